/* The collective algorithms, written once against the transport vtable.
 * Called only by the coordinator thread, in the same order on every rank.
 *
 * The engine calls the dispatchers (hora__allreduce, hora__broadcast,
 * hora__allgather, hora__reducescatter), which take each operation's
 * algorithm from the registry (select.c): the one HORA_ALGORITHM_<KIND>
 * forces, else the cheapest usable one by the cost model (cost_model.c):
 *   - one host:      shared-memory collectives (shm_coll.c)
 *   - hosts of equal rank counts: the hierarchical allreduce, broadcast
 *     and allgather (shm_coll.c): shared memory within the host, and
 *     across hosts the members with one local rank, one per host, by the
 *     flat algorithm the model picks for them (the allreduce: per slice,
 *     each local rank its own; the broadcast: the root's local rank once;
 *     the allgather: each local rank its own block)
 *   - over the connections: pipelined rings (large), recursive doubling,
 *     Rabenseifner, binomial trees and Bruck (small), the scatter +
 *     allgather broadcast and the recursive halving reduce-scatter
 *     (recursive.c), the pipelined double binary tree allreduce (medium
 *     sizes on many ranks; tree.c)
 * Data is given as gather (in) and scatter (out) lists over one virtual
 * buffer, so fused tensors need no extra copy where the algorithm can read
 * and write them in place. */
#ifndef HORA_COLLECTIVES_H
#define HORA_COLLECTIVES_H

#include "comm/comm.h"

/* The kinds of collective the data plane runs. The runtime's operation
 * kinds (runtime/message.h) share these values. */
enum hora__coll_kind {
  HORA_COLL_ALLREDUCE,
  HORA_COLL_BROADCAST,
  HORA_COLL_ALLGATHER,
  HORA_COLL_REDUCESCATTER,
  HORA_COLL_ALLGATHERV,
  HORA_COLL_ALLTOALL
};

struct hora__iov {
  void *base;
  size_t len; /* bytes */
};

/* What happens to the data besides the reduction. */
struct hora__coll_opts {
  double prescale;  /* applied to each rank's input (1: none) */
  int divisor;      /* AVERAGE: the result is divided by this (0 or 1: none) */
  double postscale; /* applied to the result last (1: none) */
  bool device;      /* the tensors are device buffers (Adasum's default differs) */
  /* Marks phases for the timeline: name = begin, NULL = end. May be NULL. */
  void (*phase)(void *arg, const char *name);
  void *phase_arg;
};

void hora__post_apply(const struct hora__coll_opts *o, hora_dtype dtype, void *buf, size_t n);

/* Marks a phase of the operation on the timeline (name NULL: its end). */
static inline void hora__coll_phase(const struct hora__coll_opts *o, const char *name) {
  if (o && o->phase) {
    o->phase(o->phase_arg, name);
  }
}

/* The socket path's private fusion buffer, of at least `bytes`: allocated
 * once, regrown only for a batch larger than any before. */
int hora__comm_fusion_buffer(hora__comm *comm, size_t bytes, char **out);

/* recv = op over every rank's input. Every rank must pass lists of the same
 * shape (lengths), each entry its own memory. wire: HORA_FLOAT16/BFLOAT16 narrows
 * float32/float64 data on socket links (pass dtype for none). AVERAGE
 * reduces as a sum; opts->divisor divides. */
