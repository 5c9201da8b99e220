/* Bootstrap: MPI tells us who the ranks are; everything after that runs
 * over hora's own connections.
 *
 *   1. duplicate MPI_COMM_WORLD; rank, size
 *   2. local rank/size by shared-memory domain, host index by local leaders
 *   3. rank 0 draws the job secret and a separate job id; MPI_Bcast
 *   4. every rank listens (TCP on the chosen interface, Unix socket for its
 *      host) and the addresses are allgathered
 *   5. the planned connections are made, all at once and without blocking:
 *      the higher rank of a pair connects, and both prove to each other
 *      that they know the secret (handshake.h: HMAC-SHA-256 over nonces of
 *      both sides; the secret itself never crosses the wire). Strangers
 *      are dropped after 1 s and few are held (see HALF_OPEN_MAX)
 *
 * Planned connections: control star (rank 0 <-> every rank) and data ring
 * (rank r <-> r+1). Peers on one host use Unix sockets. This file runs the
 * steps; connect.c plans and makes the connections (step 5), and accept.c
 * takes the incoming ones until they have proved the secret. */
#include <arpa/inet.h>
#include <limits.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <unistd.h>

#include "base/log.h"
#include "base/params.h"
#include "base/mpi_error.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/coll/collectives.h"
#include "comm/comm.h"
#include "comm/transport/socket.h"
#include "comm/shm/shm.h"

#define MPI_CHECK(call)                                                                      \
  do {                                                                                       \
    int mpi_rc_ = (call);                                                                    \
    if (mpi_rc_ != MPI_SUCCESS) {                                                            \
      return hora__mpi_error(mpi_rc_, #call);                                                \
    }                                                                                        \
  } while (0)


static int topology_from_mpi(hora__comm *c, MPI_Comm *local_out) {
  MPI_Comm local, leaders;
  MPI_CHECK(MPI_Comm_split_type(c->proc->mpi, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &local));
  MPI_Comm_rank(local, &c->local_rank);
  MPI_Comm_size(local, &c->local_size);
  int color = c->local_rank == 0 ? 0 : MPI_UNDEFINED;
  MPI_CHECK(MPI_Comm_split(c->proc->mpi, color, c->rank, &leaders));
  int hostinfo[2] = {0, 0};
  if (leaders != MPI_COMM_NULL) {
    MPI_Comm_rank(leaders, &hostinfo[0]);
    MPI_Comm_size(leaders, &hostinfo[1]);
    MPI_Comm_free(&leaders);
  }
  int rc = MPI_Bcast(hostinfo, 2, MPI_INT, 0, local);
  *local_out = local;
  if (rc != MPI_SUCCESS) {
    return hora__mpi_error(rc, "MPI_Bcast(host index)");
  }
  c->cross_rank = hostinfo[0];
  c->cross_size = hostinfo[1];
  return HORA_SUCCESS;
}

/* Every rank learns whether a bootstrap step failed on any rank, so none is
 * left waiting in the next MPI collective for one that gave up. A rank that
 * failed keeps its own error; the others name the lowest failing rank. */
static int agree(hora__comm *c, int rc, const char *step) {
  enum { CODES = 64 };
  int code = rc > 0 && rc < CODES ? rc : HORA_ERR_SYSTEM;
  int mine = rc != HORA_SUCCESS ? c->rank * CODES + code : INT_MAX;
  int first = INT_MAX;
  int err = MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, c->proc->mpi);
  if (rc != HORA_SUCCESS) {
    return rc;
  }
  if (err != MPI_SUCCESS) {
    return hora__mpi_error(err, "MPI_Allreduce(bootstrap status)");
  }
  if (first != INT_MAX) {
    return hora__error(first % CODES,
                       "bootstrap (%s) failed on rank %d (its hora_init error says why)", step,
                       first / CODES);
  }
  return HORA_SUCCESS;
}

int hora__boot_random_bytes(void *buf, size_t n, const char *what) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom((uint8_t *)buf + got, n - got, 0);
    if (r < 0 && errno != EINTR) {
      return hora__error_errno(HORA_ERR_SYSTEM, "getrandom (%s)", what);
    }
    if (r > 0) {
      got += (size_t)r;
    }
  }
  return HORA_SUCCESS;
}

