/* hora: a data-parallel training runtime.
 *
 * The one public header. It declares the contract of API.md exactly; later
 * additions are appended after it and never change what is already here.
 * Usable from C99 and C++, and includes neither mpi.h nor any CUDA header.
 */
#ifndef HORA_H
#define HORA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && defined(HORA_BUILDING)
#define HORA_EXTERN __attribute__((visibility("default")))
#else
#define HORA_EXTERN
#endif

#define HORA_VERSION_MAJOR 0
#define HORA_VERSION_MINOR 1
#define HORA_VERSION_PATCH 0

/* ---- Results -------------------------------------------------------------
 * One table generates the enum, hora_strerror() and the code names, so the
 * three can never disagree. The order is part of the ABI.
 */
#define HORA_RESULT_MAP(X)                                                          \
  X(SUCCESS, "success")                                                             \
  X(ERR_INVALID_ARG, "invalid argument")                                            \
  X(ERR_INVALID_USAGE, "invalid usage")                                             \
  X(ERR_MISMATCH, "ranks disagree about an operation")                              \
  X(ERR_NO_MEMORY, "out of memory")                                                 \
  X(ERR_SYSTEM, "a system, MPI, verbs, CUDA or NCCL call failed")                   \
  X(ERR_PEER_LOST, "a peer process died or its connection broke")                   \
  X(ERR_TIMEOUT, "an operation stalled past the shutdown time")                     \
  X(ERR_ABORTED, "the runtime was shut down by a fatal error or hora_abort")        \
  X(ERR_NOT_SUPPORTED, "not supported by this build or configuration")                \
  X(ERR_CORRUPT, "ranks hold different results (HORA_VERIFY)")                       \
  X(ERR_PROTOCOL, "a peer broke the wire protocol, or the ranks' caches diverged")

typedef enum hora_result {
#define HORA_RESULT_ENUM_(name, text) HORA_##name,
  HORA_RESULT_MAP(HORA_RESULT_ENUM_)
#undef HORA_RESULT_ENUM_
  HORA_RESULT_COUNT_
} hora_result;

/* A fixed, static string for a result code ("unknown result" if out of range). */
HORA_EXTERN const char *hora_strerror(int result);

/* The detailed message of the calling thread's most recent failed call: which
 * tensor, which ranks, which system call. Valid until this thread's next call
 * into hora; "" when there is none. */
HORA_EXTERN const char *hora_last_error(void);

/* ---- Types --------------------------------------------------------------- */

/* Element types. The values are ABI: new ones are only ever appended.
 * Integers: SUM and PRODUCT wrap around, AVERAGE divides rounding toward
 * zero, prescale/postscale round to nearest (halves away from zero).
 * HORA_BOOL is one byte per element; any nonzero byte is true and results
 * are 0 or 1: SUM and MAX are logical OR, MIN and PRODUCT logical AND.
 * AVERAGE, and a prescale or postscale other than 1.0, are refused for
 * bool (HORA_ERR_INVALID_ARG). Broadcast and allgather move bytes for
 * every type. */
typedef enum hora_dtype {
  HORA_UINT8,
  HORA_INT8,
  HORA_INT32,
  HORA_INT64,
  HORA_FLOAT16,
  HORA_BFLOAT16,
  HORA_FLOAT32,
  HORA_FLOAT64,
  HORA_INT16, /* int16_t */
  HORA_BOOL   /* one byte, 0 or nonzero */
} hora_dtype;

typedef enum hora_op {
  HORA_SUM,
  HORA_AVERAGE,
  HORA_MIN,
  HORA_MAX,
  HORA_PRODUCT,
  /* Added later: Adasum (float dtypes, allreduce only; see "Adasum" below). */
  HORA_ADASUM
} hora_op;

/* A pending operation. Created by an *_async call, owned by the caller, and
 * freed by hora_wait or by the hora_test that reports it done. */
typedef struct hora_request hora_request;

/* ---- Life cycle and ranks ------------------------------------------------ */

/* Starts the runtime. How the processes find each other depends on how
 * they were launched (HORA_BOOTSTRAP; `hora-info --bootstrap` says which):
 * under an MPI launcher, through MPI (initialised here when the program has
 * not, and then finalised in hora_finalize; otherwise on a duplicate of
 * MPI_COMM_WORLD, leaving the program's MPI alone); under torchrun's
 * variables, a Slurm job step or HORA_RENDEZVOUS, at a rendezvous rank 0
 * hosts, without MPI; with none of these, as a job of one process. Reads
 * every HORA_* setting, connects the data plane and starts the coordinator
 * thread. Collective over all processes of the job. A second call is
 * harmless. */
