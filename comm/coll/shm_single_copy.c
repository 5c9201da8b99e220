/* Single copy: the ranks of a host reading each other's buffers in place.
 *
 * For large allreduces, when the kernel lets the ranks of a host read each
 * other's memory (process_vm_readv), nothing is staged:
 *
 *   1. each rank publishes the addresses of its tensors in its half
 *   2. barrier
 *   3. rank j reduces slice j, chunk by chunk: its own input plus each
 *      peer's input, read through a bounce buffer that stays in cache,
 *      into its own output; then writes the finished chunk, still in
 *      cache, into every peer's output (process_vm_writev)
 *   4. barrier: every output is complete, and no rank reads another's
 *      buffers any more, so the callers may reuse them
 *
 * Each byte crosses memory once on its way in and once on its way out,
 * against twice each way when staged, with two barriers per operation.
 *
 * Where a peer's buffers lie in hora_mem_alloc blocks (shm_mem.c), each rank
 * publishes where, and the others map those blocks and reduce straight out
 * of the peer's input and store straight into its output: no bounce buffer,
 * no system call, no page pinning. Each rank chooses per peer and side, on
 * its own: a peer it cannot map is served through the kernel as above.
 * Only rank j touches slice j of any buffer, so in-place works.
 *
 * Where the kernel copies are slow (path_tuner.h), an operation that has a
 * buffer outside the blocks is staged instead, after the addresses are
 * exchanged: only then can every rank see whether any such buffer exists. */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/uio.h>

#include "comm/coll/collectives.h"
#include "comm/reduce/reduce.h"
#include "comm/shm/shm.h"

hora__shm_forge_fn *_Atomic hora__shm_forge;

#define BOUNCE (512 * 1024)
#define IOV_BATCH 512

/* Segments of bytes [off, off + len) of a buffer made of tensors with the
 * given lengths and base addresses; returns how many were written (at most
 * max) and moves the offset and length past them. */
static int segments(const struct hora__iov *shape, int n, const uint64_t *bases, size_t *off,
                    size_t *len, struct iovec *iov, int max) {
  int k = 0;
  size_t base = 0;
  for (int i = 0; i < n && *len > 0 && k < max; i++) {
    size_t end = base + shape[i].len;
    if (*off < end) {
      size_t in = *off - base;
      size_t c = HORA_MIN(*len, shape[i].len - in);
      iov[k].iov_base = (void *)(uintptr_t)(bases[i] + in);
      iov[k].iov_len = c;
      k++;
      *off += c;
      *len -= c;
    }
    base = end;
  }
  return k;
}

/* For the bytes [x, x + m) of the virtual buffer: out = in (op) peer when
 * first, else out = out (op) peer. The peer's bytes are either contiguous
 * at peer_flat, or, with peer_each, at peer_each[i] for tensor i. */
static void reduce_segments(const struct hora__iov *in, const struct hora__iov *out, int n,
                            size_t x, size_t m, const char *peer_flat, char *const *peer_each,
                            hora_dtype dtype, hora_op op, int first) {
  size_t es = hora_dtype_size(dtype), base = 0;
  for (int i = 0; i < n && m > 0; i++) {
    size_t end = base + in[i].len;
    if (x < end) {
      size_t at = x - base, c = HORA_MIN(m, in[i].len - at);
      char *o = (char *)out[i].base + at;
      const char *a = first ? (const char *)in[i].base + at : o;
      if (peer_each) {
        hora__reduce(dtype, op, o, a, peer_each[i] + at, c / es);
      } else {
        hora__reduce(dtype, op, o, a, peer_flat, c / es);
        peer_flat += c;
      }
      x += c;
      m -= c;
    }
    base = end;
  }
}

/* The name of local rank lr, for messages ("rank R (host H, pid P)"). */
static const char *local_peer_name(const hora__comm *comm, int lr, char *name, size_t n) {
  int peer_rank = lr;
  for (int r = 0; r < comm->size; r++) {
    if (comm->net->peers[r].host_index == comm->cross_rank && comm->net->peers[r].local_rank == lr) {
      peer_rank = r;
    }
  }
  return hora__peer_name(comm->net, peer_rank, name, n);
}

