/* Direct collectives over the host's shared segment.
 *
 * Allreduce of one piece (at most one half of a slot) among L local ranks;
 * slice j of the piece is the part rank j reduces:
 *
 *   1. each rank copies the slices the others reduce (all but its
 *      own) from its input into its own half                  (gather list in)
 *   2. barrier
 *   3. rank j reduces slice j: its own input, read in place,
 *      and slice j of every peer's half, into its output, and
 *      publishes the result in slice j of its own half, which
 *      step 1 left free                                        (reduce-scatter)
 *      [hierarchical: the result goes to the half only, is
 *       allreduced across hosts there, over the ranks with the
 *       same local rank (a ring, recursive doubling or Rabenseifner,
 *       as the cost model picks for the slice), and copied out in
 *       step 5]
 *   4. barrier
 *   5. each rank copies slice j of rank j's half, for every
 *      other j, into its output                                (allgather, scatter list out)
 *
 * Consecutive pieces alternate halves, so the next piece's step 1 never
 * overwrites what a slower rank is still reading in step 5: that rank has
 * passed the next piece's step-2 barrier only after finishing step 5.
 * A rank's own slice never leaves its buffers on the way in, and it is
 * reduced in cache-sized blocks whose result is published while still in
 * cache: at np=2 each rank moves 4 bytes of memory traffic per input byte,
 * against 5.5 when the whole input is staged. */
#include <stdlib.h>

#include "comm/coll/collectives.h"
#include "comm/reduce/reduce.h"
#include "comm/shm/shm.h"

#define REDUCE_BLOCK (32 * 1024) /* bytes per reduction pass: stays in L1/L2 */

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

/* A position in a tensor list, moved forward as offsets grow, so walking a
 * fused buffer block by block stays linear in the number of tensors. */
struct iov_cursor {
  const struct hora__iov *iov;
  int n, i;
  size_t base; /* virtual offset of iov[i] */
};

/* Address of virtual offset off and, in *avail, the bytes from there to the
 * end of its tensor. off never decreases between calls. */
static char *cursor_at(struct iov_cursor *c, size_t off, size_t *avail) {
  while (c->i < c->n && off >= c->base + c->iov[c->i].len) {
    c->base += c->iov[c->i].len;
    c->i++;
  }
  *avail = c->iov[c->i].len - (off - c->base);
  return (char *)c->iov[c->i].base + (off - c->base);
}

/* Step 3 for bytes [x, x + m) of the piece that starts at virtual offset
 * base: dst = prescale * input (op) every peer's staged copy. dst is the
 * output (then published into mine) or, when hierarchical, mine itself. */
static void reduce_own_block(hora__comm *comm, struct iov_cursor *in, struct iov_cursor *out,
                             size_t base, size_t x, size_t m, int h, hora_dtype dtype,
                             hora_op op, bool to_output, const struct hora__coll_opts *opts) {
  struct hora__shm *s = comm->proc->shm;
  int L = comm->local_size, me = comm->local_rank;
  size_t es = hora_dtype_size(dtype);
  char *mine = hora__shm_half(s, me, h);
  double prescale = opts ? opts->prescale : 1.0;
  for (size_t pos = x; pos < x + m;) {
    size_t av_in, av_out;
    const char *src = cursor_at(in, base + pos, &av_in);
    char *o = cursor_at(out, base + pos, &av_out);
    size_t c = HORA_MIN(HORA_MIN(av_in, av_out), x + m - pos);
    char *dst = to_output ? o : mine + pos;
    if (prescale != 1.0 || L == 1) {
      if (dst != src) {
        memcpy(dst, src, c);
      }
      if (prescale != 1.0) {
        hora__scale(dtype, dst, c / es, prescale);
      }
      src = dst;
    }
    for (int j = 0; j < L; j++) {
      if (j != me) {
        hora__reduce(dtype, op, dst, src, hora__shm_half(s, j, h) + pos, c / es);
        src = dst;
      }
    }
    if (to_output) {
      hora__post_apply(opts, dtype, dst, c / es);
      memcpy(mine + pos, dst, c);
    }
    pos += c;
  }
}

