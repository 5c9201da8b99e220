/* Building a communicator: the bootstrap's steps in order, and the choices
 * between them that every member must make alike (transports, hierarchy,
 * shared memory, the algorithms), each from values all of them know. */
#include <stdio.h>
#include <stdlib.h>

#include "base/log.h"
#include "base/params.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/coll/collectives.h"
#include "comm/communicator/communicator.h"
#include "comm/shm/shm.h"

static bool hosts_homogeneous(const hora__comm *c) {
  for (int r = 0; r < c->size; r++) {
    int n = 0;
    for (int q = 0; q < c->size; q++) {
      n += c->net->peers[q].host_index == c->net->peers[r].host_index;
    }
    if (n != c->local_size) {
      return false;
    }
  }
  return true;
}

/* RDMA: forced (also within hosts) or, by default, between hosts when every
 * host has an active port. */
static int choose_rdma(hora__comm *c, struct hora__rdv *rdv) {
  bool forced_ib = strcmp(hora__params.TRANSPORT, "ib") == 0;
  bool auto_transport = strcmp(hora__params.TRANSPORT, "auto") == 0;
  int ib_here = 0, ib_everywhere = 0;
  const struct hora__transport *ib = hora__transport_find("ib");
  if (ib && (forced_ib || (auto_transport && c->cross_size > 1))) {
    ib_here = !ib->available || ib->available();
  }
  HORA_CHECK(hora__rdv_min(rdv, ib_here, 0, 1, "whether its host has an RDMA port",
                           &ib_everywhere));
  if (forced_ib && !ib_everywhere) {
    return hora__error(HORA_ERR_NOT_SUPPORTED,
                       "HORA_TRANSPORT=ib, but %s%s",
                       HORA_HAVE_VERBS ? "" : "this build has no verbs support (configure --with-verbs)",
                       HORA_HAVE_VERBS ? (ib_here ? "another rank's host has no active RDMA port"
                                                  : "this host has no active RDMA port")
                                       : "");
  }
  c->proc->ib_all = forced_ib;
  c->proc->ib_remote = forced_ib || (auto_transport && ib_everywhere);
  c->proc->rdma = c->proc->ib_remote ? ib : NULL;
  return HORA_SUCCESS;
}

