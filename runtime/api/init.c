/* The runtime's life: hora_init (settings, the rendezvous, the
 * communicator, the coordinator), hora_finalize (every rank agrees that the
 * job is over), hora_abort, the rank getters, and the count of the calls
 * using the runtime, which hora_finalize waits out before it frees the
 * runtime. What MPI adds (starting and finalizing it, hora_init_comm) is
 * api_mpi.c, built with MPI only: this file needs no mpi.h.
 *
 * Lock order: lifecycle_mu, then the elastic membership's (api/elastic.c),
 * then a runtime's rt->mu. */
#include <openssl/crypto.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "comm/coll/collectives.h"
#include "comm/comm.h"
#include "comm/communicator/communicator.h"
#include "base/log.h"
#include "base/params.h"
#include "runtime/negotiate/cycle.h"
#include "runtime/observe/metrics.h"
#include "runtime/runtime.h"
#include "runtime/observe/steps.h"
#include "runtime/observe/timeline.h"

/* The running runtime, or NULL. Published after it is fully set up. */
static struct hora__runtime *_Atomic current;
/* Serialises hora_init and hora_finalize. */
static pthread_mutex_t lifecycle_mu = PTHREAD_MUTEX_INITIALIZER;
/* hora_finalize finalized an MPI that hora_init had initialised: MPI cannot
 * start again in this process. */
static atomic_bool mpi_finalized_by_hora; /* read by any caller's error message */

/* Calls that are using the runtime right now. hora_finalize frees it only
 * when none is left: threads its shutdown woke (waiters, a barrier) are
 * still on their way out. Counted before `current` is read, so a call that
 * sees the runtime is always counted. */
static atomic_int api_users;

/* The runtime, counted as in use until hora__api_leave(); NULL (and *rc
 * set) if there is none. */
struct hora__runtime *hora__api_running(int *rc, const char *call) {
  atomic_fetch_add(&api_users, 1);
  struct hora__runtime *rt = atomic_load(&current);
  if (!rt) {
    atomic_fetch_sub(&api_users, 1);
    *rc = hora__error(HORA_ERR_INVALID_USAGE, "%s: hora_init has not been called%s", call,
                      atomic_load(&mpi_finalized_by_hora) ? " (or hora_finalize has)" : "");
  }
  return rt;
}

struct hora__runtime *hora__world_runtime(void) { return atomic_load(&current); }

