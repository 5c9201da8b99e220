/* The RDMA data path: posted sends and receives, the descriptors that choose
 * between the ring and a direct write, the completions of every connection,
 * progress, and the transport's vtable. */
#include "base/common.h"

#if HORA_HAVE_VERBS

#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <unistd.h>

#include "comm/transport/ib/ib.h"

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
  for (int i = 0; i < hora__ib_dev->nregions; i++) {
    const struct ib_region *r = &hora__ib_dev->regions[i];
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
  for (int i = 0; i < hora__ib_dev->nconns; i++) {
    if (hora__ib_dev->conns[i]->qp->qp_num == qpn) {
      return hora__ib_dev->conns[i];
    }
  }
  return NULL;
}

/* Takes every completion off the shared queue and books it to its
 * connection. */
static int drain_cq(bool *progressed) {
  struct ibv_wc wc[32];
  for (;;) {
    int n = ibv_poll_cq(hora__ib_dev->cq, 32, wc);
    if (n < 0) {
      return hora__error(HORA_ERR_SYSTEM, "ibv_poll_cq failed on %s", hora__ib_dev->name);
    }
    if (n == 0) {
      return HORA_SUCCESS;
    }
    *progressed = true;
    for (int i = 0; i < n; i++) {
      if (hora__ib_dev->flush_qp && wc[i].qp_num == hora__ib_dev->flush_qp->qp_num) {
        if (wc[i].status != IBV_WC_SUCCESS && !hora__ib_dev->flush_error[0]) {
          snprintf(hora__ib_dev->flush_error, sizeof(hora__ib_dev->flush_error),
                   "RDMA flush of GPU memory on %s: %s", hora__ib_dev->name,
                   ibv_wc_status_str(wc[i].status));
        }
        hora__ib_dev->flush_done = HORA_MAX(hora__ib_dev->flush_done, (uint64_t)wc[i].wr_id);
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
        HORA_CHECK(hora__ib_post_recv(c));
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
    return hora__ib_verbs_error("ibv_post_send");
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
  struct ibv_sge sge = {.addr = (uintptr_t)hora__ib_dev->flush_buf,
                        .length = 1,
                        .lkey = hora__ib_dev->flush_mr->lkey};
  struct ibv_send_wr wr = {
      .wr_id = hora__ib_dev->flush_posted + 1,
      .sg_list = &sge,
      .num_sge = 1,
      .opcode = IBV_WR_RDMA_READ,
      .send_flags = IBV_SEND_SIGNALED,
      .wr = {.rdma = {.remote_addr = (uintptr_t)at, .rkey = r->mr->rkey}},
  }, *bad;
  if (ibv_post_send(hora__ib_dev->flush_qp, &wr, &bad) != 0) {
    return hora__ib_verbs_error("ibv_post_send(flush read)");
  }
  *seq = ++hora__ib_dev->flush_posted;
  return HORA_SUCCESS;
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
      if (hora__ib_dev->flush_error[0]) {
        return hora__error(HORA_ERR_SYSTEM, "%s", hora__ib_dev->flush_error);
      }
      if (hora__ib_dev->flush_done < c->flush_seq) {
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
    *(c->head_mode == SEND_DIRECT     ? &hora__ib_dev->bytes_direct
      : c->head_mode == SEND_RING     ? &hora__ib_dev->bytes_ring
                                      : &hora__ib_dev->bytes_via_slots) += n;
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
  if (now - hora__ib_dev->async_checked > 1000000) {
    hora__ib_dev->async_checked = now;
    struct ibv_async_event ev;
    while (ibv_get_async_event(hora__ib_dev->ctx, &ev) == 0) {
      enum ibv_event_type t = ev.event_type;
      ibv_ack_async_event(&ev);
      if (t == IBV_EVENT_PORT_ERR || t == IBV_EVENT_DEVICE_FATAL || t == IBV_EVENT_QP_FATAL) {
        return hora__error(HORA_ERR_PEER_LOST, "RDMA device %s: %s", hora__ib_dev->name,
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
  while (ibv_get_cq_event(hora__ib_dev->channel, &cq, &cq_ctx) == 0) {
    ibv_ack_cq_events(cq, 1);
  }
  uint64_t v;
  while (read(hora__ib_dev->kick_fd, &v, sizeof(v)) > 0) {
  }
  ibv_req_notify_cq(hora__ib_dev->cq, 0);
  /* Book what came in before arming; if anything did (or failed), a kick
   * makes poll() return at once so that progress acts on it. */
  bool any = false;
  if (drain_cq(&any) != HORA_SUCCESS || any) {
    uint64_t one = 1;
    ssize_t w = write(hora__ib_dev->kick_fd, &one, sizeof(one));
    (void)w;
    return hora__ib_dev->kick_fd;
  }
  return hora__ib_dev->channel->fd;
}

const struct hora__transport hora__transport_ib = {
    .name = "ib",
    .available = hora__ib_available,
    .zero_copy = true,
    .connect = hora__ib_begin,
    .accept = hora__ib_begin,
    .establish = hora__ib_establish,
    .isend = ib_isend,
    .irecv = ib_irecv,
    .progress = ib_progress,
    .poll_fd = ib_poll_fd,
    .reg_mem = hora__ib_reg_mem,
    .reg_dmabuf = hora__ib_reg_dmabuf,
    .dereg_mem = hora__ib_dereg_mem,
    .close = hora__ib_close,
};

#endif /* HORA_HAVE_VERBS */
