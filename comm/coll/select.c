/* The registry of host algorithms, the selector, and the entry points that
 * go through it. Nothing else decides between shared memory, rings, the
 * logarithmic schedules and the device data plane. */
#include <stdlib.h>

#include "base/log.h"
#include "base/params.h"
#include "comm/coll/collectives.h"
#include "comm/reduce/reduce.h"
#include "comm/shm/shm.h"

/* ---- the algorithms' run functions ------------------------------------------- */

static int ring_allreduce(hora__comm *comm, const struct hora__iov *in, int nin,
                          const struct hora__iov *out, int nout, size_t count, hora_dtype dtype,
                          hora_op op, hora_dtype wire, const struct hora__coll_opts *opts) {
  return hora__allreduce_contiguous(comm, hora__world_ring_allreduce, in, nin, out, nout, count,
                                    dtype, op, wire, opts);
}

static int rd_allreduce(hora__comm *comm, const struct hora__iov *in, int nin,
                        const struct hora__iov *out, int nout, size_t count, hora_dtype dtype,
                        hora_op op, hora_dtype wire, const struct hora__coll_opts *opts) {
  return hora__allreduce_contiguous(comm, hora__rd_allreduce, in, nin, out, nout, count, dtype,
                                    op, wire, opts);
}

static int rabenseifner_allreduce(hora__comm *comm, const struct hora__iov *in, int nin,
                                  const struct hora__iov *out, int nout, size_t count,
                                  hora_dtype dtype, hora_op op, hora_dtype wire,
                                  const struct hora__coll_opts *opts) {
  return hora__allreduce_contiguous(comm, hora__rabenseifner_allreduce, in, nin, out, nout, count,
                                    dtype, op, wire, opts);
}

static int tree_allreduce(hora__comm *comm, const struct hora__iov *in, int nin,
                          const struct hora__iov *out, int nout, size_t count, hora_dtype dtype,
                          hora_op op, hora_dtype wire, const struct hora__coll_opts *opts) {
  return hora__allreduce_contiguous(comm, hora__tree_allreduce, in, nin, out, nout, count, dtype,
                                    op, wire, opts);
}

static int shm_allreduce(hora__comm *comm, const struct hora__iov *in, int nin,
                         const struct hora__iov *out, int nout, size_t count, hora_dtype dtype,
                         hora_op op, hora_dtype wire, const struct hora__coll_opts *opts) {
  /* Decided from what every rank sees alike, so all take the same path. */
  if (nin == nout && opts && opts->prescale == 1.0 &&
      hora__shm_single_copy_fits(comm, nin, count * hora_dtype_size(dtype))) {
    return hora__shm_allreduce_single_copy(comm, in, out, nin, count, dtype, op, opts);
  }
  return hora__shm_allreduce(comm, in, nin, out, nout, count, dtype, op, wire, opts);
}

static int ring_broadcast(hora__comm *comm, const struct hora__iov *buf, int nbuf, size_t bytes,
                          int root, const struct hora__coll_opts *opts) {
  return hora__broadcast_contiguous(comm, hora__world_ring_broadcast, buf, nbuf, bytes, root,
                                    opts);
}

static int binomial_broadcast(hora__comm *comm, const struct hora__iov *buf, int nbuf,
                              size_t bytes, int root, const struct hora__coll_opts *opts) {
  return hora__broadcast_contiguous(comm, hora__binomial_broadcast, buf, nbuf, bytes, root, opts);
}

static int scatter_allgather_broadcast(hora__comm *comm, const struct hora__iov *buf, int nbuf,
                                       size_t bytes, int root,
                                       const struct hora__coll_opts *opts) {
  return hora__broadcast_contiguous(comm, hora__scatter_allgather_broadcast, buf, nbuf, bytes,
                                    root, opts);
}

static int shm_broadcast(hora__comm *comm, const struct hora__iov *buf, int nbuf, size_t bytes,
                         int root, const struct hora__coll_opts *opts) {
  if (opts && opts->phase) {
    opts->phase(opts->phase_arg, "BROADCAST");
  }
  int rc = hora__shm_broadcast(comm, buf, nbuf, bytes, comm->net->peers[root].local_rank);
  if (opts && opts->phase) {
    opts->phase(opts->phase_arg, NULL);
  }
  return rc;
}

static int ring_allgather(hora__comm *comm, const void *sendbuf, size_t bytes, void *recvbuf) {
  return hora__ring_allgather(comm, &comm->world_ring, sendbuf, bytes, recvbuf);
}

