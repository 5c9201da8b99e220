/* The coordinator thread.
 *
 * Negotiation. A request whose key and options are in the response cache
 * (it ran before) waits as one bit, its slot; any other goes in full to
 * rank 0, whose controller matches it across ranks (negotiate/negotiate.c)
 * and sends every rank the same frames of responses, fused where they may
 * be (negotiate/fusion.c). The bits are agreed on in cycles: an allreduce
 * of bit vectors between the ranks themselves, by recursive doubling
 * (partners from hora__cycle_partners), with no round trip through rank 0.
 * A cycle reduces
 *
 *   ready      AND  slots this rank can run now (a joined rank: every
 *                   cached allreduce, which it stands in for)
 *   submitted  OR   slots some rank really submitted
 *   evict      OR   slots to empty (a request that changed its options,
 *                   one waiting too long: the stall inspector must see it)
 *   frames     MAX  response frames rank 0 had sent when it took part
 *   flags      OR   some rank has a join in flight
 *
 * A rank starts the next cycle when it has new cached requests, when rank
 * 0 has sent frames, or when a partner's message for it arrives; idle
 * ranks never cycle. At the end of cycle k every rank, in the same order:
 * schedules the slots ready everywhere and submitted somewhere (in slot
 * order, fused), empties the evicted slots, then applies rank 0's frames up
 * to the cycle's count (waiting for them if they are still on the way).
 * Frames are applied nowhere else, so the caches, which only these steps
 * change, stay identical, and every rank runs the same responses in the
 * same order. Bits contributed to cycle k refer to the cache as it was
 * after cycle k-1 on every rank. A waiting request whose slot changed,
 * or a non-allreduce while someone has joined (rank 0 then refuses it),
 * goes in full. A cycle that some rank never joins (alive but stuck) is
 * reported to rank 0 after half the stall time by every rank in it, so
 * that its stall inspector can name the ranks that never reported.
 *
 * The loop: take submissions; read the control connections; rank 0 sends
 * the responses that became ready; advance the cycle; at its end, schedule
 * and run the responses (the collectives, then the requests complete);
 * with nothing to do, sleep in poll() on the wake eventfd and the control
 * sockets: an idle job costs no CPU.
 *
 * The first fatal error (a lost peer, a stall past the shutdown time,
 * hora_abort) is sent to every connected rank and rank 0 passes it on;
 * then the coordinator fails every request and closes its connections
 * (fatal.c).
 *
 * This file holds the loop and starting and stopping the coordinator;
 * engine.h names the files that hold the rest. */
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "comm/coll/collectives.h"
#include "comm/gpu/gpu.h"
#include "comm/shm/shm.h"
#include "base/log.h"
#include "base/params.h"
#include "runtime/engine/engine.h"
#include "runtime/observe/timeline.h"

void hora__engine_set_free(struct hora__set *s, bool failed) {
  if (!s) {
    return;
  }
  hora__controller_destroy(s->ctl);
  hora__engine_late_free(s);
  hora__cache_free(&s->cache);
  free(s->waiting);
  free(s->evict_wish);
  free(s->acc);
  hora__wbuf_free(&s->eager);
  hora__wbuf_free(&s->eager_tmp);
  hora__cycle_inbox_free(s->inbox);
  free(s->stuck_cycle);
  free(s->stuck_since_ns);
  while (s->frames_head) {
    struct frame *f = s->frames_head;
    s->frames_head = f->next;
    free(f);
  }
  while (s->todo) {
    struct hora__response *n = s->todo->next;
    hora__response_free(s->todo);
    s->todo = n;
  }
  free(s->zeros);
  free(s->junk);
  free(s->iov_in);
  free(s->iov_out);
  free(s->reqs);
  hora__gpu_destroy(s->comm, s->comm->gpu, failed);
  s->comm->gpu = NULL;
  free(s->ready);
  free(s->done);
  free(s);
}

/* The negotiation state of one communicator: its cache, cycles (partners
 * by its own ranks), stall inspector and, at its first rank, controller. */