HORA_EXTERN int hora_init(void);

/* Stops the runtime. Blocks until every rank has called it (like
 * MPI_Finalize); pending requests complete or fail before it returns. */
HORA_EXTERN int hora_finalize(void);

/* 1 after a successful hora_init and before hora_finalize, else 0. */
HORA_EXTERN int hora_initialized(void);

/* How the running job started: "mpi", "tcp" (HORA_RENDEZVOUS), "env"
 * (torchrun's variables), "slurm" or "single"; NULL when not running. */
HORA_EXTERN const char *hora_bootstrap(void);

/* Fails every pending and later call on every rank with HORA_ERR_ABORTED;
 * `reason` (may be NULL) appears in their messages. Does not exit. */
HORA_EXTERN int hora_abort(const char *reason);

/* ---- Elastic training (HORA_ELASTIC=1) -----------------------------------
 * A job that loses processes goes on with the survivors, and admits
 * processes started later, with no driver process: the members agree on the
 * membership among themselves (the lowest surviving rank coordinates; a
 * majority of the previous membership must agree, so two survivors never
 * end in different memberships).
 *
 * hora_elastic_reset: after a call failed with HORA_ERR_PEER_LOST, or after
 * hora_elastic_commit reported a change, every member calls it. It returns
 * when the new membership's communicator is built: hora_rank and hora_size
 * give the new numbering (survivors keep their order, newcomers follow),
 * and process sets made before are invalid (their use fails with
 * HORA_ERR_INVALID_USAGE; make them again). Fails with HORA_ERR_PEER_LOST
 * when fewer than HORA_ELASTIC_MIN_SIZE ranks, or no majority, remain; with
 * HORA_ERR_INVALID_USAGE when the job is not elastic, nothing is to be
 * done (no failure and no change reported), or hora is not running (before
 * hora_init, after hora_finalize). Requests still held fail; the trainer
 * restores its last committed state and broadcasts it from rank 0. After a
 * reset that failed for good, hora_finalize ends what is left (this
 * process's listener, rank 0's rendezvous port; members waiting on it are
 * told at once) and returns HORA_SUCCESS.
 *
 * hora_elastic_commit: a commit point, collective (every rank, at the same
 * step). *changed becomes 1 on every rank when processes wait to join (then
 * call hora_elastic_reset), else 0. HORA_ERR_INVALID_USAGE when the job is
 * not elastic, hora is not running, or the last reset failed.
 *
 * A process started later with HORA_ELASTIC=1 and the job's rendezvous
 * address (and secret) joins in hora_init, which returns once it has been
 * admitted at a commit point; hora_elastic_joined() is then 1 (until
 * hora_finalize).
 *
 * hora_elastic_epoch: the membership's number (1 at start-up, one more at
 * each reset), -1 when not running. */
HORA_EXTERN int hora_elastic_reset(void);
HORA_EXTERN int hora_elastic_commit(int *changed);
HORA_EXTERN int hora_elastic_joined(void);
HORA_EXTERN int hora_elastic_epoch(void);

HORA_EXTERN int hora_rank(void);       /* global rank, or -1 before hora_init */
HORA_EXTERN int hora_size(void);       /* number of ranks, or -1 */
HORA_EXTERN int hora_local_rank(void); /* rank among the processes on this host */
HORA_EXTERN int hora_local_size(void);
HORA_EXTERN int hora_cross_rank(void); /* index of this host among the job's hosts */
HORA_EXTERN int hora_cross_size(void); /* number of hosts */

/* ---- Collectives ---------------------------------------------------------
 * Matched across ranks by name (at most 255 bytes), not by call order. A NULL
 * name means "the next unnamed operation": all ranks must then submit their
 * unnamed operations in the same order. Buffers stay the caller's and must
 * stay valid and untouched until the request completes. The async calls
 * return at once and may be called from any thread; errors found later are
 * returned by hora_wait/hora_test.
 */
HORA_EXTERN int hora_allreduce_async(const char *name, const void *sendbuf, void *recvbuf,
                                     size_t count, hora_dtype dtype, hora_op op,
                                     hora_request **req);
HORA_EXTERN int hora_broadcast_async(const char *name, void *buf, size_t count,
                                     hora_dtype dtype, int root, hora_request **req);
HORA_EXTERN int hora_allgather_async(const char *name, const void *sendbuf, size_t count,
                                     hora_dtype dtype, void *recvbuf, hora_request **req);