/* One collective as the runtime hands it to the data plane. */
struct hora__coll_op {
  enum hora__coll_kind kind;
  const struct hora__iov *in, *out;
  int n;        /* tensors (allgather: one) */
  size_t count; /* elements over all tensors (allgather: this rank's) */
  size_t unit;  /* reducescatter: elements per row of the split (1: elements; 0: the
                   explicit block below) */
  size_t block_start, block_len; /* reducescatter with unit 0: this rank's block */
  size_t bytes; /* bytes over all tensors (allgather: this rank's) */
  hora_dtype dtype;
  hora_dtype wire; /* on the wire (compression), for host allreduces */
  hora_op op;
  int root;
  /* allgatherv and alltoall (one tensor each, in[0] and out[0]): the bytes
   * this rank sends to and receives from each rank (allgatherv: every
   * rank's block; it sends send_bytes[rank]), and the largest block
   * between any two ranks. */
  const size_t *send_bytes, *recv_bytes;
  size_t most;
  bool published; /* hora__exchange_records published in[0]'s blocks */
  const struct hora__coll_opts *opts;
  /* The buffers are GPU memory; in[i].base == NULL marks a joined rank's
   * stand-in there: zeros in, nothing out. */
  bool device;
  void *const *ready; /* device: n events the runtime stream waits for first, or NULL entries */
  void *const *done;  /* device: n events recorded when the results are written, or NULL */
  bool wait;          /* device: return only when the GPU has finished */
};

/* GPU memory: NCCL, or staged through the host algorithms (comm/gpu). */
struct hora__coll_backend {
  const char *name;
  int (*run_device)(hora__comm *comm, const struct hora__coll_op *op);
};
extern const struct hora__coll_backend hora__coll_gpu;

/* ---- the registry of host algorithms (select.c) ---------------------------
 * Every algorithm of every kind, each with when it can run on a
 * communicator, what the cost model predicts for it and how to run it. The
 * selector takes, per operation, the one forced by HORA_ALGORITHM_<KIND>
 * or else the cheapest usable one. It decides only from what every member
 * sees alike (the communicator's shape, the agreed cost model, the
 * operation's size), so every rank runs the same algorithm. */
typedef int hora__allreduce_fn(hora__comm *comm, const struct hora__iov *in, int nin,
                               const struct hora__iov *out, int nout, size_t count,
                               hora_dtype dtype, hora_op op, hora_dtype wire,
                               const struct hora__coll_opts *opts);
typedef int hora__broadcast_fn(hora__comm *comm, const struct hora__iov *buf, int nbuf,
                               size_t bytes, int root, const struct hora__coll_opts *opts);
typedef int hora__allgather_fn(hora__comm *comm, const void *sendbuf, size_t bytes,
                               void *recvbuf);

/* What the choice depends on: a communicator's shape, real or projected
 * (hora-info --model). */
struct hora__layout {
  int size, hosts;   /* ranks; hosts, each with size / hosts ranks */
  bool shm_host;     /* one host sharing a segment */
  bool hierarchical; /* several, sharing one within each */
  size_t chunk;      /* the ring's pipeline chunk */
};
void hora__comm_layout(const hora__comm *comm, struct hora__layout *s);
/* The layout of one member per host of s: what runs across hosts. */
void hora__cross_layout(const struct hora__layout *s, struct hora__layout *x);

struct hora__algo {
  const char *name;
  enum hora__coll_kind kind;
  const char *summary; /* one line, for hora-info --algorithms */
  bool (*usable)(const struct hora__layout *s);
  /* Predicted seconds for an operation of `bytes` (allgather: each
   * rank's block; the others: the whole buffer). */
  double (*cost)(const struct hora__cost_model *m, const struct hora__layout *s, size_t bytes);
  bool lockstep; /* each step waits for the whole of the one before */
  hora__allreduce_fn *allreduce;
  hora__broadcast_fn *broadcast;
  hora__allgather_fn *allgather;
  /* reducescatter: how it runs (select.c). */
  enum hora__scatter {
    HORA_SCATTER_ALLREDUCE, /* the selected allreduce, of which each rank keeps its block */
    HORA_SCATTER_RING,      /* the ring's reduce-scatter */
    HORA_SCATTER_HALVING    /* recursive halving */
  } scatter;
};

/* Every registered algorithm, and their number. */
extern const struct hora__algo *const hora__algos[];
extern const int hora__nalgos;
/* The algorithm named `name` for kind, or NULL. */
const struct hora__algo *hora__algo_find(enum hora__coll_kind kind, const char *name);
/* A lockstep algorithm must be priced this much under the ring to be
 * taken. In Rabenseifner, recursive doubling or halving, Bruck and the
 * binomial tree each step waits for the whole of the one before, so a
 * late rank holds up its partner and, a step on, the partner's partner;
 * the ring's chunks pass that skew on one chunk at a time. The model
 * prices no skew: on 16 fake hosts at 16 and 64 MiB it had Rabenseifner
 * 0.7% under the ring, which ran 12-14% faster (docs/benchmarks.md). */
