/* An RDMA connection's set-up and teardown: its queue pair and buffers, the
 * swap of records over the socket the peers met on, the queue pair moved to
 * RTS, and the one byte that says each side can receive. */
#include "base/common.h"

#if HORA_HAVE_VERBS

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/params.h"
#include "comm/transport/ib/ib.h"

static uint64_t zero_copy_min(void) {
  int64_t v = hora__params.IB_ZERO_COPY_MIN;
  return v > 0 ? (uint64_t)v : UINT64_MAX;
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

int hora__ib_post_recv(struct ib_conn *c) {
  struct ibv_recv_wr wr = {.wr_id = (uintptr_t)c}, *bad;
  if (ibv_post_recv(c->qp, &wr, &bad) != 0) {
    return hora__ib_verbs_error("ibv_post_recv");
  }
  return HORA_SUCCESS;
}

/* INIT -> RTR -> RTS towards peer; c (when given) gets its receives posted
 * before the QP can receive. */
int hora__ib_connect_qp(struct ibv_qp *qp, struct ib_conn *c, const struct hora__ib_record *peer,
                        uint32_t my_psn) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_INIT;
  a.port_num = (uint8_t)hora__ib_dev->port;
  a.pkey_index = 0;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    return hora__ib_verbs_error("ibv_modify_qp(INIT)");
  }
  for (int i = 0; c && i < RECV_DEPTH; i++) {
    HORA_CHECK(hora__ib_post_recv(c));
  }
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = (enum ibv_mtu)HORA_MIN((int)hora__ib_dev->mtu, (int)peer->mtu);
  a.dest_qp_num = peer->qpn;
  a.rq_psn = peer->psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = (uint8_t)hora__ib_dev->port;
  a.ah_attr.dlid = peer->lid;
  if (hora__ib_dev->roce || peer->lid == 0) {
    a.ah_attr.is_global = 1;
    memcpy(a.ah_attr.grh.dgid.raw, peer->gid, 16);
    a.ah_attr.grh.sgid_index = (uint8_t)hora__ib_dev->gid_index;
    a.ah_attr.grh.hop_limit = 64;
  }
  if (ibv_modify_qp(qp, &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
    return hora__ib_verbs_error("ibv_modify_qp(RTR)");
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
    return hora__ib_verbs_error("ibv_modify_qp(RTS)");
  }
  return HORA_SUCCESS;
}

/* Both sides start alike: the queue pair and the connection's buffers,
 * then the swap of records. */
int hora__ib_begin(hora__net *net, int fd, int peer, hora__conn **out) {
  int rc = hora__ib_dev_get(net);
  if (rc != HORA_SUCCESS) {
    close(fd);
    return rc;
  }
  struct ib_conn *c = hora__calloc(1, sizeof(*c));
  if (!c) {
    close(fd);
    hora__ib_dev_put();
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
  c->send_mr =
      ibv_reg_mr(hora__ib_dev->pd, c->send_buf, (size_t)SLOTS * SLOT, IBV_ACCESS_LOCAL_WRITE);
  c->ring_mr = ibv_reg_mr(hora__ib_dev->pd, c->ring, (size_t)SLOTS * SLOT,
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  c->ctl_mr = ibv_reg_mr(hora__ib_dev->pd, c->ctl, 2 * RTR_SLOTS * sizeof(*c->ctl),
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  /* Unsignalled writes need the QP to allow it. */
  struct ibv_qp_init_attr qa = {
      .sq_sig_all = 0,
      .send_cq = hora__ib_dev->cq,
      .recv_cq = hora__ib_dev->cq,
      .cap = {.max_send_wr = SEND_DEPTH,
              .max_recv_wr = RECV_DEPTH,
              .max_send_sge = 1,
              .max_recv_sge = 1,
              .max_inline_data = INLINE_MAX},
      .qp_type = IBV_QPT_RC,
  };
  bool mrs = c->send_mr && c->ring_mr && c->ctl_mr;
  c->qp = mrs ? ibv_create_qp(hora__ib_dev->pd, &qa) : NULL;
  if (!c->qp) {
    /* Some devices take no inline data: try again without. */
    qa.cap.max_inline_data = 0;
    c->qp = mrs ? ibv_create_qp(hora__ib_dev->pd, &qa) : NULL;
  }
  c->max_inline = qa.cap.max_inline_data;
  if (!c->qp) {
    rc = hora__ib_verbs_error("ibv_reg_mr/ibv_create_qp");
    goto fail;
  }
  c->psn = (uint32_t)(hora__now_ns() & 0xffffff);
  c->me = (struct hora__ib_record){.qpn = c->qp->qp_num,
                                   .psn = c->psn,
                                   .lid = hora__ib_dev->lid,
                                   .mtu = (uint8_t)hora__ib_dev->mtu,
                                   .ring_addr = (uint64_t)(uintptr_t)c->ring,
                                   .ring_rkey = c->ring_mr->rkey,
                                   .ctl_rkey = c->ctl_mr->rkey,
                                   .ctl_addr = (uint64_t)(uintptr_t)c->ctl,
                                   .zero_copy_min = zero_copy_min()};
  memcpy(c->me.gid, hora__ib_dev->gid.raw, 16);
  hora__ib_record_encode(&c->me, c->me_wire);
  *out = &c->base;
  return HORA_SUCCESS;
fail:
  hora__ib_close(&c->base); /* closes the socket too */
  return rc;
}

int hora__ib_establish(hora__net *net, hora__conn *conn, bool *ready, int *fd, short *events) {
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
      HORA_CHECK(hora__ib_connect_qp(c->qp, c, them, c->psn));
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
      if (hora__ib_dev->nconns == hora__ib_dev->capconns) {
        int cap = hora__ib_dev->capconns ? 2 * hora__ib_dev->capconns : 8;
        struct ib_conn **p = hora__realloc(hora__ib_dev->conns, (size_t)cap * sizeof(*p));
        if (!p) {
          return HORA_ERR_NO_MEMORY;
        }
        hora__ib_dev->conns = p;
        hora__ib_dev->capconns = cap;
      }
      hora__ib_dev->conns[hora__ib_dev->nconns++] = c;
      c->setup = SETUP_DONE;
    }
  }
  *ready = c->setup == SETUP_DONE;
  *fd = c->fd;
  size_t swapping = c->setup == SETUP_RECORDS ? HORA_IB_RECORD_SIZE : 1;
  *events = (short)(POLLIN | (c->sent < swapping ? POLLOUT : 0));
  return HORA_SUCCESS;
}

/* Teardown in the order verbs requires: QP, then its memory regions; the
 * CQ, channel, PD and device go with the last connection. */
void hora__ib_close(hora__conn *conn) {
  struct ib_conn *c = (struct ib_conn *)conn;
  if (hora__ib_dev) {
    for (int i = 0; i < hora__ib_dev->nconns; i++) {
      if (hora__ib_dev->conns[i] == c) {
        hora__ib_dev->conns[i] = hora__ib_dev->conns[--hora__ib_dev->nconns];
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
  hora__ib_dev_put();
}

#endif /* HORA_HAVE_VERBS */