static int cma(hora__comm *comm, int lr, bool write, struct iovec *local, int nl,
               struct iovec *remote, int nr, size_t bytes) {
  struct hora__shm *s = comm->proc->shm;
  pid_t pid = hora__shm_pid(s, lr);
  ssize_t got = write ? process_vm_writev(pid, local, (unsigned long)nl, remote, (unsigned long)nr, 0)
                      : process_vm_readv(pid, local, (unsigned long)nl, remote, (unsigned long)nr, 0);
  if (got == (ssize_t)bytes) {
    return HORA_SUCCESS;
  }
  char name[160];
  local_peer_name(comm, lr, name, sizeof(name));
  if (got < 0 && errno == ESRCH) {
    return hora__error(HORA_ERR_PEER_LOST, "lost %s: the process is gone", name);
  }
  if (got < 0) {
    return hora__error_errno(HORA_ERR_SYSTEM, "%s %s",
                             write ? "process_vm_writev to" : "process_vm_readv from", name);
  }
  return hora__error(HORA_ERR_SYSTEM, "%s %s moved %zd of %zu bytes",
                     write ? "process_vm_writev to" : "process_vm_readv from", name, got, bytes);
}

/* What each rank publishes in its half: the addresses of its n inputs and n
 * outputs, where each lies in a hora_mem_alloc block, and its count of frees. */
struct published {
  uint64_t frees;
  uint64_t pad;
  /* then uint64_t addr[2n] and struct hora__mem_ref ref[2n] */
};

static size_t published_bytes(int n) {
  return sizeof(struct published) + (size_t)n * 2 * (sizeof(uint64_t) + sizeof(struct hora__mem_ref));
}

static uint64_t *published_addrs(char *half) { return (uint64_t *)(void *)(half + sizeof(struct published)); }

static struct hora__mem_ref *published_refs(char *half, int n) {
  return (struct hora__mem_ref *)(void *)(published_addrs(half) + 2 * (size_t)n);
}

bool hora__shm_single_copy_fits(hora__comm *comm, int n, size_t bytes) {
  return comm->proc->shm && hora__shm_cma(comm->proc->shm) && comm->cross_size == 1 &&
         bytes / (size_t)comm->local_size >= (size_t)comm->proc->single_copy_min &&
         published_bytes(n) <= hora__shm_half_bytes(comm->proc->shm);
}

/* Whether every local rank published every input and output as lying in a
 * hora_mem_alloc block: then no byte needs the kernel, whatever the path
 * table says. */
static bool all_published(struct hora__shm *s, int L, int h, int n) {
  for (int j = 0; j < L; j++) {
    const struct hora__mem_ref *refs = published_refs(hora__shm_half(s, j, h), n);
    for (int i = 0; i < 2 * n; i++) {
      if (!refs[i].id) {
        return false;
      }
    }
  }
  return true;
}

/* Fills ptrs[0..2n) with this process's addresses of local rank j's inputs
 * and outputs (as long as ours: in and out). A side that cannot be mapped
 * whole gets ptrs[0] (inputs) or ptrs[n] (outputs) NULL: it goes through
 * the kernel. A reference outside its block fails the operation. */
static int map_peer(hora__comm *comm, int j, char *half, const struct hora__iov *in,
                    const struct hora__iov *out, int n, uint64_t op, char **ptrs) {
  const struct published *pub = (const struct published *)(const void *)half;
  const struct hora__mem_ref *refs = published_refs(half, n);
  pid_t pid = hora__shm_pid(comm->proc->shm, j);
  for (int side = 0; side < 2; side++) {
    char **p = ptrs + (size_t)side * (size_t)n;
    const struct hora__mem_ref *r = refs + (size_t)side * (size_t)n;
    const struct hora__iov *ours = side ? out : in;
    for (int i = 0; i < n; i++) {
      bool bad = false;
      p[i] = r[i].id ? hora__peer_mem(comm->proc->peer_maps, j, pid, pub->frees, op, &r[i],
                                      ours[i].len, &bad)
                     : NULL;
      if (bad) {
        char name[160];
        return hora__error(HORA_ERR_PROTOCOL,
                           "%s published a hora_mem_alloc block reference out of bounds: "
                           "offset %" PRIu64 " + %zu bytes of its %s %d in a block of %" PRIu64
                           " bytes",
                           local_peer_name(comm, j, name, sizeof(name)), r[i].offset, ours[i].len,
                           side ? "output" : "input", i, r[i].len);
      }
      if (!p[i]) {
        p[0] = NULL;
        break;
      }
    }
  }
  return HORA_SUCCESS;
}

/* Copies the bytes [x, x + m) of our outputs into the peer's, whose
 * addresses here are peer[i]. */
static void store_direct(const struct hora__iov *out, int n, size_t x, size_t m, char *const *peer) {
  size_t base = 0;
  for (int i = 0; i < n && m > 0; i++) {
    size_t end = base + out[i].len;
    if (x < end) {
      size_t at = x - base, c = HORA_MIN(m, out[i].len - at);
      memcpy(peer[i] + at, (const char *)out[i].base + at, c);
      x += c;
      m -= c;
    }
    base = end;
  }
}

