/* The public API: argument checks, request objects, wait and test.
 * Caller threads only validate, enqueue and wait; the coordinator thread
 * (engine.c) does the rest. */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/gpu/gpu.h"
#include "comm/shm/shm.h"
#include "base/log.h"
#include "base/mpi_error.h"
#include "base/params.h"
#include "runtime/cycle.h"
#include "runtime/runtime.h"
#include "runtime/timeline.h"

/* The running runtime, or NULL. Published after it is fully set up. */
static struct hora__runtime *_Atomic current;
/* Serialises hora_init and hora_finalize. */
static pthread_mutex_t lifecycle_mu = PTHREAD_MUTEX_INITIALIZER;
/* hora_finalize finalized an MPI that hora_init had initialised: MPI cannot
 * start again in this process. */
static bool mpi_finalized_by_hora;

void hora__runtime_set_fatal(struct hora__runtime *rt, int code, const char *msg) {
  if (atomic_flag_test_and_set(&rt->fatal_claimed)) {
    return;
  }
  hora__strlcpy(rt->fatal_msg, msg && msg[0] ? msg : hora_strerror(code), sizeof(rt->fatal_msg));
  if (rt->fate) {
    hora__strlcpy(rt->fate->msg, rt->fatal_msg, sizeof(rt->fate->msg));
    atomic_store_explicit(&rt->fate->code, code, memory_order_release);
  }
  atomic_store_explicit(&rt->fatal_code, code, memory_order_release);
}

static void fate_release(struct hora__fate *f) {
  if (f && atomic_fetch_sub(&f->refs, 1) == 1) {
    free(f);
  }
}

int hora__runtime_fatal(struct hora__runtime *rt) {
  int code = atomic_load_explicit(&rt->fatal_code, memory_order_acquire);
  if (code != HORA_SUCCESS) {
    hora__error_set_message(rt->fatal_msg);
  }
  return code;
}

void hora__request_complete_locked(struct hora__runtime *rt, struct hora_request *req, int status,
                                   const char *msg) {
  hora__table_remove(&rt->inflight, req->key, req->key_len);
  req->status = status;
  if (status != HORA_SUCCESS) {
    req->error = strdup(msg && msg[0] ? msg : hora_strerror(status));
  }
  atomic_store_explicit(&req->done, 1, memory_order_release);
}

/* Calls that are using the runtime right now. hora_finalize frees it only
 * when none is left: threads its shutdown woke (waiters, a barrier) are
 * still on their way out. Counted before `current` is read, so a call that
 * sees the runtime is always counted. */
static atomic_int api_users;

/* The runtime, counted as in use until leave(); NULL (and *rc set) if
 * there is none. */
static struct hora__runtime *running(int *rc, const char *call) {
  atomic_fetch_add(&api_users, 1);
  struct hora__runtime *rt = atomic_load(&current);
  if (!rt) {
    atomic_fetch_sub(&api_users, 1);
    *rc = hora__error(HORA_ERR_INVALID_USAGE, "%s: hora_init has not been called%s", call,
                      mpi_finalized_by_hora ? " (or hora_finalize has)" : "");
  }
  return rt;
}

static int leave(int rc) {
  atomic_fetch_sub(&api_users, 1);
  return rc;
}

/* ---- life cycle --------------------------------------------------------------- */

static void runtime_free(struct hora__runtime *rt) {
  if (!rt) {
    return;
  }
  hora__engine_join(rt);
  hora__comm_destroy(rt->comm);
  hora__table_free(&rt->inflight);
  if (rt->wake_fd >= 0) {
    close(rt->wake_fd);
  }
  pthread_mutex_destroy(&rt->mu);
  pthread_cond_destroy(&rt->done_cv);
  fate_release(rt->fate);
  free(rt);
}

static void log_startup(const struct hora__runtime *rt) {
  const hora__comm *c = rt->comm;
  const struct hora__topology *t = &rt->topo;
  HORA_INFO("host %s rank %d/%d local %d/%d host-index %d/%d: %d cores, %d PUs, %d NUMA node(s); "
            "%s PUs %s (NUMA %s); transports: same host %s, other hosts %s; spin %d us",
            hora__log_hostname(), c->rank, c->size, c->local_rank, c->local_size, c->cross_rank,
            c->cross_size, t->cores, t->pus, t->numa_nodes, t->bound ? "bound to" : "not bound,",
            t->cpus, t->numa, c->proc->local_transport, c->proc->remote_transport, c->net->spin_us);
}

