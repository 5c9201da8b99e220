/* The process-wide runtime: what a user's call goes through. Every folder
 * of runtime/ may include this (it is below them all): the structs that the
 * API's callers and the engine share, and the calls between those layers.
 *
 * Threads and locks. Caller threads validate, enqueue and wait. The one
 * coordinator thread ("hora-coord", engine/engine.c) owns negotiation, the
 * data plane and every connection. They share only what is below
 * "protected by mu"; mu is the only lock here, so there is no lock order to
 * get wrong (the timeline's, in observe/timeline.c, is a leaf: nothing is
 * taken under it). A
 * request's result fields are written by the coordinator before it sets
 * `done` (release) and read by the caller after it sees `done` (acquire). */
#ifndef HORA_RUNTIME_H
#define HORA_RUNTIME_H

#include <pthread.h>
#include <stdatomic.h>

#include "comm/comm.h"
#include "base/table.h"
#include "runtime/operation.h"
#include "runtime/topology.h"

/* Whether the job has failed, for stream-ordered requests: their results
 * come after they complete, and may then never come. Shared by the runtime
 * and those requests (counted), so it outlives hora_finalize. */
struct hora__fate {
  atomic_int refs;
  atomic_int code; /* the fatal error; set last, with release, after msg */
  char msg[1024];
};

struct hora_request {
  struct hora_request *next; /* submission queue */
  char key[HORA_KEY_MAX + 1];
  uint16_t key_len;
  struct hora__op_meta meta;
  struct hora__shape shape; /* the caller's, copied; meta.shape is its fingerprint */
  const void *sendbuf;
  void *recvbuf;
  uint64_t submit_ns;
  /* Where its time goes (hora_stats' stages): queued for the coordinator,
   * taken by it, its collective started and ended, completed. */
  uint64_t queued_ns, taken_ns, start_ns, ran_ns, done_ns;
  /* Device buffers given with a caller's stream (hora_cuda.h): the runtime
   * stream waits for `ready`; the request completes once the operation is
   * queued on the GPU, and `done` marks when its results are written. */
  void *stream;
  void *ready_event, *done_event;
  struct hora__fate *fate;
  /* The process set's runtime it was submitted to (counted: it outlives the
   * set's destruction until this request is freed); NULL for the world's. */
  struct hora__runtime *inst;
  /* Coordinator only: the cache slot it waits on, or -1 (sent in full). */
  int32_t sent_slot;
  /* Coordinator only: taken off the submission queue. Until then it is in
   * the in-flight table but not yet known to the coordinator, and no
   * response may run or complete it (it is still linked in the queue). */
  bool taken;
  /* Coordinator only: not a caller's request but the engine's, keeping the
   * key in flight for one that failed here (a mismatch) while rank 0 still
   * holds it: rank 0's answer for it retires this (stood in for), and a new
   * request under the key is refused until then, as it would be a second
   * submission at rank 0. */
  bool placeholder;
  /* Allgatherv and alltoall (their counts are not in meta): this rank's. */
  size_t v_count;   /* elements in sendbuf */
  size_t *v_send;   /* alltoall: [size] elements for each rank (owned) */
  size_t *v_recv;   /* [size] the caller's receive counts (owned), or NULL: v_result */
  struct hora_received *v_result; /* the _alloc forms': filled before `done` */
  bool group_held; /* submitted in a group that has not ended (api/group.c) */
  /* Results, written by the coordinator before `done`. */
  int status;
  char *error; /* message when status != 0 */
  int last_joined;
  atomic_int done;
};

/* The dimensions of the metrics' counters in struct hora__runtime: the
 * collectives' kinds (allgatherv counts as allgather), dtypes, operation
 * sizes and bus bandwidth buckets (observe/metrics_runtime.c names them). */
enum { HORA__MKIND_ALLREDUCE, HORA__MKIND_BROADCAST, HORA__MKIND_ALLGATHER,
       HORA__MKIND_REDUCESCATTER, HORA__MKIND_ALLTOALL, HORA__MKINDS };
#define HORA__MDTYPES 10
#define HORA__MSIZES 4
#define HORA__MBW_BUCKETS 11 /* the last is +Inf */