int hora__shm_allreduce_single_copy(hora__comm *comm, const struct hora__iov *in,
                                    const struct hora__iov *out, int n, size_t count,
                                    hora_dtype dtype, hora_op op,
                                    const struct hora__coll_opts *opts) {
  struct hora__shm *s = comm->proc->shm;
  int L = comm->local_size, me = comm->local_rank;
  size_t es = hora_dtype_size(dtype);
  if (!comm->proc->bounce) {
    comm->proc->bounce = hora__aligned_alloc(64, BOUNCE);
    if (!comm->proc->bounce) {
      return HORA_ERR_NO_MEMORY;
    }
  }
  if (!comm->proc->peer_maps) {
    comm->proc->peer_maps = hora__peer_maps_new(L);
    if (!comm->proc->peer_maps) {
      return HORA_ERR_NO_MEMORY;
    }
  }
  size_t nptrs = (size_t)L * 2 * (size_t)n;
  if (comm->proc->peer_ptrs_cap < nptrs) {
    char **p = realloc(comm->proc->peer_ptrs, nptrs * sizeof(*p));
    if (!p) {
      return hora__error(HORA_ERR_NO_MEMORY, "out of memory for %zu peer addresses", nptrs);
    }
    comm->proc->peer_ptrs = p;
    comm->proc->peer_ptrs_cap = nptrs;
  }
  char *peer_data = comm->proc->bounce;
  size_t share = count * es / (size_t)L;
  enum hora__shm_path path = hora__shm_path(s, share);
  int h = (int)(comm->shm_seq++ & 1);
  char *my_half = hora__shm_half(s, me, h);
  struct published *pub = (struct published *)(void *)my_half;
  uint64_t *mine = published_addrs(my_half);
  struct hora__mem_ref *my_refs = published_refs(my_half, n);
  pub->frees = hora__mem_frees();
  for (int i = 0; i < n; i++) {
    mine[i] = (uint64_t)(uintptr_t)in[i].base;
    mine[n + i] = (uint64_t)(uintptr_t)out[i].base;
    hora__mem_find(in[i].base, in[i].len, &my_refs[i]);
    hora__mem_find(out[i].base, out[i].len, &my_refs[n + i]);
  }
  hora__shm_forge_fn *forge = atomic_load(&hora__shm_forge);
  if (forge) {
    forge(my_refs, 2 * n, NULL, 0);
  }
  hora__coll_phase(opts, "ALLREDUCE");
  HORA_CHECK(hora__shm_barrier(comm->proc->shm, comm->net));
  /* Timed from here, where every rank starts together, to each rank's last
   * byte: a late peer's arrival is not the path's cost. */
  uint64_t started = hora__now_ns();
  bool published = all_published(s, L, h, n);
  if (!published) {
    hora__shm_path_begin(s, share, path, count * es);
    if (path == HORA_SHM_PATH_STAGED) {
      /* Some buffer must go through the kernel, and staging is faster here.
       * Every rank sees the same published references, so all stage. */
      hora__coll_phase(opts, NULL);
      HORA_CHECK(hora__shm_allreduce(comm, in, n, out, n, count, dtype, op, dtype, opts));
      hora__shm_path_end(s, hora__now_ns() - started);
      return HORA_SUCCESS;
    }
  }
  /* Per peer and side: this process's addresses of its buffers, or a NULL
   * first address where they go through the kernel. */
  bool all_direct = true;
  for (int j = 0; j < L; j++) {
    if (j != me) {
      char **p = comm->proc->peer_ptrs + (size_t)j * 2 * (size_t)n;
      HORA_CHECK(map_peer(comm, j, hora__shm_half(s, j, h), in, out, n, comm->shm_seq, p));
      all_direct = all_direct && p[0] && p[n];
    }
  }
  __atomic_fetch_add(all_direct ? &comm->proc->direct_bytes : &comm->proc->kernel_bytes,
                     (uint64_t)(count * es), __ATOMIC_RELAXED);
  size_t a, b;
  hora__shm_slice(count, L, me, &a, &b);
  struct iovec remote[IOV_BATCH], local[IOV_BATCH];
  size_t chunk = BOUNCE / es * es;
  for (size_t x = a * es; x < b * es; x += chunk) {
    /* No barrier until the end: a large slice would starve the service. */
    HORA_CHECK(hora__service_maybe(comm->net));
    size_t m = HORA_MIN(chunk, b * es - x);
    int first = 1;
    for (int j = 0; j < L; j++) {
      if (j == me) {
        continue;
      }
      char **direct = comm->proc->peer_ptrs + (size_t)j * 2 * (size_t)n;
      if (direct[0]) {
        reduce_segments(in, out, n, x, m, NULL, direct, dtype, op, first);
        first = 0;
        continue;
      }
      const uint64_t *theirs = published_addrs(hora__shm_half(s, j, h));
      size_t off = x, left = m;
      char *dst = peer_data;
      while (left > 0) {
        size_t before = left;
        int k = segments(in, n, theirs, &off, &left, remote, IOV_BATCH);
        struct iovec flat = {dst, before - left};
        HORA_CHECK(cma(comm, j, false, &flat, 1, remote, k, before - left));
        dst += before - left;
      }
      /* out = in (op) peer for the first peer, then out = out (op) peer:
       * straight from the caller's buffers, with no copy of our own. */
      reduce_segments(in, out, n, x, m, peer_data, NULL, dtype, op, first);
      first = 0;
    }
    size_t off = x, left = m;
    while (left > 0) {
      int k = segments(out, n, mine + n, &off, &left, local, IOV_BATCH);
      for (int i = 0; i < k; i++) {
        hora__post_apply(opts, dtype, local[i].iov_base, local[i].iov_len / es);
      }
    }
    /* The finished chunk is still in cache: hand it to every peer now.
     * Outputs have the same lengths on every rank, so the local and remote
     * segment lists line up. */
    for (int j = 0; j < L; j++) {
      if (j == me) {
        continue;
      }
      char **direct = comm->proc->peer_ptrs + (size_t)j * 2 * (size_t)n + n;
      if (direct[0]) {
        store_direct(out, n, x, m, direct);
        continue;
      }
      const uint64_t *theirs = published_addrs(hora__shm_half(s, j, h));
      size_t off_l = x, left_l = m, off_r = x, left_r = m;
      while (left_r > 0) {
        size_t before = left_r;
        int kl = segments(out, n, mine + n, &off_l, &left_l, local, IOV_BATCH);
        int kr = segments(out, n, theirs + n, &off_r, &left_r, remote, IOV_BATCH);
        HORA_CHECK(cma(comm, j, true, local, kl, remote, kr, before - left_r));
      }
    }
  }
  if (!published) {
    hora__shm_path_end(s, hora__now_ns() - started);
  }
  HORA_CHECK(hora__shm_barrier(comm->proc->shm, comm->net));
  hora__coll_phase(opts, NULL);
  return HORA_SUCCESS;
}

