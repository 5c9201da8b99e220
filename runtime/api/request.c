/* A caller's request from allocation to its result: naming and submission
 * (the queue and the in-flight table), and the waits (a short spin, then
 * the condition variable; a stream-ordered request's results polled on the
 * GPU). The coordinator completes it (engine/submit.c); the job's fate,
 * which such requests keep after hora_finalize, is in engine/fatal.c. */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "comm/gpu/gpu.h"
#include "base/log.h"
#include "runtime/observe/steps.h"
#include "runtime/runtime.h"

/* ---- requests -------------------------------------------------------------------- */

struct hora_request *hora__request_new(uint8_t kind) {
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

void hora__request_free(struct hora_request *r) {
  if (r) {
    hora__gpu_event_destroy(r->ready_event);
    hora__gpu_event_destroy(r->done_event);
    hora__fate_release(r->fate);
    free(r->error);
    free(r->v_send);
    free(r->v_recv);
    hora__instance_release(r->inst);
    free(r);
  }
}

/* Host or device memory: both buffers of an operation must agree. A
 * caller's stream asks for device memory, and the runtime's stream will
 * wait for the work already queued on it. */
static int classify_memory(struct hora__runtime *rt, struct hora_request *r, const char *call) {
  uint8_t k = r->meta.kind;
  if (k > HORA_KIND_LAST_COLLECTIVE) {
    return HORA_SUCCESS;
  }
  bool send_dev = false, recv_dev = false;
  HORA_CHECK(hora__gpu_is_device(r->sendbuf, &send_dev));
  HORA_CHECK(hora__gpu_is_device(r->recvbuf, &recv_dev));
  /* Both buffers given must agree (one may be NULL where this rank sends
   * or receives nothing: an empty reducescatter block, say). */
  if (r->sendbuf && r->recvbuf && send_dev != recv_dev) {
    return hora__error(HORA_ERR_INVALID_ARG, "%s: %s is device memory but %s is host memory", call,
                       send_dev ? "sendbuf" : "recvbuf", send_dev ? "recvbuf" : "sendbuf");
  }
  r->meta.device = send_dev || recv_dev;
  if (r->meta.device && r->v_result) {
    return hora__error(HORA_ERR_NOT_SUPPORTED, "%s: an _alloc form returns host memory, but "
                       "sendbuf is device memory; pass recvbuf and recv_counts", call);
  }
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

/* Names the request, rejects a name already in flight, and hands the
 * request to the coordinator. Takes ownership of r on every path. */
int hora__request_submit(struct hora__runtime *rt, struct hora_request *r, const char *name,
                         hora_request **out) {
  int rc = HORA_SUCCESS;
  char shown[300];
  r->submit_ns = hora__now_ns();
  if (rt->set_id != 0) {
    atomic_fetch_add(&rt->refs, 1);
    r->inst = rt;
  }
  rc = classify_memory(rt, r, hora__kind_name(r->meta.kind));
  if (rc != HORA_SUCCESS) {
    hora__request_free(r);
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
    rc = hora__error(HORA_ERR_INVALID_USAGE, "%s%s %s is already in flight on rank %d", rt->label,
                     hora__kind_name(r->meta.kind),
                     hora__key_display(r->key, r->key_len, shown, sizeof(shown)),
                     hora__global_rank(rt, rt->rank));
    goto fail;
  }
  if (rt->joined && r->meta.kind != HORA_KIND_ALLREDUCE && r->meta.kind != HORA_KIND_SHUTDOWN) {
    rc = hora__error(HORA_ERR_INVALID_USAGE,
                     "%s %s: rank %d has called hora_join; only allreduce can run until every "
                     "rank has joined",
                     hora__kind_name(r->meta.kind),
                     hora__key_display(r->key, r->key_len, shown, sizeof(shown)),
                     hora__global_rank(rt, rt->rank));
    goto fail;
  }
  rc = hora__group_admit(rt, r);
  if (rc != HORA_SUCCESS) {
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
  if (hora__group_hold(rt, r)) {
    pthread_mutex_unlock(&rt->mu); /* queued by hora_group_end */
    *out = r;
    return HORA_SUCCESS;
  }
  r->next = NULL;
  if (rt->queue_tail) {
    rt->queue_tail->next = r;
  } else {
    rt->queue_head = r;
  }
  rt->queue_tail = r;
  r->queued_ns = hora__now_ns();
  atomic_fetch_add_explicit(&rt->submit_seq, 1, memory_order_release);
  hora__engine_wake_locked(rt);
  pthread_mutex_unlock(&rt->mu);
  *out = r;
  return HORA_SUCCESS;
fail:
  pthread_mutex_unlock(&rt->mu);
  hora__request_free(r);
  return rc;
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
    HORA_CHECK(hora__request_job_failed(r));
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

int hora__request_finish(hora_request **req) {
  struct hora_request *r = *req;
  int status = r->status;
  /* A stream-ordered request completes once queued on the GPU; a plain
   * wait also waits for its results. */
  if (status == HORA_SUCCESS && r->done_event) {
    status = wait_results(r);
    if (status != HORA_SUCCESS) {
      hora__request_free(r);
      *req = NULL;
      return status;
    }
  }
  if (status != HORA_SUCCESS) {
    hora__error_set_message(r->error);
  }
  hora__request_free(r);
  *req = NULL;
  return status;
}

/* Until the coordinator has completed r. */
void hora__request_wait_done(struct hora__runtime *rt, struct hora_request *r) {
  /* Time waited counts as the step's exposed communication (steps.h). */
  bool waits = !atomic_load_explicit(&r->done, memory_order_acquire);
  if (waits) {
    hora__steps_wait_begin();
  }
  /* A short bounded poll catches fast completions without a sleep and a
   * wake-up; oversubscribed hosts skip it (spin_us is 0 there). */
  int spin_us = rt ? rt->spin_us : 0;
  if (spin_us > 0 && !atomic_load_explicit(&r->done, memory_order_acquire)) {
    uint64_t until = hora__now_ns() + (uint64_t)spin_us * 1000;
    if (!hora__engine_drive(rt, &r->done, until)) {
      while (!atomic_load_explicit(&r->done, memory_order_acquire) && hora__now_ns() < until) {
        sched_yield();
      }
    }
  }
  if (spin_us == 0 && rt && !atomic_load_explicit(&r->done, memory_order_acquire)) {
    (void)hora__engine_drive_sleeping(rt, &r->done);
  }
  if (!atomic_load_explicit(&r->done, memory_order_acquire)) {
    pthread_mutex_lock(&rt->mu);
    while (!atomic_load_explicit(&r->done, memory_order_acquire)) {
      pthread_cond_wait(&rt->done_cv, &rt->mu);
    }
    pthread_mutex_unlock(&rt->mu);
  }
  if (waits) {
    hora__steps_wait_end();
  }
}

/* Adds a waited-for request's stages to the counters: only one that ran
 * (every stamp set, in order). */
void hora__request_account_stages(struct hora__runtime *rt, const struct hora_request *r) {
  uint64_t now = hora__now_ns();
  const uint64_t t[] = {r->submit_ns, r->queued_ns, r->taken_ns, r->start_ns, r->ran_ns,
                        r->done_ns, now};
  for (size_t i = 1; i < sizeof(t) / sizeof(t[0]); i++) {
    if (!t[i - 1] || t[i] < t[i - 1]) {
      return;
    }
  }
  atomic_fetch_add(&rt->stats.staged_ops, 1);
  atomic_fetch_add(&rt->stats.submit_ns, t[1] - t[0]);
  atomic_fetch_add(&rt->stats.handoff_ns, t[2] - t[1]);
  atomic_fetch_add(&rt->stats.cycle_ns, t[3] - t[2]);
  atomic_fetch_add(&rt->stats.run_ns, t[4] - t[3]);
  atomic_fetch_add(&rt->stats.complete_ns, t[5] - t[4]);
  atomic_fetch_add(&rt->stats.wake_ns, t[6] - t[5]);
}

int hora__request_wait(struct hora__runtime *rt, hora_request **req) {
  hora__request_wait_done(rt, *req);
  if (rt && (*req)->status == HORA_SUCCESS) {
    hora__request_account_stages(rt, *req);
  }
  return hora__request_finish(req);
}
