/* RDMA transport over libibverbs (InfiniBand and RoCE).
 *
 * Connection: one reliable-connected queue pair per peer. The peers first
 * meet on an authenticated TCP socket (bootstrap.c), over which they swap
 * what the other needs: QP number, LID, GID, MTU, and the address and rkey
 * of their receive ring. The socket then only stays open as a liveness
 * signal.
 *
 * Data: a byte stream, like the TCP transport. The sender copies a chunk of
 * at most SLOT bytes into one of its registered send slots and writes it
 * with RDMA WRITE WITH IMMEDIATE into the next slot of the receiver's ring;
 * the immediate carries the slot and the length. The receiver copies slots
 * out, in order, into the posted receives, and gives each slot back with a
 * credit: a zero-byte write whose immediate counts the slots returned.
 *
 *   sender                                   receiver
 *   send slot k --RDMA_WRITE_WITH_IMM(k,len)--> ring slot k  -> irecv buffer
 *               <--credits n, riding on the receiver's own data writes,
 *                  or alone once half the ring is owed
 *
 * Completions of every connection arrive on one completion queue, whose
 * completion channel is the fd the coordinator sleeps on (after a bounded
 * poll); a failed completion or a port event is HORA_ERR_PEER_LOST with
 * ibv_wc_status_str in the message. */
#include "../runtime/common.h"

#if HORA_HAVE_VERBS

#include <arpa/inet.h>
#include <fcntl.h>
#include <hwloc.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../runtime/log.h"
#include "../runtime/params.h"
#include "comm.h"

#define SLOTS 16              /* ring slots per direction and connection */
#define SLOT (256 * 1024)     /* bytes per slot (fits the 21-bit length field) */
#define RECV_DEPTH (2 * SLOTS) /* receive WRs kept posted: data and credits */
#define SEND_DEPTH (2 * SLOTS)
#define SIGNAL_EVERY 8 /* ask for a send completion on every 8th write */
/* Immediate data: a data write carries its slot and length and the
 * credits its sender owes the other way; a bare credit write only those.
 *   bit 31: bare credit | bits 26-30: credits | bits 21-25: slot | 0-20: length */
#define INLINE_MAX 128 /* small writes travel inside the work request */
#define IMM_CREDIT 0x80000000u
#define IMM_CREDITS_SHIFT 26
#define IMM_SLOT_SHIFT 21
#define IMM_LEN_MASK 0x001fffffu
#define IMM_FIELD_MASK 0x1fu

/* The device, shared by every connection of the process. */
struct ib_ctx {
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_comp_channel *channel;
  struct ibv_cq *cq;
  int port;
  int gid_index;
  union ibv_gid gid;
  uint16_t lid;
  enum ibv_mtu mtu;
  bool roce;
  int kick_fd; /* eventfd: "completions are already waiting, do not sleep" */
  bool armed;
  int refs;
  struct ib_conn **conns; /* by slot in the table below, for completion dispatch */
  int nconns, capconns;
  char name[64];
};

static struct ib_ctx *dev; /* coordinator thread only */

/* What one side tells the other. Plain fixed-size data, sent as bytes. */
struct ib_wire {
  uint32_t magic;
  uint32_t qpn;
  uint32_t psn;
  uint16_t lid;
  uint8_t mtu;
  uint8_t pad;
  uint8_t gid[16];
  uint64_t ring_addr;
  uint32_t ring_rkey;
  uint32_t pad2;
};
#define IB_WIRE_MAGIC 0x48524942u /* "HRIB" */

