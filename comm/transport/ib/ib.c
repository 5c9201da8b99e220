/* RDMA transport over libibverbs (InfiniBand and RoCE).
 *
 * Connection: one reliable-connected queue pair per peer. The peers first
 * meet on an authenticated TCP socket (bootstrap.c), over which they swap,
 * without blocking (every connection of the process at once), what the
 * other needs: QP number, LID, GID, MTU, and the address and rkey of their
 * receive ring. The socket then only stays open as a liveness signal.
 *
 * Data: a byte stream, like the TCP transport. The sender copies a chunk of
 * at most SLOT bytes into one of its registered send slots and writes it
 * with RDMA WRITE WITH IMMEDIATE into the next slot of the receiver's ring;
 * the immediate carries the slot and the length. The receiver copies slots
 * out, in order, into the posted receives, and gives each slot back with a
 * credit: a zero-byte write whose immediate counts the slots returned.
 *
 * Zero copy: a receive of at least HORA_IB_ZERO_COPY_MIN bytes first tells
 * the sender where it goes, with a descriptor written into the sender's
 * control array. Inside registered memory (the fusion buffer, the ring's
 * staging) that is the address and rkey, and the sender writes the bytes
 * straight there: from its own registered memory with no copy at all, else
 * through its send slots. Elsewhere the descriptor says "use the ring".
 * Both sides apply the same size test to transfers of the same length, so
 * they always agree on which transfers carry a descriptor.
 *
 * GPUDirect: device memory registered through its dma-buf (reg_dmabuf) is
 * never touched by the CPU, so every transfer into or out of it is direct,
 * whatever its size; the algorithms use device memory at both ends.
 *
 *   receiver --descriptor(addr, rkey, len)--> sender's control array
 *   sender   --RDMA_WRITE ... RDMA_WRITE_WITH_IMM(done)--> receive buffer
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
#include "base/common.h"

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

#include "base/log.h"
#include "base/params.h"
#include "comm/transport/builtin.h"
#include "comm/transport/net.h"
#include "comm/transport/ib/ib_wire.h"

#define SLOTS HORA_IB_SLOTS
#define SLOT HORA_IB_SLOT
#define RTR_SLOTS 8           /* receive descriptors in flight per connection */
#define RECV_DEPTH (2 * SLOTS + 2 * RTR_SLOTS) /* receive WRs kept posted */
#define SEND_DEPTH (2 * SLOTS + 2 * RTR_SLOTS)
#define ZC_PIECE (1u << 30)   /* largest single RDMA write */
#define SIGNAL_EVERY 8 /* ask for a send completion on every 8th write */
/* Immediate data: see ib_wire.h. */
#define INLINE_MAX 128 /* small writes travel inside the work request */
#define IMM_CREDIT HORA_IB_IMM_BARE
#define IMM_CREDITS_SHIFT HORA_IB_IMM_CREDITS_SHIFT
#define IMM_SLOT_SHIFT HORA_IB_IMM_SLOT_SHIFT
enum {
  KIND_CREDIT = HORA_IB_KIND_CREDIT,
  KIND_DESCRIPTOR = HORA_IB_KIND_DESCRIPTOR,
  KIND_DIRECT_DONE = HORA_IB_KIND_DIRECT_DONE
};

/* Where a receive wants its bytes; len 0: through the ring. */
struct ib_descriptor {
  uint64_t addr;
  uint64_t len;
  uint32_t rkey;
  uint32_t pad;
};

/* hora__xfer.mode of a receive: decided when its descriptor goes out. */
enum { RECV_UNDECIDED = 0, RECV_RING, RECV_DIRECT, RECV_FLUSHING };
/* How the send at the head of the queue travels. */
enum { SEND_UNDECIDED = 0, SEND_RING, SEND_DIRECT, SEND_DIRECT_VIA_SLOTS };

/* A buffer registered by hora__comm_register: big transfers into or out
 * of it move without a copy. */
struct ib_region {
  char *base;
  size_t len;
  struct ibv_mr *mr;
  bool device; /* GPU memory: direct transfers only */
};

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
  uint64_t async_checked; /* when async events were last read */
  bool armed;
  int refs;
  struct ib_conn **conns; /* by slot in the table below, for completion dispatch */
  int nconns, capconns;
  struct ib_region *regions;
  int nregions, capregions;
  /* GPUDirect: a queue pair connected to itself, whose 1-byte RDMA READ
   * of GPU memory after a direct write into it makes the NIC's writes
   * visible to the GPU before anyone reads them. */
  struct ibv_qp *flush_qp;
  struct ibv_mr *flush_mr;
  char *flush_buf;
  uint64_t flush_posted, flush_done;
  char flush_error[160];
  /* Bytes sent each way, logged (info) when the device closes. */
  uint64_t bytes_direct, bytes_via_slots, bytes_ring;
  char name[64];
};

static struct ib_ctx *dev; /* coordinator thread only */