struct hora__runtime {
  /* Set by hora_init (or hora_process_set_create), read-only while running. */
  hora__comm *comm;
  int rank, size;
  /* A process set's (0: the job's world): its id, its members' global ranks
   * by set rank (NULL for the world) and "process set N: " for messages. */
  int set_id;
  const int *global_ranks;
  char label[32];
  atomic_int refs; /* a process set's: its handle and its requests */
  int spin_us;     /* how long a waiting caller polls before it sleeps */
  /* A fatal error here stays here (a set whose making failed elsewhere):
   * neither its peers nor the process's other sets are told. */
  atomic_bool contained;
  bool owns_mpi;
  struct hora__topology topo;
  pthread_t thread;
  bool thread_started;
  int wake_fd; /* eventfd: callers wake a sleeping coordinator */
  /* The engine runs on one thread at a time: the coordinator, or a caller
   * that drives it while it waits (hora__engine_drive). Outlives the engine. */
  pthread_mutex_t progress_mu;
  /* Callers driving it now: while any does, the coordinator leaves the
   * work to them. */
  atomic_int engine_drivers;

  pthread_mutex_t mu;
  pthread_cond_t done_cv;
  /* ---- protected by mu ---- */
  struct hora_request *queue_head, *queue_tail; /* submitted, not yet seen */
  struct hora__table inflight;                 /* key -> request, until completed */
  uint64_t unnamed_seq, barrier_seq;
  /* Threads asleep in hora__engine_poll on the eventfd among others (the
   * coordinator, a driving caller): a submission writes the eventfd while
   * any is. A count, not a flag: a caller waking must not hide the
   * coordinator's sleep from the next submitter. */
  int sleepers;
  bool coord_polling; /* the coordinator sleeps in its poll() on everything */
  bool accepting;          /* false once the coordinator has stopped */
  bool coordinator_exited;
  bool joined;       /* this rank has a join in flight */
  bool abort_asked;  /* hora_abort was called; the coordinator tells the job */
  int abort_code;    /* 0: hora_abort's HORA_ERR_ABORTED; else (a reset asked for) this code */
  char abort_reason[512];
  /* ---- end of protected ---- */

  /* Bumped under mu by every submission: lets a spinning coordinator see
   * new work without taking the lock. */
  atomic_uint_fast64_t submit_seq;

  /* The first fatal error: code set last, with release, after the message. */
  atomic_int fatal_code;
  char fatal_msg[1024];
  atomic_flag fatal_claimed;
  struct hora__fate *fate; /* the same, for stream-ordered requests */

  /* Coordinator-thread state (engine/engine.h). */
  struct hora__engine *engine;

  /* Counters for hora_get_stats: written by the coordinator, read by anyone. */
  struct {
    atomic_uint_fast64_t allreduces, broadcasts, allgathers, reducescatters, alltoalls, bytes;
    atomic_uint_fast64_t fused_batches, fused_tensors, cache_hits, cache_misses;
    atomic_uint_fast64_t cycles, sent_in_full, eager, eager_collectives, bus_bytes;
    atomic_uint_fast64_t negotiate_ns, communicate_ns, copy_ns;
    /* The stages of the operations a caller waited for (hora_stats). */
    atomic_uint_fast64_t staged_ops, submit_ns, handoff_ns, cycle_ns, run_ns, complete_ns,
        wake_ns;
    /* For the metrics (observe/metrics.h), by metric kind (HORA__MKIND_*):
     * bytes, operations per dtype, and the bus bandwidth histogram per size
     * bucket (counts per bucket, not cumulative; bytes/s summed). */
    atomic_uint_fast64_t kind_bytes[HORA__MKINDS];
    atomic_uint_fast64_t kind_dtype_ops[HORA__MKINDS][HORA__MDTYPES];
    atomic_uint_fast64_t busbw[HORA__MKINDS][HORA__MSIZES][HORA__MBW_BUCKETS];
    atomic_uint_fast64_t busbw_sum[HORA__MKINDS][HORA__MSIZES];
  } stats;
};



/* engine/fatal.c: records the first fatal error (later ones are ignored);
 * the one recorded, with its message set, or HORA_SUCCESS. */
void hora__runtime_set_fatal(struct hora__runtime *rt, int code, const char *msg);
int hora__runtime_fatal(struct hora__runtime *rt);
/* The job's fatal error as a stream-ordered request's fate holds it. */
int hora__request_job_failed(const struct hora_request *r);
/* Drops a reference to the fate, freeing it with the last. */
void hora__fate_release(struct hora__fate *f);

/* engine/submit.c: completion by the coordinator; call with rt->mu held.
 * Removes the request from the in-flight table and publishes the result. */
void hora__request_complete_locked(struct hora__runtime *rt, struct hora_request *req, int status,
                                   const char *msg);

/* api/init.c: the running runtime, counted as in use until hora__api_leave
 * (which returns rc); NULL, with *rc set, when there is none. */
struct hora__runtime *hora__api_running(int *rc, const char *call);
/* The world's runtime, or NULL (not counted: for the fatal path only). */
struct hora__runtime *hora__world_runtime(void);
int hora__api_leave(int rc);