int hora__engine_set_create(struct hora__engine *e, hora__comm *comm, struct hora__set **out) {
  struct hora__set *s = hora__calloc(1, sizeof(*s));
  if (!s) {
    return HORA_ERR_NO_MEMORY;
  }
  s->e = e;
  s->comm = comm;
  s->todo_tail = &s->todo;
  s->next_stall_ns = UINT64_MAX;
  s->send_at_ns = UINT64_MAX;
  s->join_defer_ns = UINT64_MAX;
  int rc = hora__cache_init(&s->cache, (uint32_t)hora__params.CACHE_CAPACITY);
  if (rc != HORA_SUCCESS) {
    hora__engine_set_free(s, false);
    return rc;
  }
  size_t bitmap = ((size_t)s->cache.capacity + 7) / 8;
  s->frames_tail = &s->frames_head;
  s->next_wait_scan_ns = UINT64_MAX;
  s->cycle_phase = CYCLE_IDLE;
  hora__cycle_partners(comm->rank, comm->size, &s->partners);
  s->waiting = hora__calloc((size_t)s->cache.capacity + 1, sizeof(*s->waiting));
  s->evict_wish = hora__calloc(bitmap + 1, 1);
  s->acc = hora__calloc(HORA_CYCLE_VECTORS * bitmap + 1, 1);
  s->inbox = hora__calloc(2 * INBOX_STEPS, sizeof(*s->inbox));
  s->stuck_cycle = hora__calloc((size_t)comm->size, sizeof(uint64_t));
  s->stuck_since_ns = hora__calloc((size_t)comm->size, sizeof(uint64_t));
  s->next_stuck_ns = UINT64_MAX;
  if (!s->waiting || !s->evict_wish || !s->acc || !s->inbox || !s->stuck_cycle ||
      !s->stuck_since_ns) {
    hora__engine_set_free(s, false);
    return HORA_ERR_NO_MEMORY;
  }
  if (comm->rank == 0) {
    rc = hora__controller_create(comm->size, &s->ctl);
    if (rc != HORA_SUCCESS) {
      hora__engine_set_free(s, false);
      return rc;
    }
    if (e->rt) {
      hora__controller_name(s->ctl, e->rt->global_ranks, e->rt->label);
    }
    rc = hora__engine_late_start(s);
    if (rc != HORA_SUCCESS) {
      hora__engine_set_free(s, false);
      return rc;
    }
  }
  *out = s;
  return HORA_SUCCESS;
}

static void engine_free(struct hora__engine *e) {
  if (!e) {
    return;
  }
  hora__engine_set_free(e->world, atomic_load(&e->rt->fatal_code) != HORA_SUCCESS);
  hora__wbuf_free(&e->wbuf);
  free(e->pollfds);
  free(e->caller_pollfds);
  free(e->service_pollfds);
  free(e->ctrl_ready);
  free(e);
}

/* The responses in the order every rank runs them. A waiting caller stops
 * once its own request is complete (drive.c wakes the coordinator for the
 * rest): a small operation's waiter does not run a large collective
 * scheduled after it. */
static int run_todo(struct hora__set *set, bool *busy) {
  const atomic_int *mine = set->e->caller_done;
  while (set->todo && !set->e->stop) {
    struct hora__response *r = set->todo;
    if (set->e->on_caller && r->device) {
      return HORA_SUCCESS; /* the GPU is the coordinator's (its device is current there) */
    }
    if (mine && atomic_load_explicit(mine, memory_order_acquire)) {
      return HORA_SUCCESS;
    }
    set->todo = r->next;
    if (!set->todo) {
      set->todo_tail = &set->todo;
    }
    *busy = true;
    HORA_TRACE("execute %s (%u tensors)", hora__kind_name(r->kind), r->ntensors);
    int rc = hora__engine_execute(set, r);
    hora__response_free(r);
    HORA_CHECK(rc);
  }
  return HORA_SUCCESS;
}

/* ---- sleeping and waking -------------------------------------------------- */

void hora__engine_wake_locked(struct hora__runtime *rt) {
  if (rt->sleepers > 0) {
    uint64_t one = 1;
    ssize_t w = write(rt->wake_fd, &one, sizeof(one));
    (void)w;
  }
}

/* With a core to spare, poll briefly for work before sleeping: a wake-up
 * from poll() costs more than the whole exchange of a small allreduce. */