/* hierarchical: across hosts too (step 3's bracket), else this host only. */
static int shm_allreduce(hora__comm *comm, const struct hora__iov *in, int nin,
                         const struct hora__iov *out, int nout, size_t count, hora_dtype dtype,
                         hora_op op, hora_dtype wire, const struct hora__coll_opts *opts,
                         bool hierarchical) {
  struct hora__shm *s = comm->proc->shm;
  int L = comm->local_size, me = comm->local_rank;
  size_t es = hora_dtype_size(dtype);
  size_t piece_elems = hora__shm_half_bytes(s) / es;
  double prescale = opts ? opts->prescale : 1.0;
  struct iov_cursor in_cur = {in, nin, 0, 0}, out_cur = {out, nout, 0, 0};
  __atomic_fetch_add(&comm->proc->staged_bytes, (uint64_t)(count * es), __ATOMIC_RELAXED);
  if (hierarchical) {
    /* Made by every rank at once, whichever algorithm its slice takes
     * across hosts (slices, and so choices, differ by local rank). */
    HORA_CHECK(hora__comm_connect_partners(comm));
  }
  for (size_t done = 0; done < count;) {
    size_t n = HORA_MIN(piece_elems, count - done);
    int h = (int)(comm->shm_seq++ & 1);
    char *mine = hora__shm_half(s, me, h);
    size_t a, b;
    hora__shm_slice(n, L, me, &a, &b);
    hora__coll_phase(opts, "MEMCPY_IN_FUSION_BUFFER");
    for (int j = 0; j < L; j++) {
      size_t ja, jb;
      hora__shm_slice(n, L, j, &ja, &jb);
      if (j != me && jb > ja) {
        iov_copy(in, nin, (done + ja) * es, (jb - ja) * es, mine + ja * es, true);
        if (prescale != 1.0) {
          hora__scale(dtype, mine + ja * es, jb - ja, prescale);
        }
      }
    }
    hora__coll_phase(opts, NULL);
    hora__coll_phase(opts, "ALLREDUCE");
    HORA_CHECK(hora__shm_barrier(comm->proc->shm, comm->net));
    size_t block = HORA_MAX((size_t)REDUCE_BLOCK / es, (size_t)1) * es;
    for (size_t x = a * es; x < b * es; x += block) {
      reduce_own_block(comm, &in_cur, &out_cur, done * es, x, HORA_MIN(block, b * es - x), h, dtype,
                       op, !hierarchical, opts);
    }
    if (hierarchical && b > a) {
      HORA_CHECK(hora__cross_allreduce(comm, mine + a * es, b - a, dtype, op, wire));
      hora__post_apply(opts, dtype, mine + a * es, b - a);
    }
    HORA_CHECK(hora__shm_barrier(comm->proc->shm, comm->net));
    hora__coll_phase(opts, NULL);
    hora__coll_phase(opts, "MEMCPY_OUT_FUSION_BUFFER");
    for (int j = 0; j < L; j++) {
      size_t ja, jb;
      hora__shm_slice(n, L, j, &ja, &jb);
      if (j != me || hierarchical) {
        iov_copy(out, nout, (done + ja) * es, (jb - ja) * es, hora__shm_half(s, j, h) + ja * es,
                 false);
      }
    }
    hora__coll_phase(opts, NULL);
    done += n;
  }
  return HORA_SUCCESS;
}

int hora__shm_allreduce(hora__comm *comm, const struct hora__iov *in, int nin,
                        const struct hora__iov *out, int nout, size_t count, hora_dtype dtype,
                        hora_op op, hora_dtype wire, const struct hora__coll_opts *opts) {
  return shm_allreduce(comm, in, nin, out, nout, count, dtype, op, wire, opts,
                       comm->cross_size > 1);
}

int hora__shm_allreduce_local(hora__comm *comm, void *buf, size_t count, hora_dtype dtype,
                              hora_op op) {
  struct hora__iov v = {buf, count * hora_dtype_size(dtype)};
  return shm_allreduce(comm, &v, 1, &v, 1, count, dtype, op, dtype, NULL, false);
}

int hora__shm_broadcast(hora__comm *comm, const struct hora__iov *buf, int nbuf, size_t bytes,
                        int root_local) {
  struct hora__shm *s = comm->proc->shm;
  size_t piece = hora__shm_half_bytes(s);
  for (size_t done = 0; done < bytes; done += piece) {
    size_t n = HORA_MIN(piece, bytes - done);
    int h = (int)(comm->shm_seq++ & 1);
    char *src = hora__shm_half(s, root_local, h);
    if (comm->local_rank == root_local) {
      iov_copy(buf, nbuf, done, n, src, true);
    }
    HORA_CHECK(hora__shm_barrier(comm->proc->shm, comm->net));
    if (comm->local_rank != root_local) {
      iov_copy(buf, nbuf, done, n, src, false);
    }
  }
  return HORA_SUCCESS;
}

int hora__shm_allgather(hora__comm *comm, const void *sendbuf, size_t bytes, void *recvbuf) {
  struct hora__shm *s = comm->proc->shm;
  int L = comm->local_size, me = comm->local_rank;
  size_t piece = hora__shm_half_bytes(s);
  for (size_t done = 0; done < bytes; done += piece) {
    size_t n = HORA_MIN(piece, bytes - done);
    int h = (int)(comm->shm_seq++ & 1);
    memcpy(hora__shm_half(s, me, h), (const char *)sendbuf + done, n);
    HORA_CHECK(hora__shm_barrier(comm->proc->shm, comm->net));
    for (int j = 0; j < L; j++) {
      memcpy((char *)recvbuf + (size_t)j * bytes + done, hora__shm_half(s, j, h), n);
    }
  }
  return HORA_SUCCESS;
}