/* ---- the registry ------------------------------------------------------------ */

static bool always(const struct hora__layout *s) {
  (void)s;
  return true;
}

static bool on_one_host(const struct hora__layout *s) { return s->shm_host; }

static bool across_hosts(const struct hora__layout *s) { return s->hierarchical; }

/* The reduce-scatters over sockets, except on one host with a shared
 * segment (there the allreduce in the segment moves the same bytes through
 * memory once). Across hosts they send each host's link (p-1)/p of the
 * bytes where the hierarchical allreduce sends 2(H-1)/H. */
static bool not_one_shm_host(const struct hora__layout *s) { return !s->shm_host; }

#define ALGO_FLAGGED(ident, nm, k, sum, use, field, fn, steps_wait)                             \
  static const struct hora__algo ident = {.name = nm,                                           \
                                          .kind = k,                                           \
                                          .summary = sum,                                      \
                                          .usable = use,                                       \
                                          .cost = hora__cost_##ident,                          \
                                          .lockstep = steps_wait,                              \
                                          .field = fn}
#define ALGO(ident, nm, k, sum, use, field, fn)                                                   \
  ALGO_FLAGGED(ident, nm, k, sum, use, field, fn, false)
/* Each step waits for the whole of the one before (the selector's margin). */
#define ALGO_LOCKSTEP(ident, nm, k, sum, use, field, fn)                                          \
  ALGO_FLAGGED(ident, nm, k, sum, use, field, fn, true)

ALGO(allreduce_shm, "shm", HORA_COLL_ALLREDUCE,
     "one host: the shared segment, or the kernel's single copy for large operations",
     on_one_host, allreduce, shm_allreduce);
ALGO(allreduce_hierarchical, "hierarchical", HORA_COLL_ALLREDUCE,
     "several hosts of equal rank counts: shared memory within each, a ring of hosts per slice",
     across_hosts, allreduce, shm_allreduce);
ALGO(allreduce_ring, "ring", HORA_COLL_ALLREDUCE,
     "pipelined ring: reduce-scatter then allgather, 2(p-1) steps, 2(p-1)/p of the bytes",
     always, allreduce, ring_allreduce);
ALGO_LOCKSTEP(allreduce_rd, "rd", HORA_COLL_ALLREDUCE,
              "recursive doubling: log2 p swaps of the whole buffer (small operations)", always,
              allreduce, rd_allreduce);
ALGO_LOCKSTEP(allreduce_rabenseifner, "rabenseifner", HORA_COLL_ALLREDUCE,
              "recursive halving reduce-scatter, recursive doubling allgather: 2 log2 p steps",
              always, allreduce, rabenseifner_allreduce);
ALGO(allreduce_tree, "tree", HORA_COLL_ALLREDUCE,
     "pipelined double binary tree: 2 log2 p steps plus one per chunk (medium sizes, many ranks)",
     always, allreduce, tree_allreduce);
ALGO(broadcast_shm, "shm", HORA_COLL_BROADCAST, "one host: through the shared segment",
     on_one_host, broadcast, shm_broadcast);
ALGO(broadcast_hierarchical, "hierarchical", HORA_COLL_BROADCAST,
     "several hosts of equal rank counts: the root's local rank across hosts, then each "
     "host's shared segment",
     across_hosts, broadcast, hora__hierarchical_broadcast);
ALGO(broadcast_ring, "ring", HORA_COLL_BROADCAST,
     "pipelined chain from the root along the ring (large operations)", always, broadcast,
     ring_broadcast);
ALGO_LOCKSTEP(broadcast_binomial, "binomial", HORA_COLL_BROADCAST,
              "binomial tree from the root: ceil(log2 p) steps (small operations)", always,
              broadcast, binomial_broadcast);
ALGO_LOCKSTEP(broadcast_scatter_allgather, "scatter_allgather", HORA_COLL_BROADCAST,
              "binomial scatter of p blocks, then the ring's allgather of them (large operations)",
              always, broadcast, scatter_allgather_broadcast);
ALGO(allgather_shm, "shm", HORA_COLL_ALLGATHER, "one host: through the shared segment",
     on_one_host, allgather, hora__shm_allgather);