struct ib_conn {
  struct hora__conn base;
  int fd; /* the TCP socket the peers met on */
  struct ibv_qp *qp;
  char *send_buf, *ring;
  struct ibv_mr *send_mr, *ring_mr;
  uint64_t remote_ring;
  uint32_t remote_rkey;
  /* Sending: slots are used round-robin; a slot is free again when its
   * write completed locally, and the peer has room when it returned the
   * matching credit. */
  uint32_t send_next;      /* next slot to write (local and remote index) */
  uint32_t send_busy;      /* data writes posted, not yet completed locally */
  uint32_t sq_used;        /* all writes (data and credits) not yet completed */
  /* Only some writes are signalled; a completion retires every write up to
   * it, in order. is_data[seq % SEND_DEPTH] says which of them used a slot. */
  uint64_t posted, retired, last_signaled;
  uint8_t is_data[SEND_DEPTH];
  uint32_t credits;        /* remote slots we may write */
  size_t send_off;         /* bytes of the head send xfer already posted */
  /* Receiving: ring slots that arrived, in order, from ring_head. */
  uint32_t ring_head;
  uint32_t ring_ready;     /* slots arrived, not yet fully copied out */
  uint32_t ring_len[SLOTS];
  uint32_t head_off;       /* bytes of the head slot already copied out */
  uint32_t credits_owed;   /* slots copied out, not yet returned */
  uint32_t max_inline;     /* what the QP accepted for inline data */
  int error;               /* a failed completion: the connection is dead */
  char error_msg[256];
};

/* ---- device ------------------------------------------------------------------- */

static int verbs_error(const char *what) {
  return hora__error_errno(HORA_ERR_SYSTEM, "%s", what);
}

/* The device (and port) named by HORA_IB_DEVICE ("mlx5_0" or "mlx5_0:1"),
 * else the active one nearest to this process's cores. */
static int pick_device(struct ibv_device **list, int n, int *which, int *port_out) {
  const char *want = hora__params.IB_DEVICE;
  char name[64] = "";
  int want_port = 0;
  if (want && want[0]) {
    hora__strlcpy(name, want, sizeof(name));
    char *colon = strchr(name, ':');
    if (colon) {
      *colon = '\0';
      want_port = atoi(colon + 1);
    }
  }
  /* hwloc knows which PCI slot, hence which NUMA node, a device sits on. */
  hwloc_topology_t topo = NULL;
  hwloc_bitmap_t mine = NULL;
  if (!name[0] && hwloc_topology_init(&topo) == 0) {
    hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(topo) == 0) {
      mine = hwloc_bitmap_alloc();
      if (mine && hwloc_get_cpubind(topo, mine, HWLOC_CPUBIND_PROCESS) != 0) {
        hwloc_bitmap_copy(mine, hwloc_topology_get_allowed_cpuset(topo));
      }
    }
  }
  int best = -1, best_port = 0, best_near = -1;
  for (int i = 0; i < n; i++) {
    const char *dn = ibv_get_device_name(list[i]);
    if (name[0] && strcmp(dn, name) != 0) {
      continue;
    }
    struct ibv_context *c = ibv_open_device(list[i]);
    if (!c) {
      continue;
    }
    struct ibv_device_attr da;
    int active = 0;
    if (ibv_query_device(c, &da) == 0) {
      for (int p = 1; p <= da.phys_port_cnt && !active; p++) {
        struct ibv_port_attr pa;
        if ((!want_port || p == want_port) && ibv_query_port(c, (uint8_t)p, &pa) == 0 &&
            pa.state == IBV_PORT_ACTIVE) {
          active = p;
        }
      }
    }
    ibv_close_device(c);
    if (!active) {
      continue;
    }
    int near = 0;
    if (topo && mine) {
      for (hwloc_obj_t o = hwloc_get_next_osdev(topo, NULL); o; o = hwloc_get_next_osdev(topo, o)) {
        if (o->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS && strcmp(o->name, dn) == 0) {
          hwloc_obj_t a = hwloc_get_non_io_ancestor_obj(topo, o);
          near = a && a->cpuset && hwloc_bitmap_intersects(a->cpuset, mine);
        }
      }
    }
    if (near > best_near) {
      best = i;
      best_port = active;
      best_near = near;
    }
  }
  if (mine) {
    hwloc_bitmap_free(mine);
  }
  if (topo) {
    hwloc_topology_destroy(topo);
  }
  if (best < 0) {
    return hora__error(HORA_ERR_NOT_SUPPORTED, "no RDMA device with an active port%s%s%s",
                       name[0] ? " named '" : "", name, name[0] ? "' (HORA_IB_DEVICE)" : "");
  }
  *which = best;
  *port_out = best_port;
  return HORA_SUCCESS;
}