/* Rank 0 draws the job secret and, apart from it, the job id that names
 * the Unix sockets: the id is public (anyone on the host can list the
 * abstract names), so it must carry no bit of the secret. */
static int make_secret(hora__comm *c) {
  uint8_t drawn[HORA_SECRET_LEN + 8];
  int rc = HORA_SUCCESS;
  if (c->rank == 0) {
    rc = hora__boot_random_bytes(drawn, sizeof(drawn), "job secret");
  }
  HORA_CHECK(agree(c, rc, "job secret"));
  MPI_CHECK(MPI_Bcast(drawn, (int)sizeof(drawn), MPI_BYTE, 0, c->proc->mpi));
  memcpy(c->proc->secret, drawn, HORA_SECRET_LEN);
  for (int i = 0; i < 8; i++) {
    snprintf(c->proc->job_id + 2 * i, 3, "%02x", drawn[HORA_SECRET_LEN + i]);
  }
  OPENSSL_cleanse(drawn, sizeof(drawn));
  return HORA_SUCCESS;
}

/* The rank on the host `dir` steps along the cross ring with this rank's
 * local rank (hosts are homogeneous when this is used). */
int hora__comm_rank_on_host(const hora__comm *c, int host) {
  for (int r = 0; r < c->size; r++) {
    if (c->net->peers[r].host_index == host && c->net->peers[r].local_rank == c->local_rank) {
      return r;
    }
  }
  return -1;
}

int hora__boot_cross_peer(const hora__comm *c, int dir) {
  return hora__comm_rank_on_host(c, (c->cross_rank + dir + c->cross_size) % c->cross_size);
}

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

/* Settings that shape the protocol (scope `job` in runtime/params.def) must
 * be the same everywhere, or ranks would deadlock in set-up or exchange
 * bytes the others read differently. One digest per rank; the two
 * encodings are sent only when a digest differs, so every rank fails
 * naming the same setting. */
static int check_job_settings(hora__comm *c) {
  size_t len = hora__params_job_encode(NULL, 0);
  char *mine = hora__malloc(len + 1);
  if (!mine) {
    return HORA_ERR_NO_MEMORY;
  }
  hora__params_job_encode(mine, len + 1);
  uint64_t digest = 0xcbf29ce484222325ull; /* FNV-1a */
  for (size_t i = 0; i < len; i++) {
    digest = (digest ^ (unsigned char)mine[i]) * 0x100000001b3ull;
  }
  uint64_t *all = hora__calloc((size_t)c->size, sizeof(*all));
  char *theirs[2] = {NULL, NULL};
  int rc = all ? HORA_SUCCESS : HORA_ERR_NO_MEMORY;
  int err = MPI_Allgather(&digest, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, c->proc->mpi);
  if (rc == HORA_SUCCESS && err != MPI_SUCCESS) {
    rc = hora__mpi_error(err, "MPI_Allgather(settings digest)");
  }
  int other = -1;
  for (int r = 1; rc == HORA_SUCCESS && r < c->size && other < 0; r++) {
    other = all[r] != all[0] ? r : -1;
  }
  /* Every rank knows `other` from the same digests: all take this branch. */
  int roots[2] = {0, other};
  int lens[2] = {0, 0};
  for (int i = 0; rc == HORA_SUCCESS && other > 0 && i < 2; i++) {
    lens[i] = c->rank == roots[i] ? (int)len : 0;
    err = MPI_Bcast(&lens[i], 1, MPI_INT, roots[i], c->proc->mpi);
    theirs[i] = err == MPI_SUCCESS ? hora__malloc((size_t)lens[i] + 1) : NULL;
    if (theirs[i] && c->rank == roots[i]) {
      memcpy(theirs[i], mine, len);
    }
    /* A failed allocation still joins the broadcast, into a scratch byte. */
    char scratch;
    if (err == MPI_SUCCESS) {
      err = MPI_Bcast(theirs[i] ? theirs[i] : &scratch, theirs[i] ? lens[i] : 0, MPI_CHAR,
                      roots[i], c->proc->mpi);
    }
    if (err != MPI_SUCCESS) {
      rc = hora__mpi_error(err, "MPI_Bcast(settings)");
    } else if (!theirs[i]) {
      rc = HORA_ERR_NO_MEMORY;
    }
  }
  if (rc == HORA_SUCCESS && other > 0) {
    char msg[512];
    if (!hora__params_job_difference(theirs[0], (size_t)lens[0], 0, theirs[1], (size_t)lens[1],
                                     other, msg, sizeof(msg))) {
      snprintf(msg, sizeof(msg), "ranks 0 and %d differ in their job-wide settings", other);
    }
    rc = hora__error(HORA_ERR_INVALID_ARG, "%s (job-wide settings must be the same on every rank)",
                     msg);
  }
  free(theirs[0]);
  free(theirs[1]);
  free(all);
  free(mine);
  return rc;
}