static int spin_for_work(struct hora__engine *e, bool *found) {
  hora__comm *c = e->world->comm;
  *found = false;
  if (c->net->spin_us <= 0) {
    return HORA_SUCCESS;
  }
  uint64_t until = hora__now_ns() + (uint64_t)c->net->spin_us * 1000;
  uint64_t frames = e->frames_in;
  do {
    if (atomic_load_explicit(&e->rt->submit_seq, memory_order_acquire) !=
            atomic_load_explicit(&e->seen_seq, memory_order_relaxed) ||
        atomic_load_explicit(&e->rt->engine_drivers, memory_order_acquire) > 0) {
      *found = true;
      return HORA_SUCCESS;
    }
    HORA_CHECK(hora__engine_service(e));
    if (e->frames_in != frames || e->world->todo || (e->world->ctl && hora__controller_has_ready(e->world->ctl))) {
      *found = true;
      return HORA_SUCCESS;
    }
    /* (A caller may take the engine meanwhile.) */
    pthread_mutex_unlock(&e->rt->progress_mu);
    sched_yield();
    pthread_mutex_lock(&e->rt->progress_mu);
  } while (hora__now_ns() < until && hora__now_ns() < e->world->send_at_ns);
  return HORA_SUCCESS;
}

static void drain_wake(struct hora__runtime *rt) {
  uint64_t v;
  ssize_t r = read(rt->wake_fd, &v, sizeof(v));
  (void)r;
}

/* The coordinator takes the engine back. A caller that drives holds it
 * for its whole request: blocking on the lock would cost the caller's
 * every release a wake-up (and the next request a fight for the lock), so
 * while one drives the coordinator sleeps on its eventfd, looking every
 * millisecond. */
static void relock_engine(struct hora__runtime *rt) {
  struct pollfd w = {.fd = rt->wake_fd, .events = POLLIN};
  while (pthread_mutex_trylock(&rt->progress_mu) != 0) {
    if (atomic_load_explicit(&rt->engine_drivers, memory_order_acquire) == 0 ||
        poll(&w, 1, 1) > 0) {
      pthread_mutex_lock(&rt->progress_mu);
      return;
    }
  }
}

/* While callers drive the engine, the coordinator sleeps on its eventfd
 * alone (peers' messages are theirs to read), looking every millisecond
 * whether one still does: once none does, it goes back to its usual sleep
 * (control connections, mailboxes, timers; marked asleep for submitters),
 * so that work that comes after the last caller left (the next step's
 * operations, a hora_test loop's) waits at most that long. A caller that
 * leaves work undone wakes it at once (drive.c); one that leaves nothing
 * does not, which would cost every small operation a wake-up. The look
 * takes no lock: a coordinator that ran a step every millisecond while
 * callers drove contended with the copying caller, which cost a 1 MiB
 * alltoall at np=2 some 8%. The 100 ms are a safety net. */
static void sleep_while_driven(struct hora__engine *e) {
  struct hora__runtime *rt = e->rt;
  pthread_mutex_unlock(&rt->progress_mu);
  struct pollfd p = {.fd = rt->wake_fd, .events = POLLIN};
  for (int ms = 0; ms < 100 && atomic_load_explicit(&rt->engine_drivers, memory_order_acquire) > 0;
       ms++) {
    if (poll(&p, 1, 1) > 0) {
      drain_wake(rt);
      break;
    }
  }
  relock_engine(rt);
}

uint64_t hora__engine_next_due_ns(struct hora__engine *e) {
  uint64_t due = HORA_MIN(HORA_MIN(e->world->next_stall_ns, e->world->send_at_ns), e->world->next_wait_scan_ns);
  due = HORA_MIN(due, e->world->next_stuck_ns);
  due = HORA_MIN(due, e->world->join_defer_ns);
  /* An idle rank still owes its peers heartbeats. */
  due = HORA_MIN(due, e->world->comm->net->service_due_ns);
  uint64_t half = hora__engine_stall_half_ns();
  if (half && !e->world->stuck_reported && e->world->cycle_phase != CYCLE_IDLE && e->world->cycle_phase != CYCLE_DONE) {
    due = HORA_MIN(due, e->world->cycle_started_ns + half);
  }
  return due;
}

bool hora__engine_sleep_begin(struct hora__runtime *rt, bool coordinator) {
  pthread_mutex_lock(&rt->mu);
  bool idle = !rt->queue_head && !rt->abort_asked;
  rt->sleepers += idle;
  rt->coord_polling = idle && coordinator;
  pthread_mutex_unlock(&rt->mu);
  return idle;
}

