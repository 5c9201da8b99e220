/* The fatal path. The first fatal error of a runtime (a lost peer, a stall
 * past the shutdown time, hora_abort) is recorded once, for callers and
 * for stream-ordered requests (the fate); when the coordinator's loop ends
 * on one it is sent to every connected rank (rank 0 passes it on) and to
 * the process's other sets, and every request still in flight fails
 * with it. */
#include <poll.h>
#include <sched.h>
#include <stdlib.h>

#include "base/log.h"
#include "comm/gpu/gpu.h"
#include "runtime/engine/engine.h"
#include "runtime/observe/metrics.h"

void hora__runtime_set_fatal(struct hora__runtime *rt, int code, const char *msg) {
  if (code == HORA_SUCCESS) {
    code = HORA_ERR_SYSTEM; /* a fatal error is never "success": readers wait for a code */
  }
  if (atomic_flag_test_and_set(&rt->fatal_claimed)) {
    /* Another thread records the first error: callers read fatal_msg next,
     * so they wait until it is whole (the code is stored after it). */
    while (atomic_load_explicit(&rt->fatal_code, memory_order_acquire) == HORA_SUCCESS) {
      sched_yield();
    }
    return;
  }
  hora__strlcpy(rt->fatal_msg, msg && msg[0] ? msg : hora_strerror(code), sizeof(rt->fatal_msg));
  if (rt->fate) {
    hora__strlcpy(rt->fate->msg, rt->fatal_msg, sizeof(rt->fate->msg));
    atomic_store_explicit(&rt->fate->code, code, memory_order_release);
  }
  atomic_store_explicit(&rt->fatal_code, code, memory_order_release);
  if (code == HORA_ERR_PEER_LOST) {
    hora__metrics_event(HORA__EV_PEER_LOST);
  }
}

int hora__runtime_fatal(struct hora__runtime *rt) {
  int code = atomic_load_explicit(&rt->fatal_code, memory_order_acquire);
  if (code != HORA_SUCCESS) {
    hora__error_set_message(rt->fatal_msg);
  }
  return code;
}

void hora__fate_release(struct hora__fate *f) {
  if (f && atomic_fetch_sub(&f->refs, 1) == 1) {
    free(f);
  }
}

/* The job's fatal error, once it has failed (and then sets the message). */
int hora__request_job_failed(const struct hora_request *r) {
  int code = atomic_load_explicit(&r->fate->code, memory_order_acquire);
  if (code != HORA_SUCCESS) {
    hora__error_set_message(r->fate->msg);
  }
  return code;
}

/* ---- the coordinator's end ------------------------------------------------ */

/* After a data-plane failure, a neighbour's closed socket is usually the
 * echo of an error elsewhere; give the explanation (an abort from rank 0,
 * or a control connection that closed) a moment to arrive. */
static int attribute_failure(struct hora__engine *e, int rc) {
  char original[1024];
  hora__strlcpy(original, hora__error_message(), sizeof(original));
  uint64_t deadline = hora__now_ns() + 500 * 1000000ull;
  hora__comm *c = e->world->comm;
  while (hora__now_ns() < deadline) {
    struct pollfd *fds = e->pollfds;
    int n = hora__engine_service_pollfds(e, fds, e->npollfds);
    if (poll(fds, (nfds_t)n, 50) > 0) {
      for (int i = 0, r = 0; r < c->size && i < n; r++) {
        if (!c->proc->ctrl[r]) {
          continue;
        }
        if (fds[i].revents) {
          int rc2 = hora__engine_read_ctrl(e, c->proc->ctrl[r]);
          if (rc2 != HORA_SUCCESS) {
            return rc2;
          }
        }
        i++;
      }
    }
  }
  hora__error(rc, "%s", original);
  return rc;
}

/* Tells the job about a fatal error that started here or at rank 0. */
static void broadcast_fatal(struct hora__engine *e, int code, const char *msg, bool from_root) {
  hora__comm *c = e->world->comm;
  hora__encode_abort(&e->wbuf, e->rt->rank, code, msg);
  if (e->wbuf.failed) {
    return;
  }
  for (int r = 0; r < c->size; r++) {
    if (!c->proc->ctrl[r] || (r == 0 && from_root)) {
      continue;
    }
    (void)hora__ctrl_send_blocking(c->proc->ctrl[r], HORA_MSG_ABORT, e->wbuf.data, e->wbuf.len, 1.0);
  }
}

/* Stops accepting work and completes every request still in flight, with
 * the fatal error, or after a normal shutdown with HORA_ERR_ABORTED. */
static void fail_everything(struct hora__engine *e) {
  struct hora__runtime *rt = e->rt;
  int code = atomic_load(&rt->fatal_code);
  const char *msg = code ? rt->fatal_msg : "the runtime was finalized before this operation ran";
  if (!code) {
    code = HORA_ERR_ABORTED;
  }
  pthread_mutex_lock(&rt->mu);
  rt->accepting = false;
  /* Queued requests are in the in-flight table too. */
  rt->queue_head = rt->queue_tail = NULL;
  while (rt->inflight.count > 0) {
    struct hora_request *victims[64];
    size_t n = 0;
    for (size_t b = 0; b < rt->inflight.nbuckets && n < HORA_ARRAY_SIZE(victims); b++) {
      for (struct hora__table_entry *t = rt->inflight.buckets[b];
           t && n < HORA_ARRAY_SIZE(victims); t = t->next) {
        victims[n++] = t->value;
      }
    }
    for (size_t i = 0; i < n; i++) {
      if (victims[i]->placeholder) {
        hora__table_remove(&rt->inflight, victims[i]->key, victims[i]->key_len);
        free(victims[i]);
      } else {
        hora__request_complete_locked(rt, victims[i], code, msg);
      }
    }
  }
  rt->coordinator_exited = true;
  pthread_cond_broadcast(&rt->done_cv);
  pthread_mutex_unlock(&rt->mu);
}

void hora__engine_fail_all(struct hora__engine *e, int rc) {
  struct hora__runtime *rt = e->rt;
  if (rc != HORA_SUCCESS) {
    /* A broken data connection, or a peer's buffer gone from under a kernel
     * copy (the peer left the collective), is usually explained by what
     * that peer sent on its control connection: an abort, say. */
    const char *why = hora__error_message();
    if ((rc == HORA_ERR_PEER_LOST && strstr(why, "data connection")) ||
        (rc == HORA_ERR_SYSTEM && strstr(why, "process_vm_"))) {
      rc = attribute_failure(e, rc);
    }
    /* The first fatal error wins: hora_abort may have recorded one already. */
    hora__runtime_set_fatal(rt, rc, hora__error_message());
    int code = atomic_load(&rt->fatal_code);
    if (!atomic_load(&rt->contained)) {
      HORA_ERROR("%sfatal: %s (%s)", rt->label, rt->fatal_msg, hora_strerror(code));
      broadcast_fatal(e, code, rt->fatal_msg, e->abort_from_root);
      hora__process_sets_fatal(rt, code, rt->fatal_msg);
    }
  }
  fail_everything(e);
  if (rc != HORA_SUCCESS) {
    /* NCCL kernels waiting for a lost peer end now, not at hora_finalize;
     * after the requests have failed, since aborting may wait for the
     * device. */
    hora__gpu_abort(e->world->comm->gpu);
  }
}