static int comm_connect(hora__comm *c, MPI_Comm local, const int *ctrl_peers, int nctrl_peers);

static int comm_create(MPI_Comm world, const int *ctrl_peers, int nctrl_peers, hora__comm *c) {
  MPI_CHECK(MPI_Comm_dup(world, &c->proc->mpi));
  MPI_Comm_set_errhandler(c->proc->mpi, MPI_ERRORS_RETURN);
  MPI_Comm_rank(c->proc->mpi, &c->rank);
  MPI_Comm_size(c->proc->mpi, &c->size);
  c->net->rank = c->rank;
  c->net->size = c->size;
  HORA_CHECK(check_job_settings(c));
  MPI_Comm local = MPI_COMM_NULL;
  int rc = topology_from_mpi(c, &local);
  if (rc == HORA_SUCCESS) {
    rc = comm_connect(c, local, ctrl_peers, nctrl_peers);
  }
  if (local != MPI_COMM_NULL) {
    MPI_Comm_free(&local);
  }
  return rc;
}

/* This rank's listening sockets (TCP on the chosen interface, and a Unix
 * socket for its host) and its tables of peers. */
static int listen_and_allocate(hora__comm *c, struct in_addr *ip, char *ifname, size_t n) {
  HORA_CHECK(hora__choose_ipv4(hora__params.IFACE, c->cross_size == 1, ip, ifname, n));
  HORA_CHECK(hora__listen_tcp(*ip, &c->proc->tcp_listen_fd, &c->proc->tcp_addr));
  HORA_CHECK(hora__listen_unix(c->proc->job_id, c->rank, &c->proc->unix_listen_fd));
  c->net->peers = hora__calloc((size_t)c->size, sizeof(*c->net->peers));
  c->proc->ctrl = hora__calloc((size_t)c->size, sizeof(*c->proc->ctrl));
  c->proc->data = hora__calloc((size_t)c->size, sizeof(*c->proc->data));
  c->proc->cross = hora__calloc((size_t)c->size, sizeof(*c->proc->cross));
  if (!c->net->peers || !c->proc->ctrl || !c->proc->data || !c->proc->cross) {
    return HORA_ERR_NO_MEMORY;
  }
  return HORA_SUCCESS;
}