int hora__engine_poll(struct hora__engine *e, struct pollfd *fds, int n, bool release,
                      int service_from) {
  struct hora__runtime *rt = e->rt;
  struct hora__shm *shm = e->world->comm->proc->shm;
  int pr = 0, err = 0;
  bool polled = false;
  if (!shm || !hora__shm_mail_sleep(shm, true)) { /* (else a partner's step came in meanwhile) */
    uint64_t due = hora__engine_next_due_ns(e), now = hora__now_ns();
    uint64_t ns = due <= now ? 0 : HORA_MIN(due - now, 1000000000ull);
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull), .tv_nsec = (long)(ns % 1000000000ull)};
    if (release) {
      pthread_mutex_unlock(&rt->progress_mu); /* callers may drive meanwhile */
    }
    pr = ppoll(fds, (nfds_t)n, &ts, NULL);
    err = errno;
    polled = true;
    if (shm) {
      hora__shm_mail_sleep(shm, false);
    }
  }
  /* Awake before taking the engine back: submitters need not wake us. */
  pthread_mutex_lock(&rt->mu);
  rt->sleepers--;
  rt->coord_polling = false;
  pthread_mutex_unlock(&rt->mu);
  if (polled && release) {
    relock_engine(rt);
  }
  if (pr > 0 && fds[0].revents) {
    drain_wake(rt);
  }
  if (polled && pr >= 0 && service_from > 0) {
    hora__engine_service_ready(e, fds + service_from, n - service_from);
  }
  if (pr < 0 && err != EINTR) {
    errno = err;
    return hora__error_errno(HORA_ERR_SYSTEM, "ppoll");
  }
  return HORA_SUCCESS;
}

static int sleep_until_work(struct hora__engine *e) {
  hora__comm *c = e->world->comm;
  if (atomic_load_explicit(&e->rt->engine_drivers, memory_order_acquire) > 0) {
    sleep_while_driven(e);
    return HORA_SUCCESS;
  }
  bool found;
  HORA_CHECK(spin_for_work(e, &found));
  if (found || !hora__engine_sleep_begin(e->rt, true)) {
    return HORA_SUCCESS;
  }
  struct pollfd *fds = e->pollfds;
  int n = 0;
  fds[n++] = (struct pollfd){.fd = e->rt->wake_fd, .events = POLLIN};
  fds[n++] = (struct pollfd){.fd = c->proc->tcp_listen_fd, .events = POLLIN};
  fds[n++] = (struct pollfd){.fd = c->proc->unix_listen_fd, .events = POLLIN};
  int service_from = n;
  n += hora__engine_service_pollfds(e, fds + n, e->npollfds - n);
  hora__timeline_flush();
  HORA_CHECK(hora__engine_poll(e, fds, n, true, service_from));
  if (fds[1].revents) {
    hora__engine_refuse_connections(e, c->proc->tcp_listen_fd);
  }
  if (fds[2].revents) {
    hora__engine_refuse_connections(e, c->proc->unix_listen_fd);
  }
  hora__engine_log_refusals(e, false);
  return HORA_SUCCESS;
}

/* ---- the loop ----------------------------------------------------------------- */

/* One communicator's turn: send the responses its controller has ready,
 * advance its cycle, run what the cycle scheduled, watch for stalls. */
static int set_step(struct hora__set *set, bool *busy) {
  if (set->ctl && hora__controller_has_ready(set->ctl)) {
    HORA_CHECK(hora__engine_distribute(set));
  }
  HORA_CHECK(hora__engine_cycle_advance(set, busy));
  HORA_CHECK(hora__engine_cycle_end(set, busy));
  /* The next cycle starts before this one's collectives run, so that the
   * partners can go on negotiating meanwhile. */
  HORA_CHECK(hora__engine_cycle_advance(set, busy));
  HORA_CHECK(run_todo(set, busy));
  if (set->e->stop) {
    return HORA_SUCCESS;
  }
  if (set->ctl) {
    HORA_CHECK(hora__controller_check_stalls(set->ctl, hora__now_ns(),
                                             hora__params.STALL_CHECK_TIME_SECONDS,
                                             hora__params.STALL_SHUTDOWN_TIME_SECONDS,
                                             &set->next_stall_ns));
  }
  hora__engine_scan_waiting(set);
  HORA_CHECK(hora__engine_report_stuck(set));
  if (set->ctl && set->next_stuck_ns <= hora__now_ns()) {
    HORA_CHECK(hora__engine_check_stuck(set));
  }
  return HORA_SUCCESS;
}