static int init_locked(void) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (finalized || mpi_finalized_by_hora) {
    return hora__error(HORA_ERR_INVALID_USAGE,
                       "hora_init: MPI has been finalized in this process (by %s), and MPI cannot "
                       "start twice",
                       mpi_finalized_by_hora ? "hora_finalize" : "the program");
  }
  /* Settings first: a bad value must not leave MPI half started. */
  int prc = hora__params_load();
  char perr[1024];
  hora__strlcpy(perr, hora__error_message(), sizeof(perr));
  if (prc == HORA_SUCCESS) {
    prc = hora__log_open();
    hora__strlcpy(perr, hora__error_message(), sizeof(perr));
  }
  bool owns_mpi = false;
  if (!inited) {
    int provided = 0;
    int err = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    if (err != MPI_SUCCESS) {
      return hora__mpi_error(err, "MPI_Init_thread");
    }
    owns_mpi = true;
  }
  /* Every rank learns whether any rank's settings were bad, so none is left
   * waiting in the bootstrap for one that gave up. */
  int worst = prc, err = MPI_Allreduce(&prc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  int rc = HORA_SUCCESS;
  if (err != MPI_SUCCESS) {
    rc = hora__mpi_error(err, "MPI_Allreduce(settings check)");
  } else if (prc != HORA_SUCCESS) {
    rc = hora__error(prc, "%s", perr);
  } else if (worst != HORA_SUCCESS) {
    rc = hora__error(worst, "hora_init failed on another rank because of its HORA_* settings");
  }
  if (rc != HORA_SUCCESS) {
    if (owns_mpi) {
      MPI_Finalize();
      mpi_finalized_by_hora = true;
    }
    return rc;
  }

  struct hora__runtime *rt = hora__calloc(1, sizeof(*rt));
  if (!rt) {
    return HORA_ERR_NO_MEMORY;
  }
  rt->owns_mpi = owns_mpi;
  rt->wake_fd = -1;
  pthread_mutex_init(&rt->mu, NULL);
  pthread_cond_init(&rt->done_cv, NULL);
  rt->accepting = true;
  rt->fate = hora__calloc(1, sizeof(*rt->fate));
  if (!rt->fate) {
    rc = HORA_ERR_NO_MEMORY;
    goto fail;
  }
  atomic_init(&rt->fate->refs, 1);
  rt->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (rt->wake_fd < 0) {
    rc = hora__error_errno(HORA_ERR_SYSTEM, "eventfd");
    goto fail;
  }
  HORA_CHECK_GOTO(hora__topology_probe(&rt->topo), rc, fail);
  /* The control plane: the star around rank 0 (the bootstrap's own) and
   * the cycles' partners. */
  int world_rank = 0, world_size = 1, ctrl_peers[32], nctrl = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  struct hora__cycle_partners cp;
  hora__cycle_partners(world_rank, world_size, &cp);
  if (cp.fold >= 0) {
    ctrl_peers[nctrl++] = cp.fold;
  }
  for (int i = 0; i < cp.nrounds; i++) {
    ctrl_peers[nctrl++] = cp.round[i];
  }
  HORA_CHECK_GOTO(hora__comm_create(MPI_COMM_WORLD, ctrl_peers, nctrl, &rt->comm), rc, fail);
  rt->rank = rt->comm->rank;
  rt->size = rt->comm->size;
  /* Spinning only pays when every local rank has a core of its own. */
  rt->comm->net->spin_us = rt->comm->local_size <= rt->topo.pus ? (int)hora__params.SPIN_TIME_US : 0;
  if (rt->rank == 0) {
    hora__params_log();
    if (hora__params.TIMELINE[0]) {
      HORA_CHECK_GOTO(hora__timeline_open(hora__params.TIMELINE, hora__params.TIMELINE_MARK_CYCLES,
                                          "HORA_TIMELINE"),
                      rc, fail);
    }
  }
  log_startup(rt);
  HORA_CHECK_GOTO(hora__engine_start(rt), rc, fail);
  atomic_store_explicit(&current, rt, memory_order_release);
  return HORA_SUCCESS;
fail:
  runtime_free(rt);
  hora__timeline_close();
  if (owns_mpi) {
    MPI_Finalize();
    mpi_finalized_by_hora = true;
  }
  return rc;
}

HORA_EXTERN int hora_init(void) {
  hora__error_clear();
  pthread_mutex_lock(&lifecycle_mu);
  int rc = atomic_load(&current) ? HORA_SUCCESS : init_locked();
  pthread_mutex_unlock(&lifecycle_mu);
  return rc;
}

HORA_EXTERN int hora_initialized(void) { return atomic_load(&current) != NULL; }

/* Forward declarations of the submission path used by finalize. */
static int submit(struct hora__runtime *rt, struct hora_request *r, const char *name,
                  hora_request **out);
static int wait_request(struct hora__runtime *rt, hora_request **req);
static struct hora_request *request_new(uint8_t kind);