static uint64_t zero_copy_min(void) {
  int64_t v = hora__params.IB_ZERO_COPY_MIN;
  return v > 0 ? (uint64_t)v : UINT64_MAX;
}


/* Where a connection's set-up stands: the two sides swap their records
 * over the socket, connect the queue pair, then swap one byte saying it
 * can receive, so that nobody writes before the other side is ready. */
enum ib_setup { SETUP_RECORDS, SETUP_READY, SETUP_DONE };

struct ib_conn {
  struct hora__conn base;
  int fd; /* the TCP socket the peers met on */
  enum ib_setup setup;
  struct hora__ib_record me, them; /* the records swapped during set-up */
  uint8_t me_wire[HORA_IB_RECORD_SIZE], them_wire[HORA_IB_RECORD_SIZE];
  size_t sent, got;         /* bytes of the current swap moved */
  uint32_t psn;             /* our first packet sequence number */
  struct ibv_qp *qp;
  char *send_buf, *ring;
  struct ibv_mr *send_mr, *ring_mr;
  uint64_t remote_ring;
  uint32_t remote_rkey;
  /* Descriptors: ctl[0..RTR_SLOTS) are the peer's, for our sends;
   * ctl[RTR_SLOTS..) stage ours when they cannot go inline. */
  struct ib_descriptor *ctl;
  struct ibv_mr *ctl_mr;
  uint64_t remote_ctl;
  uint32_t remote_ctl_rkey;
  hora__xfer *desc_cursor; /* first receive not yet decided */
  uint32_t desc_sent;      /* descriptors written (slot index at the peer) */
  uint32_t desc_live;      /* of those, receives not yet complete */
  uint32_t direct_done;    /* direct writes finished, not yet booked */
  uint32_t desc_got, desc_used; /* the peer's descriptors arrived / consumed */
  uint64_t flush_seq;      /* the flush the head receive waits for */
  size_t zc_min;           /* transfers this big or bigger carry a descriptor */
  int head_mode;           /* SEND_* of the send at the head */
  uint64_t head_raddr;     /* where its next byte goes (direct) */
  uint32_t head_rkey, head_lkey;
  /* Direct sends posted, waiting for their last write to complete. */
  struct {
    hora__xfer *x;
    uint64_t seq;
  } direct_wait[RTR_SLOTS];
  uint32_t direct_wait_head, direct_wait_n;
  /* Sending: slots are used round-robin; a slot is free again when its
   * write completed locally, and the peer has room when it returned the
   * matching credit. */
  uint32_t send_next;      /* next remote ring slot to write */
  uint32_t local_next;     /* next local send slot to fill */
  uint32_t send_busy;      /* data writes posted, not yet completed locally */
  uint32_t sq_used;        /* all writes (data and credits) not yet completed */
  /* Only some writes are signalled; a completion retires every write up to
   * it, in order. is_data[seq % SEND_DEPTH] says which of them used a slot. */
  uint64_t posted, retired, last_signaled;
  uint8_t is_data[SEND_DEPTH];
  uint32_t credits;        /* remote slots we may write */
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
  HORA_INFO("rdma: sent %llu bytes straight from registered memory into the peer's, %llu through "
            "send slots into the peer's registered memory, %llu through the receive ring",
            (unsigned long long)dev->bytes_direct, (unsigned long long)dev->bytes_via_slots,
            (unsigned long long)dev->bytes_ring);
  if (dev->flush_qp) {
    ibv_destroy_qp(dev->flush_qp);
  }
  if (dev->flush_mr) {
    ibv_dereg_mr(dev->flush_mr);
  }
  free(dev->flush_buf);
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
  free(dev->regions);
  free(dev);
  dev = NULL;
}