#define HORA_RING_MARGIN 0.05

/* The cheapest usable algorithm for an operation of `bytes` by the model,
 * but the ring within HORA_RING_MARGIN of a lockstep one. */
const struct hora__algo *hora__algo_pick(const struct hora__layout *s,
                                         const struct hora__cost_model *m,
                                         enum hora__coll_kind kind, size_t bytes);
/* The hierarchical algorithms' step across hosts, among the members with
 * this rank's local rank (one per host), for `bytes` (allreduce: a slice;
 * broadcast: the buffer; allgather: one block): the cheapest flat
 * algorithm of kind by the model over hosts members, the allreduce's and
 * the allgather's L groups sharing each host's link, and (cost: may be
 * NULL) its predicted seconds. */
const struct hora__algo *hora__cross_pick(const struct hora__layout *s,
                                          const struct hora__cost_model *m,
                                          enum hora__coll_kind kind, size_t bytes, double *cost);
const struct hora__algo *hora__cross_algorithm(const hora__comm *comm, enum hora__coll_kind kind,
                                               size_t bytes);
/* Run it, over that group: buf (count elements, in place) = op over it. */
int hora__cross_allreduce(hora__comm *comm, void *buf, size_t count, hora_dtype dtype,
                          hora_op op, hora_dtype wire);
/* buf (bytes) = that of the member on host root_host. */
int hora__cross_broadcast(hora__comm *comm, void *buf, size_t bytes, int root_host);
/* The member on host h's block of bytes lands at recvbuf + at[h]
 * (sendbuf: this rank's; it may lie there already). */
int hora__cross_allgather(hora__comm *comm, const void *sendbuf, size_t bytes, void *recvbuf,
                          const size_t *at);
/* What runs an operation of `bytes` of kind on comm: the forced one, or
 * the pick. */
const struct hora__algo *hora__algo_select(const hora__comm *comm, enum hora__coll_kind kind,
                                           size_t bytes);
/* The kind's name as in HORA_ALGORITHM_<KIND> (lower case). */
const char *hora__algo_kind_name(enum hora__coll_kind kind);

/* The communicator's algorithm table: where shared memory serves (shm: the
 * members of each host share a segment; hierarchical: several hosts with
 * the same number of members each), and the forced choices. Fails on a
 * forced algorithm that is unknown. */
int hora__coll_choose(hora__comm *comm, bool shm, bool hierarchical);

/* ---- the alpha-beta-gamma cost model (cost_model.c; struct in comm.h) --- */
/* This process's model for comm's links: rank 0's HORA_COST_MODEL if set
 * (other ranks take rank 0's model), else the built-in constants of the
 * transport comm uses between hosts (or between its ranks, on one host
 * without shared memory). *calibrate: HORA_COST_MODEL=calibrate (or unset,
 * across hosts), so hora__cost_calibrate is to measure the link's
 * constants, unless this process already has them (hora__cost_remember). */
int hora__cost_model_init(const hora__comm *comm, struct hora__cost_model *m, bool *calibrate);
/* Keeps a calibrated model, which every rank of comm received, for the
 * communicators this process makes later (process sets, a rebuilt world)
 * that also span hosts, or also do not: they reuse it instead of measuring
 * the same links again. */
void hora__cost_remember(const hora__comm *comm, const struct hora__cost_model *m);
/* Measures the link's constants, collectively over comm: rank 0 and its
 * partner (the first rank on another host, else rank 1) ping-pong over
 * their data connection (made here if missing) for alpha and beta, and
 * rank 0 times the float32 sum for gamma. Rank 0's m->link gets the
 * results (m->local stays as it is, so that a file of the link's
 * constants gives the same model); the other ranks' m is left for rank
 * 0's to be broadcast. A fraction of a second. */