/* Blocks until *req completes, frees it and sets *req to NULL. Returns the
 * operation's result. */
HORA_EXTERN int hora_wait(hora_request **req);

/* Never blocks. Sets *done; when done, returns the operation's result, frees
 * the request and sets *req to NULL. */
HORA_EXTERN int hora_test(hora_request **req, int *done);

/* Blocking forms: submit, then wait. */
HORA_EXTERN int hora_allreduce(const char *name, const void *sendbuf, void *recvbuf,
                               size_t count, hora_dtype dtype, hora_op op);
HORA_EXTERN int hora_broadcast(const char *name, void *buf, size_t count, hora_dtype dtype,
                               int root);
HORA_EXTERN int hora_allgather(const char *name, const void *sendbuf, size_t count,
                               hora_dtype dtype, void *recvbuf);

/* Returns when every rank has called it. */
HORA_EXTERN int hora_barrier(void);

/* For a rank that has run out of data: blocks until every rank has joined,
 * taking part in the other ranks' allreduces with zeros meanwhile. Returns
 * the rank that joined last in *last_joined_rank (may be NULL).
 * (Added later: joined ranks also add zeros to reducescatters, zeros as
 * their blocks of allgathers, no elements to allgathervs and alltoalls, and
 * receive the others' broadcasts from a root that has not joined; only a
 * broadcast from a joined root fails, with HORA_ERR_INVALID_USAGE.) */
HORA_EXTERN int hora_join(int *last_joined_rank);

/* ---- Additions beyond API.md --------------------------------------------- */

/* Size in bytes of one element of `dtype`, or 0 for an unknown dtype. */
HORA_EXTERN size_t hora_dtype_size(hora_dtype dtype);

/* Short names: "float32", "sum"; "unknown" when out of range. */
HORA_EXTERN const char *hora_dtype_name(hora_dtype dtype);
HORA_EXTERN const char *hora_op_name(hora_op op);

/* ---- Host-shared memory ----------------------------------------------------
 * A block the other ranks of this host can map, like MPI_Alloc_mem or
 * ncclMemAlloc. Any buffer works with every call; an allreduce whose buffers
 * come from these blocks on every rank of a host reduces them with plain loads
 * and stores instead of copying them through the kernel, which is faster from
 * about 1 MiB up. The block is page-aligned and zeroed. Both calls work
 * before hora_init and after hora_finalize. A child made by fork() shares the
 * block with its parent instead of getting a copy. */
HORA_EXTERN int hora_mem_alloc(size_t bytes, void **ptr);
/* Frees a block from hora_mem_alloc (NULL is a no-op). Anything else is
 * HORA_ERR_INVALID_ARG. Not while an operation on the block is in flight. */
HORA_EXTERN int hora_mem_free(void *ptr);

/* "0.1.0" */
HORA_EXTERN const char *hora_version(void);

/* ---- Extended allreduce: per-operation options ----------------------------
 * The options struct can grow: callers set struct_size to the sizeof they
 * compiled against (HORA_ALLREDUCE_OPTIONS_INIT does), and hora reads only
 * the fields that size covers. All ranks must pass the same options for one
 * name (a difference is HORA_ERR_MISMATCH). Compressed and uncompressed
 * operations never share a fused buffer. Compression applies on the
 * network rings (between hosts); within a host, shared memory reduces the
 * full values. */
typedef enum hora_compression {
  HORA_COMPRESSION_DEFAULT = -1, /* take the HORA_COMPRESSION setting */
  HORA_COMPRESSION_NONE = 0,
  HORA_COMPRESSION_FP16 = 1, /* float32/float64 travel as IEEE half, reduced in their own type */
  HORA_COMPRESSION_BF16 = 2  /* float32/float64 travel as bfloat16, reduced in their own type */
} hora_compression;

typedef struct hora_allreduce_options {
  size_t struct_size; /* sizeof(hora_allreduce_options) */
  double prescale;    /* each rank's input is multiplied by this first (1.0: none) */
  double postscale;   /* the result is multiplied by this last, after AVERAGE's division */
  int compression;    /* a hora_compression; ignored for dtypes other than float32/float64 */
  /* The tensor's shape (added later; read only when struct_size covers
   * both fields): ndims -1 means none is given; else 0..HORA_MAX_DIMS, and
   * dims[] holds ndims sizes whose product is count. dims is read during
   * the call only. Ranks that give different shapes for one name, or a
   * shape and none, get HORA_ERR_MISMATCH naming both. */
  int ndims;
  const int64_t *dims;
  /* The process set that runs it (added later; see "Process sets" below):
   * NULL or hora_process_set_world() for every rank of the job. */
  const struct hora_process_set *process_set;
} hora_allreduce_options;