/* One turn of the loop's work, on whichever thread holds progress_mu. */
int hora__engine_step(struct hora__engine *e, bool *busy) {
  HORA_CHECK(hora__engine_take_submissions(e->world, busy));
  HORA_CHECK(hora__service_run(&e->proc->net));
  return set_step(e->world, busy);
}

static int cycle(struct hora__engine *e) {
  bool busy = false;
  if (e->deferred_rc != HORA_SUCCESS) {
    /* A caller's step failed: the error is the coordinator's to handle. */
    return hora__error(e->deferred_rc, "%s", e->deferred_msg);
  }
  HORA_CHECK(hora__engine_step(e, &busy));
  if (e->stop) {
    return HORA_SUCCESS;
  }
  if (!busy) {
    HORA_CHECK(sleep_until_work(e));
  }
  return HORA_SUCCESS;
}

/* Writes out what is still queued on the control connections (the last
 * responses, say) before they close; bounded, since a peer may be gone. */
static void flush_control(struct hora__engine *e, double timeout_s) {
  hora__comm *c = e->world->comm;
  uint64_t deadline = hora__now_ns() + (uint64_t)(timeout_s * 1e9);
  for (;;) {
    struct pollfd *fds = e->pollfds;
    int n = 0;
    for (int r = 0; r < c->size && n < e->npollfds; r++) {
      if (c->proc->ctrl[r] && hora__ctrl_has_output(c->proc->ctrl[r])) {
        if (hora__ctrl_flush(c->proc->ctrl[r]) != HORA_SUCCESS) {
          hora__ctrl_free(c->proc->ctrl[r]);
          c->proc->ctrl[r] = NULL;
          continue;
        }
        if (hora__ctrl_has_output(c->proc->ctrl[r])) {
          fds[n++] = (struct pollfd){.fd = hora__ctrl_fd(c->proc->ctrl[r]), .events = POLLOUT};
        }
      }
    }
    uint64_t now = hora__now_ns();
    if (n == 0 || now >= deadline) {
      return;
    }
    (void)poll(fds, (nfds_t)n, (int)HORA_MIN((deadline - now) / 1000000 + 1, 100));
  }
}

static bool gpu_eager(void) { return strcmp(hora__params.GPU_INIT, "eager") == 0; }

/* HORA_GPU_INIT=eager: the device data plane is set up in hora_init, on
 * every rank together. The ranks first agree that each can (a build with
 * CUDA, a GPU it sees), so that none waits in the set-up for one that
 * cannot. */
static int gpu_setup_eager(struct hora__engine *e) {
  hora__comm *c = e->world->comm;
  uint8_t mine = !HORA_HAVE_CUDA ? 0 : hora__gpu_present() ? 2 : 1;
  uint8_t *all = hora__calloc((size_t)c->size, 1);
  if (!all) {
    return HORA_ERR_NO_MEMORY;
  }
  int rc = hora__allgather(c, &mine, 1, all);
  char lacking[256] = "";
  size_t used = 0;
  for (int r = 0; rc == HORA_SUCCESS && r < c->size; r++) {
    if (all[r] != 2 && used < sizeof(lacking)) {
      used += (size_t)snprintf(lacking + used, sizeof(lacking) - used, "%s%d", used ? ", " : "", r);
    }
  }
  free(all);
  HORA_CHECK(rc);
  if (mine == 0) {
    return hora__error(HORA_ERR_NOT_SUPPORTED, "HORA_GPU_INIT=eager, but this build of hora has no "
                       "CUDA (configure --with-cuda)");
  }
  if (mine == 1) {
    return hora__error(HORA_ERR_NOT_SUPPORTED, "HORA_GPU_INIT=eager, but this process sees no GPU");
  }
  if (lacking[0]) {
    return hora__error(HORA_ERR_NOT_SUPPORTED,
                       "HORA_GPU_INIT=eager, but rank(s) %s cannot use a GPU (none visible there, "
                       "or a build without CUDA)",
                       lacking);
  }
  return hora__gpu_setup(c, &c->gpu);
}