static int dev_get(hora__net *net) {
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
  int cqe = (RECV_DEPTH + SEND_DEPTH) * HORA_MAX(net->size, 4);
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
static bool ib_available(void) {
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

/* One step of swapping n bytes over the set-up socket without blocking;
 * *done once both directions are complete. */
static int swap_step(struct ib_conn *c, const void *out, void *in, size_t n, bool *done) {
  char name[32];
  snprintf(name, sizeof(name), "rank %d", c->base.peer);
  while (c->sent < n) {
    ssize_t w = send(c->fd, (const char *)out + c->sent, n - c->sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
      break;
    }
    if (w < 0) {
      return hora__error_errno(HORA_ERR_PEER_LOST, "RDMA connection set-up with %s (send)", name);
    }
    c->sent += (size_t)w;
  }
  while (c->got < n) {
    ssize_t r = recv(c->fd, (char *)in + c->got, n - c->got, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
      break;
    }
    if (r <= 0) {
      return r == 0 ? hora__error(HORA_ERR_PEER_LOST, "RDMA connection set-up: %s closed the "
                                  "connection", name)
                    : hora__error_errno(HORA_ERR_PEER_LOST, "RDMA connection set-up with %s "
                                        "(receive)", name);
    }
    c->got += (size_t)r;
  }
  *done = c->sent == n && c->got == n;
  if (*done) {
    c->sent = c->got = 0;
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

/* INIT -> RTR -> RTS towards peer; c (when given) gets its receives posted
 * before the QP can receive. */
static int connect_qp(struct ibv_qp *qp, struct ib_conn *c, const struct hora__ib_record *peer,
                      uint32_t my_psn) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_INIT;
  a.port_num = (uint8_t)dev->port;
  a.pkey_index = 0;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    return verbs_error("ibv_modify_qp(INIT)");
  }
  for (int i = 0; c && i < RECV_DEPTH; i++) {
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
  if (ibv_modify_qp(qp, &a,
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
  if (ibv_modify_qp(qp, &a,
                    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                        IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC)) {
    return verbs_error("ibv_modify_qp(RTS)");
  }
  return HORA_SUCCESS;
}

static void ib_close(hora__conn *conn);

/* Both sides start alike: the queue pair and the connection's buffers,
 * then the swap of records. */
static int ib_begin(hora__net *net, int fd, int peer, hora__conn **out) {
  int rc = dev_get(net);
  if (rc != HORA_SUCCESS) {
    close(fd);
    return rc;
  }
  struct ib_conn *c = hora__calloc(1, sizeof(*c));
  if (!c) {
    close(fd);
    dev_put();
    return HORA_ERR_NO_MEMORY;
  }
  c->base.tp = &hora__transport_ib;
  c->base.peer = peer;
  c->fd = fd;
  c->credits = SLOTS;
  c->setup = SETUP_RECORDS;
  c->send_buf = hora__aligned_alloc(4096, (size_t)SLOTS * SLOT);
  c->ring = hora__aligned_alloc(4096, (size_t)SLOTS * SLOT);
  c->ctl = hora__aligned_alloc(4096, 2 * RTR_SLOTS * sizeof(*c->ctl));
  if (!c->send_buf || !c->ring || !c->ctl) {
    rc = HORA_ERR_NO_MEMORY;
    goto fail;
  }
  /* The NIC writes the ring and the descriptors behind the compiler's (and
   * valgrind's) back: start them defined. */
  memset(c->ring, 0, (size_t)SLOTS * SLOT);
  memset(c->ctl, 0, 2 * RTR_SLOTS * sizeof(*c->ctl));
  /* Registered once, for the life of the connection. */
  c->send_mr = ibv_reg_mr(dev->pd, c->send_buf, (size_t)SLOTS * SLOT, IBV_ACCESS_LOCAL_WRITE);
  c->ring_mr = ibv_reg_mr(dev->pd, c->ring, (size_t)SLOTS * SLOT,
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  c->ctl_mr = ibv_reg_mr(dev->pd, c->ctl, 2 * RTR_SLOTS * sizeof(*c->ctl),
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
  bool mrs = c->send_mr && c->ring_mr && c->ctl_mr;
  c->qp = mrs ? ibv_create_qp(dev->pd, &qa) : NULL;
  if (!c->qp) {
    /* Some devices take no inline data: try again without. */
    qa.cap.max_inline_data = 0;
    c->qp = mrs ? ibv_create_qp(dev->pd, &qa) : NULL;
  }
  c->max_inline = qa.cap.max_inline_data;
  if (!c->qp) {
    rc = verbs_error("ibv_reg_mr/ibv_create_qp");
    goto fail;
  }
  c->psn = (uint32_t)(hora__now_ns() & 0xffffff);
  c->me = (struct hora__ib_record){.qpn = c->qp->qp_num,
                                   .psn = c->psn,
                                   .lid = dev->lid,
                                   .mtu = (uint8_t)dev->mtu,
                                   .ring_addr = (uint64_t)(uintptr_t)c->ring,
                                   .ring_rkey = c->ring_mr->rkey,
                                   .ctl_rkey = c->ctl_mr->rkey,
                                   .ctl_addr = (uint64_t)(uintptr_t)c->ctl,
                                   .zero_copy_min = zero_copy_min()};
  memcpy(c->me.gid, dev->gid.raw, 16);
  hora__ib_record_encode(&c->me, c->me_wire);
  *out = &c->base;
  return HORA_SUCCESS;
fail:
  ib_close(&c->base); /* closes the socket too */
  return rc;
}

static int ib_establish(hora__net *net, hora__conn *conn, bool *ready, int *fd, short *events) {
  (void)net;
  struct ib_conn *c = (struct ib_conn *)conn;
  bool done = false;
  *ready = false;
  if (c->setup == SETUP_RECORDS) {
    HORA_CHECK(swap_step(c, c->me_wire, c->them_wire, HORA_IB_RECORD_SIZE, &done));
    if (done) {
      const struct hora__ib_record *them = &c->them;
      HORA_CHECK(hora__ib_record_decode(c->them_wire, conn->peer, &c->them));
      c->remote_ring = them->ring_addr;
      c->remote_rkey = them->ring_rkey;
      c->remote_ctl = them->ctl_addr;
      c->remote_ctl_rkey = them->ctl_rkey;
      /* Both ends must agree on which transfers carry a descriptor. */
      c->zc_min = (size_t)HORA_MAX(c->me.zero_copy_min, them->zero_copy_min);
      HORA_CHECK(connect_qp(c->qp, c, them, c->psn));
      c->setup = SETUP_READY;
    }
  }
  if (c->setup == SETUP_READY) {
    static const uint8_t can_receive = 1;
    uint8_t peer_can_receive = 0;
    HORA_CHECK(swap_step(c, &can_receive, &peer_can_receive, 1, &done));
    if (done && peer_can_receive != can_receive) {
      return hora__error(HORA_ERR_PROTOCOL, "RDMA connection set-up: rank %d sent %u where it "
                         "says it can receive (1)", conn->peer, peer_can_receive);
    }
    if (done) {
      if (dev->nconns == dev->capconns) {
        int cap = dev->capconns ? 2 * dev->capconns : 8;
        struct ib_conn **p = hora__realloc(dev->conns, (size_t)cap * sizeof(*p));
        if (!p) {
          return HORA_ERR_NO_MEMORY;
        }
        dev->conns = p;
        dev->capconns = cap;
      }
      dev->conns[dev->nconns++] = c;
      c->setup = SETUP_DONE;
    }
  }
  *ready = c->setup == SETUP_DONE;
  *fd = c->fd;
  size_t swapping = c->setup == SETUP_RECORDS ? HORA_IB_RECORD_SIZE : 1;
  *events = (short)(POLLIN | (c->sent < swapping ? POLLOUT : 0));
  return HORA_SUCCESS;
}

/* ---- data path ------------------------------------------------------------------- */

/* Takes the head off its queue; the caller decides when it is done. */
static hora__xfer *unlink_head(hora__xfer **head, hora__xfer **tail) {
  hora__xfer *x = *head;
  *head = x->next;
  if (!*head) {
    *tail = NULL;
  }
  return x;
}

static void pop(hora__xfer **head, hora__xfer **tail) {
  unlink_head(head, tail)->done = true;
}


/* The registered region holding all of [p, p + len), if any. */
static const struct ib_region *region_of(const void *p, size_t len) {
  const char *a = p;
  for (int i = 0; i < dev->nregions; i++) {
    const struct ib_region *r = &dev->regions[i];
    if (a >= r->base && len <= r->len && (size_t)(a - r->base) <= r->len - len) {
      return r;
    }
  }
  return NULL;
}

static int ib_isend(hora__conn *conn, const void *buf, size_t len, hora__xfer *x) {
  x->ptr = (char *)(uintptr_t)buf;
  x->left = len;
  x->done = len == 0;
  x->mode = 0;
  if (!x->done) {
    hora__xfer_enqueue(&conn->send_head, &conn->send_tail, x);
  }
  return HORA_SUCCESS;
}

static int ib_irecv(hora__conn *conn, void *buf, size_t len, hora__xfer *x) {
  struct ib_conn *c = (struct ib_conn *)conn;
  x->ptr = buf;
  x->left = len;
  x->done = len == 0;
  x->mode = RECV_UNDECIDED;
  if (!x->done) {
    hora__xfer_enqueue(&conn->recv_head, &conn->recv_tail, x);
    if (!c->desc_cursor) {
      c->desc_cursor = x;
    }
  }
  return HORA_SUCCESS;
}

static void recv_complete(struct ib_conn *c) {
  hora__xfer *x = c->base.recv_head;
  if (x->mode != RECV_UNDECIDED) {
    c->desc_live--; /* the sender has read its descriptor: the slot is free */
  }
  if (c->desc_cursor == x) {
    c->desc_cursor = x->next;
  }
  pop(&c->base.recv_head, &c->base.recv_tail);
}

static int conn_failed(hora__net *net, struct ib_conn *c) {
  char name[160];
  return hora__error(HORA_ERR_PEER_LOST, "RDMA connection to %s failed: %s",
                     hora__peer_name(net, c->base.peer, name, sizeof(name)), c->error_msg);
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
      if (dev->flush_qp && wc[i].qp_num == dev->flush_qp->qp_num) {
        if (wc[i].status != IBV_WC_SUCCESS && !dev->flush_error[0]) {
          snprintf(dev->flush_error, sizeof(dev->flush_error), "RDMA flush of GPU memory on %s: %s",
                   dev->name, ibv_wc_status_str(wc[i].status));
        }
        dev->flush_done = HORA_MAX(dev->flush_done, (uint64_t)wc[i].wr_id);
        continue;
      }
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
        /* The slot indexes ring_len and the length sizes a copy out of
         * the ring: checked before either is used. */
        struct hora__ib_ring_state st = {c->ring_head, c->ring_ready, c->credits};
        struct hora__ib_imm m;
        HORA_CHECK(hora__ib_imm_decode(ntohl(wc[i].imm_data), &st, c->base.peer, &m));
        c->credits += m.credits;
        if (!m.bare) {
          c->ring_len[m.slot] = m.len;
          c->ring_ready++;
        } else if (m.kind == KIND_DESCRIPTOR) {
          if (c->desc_got - c->desc_used >= RTR_SLOTS) {
            return hora__error(HORA_ERR_PROTOCOL, "rank %d announced more than %d RDMA receive "
                               "descriptors at once", c->base.peer, RTR_SLOTS);
          }
          c->desc_got++;
        } else if (m.kind == KIND_DIRECT_DONE) {
          c->direct_done++;
        }
        HORA_CHECK(post_recv(c));
      } else if (wc[i].opcode == IBV_WC_RDMA_WRITE) {
        /* wr_id is the write's sequence number + 1: it and all before it
         * are done. */
        for (; c->retired < wc[i].wr_id; c->retired++) {
          c->sq_used--;
          c->send_busy -= c->is_data[c->retired % SEND_DEPTH];
        }
        /* Direct sends whose last write is among them: the caller may
         * have its memory back. */
        while (c->direct_wait_n > 0 && c->direct_wait[c->direct_wait_head].seq <= c->retired) {
          c->direct_wait[c->direct_wait_head].x->done = true;
          c->direct_wait_head = (c->direct_wait_head + 1) % RTR_SLOTS;
          c->direct_wait_n--;
          c->base.pending--;
        }
      }
    }
  }
}

/* One RDMA write of len bytes at local (lkey) to raddr (rkey); with an
 * immediate when with_imm. data: it fills a send slot. */
static int post_write(struct ib_conn *c, const void *local, uint32_t lkey, uint32_t len,
                      uint64_t raddr, uint32_t rkey, bool with_imm, uint32_t imm, int data,
                      bool must_signal) {
  uint64_t seq = c->posted;
  c->is_data[seq % SEND_DEPTH] = (uint8_t)data;
  /* Signal often enough that a completion freeing room is always on its
   * way before slots or queue entries could run out. */
  bool signal = must_signal || seq + 1 - c->last_signaled >= SIGNAL_EVERY ||
                c->send_busy + 1 >= SLOTS / 2 || c->sq_used + 1 >= SEND_DEPTH / 2;
  struct ibv_sge sge = {.addr = (uintptr_t)local, .length = len, .lkey = lkey};
  struct ibv_send_wr wr = {
      .wr_id = seq + 1,
      .sg_list = len ? &sge : NULL,
      .num_sge = len ? 1 : 0,
      .opcode = with_imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
      .send_flags = (signal ? IBV_SEND_SIGNALED : 0) | (len <= c->max_inline ? IBV_SEND_INLINE : 0),
      .imm_data = htonl(imm),
      .wr = {.rdma = {.remote_addr = raddr, .rkey = rkey}},
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

static uint32_t bare_imm(struct ib_conn *c, uint32_t kind) {
  uint32_t imm = IMM_CREDIT | c->credits_owed << IMM_CREDITS_SHIFT | kind << IMM_SLOT_SHIFT;
  c->credits_owed = 0;
  return imm;
}

/* Reads one byte of GPU memory just written by the NIC, through the
 * loopback queue pair: the read completes only after those writes. */
static int post_flush(const struct ib_region *r, const char *at, uint64_t *seq) {
  struct ibv_sge sge = {.addr = (uintptr_t)dev->flush_buf, .length = 1, .lkey = dev->flush_mr->lkey};
  struct ibv_send_wr wr = {
      .wr_id = dev->flush_posted + 1,
      .sg_list = &sge,
      .num_sge = 1,
      .opcode = IBV_WR_RDMA_READ,
      .send_flags = IBV_SEND_SIGNALED,
      .wr = {.rdma = {.remote_addr = (uintptr_t)at, .rkey = r->mr->rkey}},
  }, *bad;
  if (ibv_post_send(dev->flush_qp, &wr, &bad) != 0) {
    return verbs_error("ibv_post_send(flush read)");
  }
  *seq = ++dev->flush_posted;
  return HORA_SUCCESS;
}

/* The loopback queue pair of the flushes, made with the first device region. */
static int open_flush_qp(void) {
  if (dev->flush_qp) {
    return HORA_SUCCESS;
  }
  dev->flush_buf = hora__aligned_alloc(64, 64);
  dev->flush_mr = dev->flush_buf ? ibv_reg_mr(dev->pd, dev->flush_buf, 64, IBV_ACCESS_LOCAL_WRITE) : NULL;
  /* One flush in flight per connection at most. */
  struct ibv_qp_init_attr qa = {
      .send_cq = dev->cq,
      .recv_cq = dev->cq,
      .cap = {.max_send_wr = (uint32_t)HORA_MAX(2 * dev->nconns, 64), .max_recv_wr = 1,
              .max_send_sge = 1, .max_recv_sge = 1},
      .qp_type = IBV_QPT_RC,
  };
  dev->flush_qp = dev->flush_mr ? ibv_create_qp(dev->pd, &qa) : NULL;
  if (!dev->flush_qp) {
    return verbs_error("setting up the GPUDirect flush queue pair");
  }
  uint32_t psn = (uint32_t)(hora__now_ns() & 0xffffff);
  struct hora__ib_record self = {.qpn = dev->flush_qp->qp_num, .psn = psn, .lid = dev->lid,
                         .mtu = (uint8_t)dev->mtu};
  memcpy(self.gid, dev->gid.raw, 16);
  return connect_qp(dev->flush_qp, NULL, &self, psn);
}

/* Receives, in posting order, tell the sender where big ones go. */
static int post_descriptors(struct ib_conn *c, size_t zc_min, bool *progressed) {
  while (c->desc_cursor && c->desc_live < RTR_SLOTS && c->sq_used < SEND_DEPTH) {
    hora__xfer *x = c->desc_cursor;
    const struct ib_region *r = region_of(x->ptr, x->left);
    if (x->left >= zc_min || (r && r->device)) {
      uint32_t i = c->desc_sent % RTR_SLOTS;
      struct ib_descriptor *d = &c->ctl[RTR_SLOTS + i];
      *d = (struct ib_descriptor){.addr = r ? (uintptr_t)x->ptr : 0,
                                  .len = r ? x->left : 0,
                                  .rkey = r ? r->mr->rkey : 0};
      x->mode = r ? RECV_DIRECT : RECV_RING;
      HORA_CHECK(post_write(c, d, c->ctl_mr->lkey, sizeof(*d),
                            c->remote_ctl + i * sizeof(*d), c->remote_ctl_rkey, true,
                            bare_imm(c, KIND_DESCRIPTOR), 0, false));
      c->desc_sent++;
      c->desc_live++;
      *progressed = true;
    }
    c->desc_cursor = x->next;
  }
  return HORA_SUCCESS;
}

/* Received bytes into posted receives, in order: ring slots are copied
 * out; a direct receive is complete when its sender says so. */
static int deliver_received(hora__net *net, struct ib_conn *c, bool *progressed) {
  hora__conn *conn = &c->base;
  while (conn->recv_head) {
    hora__xfer *x = conn->recv_head;
    if (x->mode == RECV_DIRECT) {
      if (c->direct_done == 0) {
        if (c->ring_ready > 0) {
          /* Writes arrive in order: ring data ahead of the direct write's
           * end means the sender did not take the descriptor. */
          char name[160];
          const struct ib_region *r = region_of(x->ptr, x->left);
          return hora__error(HORA_ERR_PROTOCOL,
                             "RDMA transfer from %s out of step: %zu bytes came through the ring "
                             "for a receive into registered %s memory",
                             hora__peer_name(net, c->base.peer, name, sizeof(name)),
                             (size_t)c->ring_len[c->ring_head % SLOTS],
                             r && r->device ? "device" : "host");
        }
        return HORA_SUCCESS;
      }
      c->direct_done--;
      *progressed = true;
      const struct ib_region *r = region_of(x->ptr, x->left);
      if (r && r->device) {
        HORA_CHECK(post_flush(r, x->ptr, &c->flush_seq));
        x->mode = RECV_FLUSHING;
        continue;
      }
      x->ptr += x->left;
      x->left = 0;
      recv_complete(c);
      continue;
    }
    if (x->mode == RECV_FLUSHING) {
      if (dev->flush_error[0]) {
        return hora__error(HORA_ERR_SYSTEM, "%s", dev->flush_error);
      }
      if (dev->flush_done < c->flush_seq) {
        return HORA_SUCCESS;
      }
      x->ptr += x->left;
      x->left = 0;
      recv_complete(c);
      *progressed = true;
      continue;
    }
    if (c->ring_ready == 0) {
      return HORA_SUCCESS;
    }
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
      recv_complete(c);
    }
  }
  return HORA_SUCCESS;
}

/* How the send at the head travels; false while its descriptor is still
 * on the way. */
static int decide_send(hora__net *net, struct ib_conn *c, hora__xfer *x, size_t zc_min,
                       bool *decided) {
  *decided = true;
  if (c->head_mode != SEND_UNDECIDED) {
    return HORA_SUCCESS;
  }
  const struct ib_region *r = region_of(x->ptr, x->left);
  bool device = r && r->device;
  if (x->left < zc_min && !device) {
    c->head_mode = SEND_RING;
    return HORA_SUCCESS;
  }
  if (c->desc_used == c->desc_got) {
    *decided = false;
    return HORA_SUCCESS;
  }
  struct ib_descriptor d = c->ctl[c->desc_used++ % RTR_SLOTS];
  char name[160];
  if (d.len == 0 && device) {
    return hora__error(HORA_ERR_SYSTEM,
                       "RDMA transfer to %s: device memory can only be written straight into "
                       "registered device memory, and the receiver's buffer is not",
                       hora__peer_name(net, c->base.peer, name, sizeof(name)));
  }
  if (d.len == 0) {
    c->head_mode = SEND_RING;
    return HORA_SUCCESS;
  }
  if (d.len != x->left) {
    return hora__error(HORA_ERR_PROTOCOL,
                       "RDMA transfer to %s out of step: it expects %llu bytes, this send has %zu",
                       hora__peer_name(net, c->base.peer, name, sizeof(name)),
                       (unsigned long long)d.len, x->left);
  }
  c->head_raddr = d.addr;
  c->head_rkey = d.rkey;
  c->head_mode = r ? SEND_DIRECT : SEND_DIRECT_VIA_SLOTS;
  c->head_lkey = r ? r->mr->lkey : 0;
  return HORA_SUCCESS;
}

/* Queued sends, in order, each the way its receiver asked for. */
static int post_sends(hora__net *net, struct ib_conn *c, size_t zc_min, bool *progressed) {
  hora__conn *conn = &c->base;
  while (conn->send_head && c->sq_used < SEND_DEPTH) {
    hora__xfer *x = conn->send_head;
    bool decided;
    HORA_CHECK(decide_send(net, c, x, zc_min, &decided));
    if (!decided) {
      return HORA_SUCCESS;
    }
    size_t n;
    bool last;
    if (c->head_mode == SEND_DIRECT) {
      /* Straight from the caller's registered memory: the send is done
       * when its last write completes here. */
      if (c->direct_wait_n == RTR_SLOTS) {
        return HORA_SUCCESS;
      }
      n = HORA_MIN(x->left, (size_t)ZC_PIECE);
      last = n == x->left;
      HORA_CHECK(post_write(c, x->ptr, c->head_lkey, (uint32_t)n, c->head_raddr, c->head_rkey, last,
                            last ? bare_imm(c, KIND_DIRECT_DONE) : 0, 0, last));
    } else {
      if (c->send_busy >= SLOTS || (c->head_mode == SEND_RING && c->credits == 0)) {
        return HORA_SUCCESS;
      }
      char *slot = c->send_buf + (size_t)(c->local_next++ % SLOTS) * SLOT;
      n = HORA_MIN(x->left, (size_t)SLOT);
      last = n == x->left;
      memcpy(slot, x->ptr, n);
      if (c->head_mode == SEND_RING) {
        /* Into the next slot of the receiver's ring; also gives back the
         * slots we have emptied. */
        uint32_t rs = c->send_next++ % SLOTS;
        uint32_t imm = c->credits_owed << IMM_CREDITS_SHIFT | rs << IMM_SLOT_SHIFT | (uint32_t)n;
        c->credits_owed = 0;
        c->credits--;
        HORA_CHECK(post_write(c, slot, c->send_mr->lkey, (uint32_t)n,
                              c->remote_ring + (uint64_t)rs * SLOT, c->remote_rkey, true, imm, 1,
                              false));
      } else {
        HORA_CHECK(post_write(c, slot, c->send_mr->lkey, (uint32_t)n, c->head_raddr, c->head_rkey,
                              last, last ? bare_imm(c, KIND_DIRECT_DONE) : 0, 1, false));
      }
      c->send_busy++;
    }
    x->ptr += n;
    x->left -= n;
    c->head_raddr += n;
    *(c->head_mode == SEND_DIRECT     ? &dev->bytes_direct
      : c->head_mode == SEND_RING     ? &dev->bytes_ring
                                      : &dev->bytes_via_slots) += n;
    *progressed = true;
    if (last) {
      if (c->head_mode == SEND_DIRECT) {
        uint32_t w = (c->direct_wait_head + c->direct_wait_n++) % RTR_SLOTS;
        c->direct_wait[w].x = unlink_head(&conn->send_head, &conn->send_tail);
        c->direct_wait[w].seq = c->posted;
        conn->pending++;
      } else {
        pop(&conn->send_head, &conn->send_tail);
      }
      c->head_mode = SEND_UNDECIDED;
    }
  }
  return HORA_SUCCESS;
}

static int ib_progress(hora__net *net, hora__conn *conn, bool *progressed) {
  struct ib_conn *c = (struct ib_conn *)conn;
  HORA_CHECK(drain_cq(progressed));
  /* Port and device events, at most once a millisecond: each look is a
   * system call, and a polling loop must stay cheap. */
  uint64_t now = hora__now_ns();
  if (now - dev->async_checked > 1000000) {
    dev->async_checked = now;
    struct ibv_async_event ev;
    while (ibv_get_async_event(dev->ctx, &ev) == 0) {
      enum ibv_event_type t = ev.event_type;
      ibv_ack_async_event(&ev);
      if (t == IBV_EVENT_PORT_ERR || t == IBV_EVENT_DEVICE_FATAL || t == IBV_EVENT_QP_FATAL) {
        return hora__error(HORA_ERR_PEER_LOST, "RDMA device %s: %s", dev->name,
                           ibv_event_type_str(t));
      }
    }
  }
  if (c->error) {
    return conn_failed(net, c);
  }
  HORA_CHECK(post_descriptors(c, c->zc_min, progressed));
  HORA_CHECK(deliver_received(net, c, progressed));
  HORA_CHECK(post_sends(net, c, c->zc_min, progressed));
  /* With nothing to carry them, return slots alone once half the ring is
   * owed: a sender never waits on fewer than half the slots, and the
   * receiver, wanting more data, always empties enough to get there. */
  if (c->credits_owed >= SLOTS / 2 && c->sq_used < SEND_DEPTH) {
    HORA_CHECK(post_write(c, NULL, 0, 0, c->remote_ring, c->remote_rkey, true,
                          bare_imm(c, KIND_CREDIT), 0, false));
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

/* Registered for the life of the buffer (hora__comm_register): the fusion
 * buffer and the ring's staging. Each region keeps the device open. */
static int add_region(hora__net *net, void *buf, size_t len, int dmabuf_fd, uint64_t offset,
                      void **handle) {
  *handle = NULL;
  HORA_CHECK(dev_get(net));
  if (dev->nregions == dev->capregions) {
    int cap = dev->capregions ? 2 * dev->capregions : 4;
    struct ib_region *p = hora__realloc(dev->regions, (size_t)cap * sizeof(*p));
    if (!p) {
      dev_put();
      return HORA_ERR_NO_MEMORY;
    }
    dev->regions = p;
    dev->capregions = cap;
  }
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  if (dmabuf_fd >= 0) {
    int rc = open_flush_qp();
    if (rc != HORA_SUCCESS) {
      dev_put();
      return rc;
    }
    access |= IBV_ACCESS_REMOTE_READ; /* the flush reads it */
  }
  struct ibv_mr *mr = dmabuf_fd >= 0
                          ? ibv_reg_dmabuf_mr(dev->pd, offset, len, (uintptr_t)buf, dmabuf_fd, access)
                          : ibv_reg_mr(dev->pd, buf, len, access);
  if (!mr) {
    int rc = hora__error_errno(HORA_ERR_SYSTEM, "%s of %zu bytes on %s",
                               dmabuf_fd >= 0 ? "ibv_reg_dmabuf_mr" : "ibv_reg_mr", len, dev->name);
    dev_put();
    return rc;
  }
  dev->regions[dev->nregions++] =
      (struct ib_region){.base = buf, .len = len, .mr = mr, .device = dmabuf_fd >= 0};
  *handle = mr;
  return HORA_SUCCESS;
}

static int ib_reg_mem(hora__net *net, void *buf, size_t len, void **handle) {
  return add_region(net, buf, len, -1, 0, handle);
}

/* GPU memory, through the dma-buf its driver exported for [buf, buf+len). */
static int ib_reg_dmabuf(hora__net *net, void *buf, size_t len, int fd, uint64_t offset,
                         void **handle) {
  return add_region(net, buf, len, fd, offset, handle);
}

static int ib_dereg_mem(hora__net *net, void *handle) {
  (void)net;
  if (!handle || !dev) {
    return HORA_SUCCESS;
  }
  for (int i = 0; i < dev->nregions; i++) {
    if (dev->regions[i].mr == handle) {
      dev->regions[i] = dev->regions[--dev->nregions];
      break;
    }
  }
  int rc = HORA_SUCCESS;
  if (ibv_dereg_mr(handle) != 0) {
    rc = hora__error_errno(HORA_ERR_SYSTEM, "ibv_dereg_mr");
  }
  dev_put();
  return rc;
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
  if (c->ctl_mr) {
    ibv_dereg_mr(c->ctl_mr);
  }
  free(c->send_buf);
  free(c->ring);
  free(c->ctl);
  if (c->fd >= 0) {
    close(c->fd);
  }
  free(c);
  dev_put();
}

const struct hora__transport hora__transport_ib = {
    .name = "ib",
    .available = ib_available,
    .zero_copy = true,
    .connect = ib_begin,
    .accept = ib_begin,
    .establish = ib_establish,
    .isend = ib_isend,
    .irecv = ib_irecv,
    .progress = ib_progress,
    .poll_fd = ib_poll_fd,
    .reg_mem = ib_reg_mem,
    .reg_dmabuf = ib_reg_dmabuf,
    .dereg_mem = ib_dereg_mem,
    .close = ib_close,
};

#endif /* HORA_HAVE_VERBS */