#define HORA_MAX_DIMS 32

#define HORA_ALLREDUCE_OPTIONS_INIT \
  { sizeof(hora_allreduce_options), 1.0, 1.0, HORA_COMPRESSION_DEFAULT, -1, NULL, NULL }

/* hora_allreduce_async with options; opts may be NULL (the defaults). */
HORA_EXTERN int hora_allreduce_async_ex(const char *name, const void *sendbuf, void *recvbuf,
                                        size_t count, hora_dtype dtype, hora_op op,
                                        const hora_allreduce_options *opts, hora_request **req);

/* ---- Parameter broadcast ---------------------------------------------------
 * A named buffer, for calls that take lists of them. */
typedef struct hora_tensor {
  const char *name;
  void *buf;
  size_t count;
  hora_dtype dtype;
} hora_tensor;

/* Broadcasts every buffer of the list from `root`, as one fused step where
 * the buffers fit the fusion buffer together. Blocks until all are done;
 * returns the first failure. Names follow the rules of the other calls. */
HORA_EXTERN int hora_broadcast_parameters(const hora_tensor *tensors, size_t n, int root);

/* ---- Statistics ------------------------------------------------------------
 * Counters of this process since hora_init, for trainers and benchmarks to
 * show where the time goes. Like the options, the struct can grow. */
typedef struct hora_stats {
  size_t struct_size;       /* sizeof(hora_stats) */
  uint64_t operations;      /* operations completed: allreduces + broadcasts + allgathers
                               (+ reducescatters + alltoalls) */
  uint64_t allreduces, broadcasts, allgathers;
  uint64_t bytes;           /* bytes of the callers' buffers those collectives covered */
  uint64_t fused_batches;   /* collectives that carried more than one tensor */
  uint64_t fused_tensors;   /* tensors that travelled in those */
  uint64_t cache_hits;      /* requests negotiated through the response cache */
  uint64_t cache_misses;    /* requests negotiated in full */
  double negotiate_seconds; /* summed over operations: from submission to the start of its run */
  double communicate_seconds; /* coordinator time spent in collectives */
  double copy_seconds;      /* coordinator time packing and unpacking fusion buffers */
  uint64_t direct_bytes;    /* allreduce bytes reduced straight between the host's
                               hora_mem_alloc blocks, with no copy through the kernel */
  uint64_t cycles;          /* negotiation cycles: allreduces of cache bits between the ranks */
  uint64_t sent_in_full;    /* requests negotiated through rank 0 (not in the cache, or
                               taken out of it) */
  uint64_t kernel_bytes;    /* allreduce bytes copied between the host's ranks by the
                               kernel (process_vm_readv/writev; HORA_SHM_SINGLE_COPY) */
  uint64_t staged_bytes;    /* allreduce bytes staged through the host's shared memory */
  uint64_t reducescatters;  /* reducescatters completed (added later; also in operations) */
  uint64_t alltoalls;       /* alltoalls completed (added later; also in operations;
                               allgathervs count among the allgathers) */
  /* Where an operation's time goes, stage by stage, summed over the
   * operations a caller waited for with hora_wait (staged_operations of
   * them; divide for the mean): in the submitting call; on the queue until
   * the coordinator takes it (waking it); negotiation (the cycle, or rank
   * 0's answer); the collective; until it is marked complete; and until
   * the waiting caller returns (waking it). */
  uint64_t staged_operations;
  double stage_submit_seconds, stage_handoff_seconds, stage_negotiate_seconds;
  double stage_run_seconds, stage_complete_seconds, stage_wake_seconds;
  uint64_t eager_allreduces; /* allreduces whose data travelled with the negotiation cycle
                                that scheduled them (HORA_EAGER_THRESHOLD; added later) */
  uint64_t bus_bytes; /* what the collectives moved on the busiest link (hora_step_stats'
                         bus_bytes; added later): divided by communicate_seconds, the bus
                         bandwidth of nccl-tests */
  uint64_t eager_collectives; /* broadcasts, allgathers and reducescatters whose data
                                 travelled with their negotiation cycle (added later;
                                 the allreduces are eager_allreduces) */
} hora_stats;

/* Fills *stats (set stats->struct_size first). Callable from any thread. */
HORA_EXTERN int hora_get_stats(hora_stats *stats);