/* RoCE v2 over IPv4 when there is one (it routes), else the first valid
 * GID; HORA_IB_GID_INDEX overrides. */
static int pick_gid(struct ib_ctx *d, int gid_table_len) {
  if (hora__params.IB_GID_INDEX >= 0) {
    d->gid_index = (int)hora__params.IB_GID_INDEX;
  } else {
    d->gid_index = -1;
    int fallback = -1;
    for (int i = 0; i < gid_table_len; i++) {
      struct ibv_gid_entry e;
      if (ibv_query_gid_ex(d->ctx, (uint32_t)d->port, (uint32_t)i, &e, 0) != 0) {
        continue;
      }
      bool v4 = e.gid.raw[10] == 0xff && e.gid.raw[11] == 0xff;
      if (e.gid_type == IBV_GID_TYPE_ROCE_V2 && v4) {
        d->gid_index = i;
        break;
      }
      if (fallback < 0) {
        fallback = i;
      }
    }
    if (d->gid_index < 0) {
      d->gid_index = fallback >= 0 ? fallback : 0;
    }
  }
  if (ibv_query_gid(d->ctx, (uint8_t)d->port, d->gid_index, &d->gid) != 0) {
    return hora__error_errno(HORA_ERR_SYSTEM, "ibv_query_gid(%s port %d index %d)", d->name,
                             d->port, d->gid_index);
  }
  return HORA_SUCCESS;
}

static void dev_put(void) {
  if (!dev || --dev->refs > 0) {
    return;
  }
  if (dev->cq) {
    ibv_destroy_cq(dev->cq);
  }
  if (dev->channel) {
    ibv_destroy_comp_channel(dev->channel);
  }
  if (dev->pd) {
    ibv_dealloc_pd(dev->pd);
  }
  if (dev->ctx) {
    ibv_close_device(dev->ctx);
  }
  if (dev->kick_fd >= 0) {
    close(dev->kick_fd);
  }
  free(dev->conns);
  free(dev);
  dev = NULL;
}

static int dev_get(hora__comm *comm) {
  if (dev) {
    dev->refs++;
    return HORA_SUCCESS;
  }
  int n = 0;
  struct ibv_device **list = ibv_get_device_list(&n);
  if (!list || n == 0) {
    if (list) {
      ibv_free_device_list(list);
    }
    return hora__error(HORA_ERR_NOT_SUPPORTED, "no RDMA device (ibv_get_device_list found none)");
  }
  struct ib_ctx *d = hora__calloc(1, sizeof(*d));
  if (!d) {
    ibv_free_device_list(list);
    return HORA_ERR_NO_MEMORY;
  }
  d->kick_fd = -1;
  d->refs = 1;
  dev = d;
  int which = 0, rc;
  int port = 1;
  HORA_CHECK_GOTO(pick_device(list, n, &which, &port), rc, fail);
  d->port = port;
  hora__strlcpy(d->name, ibv_get_device_name(list[which]), sizeof(d->name));
  d->ctx = ibv_open_device(list[which]);
  ibv_free_device_list(list);
  list = NULL;
  if (!d->ctx) {
    rc = verbs_error("ibv_open_device");
    goto fail;
  }
  struct ibv_port_attr pa;
  if (ibv_query_port(d->ctx, (uint8_t)d->port, &pa) != 0) {
    rc = verbs_error("ibv_query_port");
    goto fail;
  }
  d->lid = pa.lid;
  d->mtu = pa.active_mtu;
  d->roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
  HORA_CHECK_GOTO(pick_gid(d, pa.gid_tbl_len), rc, fail);
  d->pd = ibv_alloc_pd(d->ctx);
  d->channel = ibv_create_comp_channel(d->ctx);
  int cqe = (RECV_DEPTH + SEND_DEPTH) * HORA_MAX(comm->size, 4);
  d->cq = d->channel ? ibv_create_cq(d->ctx, cqe, NULL, d->channel, 0) : NULL;
  d->kick_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (!d->pd || !d->channel || !d->cq || d->kick_fd < 0) {
    rc = verbs_error("setting up the RDMA device (PD, completion channel, CQ)");
    goto fail;
  }
  int flags = fcntl(d->channel->fd, F_GETFL);
  fcntl(d->channel->fd, F_SETFL, flags | O_NONBLOCK);
  flags = fcntl(d->ctx->async_fd, F_GETFL);
  fcntl(d->ctx->async_fd, F_SETFL, flags | O_NONBLOCK);
  HORA_INFO("rdma: device %s port %d, %s, GID index %d, MTU %d", d->name, d->port,
            d->roce ? "RoCE" : "InfiniBand", d->gid_index, 128 << d->mtu);
  return HORA_SUCCESS;
fail:
  if (list) {
    ibv_free_device_list(list);
  }
  dev_put();
  return rc;
}