int hora__cost_calibrate(hora__comm *comm, struct hora__cost_model *m);
/* The built-in constants for transport "tcp", "unix" or "ib". */
int hora__cost_builtin(const char *transport, struct hora__cost_model *m);
/* HORA_COST_MODEL's forms into c: "alpha_us,beta_ns_per_byte,gamma_ns_per_byte",
 * "file:PATH" (those numbers read from PATH) or, where calibrate is not
 * NULL, "calibrate" (*calibrate set, c left as it is). */
int hora__cost_parse(const char *text, struct hora__cost *c, bool *calibrate);
/* c as HORA_COST_MODEL's numbers, "alpha_us,beta_ns,gamma_ns" (4 digits). */
void hora__cost_format(const struct hora__cost *c, char *out, size_t n);
/* Writes c to path as file: reads it, under a comment line. */
int hora__cost_save(const char *path, const struct hora__cost *c, const char *comment);
/* A whole operation's predicted seconds, as the runtime runs a cached one
 * of `bytes` by algorithm a: the runtime's cost per operation, the
 * negotiation cycle (a recursive doubling of a few bytes, with the data
 * where the operation is eager: then no algorithm runs after it), and the
 * algorithm's. */
double hora__operation_cost(const struct hora__cost_model *m, const struct hora__layout *s,
                            const struct hora__algo *a, size_t bytes, bool eager);
/* Whether a cached operation of `bytes` (an allgather's: each rank's block)
 * of host memory (no compression, Adasum or group) travels in the
 * negotiation cycle (HORA_EAGER_THRESHOLD), and if so what it adds to the
 * cycle (*carried, may be NULL): an allgather's whole result, the others'
 * whole input. Alltoalls and the v forms never do. */
bool hora__eager(enum hora__coll_kind kind, size_t bytes, int size, size_t *carried);
/* Each algorithm's predicted seconds (the registry's cost functions). */
#define HORA_COST_FN(ident)                                                                  \
  double hora__cost_##ident(const struct hora__cost_model *m, const struct hora__layout *s,   \
                            size_t bytes)
HORA_COST_FN(allreduce_shm);
HORA_COST_FN(allreduce_hierarchical);
HORA_COST_FN(allreduce_ring);
HORA_COST_FN(allreduce_rd);
HORA_COST_FN(allreduce_rabenseifner);
HORA_COST_FN(allreduce_tree);
HORA_COST_FN(broadcast_shm);
HORA_COST_FN(broadcast_hierarchical);
HORA_COST_FN(broadcast_ring);
HORA_COST_FN(broadcast_binomial);
HORA_COST_FN(broadcast_scatter_allgather);
HORA_COST_FN(allgather_shm);
HORA_COST_FN(allgather_hierarchical);
HORA_COST_FN(allgather_ring);
HORA_COST_FN(allgather_bruck);
HORA_COST_FN(reducescatter_ring);
HORA_COST_FN(reducescatter_allreduce);
HORA_COST_FN(reducescatter_halving);

/* ---- point-to-point schedules (recursive.c) --------------------------------
 * The algorithms that talk to partners other than the ring neighbours:
 * recursive doubling and Rabenseifner's allreduce, the binomial and the
 * scatter + allgather broadcasts, Bruck's allgather and the recursive
 * halving reduce-scatter. Their partners (r +- 2^k, r ^ 2^k, the fold r +-
 * p2) get data connections at the first use, collectively. */
int hora__comm_connect_partners(hora__comm *comm);
/* The partners of `pos` among `size`: at most 3 * 32 ranks into out,
 * returns how many. */
int hora__coll_partners(int pos, int size, int *out);
/* An allreduce of count elements from src (every rank's) into dst (src
 * or a buffer of its own). */
typedef int hora__contiguous_allreduce_fn(hora__comm *comm, const void *src, void *dst,
                                          size_t count, hora_dtype dtype, hora_op op,
                                          hora_dtype wire);
