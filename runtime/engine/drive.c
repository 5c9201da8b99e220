/* Callers driving the engine while they wait (see hora__engine_drive in
 * runtime.h). As MPI's progress does, the waiting caller runs the engine's
 * steps itself instead of waiting for the coordinator thread to notice its
 * submission and then being woken by it: each of those hand-offs costs a
 * context switch. One thread at a time holds the engine (rt->progress_mu);
 * the coordinator keeps everything else: its sleep between operations,
 * the fatal path, device work (its thread has the GPU current).
 *
 * With a core to spare (spin_us > 0) the caller polls, yielding, for at
 * most spin_us. Where the host has more ranks than cores nothing spins: the
 * caller sleeps in poll() on the control connections itself, as the
 * coordinator would, for as long as its request takes. */
#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include "comm/shm/shm.h"
#include "runtime/engine/engine.h"
#include "runtime/observe/timeline.h"

/* Under mu: once the caller has let go of the engine, hora__instance_stop
 * may close the eventfd (the descriptor number is then another file's).
 * A caller leaving work to it wakes it; one leaving an engine that is not
 * idle wakes it only if it sleeps in its poll() on everything, which would
 * not see what the caller already read. Otherwise it sleeps on the eventfd
 * alone and takes the engine back within a millisecond of the last
 * caller's leaving: a wake-up per small operation cost each a context
 * switch and a fight for progress_mu. */
static void wake_coordinator(struct hora__runtime *rt, bool left_work, bool idle) {
  pthread_mutex_lock(&rt->mu);
  if (rt->wake_fd >= 0 && (left_work || (!idle && rt->coord_polling))) {
    uint64_t one = 1;
    ssize_t w = write(rt->wake_fd, &one, sizeof(one));
    (void)w;
  }
  pthread_mutex_unlock(&rt->mu);
}

/* A caller's failure is the coordinator's to handle (its fatal path). */
static void defer_error(struct hora__engine *e, int rc) {
  e->deferred_rc = rc;
  hora__strlcpy(e->deferred_msg, hora__error_message(), sizeof(e->deferred_msg));
}

/* Whether a caller may take the engine (under progress_mu). */
static bool drivable(const struct hora__engine *e) {
  return e && !e->world->comm->gpu && !e->exited && !e->stop && e->deferred_rc == HORA_SUCCESS;
}

/* One step on the caller's thread; false once it must stop driving (an
 * error, now the coordinator's; the end of the job; device work next). */
static bool caller_step(struct hora__runtime *rt, struct hora__engine *e, const atomic_int *done,
                        bool *busy) {
  int set_id = hora__timeline_thread_get();
  hora__timeline_thread_set(rt->set_id);
  e->on_caller = true;
  e->caller_done = done;
  int rc = hora__engine_step(e, busy);
  e->on_caller = false;
  e->caller_done = NULL;
  hora__timeline_thread_set(set_id);
  if (rc != HORA_SUCCESS) {
    defer_error(e, rc);
  }
  return e->deferred_rc == HORA_SUCCESS && !e->stop && !(e->world->todo && e->world->todo->device);
}

bool hora__engine_drive(struct hora__runtime *rt, const atomic_int *done, uint64_t until_ns) {
  /* The engine is only touched under progress_mu: hora__engine_join frees
   * it under the lock, and the counters live in rt, which outlives it. */
  bool counted = false, left_todo = false, idle = true;
  uint64_t seen = 0;
  while (!atomic_load_explicit(done, memory_order_acquire) && hora__now_ns() < until_ns) {
    bool busy = false;
    if (pthread_mutex_trylock(&rt->progress_mu) == 0) {
      struct hora__engine *e = rt->engine;
      if (!counted && (!e || e->world->comm->gpu)) {
        /* (Device work: the coordinator's thread has the GPU current.) */
        pthread_mutex_unlock(&rt->progress_mu);
        return false;
      }
      if (!counted) {
        atomic_fetch_add_explicit(&rt->engine_drivers, 1, memory_order_acq_rel);
        counted = true;
      }
      bool give_up = !drivable(e);
      if (!give_up) {
        give_up = !caller_step(rt, e, done, &busy);
        seen = atomic_load_explicit(&e->seen_seq, memory_order_relaxed);
        left_todo = e->world->todo != NULL;
        if (give_up || atomic_load_explicit(done, memory_order_acquire)) {
          idle = hora__engine_set_idle(e->world); /* (this caller leaves) */
        }
      }
      pthread_mutex_unlock(&rt->progress_mu);
      if (give_up) {
        break;
      }
    }
    if (!busy) {
      sched_yield();
    }
  }
  if (!counted) {
    return true; /* (spun; the coordinator had the engine all along) */
  }
  atomic_fetch_sub_explicit(&rt->engine_drivers, 1, memory_order_acq_rel);
  /* The coordinator takes over what is left: a request still running, a
   * submission no step took, responses after this caller's, an error. */
  wake_coordinator(rt,
                   !atomic_load_explicit(done, memory_order_acquire) || left_todo ||
                       atomic_load_explicit(&rt->submit_seq, memory_order_acquire) != seen,
                   idle);
  return true;
}

/* The caller's sleep while it drives: poll() on the control connections
 * and the eventfd (submissions from other threads write it: it is marked
 * as the one sleeping), until input or the engine's next timer. */
static int caller_sleep(struct hora__runtime *rt, struct hora__engine *e) {
  if (!hora__engine_sleep_begin(rt, false)) {
    return HORA_SUCCESS;
  }
  struct pollfd *fds = e->caller_pollfds;
  int n = 0;
  fds[n++] = (struct pollfd){.fd = rt->wake_fd, .events = POLLIN};
  int service_from = n;
  n += hora__engine_service_pollfds(e, fds + n, e->npollfds - n);
  return hora__engine_poll(e, fds, n, false, service_from);
}

bool hora__engine_drive_sleeping(struct hora__runtime *rt, const atomic_int *done) {
  if (pthread_mutex_trylock(&rt->progress_mu) != 0) {
    return false; /* the coordinator (or another caller) is at work */
  }
  struct hora__engine *e = rt->engine;
  if (!drivable(e)) {
    pthread_mutex_unlock(&rt->progress_mu);
    return false;
  }
  atomic_fetch_add_explicit(&rt->engine_drivers, 1, memory_order_acq_rel);
  bool stopped = false;
  while (!atomic_load_explicit(done, memory_order_acquire)) {
    bool busy = false;
    if (!caller_step(rt, e, done, &busy)) {
      stopped = true;
      break;
    }
    if (atomic_load_explicit(done, memory_order_acquire)) {
      break;
    }
    if (!busy) {
      int rc = caller_sleep(rt, e);
      if (rc != HORA_SUCCESS) {
        defer_error(e, rc);
        break;
      }
    }
  }
  bool left_work = stopped || e->world->todo != NULL ||
                   !atomic_load_explicit(done, memory_order_acquire) ||
                   atomic_load_explicit(&rt->submit_seq, memory_order_acquire) !=
                       atomic_load_explicit(&e->seen_seq, memory_order_relaxed);
  bool idle = hora__engine_set_idle(e->world);
  atomic_fetch_sub_explicit(&rt->engine_drivers, 1, memory_order_acq_rel);
  pthread_mutex_unlock(&rt->progress_mu);
  wake_coordinator(rt, left_work, idle);
  return true;
}
