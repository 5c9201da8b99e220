/* Pipelined chain broadcast along the ring, starting at the root:
 *
 *   root -> root+1 -> root+2 -> ... -> root-1
 *
 * Each rank forwards chunk k as soon as it has arrived, so for large
 * buffers every link is busy at once and the time approaches one transfer
 * of the buffer. */
#include "comm/coll/collectives.h"

struct bcast_ctx {
  char *buf;
  size_t bytes, chunk;
};

static void chunk_at(const struct bcast_ctx *b, size_t i, char **ptr, size_t *len) {
  size_t lo = HORA_MIN(i * b->chunk, b->bytes);
  size_t hi = HORA_MIN(lo + b->chunk, b->bytes);
  *ptr = b->buf + lo;
  *len = hi - lo;
}

static void bc_send_at(void *arg, size_t i, const void **ptr, size_t *len, bool *scratch) {
  char *p;
  *scratch = false;
  chunk_at(arg, i, &p, len);
  *ptr = p;
}

static void bc_recv_at(void *arg, size_t i, void **ptr, size_t *len, bool *scratch) {
  char *p;
  chunk_at(arg, i, &p, len);
  *ptr = p;
  *scratch = false;
}

int hora__ring_broadcast(hora__comm *comm, const struct hora__ring_view *view, void *buf,
                         size_t bytes, int root, size_t chunk) {
  int p = view->size;
  if (p == 1 || bytes == 0) {
    return HORA_SUCCESS;
  }
  int pos = (view->pos - root + p) % p;
  struct bcast_ctx b = {.buf = buf, .bytes = bytes, .chunk = HORA_MAX(chunk, (size_t)1)};
  size_t nchunks = (bytes + b.chunk - 1) / b.chunk;
  struct hora__ring ring = {
      .next = view->next,
      .prev = view->prev,
      .nsend = pos == p - 1 ? 0 : nchunks,
      .nrecv = pos == 0 ? 0 : nchunks,
      .send_depends = pos != 0,
      .dep_lag = 0,
      .arg = &b,
      .send_at = bc_send_at,
      .recv_at = bc_recv_at,
  };
  return hora__ring_run(comm, &ring);
}

int hora__world_ring_broadcast(hora__comm *comm, void *buf, size_t bytes, int root) {
  struct hora__layout s;
  hora__comm_layout(comm, &s);
  return hora__ring_broadcast(comm, &comm->world_ring, buf, bytes, root,
                              hora__chain_chunk(&comm->model, &s, bytes));
}

int hora__broadcast_contiguous(hora__comm *comm, hora__contiguous_broadcast_fn *fn,
                               const struct hora__iov *buf, int nbuf, size_t bytes, int root,
                               const struct hora__coll_opts *opts) {
  if (nbuf == 1 || bytes == 0) { /* (empty tensors: no fusion buffer) */
    if (opts && opts->phase) {
      opts->phase(opts->phase_arg, "BROADCAST");
    }
    int rc = bytes ? fn(comm, buf[0].base, bytes, root) : HORA_SUCCESS;
    if (opts && opts->phase) {
      opts->phase(opts->phase_arg, NULL);
    }
    return rc;
  }
  char *f;
  HORA_CHECK(hora__comm_fusion_buffer(comm, bytes, &f));
  size_t off = 0;
  if (comm->rank == root) {
    for (int i = 0; i < nbuf; i++) {
      memcpy(f + off, buf[i].base, buf[i].len);
      off += buf[i].len;
    }
  }
  if (opts && opts->phase) {
    opts->phase(opts->phase_arg, "BROADCAST");
  }
  int rc = fn(comm, f, bytes, root);
  if (opts && opts->phase) {
    opts->phase(opts->phase_arg, NULL);
  }
  if (rc == HORA_SUCCESS && comm->rank != root) {
    off = 0;
    for (int i = 0; i < nbuf; i++) {
      memcpy(buf[i].base, f + off, buf[i].len);
      off += buf[i].len;
    }
  }
  return rc;
}