/* Whether this machine has an active RDMA port at all (for HORA_TRANSPORT=auto). */
bool hora__ib_available(void) {
  int n = 0;
  struct ibv_device **list = ibv_get_device_list(&n);
  bool any = false;
  for (int i = 0; list && i < n && !any; i++) {
    struct ibv_context *c = ibv_open_device(list[i]);
    struct ibv_device_attr da;
    if (c && ibv_query_device(c, &da) == 0) {
      for (int p = 1; p <= da.phys_port_cnt && !any; p++) {
        struct ibv_port_attr pa;
        any = ibv_query_port(c, (uint8_t)p, &pa) == 0 && pa.state == IBV_PORT_ACTIVE;
      }
    }
    if (c) {
      ibv_close_device(c);
    }
  }
  if (list) {
    ibv_free_device_list(list);
  }
  return any;
}

/* ---- connection ----------------------------------------------------------------- */

static int sock_exchange(int fd, const void *out, void *in, size_t n, double timeout_s) {
  size_t sent = 0, got = 0;
  uint64_t deadline = hora__now_ns() + (uint64_t)(timeout_s * 1e9);
  while (sent < n || got < n) {
    struct pollfd p = {.fd = fd, .events = (short)((sent < n ? POLLOUT : 0) | (got < n ? POLLIN : 0))};
    uint64_t now = hora__now_ns();
    if (now >= deadline) {
      return hora__error(HORA_ERR_PEER_LOST, "RDMA connection exchange timed out");
    }
    if (poll(&p, 1, (int)((deadline - now) / 1000000) + 1) < 0 && errno != EINTR) {
      return hora__error_errno(HORA_ERR_SYSTEM, "poll");
    }
    if (sent < n && (p.revents & POLLOUT)) {
      ssize_t w = send(fd, (const char *)out + sent, n - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0 && errno != EAGAIN && errno != EINTR) {
        return hora__error_errno(HORA_ERR_PEER_LOST, "RDMA connection exchange (send)");
      }
      sent += w > 0 ? (size_t)w : 0;
    }
    if (got < n && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t r = recv(fd, (char *)in + got, n - got, MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
        return hora__error(HORA_ERR_PEER_LOST, "RDMA connection exchange: the peer closed");
      }
      got += r > 0 ? (size_t)r : 0;
    }
  }
  return HORA_SUCCESS;
}

static int post_recv(struct ib_conn *c) {
  struct ibv_recv_wr wr = {.wr_id = (uintptr_t)c}, *bad;
  if (ibv_post_recv(c->qp, &wr, &bad) != 0) {
    return verbs_error("ibv_post_recv");
  }
  return HORA_SUCCESS;
}

