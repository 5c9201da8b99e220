/* Direct collectives over the host's shared segment.
 *
 * Allreduce of one piece (at most one half of a slot) among L local ranks:
 *
 *   1. each rank copies its input piece into its own half      (gather list in)
 *   2. barrier
 *   3. rank j reduces slice j, reading that slice of every
 *      rank's half, into its own half                          (reduce-scatter)
 *      [hierarchical: allreduce of slice j across hosts, over
 *       the ranks with the same local rank]
 *      then divides (AVERAGE) and postscales it
 *   4. barrier
 *   5. each rank copies slice j of rank j's half, for every j,
 *      into its output                                         (allgather, scatter list out)
 *
 * Consecutive pieces alternate halves, so the next piece's step 1 never
 * overwrites what a slower rank is still reading in step 5: that rank has
 * passed the next piece's step-2 barrier only after finishing step 5.
 * Each byte is copied in once and out once; the reduction reads peers'
 * memory in place. */
#include "collectives.h"
#include "reduce.h"
#include "shm.h"

#define REDUCE_BLOCK (32 * 1024) /* bytes per reduction pass: stays in L1/L2 */

static void phase(const struct hora__coll_opts *o, const char *name) {
  if (o && o->phase) {
    o->phase(o->phase_arg, name);
  }
}

/* Copies [off, off + len) of the virtual buffer described by iov to/from dst. */
static void iov_copy(const struct hora__iov *iov, int n, size_t off, size_t len, char *flat,
                     bool to_flat) {
  size_t base = 0;
  for (int i = 0; i < n && len > 0; i++) {
    size_t end = base + iov[i].len;
    if (off < end) {
      size_t in = off - base;
      size_t c = HORA_MIN(len, iov[i].len - in);
      if (to_flat) {
        memcpy(flat, (char *)iov[i].base + in, c);
      } else {
        memcpy((char *)iov[i].base + in, flat, c);
      }
      flat += c;
      off += c;
      len -= c;
    }
    base = end;
  }
}

static void slice_of(size_t n, int L, int j, size_t *a, size_t *b) {
  *a = n * (size_t)j / (size_t)L;
  *b = n * (size_t)(j + 1) / (size_t)L;
}

int hora__shm_allreduce(hora__comm *comm, const struct hora__iov *in, int nin,
                        const struct hora__iov *out, int nout, size_t count, hora_dtype dtype,
                        hora_op op, hora_dtype wire, const struct hora__coll_opts *opts) {
  struct hora__shm *s = comm->shm;
  int L = comm->local_size, me = comm->local_rank;
  size_t es = hora_dtype_size(dtype);
  size_t piece_elems = hora__shm_half_bytes(s) / es;
  for (size_t done = 0; done < count;) {
    size_t n = HORA_MIN(piece_elems, count - done);
    int h = (int)(comm->shm_seq++ & 1);
    char *mine = hora__shm_half(s, me, h);
    phase(opts, "MEMCPY_IN_FUSION_BUFFER");
    iov_copy(in, nin, done * es, n * es, mine, true);
    if (opts && opts->prescale != 1.0) {
      hora__scale(dtype, mine, n, opts->prescale);
    }
    phase(opts, NULL);
    phase(opts, "ALLREDUCE");
    HORA_CHECK(hora__shm_barrier(comm));
    size_t a, b;
    slice_of(n, L, me, &a, &b);
    size_t block = HORA_MAX((size_t)REDUCE_BLOCK / es, (size_t)1);
    for (size_t x = a; x < b; x += block) {
      size_t m = HORA_MIN(block, b - x);
      for (int j = 0; j < L; j++) {
        if (j != me) {
          hora__reduce(dtype, op, mine + x * es, mine + x * es, hora__shm_half(s, j, h) + x * es, m);
        }
      }
    }
    if (comm->cross_size > 1 && b > a) {
      HORA_CHECK(hora__ring_allreduce(comm, &comm->cross_ring, mine + a * es, mine + a * es,
                                      b - a, dtype, op, wire));
    }
    if (b > a) {
      hora__post_apply(opts, dtype, mine + a * es, b - a);
    }
    HORA_CHECK(hora__shm_barrier(comm));
    phase(opts, NULL);
    phase(opts, "MEMCPY_OUT_FUSION_BUFFER");
    for (int j = 0; j < L; j++) {
      size_t ja, jb;
      slice_of(n, L, j, &ja, &jb);
      iov_copy(out, nout, (done + ja) * es, (jb - ja) * es, hora__shm_half(s, j, h) + ja * es, false);
    }
    phase(opts, NULL);
    done += n;
  }
  return HORA_SUCCESS;
}

int hora__shm_broadcast(hora__comm *comm, const struct hora__iov *buf, int nbuf, size_t bytes,
                        int root_local) {
  struct hora__shm *s = comm->shm;
  size_t piece = hora__shm_half_bytes(s);
  for (size_t done = 0; done < bytes; done += piece) {
    size_t n = HORA_MIN(piece, bytes - done);
    int h = (int)(comm->shm_seq++ & 1);
    char *src = hora__shm_half(s, root_local, h);
    if (comm->local_rank == root_local) {
      iov_copy(buf, nbuf, done, n, src, true);
    }
    HORA_CHECK(hora__shm_barrier(comm));
    if (comm->local_rank != root_local) {
      iov_copy(buf, nbuf, done, n, src, false);
    }
  }
  return HORA_SUCCESS;
}

int hora__shm_allgather(hora__comm *comm, const void *sendbuf, size_t bytes, void *recvbuf) {
  struct hora__shm *s = comm->shm;
  int L = comm->local_size, me = comm->local_rank;
  size_t piece = hora__shm_half_bytes(s);
  for (size_t done = 0; done < bytes; done += piece) {
    size_t n = HORA_MIN(piece, bytes - done);
    int h = (int)(comm->shm_seq++ & 1);
    memcpy(hora__shm_half(s, me, h), (const char *)sendbuf + done, n);
    HORA_CHECK(hora__shm_barrier(comm));
    for (int j = 0; j < L; j++) {
      memcpy((char *)recvbuf + (size_t)j * bytes + done, hora__shm_half(s, j, h), n);
    }
  }
  return HORA_SUCCESS;
}