HORA_EXTERN int hora_finalize(void) {
  hora__error_clear();
  pthread_mutex_lock(&lifecycle_mu);
  int rc = HORA_SUCCESS;
  struct hora__runtime *rt = running(&rc, "hora_finalize");
  if (!rt) {
    pthread_mutex_unlock(&lifecycle_mu);
    return rc;
  }
  /* Agree with every rank that the job is over, then stop. */
  struct hora_request *r = request_new(HORA_KIND_SHUTDOWN);
  if (r) {
    hora_request *q = NULL;
    if (submit(rt, r, NULL, &q) == HORA_SUCCESS) {
      wait_request(rt, &q);
    }
  }
  atomic_store(&current, NULL);
  hora__engine_join(rt);
  leave(HORA_SUCCESS);
  while (atomic_load(&api_users) > 0) {
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
  hora__timeline_close();
  int fatal = atomic_load(&rt->fatal_code);
  char msg[1024];
  hora__strlcpy(msg, rt->fatal_msg, sizeof(msg));
  bool owns_mpi = rt->owns_mpi;
  runtime_free(rt);
  if (owns_mpi) {
    if (fatal == HORA_SUCCESS) {
      MPI_Finalize();
      mpi_finalized_by_hora = true;
    } else {
      /* A peer is gone: MPI_Finalize could wait for it forever. The
       * process is expected to exit with an error now. */
      HORA_WARN("hora_finalize: not finalizing MPI after a fatal error (%s)", hora_strerror(fatal));
    }
  }
  hora__log_close();
  pthread_mutex_unlock(&lifecycle_mu);
  if (fatal != HORA_SUCCESS) {
    return hora__error(fatal, "%s", msg);
  }
  return HORA_SUCCESS;
}

HORA_EXTERN int hora_abort(const char *reason) {
  hora__error_clear();
  int rc = HORA_SUCCESS;
  struct hora__runtime *rt = running(&rc, "hora_abort");
  if (!rt) {
    return rc;
  }
  char msg[1024];
  snprintf(msg, sizeof(msg), "hora_abort called on rank %d: %s", rt->rank,
           reason && reason[0] ? reason : "(no reason given)");
  hora__runtime_set_fatal(rt, HORA_ERR_ABORTED, msg);
  pthread_mutex_lock(&rt->mu);
  rt->abort_asked = true;
  hora__strlcpy(rt->abort_reason, reason ? reason : "", sizeof(rt->abort_reason));
  atomic_fetch_add_explicit(&rt->submit_seq, 1, memory_order_release);
  hora__engine_wake_locked(rt);
  /* Wait (bounded) until the coordinator has told the job, so the news is
   * out even if this process exits right away. */
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 5;
  while (!rt->coordinator_exited) {
    if (pthread_cond_timedwait(&rt->done_cv, &rt->mu, &until) != 0) {
      break;
    }
  }
  pthread_mutex_unlock(&rt->mu);
  return leave(HORA_SUCCESS);
}

#define RANK_GETTER(fn, field)                                                               \
  HORA_EXTERN int fn(void) {                                                                 \
    atomic_fetch_add(&api_users, 1);                                                         \
    struct hora__runtime *rt = atomic_load(&current);                                        \
    return leave(rt ? rt->comm->field : -1);                                                 \
  }
RANK_GETTER(hora_rank, rank)
RANK_GETTER(hora_size, size)
RANK_GETTER(hora_local_rank, local_rank)
RANK_GETTER(hora_local_size, local_size)
RANK_GETTER(hora_cross_rank, cross_rank)
RANK_GETTER(hora_cross_size, cross_size)

/* ---- requests -------------------------------------------------------------------- */

static struct hora_request *request_new(uint8_t kind) {
  struct hora_request *r = hora__calloc(1, sizeof(*r));
  if (r) {
    r->meta.kind = kind;
    r->meta.root = -1;
    r->meta.prescale = r->meta.postscale = 1.0;
    r->shape.ndims = -1;
    r->last_joined = -1;
    r->sent_slot = -1;
  }
  return r;
}

static void request_free(struct hora_request *r) {
  if (r) {
    hora__gpu_event_destroy(r->ready_event);
    hora__gpu_event_destroy(r->done_event);
    fate_release(r->fate);
    free(r->error);
    free(r);
  }
}

static int check_name(const char *name) {
  if (name) {
    size_t n = strnlen(name, HORA_NAME_MAX + 1);
    if (n > HORA_NAME_MAX) {
      return hora__error(HORA_ERR_INVALID_ARG, "operation name '%.40s...' is longer than %d bytes",
                         name, HORA_NAME_MAX);
    }
  }
  return HORA_SUCCESS;
}

/* Names the request, rejects a name already in flight, and hands the
 * request to the coordinator. Takes ownership of r on every path. */
/* Host or device memory: both buffers of an operation must agree. A
 * caller's stream asks for device memory, and the runtime's stream will
 * wait for the work already queued on it. */
static int classify_memory(struct hora__runtime *rt, struct hora_request *r, const char *call) {
  uint8_t k = r->meta.kind;
  if (k != HORA_KIND_ALLREDUCE && k != HORA_KIND_BROADCAST && k != HORA_KIND_ALLGATHER) {
    return HORA_SUCCESS;
  }
  bool send_dev = false, recv_dev = false;
  HORA_CHECK(hora__gpu_is_device(r->sendbuf, &send_dev));
  HORA_CHECK(hora__gpu_is_device(r->recvbuf, &recv_dev));
  if (r->meta.count > 0 && send_dev != recv_dev) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s: %s is device memory but %s is host memory", call,
                       send_dev ? "sendbuf" : "recvbuf", send_dev ? "recvbuf" : "sendbuf");
  }
  r->meta.device = send_dev || recv_dev;
  if (r->stream) {
    if (!r->meta.device && r->meta.count > 0) {
      return hora__error(HORA_ERR_INVALID_ARG,
                         "%s: a stream is given, but the buffers are host memory", call);
    }
    r->fate = rt->fate;
    atomic_fetch_add(&r->fate->refs, 1);
    HORA_CHECK(hora__gpu_record_event(r->stream, &r->ready_event));
    HORA_CHECK(hora__gpu_event_create(&r->done_event));
  }
  return HORA_SUCCESS;
}