/* ---- single copy for alltoall and allgatherv ----------------------------------
 * Each rank publishes where its sendbuf lies (and, for an alltoall, where
 * its block for each rank begins in it); after a barrier every rank reads
 * its blocks straight out of the peers' sendbufs with process_vm_readv, and
 * a second barrier keeps every sendbuf in place until all have read. Only
 * where every rank chose the kernel for blocks this large: each publishes
 * its choice, so all see the same answer, and on "no" the caller stages.
 * The publishing can go out with the counts records (one barrier less):
 * the choice is then made after it, from the largest block in the records,
 * the same on every rank (the settings it depends on are agreed, and the
 * path table only changes in an allreduce's first step). */
struct published_blocks {
  uint64_t kernel; /* 1: this rank reads through the kernel */
  uint64_t base;   /* its sendbuf */
  /* then uint64_t offset[L]: where its block for each local rank begins;
   * with the records, then its record (width words) */
};

static bool kernel_for(const hora__comm *comm, size_t most) {
  struct hora__shm *s = comm->proc->shm;
  return hora__shm_cma(s) && most >= (size_t)comm->proc->single_copy_min &&
         hora__shm_path(s, most) == HORA_SHM_PATH_KERNEL;
}

static void publish_blocks(hora__comm *comm, int h, const void *sendbuf, const size_t *offsets,
                           bool kernel) {
  struct published_blocks *pub =
      (struct published_blocks *)(void *)hora__shm_half(comm->proc->shm, comm->local_rank, h);
  uint64_t *off = (uint64_t *)(pub + 1);
  pub->kernel = kernel;
  pub->base = (uint64_t)(uintptr_t)sendbuf;
  for (int j = 0; j < comm->local_size; j++) {
    off[j] = offsets ? offsets[j] : 0;
  }
  hora__shm_forge_fn *forge = atomic_load(&hora__shm_forge);
  if (forge) {
    forge(NULL, 0, off, comm->local_size);
  }
}