/* ---- Steps -------------------------------------------------------------------
 * A trainer calls hora_step_mark() once per iteration (hora.torch's
 * DistributedOptimizer.step() calls it by itself): each call ends a step
 * and starts the next; the first only starts one. Within a step, the time
 * in which some thread of this process waited in hora_wait (hora.torch's
 * synchronize) is its exposed communication; the rest is compute. With
 * HORA_TIMELINE, rank 0 writes an instant event STEP per step. Callable
 * from any thread after hora_init. */
HORA_EXTERN int hora_step_mark(void);

typedef struct hora_step_stats {
  size_t struct_size;     /* sizeof(hora_step_stats) */
  uint64_t steps;         /* steps ended since hora_init */
  double seconds;         /* their wall time, summed */
  double wait_seconds;    /* of which waiting in hora_wait: exposed communication */
  double compute_seconds; /* the rest (seconds - wait_seconds) */
  uint64_t bytes;         /* bytes of the collectives completed within them (hora_stats' bytes) */
  double communicate_seconds; /* coordinator time in those collectives */
  double bus_bytes;       /* what those collectives moved on the busiest link, as in
                             nccl-tests: allreduce 2(p-1)/p x bytes, allgather (p-1) x the
                             rank's block, reducescatter and alltoall (p-1)/p, broadcast 1x */
  /* The last step alone. */
  double last_seconds, last_wait_seconds, last_compute_seconds;
  uint64_t last_bytes;
  double last_bus_bandwidth; /* bus bytes per second of collective time (0: none ran) */
} hora_step_stats;

/* Fills *stats (set stats->struct_size first). Callable from any thread. */
HORA_EXTERN int hora_get_step_stats(hora_step_stats *stats);

/* ---- Build information ------------------------------------------------------
 * 1 when this library was built with `feature`: "mpi", "cuda", "nccl" or
 * "verbs"; 0 otherwise (and for unknown names). Callable at any time. */
HORA_EXTERN int hora_built(const char *feature);

/* 1 when MPI runs with MPI_THREAD_MULTIPLE (what hora_init asks for when it
 * starts MPI itself), 0 otherwise or when MPI is not running. */
HORA_EXTERN int hora_mpi_threads_supported(void);

/* ---- Shapes of broadcast and allgather ---------------------------------------
 * Options of broadcast and allgather; grows like hora_allreduce_options.
 * A shape is checked like an allreduce's: HORA_ERR_INVALID_ARG at
 * submission when it does not hold count elements, HORA_ERR_MISMATCH on
 * every rank when ranks disagree. A broadcast compares the whole shape; an
 * allgather every dimension but the first (each rank's own rows). */
typedef struct hora_op_options {
  size_t struct_size; /* sizeof(hora_op_options) */
  int ndims;          /* -1: no shape; else dims[0] * ... * dims[ndims-1] == count
                         (for allgather: this rank's input) */
  const int64_t *dims;
  /* The process set that runs it (added later; see "Process sets" below):
   * NULL or hora_process_set_world() for every rank of the job. */
  const struct hora_process_set *process_set;
} hora_op_options;

#define HORA_OP_OPTIONS_INIT { sizeof(hora_op_options), -1, NULL, NULL }

/* hora_broadcast_async / hora_allgather_async with options; opts may be NULL. */
HORA_EXTERN int hora_broadcast_async_ex(const char *name, void *buf, size_t count,
                                        hora_dtype dtype, int root, const hora_op_options *opts,
                                        hora_request **req);
HORA_EXTERN int hora_allgather_async_ex(const char *name, const void *sendbuf, size_t count,
                                        hora_dtype dtype, void *recvbuf,
                                        const hora_op_options *opts, hora_request **req);

/* ---- Timeline at run time ----------------------------------------------------
 * Starts writing the timeline (the HORA_TIMELINE trace) to `path`; with
 * mark_cycles, an instant event CYCLE_START per negotiation cycle as well.
 * Only rank 0 writes it: on other ranks both calls check their arguments
 * and do nothing, so every rank may call them, as with Horovod. A timeline
 * already being written (from HORA_TIMELINE or an earlier call) is
 * finished first, and the new file replaces it. Stopping finishes the
 * file (it is valid JSON, the phases still open are ended) and is a no-op
 * when none is being written. Callable from any thread; before hora_init,
 * HORA_ERR_INVALID_USAGE. */
HORA_EXTERN int hora_start_timeline(const char *path, int mark_cycles);
HORA_EXTERN int hora_stop_timeline(void);