static int submit(struct hora__runtime *rt, struct hora_request *r, const char *name,
                  hora_request **out) {
  int rc = HORA_SUCCESS;
  char shown[300];
  r->submit_ns = hora__now_ns();
  rc = classify_memory(rt, r, hora__kind_name(r->meta.kind));
  if (rc != HORA_SUCCESS) {
    request_free(r);
    return rc;
  }
  pthread_mutex_lock(&rt->mu);
  if (!rt->accepting || atomic_load(&rt->fatal_code) != HORA_SUCCESS) {
    rc = hora__runtime_fatal(rt);
    if (rc == HORA_SUCCESS) {
      rc = hora__error(HORA_ERR_INVALID_USAGE, "the runtime is shutting down");
    }
    goto fail;
  }
  switch (r->meta.kind) {
    case HORA_KIND_BARRIER:
      r->key_len = (uint16_t)snprintf(r->key, sizeof(r->key), "%c%llu", HORA_KEY_BARRIER,
                                      (unsigned long long)rt->barrier_seq);
      break;
    case HORA_KIND_JOIN:
      r->key_len = (uint16_t)snprintf(r->key, sizeof(r->key), "%c", HORA_KEY_JOIN);
      break;
    case HORA_KIND_SHUTDOWN:
      r->key_len = (uint16_t)snprintf(r->key, sizeof(r->key), "%c", HORA_KEY_SHUTDOWN);
      break;
    default:
      if (name) {
        r->key_len = (uint16_t)snprintf(r->key, sizeof(r->key), "%c%s", HORA_KEY_NAMED, name);
      } else {
        r->key_len = (uint16_t)snprintf(r->key, sizeof(r->key), "%c%llu", HORA_KEY_UNNAMED,
                                        (unsigned long long)rt->unnamed_seq);
      }
      break;
  }
  if (hora__table_get(&rt->inflight, r->key, r->key_len)) {
    rc = hora__error(HORA_ERR_INVALID_USAGE, "%s %s is already in flight on rank %d",
                     hora__kind_name(r->meta.kind),
                     hora__key_display(r->key, r->key_len, shown, sizeof(shown)), rt->rank);
    goto fail;
  }
  if (rt->joined && r->meta.kind != HORA_KIND_ALLREDUCE && r->meta.kind != HORA_KIND_SHUTDOWN) {
    rc = hora__error(HORA_ERR_INVALID_USAGE,
                     "%s %s: rank %d has called hora_join; only allreduce can run until every "
                     "rank has joined",
                     hora__kind_name(r->meta.kind),
                     hora__key_display(r->key, r->key_len, shown, sizeof(shown)), rt->rank);
    goto fail;
  }
  rc = hora__table_put(&rt->inflight, r->key, r->key_len, r);
  if (rc != HORA_SUCCESS) {
    goto fail;
  }
  /* Sequence numbers advance only for operations that were accepted. */
  if (r->meta.kind == HORA_KIND_BARRIER) {
    rt->barrier_seq++;
  } else if (r->key[0] == HORA_KEY_UNNAMED) {
    rt->unnamed_seq++;
  } else if (r->meta.kind == HORA_KIND_JOIN) {
    rt->joined = true;
  }
  r->next = NULL;
  if (rt->queue_tail) {
    rt->queue_tail->next = r;
  } else {
    rt->queue_head = r;
  }
  rt->queue_tail = r;
  atomic_fetch_add_explicit(&rt->submit_seq, 1, memory_order_release);
  hora__engine_wake_locked(rt);
  pthread_mutex_unlock(&rt->mu);
  *out = r;
  return HORA_SUCCESS;
fail:
  pthread_mutex_unlock(&rt->mu);
  request_free(r);
  return rc;
}

/* The job's fatal error, once it has failed (and then sets the message). */
static int job_failed(const struct hora_request *r) {
  int code = atomic_load_explicit(&r->fate->code, memory_order_acquire);
  if (code != HORA_SUCCESS) {
    hora__error_set_message(r->fate->msg);
  }
  return code;
}

/* A stream-ordered request's results on the GPU. The host polls, sleeping
 * (lengthening up to 100 us), instead of blocking in cudaEventSynchronize:
 * after a lost peer NCCL's kernels may never end, and the job's failure
 * (the coordinator watches NCCL's errors and the peers) must end the wait.
 * Once the job has failed the results are not trusted even where the event
 * has happened: aborting NCCL ends its kernels early, and the event then
 * fires. */
static int wait_results(struct hora_request *r) {
  long sleep_ns = 2000;
  for (;;) {
    HORA_CHECK(job_failed(r));
    bool happened = false;
    HORA_CHECK(hora__gpu_event_query(r->done_event, &happened));
    if (happened) {
      return HORA_SUCCESS;
    }
    struct timespec ts = {0, sleep_ns};
    nanosleep(&ts, NULL);
    sleep_ns = sleep_ns < 100000 ? sleep_ns * 2 : 100000;
  }
}

static int finish(hora_request **req) {
  struct hora_request *r = *req;
  int status = r->status;
  /* A stream-ordered request completes once queued on the GPU; a plain
   * wait also waits for its results. */
  if (status == HORA_SUCCESS && r->done_event) {
    status = wait_results(r);
    if (status != HORA_SUCCESS) {
      request_free(r);
      *req = NULL;
      return status;
    }
  }
  if (status != HORA_SUCCESS) {
    hora__error_set_message(r->error);
  }
  request_free(r);
  *req = NULL;
  return status;
}