ALGO(allgather_hierarchical, "hierarchical", HORA_COLL_ALLGATHER,
     "several hosts of equal rank counts: each local rank's block across hosts, then the "
     "host's shared segment",
     across_hosts, allgather, hora__hierarchical_allgather);
ALGO(allgather_ring, "ring", HORA_COLL_ALLGATHER, "ring: p-1 steps, one block each", always,
     allgather, ring_allgather);
ALGO_LOCKSTEP(allgather_bruck, "bruck", HORA_COLL_ALLGATHER,
              "Bruck: ceil(log2 p) steps of doubling block counts, any p", always, allgather,
              hora__bruck_allgather);
ALGO(reducescatter_ring, "ring", HORA_COLL_REDUCESCATTER,
     "the ring allreduce's reduce-scatter half: p-1 steps (over sockets)", not_one_shm_host,
     scatter, HORA_SCATTER_RING);
ALGO(reducescatter_allreduce, "allreduce", HORA_COLL_REDUCESCATTER,
     "the chosen allreduce, of which each rank keeps its block", always, scatter,
     HORA_SCATTER_ALLREDUCE);
ALGO_LOCKSTEP(reducescatter_halving, "halving", HORA_COLL_REDUCESCATTER,
              "recursive halving: log2 p steps of halving sizes (over sockets)", not_one_shm_host,
              scatter, HORA_SCATTER_HALVING);

const struct hora__algo *const hora__algos[] = {
    &allreduce_shm,          &allreduce_hierarchical,
    &allreduce_ring,         &allreduce_rd,
    &allreduce_rabenseifner, &allreduce_tree,
    &broadcast_shm,          &broadcast_hierarchical,
    &broadcast_ring,         &broadcast_binomial,
    &broadcast_scatter_allgather,
    &allgather_shm,          &allgather_hierarchical,
    &allgather_ring,         &allgather_bruck,
    &reducescatter_ring,     &reducescatter_allreduce,
    &reducescatter_halving,
};
const int hora__nalgos = (int)(sizeof(hora__algos) / sizeof(hora__algos[0]));

const char *hora__algo_kind_name(enum hora__coll_kind kind) {
  static const char *const names[HORA_ALGO_KINDS] = {"allreduce", "broadcast", "allgather",
                                                     "reducescatter"};
  return (int)kind >= 0 && (int)kind < HORA_ALGO_KINDS ? names[kind] : "?";
}

const struct hora__algo *hora__algo_find(enum hora__coll_kind kind, const char *name) {
  for (int i = 0; i < hora__nalgos; i++) {
    if (hora__algos[i]->kind == kind && strcmp(hora__algos[i]->name, name) == 0) {
      return hora__algos[i];
    }
  }
  return NULL;
}

void hora__comm_layout(const hora__comm *comm, struct hora__layout *s) {
  *s = (struct hora__layout){.size = comm->size,
                            .hosts = comm->cross_size,
                            .shm_host = comm->shm_host,
                            .hierarchical = comm->hierarchical,
                            .chunk = (size_t)HORA_MAX(comm->proc->chunk_bytes, 1)};
}

void hora__cross_layout(const struct hora__layout *s, struct hora__layout *x) {
  *x = (struct hora__layout){.size = s->hosts, .hosts = s->hosts, .chunk = s->chunk};
}

const struct hora__algo *hora__algo_pick(const struct hora__layout *s,
                                         const struct hora__cost_model *m,
                                         enum hora__coll_kind kind, size_t bytes) {
  const struct hora__algo *best = NULL;
  double best_cost = 0;
  for (int i = 0; i < hora__nalgos; i++) {
    const struct hora__algo *a = hora__algos[i];
    if (a->kind != kind || !a->usable(s)) {
      continue;
    }
    double c = a->cost(m, s, bytes);
    if (!best || c < best_cost) {
      best = a;
      best_cost = c;
    }
  }
  if (best && best->lockstep) {
    const struct hora__algo *ring = hora__algo_find(kind, "ring");
    if (ring && ring->usable(s) && ring->cost(m, s, bytes) <= best_cost * (1 + HORA_RING_MARGIN)) {
      return ring;
    }
  }
  return best;
}