/* ---- Process sets ------------------------------------------------------------
 * A process set is a group of the job's ranks that runs collectives among
 * themselves, like Horovod's process sets or an MPI communicator. Every
 * collective takes one through its options struct (`process_set` in
 * hora_allreduce_options and hora_op_options; hora_barrier_ex and
 * hora_join_ex for the two calls that had none): NULL, or
 * hora_process_set_world(), is every rank of the job.
 *
 * Within a set, ranks are the set's own: 0 .. size-1 in the order of the
 * members' global ranks. A broadcast's root, an allgather's order and
 * hora_join_ex's last_joined_rank are set ranks; messages (mismatches,
 * stall warnings) name global ranks and the set's id.
 *
 * Each set negotiates on its own: names are matched within the set (the
 * same name in two sets is two operations), its first member coordinates
 * it, and it has its own response cache, fusion buffer, join and stall
 * inspector, so one set's stalled operation never holds up another's.
 * Each runs on a thread of its own with connections of its own, so the
 * operations of different sets a rank has in flight complete whatever the
 * order they were submitted in. A fatal error in any set (a lost peer)
 * fails every set of the job, the world too.
 *
 * Memory and descriptors per set and member: its fusion buffer
 * (HORA_FUSION_THRESHOLD, allocated on first use) and ring staging, a
 * shared-memory segment among its members on the host, one thread, two
 * listening sockets and its control and ring connections. */
typedef struct hora_process_set hora_process_set;

/* Makes the set of the n global ranks in `ranks` (any order, no
 * duplicates). Collective over every rank of the job, which must all pass
 * the same ranks (HORA_ERR_MISMATCH on every rank otherwise); sets are
 * numbered 1, 2, ... in the order they are made. A rank outside the set
 * gets a handle too: hora_process_set_included() says 0, and its
 * collectives fail with HORA_ERR_INVALID_USAGE. */
HORA_EXTERN int hora_process_set_create(const int *ranks, int n, hora_process_set **ps);

/* Frees a set: collective over every rank of the job, all passing the same
 * set. Its members first complete what is in flight on it. Other threads
 * should not submit to it meanwhile: an operation submitted then completes,
 * fails with HORA_ERR_ABORTED (its peers had stopped), or is refused with
 * HORA_ERR_INVALID_USAGE, as is every later use of the handle in a
 * collective. The world cannot be destroyed. Sets still alive at
 * hora_finalize are destroyed there. */
HORA_EXTERN int hora_process_set_destroy(hora_process_set *ps);

/* The job's world as a set (id 0). Valid while the runtime runs. */
HORA_EXTERN hora_process_set *hora_process_set_world(void);

/* The set's id (0: the world), its size, this rank's rank in it (-1 when not
 * a member), and whether this rank is a member; -1 for a NULL set. */
HORA_EXTERN int hora_process_set_id(const hora_process_set *ps);
HORA_EXTERN int hora_process_set_size(const hora_process_set *ps);
HORA_EXTERN int hora_process_set_rank(const hora_process_set *ps);
HORA_EXTERN int hora_process_set_included(const hora_process_set *ps);
/* Copies the members' global ranks, ascending, into ranks[0 .. n-1] (at
 * most n of them) and returns the set's size; -1 for a NULL set. */
HORA_EXTERN int hora_process_set_ranks(const hora_process_set *ps, int *ranks, int n);

/* hora_barrier and hora_join within opts->process_set (opts may be NULL:
 * the world). last_joined_rank is a rank of that set. */
HORA_EXTERN int hora_barrier_ex(const hora_op_options *opts);
HORA_EXTERN int hora_join_ex(const hora_op_options *opts, int *last_joined_rank);

/* hora_broadcast_parameters within opts->process_set (opts may be NULL;
 * its shape fields are ignored); root is a rank of that set. */
HORA_EXTERN int hora_broadcast_parameters_ex(const hora_tensor *tensors, size_t n, int root,
                                             const hora_op_options *opts);

/* ---- Reducescatter ------------------------------------------------------------
 * Reduces count elements of sendbuf over the ranks (of opts->process_set),
 * like an allreduce, and leaves each rank its block of the result, in rank
 * order: Horovod's split, where the first (rows % size) ranks get one row
 * more than the others. The rows are the shape's first dimension when
 * opts gives a shape (so every block is whole rows), else single elements.
 * recvbuf holds hora_reducescatter_block(count, rows, size, rank)
 * elements (rows 0: elements). Every op, prescale, postscale and
 * compression works as for allreduce; AVERAGE divides by the set's size.
 * A rank that has joined contributes zeros, as to an allreduce. Host or
 * device buffers. */
HORA_EXTERN int hora_reducescatter_async(const char *name, const void *sendbuf, void *recvbuf,
                                         size_t count, hora_dtype dtype, hora_op op,
                                         hora_request **req);