/* Until the coordinator has completed r. */
static void wait_done(struct hora__runtime *rt, struct hora_request *r) {
  /* A short bounded poll catches fast completions without a sleep and a
   * wake-up; oversubscribed hosts skip it (spin_us is 0 there). */
  if (rt && rt->comm->net->spin_us > 0 && !atomic_load_explicit(&r->done, memory_order_acquire)) {
    uint64_t until = hora__now_ns() + (uint64_t)rt->comm->net->spin_us * 1000;
    while (!atomic_load_explicit(&r->done, memory_order_acquire) && hora__now_ns() < until) {
      sched_yield();
    }
  }
  if (!atomic_load_explicit(&r->done, memory_order_acquire)) {
    pthread_mutex_lock(&rt->mu);
    while (!atomic_load_explicit(&r->done, memory_order_acquire)) {
      pthread_cond_wait(&rt->done_cv, &rt->mu);
    }
    pthread_mutex_unlock(&rt->mu);
  }
}

static int wait_request(struct hora__runtime *rt, hora_request **req) {
  wait_done(rt, *req);
  return finish(req);
}

/* Requests live until waited on, even across hora_finalize (which completes
 * them); so wait and test need no running runtime once a request is done. */
HORA_EXTERN int hora_wait(hora_request **req) {
  hora__error_clear();
  if (!req || !*req) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_wait: %s is NULL", req ? "*req" : "req");
  }
  if (atomic_load_explicit(&(*req)->done, memory_order_acquire)) {
    return finish(req);
  }
  int rc = HORA_SUCCESS;
  struct hora__runtime *rt = running(&rc, "hora_wait");
  if (!rt) {
    /* Not done and no runtime: hora_finalize (in another thread) is
     * completing every request right now. */
    for (int ms = 0; ms < 60000 && !atomic_load(&(*req)->done); ms++) {
      struct timespec one = {0, 1000000};
      nanosleep(&one, NULL);
    }
    return atomic_load_explicit(&(*req)->done, memory_order_acquire) ? finish(req) : rc;
  }
  return leave(wait_request(rt, req));
}

HORA_EXTERN int hora_test(hora_request **req, int *done) {
  hora__error_clear();
  if (!req || !*req || !done) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_test: %s is NULL",
                       !req ? "req" : !*req ? "*req" : "done");
  }
  bool happened = atomic_load_explicit(&(*req)->done, memory_order_acquire);
  if (happened && (*req)->status == HORA_SUCCESS && (*req)->done_event &&
      job_failed(*req) == HORA_SUCCESS) {
    HORA_CHECK(hora__gpu_event_query((*req)->done_event, &happened));
  }
  *done = happened;
  return happened ? finish(req) : HORA_SUCCESS;
}

/* ---- collectives ----------------------------------------------------------------- */

static int check_common(const char *call, const char *name, size_t count, hora_dtype dtype,
                        hora_request **req, size_t multiplier) {
  if (!req) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s: req is NULL", call);
  }
  *req = NULL;
  HORA_CHECK(check_name(name));
  if (!hora__dtype_valid((int)dtype)) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s: unknown dtype %d", call, (int)dtype);
  }
  size_t es = hora_dtype_size(dtype);
  if (count > SIZE_MAX / es / multiplier || count > (SIZE_MAX >> 4) / es / multiplier) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s: %zu elements of %s overflow a byte count", call,
                       count, hora_dtype_name(dtype));
  }
  return HORA_SUCCESS;
}

/* The caller's shape into r: its dims for rank 0's messages, and the
 * fingerprint every comparison uses. */
static void set_shape(struct hora_request *r, const struct hora__shape *s) {
  if (s->ndims >= 0) {
    r->shape = *s;
    r->meta.shape = hora__shape_fingerprint(r->meta.kind, s);
  }
}

/* The shape of a hora_op_options (NULL: none), read only where the
 * caller's struct_size covers it. */
static int op_options_shape(const char *call, const hora_op_options *opts, size_t count,
                            struct hora__shape *shape) {
  shape->ndims = -1;
  if (!opts) {
    return HORA_SUCCESS;
  }
  if (opts->struct_size < sizeof(opts->struct_size) || opts->struct_size > (1u << 16)) {
    return hora__error(HORA_ERR_INVALID_ARG,
                       "%s: opts->struct_size is %zu; set it to sizeof(hora_op_options)", call,
                       opts->struct_size);
  }
  if (opts->struct_size < offsetof(hora_op_options, dims) + sizeof(opts->dims)) {
    return HORA_SUCCESS;
  }
  return hora__shape_check(call, opts->ndims, opts->dims, count, shape);
}

static int compression_setting(void) {
  if (strcmp(hora__params.COMPRESSION, "fp16") == 0) {
    return HORA_COMPRESSION_FP16;
  }
  return strcmp(hora__params.COMPRESSION, "bf16") == 0 ? HORA_COMPRESSION_BF16
                                                       : HORA_COMPRESSION_NONE;
}

HORA_EXTERN int hora_allreduce_async_ex(const char *name, const void *sendbuf, void *recvbuf,
                                        size_t count, hora_dtype dtype, hora_op op,
                                        const hora_allreduce_options *opts, hora_request **req) {
  return hora__allreduce_submit(name, sendbuf, recvbuf, count, dtype, op, opts, NULL, req);
}