const struct hora__algo *hora__cross_pick(const struct hora__layout *s,
                                          const struct hora__cost_model *m,
                                          enum hora__coll_kind kind, size_t bytes, double *cost) {
  /* One member per host. The allreduce's and the allgather's L local
   * ranks' groups run at once, sharing each host's link; a broadcast
   * crosses hosts in the root's group only. */
  int L = HORA_MAX(s->size / HORA_MAX(s->hosts, 1), 1);
  struct hora__layout x;
  hora__cross_layout(s, &x);
  struct hora__cost_model shared = *m;
  if (kind != HORA_COLL_BROADCAST) {
    shared.link.beta *= L;
  }
  const struct hora__algo *a = hora__algo_pick(&x, &shared, kind, bytes);
  if (cost) {
    *cost = a->cost(&shared, &x, bytes);
  }
  return a;
}

const struct hora__algo *hora__cross_algorithm(const hora__comm *comm, enum hora__coll_kind kind,
                                               size_t bytes) {
  struct hora__layout s;
  hora__comm_layout(comm, &s);
  return hora__cross_pick(&s, &comm->model, kind, bytes, NULL);
}

const struct hora__algo *hora__algo_select(const hora__comm *comm, enum hora__coll_kind kind,
                                           size_t bytes) {
  if (comm->forced[kind]) {
    return comm->forced[kind];
  }
  struct hora__layout s;
  hora__comm_layout(comm, &s);
  return hora__algo_pick(&s, &comm->model, kind, bytes);
}

int hora__coll_choose(hora__comm *comm, bool shm, bool hierarchical) {
  comm->shm_host = shm && comm->cross_size == 1 && comm->size > 1;
  comm->hierarchical = shm && comm->cross_size > 1 && hierarchical;
  comm->algo_device = &hora__coll_gpu;
  const char *forced[HORA_ALGO_KINDS] = {
      hora__params.ALGORITHM_ALLREDUCE, hora__params.ALGORITHM_BROADCAST,
      hora__params.ALGORITHM_ALLGATHER, hora__params.ALGORITHM_REDUCESCATTER};
  struct hora__layout s;
  hora__comm_layout(comm, &s);
  for (int k = 0; k < HORA_ALGO_KINDS; k++) {
    comm->forced[k] = NULL;
    if (strcmp(forced[k], "auto") == 0) {
      continue;
    }
    const struct hora__algo *a = hora__algo_find((enum hora__coll_kind)k, forced[k]);
    if (!a) {
      return hora__error(HORA_ERR_INVALID_ARG, "HORA_ALGORITHM_%s=%s: no such %s algorithm "
                         "(hora-info --algorithms lists them)",
                         k == 0 ? "ALLREDUCE" : k == 1 ? "BROADCAST" : k == 2 ? "ALLGATHER"
                                                                      : "REDUCESCATTER",
                         forced[k], hora__algo_kind_name((enum hora__coll_kind)k));
    }
    if (!a->usable(&s)) {
      /* Every rank sees the same shape: all fall back alike. */
      if (comm->rank == 0) {
        HORA_WARN("HORA_ALGORITHM_%s=%s cannot run on this communicator (%d ranks on %d "
                  "host(s)%s); the cost model chooses instead",
                  k == 0 ? "ALLREDUCE" : k == 1 ? "BROADCAST" : k == 2 ? "ALLGATHER"
                                                                       : "REDUCESCATTER",
                  forced[k], comm->size, comm->cross_size,
                  shm ? "" : ", no shared memory");
      }
      continue;
    }
    comm->forced[k] = a;
  }
  return HORA_SUCCESS;
}

int hora__coll_run(hora__comm *comm, const struct hora__coll_op *op) {
  if (op->device) {
    return comm->algo_device->run_device(comm, op);
  }
  switch (op->kind) {
    case HORA_COLL_ALLREDUCE:
      return hora__allreduce(comm, op->in, op->n, op->out, op->n, op->count, op->dtype, op->op,
                             op->wire, op->opts);
    case HORA_COLL_BROADCAST:
      return hora__broadcast(comm, op->out, op->n, op->bytes, op->root, op->opts);
    case HORA_COLL_ALLGATHER:
      return hora__allgather(comm, op->in[0].base, op->bytes, op->out[0].base);
    case HORA_COLL_REDUCESCATTER:
      if (op->unit == 0) {
        return hora__reducescatter_at(comm, op->in[0].base, op->out[0].base, op->count,
                                      op->block_start, op->block_len, op->dtype, op->op, op->wire,
                                      op->opts);
      }
      return hora__reducescatter(comm, op->in[0].base, op->out[0].base, op->count, op->unit,
                                 op->dtype, op->op, op->wire, op->opts);
    case HORA_COLL_ALLGATHERV:
      return hora__allgatherv(comm, op->in[0].base, op->recv_bytes, op->out[0].base,
                              op->published);
    case HORA_COLL_ALLTOALL:
      return hora__alltoall(comm, op->in[0].base, op->send_bytes, op->out[0].base,
                            op->recv_bytes, op->most, op->published);
  }
  return hora__error(HORA_ERR_INVALID_ARG, "collective of unknown kind %d", (int)op->kind);
}