static int comm_connect(hora__comm *c, MPI_Comm local, const int *ctrl_peers, int nctrl_peers) {
  HORA_CHECK(make_secret(c));

  struct in_addr ip;
  char ifname[64];
  HORA_CHECK(agree(c, listen_and_allocate(c, &ip, ifname, sizeof(ifname)), "listening sockets"));
  struct hora__peer_info me;
  memset(&me, 0, sizeof(me));
  hora__strlcpy(me.host, hora__log_hostname(), sizeof(me.host));
  me.pid = (int32_t)getpid();
  me.local_rank = c->local_rank;
  me.host_index = c->cross_rank;
  me.ipv4 = c->proc->tcp_addr.sin_addr.s_addr;
  me.port = c->proc->tcp_addr.sin_port;
  MPI_CHECK(MPI_Allgather(&me, (int)sizeof(me), MPI_BYTE, c->net->peers, (int)sizeof(me), MPI_BYTE,
                          c->proc->mpi));
  char ipstr[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &ip, ipstr, sizeof(ipstr));
  HORA_DEBUG("bootstrap: listening on %s:%d (%s) and @hora.%s.%d", ipstr,
             ntohs(c->proc->tcp_addr.sin_port), ifname, c->proc->job_id, c->rank);

  /* RDMA: forced (also within hosts) or, by default, between hosts when
   * every host has an active port. The ranks must agree. */
  bool forced_ib = strcmp(hora__params.TRANSPORT, "ib") == 0;
  bool auto_transport = strcmp(hora__params.TRANSPORT, "auto") == 0;
  int ib_here = 0, ib_everywhere = 0;
  const struct hora__transport *ib = hora__transport_find("ib");
  if (ib && (forced_ib || (auto_transport && c->cross_size > 1))) {
    ib_here = !ib->available || ib->available();
  }
  MPI_CHECK(MPI_Allreduce(&ib_here, &ib_everywhere, 1, MPI_INT, MPI_MIN, c->proc->mpi));
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

  /* Hierarchical allreduce: shared memory within each host and a ring
   * across hosts per slice; it needs the same number of ranks per host. */
  bool forced_tcp = strcmp(hora__params.TRANSPORT, "tcp") == 0 || forced_ib;
  const char *hier = hora__params.HIERARCHICAL_ALLREDUCE;
  bool homogeneous = hosts_homogeneous(c);
  bool hierarchical = !forced_tcp && c->cross_size > 1 && c->local_size > 1 && homogeneous &&
                      strcmp(hier, "0") != 0;
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
  MPI_CHECK(MPI_Allreduce(&streams, &c->proc->tcp_streams, 1, MPI_INT, MPI_MIN, c->proc->mpi));
  HORA_CHECK(agree(c, hora__boot_connect_all(c, ctrl_peers, nctrl_peers), "connections"));
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
  int shm_rc = HORA_SUCCESS;
  if (!forced_tcp && c->local_size > 1) {
    shm_rc = hora__shm_create(c->net, local, &c->proc->shm);
  }
  HORA_CHECK(agree(c, shm_rc, "shared memory"));
  /* The algorithms must agree job-wide: if some host could not share
   * memory, every rank uses the rings. */
  int ok = forced_tcp || c->local_size == 1 || c->proc->shm != NULL, all_ok = 0;
  MPI_CHECK(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, c->proc->mpi));
  if (!all_ok) {
    hora__shm_destroy(c->proc->shm);
    c->proc->shm = NULL;
    hierarchical = false;
  }
  hora__coll_choose(c, c->proc->shm != NULL, hierarchical);
  c->proc->local_transport = c->local_size == 1 ? "none"
                      : c->proc->shm             ? "shm"
                      : forced_ib          ? "ib"
                      : forced_tcp         ? "tcp"
                                           : "tcp(unix)";
  const char *remote = c->proc->ib_remote ? "ib" : "tcp";
  c->proc->remote_transport = c->cross_size == 1 ? "none"
                        : hierarchical     ? (c->proc->ib_remote ? "ib(hierarchical)" : "tcp(hierarchical)")
                                           : remote;
  if (hierarchical && c->proc->ib_remote) {
    /* The cross-host rings reduce in this rank's two shared halves: with
     * them registered, slices move between hosts without a copy. */
    hora__comm_register(c, hora__shm_half(c->proc->shm, c->local_rank, 0),
                        2 * hora__shm_half_bytes(c->proc->shm), &c->proc->shm_reg);
  }
  c->proc->chunk_bytes = hora__params.CHUNK_SIZE;
  c->proc->single_copy_min = hora__params.SHM_SINGLE_COPY_MIN;
  c->net->stall_ns = (uint64_t)(hora__params.STALL_SHUTDOWN_TIME_SECONDS * 1e9);
  return HORA_SUCCESS;
}

int hora__comm_create(MPI_Comm world, const int *ctrl_peers, int nctrl_peers, hora__comm **out) {
  hora__comm *c = hora__calloc(1, sizeof(*c));
  struct hora__proc *proc = hora__calloc(1, sizeof(*proc));
  if (!c || !proc) {
    free(c);
    free(proc);
    return HORA_ERR_NO_MEMORY;
  }
  /* The job's world owns the process's side. */
  c->proc = proc;
  c->owns_proc = true;
  c->net = &proc->net;
  proc->stream = hora__transport_find("tcp");
  c->proc->tcp_listen_fd = c->proc->unix_listen_fd = c->proc->reserve_fd = -1;
  c->proc->mpi = MPI_COMM_NULL;
  int rc = comm_create(world, ctrl_peers, nctrl_peers, c);
  if (rc != HORA_SUCCESS) {
    hora__comm_destroy(c);
    return rc;
  }
  *out = c;
  return HORA_SUCCESS;
}