static int build(hora__comm *c, struct hora__rdv *rdv, uint64_t epoch, const int *ctrl_peers,
                 int nctrl_peers) {
  HORA_CHECK(hora__boot_membership(c, rdv, epoch));
  HORA_CHECK(hora__boot_secret(c, rdv));
  HORA_CHECK(hora__boot_addresses(c, rdv));
  HORA_CHECK(choose_rdma(c, rdv));

  /* Hierarchical allreduce: shared memory within each host and a ring
   * across hosts per slice; it needs the same number of ranks per host. */
  bool forced_ib = c->proc->ib_all;
  bool forced_tcp = strcmp(hora__params.TRANSPORT, "tcp") == 0 || forced_ib;
  const char *hier = hora__params.HIERARCHICAL_ALLREDUCE;
  bool hierarchical = !forced_tcp && c->cross_size > 1 && c->local_size > 1 &&
                      hosts_homogeneous(c) && strcmp(hier, "0") != 0;
  if (strcmp(hier, "1") == 0 && !hierarchical && c->rank == 0) {
    HORA_WARN("HORA_HIERARCHICAL_ALLREDUCE=1 ignored: it needs several hosts with the same number "
              "of ranks each, and shared memory (HORA_TRANSPORT is %s)", hora__params.TRANSPORT);
  }
  if (hierarchical) {
    c->cross_ring.pos = c->cross_rank;
    c->cross_ring.size = c->cross_size;
  }
  /* Sockets per TCP connection: the smallest any rank asks for. */
  int streams = (int)HORA_MAX(1, HORA_MIN(hora__params.SOCKETS_PER_PEER, HORA_TCP_STREAMS_MAX));
  HORA_CHECK(hora__rdv_min(rdv, streams, 1, HORA_TCP_STREAMS_MAX,
                           "its sockets per TCP connection (HORA_SOCKETS_PER_PEER)",
                           &c->proc->tcp_streams));
  HORA_CHECK(hora__rdv_agree(rdv, hora__boot_connect_all(c, ctrl_peers, nctrl_peers),
                             "connections"));
  c->world_ring.pos = c->rank;
  c->world_ring.size = c->size;
  if (c->size > 1) {
    c->world_ring.next = c->proc->data[(c->rank + 1) % c->size];
    c->world_ring.prev = c->proc->data[(c->rank + c->size - 1) % c->size];
  }
  if (hierarchical) {
    c->cross_ring.next = c->proc->cross[hora__boot_cross_peer(c, 1)];
    c->cross_ring.prev = c->proc->cross[hora__boot_cross_peer(c, -1)];
  }
  /* A process set (epoch 0) maps its segment lazily: see hora__shm_begin. */
  HORA_CHECK(hora__boot_shm(c, rdv, !forced_tcp && c->local_size > 1, epoch != 0));
  /* The algorithms must agree job-wide: if some host could not share
   * memory, every rank uses the rings. */
  int ok = forced_tcp || c->local_size == 1 || c->proc->shm != NULL, all_ok = 0;
  HORA_CHECK(hora__rdv_min(rdv, ok, 0, 1, "whether its host's shared memory works", &all_ok));
  if (!all_ok) {
    hora__shm_destroy(c->proc->shm);
    c->proc->shm = NULL;
    hierarchical = false;
  }
  c->proc->chunk_bytes = hora__params.CHUNK_SIZE;
  HORA_CHECK(hora__rdv_agree(rdv, hora__coll_choose(c, c->proc->shm != NULL, hierarchical),
                             "algorithms"));
  /* Every rank chooses by rank 0's constants, so all choose alike. Rank 0
   * says whether to calibrate (its HORA_COST_MODEL alone counts); then it
   * and its partner measure here, where every rank is in the build and
   * the data connections stand, while the others wait in the broadcast
   * of the result. */
  struct {
    struct hora__cost_model m;
    int calibrate;
  } cm;
  memset(&cm, 0, sizeof(cm));
  bool calibrate = false;
  HORA_CHECK(hora__rdv_agree(rdv, hora__cost_model_init(c, &cm.m, &calibrate), "cost model"));
  cm.calibrate = calibrate;
  HORA_CHECK(hora__rdv_bcast(rdv, 0, &cm, sizeof(cm)));
  if (cm.calibrate) {
    HORA_CHECK(hora__rdv_agree(rdv, hora__cost_calibrate(c, &cm.m), "cost model calibration"));
    HORA_CHECK(hora__rdv_bcast(rdv, 0, &cm.m, sizeof(cm.m)));
  }
  cm.m.source[sizeof(cm.m.source) - 1] = '\0';
  if (cm.calibrate) {
    hora__cost_remember(c, &cm.m);
  }
  c->model = cm.m;
  c->proc->local_transport = c->local_size == 1 ? "none"
                             : c->proc->shm     ? "shm"
                             : forced_ib        ? "ib"
                             : forced_tcp       ? "tcp"
                                                : "tcp(unix)";
  const char *remote = c->proc->ib_remote ? "ib" : "tcp";
  c->proc->remote_transport = c->cross_size == 1 ? "none"
                              : hierarchical     ? (c->proc->ib_remote ? "ib(hierarchical)"
                                                                       : "tcp(hierarchical)")
                                                 : remote;
  if (hierarchical && c->proc->ib_remote) {
    /* The cross-host rings reduce in this rank's two shared halves: with
     * them registered, slices move between hosts without a copy. */
    hora__comm_register(c, hora__shm_half(c->proc->shm, c->local_rank, 0),
                        2 * hora__shm_half_bytes(c->proc->shm), &c->proc->shm_reg);
  }
  c->proc->single_copy_min = hora__params.SHM_SINGLE_COPY_MIN;
  c->net->stall_ns = (uint64_t)(hora__params.STALL_SHUTDOWN_TIME_SECONDS * 1e9);
  return HORA_SUCCESS;
}

int hora__comm_create(struct hora__rdv *rdv, uint64_t epoch, const int *ctrl_peers,
                      int nctrl_peers, hora__comm **out) {
  hora__comm *c = hora__calloc(1, sizeof(*c));
  struct hora__proc *proc = hora__calloc(1, sizeof(*proc));
  if (!c || !proc) {
    free(c);
    free(proc);
    return HORA_ERR_NO_MEMORY;
  }
  c->proc = proc;
  c->owns_proc = true;
  c->net = &proc->net;
  proc->stream = hora__transport_find("tcp");
  proc->tcp_listen_fd = proc->unix_listen_fd = proc->reserve_fd = -1;
  int rc = build(c, rdv, epoch, ctrl_peers, nctrl_peers);
  if (rc != HORA_SUCCESS) {
    hora__comm_destroy(c);
    return rc;
  }
  *out = c;
  return HORA_SUCCESS;
}