/* api/request.c: a caller's request, from allocation to its result. */
struct hora_request *hora__request_new(uint8_t kind);
void hora__request_free(struct hora_request *r);
int hora__request_submit(struct hora__runtime *rt, struct hora_request *r, const char *name,
                         hora_request **out);
/* Until the coordinator has completed r. */
void hora__request_wait_done(struct hora__runtime *rt, struct hora_request *r);
/* The result of a completed request, which it frees (*req becomes NULL). */
int hora__request_finish(hora_request **req);
/* Adds a request's stages (hora_stats) once it is done and waited for:
 * only one that ran, with every stamp in order. */
void hora__request_account_stages(struct hora__runtime *rt, const struct hora_request *r);
int hora__request_wait(struct hora__runtime *rt, hora_request **req);

/* api/api.c: the collectives, with an optional caller's stream (a
 * cudaStream_t; NULL for none), for api/api_cuda.c. */
int hora__allreduce_submit(const char *name, const void *sendbuf, void *recvbuf, size_t count,
                           hora_dtype dtype, hora_op op, const hora_allreduce_options *opts,
                           void *stream, hora_request **req);
int hora__reducescatter_submit(const char *name, const void *sendbuf, void *recvbuf,
                               size_t count, hora_dtype dtype, hora_op op,
                               const hora_allreduce_options *opts, void *stream,
                               hora_request **req);
int hora__broadcast_submit(const char *name, void *buf, size_t count, hora_dtype dtype, int root,
                           const hora_op_options *opts, void *stream, hora_request **req);
int hora__allgather_submit(const char *name, const void *sendbuf, size_t count, hora_dtype dtype,
                           void *recvbuf, const hora_op_options *opts, void *stream,
                           hora_request **req);
int hora__wait_stream(hora_request **req, void *stream);
/* api/group.c: whether r may join the calling thread's open group (an error
 * where it may not), and holding it there (false: no group is open). */
int hora__group_admit(struct hora__runtime *rt, const struct hora_request *r);
bool hora__group_hold(struct hora__runtime *rt, struct hora_request *r);

/* api/api.c: what every collective's submission checks, for api_exchange.c. */
int hora__api_check_common(const char *call, const char *name, size_t count, hora_dtype dtype,
                           hora_request **req, size_t multiplier);
void hora__api_set_shape(struct hora_request *r, const struct hora__shape *s);
const hora_process_set *hora__api_options_set(const hora_op_options *opts);
int hora__api_options_shape(const char *call, const hora_op_options *opts, size_t count,
                            struct hora__shape *shape);

/* api/init.c: a runtime over `comm` (the world's, or a process set's with
 * its id and members' global ranks), started; and stopping it (collective over
 * its ranks) before it is released. */
struct hora__rdv;
struct hora__rdv_tcp_spec;
/* Ends the world's membership (collective over it, as hora_finalize, but
 * leaving MPI and the log alone) and, with a spec, joins the membership a
 * tcp rendezvous forms, with a new epoch: a communicator built again within
 * the process. NULL spec: this process leaves. */
int hora__world_rebuild(const struct hora__rdv_tcp_spec *spec);
/* The same, for a caller that holds the life cycle's lock (hora__lifecycle_lock). */
int hora__world_rebuild_locked(const struct hora__rdv_tcp_spec *spec);
void hora__lifecycle_lock(void);
void hora__lifecycle_unlock(void);

/* api/metrics.c: the metrics thread (observe/metrics.h) over the world's
 * runtime and its process sets: started with the world (rt), told the
 * process's new rank after a rebuild, stopped before the world is freed. */
void hora__metrics_api_start(struct hora__runtime *rt);
void hora__metrics_api_identity(struct hora__runtime *rt);
void hora__metrics_api_stop(void);

/* api/elastic.c: elastic training's share of the life cycle. */
struct hora__rdv_choice;
/* At start-up (HORA_ELASTIC): this process's listener, every member's
 * address through the start-up's rendezvous, rank 0's door. */
int hora__elastic_begin(struct hora__rdv *rdv, struct hora__runtime *rt,
                        const struct hora__rdv_choice *choice);
/* Whether this process comes to a running job (HORA_ELASTIC, no rank, or
 * rank 0 finding the rendezvous port taken); then joins it and builds the
 * world. Caller holds the life cycle's lock. */
bool hora__elastic_is_newcomer(const struct hora__rdv_choice *choice);
int hora__elastic_join_locked(const struct hora__rdv_choice *choice);
/* After the world is built again (rank 0 holds the door) and at the end. */
void hora__elastic_rebuilt(struct hora__runtime *rt);
void hora__elastic_end(void);
/* The membership is open: its listener's thread runs (after a reset that
 * failed for good, with no world). Caller holds the life cycle's lock. */