int hora__shm_publish_blocks(hora__comm *comm, const void *sendbuf, const size_t *offsets,
                             const uint64_t *record, size_t width, uint64_t *all,
                             bool *published) {
  struct hora__shm *s = comm->proc->shm;
  int L = comm->local_size;
  *published = false;
  if (!hora__shm_cma(s) ||
      sizeof(struct published_blocks) + ((size_t)L + width) * sizeof(uint64_t) >
          hora__shm_half_bytes(s)) {
    return HORA_SUCCESS;
  }
  comm->published_seq = comm->shm_seq;
  int h = (int)(comm->shm_seq++ & 1);
  publish_blocks(comm, h, sendbuf, offsets, false);
  memcpy((uint64_t *)(void *)(hora__shm_half(s, comm->local_rank, h) +
                              sizeof(struct published_blocks)) + L,
         record, width * sizeof(uint64_t));
  HORA_CHECK(hora__shm_barrier(s, comm->net));
  for (int j = 0; j < L; j++) {
    const uint64_t *theirs =
        (const uint64_t *)(const void *)(hora__shm_half(s, j, h) + sizeof(struct published_blocks));
    memcpy(all + (size_t)j * width, theirs + L, width * sizeof(uint64_t));
  }
  *published = true;
  return HORA_SUCCESS;
}

int hora__shm_read_blocks(hora__comm *comm, const void *sendbuf, const size_t *offsets,
                          void *recvbuf, const size_t *recv_bytes, const size_t *at, size_t most,
                          bool published, bool *done) {
  struct hora__shm *s = comm->proc->shm;
  int L = comm->local_size, me = comm->local_rank;
  *done = false;
  int h;
  if (published) {
    if (comm->shm_seq != comm->published_seq + 1) {
      /* (A use of the segment between the two: a bug, not a peer's doing.) */
      return hora__error(HORA_ERR_SYSTEM, "single-copy exchange: its published blocks were "
                         "overwritten before the read");
    }
    h = (int)(comm->published_seq & 1);
    if (!kernel_for(comm, most)) {
      return HORA_SUCCESS; /* (the same on every rank: the caller stages) */
    }
  } else {
    if (sizeof(struct published_blocks) + (size_t)L * sizeof(uint64_t) > hora__shm_half_bytes(s)) {
      return HORA_SUCCESS;
    }
    h = (int)(comm->shm_seq++ & 1);
    publish_blocks(comm, h, sendbuf, offsets, kernel_for(comm, most));
    HORA_CHECK(hora__shm_barrier(s, comm->net));
    for (int j = 0; j < L; j++) {
      if (!((struct published_blocks *)(void *)hora__shm_half(s, j, h))->kernel) {
        return HORA_SUCCESS; /* (all ranks see the same: the caller stages) */
      }
    }
  }
  size_t moved = 0;
  for (int k = 0; k < L; k++) {
    int j = (me + k) % L; /* each rank starts with a different peer */
    if (!recv_bytes[j]) {
      continue;
    }
    if (j == me) {
      /* Our own block from our own sendbuf, not from what the segment says
       * (memmove: an allgatherv in place has it there already). */
      memmove((char *)recvbuf + at[j], (const char *)sendbuf + (offsets ? offsets[me] : 0),
              recv_bytes[j]);
      continue;
    }
    const struct published_blocks *theirs =
        (const struct published_blocks *)(const void *)hora__shm_half(s, j, h);
    uint64_t base = theirs->base, off = ((const uint64_t *)(theirs + 1))[me];
    if (off > UINT64_MAX - base || recv_bytes[j] > UINT64_MAX - (base + off)) {
      char name[160];
      return hora__error(HORA_ERR_PROTOCOL,
                         "%s published a block offset %" PRIu64 " (+ %zu bytes) past the end of "
                         "the address space from its sendbuf at 0x%" PRIx64,
                         local_peer_name(comm, j, name, sizeof(name)), off, recv_bytes[j], base);
    }
    uint64_t from = base + off;
    struct iovec local = {(char *)recvbuf + at[j], recv_bytes[j]};
    struct iovec remote = {(void *)(uintptr_t)from, recv_bytes[j]};
    HORA_CHECK(cma(comm, j, false, &local, 1, &remote, 1, recv_bytes[j]));
    moved += recv_bytes[j];
  }
  __atomic_fetch_add(&comm->proc->kernel_bytes, moved, __ATOMIC_RELAXED);
  HORA_CHECK(hora__shm_barrier(s, comm->net));
  *done = true;
  return HORA_SUCCESS;
}