hora__contiguous_allreduce_fn hora__rd_allreduce, hora__rabenseifner_allreduce,
    hora__world_ring_allreduce, hora__tree_allreduce;
/* A broadcast of one contiguous buffer. */
typedef int hora__contiguous_broadcast_fn(hora__comm *comm, void *buf, size_t bytes, int root);
hora__contiguous_broadcast_fn hora__binomial_broadcast, hora__world_ring_broadcast,
    hora__scatter_allgather_broadcast;
/* A broadcast over an iov list by fn (several fused through the fusion
 * buffer). */
int hora__broadcast_contiguous(hora__comm *comm, hora__contiguous_broadcast_fn *fn,
                               const struct hora__iov *buf, int nbuf, size_t bytes, int root,
                               const struct hora__coll_opts *opts);
int hora__bruck_allgather(hora__comm *comm, const void *sendbuf, size_t bytes, void *recvbuf);
/* recvbuf = this rank's block of the reduction of every rank's sendbuf
 * (recursive halving); rank j's block is lens[j] elements at starts[j]
 * (the same arrays on every rank: blocks anywhere, in any order, not
 * overlapping). prescale multiplies this rank's input first. recvbuf may
 * be sendbuf. */
int hora__halving_reducescatter(hora__comm *comm, const void *sendbuf, void *recvbuf,
                                const size_t *starts, const size_t *lens, double prescale,
                                hora_dtype dtype, hora_op op, hora_dtype wire);
/* The double binary tree (tree.c): tree 0 is NCCL's binary tree over
 * positions 0..size-1 (position v with lowest set bit 2^b has children v
 * - 2^(b-1) and v + 2^(b-1), or nearer where that is past the end; 0 is
 * the root, with one child), tree 1 the same mirrored (even sizes) or
 * shifted by one (odd), so that a position inner in one tree is a leaf of
 * the other (all but at most one). Every link joins positions a power of
 * two apart (mod size), among hora__coll_partners. -1: none. */
void hora__tree_links(int size, int pos, int tree, int *parent, int child[2]);
/* The tree's pipeline chunk for an allreduce of `bytes` over size ranks:
 * the one the cost model's link makes fastest, between 4 KiB and `most`
 * (HORA_CHUNK_SIZE; `most` where the model has no link constants). */
size_t hora__tree_chunk(const struct hora__cost *link, int size, size_t bytes, size_t most);
/* The chain broadcast's pipeline chunk on layout s: the one the model
 * makes fastest for `bytes`, between 4 KiB and s->chunk (HORA_CHUNK_SIZE). */
size_t hora__chain_chunk(const struct hora__cost_model *m, const struct hora__layout *s,
                         size_t bytes);
/* buf (count elements, in place) = op over the group: every member, or
 * (cross) the members with this rank's local rank, one per host. */
int hora__tree_run(hora__comm *comm, bool cross, void *buf, size_t count, hora_dtype dtype,
                   hora_op op, hora_dtype wire);
/* An allreduce over iov lists by fn: one tensor between the caller's
 * buffers, several fused through the fusion buffer, with opts' scales
 * and phases. */
int hora__allreduce_contiguous(hora__comm *comm, hora__contiguous_allreduce_fn *fn,
                               const struct hora__iov *in, int nin, const struct hora__iov *out,
                               int nout, size_t count, hora_dtype dtype, hora_op op,
                               hora_dtype wire, const struct hora__coll_opts *opts);

/* Runs op with the backend the table chose for it on comm. */
int hora__coll_run(hora__comm *comm, const struct hora__coll_op *op);

/* The host collectives, through comm's backends. */
int hora__allreduce(hora__comm *comm, const struct hora__iov *in, int nin,
                    const struct hora__iov *out, int nout, size_t count, hora_dtype dtype,
                    hora_op op, hora_dtype wire, const struct hora__coll_opts *opts);

/* buf (a list) on every rank = buf on root. */
int hora__broadcast(hora__comm *comm, const struct hora__iov *buf, int nbuf, size_t bytes,
                    int root, const struct hora__coll_opts *opts);