HORA_EXTERN int hora_reducescatter_async_ex(const char *name, const void *sendbuf,
                                            void *recvbuf, size_t count, hora_dtype dtype,
                                            hora_op op, const hora_allreduce_options *opts,
                                            hora_request **req);
HORA_EXTERN int hora_reducescatter(const char *name, const void *sendbuf, void *recvbuf,
                                   size_t count, hora_dtype dtype, hora_op op);
/* The v variant: rank j keeps recv_counts[j] elements (one count per rank
 * of the set; sendbuf holds their sum, and every rank must pass the same
 * counts: HORA_ERR_MISMATCH otherwise). It runs as an allreduce of which
 * each rank keeps its block, or by recursive halving after an allgather of
 * every rank's block (HORA_ALGORITHM_REDUCESCATTER=halving, or the cost
 * model's choice); a joined rank adds zeros and keeps nothing. */
HORA_EXTERN int hora_reducescatterv_async(const char *name, const void *sendbuf, void *recvbuf,
                                          const size_t *recv_counts, hora_dtype dtype, hora_op op,
                                          const hora_allreduce_options *opts,
                                          hora_request **req);
HORA_EXTERN int hora_reducescatterv(const char *name, const void *sendbuf, void *recvbuf,
                                    const size_t *recv_counts, hora_dtype dtype, hora_op op,
                                    const hora_allreduce_options *opts);
/* Elements of rank's block of a reducescatter of count elements in `rows`
 * rows (0: count single elements) over size ranks; 0 for arguments that
 * make no split (rank out of range, count not a multiple of rows). */
HORA_EXTERN size_t hora_reducescatter_block(size_t count, size_t rows, int size, int rank);

/* ---- Collective algorithms -------------------------------------------------
 * The host algorithm hora runs for a collective of `bytes` over every rank
 * of the job (kind "allreduce", "broadcast", "allgather" or
 * "reducescatter"; bytes: the whole buffer, for an allgather each rank's
 * block): "ring", "rd", "rabenseifner", "tree", "shm", "hierarchical", "binomial",
 * "scatter_allgather", "bruck", "halving", "allreduce" (hora-info
 * --algorithms), forced by
 * HORA_ALGORITHM_<KIND> or chosen by the cost model, and the model's
 * predicted seconds for its data movement (negotiation not included). *name
 * stays valid until hora_finalize. */
HORA_EXTERN int hora_collective_algorithm(const char *kind, size_t bytes, const char **name,
                                          double *predicted_seconds);
/* The cost model's prediction for a whole operation as the runtime runs a
 * cached one of `bytes` of host memory without compression: the runtime's
 * cost per operation (HORA_COST_MODEL's fourth number), the negotiation
 * cycle and the algorithm. *name: the algorithm, or "eager" for an
 * operation that travels inside the cycle (HORA_EAGER_THRESHOLD) and runs
 * none. Valid until hora_finalize. */
HORA_EXTERN int hora_predict_operation(const char *kind, size_t bytes, const char **name,
                                       double *predicted_seconds);

/* ---- Allgatherv and alltoall ---------------------------------------------------
 * Collectives whose counts differ by rank. Counts are elements, indexed by
 * rank within the set (opts->process_set), and blocks lie packed in rank
 * order. Each rank gives only its own counts: when the operation runs, the
 * ranks first exchange them (a small allgather of each rank's counts), so
 * they are not part of the negotiation, and counts that change every step
 * still hit the response cache.
 *
 * A caller that knows what it will receive passes recv_counts and a recvbuf
 * holding their sum. If they differ from what the others send, the
 * operation fails on every rank with HORA_ERR_MISMATCH naming the rank, and
 * nothing is written. A caller that does not know uses an _alloc form:
 * hora allocates the result once the counts are known and hands it over,
 * with the counts, in a hora_received when the request completes (the
 * counts-only query is then a free side effect). In place: an alltoall's
 * sendbuf may be its recvbuf (with the same counts both ways; it is then
 * sent from a copy), and an allgatherv's sendbuf may be this rank's block
 * of its recvbuf.
 *
 * With a shape in opts (dims[0] rows of this rank's sendbuf), every
 * dimension but the first must agree across ranks (HORA_ERR_MISMATCH) and
 * an alltoall's send counts must be whole rows.
 *
 * Join: while some ranks have joined, the others' allgathervs and alltoalls
 * run; a joined rank sends no elements and receives nothing (its counts in
 * the others' results are 0). Horovod refuses both once a rank has joined.
 * Host or device buffers; the _alloc forms return host memory and take
 * host buffers only (device: HORA_ERR_NOT_SUPPORTED). */