bool hora__elastic_open(void);
/* No more calls into the world from the listener's thread (before freeing it). */
void hora__elastic_quiet(void);
/* A reset left processes out: MPI_Finalize would wait for them. */
bool hora__elastic_lost_members(void);
/* hora_init, and hora_init_comm (api/api_mpi.c) with mpi_comm pointing to
 * its MPI_Comm: starts the world unless it runs. */
int hora__init(const void *mpi_comm);
int hora__instance_start(struct hora__rdv *rdv, int set_id, const int *global_ranks,
                         struct hora__runtime **out);
void hora__instance_stop(struct hora__runtime *rt);
void hora__instance_release(struct hora__runtime *rt);

/* api/process_set.c: the runtime that runs a collective of opts' set
 * (NULL: the world), counted as in use like hora__api_running (and a set's
 * runtime referenced) until hora__api_leave_in; fatal errors passed on to
 * every set of the process; the sets' counters for hora_get_stats; and
 * the sets still alive, destroyed by hora_finalize. */
struct hora__runtime *hora__api_running_in(const struct hora_process_set *ps, int *rc,
                                           const char *call);
/* The end of a call that hora__api_running_in let in (returns rc). */
int hora__api_leave_in(struct hora__runtime *rt, int rc);
void hora__process_sets_fatal(struct hora__runtime *from, int code, const char *msg);
void hora__process_sets_add_stats(hora_stats *s);
/* Calls fn for each live set's runtime, with the sets' lock held. */
void hora__process_sets_each(void (*fn)(struct hora__runtime *rt, void *arg), void *arg);
/* Adds rt's counters to *s (api/api.c). */
void hora__stats_add(hora_stats *s, struct hora__runtime *rt);
/* The process's counters: the world's (rt) and every process set's, into
 * *s, zeroed first. */
void hora__stats_total(hora_stats *s, struct hora__runtime *rt);
void hora__process_sets_finalize(void);
/* hora_process_set_from_mpi_comm's agreement (collective over the world):
 * `find` (api/api_mpi.c: the ranks of an MPI communicator) gives this
 * rank's members, in any order, or none (NULL, 0) where it is in no set. */
typedef int (*hora__set_members_fn)(const char *call, const void *arg, int **members, int *n);
int hora__process_set_from_members(const char *call, hora__set_members_fn find, const void *arg,
                                   hora_process_set **out);
/* A global rank for messages: rank r of rt's set. */
static inline int hora__global_rank(const struct hora__runtime *rt, int r) {
  return rt->global_ranks && r >= 0 && r < rt->size ? rt->global_ranks[r] : r;
}

/* api/api_mpi.c, in a build with MPI only (HORA_HAVE_MPI): MPI's share of
 * the world's life. The world started through MPI keeps the mpi
 * rendezvous' communicator (hora_process_set_from_mpi_comm translates
 * ranks with it) until it ends. */
/* MPI is initialised and not finalized; and whether it was finalized. */
void hora__mpi_state(bool *running, bool *finalized);
/* MPI_Init_thread, asking for MPI_THREAD_MULTIPLE. */
int hora__mpi_start(void);
/* The mpi rendezvous over *mpi_comm (an MPI_Comm; NULL: MPI_COMM_WORLD),
 * whose communicator becomes the world's. */
int hora__mpi_open(const void *mpi_comm, struct hora__rdv **out);
/* The world is over: its communicator is freed, and MPI finalized when
 * `finalize`. */
void hora__mpi_world_end(bool finalize);
/* MPI runs with MPI_THREAD_MULTIPLE. */
int hora__mpi_threads_multiple(void);

/* engine/engine.c */
int hora__engine_start(struct hora__runtime *rt);
void hora__engine_join(struct hora__runtime *rt);
/* Wakes the coordinator if it sleeps; call with rt->mu held. */
void hora__engine_wake_locked(struct hora__runtime *rt);
/* engine/drive.c: a waiting caller runs the engine's steps itself until
 * *done or until_ns; false where it may not (device work), and nothing ran. */
bool hora__engine_drive(struct hora__runtime *rt, const atomic_int *done, uint64_t until_ns);
/* Where waits never spin: the caller runs the engine, sleeping in poll()
 * itself, until *done; false where it may not (the engine is
 * busy on another thread, device work), and nothing ran. */
bool hora__engine_drive_sleeping(struct hora__runtime *rt, const atomic_int *done);

#endif
