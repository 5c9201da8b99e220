/* Ring allgather: p-1 steps; in step t rank r sends block (r - t) mod p to
 * r+1 and receives block (r - t - 1) mod p from r-1, straight into place.
 * Blocks move in chunks, and chunk k of step t+1 leaves as soon as chunk k
 * of step t has arrived.
 *
 *   step 0:  r0:b0 -> r1   r1:b1 -> r2   r2:b2 -> r0
 *   step 1:  r0:b2 -> r1   r1:b0 -> r2   r2:b1 -> r0   */
#include "comm/coll/collectives.h"

struct allgather_ctx {
  int rank, size;
  char *recv;
  size_t bytes, chunk, nchunks;
};

static void block_chunk(const struct allgather_ctx *a, size_t i, bool sending, char **ptr,
                        size_t *len) {
  size_t t = i / a->nchunks;
  size_t k = i % a->nchunks;
  int p = a->size;
  int block = (int)(((long)a->rank - (long)t - (sending ? 0 : 1)) % p + p) % p;
  size_t lo = HORA_MIN(k * a->chunk, a->bytes);
  size_t hi = HORA_MIN(lo + a->chunk, a->bytes);
  *ptr = a->recv + (size_t)block * a->bytes + lo;
  *len = hi - lo;
}

static void ag_send_at(void *arg, size_t i, const void **ptr, size_t *len, bool *scratch) {
  char *p;
  *scratch = false;
  block_chunk(arg, i, true, &p, len);
  *ptr = p;
}

static void ag_recv_at(void *arg, size_t i, void **ptr, size_t *len, bool *scratch) {
  char *p;
  block_chunk(arg, i, false, &p, len);
  *ptr = p;
  *scratch = false;
}

int hora__ring_allgather(hora__comm *comm, const struct hora__ring_view *view, const void *sendbuf,
                         size_t bytes, void *recvbuf) {
  int p = view->size;
  char *mine = (char *)recvbuf + (size_t)view->pos * bytes;
  if (sendbuf != mine && bytes) {
    memmove(mine, sendbuf, bytes);
  }
  if (p == 1 || bytes == 0) {
    return HORA_SUCCESS;
  }
  struct allgather_ctx a = {.rank = view->pos, .size = p, .recv = recvbuf, .bytes = bytes};
  a.chunk = (size_t)comm->proc->chunk_bytes;
  a.nchunks = HORA_MAX((bytes + a.chunk - 1) / a.chunk, (size_t)1);
  size_t total = (size_t)(p - 1) * a.nchunks;
  struct hora__ring ring = {
      .next = view->next,
      .prev = view->prev,
      .nsend = total,
      .nrecv = total,
      .send_depends = true,
      .dep_lag = a.nchunks,
      .arg = &a,
      .send_at = ag_send_at,
      .recv_at = ag_recv_at,
  };
  return hora__ring_run(comm, &ring);
}

