/* Ring allreduce: reduce-scatter, then allgather, pipelined in chunks.
 *
 * The buffer is cut into p segments. In step t (0 <= t < 2(p-1)) rank r
 * sends segment (r - t) mod p to r+1 and receives segment (r - t - 1) mod p
 * from r-1. In the first p-1 steps (reduce-scatter) what arrives is added
 * to the rank's own data; after them rank r holds the complete result of
 * segment r+1. The last p-1 steps (allgather) pass complete segments on.
 *
 *        step 0        step 1        ...   step p-1 (allgather)
 *   r0 --s0--> r1 --s3--> ...
 *   r1 --s1--> r2          each rank sends 2(p-1)/p of the buffer
 *   r2 --s2--> r3
 *   r3 --s3--> r0
 *
 * Every segment is split into chunks of HORA_CHUNK_SIZE; chunk k of step
 * t+1 is sent as soon as chunk k of step t has been reduced.
 *
 * Compressed (wire dtype != dtype): every chunk is narrowed to fp16/bf16
 * just before it leaves and widened on arrival, so the partial sums
 * accumulate in the data's own type. The owner of a finished segment
 * rounds its own copy through the wire type too, so all ranks agree. */
#include <stdlib.h>

#include "comm/coll/collectives.h"
#include "comm/reduce/reduce.h"

struct allreduce_ctx {
  int rank, size;
  int shift;   /* reduce-scatter: 1, so that rank r ends with segment r (allreduce: 0) */
  size_t unit; /* segments are whole units of this many elements (1: elements) */
  const char *send;
  char *recv;
  size_t count, esize, base, rem, chunk_elems, nchunks;
  hora_dtype dtype, wire;
  size_t wire_esize;
  bool compressed;
  hora_op op;
};

static void seg_range(const struct allreduce_ctx *a, int seg, size_t *start, size_t *len) {
  size_t s = (size_t)seg;
  *start = (s * a->base + HORA_MIN(s, a->rem)) * a->unit;
  *len = (a->base + (s < a->rem ? 1 : 0)) * a->unit;
}

void hora__block_range(size_t count, size_t unit, int size, int r, size_t *start, size_t *len) {
  if (unit == 0 || count == 0) {
    *start = *len = 0; /* nothing to split (a shape with a zero dimension) */
    return;
  }
  size_t units = count / unit, base = units / (size_t)size, rem = units % (size_t)size;
  size_t s = (size_t)r;
  *start = (s * base + HORA_MIN(s, rem)) * unit;
  *len = (base + (s < rem ? 1 : 0)) * unit;
}

/* Element range of linear transfer index i, and its step. */
static void chunk_range(const struct allreduce_ctx *a, size_t i, bool sending, size_t *off,
                        size_t *n, size_t *step) {
  size_t t = i / a->nchunks;
  size_t k = i % a->nchunks;
  int p = a->size;
  int seg = (int)(((long)a->rank - a->shift - (long)t - (sending ? 0 : 1)) % p + p) % p;
  size_t start, len;
  seg_range(a, seg, &start, &len);
  size_t lo = HORA_MIN(k * a->chunk_elems, len);
  size_t hi = HORA_MIN(lo + a->chunk_elems, len);
  *off = start + lo;
  *n = hi - lo;
  *step = t;
}

static void ar_send_at(void *arg, size_t i, const void **ptr, size_t *len, bool *scratch) {
  struct allreduce_ctx *a = arg;
  size_t off, n, t;
  chunk_range(a, i, true, &off, &n, &t);
  *scratch = a->compressed;
  *ptr = (t == 0 ? a->send : a->recv) + off * a->esize;
  *len = n * a->wire_esize;
}

static void ar_fill_send(void *arg, size_t i, void *staging) {
  struct allreduce_ctx *a = arg;
  size_t off, n, t;
  chunk_range(a, i, true, &off, &n, &t);
  const char *src = (t == 0 ? a->send : a->recv) + off * a->esize;
  hora__compress(a->wire, staging, a->dtype, src, n);
  if (t == (size_t)(a->size - 1)) {
    /* This segment is final here: keep exactly what the others will get. */
    hora__decompress(a->dtype, a->recv + off * a->esize, a->wire, staging, n);
  }
}