/* Adasum, on one tensor (it is never fused: its coefficients are the
 * tensor's own), in place in the output. */
static int adasum_allreduce(hora__comm *comm, const struct hora__iov *in, int nin,
                            const struct hora__iov *out, int nout, size_t count, hora_dtype dtype,
                            const struct hora__coll_opts *opts) {
  if (nin != 1 || nout != 1) {
    return hora__error(HORA_ERR_INVALID_ARG, "adasum of %d tensors at once", nin);
  }
  if (out[0].base != in[0].base && out[0].len) {
    memcpy(out[0].base, in[0].base, out[0].len);
  }
  if (opts && opts->prescale != 1.0) {
    hora__scale(dtype, out[0].base, count, opts->prescale);
  }
  if (opts && opts->phase) {
    opts->phase(opts->phase_arg, "ADASUM");
  }
  int rc = hora__adasum(comm, out[0].base, count, dtype, opts && opts->device);
  if (opts && opts->phase) {
    opts->phase(opts->phase_arg, NULL);
  }
  if (rc == HORA_SUCCESS && opts && opts->postscale != 1.0) {
    hora__scale(dtype, out[0].base, count, opts->postscale);
  }
  return rc;
}

int hora__allreduce(hora__comm *comm, const struct hora__iov *in, int nin,
                    const struct hora__iov *out, int nout, size_t count, hora_dtype dtype,
                    hora_op op, hora_dtype wire, const struct hora__coll_opts *opts) {
  if (op == HORA_ADASUM) {
    return adasum_allreduce(comm, in, nin, out, nout, count, dtype, opts);
  }
  const struct hora__algo *a =
      hora__algo_select(comm, HORA_COLL_ALLREDUCE, count * hora_dtype_size(dtype));
  return a->allreduce(comm, in, nin, out, nout, count, dtype, op, wire, opts);
}

int hora__broadcast(hora__comm *comm, const struct hora__iov *buf, int nbuf, size_t bytes,
                    int root, const struct hora__coll_opts *opts) {
  return hora__algo_select(comm, HORA_COLL_BROADCAST, bytes)
      ->broadcast(comm, buf, nbuf, bytes, root, opts);
}

int hora__allgather(hora__comm *comm, const void *sendbuf, size_t bytes, void *recvbuf) {
  return hora__algo_select(comm, HORA_COLL_ALLGATHER, bytes)->allgather(comm, sendbuf, bytes,
                                                                        recvbuf);
}

/* The recursive halving, which needs every rank's block: Horovod's split
 * computed here, explicit counts (unit 0) exchanged first, since the
 * operation carries only this rank's (a joined rank's is empty). */
static int halving_reducescatter(hora__comm *comm, const void *sendbuf, void *recvbuf,
                                 size_t count, size_t unit, size_t start, size_t len,
                                 hora_dtype dtype, hora_op op, hora_dtype wire,
                                 const struct hora__coll_opts *opts) {
  int p = comm->size, rc = HORA_SUCCESS;
  size_t *starts = hora__malloc(2 * (size_t)p * sizeof(*starts));
  uint64_t *all = hora__malloc(2 * (size_t)p * sizeof(*all));
  if (!starts || !all) {
    free(starts);
    free(all);
    return HORA_ERR_NO_MEMORY;
  }
  size_t *lens = starts + p;
  if (unit > 0) {
    for (int j = 0; j < p; j++) {
      hora__block_range(count, unit, p, j, &starts[j], &lens[j]);
    }
  } else {
    uint64_t mine[2] = {start, len};
    rc = hora__allgather(comm, mine, sizeof(mine), all);
    for (int j = 0; rc == HORA_SUCCESS && j < p; j++) {
      starts[j] = (size_t)all[2 * j];
      lens[j] = (size_t)all[2 * j + 1];
      if (all[2 * j] > count || all[2 * j + 1] > count - all[2 * j]) {
        /* (Every rank sees the same records: all fail alike.) */
        rc = hora__error(HORA_ERR_INVALID_ARG, "reducescatter: rank %d's block [%zu, +%zu) of "
                         "%zu elements", j, starts[j], lens[j], count);
      }
    }
  }
  if (rc == HORA_SUCCESS) {
    if (opts && opts->phase) {
      opts->phase(opts->phase_arg, "REDUCESCATTER");
    }
    rc = hora__halving_reducescatter(comm, sendbuf, recvbuf, starts, lens,
                                     opts ? opts->prescale : 1.0, dtype, op, wire);
    if (opts && opts->phase) {
      opts->phase(opts->phase_arg, NULL);
    }
  }
  if (rc == HORA_SUCCESS && len) {
    hora__post_apply(opts, dtype, recvbuf, len);
  }
  free(starts);
  free(all);
  return rc;
}