/* recvbuf[r * bytes ..] = rank r's sendbuf. */
int hora__allgather(hora__comm *comm, const void *sendbuf, size_t bytes, void *recvbuf);

/* recvbuf = block `rank` (hora__block_range) of the reduction of every
 * rank's count elements of sendbuf, with opts' scales as an allreduce. */
int hora__reducescatter(hora__comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                        size_t unit, hora_dtype dtype, hora_op op, hora_dtype wire,
                        const struct hora__coll_opts *opts);
/* The same, each rank's block given (start, len elements; split by explicit
 * counts): the allreduce of which each rank keeps its block, or the
 * recursive halving after an allgather of every rank's (start, len). */
int hora__reducescatter_at(hora__comm *comm, const void *sendbuf, void *recvbuf, size_t count,
                           size_t start, size_t len, hora_dtype dtype, hora_op op,
                           hora_dtype wire, const struct hora__coll_opts *opts);

/* The ring allgather of blocks of bytes[q] bytes at at[q] of recvbuf
 * (sendbuf: this rank's), q a position on ring (the world's, or the
 * members with this local rank across hosts); exchange.c. */
int hora__ring_allgatherv(hora__comm *comm, const struct hora__ring_view *ring, const void *sendbuf,
                          const size_t *bytes, void *recvbuf, const size_t *at);
/* recvbuf = every rank's block in rank order, rank r's of bytes[r] bytes
 * (every rank passes the same bytes[]); exchange.c. */
int hora__allgatherv(hora__comm *comm, const void *sendbuf, const size_t *bytes, void *recvbuf,
                     bool published);
/* Rank r's block for rank j (send_bytes[j] bytes, blocks in rank order in
 * sendbuf) lands in j's recvbuf, blocks in rank order there too. `most`
 * is the largest block between any two ranks, the same on every rank.
 * sendbuf and recvbuf may overlap (in place: then sent from a copy).
 * `published`: hora__exchange_records published sendbuf and its blocks
 * (they must not overlap recvbuf then). */
int hora__alltoall(hora__comm *comm, const void *sendbuf, const size_t *send_bytes,
                   void *recvbuf, const size_t *recv_bytes, size_t most, bool published);
/* Every member's record of an exchange (width words each) into all
 * ([size * width]). On one host with the kernel's copies, it also
 * publishes where this rank's blocks lie in sendbuf (offsets[j]: its block
 * for rank j, or NULL: one block at 0), *published true, and the exchange
 * that follows at once with `published` saves a barrier. */
int hora__exchange_records(hora__comm *comm, const uint64_t *record, size_t width, uint64_t *all,
                           const void *sendbuf, const size_t *offsets, bool *published);

/* Sends send_len bytes to `to` while receiving recv_len bytes from `from`
 * (the same connection or not), pipelined in chunks; either may be 0. */
int hora__exchange_step(hora__comm *comm, hora__conn *to, const void *send, size_t send_len,
                        hora__conn *from, void *recv, size_t recv_len);
/* Returns once every member has reached this point of its collectives
 * (a one-byte ring allgather): before a connection plan, which an idle
 * rank would refuse. */
int hora__comm_all_arrived(hora__comm *comm);
/* hora__comm_connect_peers, first making sure every member has reached
 * the operation (a collective over comm's existing connections). */
int hora__comm_connect_peers_agreed(hora__comm *comm);

/* buf (count elements of a float dtype) = the Adasum of every rank's buf
 * (adasum.c); hierarchical (HORA_HIERARCHICAL_ADASUM=1, or auto and device
 * buffers), where the allreduce is hierarchical, the Adasum of each host's
 * sum divided by the ranks per host, as Horovod's GPU Adasum. */
int hora__adasum(hora__comm *comm, void *buf, size_t count, hora_dtype dtype, bool device);
/* Whether HORA_HIERARCHICAL_ADASUM (setting) asks for the hierarchical
 * Adasum on these buffers: 1, or auto on device buffers. */