int hora__allreduce_submit(const char *name, const void *sendbuf, void *recvbuf, size_t count,
                           hora_dtype dtype, hora_op op, const hora_allreduce_options *opts,
                           void *stream, hora_request **req) {
  hora__error_clear();
  HORA_CHECK(check_common("hora_allreduce_async", name, count, dtype, req, 1));
  if (!hora__op_valid((int)op)) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_allreduce_async: unknown op %d", (int)op);
  }
  if (count > 0 && (!sendbuf || !recvbuf)) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_allreduce_async: %s is NULL",
                       sendbuf ? "recvbuf" : "sendbuf");
  }
  /* Read only the fields the caller's struct has. */
  hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
  if (opts) {
    if (opts->struct_size < offsetof(hora_allreduce_options, prescale) ||
        opts->struct_size > (1u << 16)) {
      return hora__error(HORA_ERR_INVALID_ARG,
                         "hora_allreduce_async_ex: opts->struct_size is %zu; set it to "
                         "sizeof(hora_allreduce_options)",
                         opts->struct_size);
    }
    memcpy(&o, opts, HORA_MIN(opts->struct_size, sizeof(o)));
    /* A struct from before the shape ends after `compression`, maybe with
     * padding where `ndims` now is: the shape counts only when whole. */
    if (opts->struct_size < offsetof(hora_allreduce_options, dims) + sizeof(o.dims)) {
      o.ndims = -1;
      o.dims = NULL;
    }
  }
  struct hora__shape shape;
  HORA_CHECK(hora__shape_check("hora_allreduce_async_ex", o.ndims, o.dims, count, &shape));
  if (!isfinite(o.prescale) || !isfinite(o.postscale)) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_allreduce_async_ex: prescale %g or postscale %g "
                       "is not a finite number", o.prescale, o.postscale);
  }
  if (o.compression < HORA_COMPRESSION_DEFAULT || o.compression > HORA_COMPRESSION_BF16) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_allreduce_async_ex: unknown compression %d",
                       o.compression);
  }
  HORA_CHECK(hora__check_allreduce_dtype(opts ? "hora_allreduce_async_ex" : "hora_allreduce_async",
                                         name, dtype, op, o.prescale, o.postscale));
  int rc = HORA_SUCCESS;
  struct hora__runtime *rt = running(&rc, "hora_allreduce_async");
  if (!rt) {
    return rc;
  }
  struct hora_request *r = request_new(HORA_KIND_ALLREDUCE);
  if (!r) {
    return leave(HORA_ERR_NO_MEMORY);
  }
  int compression = o.compression == HORA_COMPRESSION_DEFAULT ? compression_setting() : o.compression;
  r->meta.dtype = (uint8_t)dtype;
  r->meta.op = (uint8_t)op;
  r->meta.count = count;
  r->meta.prescale = o.prescale;
  r->meta.postscale = o.postscale;
  /* Only float32 and float64 are narrowed on the wire. */
  r->meta.compression = (uint8_t)(dtype == HORA_FLOAT32 || dtype == HORA_FLOAT64 ? compression : 0);
  set_shape(r, &shape);
  r->sendbuf = sendbuf;
  r->recvbuf = recvbuf;
  r->stream = stream;
  return leave(submit(rt, r, name, req));
}

HORA_EXTERN int hora_allreduce_async(const char *name, const void *sendbuf, void *recvbuf,
                                     size_t count, hora_dtype dtype, hora_op op,
                                     hora_request **req) {
  return hora_allreduce_async_ex(name, sendbuf, recvbuf, count, dtype, op, NULL, req);
}

HORA_EXTERN int hora_broadcast_async(const char *name, void *buf, size_t count, hora_dtype dtype,
                                     int root, hora_request **req) {
  return hora__broadcast_submit(name, buf, count, dtype, root, NULL, NULL, req);
}

HORA_EXTERN int hora_broadcast_async_ex(const char *name, void *buf, size_t count, hora_dtype dtype,
                                        int root, const hora_op_options *opts, hora_request **req) {
  return hora__broadcast_submit(name, buf, count, dtype, root, opts, NULL, req);
}

int hora__broadcast_submit(const char *name, void *buf, size_t count, hora_dtype dtype, int root,
                           const hora_op_options *opts, void *stream, hora_request **req) {
  hora__error_clear();
  HORA_CHECK(check_common("hora_broadcast_async", name, count, dtype, req, 1));
  if (count > 0 && !buf) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_broadcast_async: buf is NULL");
  }
  struct hora__shape shape;
  HORA_CHECK(op_options_shape("hora_broadcast_async_ex", opts, count, &shape));
  int rc = HORA_SUCCESS;
  struct hora__runtime *rt = running(&rc, "hora_broadcast_async");
  if (!rt) {
    return rc;
  }
  if (root < 0 || root >= rt->size) {
    return leave(hora__error(HORA_ERR_INVALID_ARG,
                             "hora_broadcast_async: root %d is out of range (the job has %d ranks)",
                             root, rt->size));
  }
  struct hora_request *r = request_new(HORA_KIND_BROADCAST);
  if (!r) {
    return leave(HORA_ERR_NO_MEMORY);
  }
  r->meta.dtype = (uint8_t)dtype;
  r->meta.count = count;
  r->meta.root = root;
  set_shape(r, &shape);
  r->sendbuf = buf;
  r->recvbuf = buf;
  r->stream = stream;
  return leave(submit(rt, r, name, req));
}

HORA_EXTERN int hora_allgather_async(const char *name, const void *sendbuf, size_t count,
                                     hora_dtype dtype, void *recvbuf, hora_request **req) {
  return hora__allgather_submit(name, sendbuf, count, dtype, recvbuf, NULL, NULL, req);
}

HORA_EXTERN int hora_allgather_async_ex(const char *name, const void *sendbuf, size_t count,
                                        hora_dtype dtype, void *recvbuf,
                                        const hora_op_options *opts, hora_request **req) {
  return hora__allgather_submit(name, sendbuf, count, dtype, recvbuf, opts, NULL, req);
}