static void ar_recv_at(void *arg, size_t i, void **ptr, size_t *len, bool *scratch) {
  struct allreduce_ctx *a = arg;
  size_t off, n, t;
  chunk_range(a, i, false, &off, &n, &t);
  *scratch = a->compressed || t < (size_t)(a->size - 1);
  *ptr = a->recv + off * a->esize;
  *len = n * a->wire_esize;
}

static void ar_received(void *arg, size_t i, void *staged) {
  struct allreduce_ctx *a = arg;
  if (!staged) {
    return; /* allgather phase: landed in place */
  }
  size_t off, n, t;
  chunk_range(a, i, false, &off, &n, &t);
  char *dst = a->recv + off * a->esize;
  const char *mine = a->send + off * a->esize;
  bool reducing = t < (size_t)(a->size - 1);
  if (!a->compressed) {
    hora__reduce(a->dtype, a->op, dst, staged, mine, n);
  } else if (reducing) {
    hora__reduce_wire(a->dtype, a->op, dst, a->wire, staged, mine, n);
  } else {
    hora__decompress(a->dtype, dst, a->wire, staged, n);
  }
}

/* The ring's reduction: 2(p-1) steps of an allreduce, or the first p-1
 * (reduce-scatter, shifted so that rank r ends with segment r). */
static int ring_reduce(hora__comm *comm, const struct hora__ring_view *view, const void *sendbuf,
                       void *recvbuf, size_t count, size_t unit, bool scatter, hora_dtype dtype,
                       hora_op op, hora_dtype wire_dtype) {
  size_t esize = hora_dtype_size(dtype);
  int p = view->size;
  struct allreduce_ctx a = {
      .rank = view->pos,
      .size = p,
      .shift = scatter ? 1 : 0,
      .unit = unit,
      .send = sendbuf,
      .recv = recvbuf,
      .count = count,
      .esize = esize,
      .base = count / unit / (size_t)p,
      .rem = count / unit % (size_t)p,
      .dtype = dtype,
      .wire = wire_dtype,
      .wire_esize = hora_dtype_size(wire_dtype),
      .compressed = wire_dtype != dtype,
      .op = op,
  };
  /* A chunk is what one staging slot holds, in wire bytes. */
  a.chunk_elems = HORA_MAX((size_t)comm->proc->chunk_bytes / a.wire_esize, (size_t)1);
  size_t max_seg = (a.base + (a.rem ? 1 : 0)) * unit;
  a.nchunks = HORA_MAX((max_seg + a.chunk_elems - 1) / a.chunk_elems, (size_t)1);
  size_t total = (size_t)((scatter ? 1 : 2) * (p - 1)) * a.nchunks;
  struct hora__ring ring = {
      .next = view->next,
      .prev = view->prev,
      .nsend = total,
      .nrecv = total,
      .send_depends = true,
      .dep_lag = a.nchunks,
      .arg = &a,
      .send_at = ar_send_at,
      .fill_send = ar_fill_send,
      .recv_at = ar_recv_at,
      .received = ar_received,
  };
  return hora__ring_run(comm, &ring);
}

int hora__ring_allreduce(hora__comm *comm, const struct hora__ring_view *view, const void *sendbuf,
                         void *recvbuf, size_t count, hora_dtype dtype, hora_op op,
                         hora_dtype wire_dtype) {
  if (view->size == 1 || count == 0) {
    if (sendbuf != recvbuf && count) {
      memcpy(recvbuf, sendbuf, count * hora_dtype_size(dtype));
    }
    return HORA_SUCCESS;
  }
  return ring_reduce(comm, view, sendbuf, recvbuf, count, 1, false, dtype, op, wire_dtype);
}