static int connect_qp(struct ib_conn *c, const struct ib_wire *peer, uint32_t my_psn) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_INIT;
  a.port_num = (uint8_t)dev->port;
  a.pkey_index = 0;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  if (ibv_modify_qp(c->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    return verbs_error("ibv_modify_qp(INIT)");
  }
  for (int i = 0; i < RECV_DEPTH; i++) {
    HORA_CHECK(post_recv(c));
  }
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = (enum ibv_mtu)HORA_MIN((int)dev->mtu, (int)peer->mtu);
  a.dest_qp_num = peer->qpn;
  a.rq_psn = peer->psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = (uint8_t)dev->port;
  a.ah_attr.dlid = peer->lid;
  if (dev->roce || peer->lid == 0) {
    a.ah_attr.is_global = 1;
    memcpy(a.ah_attr.grh.dgid.raw, peer->gid, 16);
    a.ah_attr.grh.sgid_index = (uint8_t)dev->gid_index;
    a.ah_attr.grh.hop_limit = 64;
  }
  if (ibv_modify_qp(c->qp, &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
    return verbs_error("ibv_modify_qp(RTR)");
  }
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = my_psn;
  a.max_rd_atomic = 1;
  if (ibv_modify_qp(c->qp, &a,
                    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                        IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC)) {
    return verbs_error("ibv_modify_qp(RTS)");
  }
  return HORA_SUCCESS;
}

static void ib_close(hora__conn *conn);

static int ib_adopt_socket(hora__comm *comm, int fd, int peer, hora__conn **out) {
  HORA_CHECK(dev_get(comm));
  struct ib_conn *c = hora__calloc(1, sizeof(*c));
  if (!c) {
    dev_put();
    return HORA_ERR_NO_MEMORY;
  }
  c->base.tp = &hora__transport_ib;
  c->base.peer = peer;
  c->fd = fd;
  c->credits = SLOTS;
  int rc;
  c->send_buf = hora__aligned_alloc(4096, (size_t)SLOTS * SLOT);
  c->ring = hora__aligned_alloc(4096, (size_t)SLOTS * SLOT);
  if (!c->send_buf || !c->ring) {
    rc = HORA_ERR_NO_MEMORY;
    goto fail;
  }
  /* Registered once, for the life of the connection. */
  c->send_mr = ibv_reg_mr(dev->pd, c->send_buf, (size_t)SLOTS * SLOT, IBV_ACCESS_LOCAL_WRITE);
  c->ring_mr = ibv_reg_mr(dev->pd, c->ring, (size_t)SLOTS * SLOT,
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  /* Unsignalled writes need the QP to allow it. */
  struct ibv_qp_init_attr qa = {
      .sq_sig_all = 0,
      .send_cq = dev->cq,
      .recv_cq = dev->cq,
      .cap = {.max_send_wr = SEND_DEPTH,
              .max_recv_wr = RECV_DEPTH,
              .max_send_sge = 1,
              .max_recv_sge = 1,
              .max_inline_data = INLINE_MAX},
      .qp_type = IBV_QPT_RC,
  };
  c->qp = c->send_mr && c->ring_mr ? ibv_create_qp(dev->pd, &qa) : NULL;
  if (!c->qp) {
    /* Some devices take no inline data: try again without. */
    qa.cap.max_inline_data = 0;
    c->qp = c->send_mr && c->ring_mr ? ibv_create_qp(dev->pd, &qa) : NULL;
  }
  c->max_inline = qa.cap.max_inline_data;
  if (!c->qp) {
    rc = verbs_error("ibv_reg_mr/ibv_create_qp");
    goto fail;
  }
  uint32_t psn = (uint32_t)(hora__now_ns() & 0xffffff);
  struct ib_wire me = {.magic = IB_WIRE_MAGIC,
                       .qpn = c->qp->qp_num,
                       .psn = psn,
                       .lid = dev->lid,
                       .mtu = (uint8_t)dev->mtu,
                       .ring_addr = (uint64_t)(uintptr_t)c->ring,
                       .ring_rkey = c->ring_mr->rkey};
  memcpy(me.gid, dev->gid.raw, 16);
  struct ib_wire them;
  HORA_CHECK_GOTO(sock_exchange(fd, &me, &them, sizeof(me), hora__params.CONNECT_TIMEOUT_SECONDS),
                  rc, fail);
  if (them.magic != IB_WIRE_MAGIC) {
    rc = hora__error(HORA_ERR_PEER_LOST, "rank %d sent a malformed RDMA connection record", peer);
    goto fail;
  }
  c->remote_ring = them.ring_addr;
  c->remote_rkey = them.ring_rkey;
  HORA_CHECK_GOTO(connect_qp(c, &them, psn), rc, fail);
  /* Make sure both QPs are ready to receive before anyone writes. */
  uint8_t ready = 1, peer_ready = 0;
  HORA_CHECK_GOTO(sock_exchange(fd, &ready, &peer_ready, 1, hora__params.CONNECT_TIMEOUT_SECONDS),
                  rc, fail);
  if (dev->nconns == dev->capconns) {
    int cap = dev->capconns ? 2 * dev->capconns : 8;
    struct ib_conn **p = hora__realloc(dev->conns, (size_t)cap * sizeof(*p));
    if (!p) {
      rc = HORA_ERR_NO_MEMORY;
      goto fail;
    }
    dev->conns = p;
    dev->capconns = cap;
  }
  dev->conns[dev->nconns++] = c;
  *out = &c->base;
  return HORA_SUCCESS;
fail:
  c->fd = -1; /* the caller closes the socket on failure */
  ib_close(&c->base);
  return rc;
}

/* ---- data path ------------------------------------------------------------------- */

static void enqueue(hora__xfer **head, hora__xfer **tail, hora__xfer *x) {
  x->next = NULL;
  if (*tail) {
    (*tail)->next = x;
  } else {
    *head = x;
  }
  *tail = x;
}

static void pop(hora__xfer **head, hora__xfer **tail) {
  hora__xfer *x = *head;
  x->done = true;
  *head = x->next;
  if (!*head) {
    *tail = NULL;
  }
}

static int ib_isend(hora__conn *conn, const void *buf, size_t len, hora__xfer *x) {
  x->ptr = (char *)(uintptr_t)buf;
  x->left = len;
  x->done = len == 0;
  if (!x->done) {
    enqueue(&conn->send_head, &conn->send_tail, x);
  }
  return HORA_SUCCESS;
}

static int ib_irecv(hora__conn *conn, void *buf, size_t len, hora__xfer *x) {
  x->ptr = buf;
  x->left = len;
  x->done = len == 0;
  if (!x->done) {
    enqueue(&conn->recv_head, &conn->recv_tail, x);
  }
  return HORA_SUCCESS;
}

static int conn_failed(hora__comm *comm, struct ib_conn *c) {
  char name[160];
  return hora__error(HORA_ERR_PEER_LOST, "RDMA connection to %s failed: %s",
                     hora__peer_name(comm, c->base.peer, name, sizeof(name)), c->error_msg);
}

static struct ib_conn *conn_of_qp(uint32_t qpn) {
  for (int i = 0; i < dev->nconns; i++) {
    if (dev->conns[i]->qp->qp_num == qpn) {
      return dev->conns[i];
    }
  }
  return NULL;
}

/* Takes every completion off the shared queue and books it to its
 * connection. */
static int drain_cq(bool *progressed) {
  struct ibv_wc wc[32];
  for (;;) {
    int n = ibv_poll_cq(dev->cq, 32, wc);
    if (n < 0) {
      return hora__error(HORA_ERR_SYSTEM, "ibv_poll_cq failed on %s", dev->name);
    }
    if (n == 0) {
      return HORA_SUCCESS;
    }
    *progressed = true;
    for (int i = 0; i < n; i++) {
      struct ib_conn *c = conn_of_qp(wc[i].qp_num);
      if (!c) {
        continue; /* a connection already closed */
      }
      if (wc[i].status != IBV_WC_SUCCESS) {
        if (!c->error) {
          c->error = 1;
          snprintf(c->error_msg, sizeof(c->error_msg), "work completion %s (%d)",
                   ibv_wc_status_str(wc[i].status), (int)wc[i].status);
        }
        continue;
      }
      if (wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        uint32_t imm = ntohl(wc[i].imm_data);
        c->credits += (imm >> IMM_CREDITS_SHIFT) & IMM_FIELD_MASK;
        if (!(imm & IMM_CREDIT)) {
          uint32_t slot = (imm >> IMM_SLOT_SHIFT) & IMM_FIELD_MASK;
          c->ring_len[slot] = imm & IMM_LEN_MASK;
          c->ring_ready++;
        }
        HORA_CHECK(post_recv(c));
      } else if (wc[i].opcode == IBV_WC_RDMA_WRITE) {
        /* wr_id is the write's sequence number + 1: it and all before it
         * are done. */
        for (; c->retired < wc[i].wr_id; c->retired++) {
          c->sq_used--;
          c->send_busy -= c->is_data[c->retired % SEND_DEPTH];
        }
      }
    }
  }
}

static int post_write(struct ib_conn *c, uint32_t slot, uint32_t len, uint32_t imm, int data) {
  uint64_t seq = c->posted;
  c->is_data[seq % SEND_DEPTH] = (uint8_t)data;
  /* Signal often enough that a completion freeing room is always on its
   * way before slots or queue entries could run out. */
  bool signal = seq + 1 - c->last_signaled >= SIGNAL_EVERY || c->send_busy + 1 >= SLOTS / 2 ||
                c->sq_used + 1 >= SEND_DEPTH / 2;
  struct ibv_sge sge = {.addr = (uintptr_t)(c->send_buf + (size_t)slot * SLOT),
                        .length = len,
                        .lkey = c->send_mr->lkey};
  struct ibv_send_wr wr = {
      .wr_id = seq + 1,
      .sg_list = len ? &sge : NULL,
      .num_sge = len ? 1 : 0,
      .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
      .send_flags = (signal ? IBV_SEND_SIGNALED : 0) | (len <= c->max_inline ? IBV_SEND_INLINE : 0),
      .imm_data = htonl(imm),
      .wr = {.rdma = {.remote_addr = c->remote_ring + (uint64_t)slot * SLOT, .rkey = c->remote_rkey}},
  }, *bad;
  if (ibv_post_send(c->qp, &wr, &bad) != 0) {
    return verbs_error("ibv_post_send");
  }
  c->posted++;
  c->sq_used++;
  if (signal) {
    c->last_signaled = c->posted;
  }
  return HORA_SUCCESS;
}

static int ib_progress(hora__comm *comm, hora__conn *conn, bool *progressed) {
  struct ib_conn *c = (struct ib_conn *)conn;
  HORA_CHECK(drain_cq(progressed));
  struct ibv_async_event ev;
  while (ibv_get_async_event(dev->ctx, &ev) == 0) {
    enum ibv_event_type t = ev.event_type;
    ibv_ack_async_event(&ev);
    if (t == IBV_EVENT_PORT_ERR || t == IBV_EVENT_DEVICE_FATAL || t == IBV_EVENT_QP_FATAL) {
      return hora__error(HORA_ERR_PEER_LOST, "RDMA device %s: %s", dev->name, ibv_event_type_str(t));
    }
  }
  if (c->error) {
    return conn_failed(comm, c);
  }
  /* Received slots into posted receives, in order. */
  while (conn->recv_head && c->ring_ready > 0) {
    hora__xfer *x = conn->recv_head;
    uint32_t slot = c->ring_head % SLOTS;
    uint32_t avail = c->ring_len[slot] - c->head_off;
    size_t n = HORA_MIN((size_t)avail, x->left);
    memcpy(x->ptr, c->ring + (size_t)slot * SLOT + c->head_off, n);
    x->ptr += n;
    x->left -= n;
    c->head_off += (uint32_t)n;
    *progressed = true;
    if (c->head_off == c->ring_len[slot]) {
      c->ring_head++;
      c->ring_ready--;
      c->head_off = 0;
      c->credits_owed++;
    }
    if (x->left == 0) {
      pop(&conn->recv_head, &conn->recv_tail);
    }
  }
  /* Queued sends into free slots, while the receiver has room; each also
   * gives back the slots we have emptied. */
  while (conn->send_head && c->credits > 0 && c->send_busy < SLOTS && c->sq_used < SEND_DEPTH) {
    hora__xfer *x = conn->send_head;
    uint32_t slot = c->send_next % SLOTS;
    size_t n = HORA_MIN(x->left, (size_t)SLOT);
    memcpy(c->send_buf + (size_t)slot * SLOT, x->ptr, n);
    uint32_t imm = c->credits_owed << IMM_CREDITS_SHIFT | slot << IMM_SLOT_SHIFT | (uint32_t)n;
    HORA_CHECK(post_write(c, slot, (uint32_t)n, imm, 1));
    c->credits_owed = 0;
    c->send_next++;
    c->send_busy++;
    c->credits--;
    x->ptr += n;
    x->left -= n;
    *progressed = true;
    if (x->left == 0) {
      pop(&conn->send_head, &conn->send_tail);
    }
  }
  /* With nothing to carry them, return slots alone once half the ring is
   * owed: a sender never waits on fewer than half the slots, and the
   * receiver, wanting more data, always empties enough to get there. */
  if (c->credits_owed >= SLOTS / 2 && c->sq_used < SEND_DEPTH) {
    HORA_CHECK(post_write(c, 0, 0, IMM_CREDIT | c->credits_owed << IMM_CREDITS_SHIFT, 0));
    c->credits_owed = 0;
  }
  return HORA_SUCCESS;
}

/* Before the coordinator sleeps: arm the completion channel, and look once
 * more, since completions that came before arming wake nobody. */
static int ib_poll_fd(hora__conn *conn, short *events) {
  (void)conn;
  *events = POLLIN;
  struct ibv_cq *cq;
  void *cq_ctx;
  while (ibv_get_cq_event(dev->channel, &cq, &cq_ctx) == 0) {
    ibv_ack_cq_events(cq, 1);
  }
  uint64_t v;
  while (read(dev->kick_fd, &v, sizeof(v)) > 0) {
  }
  ibv_req_notify_cq(dev->cq, 0);
  /* Book what came in before arming; if anything did (or failed), a kick
   * makes poll() return at once so that progress acts on it. */
  bool any = false;
  if (drain_cq(&any) != HORA_SUCCESS || any) {
    uint64_t one = 1;
    ssize_t w = write(dev->kick_fd, &one, sizeof(one));
    (void)w;
    return dev->kick_fd;
  }
  return dev->channel->fd;
}

static int ib_reg_mem(hora__comm *comm, void *buf, size_t len, void **handle) {
  (void)comm;
  struct ibv_mr *mr = ibv_reg_mr(dev->pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!mr) {
    return hora__error_errno(HORA_ERR_SYSTEM, "ibv_reg_mr of %zu bytes", len);
  }
  *handle = mr;
  return HORA_SUCCESS;
}

static int ib_dereg_mem(hora__comm *comm, void *handle) {
  (void)comm;
  if (handle && ibv_dereg_mr(handle) != 0) {
    return hora__error_errno(HORA_ERR_SYSTEM, "ibv_dereg_mr");
  }
  return HORA_SUCCESS;
}

/* Teardown in the order verbs requires: QP, then its memory regions; the
 * CQ, channel, PD and device go with the last connection. */
static void ib_close(hora__conn *conn) {
  struct ib_conn *c = (struct ib_conn *)conn;
  if (dev) {
    for (int i = 0; i < dev->nconns; i++) {
      if (dev->conns[i] == c) {
        dev->conns[i] = dev->conns[--dev->nconns];
        break;
      }
    }
  }
  if (c->qp) {
    ibv_destroy_qp(c->qp);
  }
  if (c->send_mr) {
    ibv_dereg_mr(c->send_mr);
  }
  if (c->ring_mr) {
    ibv_dereg_mr(c->ring_mr);
  }
  free(c->send_buf);
  free(c->ring);
  if (c->fd >= 0) {
    close(c->fd);
  }
  free(c);
  dev_put();
}

const struct hora__transport hora__transport_ib = {
    .name = "ib",
    .adopt_socket = ib_adopt_socket,
    .isend = ib_isend,
    .irecv = ib_irecv,
    .progress = ib_progress,
    .poll_fd = ib_poll_fd,
    .reg_mem = ib_reg_mem,
    .dereg_mem = ib_dereg_mem,
    .close = ib_close,
};

#endif /* HORA_HAVE_VERBS */