int hora__allgather_submit(const char *name, const void *sendbuf, size_t count, hora_dtype dtype,
                           void *recvbuf, const hora_op_options *opts, void *stream,
                           hora_request **req) {
  hora__error_clear();
  int rc = HORA_SUCCESS;
  struct hora__runtime *rt = running(&rc, "hora_allgather_async");
  if (!rt) {
    if (req) {
      *req = NULL;
    }
    return req ? rc : hora__error(HORA_ERR_INVALID_ARG, "hora_allgather_async: req is NULL");
  }
  rc = check_common("hora_allgather_async", name, count, dtype, req, (size_t)rt->size);
  if (rc != HORA_SUCCESS) {
    return leave(rc);
  }
  if (count > 0 && (!sendbuf || !recvbuf)) {
    return leave(hora__error(HORA_ERR_INVALID_ARG, "hora_allgather_async: %s is NULL",
                             sendbuf ? "recvbuf" : "sendbuf"));
  }
  struct hora__shape shape;
  rc = op_options_shape("hora_allgather_async_ex", opts, count, &shape);
  if (rc != HORA_SUCCESS) {
    return leave(rc);
  }
  struct hora_request *r = request_new(HORA_KIND_ALLGATHER);
  if (!r) {
    return leave(HORA_ERR_NO_MEMORY);
  }
  r->meta.dtype = (uint8_t)dtype;
  r->meta.count = count;
  set_shape(r, &shape);
  r->sendbuf = sendbuf;
  r->recvbuf = recvbuf;
  r->stream = stream;
  return leave(submit(rt, r, name, req));
}

/* hora_wait_stream (hora_cuda.h): the caller's stream waits for the
 * results; the host waits only until the operation is queued. */
int hora__wait_stream(hora_request **req, void *stream) {
  hora__error_clear();
  if (!req || !*req) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_wait_stream: %s is NULL", req ? "*req" : "req");
  }
  struct hora_request *r = *req;
  if (!r->done_event) {
    return hora_wait(req); /* not stream-ordered: a plain wait */
  }
  if (!atomic_load_explicit(&r->done, memory_order_acquire)) {
    int rc = HORA_SUCCESS;
    struct hora__runtime *rt = running(&rc, "hora_wait_stream");
    if (!rt) {
      return rc;
    }
    wait_done(rt, r);
    leave(HORA_SUCCESS);
  }
  int status = r->status;
  if (status == HORA_SUCCESS) {
    /* A failed job's results may never come: no stream waits for them. */
    status = job_failed(r);
  }
  if (status == HORA_SUCCESS) {
    status = hora__gpu_stream_wait_event(stream, r->done_event);
  } else if (r->status != HORA_SUCCESS) {
    hora__error_set_message(r->error);
  }
  request_free(r);
  *req = NULL;
  return status;
}

HORA_EXTERN int hora_allreduce(const char *name, const void *sendbuf, void *recvbuf, size_t count,
                               hora_dtype dtype, hora_op op) {
  hora_request *r = NULL;
  HORA_CHECK(hora_allreduce_async(name, sendbuf, recvbuf, count, dtype, op, &r));
  return hora_wait(&r);
}

HORA_EXTERN int hora_broadcast(const char *name, void *buf, size_t count, hora_dtype dtype,
                               int root) {
  hora_request *r = NULL;
  HORA_CHECK(hora_broadcast_async(name, buf, count, dtype, root, &r));
  return hora_wait(&r);
}

HORA_EXTERN int hora_allgather(const char *name, const void *sendbuf, size_t count,
                               hora_dtype dtype, void *recvbuf) {
  hora_request *r = NULL;
  HORA_CHECK(hora_allgather_async(name, sendbuf, count, dtype, recvbuf, &r));
  return hora_wait(&r);
}

static int run_internal(uint8_t kind, const char *call, int *last_joined) {
  hora__error_clear();
  int rc = HORA_SUCCESS;
  struct hora__runtime *rt = running(&rc, call);
  if (!rt) {
    return rc;
  }
  struct hora_request *r = request_new(kind);
  if (!r) {
    return leave(HORA_ERR_NO_MEMORY);
  }
  hora_request *q = NULL;
  rc = submit(rt, r, NULL, &q);
  if (rc != HORA_SUCCESS) {
    return leave(rc);
  }
  /* Read before wait_request frees it. */
  while (!atomic_load_explicit(&q->done, memory_order_acquire)) {
    pthread_mutex_lock(&rt->mu);
    while (!atomic_load_explicit(&q->done, memory_order_acquire)) {
      pthread_cond_wait(&rt->done_cv, &rt->mu);
    }
    pthread_mutex_unlock(&rt->mu);
  }
  if (last_joined) {
    *last_joined = q->last_joined;
  }
  return leave(finish(&q));
}

HORA_EXTERN int hora_barrier(void) { return run_internal(HORA_KIND_BARRIER, "hora_barrier", NULL); }