bool hora__adasum_wants_hosts(const char *setting, bool device);

/* ---- rings ---------------------------------------------------------------- */


int hora__ring_allreduce(hora__comm *comm, const struct hora__ring_view *ring, const void *sendbuf,
                         void *recvbuf, size_t count, hora_dtype dtype, hora_op op,
                         hora_dtype wire);
/* The reduce-scatter half of the ring: afterwards scratch (count elements;
 * may be sendbuf) holds at rank r the complete reduction of block r, at the
 * place hora__block_range gives; the rest of scratch is partial sums. */
int hora__ring_reducescatter(hora__comm *comm, const struct hora__ring_view *ring,
                             const void *sendbuf, void *scratch, size_t count, size_t unit,
                             hora_dtype dtype, hora_op op, hora_dtype wire);
/* Block r of count elements split among size ranks in whole units of
 * `unit` elements, the first (count / unit) % size blocks one unit larger
 * (Horovod's reducescatter split). */
void hora__block_range(size_t count, size_t unit, int size, int r, size_t *start, size_t *len);
/* The chain from root_pos along ring, in chunks of `chunk` bytes. */
int hora__ring_broadcast(hora__comm *comm, const struct hora__ring_view *ring, void *buf,
                         size_t bytes, int root_pos, size_t chunk);
int hora__ring_allgather(hora__comm *comm, const struct hora__ring_view *ring, const void *sendbuf,
                         size_t bytes, void *recvbuf);

/* ---- direct shared-memory collectives (shm_coll.c, shm_single_copy.c) ----- */
/* Local rank j's slice [*a, *b) of n bytes or elements among L. */
static inline void hora__shm_slice(size_t n, int L, int j, size_t *a, size_t *b) {
  *a = n * (size_t)j / (size_t)L;
  *b = n * (size_t)(j + 1) / (size_t)L;
}

int hora__shm_allreduce(hora__comm *comm, const struct hora__iov *in, int nin,
                        const struct hora__iov *out, int nout, size_t count, hora_dtype dtype,
                        hora_op op, hora_dtype wire, const struct hora__coll_opts *opts);
/* buf (in place) = op over the ranks of this host only, whatever the
 * communicator spans. */
int hora__shm_allreduce_local(hora__comm *comm, void *buf, size_t count, hora_dtype dtype,
                              hora_op op);
int hora__shm_broadcast(hora__comm *comm, const struct hora__iov *buf, int nbuf, size_t bytes,
                        int root_local);
int hora__shm_allgather(hora__comm *comm, const void *sendbuf, size_t bytes, void *recvbuf);
/* The hierarchical broadcast: the root's buffer to the member with the
 * root's local rank on every host (hora__cross_broadcast), then through
 * each host's segment. */
int hora__hierarchical_broadcast(hora__comm *comm, const struct hora__iov *buf, int nbuf,
                                 size_t bytes, int root, const struct hora__coll_opts *opts);
/* The hierarchical allgather: each local rank's block across hosts among
 * the members with its local rank (hora__cross_allgather), then the
 * columns of blocks gathered through each host's segment. */
int hora__hierarchical_allgather(hora__comm *comm, const void *sendbuf, size_t bytes,
                                 void *recvbuf);
/* Single-copy allreduce (process_vm_readv), for large operations on one
 * host; in and out list the same tensors. */
bool hora__shm_single_copy_fits(hora__comm *comm, int n, size_t bytes);
int hora__shm_allreduce_single_copy(hora__comm *comm, const struct hora__iov *in,
                                    const struct hora__iov *out, int n, size_t count,
                                    hora_dtype dtype, hora_op op,
                                    const struct hora__coll_opts *opts);

/* Tests only (tests/mpi/test_shm_forge.c): when set, runs on this rank's
 * record in the host segment just before the barrier that publishes it:
 * the single-copy allreduce's block references (refs: inputs, then
 * outputs) or an exchange's block offsets (one per local rank), so that a
 * test can play a peer that publishes bad ones. */