static void *coordinator_main(void *arg) {
  struct hora__runtime *rt = arg;
  struct hora__engine *e = rt->engine;
  pthread_setname_np(pthread_self(), "hora-coord");
  hora__timeline_thread_set(rt->set_id);
  int rc = HORA_SUCCESS;
  if (gpu_eager()) {
    /* hora_init waits for this; on failure the fatal path below ends the
     * coordinator, and hora_init fails with the error. */
    rc = gpu_setup_eager(e);
    if (rc != HORA_SUCCESS) {
      hora__runtime_set_fatal(rt, rc, hora__error_message());
    }
    pthread_mutex_lock(&rt->mu);
    e->setup_done = true;
    pthread_cond_broadcast(&rt->done_cv);
    pthread_mutex_unlock(&rt->mu);
  }
  pthread_mutex_lock(&rt->progress_mu);
  while (!e->stop && rc == HORA_SUCCESS) {
    rc = cycle(e);
  }
  e->exited = true;
  hora__engine_fail_all(e, rc);
  if (rc == HORA_SUCCESS) {
    flush_control(e, 5.0);
  }
  hora__engine_log_refusals(e, true);
  hora__comm_disconnect(e->world->comm);
  pthread_mutex_unlock(&rt->progress_mu);
  return NULL;
}

int hora__engine_start(struct hora__runtime *rt) {
  struct hora__engine *e = hora__calloc(1, sizeof(*e));
  if (!e) {
    return HORA_ERR_NO_MEMORY;
  }
  e->rt = rt;
  e->proc = rt->comm->proc;
  e->npollfds = rt->size + 8;
  e->pollfds = hora__calloc((size_t)e->npollfds, sizeof(*e->pollfds));
  e->caller_pollfds = hora__calloc((size_t)e->npollfds, sizeof(*e->caller_pollfds));
  e->service_pollfds = hora__calloc((size_t)e->npollfds, sizeof(*e->service_pollfds));
  e->nctrl_ready = rt->size;
  e->ctrl_ready = hora__calloc((size_t)rt->size + 1, 1);
  if (!e->pollfds || !e->caller_pollfds || !e->service_pollfds || !e->ctrl_ready) {
    engine_free(e);
    return HORA_ERR_NO_MEMORY;
  }
  int rc = hora__engine_set_create(e, rt->comm, &e->world);
  if (rc != HORA_SUCCESS) {
    engine_free(e);
    return rc;
  }
  /* Before the thread starts: a caller may drive the engine at once. */
  hora__net *net = &e->proc->net;
  net->service = hora__engine_service;
  net->service_pollfds = hora__engine_service_pollfds;
  net->service_ready = hora__engine_service_ready;
  net->service_arg = e;
  /* Often enough for heartbeats at a quarter of the peer timeout, and for
   * an abort to stop a collective well within a second. */
  uint64_t peer_ns = (uint64_t)(hora__params.PEER_TIMEOUT_SECONDS * 1e9);
  net->service_interval_ns = peer_ns > 0 ? HORA_MIN(peer_ns / 8, 100000000ull) : 100000000ull;
  net->service_due_ns = hora__now_ns() + net->service_interval_ns;
  rt->engine = e;
  int err = pthread_create(&rt->thread, NULL, coordinator_main, rt);
  if (err != 0) {
    rt->engine = NULL;
    engine_free(e);
    errno = err;
    return hora__error_errno(HORA_ERR_SYSTEM, "pthread_create(coordinator)");
  }
  rt->thread_started = true;
  if (gpu_eager()) {
    pthread_mutex_lock(&rt->mu);
    while (!e->setup_done) {
      pthread_cond_wait(&rt->done_cv, &rt->mu);
    }
    pthread_mutex_unlock(&rt->mu);
    int code = atomic_load_explicit(&rt->fatal_code, memory_order_acquire);
    if (code != HORA_SUCCESS) {
      return hora__error(code, "%s", rt->fatal_msg);
    }
  }
  return HORA_SUCCESS;
}

void hora__engine_join(struct hora__runtime *rt) {
  if (rt->thread_started) {
    pthread_join(rt->thread, NULL);
    rt->thread_started = false;
  }
  pthread_mutex_lock(&rt->progress_mu); /* no caller is inside a step */
  engine_free(rt->engine);
  rt->engine = NULL;
  pthread_mutex_unlock(&rt->progress_mu);
}