typedef struct hora_received {
  void *buf;      /* `total` elements; release with hora_received_free */
  size_t total;
  size_t *counts; /* [size]: elements received from each rank */
  int size;       /* ranks of the set */
} hora_received;

/* Frees what a completed _alloc operation handed over and zeroes *r; a
 * zeroed or NULL r is a no-op. */
HORA_EXTERN void hora_received_free(hora_received *r);

/* recvbuf = every rank's count elements of sendbuf, in rank order; rank r
 * sends recv_counts[r] of them. */
HORA_EXTERN int hora_allgatherv_async(const char *name, const void *sendbuf, size_t count,
                                      hora_dtype dtype, void *recvbuf, const size_t *recv_counts,
                                      const hora_op_options *opts, hora_request **req);
HORA_EXTERN int hora_allgatherv(const char *name, const void *sendbuf, size_t count,
                                hora_dtype dtype, void *recvbuf, const size_t *recv_counts,
                                const hora_op_options *opts);
/* The same, with the result allocated: *result is filled when the request
 * completes successfully (and zeroed otherwise). It must stay valid until then. */
HORA_EXTERN int hora_allgatherv_alloc_async(const char *name, const void *sendbuf, size_t count,
                                            hora_dtype dtype, hora_received *result,
                                            const hora_op_options *opts, hora_request **req);

/* Sends send_counts[j] elements of sendbuf (blocks in rank order) to each
 * rank j and receives recv_counts[j] elements from each into recvbuf. With
 * send_counts NULL, this rank sends each rank as many elements as it
 * receives from it (recv_counts), as in the equal split. */
HORA_EXTERN int hora_alltoall_async(const char *name, const void *sendbuf,
                                    const size_t *send_counts, void *recvbuf,
                                    const size_t *recv_counts, hora_dtype dtype,
                                    hora_request **req);
HORA_EXTERN int hora_alltoall(const char *name, const void *sendbuf, const size_t *send_counts,
                              void *recvbuf, const size_t *recv_counts, hora_dtype dtype);
/* With count (the elements of sendbuf) and options. send_counts NULL is the
 * equal split, count / size elements to every rank (count must divide);
 * recv_counts NULL with it expects the same from every rank. */
HORA_EXTERN int hora_alltoall_async_ex(const char *name, const void *sendbuf, size_t count,
                                       const size_t *send_counts, void *recvbuf,
                                       const size_t *recv_counts, hora_dtype dtype,
                                       const hora_op_options *opts, hora_request **req);
/* The same, with the result allocated as for hora_allgatherv_alloc_async. */
HORA_EXTERN int hora_alltoall_alloc_async(const char *name, const void *sendbuf, size_t count,
                                          const size_t *send_counts, hora_dtype dtype,
                                          hora_received *result, const hora_op_options *opts,
                                          hora_request **req);

/* ---- Grouped operations ----------------------------------------------------------
 * The collectives this thread submits between hora_group_start and
 * hora_group_end (like NCCL's group calls; they nest) are one unit: rank 0
 * runs none of them before all of them are ready on every rank, then sends
 * them at once, without waiting for the cycle, fused where they are
 * compatible and fit the fusion buffer. Every rank must group the same
 * operations (matched by name, in any order); a member that fails (a
 * mismatch, a rank that calls hora_finalize without it, a different
 * grouping) fails every member of the group on every rank. The requests
 * are returned as usual, but complete only after hora_group_end: hora_wait
 * before it is HORA_ERR_INVALID_USAGE. A group's members run in one process
 * set; barrier and join cannot be grouped. A group of one is a plain
 * operation. */
HORA_EXTERN int hora_group_start(void);
HORA_EXTERN int hora_group_end(void);

/* ---- Adasum -------------------------------------------------------------------
 * HORA_ADASUM, an allreduce op for float16, bfloat16, float32 and float64
 * buffers (Maleki et al., MLSys 2021): a and b combine as
 * (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b (a zero vector's coefficient
 * is 1), the ranks as a binary tree (ranks r and r ^ 1 first; ranks past the
 * largest power of two P fold into r - P first). Computed in double; every
 * rank gets the same bits; each tensor alone (never fused); prescale before,
 * postscale after. Other dtypes and reducescatter: HORA_ERR_INVALID_ARG.
 * Device buffers are staged through host memory. */

#ifdef __cplusplus
}
#endif

#endif /* HORA_H */