/* ---- hierarchical broadcast and allgather -------------------------------------
 *
 * Broadcast from the root, local rank k of host R, among H hosts of L ranks:
 *
 *   1. across hosts: the root to local rank k of every other host, by the
 *      binomial tree, the scatter + allgather or the chain over those H
 *      members, as the model picks for them
 *   2. within every host: local rank k through the segment to the others
 *
 *      host 0:  [0] root --(1)--> host 1: [2]
 *               [0] --(2)--> [1]          [2] --(2)--> [3]
 *
 * The buffer crosses each host's link once, as with the flat algorithms on
 * ranks in blocks, but the network sees H members, not H * L: fewer steps
 * for small buffers. It is not split into L slices that every local rank
 * carries across: the host's one link would carry the same bytes, and the
 * split would add a pass through the segment on the root's host and an
 * allgather of the slices on every other.
 *
 * Allgather, block (h, j) being that of local rank j on host h:
 *
 *   1. across hosts: local rank j gathers column j, the blocks (h, j) of
 *      every host, among the members with its local rank (the ring or
 *      Bruck over H, as the model picks), straight into place; the L
 *      columns move at once, so each host's link carries L blocks a step
 *   2. within every host: each rank's column through the segment to the
 *      others, a piece of it per half and barrier
 *
 *      host 0: (0,0) (0,1)    1: (0,0) <-> (1,0), (0,1) <-> (1,1)
 *      host 1: (1,0) (1,1)    2: column 0 <-> column 1 on each host
 *
 * Blocks land at their ranks' places: a host's ranks need not be
 * contiguous in rank order. */

int hora__hierarchical_broadcast(hora__comm *comm, const struct hora__iov *buf, int nbuf,
                                 size_t bytes, int root, const struct hora__coll_opts *opts) {
  if (bytes == 0) {
    return HORA_SUCCESS;
  }
  /* Made by every rank at once, though only the root's local rank crosses
   * hosts in this operation. */
  HORA_CHECK(hora__comm_connect_partners(comm));
  const struct hora__peer_info *from = &comm->net->peers[root];
  int rc = HORA_SUCCESS;
  hora__coll_phase(opts, "BROADCAST");
  if (comm->local_rank == from->local_rank) {
    char *flat = buf[0].base;
    if (nbuf > 1) {
      rc = hora__comm_fusion_buffer(comm, bytes, &flat);
      if (rc == HORA_SUCCESS && comm->rank == root) {
        iov_copy(buf, nbuf, 0, bytes, flat, true);
      }
    }
    if (rc == HORA_SUCCESS) {
      rc = hora__cross_broadcast(comm, flat, bytes, from->host_index);
    }
    if (rc == HORA_SUCCESS && nbuf > 1 && comm->rank != root) {
      iov_copy(buf, nbuf, 0, bytes, flat, false);
    }
  }
  if (rc == HORA_SUCCESS) {
    rc = hora__shm_broadcast(comm, buf, nbuf, bytes, from->local_rank);
  }
  hora__coll_phase(opts, NULL);
  return rc;
}

/* Copies bytes [off, off + n) of a column, blocks of `bytes` at recvbuf +
 * at[h] for h = 0, 1, ... one after another, to or from flat. */
static void column_copy(char *recvbuf, const size_t *at, size_t bytes, size_t off, size_t n,
                        char *flat, bool to_flat) {
  while (n > 0) {
    size_t in = off % bytes, c = HORA_MIN(n, bytes - in);
    char *block = recvbuf + at[off / bytes] + in;
    if (to_flat) {
      memcpy(flat, block, c);
    } else {
      memcpy(block, flat, c);
    }
    flat += c;
    off += c;
    n -= c;
  }
}

int hora__hierarchical_allgather(hora__comm *comm, const void *sendbuf, size_t bytes,
                                 void *recvbuf) {
  struct hora__shm *s = comm->proc->shm;
  int H = comm->cross_size, L = comm->local_size, me = comm->local_rank;
  if (bytes == 0) {
    return HORA_SUCCESS;
  }
  /* at[j * H + h]: where the block of local rank j on host h lands. */
  size_t *at = hora__malloc((size_t)comm->size * sizeof(*at));
  if (!at) {
    return HORA_ERR_NO_MEMORY;
  }
  for (int r = 0; r < comm->size; r++) {
    const struct hora__peer_info *p = &comm->net->peers[r];
    at[(size_t)p->local_rank * (size_t)H + (size_t)p->host_index] = (size_t)r * bytes;
  }
  int rc = hora__comm_connect_partners(comm);
  if (rc == HORA_SUCCESS) {
    rc = hora__cross_allgather(comm, sendbuf, bytes, recvbuf, at + (size_t)me * (size_t)H);
  }
  size_t column = (size_t)H * bytes, piece = hora__shm_half_bytes(s);
  for (size_t done = 0; rc == HORA_SUCCESS && done < column; done += piece) {
    size_t n = HORA_MIN(piece, column - done);
    int h = (int)(comm->shm_seq++ & 1);
    column_copy(recvbuf, at + (size_t)me * (size_t)H, bytes, done, n, hora__shm_half(s, me, h),
                true);
    rc = hora__shm_barrier(s, comm->net);
    for (int j = 0; rc == HORA_SUCCESS && j < L; j++) {
      if (j != me) {
        column_copy(recvbuf, at + (size_t)j * (size_t)H, bytes, done, n, hora__shm_half(s, j, h),
                    false);
      }
    }
  }
  free(at);
  return rc;
}