int hora__api_leave(int rc) {
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
  pthread_mutex_destroy(&rt->progress_mu);
  pthread_cond_destroy(&rt->done_cv);
  hora__fate_release(rt->fate);
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

/* The world's memberships in this process, numbered: each communicator's
 * connections prove a key derived from its epoch. */
static uint64_t world_epoch;
/* How the running world started (hora-info, the log). */
static struct hora__rdv_choice started_by;

/* The rendezvous a choice names. Through MPI, MPI starts first unless the
 * program has started it (*owns_mpi), and the world keeps the
 * communicator. */
static int open_rendezvous(const struct hora__rdv_choice *c, const void *mpi_comm, bool start_mpi,
                           bool *owns_mpi, struct hora__rdv **out) {
#if HORA_HAVE_MPI
  if (c->kind == HORA_RDV_MPI) {
    if (start_mpi) {
      HORA_CHECK(hora__mpi_start());
      *owns_mpi = true;
    }
    return hora__mpi_open(mpi_comm, out);
  }
#endif
  return hora__rdv_open(c, hora__params.CONNECT_TIMEOUT_SECONDS, out);
}

/* The world's share of MPI given back (its communicator), and MPI itself
 * when `finalize` (hora started it; it cannot start again). */
static void end_mpi(bool finalize) {
#if HORA_HAVE_MPI
  hora__mpi_world_end(finalize);
  if (finalize) {
    atomic_store(&mpi_finalized_by_hora, true);
  }
#else
  (void)finalize; /* nothing of MPI ever started */
#endif
}

/* mpi_comm: hora_init_comm's MPI_Comm, or NULL (hora_init). */
static int init_locked(const void *mpi_comm) {
  bool mpi_running = false, mpi_finalized = false;
#if HORA_HAVE_MPI
  hora__mpi_state(&mpi_running, &mpi_finalized);
#endif
  if (mpi_comm && !mpi_running) {
    return hora__error(HORA_ERR_INVALID_USAGE,
                       "hora_init_comm: MPI is not running, so there can be no communicator");
  }
  /* Settings first: a bad value must not leave MPI half started. */
  int prc = hora__params_load();
  if (prc == HORA_SUCCESS) {
    prc = hora__metrics_check_settings();
  }
  char perr[1024];
  hora__strlcpy(perr, hora__error_message(), sizeof(perr));
  if (prc == HORA_SUCCESS) {
    prc = hora__log_open();
    hora__strlcpy(perr, hora__error_message(), sizeof(perr));
  }
  struct hora__rdv_choice choice;
  const char *mpi_var = NULL;
  int rc = HORA_SUCCESS;
  if (prc == HORA_SUCCESS) {
    rc = hora__rdv_choose(mpi_running, &choice);
  } else if (HORA_HAVE_MPI && (mpi_comm || mpi_running || hora__rdv_mpi_launched(&mpi_var))) {
    /* Under MPI the others still learn of the bad setting (below). */
    memset(&choice, 0, sizeof(choice));
    choice.kind = HORA_RDV_MPI;
  } else {
    /* The start-up's own settings cannot be trusted: the others time out
     * waiting for this process, naming it. (Without MPI in the build, an
     * MPI launcher's job fails the same way.) */
    return hora__error(prc, "%s", perr);
  }
  if (rc != HORA_SUCCESS) {
    return rc; /* the variables are wrong here: nothing was started */
  }
  if (choice.rank >= 0 && choice.kind != HORA_RDV_MPI) {
    hora__log_set_rank(choice.rank); /* the launcher's: the rendezvous may refuse it */
  }
  if (mpi_comm) {
    choice.kind = HORA_RDV_MPI;
    snprintf(choice.why, sizeof(choice.why), "hora_init_comm");
  }
  if (choice.kind == HORA_RDV_MPI && (mpi_finalized || atomic_load(&mpi_finalized_by_hora))) {
    return hora__error(HORA_ERR_INVALID_USAGE,
                       "hora_init: MPI has been finalized in this process (by %s), and MPI cannot "
                       "start twice",
                       atomic_load(&mpi_finalized_by_hora) ? "hora_finalize" : "the program");
  }
  if (prc == HORA_SUCCESS && hora__elastic_is_newcomer(&choice)) {
    /* A process started later: it joins the running job at a commit point. */
    rc = hora__elastic_join_locked(&choice);
    if (rc == HORA_SUCCESS) {
      if (atomic_load(&current)) {
        hora__metrics_api_start(atomic_load(&current));
      }
      started_by = choice;
      OPENSSL_cleanse(started_by.secret, sizeof(started_by.secret));
    }
    OPENSSL_cleanse(choice.secret, sizeof(choice.secret));
    return rc;
  }
  bool owns_mpi = false;
  struct hora__rdv *rdv = NULL;
  rc = open_rendezvous(&choice, mpi_comm, !mpi_running, &owns_mpi, &rdv);
  /* Rank 0's timeline file is one of those settings: a path it cannot
   * write fails every rank here, not just rank 0 later. */
  if (rc == HORA_SUCCESS && prc == HORA_SUCCESS && rdv->rank == 0 && hora__params.TIMELINE[0]) {
    prc = hora__timeline_open(hora__params.TIMELINE, hora__params.TIMELINE_MARK_CYCLES,
                              "HORA_TIMELINE");
    if (prc != HORA_SUCCESS) {
      hora__strlcpy(perr, hora__error_message(), sizeof(perr));
    }
  }
  /* Every rank learns whether any rank's settings were bad, so none is left
   * waiting in the bootstrap for one that gave up. */
  if (rc == HORA_SUCCESS) {
    int worst = prc;
    rc = hora__rdv_min(rdv, -prc, 1 - HORA_RESULT_COUNT_, 0, "its settings check's result",
                       &worst);
    if (rc == HORA_SUCCESS && prc != HORA_SUCCESS) {
      rc = hora__error(prc, "%s", perr);
    } else if (rc == HORA_SUCCESS && worst != HORA_SUCCESS) {
      rc = hora__error(-worst, "hora_init failed on another rank because of its HORA_* settings");
    }
  }
  struct hora__runtime *rt = NULL;
  if (rc == HORA_SUCCESS) {
    HORA_INFO("start-up: %s rendezvous (%s)%s%s", hora__rdv_kind_name(choice.kind), choice.why,
              choice.where[0] ? " at " : "", choice.where);
    rc = hora__instance_start(rdv, 0, NULL, &rt);
    if (rc == HORA_SUCCESS) {
      rc = hora__elastic_begin(rdv, rt, &choice);
      if (rc != HORA_SUCCESS) {
        char msg[1024];
        hora__strlcpy(msg, hora__error_message(), sizeof(msg));
        hora__instance_stop(rt);
        hora__instance_release(rt);
        hora__elastic_end();
        rt = NULL;
        hora__error(rc, "%s", msg);
      }
    }
  }
  hora__rdv_close(rdv);
  if (rc != HORA_SUCCESS) {
    hora__timeline_close();
    end_mpi(owns_mpi);
    return rc;
  }
  rt->owns_mpi = owns_mpi;
  started_by = choice;
  OPENSSL_cleanse(started_by.secret, sizeof(started_by.secret));
  OPENSSL_cleanse(choice.secret, sizeof(choice.secret));
  atomic_store_explicit(&current, rt, memory_order_release);
  hora__metrics_api_start(rt);
  return HORA_SUCCESS;
}

/* A runtime over comm: the job's world (set_id 0), or a process set's. */
int hora__instance_start(struct hora__rdv *rdv, int set_id, const int *global_ranks,
                         struct hora__runtime **out) {
  int rc = HORA_SUCCESS;
  struct hora__runtime *rt = hora__calloc(1, sizeof(*rt));
  if (!rt) {
    return HORA_ERR_NO_MEMORY;
  }
  rt->wake_fd = -1;
  rt->set_id = set_id;
  rt->global_ranks = global_ranks;
  atomic_init(&rt->refs, 1);
  if (set_id > 0) {
    snprintf(rt->label, sizeof(rt->label), "process set %d: ", set_id);
  } else {
    hora__steps_reset(); /* the steps of this hora_init's runtime */
  }
  pthread_mutex_init(&rt->mu, NULL);
  pthread_mutex_init(&rt->progress_mu, NULL);
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
  /* A process set's runtime lives in the world's process: its topology
   * (hwloc's load is some 15 ms) is the world's. */
  struct hora__runtime *world = set_id ? hora__world_runtime() : NULL;
  if (world) {
    rt->topo = world->topo;
  } else {
    HORA_CHECK_GOTO(hora__topology_probe(&rt->topo), rc, fail);
  }
  /* The control plane: the star around rank 0 (the bootstrap's own) and
   * the cycles' partners. */
  int my_rank = rdv->rank, my_size = rdv->size, ctrl_peers[32], nctrl = 0;
  struct hora__cycle_partners cp;
  hora__cycle_partners(my_rank, my_size, &cp);
  if (cp.fold >= 0) {
    ctrl_peers[nctrl++] = cp.fold;
  }
  for (int i = 0; i < cp.nrounds; i++) {
    ctrl_peers[nctrl++] = cp.round[i];
  }
  if (set_id == 0) {
    hora__log_set_rank(my_rank); /* the log names the world's ranks, from the bootstrap on */
    hora__params_log_horovod();
  }
  uint64_t epoch = set_id == 0 ? world_epoch + 1 : 0;
  HORA_CHECK_GOTO(hora__comm_create(rdv, epoch, ctrl_peers, nctrl, &rt->comm), rc, fail);
  if (set_id == 0) {
    world_epoch = rt->comm->proc->epoch;
  }
  rt->rank = rt->comm->rank;
  rt->size = rt->comm->size;
  rt->comm->net->names = global_ranks;
  rt->comm->device_local_rank = world ? world->comm->local_rank : rt->comm->local_rank;
  /* Spinning only pays when every local rank has a core of its own. */
  rt->comm->net->spin_us = rt->comm->local_size <= rt->topo.pus ? (int)hora__params.SPIN_TIME_US : 0;
  rt->spin_us = rt->comm->net->spin_us;
  if (set_id == 0) {
    if (rt->rank == 0) {
      hora__params_log();
      char nums[96];
      hora__cost_format(&rt->comm->model.link, nums, sizeof(nums));
      HORA_INFO("cost model: HORA_COST_MODEL=%s, %s", nums, rt->comm->model.source);
      if (hora__params.TIMELINE[0] && !hora__timeline_enabled()) {
        /* A rank 0 chosen by an elastic reset: it writes the timeline now. */
        HORA_CHECK_GOTO(hora__timeline_open(hora__params.TIMELINE,
                                            hora__params.TIMELINE_MARK_CYCLES, "HORA_TIMELINE"),
                        rc, fail);
      }
    }
    log_startup(rt);
  } else if (rt->rank == 0) {
    const hora__comm *c = rt->comm;
    HORA_INFO("process set %d: %d ranks (global %d..%d) on %d host(s); allreduce %s", set_id,
              c->size, global_ranks[0], global_ranks[c->size - 1], c->cross_size,
              !c->shm_host && !c->hierarchical ? "over the connections (by the cost model)"
              : c->cross_size > 1                         ? "hierarchical (shared memory, then "
                                                            "across hosts)"
                                                          : "in shared memory");
    HORA_INFO("process set %d: cost model %s", set_id, c->model.source);
  }
  HORA_CHECK_GOTO(hora__engine_start(rt), rc, fail);
  *out = rt;
  return HORA_SUCCESS;
fail:
  hora__instance_release(rt);
  return rc;
}

/* Agrees with the set's ranks that it is over, stops its coordinator (every
 * request it held has then completed) and frees its data plane. */
void hora__instance_stop(struct hora__runtime *rt) {
  struct hora_request *r = hora__request_new(HORA_KIND_SHUTDOWN);
  if (r) {
    hora_request *q = NULL;
    if (hora__request_submit(rt, r, NULL, &q) == HORA_SUCCESS) {
      hora__request_wait(rt, &q);
    }
  }
  hora__engine_join(rt);
  hora__comm_destroy(rt->comm);
  pthread_mutex_lock(&rt->mu);
  rt->comm = NULL;
  close(rt->wake_fd);
  rt->wake_fd = -1;
  pthread_mutex_unlock(&rt->mu);
}

/* Drops a reference; the last frees what stop left (the locks, the table). */
void hora__instance_release(struct hora__runtime *rt) {
  if (rt && atomic_fetch_sub(&rt->refs, 1) == 1) {
    runtime_free(rt);
  }
}

int hora__init(const void *mpi_comm) {
  hora__error_clear();
  pthread_mutex_lock(&lifecycle_mu);
  int rc = atomic_load(&current) ? HORA_SUCCESS : init_locked(mpi_comm);
  pthread_mutex_unlock(&lifecycle_mu);
  return rc;
}

HORA_EXTERN int hora_init(void) { return hora__init(NULL); }

HORA_EXTERN int hora_initialized(void) { return atomic_load(&current) != NULL; }

HORA_EXTERN const char *hora_bootstrap(void) {
  return atomic_load(&current) ? hora__rdv_kind_name(started_by.kind) : NULL;
}

/* The world's runtime stopped with its members' agreement (process sets
 * first), waited out and freed; NULL afterwards. Caller holds lifecycle_mu. */
static int world_stop_locked(struct hora__runtime *rt) {
  hora__process_sets_finalize();
  struct hora_request *r = hora__request_new(HORA_KIND_SHUTDOWN);
  if (r) {
    hora_request *q = NULL;
    if (hora__request_submit(rt, r, NULL, &q) == HORA_SUCCESS) {
      hora__request_wait(rt, &q);
    }
  }
  atomic_store(&current, NULL);
  hora__engine_join(rt);
  hora__api_leave(HORA_SUCCESS);
  while (atomic_load(&api_users) > 0) {
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
  int fatal = atomic_load(&rt->fatal_code);
  if (fatal != HORA_SUCCESS) {
    hora__error(fatal, "%s", rt->fatal_msg);
  }
  runtime_free(rt);
  return fatal;
}

HORA_EXTERN int hora_finalize(void) {
  hora__error_clear();
  pthread_mutex_lock(&lifecycle_mu);
  int rc = HORA_SUCCESS;
  /* Its last file write sees the world's final counters. */
  hora__metrics_api_stop();
  struct hora__runtime *rt = hora__api_running(&rc, "hora_finalize");
  if (!rt && hora__elastic_open()) {
    /* A reset failed for good: the world is gone (and MPI's communicator
     * with it) but the membership lives on: its listener and thread, rank
     * 0's door, members queued here, who learn now that it has ended. MPI
     * is left alone: processes were lost, MPI_Finalize could wait for them. */
    hora__error_clear();
    hora__elastic_end();
    hora__timeline_close();
    hora__log_close();
    pthread_mutex_unlock(&lifecycle_mu);
    return HORA_SUCCESS;
  }
  if (!rt) {
    pthread_mutex_unlock(&lifecycle_mu);
    return rc;
  }
  /* The process sets first, in the order they were made (each is over when
   * its members agree), then the world: every rank agrees the job is over. */
  bool owns_mpi = rt->owns_mpi;
  hora__elastic_quiet();
  int fatal = world_stop_locked(rt);
  if (owns_mpi && hora__elastic_lost_members()) {
    HORA_INFO("hora_finalize: not finalizing MPI: processes of the job were lost, and "
              "MPI_Finalize could wait for them");
    owns_mpi = false;
  }
  hora__elastic_end();
  char msg[1024];
  hora__strlcpy(msg, fatal != HORA_SUCCESS ? hora__error_message() : "", sizeof(msg));
  hora__timeline_close();
  if (owns_mpi && fatal != HORA_SUCCESS) {
    /* A peer is gone: MPI_Finalize could wait for it forever. The process
     * is expected to exit with an error now. */
    HORA_WARN("hora_finalize: not finalizing MPI after a fatal error (%s)", hora_strerror(fatal));
  }
  end_mpi(owns_mpi && fatal == HORA_SUCCESS);
  hora__log_close();
  pthread_mutex_unlock(&lifecycle_mu);
  if (fatal != HORA_SUCCESS) {
    return hora__error(fatal, "%s", msg);
  }
  return HORA_SUCCESS;
}

void hora__lifecycle_lock(void) { pthread_mutex_lock(&lifecycle_mu); }
void hora__lifecycle_unlock(void) { pthread_mutex_unlock(&lifecycle_mu); }

int hora__world_rebuild(const struct hora__rdv_tcp_spec *spec) {
  hora__error_clear();
  pthread_mutex_lock(&lifecycle_mu);
  int rc = hora__world_rebuild_locked(spec);
  pthread_mutex_unlock(&lifecycle_mu);
  return rc;
}

int hora__world_rebuild_locked(const struct hora__rdv_tcp_spec *spec) {
  int rc = HORA_SUCCESS;
  atomic_fetch_add(&api_users, 1); /* world_stop_locked leaves */
  struct hora__runtime *old = atomic_load(&current);
  if (!old) {
    atomic_fetch_sub(&api_users, 1);
  }
  bool owns_mpi = old && old->owns_mpi;
  if (old && world_stop_locked(old) != HORA_SUCCESS) {
    /* The failure belonged to that membership, not to this process. */
    HORA_INFO("the previous membership ended with: %s", hora__error_message());
    hora__error_clear();
  }
  end_mpi(false); /* an MPI communicator names the old membership's ranks */
  struct hora__rdv *rdv = NULL;
  struct hora__runtime *rt = NULL;
  if (spec) {
    rc = hora__rdv_open_tcp(spec, &rdv);
    if (rc == HORA_SUCCESS) {
      rc = hora__instance_start(rdv, 0, NULL, &rt);
    }
    hora__rdv_close(rdv);
  }
  if (rt) {
    rt->owns_mpi = owns_mpi;
    if (started_by.kind == HORA_RDV_SINGLE || started_by.kind == HORA_RDV_MPI) {
      started_by.kind = HORA_RDV_TCP;
    }
    atomic_store_explicit(&current, rt, memory_order_release);
    hora__metrics_api_identity(rt);
  }
  return rc;
}

HORA_EXTERN int hora_abort(const char *reason) {
  hora__error_clear();
  int rc = HORA_SUCCESS;
  struct hora__runtime *rt = hora__api_running(&rc, "hora_abort");
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
  return hora__api_leave(HORA_SUCCESS);
}

#define RANK_GETTER(fn, field)                         \
  HORA_EXTERN int fn(void) {                           \
    atomic_fetch_add(&api_users, 1);                   \
    struct hora__runtime *rt = atomic_load(&current);  \
    return hora__api_leave(rt ? rt->comm->field : -1); \
  }
RANK_GETTER(hora_rank, rank)
RANK_GETTER(hora_size, size)
RANK_GETTER(hora_local_rank, local_rank)
RANK_GETTER(hora_local_size, local_size)
RANK_GETTER(hora_cross_rank, cross_rank)
RANK_GETTER(hora_cross_size, cross_size)