struct hora__mem_ref;
typedef void hora__shm_forge_fn(struct hora__mem_ref *refs, int nrefs, uint64_t *offsets,
                                int noffsets);
extern hora__shm_forge_fn *_Atomic hora__shm_forge;

/* One host: every rank reads its blocks out of the peers' sendbufs with
 * the kernel (block for local rank t at offsets[t] of each sendbuf, or 0
 * with offsets NULL; recv_bytes[j] from rank j land at at[j]). *done is
 * false, and nothing moved, where the ranks did not all choose the kernel
 * for blocks of `most` bytes (the same answer on every rank). `published`:
 * hora__shm_publish_blocks has just published sendbuf and offsets (nothing
 * used the segment since), so the read needs one barrier instead of two. */
int hora__shm_read_blocks(hora__comm *comm, const void *sendbuf, const size_t *offsets,
                          void *recvbuf, const size_t *recv_bytes, const size_t *at, size_t most,
                          bool published, bool *done);
/* One host: every rank's record (width words) into all ([size * width]),
 * and where its sendbuf and blocks lie (as for hora__shm_read_blocks), in
 * one barrier. *published false (nothing done) where the kernel cannot
 * read the peers or the records do not fit the segment. */
int hora__shm_publish_blocks(hora__comm *comm, const void *sendbuf, const size_t *offsets,
                             const uint64_t *record, size_t width, uint64_t *all,
                             bool *published);

/* ---- the ring pipeline engine (ring.c) -----------------------------------
 * A sequence of sends to the next rank and receives from the previous one,
 * both indexed 0..n-1, moved in chunks with a window of transfers in
 * flight. Send i may depend on receive i - dep_lag having completed. */
struct hora__ring {
  hora__conn *next, *prev;
  size_t nsend, nrecv;
  bool send_depends; /* send i waits for receive i - dep_lag */
  size_t dep_lag;
  void *arg;
  /* Where send i reads from; *scratch asks for a staging buffer, which
   * fill_send then fills. */
  void (*send_at)(void *arg, size_t i, const void **ptr, size_t *len, bool *scratch);
  void (*fill_send)(void *arg, size_t i, void *staging);
  /* Where receive i lands; *scratch asks for a staging buffer instead. */
  void (*recv_at)(void *arg, size_t i, void **ptr, size_t *len, bool *scratch);
  /* Called in order when receive i is complete; `staged` is the staging
   * buffer it landed in, or NULL. */
  void (*received)(void *arg, size_t i, void *staged);
};

int hora__ring_run(hora__comm *comm, const struct hora__ring *ring);

/* ---- point-to-point schedules over several peers (ring.c) -----------------
 * What hora__ring_run cannot express: sends and receives with several
 * peers at once (a tree's parent and children), and local steps (a
 * reduction) between them. Each operation belongs to a lane: one
 * direction of one connection, whose transfers go in the lane's order
 * with a window of them in flight, or a local lane, whose steps run in
 * order. An operation starts only once the operations it names in
 * `after` are done (a receive then lands, a send leaves, a step runs).
 * Every rank lists its operations in one order the whole job agrees on:
 * each dependency earlier, and a message at the same place among its
 * lane's operations at both ends; then the schedule cannot deadlock. */
#define HORA_SCHED_DEPS 2
#define HORA_SCHED_LANES 16
struct hora__sched_lane {
  hora__conn *conn; /* NULL: a local lane */
  bool send;
};
struct hora__sched_op {
  int lane;
  void *buf; /* what moves (a local step: the caller's meaning, as len's) */
  size_t len;
  long after[HORA_SCHED_DEPS]; /* indexes of earlier operations, or -1 */
};
struct hora__sched {
  const struct hora__sched_lane *lanes;
  int nlanes;
  const struct hora__sched_op *ops;
  size_t nops;
  void *arg;
  void (*local)(void *arg, const struct hora__sched_op *op); /* runs a local step */
};
int hora__sched_run(hora__comm *comm, const struct hora__sched *s);

#endif