HORA_EXTERN int hora_broadcast_parameters(const hora_tensor *tensors, size_t n, int root) {
  hora__error_clear();
  if (n > 0 && !tensors) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_broadcast_parameters: tensors is NULL");
  }
  hora_request **reqs = hora__calloc(n ? n : 1, sizeof(*reqs));
  if (!reqs) {
    return HORA_ERR_NO_MEMORY;
  }
  /* Submit all, then wait for all, so the engine can fuse them. */
  int first = HORA_SUCCESS;
  char first_msg[1024] = "";
  size_t submitted = 0;
  for (size_t i = 0; i < n; i++) {
    int rc = hora_broadcast_async(tensors[i].name, tensors[i].buf, tensors[i].count,
                                  tensors[i].dtype, root, &reqs[i]);
    if (rc != HORA_SUCCESS) {
      first = rc;
      snprintf(first_msg, sizeof(first_msg), "hora_broadcast_parameters: tensor %zu: %s", i,
               hora_last_error());
      break;
    }
    submitted++;
  }
  for (size_t i = 0; i < submitted; i++) {
    int rc = hora_wait(&reqs[i]);
    if (rc != HORA_SUCCESS && first == HORA_SUCCESS) {
      first = rc;
      snprintf(first_msg, sizeof(first_msg), "hora_broadcast_parameters: tensor %zu: %s", i,
               hora_last_error());
    }
  }
  free(reqs);
  if (first != HORA_SUCCESS) {
    return hora__error(first, "%s", first_msg);
  }
  hora__error_clear();
  return HORA_SUCCESS;
}

HORA_EXTERN int hora_get_stats(hora_stats *stats) {
  hora__error_clear();
  if (!stats) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_get_stats: stats is NULL");
  }
  if (stats->struct_size < offsetof(hora_stats, operations) + sizeof(uint64_t) ||
      stats->struct_size > (1u << 16)) {
    return hora__error(HORA_ERR_INVALID_ARG,
                       "hora_get_stats: stats->struct_size is %zu; set it to sizeof(hora_stats)",
                       stats->struct_size);
  }
  int rc = HORA_SUCCESS;
  struct hora__runtime *rt = running(&rc, "hora_get_stats");
  if (!rt) {
    return rc;
  }
  hora_stats s;
  memset(&s, 0, sizeof(s));
  s.struct_size = sizeof(s);
  s.allreduces = atomic_load(&rt->stats.allreduces);
  s.broadcasts = atomic_load(&rt->stats.broadcasts);
  s.allgathers = atomic_load(&rt->stats.allgathers);
  s.operations = s.allreduces + s.broadcasts + s.allgathers;
  s.bytes = atomic_load(&rt->stats.bytes);
  s.fused_batches = atomic_load(&rt->stats.fused_batches);
  s.fused_tensors = atomic_load(&rt->stats.fused_tensors);
  s.cache_hits = atomic_load(&rt->stats.cache_hits);
  s.cache_misses = atomic_load(&rt->stats.cache_misses);
  s.negotiate_seconds = (double)atomic_load(&rt->stats.negotiate_ns) * 1e-9;
  s.communicate_seconds = (double)atomic_load(&rt->stats.communicate_ns) * 1e-9;
  s.copy_seconds = (double)atomic_load(&rt->stats.copy_ns) * 1e-9;
  s.direct_bytes = rt->comm ? __atomic_load_n(&rt->comm->proc->direct_bytes, __ATOMIC_RELAXED) : 0;
  s.kernel_bytes = rt->comm ? __atomic_load_n(&rt->comm->proc->kernel_bytes, __ATOMIC_RELAXED) : 0;
  s.staged_bytes = rt->comm ? __atomic_load_n(&rt->comm->proc->staged_bytes, __ATOMIC_RELAXED) : 0;
  s.cycles = atomic_load(&rt->stats.cycles);
  s.sent_in_full = atomic_load(&rt->stats.sent_in_full);
  size_t keep = stats->struct_size;
  memcpy(stats, &s, HORA_MIN(keep, sizeof(s)));
  stats->struct_size = keep;
  return leave(HORA_SUCCESS);
}

HORA_EXTERN int hora_join(int *last_joined_rank) {
  int last = -1;
  int rc = run_internal(HORA_KIND_JOIN, "hora_join", &last);
  if (last_joined_rank) {
    *last_joined_rank = rc == HORA_SUCCESS ? last : -1;
  }
  return rc;
}

/* Only rank 0 writes the timeline; the coordinator keeps writing events
 * while the file is swapped (timeline.c locks). */
HORA_EXTERN int hora_start_timeline(const char *path, int mark_cycles) {
  hora__error_clear();
  if (!path || !path[0]) {
    return hora__error(HORA_ERR_INVALID_ARG, "hora_start_timeline: path is %s",
                       path ? "empty" : "NULL");
  }
  int rc = HORA_SUCCESS;
  struct hora__runtime *rt = running(&rc, "hora_start_timeline");
  if (!rt) {
    return rc;
  }
  if (rt->rank == 0) {
    rc = hora__timeline_open(path, mark_cycles != 0, "hora_start_timeline");
  }
  return leave(rc);
}

HORA_EXTERN int hora_stop_timeline(void) {
  hora__error_clear();
  int rc = HORA_SUCCESS;
  struct hora__runtime *rt = running(&rc, "hora_stop_timeline");
  if (!rt) {
    return rc;
  }
  if (rt->rank == 0) {
    hora__timeline_close();
  }
  return leave(HORA_SUCCESS);
}

HORA_EXTERN int hora_mem_alloc(size_t bytes, void **ptr) {
  hora__error_clear();
  return hora__mem_alloc(bytes, ptr);
}

HORA_EXTERN int hora_mem_free(void *ptr) {
  hora__error_clear();
  return hora__mem_free(ptr);
}