void hora__comm_disconnect(hora__comm *c) {
  if (c->proc->ctrl) {
    for (int r = 0; r < c->size; r++) {
      hora__ctrl_free(c->proc->ctrl[r]);
      c->proc->ctrl[r] = NULL;
    }
  }
  for (int k = 0; k < 2; k++) {
    hora__conn **v = k ? c->proc->cross : c->proc->data;
    for (int r = 0; v && r < c->size; r++) {
      if (v[r]) {
        v[r]->tp->close(v[r]);
        v[r] = NULL;
      }
    }
  }
  c->world_ring.next = c->world_ring.prev = NULL;
  c->cross_ring.next = c->cross_ring.prev = NULL;
  c->net->active = NULL;
  if (c->proc->tcp_listen_fd >= 0) {
    close(c->proc->tcp_listen_fd);
    c->proc->tcp_listen_fd = -1;
  }
  if (c->proc->unix_listen_fd >= 0) {
    close(c->proc->unix_listen_fd);
    c->proc->unix_listen_fd = -1;
  }
  if (c->proc->reserve_fd >= 0) {
    close(c->proc->reserve_fd);
    c->proc->reserve_fd = -1;
  }
}

void hora__comm_register(hora__comm *c, void *buf, size_t len, void **handle) {
  *handle = NULL;
  const struct hora__transport *tp = c->proc->rdma;
  if (tp && tp->zero_copy && len > 0 && tp->reg_mem(c->net, buf, len, handle) != HORA_SUCCESS) {
    HORA_WARN("RDMA registration of a %zu-byte buffer failed (%s); transfers into it are copied",
              len, hora_last_error());
    *handle = NULL;
  }
}

int hora__comm_register_device(hora__comm *c, void *buf, size_t len, int fd, uint64_t offset,
                               void **handle) {
  *handle = NULL;
  const struct hora__transport *tp = c->proc->rdma;
  if (!tp || !tp->reg_dmabuf) {
    return hora__error(HORA_ERR_NOT_SUPPORTED,
                       hora__transport_find("ib") ? "no RDMA connections to register GPU memory with"
                                                  : "built without RDMA (libibverbs)");
  }
  return tp->reg_dmabuf(c->net, buf, len, fd, offset, handle);
}

void hora__comm_deregister(hora__comm *c, void **handle) {
  if (*handle && c->proc->rdma) {
    c->proc->rdma->dereg_mem(c->net, *handle);
  }
  *handle = NULL;
}

int hora__comm_grow_registered(hora__comm *c, char **buf, size_t *bytes, void **handle,
                               size_t need) {
  if (*bytes >= need) {
    return HORA_SUCCESS;
  }
  /* Page-aligned: RDMA registers whole pages. */
  char *p = hora__aligned_alloc(4096, need);
  if (!p) {
    return HORA_ERR_NO_MEMORY;
  }
  hora__comm_deregister(c, handle);
  free(*buf);
  *buf = p;
  *bytes = need;
  hora__comm_register(c, p, need, handle);
  return HORA_SUCCESS;
}

void hora__comm_destroy(hora__comm *c) {
  if (!c) {
    return;
  }
  hora__comm_disconnect(c);
  hora__comm_deregister(c, &c->fusion_reg);
  hora__comm_deregister(c, &c->scratch_reg);
  hora__comm_deregister(c, &c->reduced_reg);
  hora__comm_deregister(c, &c->proc->shm_reg);
  if (c->proc->mpi != MPI_COMM_NULL) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      MPI_Comm_free(&c->proc->mpi);
    }
  }
  hora__peer_maps_free(c->proc->peer_maps, c->local_size);
  free(c->proc->peer_ptrs);
  hora__shm_destroy(c->proc->shm);
  free(c->fusion);
  free(c->scratch);
  free(c->reduced);
  free(c->proc->bounce);
  free(c->net->peers);
  free(c->proc->ctrl);
  free(c->proc->data);
  free(c->proc->cross);
  if (c->owns_proc) {
    free(c->proc);
  }
  free(c);
}