int hora__ring_reducescatter(hora__comm *comm, const struct hora__ring_view *view,
                             const void *sendbuf, void *scratch, size_t count, size_t unit,
                             hora_dtype dtype, hora_op op, hora_dtype wire_dtype) {
  if (view->size == 1 || count == 0) {
    if (sendbuf != scratch && count) {
      memcpy(scratch, sendbuf, count * hora_dtype_size(dtype));
    }
    return HORA_SUCCESS;
  }
  return ring_reduce(comm, view, sendbuf, scratch, count, unit, true, dtype, op, wire_dtype);
}

/* ---- choosing the algorithm ------------------------------------------------ */

void hora__post_apply(const struct hora__coll_opts *o, hora_dtype dtype, void *buf, size_t n) {
  if (dtype == HORA_BOOL) {
    /* The kernels write 0 or 1, but a lone rank reduces nothing: its own
     * nonzero bytes must become 1 too. Bool is never divided or scaled. */
    hora__normalize_bool(buf, n);
    return;
  }
  if (!o) {
    return;
  }
  /* Horovod's AVERAGE: one multiplication by postscale / size. */
  double factor = o->divisor > 1 ? o->postscale / o->divisor : o->postscale;
  if (factor != 1.0) {
    hora__scale(dtype, buf, n, factor);
  }
}

int hora__comm_fusion_buffer(hora__comm *comm, size_t bytes, char **out) {
  HORA_CHECK(
      hora__comm_grow_registered(comm, &comm->fusion, &comm->fusion_bytes, &comm->fusion_reg, bytes));
  *out = comm->fusion;
  return HORA_SUCCESS;
}

int hora__world_ring_allreduce(hora__comm *comm, const void *src, void *dst, size_t count,
                               hora_dtype dtype, hora_op op, hora_dtype wire) {
  return hora__ring_allreduce(comm, &comm->world_ring, src, dst, count, dtype, op, wire);
}

int hora__allreduce_contiguous(hora__comm *comm, hora__contiguous_allreduce_fn *fn,
                               const struct hora__iov *in, int nin, const struct hora__iov *out,
                               int nout, size_t count, hora_dtype dtype, hora_op op,
                               hora_dtype wire, const struct hora__coll_opts *opts) {
  size_t esize = hora_dtype_size(dtype);
  bool prescale = opts && opts->prescale != 1.0;
  if ((nin == 1 && nout == 1) || count == 0) { /* (empty tensors: no fusion buffer) */
    /* One tensor: reduce straight between the caller's buffers; a prescale
     * must not touch the caller's input, so it works on the output. */
    const void *src = in[0].base;
    if (prescale && count) {
      if (out[0].base != in[0].base) {
        memcpy(out[0].base, in[0].base, count * esize);
      }
      hora__scale(dtype, out[0].base, count, opts->prescale);
      src = out[0].base;
    }
    hora__coll_phase(opts, "ALLREDUCE");
    int rc = count ? fn(comm, src, out[0].base, count, dtype, op, wire) : HORA_SUCCESS;
    hora__coll_phase(opts, NULL);
    if (rc == HORA_SUCCESS && count) {
      hora__post_apply(opts, dtype, out[0].base, count);
    }
    return rc;
  }
  char *f;
  HORA_CHECK(hora__comm_fusion_buffer(comm, count * esize, &f));
  hora__coll_phase(opts, "MEMCPY_IN_FUSION_BUFFER");
  size_t off = 0;
  for (int i = 0; i < nin; i++) {
    memcpy(f + off, in[i].base, in[i].len);
    off += in[i].len;
  }
  if (prescale) {
    hora__scale(dtype, f, count, opts->prescale);
  }
  hora__coll_phase(opts, NULL);
  hora__coll_phase(opts, "ALLREDUCE");
  int rc = fn(comm, f, f, count, dtype, op, wire);
  hora__coll_phase(opts, NULL);
  if (rc != HORA_SUCCESS) {
    return rc;
  }
  hora__post_apply(opts, dtype, f, count);
  hora__coll_phase(opts, "MEMCPY_OUT_FUSION_BUFFER");
  off = 0;
  for (int i = 0; i < nout; i++) {
    memcpy(out[i].base, f + off, out[i].len);
    off += out[i].len;
  }
  hora__coll_phase(opts, NULL);
  return HORA_SUCCESS;
}