/* The registry's "ring": the reduce-scatter half of the ring allreduce
 * (blocks of Horovod's split; explicit ones, unit 0, take the allreduce).
 * Its "allreduce": the chosen allreduce into the staging buffer, of which
 * this rank keeps its block; where shared memory reduces the same bytes
 * cross the host's memory either way, and across hosts a logarithmic
 * allreduce beats the ring's p-1 steps for small operations. "halving":
 * above. */
static int reducescatter(hora__comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                         size_t unit, size_t start, size_t len, hora_dtype dtype, hora_op op,
                         hora_dtype wire, const struct hora__coll_opts *opts) {
  size_t es = hora_dtype_size(dtype);
  if (count == 0) {
    return HORA_SUCCESS; /* every block is empty */
  }
  const struct hora__algo *a = hora__algo_select(comm, HORA_COLL_REDUCESCATTER, count * es);
  if (a->scatter == HORA_SCATTER_HALVING) {
    return halving_reducescatter(comm, sendbuf, recvbuf, count, unit, start, len, dtype, op, wire,
                                 opts);
  }
  size_t had = comm->reduced_bytes;
  HORA_CHECK(hora__comm_grow_registered(comm, &comm->reduced, &comm->reduced_bytes,
                                        &comm->reduced_reg, count * es));
  if (comm->reduced_bytes != had) {
    /* Once per growth: peers may write into it with process_vm_writev,
     * which valgrind cannot see, and it would flag the results as unset. */
    memset(comm->reduced, 0, comm->reduced_bytes);
  }
  char *f = comm->reduced;
  int rc;
  if (unit > 0 && a->scatter == HORA_SCATTER_RING) {
    const void *src = sendbuf;
    if (opts && opts->prescale != 1.0) {
      memcpy(f, sendbuf, count * es);
      hora__scale(dtype, f, count, opts->prescale);
      src = f;
    }
    if (opts && opts->phase) {
      opts->phase(opts->phase_arg, "REDUCESCATTER");
    }
    rc = hora__ring_reducescatter(comm, &comm->world_ring, src, f, count, unit, dtype, op, wire);
    if (opts && opts->phase) {
      opts->phase(opts->phase_arg, NULL);
    }
    if (rc == HORA_SUCCESS) {
      hora__post_apply(opts, dtype, f + start * es, len);
    }
  } else {
    struct hora__iov in = {(void *)(uintptr_t)sendbuf, count * es}, out = {f, count * es};
    rc = hora__allreduce(comm, &in, 1, &out, 1, count, dtype, op, wire, opts);
  }
  if (rc == HORA_SUCCESS && len) {
    memcpy(recvbuf, f + start * es, len * es);
  }
  return rc;
}

int hora__reducescatter(hora__comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                        size_t unit, hora_dtype dtype, hora_op op, hora_dtype wire,
                        const struct hora__coll_opts *opts) {
  size_t start, len;
  hora__block_range(count, unit, comm->size, comm->rank, &start, &len);
  return reducescatter(comm, sendbuf, recvbuf, count, unit, start, len, dtype, op, wire, opts);
}

int hora__reducescatter_at(hora__comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                           size_t start, size_t len, hora_dtype dtype, hora_op op,
                           hora_dtype wire, const struct hora__coll_opts *opts) {
  if (start > count || len > count - start) {
    return hora__error(HORA_ERR_INVALID_ARG, "reducescatter block [%zu, +%zu) of %zu elements",
                       start, len, count);
  }
  return reducescatter(comm, sendbuf, recvbuf, count, 0, start, len, dtype, op, wire, opts);
}
