/* The negotiation cycles as the coordinator runs them (runtime/engine/:
 * cycle_steps.c and control_messages.c), without MPI. N threads each play
 * one rank's coordinator, with its own runtime, process, communicator,
 * engine and world set, joined by control connections over socketpair()s
 * where the bootstrap makes them (rank 0's star and the cycles' partners,
 * as runtime/api/init.c plans them).
 * Each thread runs the coordinator's loop (engine.c's cycle() and
 * set_step()) without the data plane: take the submissions, read the control
 * connections, let rank 0 send its ready responses, advance and end the
 * cycles, and sleep in poll() when nothing moved. The responses a cycle
 * schedules stay on set->todo, where the test compares them across ranks
 * instead of running them. A watchdog fails a job that does not finish.
 *
 * The single-rank tests put the test itself at the far end of the rank's
 * sockets: it reads the steps the rank sends and writes raw ones, well
 * formed or not, from the partners or from ranks that are not. */
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/params.h"
#include "runtime/engine/engine.h"
#include "runtime/negotiate/fusion.h"
#include "../runner.h"

#define MS 1000000ull
#define MAXN 8
#define NSLOTS 20         /* slots filled in the schedule test */
#define CAPACITY 64       /* the sets' caches: 8 bytes of bits per vector */
#define JOB_LIMIT_S 10    /* a job that has not finished by then hangs */
#define LOST_LIMIT_S 5    /* the lost-peer jobs must fail sooner */
#define HOLD_NS (30 * MS) /* how long a held rank is watched waiting for frames */

static const int sizes[] = {1, 2, 3, 4, 5, 7, 8};

/* ---- one simulated rank ---------------------------------------------------- */

struct job;

/* What a test's hook writes down of a rank at a point of its run. */
struct snap {
  bool taken;
  uint64_t cycles, stat_cycles, frames_got, frames_applied, frames_told, acc_frames, hits;
  int phase;
  bool others_joined, join_pending, todo_empty;
  char todo[1024];
  bool slot_used[NSLOTS];
  char slot_key[NSLOTS][16];
  struct hora_request *waiting[NSLOTS];
  uint32_t nwaiting;
  int32_t sent_slot[NSLOTS]; /* of the rank's request on each slot, or -2 */
};

struct sim {
  int rank, n;
  struct job *job;
  struct hora__runtime rt;
  struct hora__proc proc;
  hora__comm comm;
  struct hora__engine *e;
  struct hora__set *set;
  pthread_t thread;
  int rc;        /* how the rank's loop ended */
  char msg[512]; /* its error message */
  char why[512]; /* the first thing the test found wrong here */
  struct hora_request *reqs[4 * NSLOTS];
  int nreqs;
  struct hora_request *on_slot[NSLOTS]; /* the test's request waiting on each slot */
  int stage;
  bool holding, died;
  uint64_t hold_since;
  struct snap at[3]; /* the hooks' snapshots */
};

struct job {
  int n;
  struct sim *ranks;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int finished;
  atomic_int settled; /* ranks whose goal is met, or that failed */
  atomic_bool watchdog;
  /* Called after each turn of a rank's loop: true once its goal is met. */
  bool (*after_step)(struct sim *);
  int hold_rank; /* reads nothing from rank 0 until its cycle is done; -1: none */
  int die_rank;  /* closes every socket once its first cycle has started; -1: none */
};

static void note(struct sim *k, const char *fmt, ...) HORA_PRINTF(2, 3);
static void note(struct sim *k, const char *fmt, ...) {
  if (k->why[0]) {
    return;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(k->why, sizeof(k->why), fmt, ap);
  va_end(ap);
}

static void meta_of(uint8_t kind, uint64_t count, struct hora__op_meta *m) {
  memset(m, 0, sizeof(*m));
  m->kind = kind;
  m->dtype = HORA_FLOAT32;
  m->op = kind == HORA_KIND_ALLREDUCE ? HORA_SUM : 0;
  m->root = kind == HORA_KIND_BROADCAST ? 0 : -1;
  m->count = count;
  m->prescale = m->postscale = 1.0;
}

/* The schedule test's slots: every fifth a broadcast, the rest allreduces. */
static uint8_t slot_kind(int s) { return s % 5 == 4 ? HORA_KIND_BROADCAST : HORA_KIND_ALLREDUCE; }
static void slot_key(int s, char *buf, size_t n) { snprintf(buf, n, "Ns%02d", s); }
static void slot_meta(int s, struct hora__op_meta *m) { meta_of(slot_kind(s), 4 + (uint64_t)s, m); }

/* The control connections rank `rank` of n has: the star around rank 0
 * and the cycles' partners. */
static void peers_of(int rank, int n, bool *need) {
  memset(need, 0, (size_t)n);
  for (int r = 0; r < n; r++) {
    need[r] = r != rank && (rank == 0 || r == 0);
  }
  struct hora__cycle_partners cp;
  hora__cycle_partners(rank, n, &cp);
  if (cp.fold >= 0) {
    need[cp.fold] = true;
  }
  for (int i = 0; i < cp.nrounds; i++) {
    need[cp.round[i]] = true;
  }
}

static int sim_init(struct sim *k, int rank, int n) {
  memset(k, 0, sizeof(*k));
  k->rank = rank;
  k->n = n;
  struct hora__runtime *rt = &k->rt;
  pthread_mutex_init(&rt->mu, NULL);
  pthread_cond_init(&rt->done_cv, NULL);
  rt->rank = rank;
  rt->size = n;
  rt->comm = &k->comm;
  rt->wake_fd = -1;
  rt->accepting = true;
  atomic_init(&rt->fatal_code, HORA_SUCCESS);
  atomic_init(&rt->submit_seq, 0);
  hora__net *net = &k->proc.net;
  net->rank = rank;
  net->size = n;
  k->proc.tcp_listen_fd = k->proc.unix_listen_fd = k->proc.reserve_fd = -1;
  k->proc.ctrl = calloc((size_t)n, sizeof(*k->proc.ctrl));
  k->comm.proc = &k->proc;
  k->comm.net = net;
  k->comm.rank = rank;
  k->comm.size = n;
  k->comm.local_size = 1;
  k->comm.cross_rank = rank;
  k->comm.cross_size = n;
  k->e = calloc(1, sizeof(*k->e));
  if (!k->proc.ctrl || !k->e) {
    return HORA_ERR_NO_MEMORY;
  }
  k->e->rt = rt;
  k->e->proc = &k->proc;
  k->e->npollfds = n + 8;
  k->e->pollfds = calloc((size_t)k->e->npollfds, sizeof(*k->e->pollfds));
  if (!k->e->pollfds) {
    return HORA_ERR_NO_MEMORY;
  }
  HORA_CHECK(hora__engine_set_create(k->e, &k->comm, &k->e->world));
  k->set = k->e->world;
  return HORA_SUCCESS;
}

/* Closes this rank's ends, as the fatal path's hora__comm_disconnect does:
 * its peers see EOF. */
static void close_all(struct sim *k) {
  for (int r = 0; k->proc.ctrl && r < k->n; r++) {
    hora__ctrl_free(k->proc.ctrl[r]);
    k->proc.ctrl[r] = NULL;
  }
}

static void sim_free(struct sim *k) {
  close_all(k);
  if (k->e) {
    hora__engine_set_free(k->e->world, false);
    hora__wbuf_free(&k->e->wbuf);
    free(k->e->pollfds);
    free(k->e);
    k->e = NULL;
  }
  for (int i = 0; i < k->nreqs; i++) {
    hora__request_free(k->reqs[i]);
  }
  k->nreqs = 0;
  free(k->proc.ctrl);
  k->proc.ctrl = NULL;
  pthread_cond_destroy(&k->rt.done_cv);
  pthread_mutex_destroy(&k->rt.mu);
}

/* The same slots, assigned the same way, on every rank. */
static void fill_cache(struct sim *k, int nslots) {
  for (int s = 0; s < nslots; s++) {
    char key[16];
    struct hora__op_meta m;
    slot_key(s, key, sizeof(key));
    slot_meta(s, &m);
    int32_t slot = -1;
    int rc = hora__cache_note(&k->set->cache, key, strlen(key), &m, &slot);
    if (rc != HORA_SUCCESS || slot != s) {
      note(k, "rank %d: noting %s gave slot %d (rc %d)", k->rank, key, (int)slot, rc);
    }
  }
}

/* A caller's request, queued as hora__request_submit queues it. */
static struct hora_request *submit(struct sim *k, const struct hora__op_meta *m, const char *key) {
  if (k->nreqs == (int)HORA_ARRAY_SIZE(k->reqs)) {
    note(k, "rank %d: too many requests", k->rank);
    return NULL;
  }
  struct hora_request *q = hora__request_new(m->kind);
  if (!q) {
    note(k, "rank %d: out of memory", k->rank);
    return NULL;
  }
  q->meta = *m;
  q->key_len = (uint16_t)snprintf(q->key, sizeof(q->key), "%s", key);
  q->submit_ns = hora__now_ns();
  k->reqs[k->nreqs++] = q;
  pthread_mutex_lock(&k->rt.mu);
  if (k->rt.queue_tail) {
    k->rt.queue_tail->next = q;
  } else {
    k->rt.queue_head = q;
  }
  k->rt.queue_tail = q;
  atomic_fetch_add(&k->rt.submit_seq, 1);
  pthread_mutex_unlock(&k->rt.mu);
  return q;
}

static struct hora_request *submit_slot(struct sim *k, int s) {
  char key[16];
  struct hora__op_meta m;
  slot_key(s, key, sizeof(key));
  slot_meta(s, &m);
  return k->on_slot[s] = submit(k, &m, key);
}

/* "allreduce[Ns00,Ns01] broadcast[Ns04]": a list of responses, in order. */
static void describe(const struct hora__response *r, char *buf, size_t n) {
  size_t used = 0;
  buf[0] = '\0';
  for (; r && used < n; r = r->next) {
    used += (size_t)snprintf(buf + used, n - used, "%s%s[", used ? " " : "",
                             hora__kind_name(r->kind));
    for (uint32_t t = 0; t < r->ntensors && used < n; t++) {
      used += (size_t)snprintf(buf + used, n - used, "%s%.*s", t ? "," : "",
                               (int)r->tensors[t].key_len, r->tensors[t].key);
    }
    if (used < n) {
      used += (size_t)snprintf(buf + used, n - used, "]");
    }
  }
}

static void take_snap(struct sim *k, struct snap *p) {
  struct hora__set *set = k->set;
  p->taken = true;
  p->cycles = set->cycles;
  p->stat_cycles = atomic_load(&k->rt.stats.cycles);
  p->hits = atomic_load(&k->rt.stats.cache_hits);
  p->frames_got = set->frames_got;
  p->frames_applied = set->frames_applied;
  p->frames_told = set->frames_told;
  p->acc_frames = set->acc_frames;
  p->phase = set->cycle_phase;
  p->others_joined = set->others_joined;
  p->join_pending = set->join_pending;
  p->todo_empty = set->todo == NULL;
  describe(set->todo, p->todo, sizeof(p->todo));
  for (int s = 0; s < NSLOTS; s++) {
    const struct hora__cache_entry *ce = hora__cache_entry(&set->cache, s);
    p->slot_used[s] = ce != NULL;
    snprintf(p->slot_key[s], sizeof(p->slot_key[s]), "%.*s", ce ? (int)ce->key_len : 0,
             ce ? ce->key : "");
    p->waiting[s] = (uint32_t)s < set->cache.capacity ? set->waiting[s] : NULL;
    p->sent_slot[s] = k->on_slot[s] ? k->on_slot[s]->sent_slot : -2;
  }
  p->nwaiting = set->nwaiting;
}

/* ---- the coordinator's loop ------------------------------------------------ */

static bool any_output(struct sim *k) {
  for (int r = 0; r < k->n; r++) {
    if (k->proc.ctrl[r] && hora__ctrl_has_output(k->proc.ctrl[r])) {
      return true;
    }
  }
  return false;
}

/* One turn, as engine.c's cycle() and set_step() take it, without running
 * the responses: take submissions, read every control connection (a held
 * rank: all but rank 0's) and write what is queued on them, rank 0 sends
 * its ready responses, then advance, end and advance the cycle. */
static int step(struct sim *k, bool *busy) {
  struct hora__set *set = k->set;
  HORA_CHECK(hora__engine_take_submissions(set, busy));
  for (int r = 0; r < k->n; r++) {
    if (!k->proc.ctrl[r] || (r == 0 && k->holding)) {
      continue;
    }
    uint64_t before = k->e->frames_in;
    HORA_CHECK(hora__engine_read_ctrl(k->e, k->proc.ctrl[r]));
    *busy |= k->e->frames_in != before;
    /* A partner that is no longer needed may have closed: then it is gone. */
    if (k->proc.ctrl[r] && hora__ctrl_has_output(k->proc.ctrl[r])) {
      HORA_CHECK(hora__ctrl_flush(k->proc.ctrl[r]));
    }
  }
  if (set->ctl && hora__controller_has_ready(set->ctl)) {
    HORA_CHECK(hora__engine_distribute(set));
  }
  HORA_CHECK(hora__engine_cycle_advance(set, busy));
  HORA_CHECK(hora__engine_cycle_end(set, busy));
  HORA_CHECK(hora__engine_cycle_advance(set, busy));
  return HORA_SUCCESS;
}

/* Sleeps in poll() on the control connections (not rank 0's while held)
 * until one has input, or can take queued output, or `ms` pass. */
static void wait_input(struct sim *k, int ms) {
  struct pollfd fds[MAXN];
  int n = 0;
  for (int r = 0; r < k->n; r++) {
    hora__ctrl *c = k->proc.ctrl[r];
    if (c && !(r == 0 && k->holding)) {
      fds[n++] = (struct pollfd){.fd = hora__ctrl_fd(c),
                                 .events = (short)(POLLIN | (hora__ctrl_has_output(c) ? POLLOUT : 0))};
    }
  }
  (void)poll(fds, (nfds_t)n, ms);
}

/* The held rank: once its cycle is done but for rank 0's frames, it is
 * watched for HOLD_NS, then reads rank 0's connection again. */
static void hold(struct sim *k) {
  if (!k->holding || k->set->cycle_phase != CYCLE_DONE) {
    return;
  }
  uint64_t now = hora__now_ns();
  if (!k->hold_since) {
    k->hold_since = now;
    take_snap(k, &k->at[2]);
  } else if (now - k->hold_since >= HOLD_NS) {
    take_snap(k, &k->at[2]); /* still the same after turns of the loop */
    k->holding = false;
  }
}

static void *rank_main(void *arg) {
  struct sim *k = arg;
  struct job *job = k->job;
  bool settled = false;
  int rc = HORA_SUCCESS;
  k->holding = k->rank == job->hold_rank;
  for (;;) {
    if (atomic_load(&job->watchdog)) {
      rc = hora__error(HORA_ERR_TIMEOUT, "the test's watchdog ran out (rank %d at cycle %llu, "
                       "phase %d)", k->rank, (unsigned long long)k->set->cycles,
                       k->set->cycle_phase);
      break;
    }
    bool busy = false;
    rc = step(k, &busy);
    if (rc != HORA_SUCCESS) {
      break;
    }
    hold(k);
    if (k->rank == job->die_rank &&
        (k->set->cycle_phase != CYCLE_IDLE || k->set->cycles > 0)) {
      close_all(k); /* gone in the middle of its cycle */
      k->died = true;
      break;
    }
    if (!settled && job->after_step && job->after_step(k)) {
      settled = true;
      atomic_fetch_add(&job->settled, 1);
    }
    if (atomic_load(&job->settled) == job->n && !any_output(k)) {
      break;
    }
    if (!busy) {
      wait_input(k, 5);
    }
  }
  k->rc = rc;
  if (rc != HORA_SUCCESS) {
    snprintf(k->msg, sizeof(k->msg), "%s", hora__error_message());
    close_all(k); /* as the fatal path does: the peers see EOF */
  }
  if (!settled) {
    atomic_fetch_add(&job->settled, 1);
  }
  pthread_mutex_lock(&job->mu);
  job->finished++;
  pthread_cond_signal(&job->cv);
  pthread_mutex_unlock(&job->mu);
  return NULL;
}

/* ---- a job of n ranks -------------------------------------------------------- */

static struct hora__params saved_params;

/* The settings the sets are made with; restored by params_restore. */
static void params_for_cycles(int64_t fusion_threshold) {
  saved_params = hora__params;
  hora__params.CACHE_CAPACITY = CAPACITY;
  hora__params.FUSION_THRESHOLD = fusion_threshold;
  hora__params.CYCLE_TIME = 0; /* rank 0 sends ready responses at once */
  hora__params.EAGER_THRESHOLD = 0; /* no data here: what the cycles schedule, not run */
}

static void params_restore(void) { hora__params = saved_params; }

static int socket_pair(int fds[2]) {
  return socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) == 0
             ? HORA_SUCCESS
             : hora__error_errno(HORA_ERR_SYSTEM, "socketpair");
}

static void job_free(struct job *job) {
  for (int r = 0; job->ranks && r < job->n; r++) {
    sim_free(&job->ranks[r]);
  }
  free(job->ranks);
  job->ranks = NULL;
  pthread_cond_destroy(&job->cv);
  pthread_mutex_destroy(&job->mu);
}

static int job_init(struct job *job, int n) {
  memset(job, 0, sizeof(*job));
  pthread_mutex_init(&job->mu, NULL);
  pthread_cond_init(&job->cv, NULL);
  atomic_init(&job->settled, 0);
  atomic_init(&job->watchdog, false);
  job->n = n;
  job->hold_rank = job->die_rank = -1;
  job->ranks = calloc((size_t)n, sizeof(*job->ranks));
  if (!job->ranks) {
    return HORA_ERR_NO_MEMORY;
  }
  for (int r = 0; r < n; r++) {
    HORA_CHECK(sim_init(&job->ranks[r], r, n));
    job->ranks[r].job = job;
  }
  for (int a = 0; a < n; a++) {
    bool need_a[MAXN];
    peers_of(a, n, need_a);
    for (int b = a + 1; b < n; b++) {
      bool need_b[MAXN];
      peers_of(b, n, need_b);
      if (!need_a[b] && !need_b[a]) {
        continue;
      }
      int fds[2];
      HORA_CHECK(socket_pair(fds));
      job->ranks[a].proc.ctrl[b] = hora__ctrl_new(fds[0], b);
      job->ranks[b].proc.ctrl[a] = hora__ctrl_new(fds[1], a);
      if (!job->ranks[a].proc.ctrl[b] || !job->ranks[b].proc.ctrl[a]) {
        return HORA_ERR_NO_MEMORY;
      }
    }
  }
  return HORA_SUCCESS;
}

static bool wait_finished(struct job *job, int want, int limit_s) {
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += limit_s;
  pthread_mutex_lock(&job->mu);
  int rc = 0;
  while (job->finished < want && rc == 0) {
    rc = pthread_cond_timedwait(&job->cv, &job->mu, &deadline);
  }
  bool all = job->finished >= want;
  pthread_mutex_unlock(&job->mu);
  return all;
}

/* Runs every rank's loop on its own thread. Returns what went wrong, or
 * NULL: a thread that did not start, a job that did not finish in time,
 * or (with want_success) a rank's failure or complaint. */
static const char *job_run(struct job *job, int limit_s, bool want_success, char *why,
                           size_t why_len) {
  int started = 0;
  while (started < job->n &&
         pthread_create(&job->ranks[started].thread, NULL, rank_main, &job->ranks[started]) == 0) {
    started++;
  }
  if (started < job->n) {
    atomic_store(&job->watchdog, true);
  }
  bool in_time = wait_finished(job, started, limit_s);
  if (!in_time) {
    atomic_store(&job->watchdog, true);
    if (!wait_finished(job, started, limit_s)) {
      fprintf(stderr, "cycles of %d ranks: still hanging after the watchdog; giving up\n", job->n);
      abort();
    }
  }
  for (int r = 0; r < started; r++) {
    pthread_join(job->ranks[r].thread, NULL);
  }
  why[0] = '\0';
  if (started < job->n) {
    snprintf(why, why_len, "%d ranks: only %d threads started", job->n, started);
  } else if (!in_time) {
    snprintf(why, why_len, "%d ranks did not finish in %d s", job->n, limit_s);
  }
  /* A failure that is not a lost peer is where it started: the others
   * then lost the rank that failed. */
  for (int pass = 0; pass < 2; pass++) {
    for (int r = 0; r < job->n && !why[0]; r++) {
      struct sim *k = &job->ranks[r];
      if (k->why[0]) {
        snprintf(why, why_len, "%d ranks: %s", job->n, k->why);
      } else if (want_success && k->rc != HORA_SUCCESS &&
                 (pass == 1 || k->rc != HORA_ERR_PEER_LOST)) {
        snprintf(why, why_len, "%d ranks: rank %d failed: %s (%s)", job->n, r, k->msg,
                 hora_strerror(k->rc));
      }
    }
  }
  return why[0] ? why : NULL;
}

/* ---- 1. what a cycle schedules and empties ------------------------------------ */

/* The schedule test's case: which ranks have joined, which slots each waits
 * on, which each wishes emptied, and what the engine's description (top of
 * engine.c) says follows from them. */
struct sched_case {
  int n, mode;
  bool joined[MAXN];
  uint32_t wait[MAXN], wish[MAXN];
  uint32_t scheduled, emptied;
  bool any_joined;
  char todo[1024]; /* the scheduled slots' responses, in slot order, fused */
};

static uint32_t mix(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

/* mode 0: nobody joined; 1: ranks 1, 4, 7 (rank 0 alone) joined; 2: all. */
static void sched_case_make(struct sched_case *c, int n, int mode) {
  memset(c, 0, sizeof(*c));
  c->n = n;
  c->mode = mode;
  int last_free = -1, nfree = 0;
  for (int r = 0; r < n; r++) {
    c->joined[r] = mode == 2 || (mode == 1 && (n == 1 || r % 3 == 1));
    c->any_joined |= c->joined[r];
    if (!c->joined[r]) {
      last_free = r;
      nfree++;
    }
  }
  /* Slots 0, 1, 3 and 4 (a broadcast): every rank that has not joined waits
   * on them; slot 2: all but one of them; 16: the even ranks; 17: nobody;
   * the rest at random. A joined rank waits on nothing. */
  for (int r = 0; r < n; r++) {
    if (c->joined[r]) {
      continue;
    }
    uint32_t w = 1u << 0 | 1u << 1 | 1u << 3 | 1u << 4;
    if (!(r == last_free && nfree > 1)) {
      w |= 1u << 2;
    }
    if (r % 2 == 0) {
      w |= 1u << 16;
    }
    for (int s = 5; s < NSLOTS; s++) {
      if (s != 16 && s != 17 && (mix((uint32_t)(r * 131 + s * 7 + mode * 1009 + n * 31)) & 1)) {
        w |= 1u << s;
      }
    }
    c->wait[r] = w;
  }
  /* Rank 0 wishes slots 1 (scheduled unless all joined) and 16 emptied, the
   * last rank slot 17. */
  c->wish[0] |= 1u << 1 | 1u << 16;
  c->wish[n - 1] |= 1u << 17;
  /* ready AND, submitted OR: a joined rank is ready for every cached
   * allreduce; the slots ready everywhere and submitted somewhere run; the
   * evicted ones that do not run are emptied. */
  uint32_t allreduces = 0;
  for (int s = 0; s < NSLOTS; s++) {
    allreduces |= slot_kind(s) == HORA_KIND_ALLREDUCE ? 1u << s : 0;
  }
  uint32_t ready = ~0u, submitted = 0, wish = 0;
  for (int r = 0; r < n; r++) {
    ready &= c->wait[r] | (c->joined[r] ? allreduces : 0);
    submitted |= c->wait[r];
    wish |= c->wish[r];
  }
  c->scheduled = ready & submitted & ((1u << NSLOTS) - 1);
  c->emptied = wish & ~c->scheduled;
}

static void sched_expected_todo(struct sched_case *c, int64_t fusion) {
  struct hora__response *head = NULL, **tail = &head;
  for (int s = 0; s < NSLOTS; s++) {
    if (c->scheduled >> s & 1) {
      char key[16];
      struct hora__op_meta m;
      slot_key(s, key, sizeof(key));
      slot_meta(s, &m);
      *tail = hora__response_for(&m, key, strlen(key));
      if (*tail) {
        tail = &(*tail)->next;
      }
    }
  }
  (void)hora__responses_fuse(head, &tail, fusion);
  describe(head, c->todo, sizeof(c->todo));
  while (head) {
    struct hora__response *nx = head->next;
    hora__response_free(head);
    head = nx;
  }
}

static bool sched_after_step(struct sim *k) {
  if (k->set->cycles >= 1 && !k->at[0].taken) {
    take_snap(k, &k->at[0]);
  }
  return k->at[0].taken;
}

/* What rank r should show after the cycle. */
static void sched_check(const struct sched_case *c, struct job *job, char *why, size_t n) {
  static const char *const modes[] = {"nobody joined", "some joined", "all joined"};
  for (int r = 0; r < c->n && !why[0]; r++) {
    struct sim *k = &job->ranks[r];
    const struct snap *p = &k->at[0];
    char where[64];
    snprintf(where, sizeof(where), "%d ranks, %s, rank %d", c->n, modes[c->mode], r);
    if (!p->taken || p->cycles != 1 || p->stat_cycles != 1) {
      snprintf(why, n, "%s: at cycle %llu (%s), expected 1", where,
               (unsigned long long)p->cycles, p->taken ? "taken" : "never reached");
    } else if (strcmp(p->todo, c->todo) != 0) {
      snprintf(why, n, "%s scheduled '%s', expected '%s'", where, p->todo, c->todo);
    } else if (p->others_joined != c->any_joined) {
      snprintf(why, n, "%s: others_joined %d, expected %d", where, p->others_joined, c->any_joined);
    }
    uint32_t still = 0;
    for (int s = 0; s < NSLOTS && !why[0]; s++) {
      char key[16];
      slot_key(s, key, sizeof(key));
      bool empty = c->emptied >> s & 1;
      if (p->slot_used[s] == empty || (!empty && strcmp(p->slot_key[s], key) != 0)) {
        snprintf(why, n, "%s: slot %d holds '%s', expected %s", where, s, p->slot_key[s],
                 empty ? "nothing (evicted)" : key);
        break;
      }
      if (!(c->wait[r] >> s & 1)) {
        if (p->waiting[s]) {
          snprintf(why, n, "%s: something waits on slot %d", where, s);
        }
        continue;
      }
      /* Scheduled: the cycle took it off its slot. Emptied, or a
       * non-allreduce while someone has joined: sent to rank 0 in full.
       * Otherwise it still waits. */
      struct hora_request *q = k->on_slot[s];
      bool ran = c->scheduled >> s & 1;
      bool stale = !ran && (empty || (c->any_joined && slot_kind(s) != HORA_KIND_ALLREDUCE));
      bool ok = ran ? !p->waiting[s] && p->sent_slot[s] == s
                    : stale ? !p->waiting[s] && p->sent_slot[s] == -1
                            : p->waiting[s] == q && p->sent_slot[s] == s;
      still += !ran && !stale;
      if (!ok) {
        snprintf(why, n, "%s: its request on slot %d (%s) is %s with sent_slot %d", where, s,
                 ran ? "scheduled" : stale ? "stale" : "not scheduled",
                 p->waiting[s] == q ? "waiting" : p->waiting[s] ? "replaced" : "not waiting",
                 (int)p->sent_slot[s]);
      }
    }
    if (!why[0] && p->nwaiting != still) {
      snprintf(why, n, "%s: nwaiting %u, expected %u", where, p->nwaiting, still);
    }
  }
}

/* Every rank fills its cache alike, waits on its own slots and wishes its
 * own evicted; one cycle runs. Every rank then has scheduled the slots
 * ready everywhere (a joined rank stands in for cached allreduces) and
 * submitted somewhere, in slot order (then fused, identically), emptied
 * the evicted slots that did not run, and taken the scheduled requests off
 * their slots; requests on emptied slots went to rank 0 in full. */
TEST(cycles_schedule_slots_ready_everywhere_and_submitted_somewhere) {
  char why[4096] = "";
  for (size_t i = 0; i < HORA_ARRAY_SIZE(sizes) && !why[0]; i++) {
    for (int mode = 0; mode < 3 && !why[0]; mode++) {
      int n = sizes[i];
      int64_t fusion = mode == 1 ? 64 << 20 : 0; /* fused, and in plain slot order */
      struct sched_case c;
      sched_case_make(&c, n, mode);
      sched_expected_todo(&c, fusion);
      params_for_cycles(fusion);
      struct job job;
      int rc = job_init(&job, n);
      for (int r = 0; r < n && rc == HORA_SUCCESS; r++) {
        struct sim *k = &job.ranks[r];
        fill_cache(k, NSLOTS);
        for (int s = 0; s < NSLOTS; s++) {
          if (c.wait[r] >> s & 1) {
            submit_slot(k, s);
          }
          if (c.wish[r] >> s & 1) {
            hora__engine_wish_evicted(k->set, s);
          }
        }
        k->set->join_pending = c.joined[r]; /* what taking its JOIN request sets */
      }
      job.after_step = sched_after_step;
      if (rc != HORA_SUCCESS) {
        snprintf(why, sizeof(why), "%d ranks: setting up failed: %s", n, hora__error_message());
      } else if (!job_run(&job, JOB_LIMIT_S, true, why, sizeof(why))) {
        sched_check(&c, &job, why, sizeof(why));
      }
      job_free(&job);
      params_restore();
    }
  }
  if (why[0]) {
    FAIL("%s", why);
  }
}

/* ---- 2. rank 0's frames --------------------------------------------------------- */

/* A rank other than 0 none of whose cycle partners is rank 0: its cycle can
 * be done before rank 0's frames reach it. -1 where there is none. */
static int far_from_0(int n) {
  for (int r = n - 1; r > 0; r--) {
    struct hora__cycle_partners cp;
    hora__cycle_partners(r, n, &cp);
    bool near = cp.fold == 0;
    for (int i = 0; i < cp.nrounds; i++) {
      near |= cp.round[i] == 0;
    }
    if (!near) {
      return r;
    }
  }
  return -1;
}

static void fresh_meta(struct hora__op_meta *m) { meta_of(HORA_KIND_ALLREDUCE, 8, m); }

static bool frames_after_step(struct sim *k) {
  if (k->stage == 0 && k->set->cycles >= 1) {
    take_snap(k, &k->at[0]);
    /* Again: now from the cache. */
    struct hora__op_meta m;
    fresh_meta(&m);
    submit(k, &m, "Nfresh");
    k->stage = 1;
  }
  /* A rank may have started the next cycle (asked by a partner) before it
   * took the request: then a later one schedules it. */
  size_t queued = 0;
  for (const struct hora__response *r = k->set->todo; r; r = r->next) {
    queued++;
  }
  if (k->stage == 1 && queued >= 2) {
    take_snap(k, &k->at[1]);
    k->stage = 2;
  }
  return k->stage == 2;
}

static void frames_check(struct job *job, int hold, char *why, size_t n) {
  const char *first = "allreduce[Nfresh]", *second = "allreduce[Nfresh] allreduce[Nfresh]";
  for (int r = 0; r < job->n && !why[0]; r++) {
    struct sim *k = &job->ranks[r];
    const struct snap *a = &k->at[0], *b = &k->at[1], *h = &k->at[2];
    char where[64];
    snprintf(where, sizeof(where), "%d ranks, rank %d", job->n, r);
    if (!a->taken || a->cycles != 1 || a->frames_applied != 1 || a->frames_got != 1) {
      snprintf(why, n, "%s after cycle 1: cycles %llu, frames got %llu, applied %llu (expected 1)",
               where, (unsigned long long)a->cycles, (unsigned long long)a->frames_got,
               (unsigned long long)a->frames_applied);
    } else if (r == 0 && a->frames_told != 1) {
      snprintf(why, n, "%s told %llu frames in cycle 1, expected 1", where,
               (unsigned long long)a->frames_told);
    } else if (strcmp(a->todo, first) != 0) {
      snprintf(why, n, "%s after cycle 1 has '%s', expected '%s'", where, a->todo, first);
    } else if (!a->slot_used[0] || strcmp(a->slot_key[0], "Nfresh") != 0) {
      snprintf(why, n, "%s: the frame did not put Nfresh in slot 0 ('%s')", where, a->slot_key[0]);
    } else if (!b->taken || b->cycles < 2 || b->frames_applied != 1 || b->hits != 1) {
      snprintf(why, n, "%s after cycle 2: cycles %llu, frames applied %llu, cache hits %llu", where,
               (unsigned long long)b->cycles, (unsigned long long)b->frames_applied,
               (unsigned long long)b->hits);
    } else if (strcmp(b->todo, second) != 0 || b->waiting[0] || b->nwaiting != 0) {
      snprintf(why, n, "%s after cycle 2 has '%s' (expected '%s'), %u waiting", where, b->todo,
               second, b->nwaiting);
    } else if (r == hold) {
      /* Its cycle was done, with rank 0's frame counted, before the frame
       * came: the cycle's end waited for it. */
      if (!h->taken || h->phase != CYCLE_DONE || h->cycles != 0 || h->acc_frames != 1 ||
          h->frames_got != 0 || h->frames_applied != 0 || !h->todo_empty) {
        snprintf(why, n, "%s, held from rank 0's frames: %s, phase %d, cycles %llu, acc_frames "
                 "%llu, frames got %llu, applied %llu, todo '%s'", where,
                 h->taken ? "watched" : "never done", h->phase, (unsigned long long)h->cycles,
                 (unsigned long long)h->acc_frames, (unsigned long long)h->frames_got,
                 (unsigned long long)h->frames_applied, h->todo);
      }
    }
  }
}

/* Every rank submits an operation the cache does not have: it goes to rank
 * 0 in full, rank 0's controller matches it and sends one frame of
 * responses, counts it (frames_got) and starts a cycle to tell it
 * (frames_told). Every rank applies the frame at that cycle's end, which
 * puts the operation in slot 0 of every cache; submitted again, it waits on
 * the slot and a later cycle (the first every rank takes it part in with
 * the request) schedules it, on every rank alike. A rank that none of rank 0's
 * steps reaches directly (from 4 ranks on) is kept from reading rank 0's
 * connection: its cycle is done, with the frame counted, and it waits for
 * the frame, ending the cycle only once it has come. */
TEST(cycles_apply_rank_0s_frames_at_their_end) {
  char why[4096] = "";
  for (size_t i = 0; i < HORA_ARRAY_SIZE(sizes) && !why[0]; i++) {
    for (int held = 0; held < 2 && !why[0]; held++) {
      int n = sizes[i], hold = held ? far_from_0(n) : -1;
      if (held && hold < 0) {
        continue; /* every rank hears rank 0's frame before its steps */
      }
      params_for_cycles(64 << 20);
      struct job job;
      int rc = job_init(&job, n);
      for (int r = 0; r < n && rc == HORA_SUCCESS; r++) {
        struct hora__op_meta m;
        fresh_meta(&m);
        submit(&job.ranks[r], &m, "Nfresh");
      }
      job.after_step = frames_after_step;
      job.hold_rank = hold;
      if (rc != HORA_SUCCESS) {
        snprintf(why, sizeof(why), "%d ranks: setting up failed: %s", n, hora__error_message());
      } else if (!job_run(&job, JOB_LIMIT_S, true, why, sizeof(why))) {
        frames_check(&job, hold, why, sizeof(why));
      }
      job_free(&job);
      params_restore();
    }
  }
  if (why[0]) {
    FAIL("%s", why);
  }
}

/* ---- 3. join ------------------------------------------------------------------------ */

static bool join_after_step(struct sim *k) {
  if (k->set->cycles >= 1 && !k->at[0].taken) {
    take_snap(k, &k->at[0]);
  }
  return k->at[0].taken;
}

/* One rank takes a JOIN request (it goes to rank 0 in full, and its join is
 * in flight); the others wait on a cached allreduce. After the cycle every
 * rank knows someone has joined, and the joined rank stood in for the
 * allreduce, which ran everywhere. Alone, rank 0's join is every rank's:
 * the JOIN response comes in the cycle's frame and ends it. */
TEST(cycles_tell_every_rank_someone_joined) {
  char why[4096] = "";
  for (size_t i = 0; i < HORA_ARRAY_SIZE(sizes) && !why[0]; i++) {
    int n = sizes[i];
    int joiners[2] = {0, n - 1};
    for (int t = 0; t < (n > 1 ? 2 : 1) && !why[0]; t++) {
      int j = joiners[t];
      params_for_cycles(64 << 20);
      struct job job;
      int rc = job_init(&job, n);
      for (int r = 0; r < n && rc == HORA_SUCCESS; r++) {
        struct sim *k = &job.ranks[r];
        fill_cache(k, 1);
        if (r == j) {
          struct hora__op_meta m;
          meta_of(HORA_KIND_JOIN, 0, &m);
          submit(k, &m, "J");
        } else {
          submit_slot(k, 0);
        }
      }
      job.after_step = join_after_step;
      if (rc != HORA_SUCCESS) {
        snprintf(why, sizeof(why), "%d ranks: setting up failed: %s", n, hora__error_message());
      } else if (!job_run(&job, JOB_LIMIT_S, true, why, sizeof(why))) {
        for (int r = 0; r < n && !why[0]; r++) {
          const struct snap *p = &job.ranks[r].at[0];
          bool ok = n == 1 ? !p->others_joined && !p->join_pending && strcmp(p->todo, "join[]") == 0
                           : p->others_joined && p->join_pending == (r == j) &&
                                 strcmp(p->todo, "allreduce[Ns00]") == 0;
          if (!p->taken || p->cycles != 1 || !ok) {
            snprintf(why, sizeof(why), "%d ranks, rank %d joined: rank %d after cycle %llu: "
                     "others_joined %d, join_pending %d, todo '%s'", n, j, r,
                     (unsigned long long)p->cycles, p->others_joined, p->join_pending, p->todo);
          }
        }
      }
      job_free(&job);
      params_restore();
    }
  }
  if (why[0]) {
    FAIL("%s", why);
  }
}

/* ---- one rank, with the test at the far ends of its sockets ---------------------- */

struct lone {
  struct sim k;
  int far[MAXN]; /* the test's end of the connection to each peer, or -1 */
};

static int lone_init(struct lone *l, int rank, int n, int nslots) {
  for (int r = 0; r < MAXN; r++) {
    l->far[r] = -1;
  }
  HORA_CHECK(sim_init(&l->k, rank, n));
  bool need[MAXN];
  peers_of(rank, n, need);
  for (int r = 0; r < n; r++) {
    if (!need[r]) {
      continue;
    }
    int fds[2];
    HORA_CHECK(socket_pair(fds));
    l->far[r] = fds[1];
    l->k.proc.ctrl[r] = hora__ctrl_new(fds[0], r);
    if (!l->k.proc.ctrl[r]) {
      close(fds[0]);
      return HORA_ERR_NO_MEMORY;
    }
  }
  fill_cache(&l->k, nslots);
  return HORA_SUCCESS;
}

static void lone_close_far(struct lone *l, int peer) {
  if (l->far[peer] >= 0) {
    close(l->far[peer]);
    l->far[peer] = -1;
  }
}

static void lone_free(struct lone *l) {
  for (int r = 0; r < MAXN; r++) {
    lone_close_far(l, r);
  }
  sim_free(&l->k);
}

/* Writes one control frame, header and payload, as hora__ctrl_send frames it. */
static bool far_send(struct lone *l, int peer, uint16_t type, const void *p, size_t n) {
  uint8_t buf[256];
  if (n + 8 > sizeof(buf) || l->far[peer] < 0) {
    return false;
  }
  uint32_t len = (uint32_t)n;
  buf[0] = (uint8_t)len;
  buf[1] = (uint8_t)(len >> 8);
  buf[2] = (uint8_t)(len >> 16);
  buf[3] = (uint8_t)(len >> 24);
  buf[4] = (uint8_t)type;
  buf[5] = (uint8_t)(type >> 8);
  buf[6] = buf[7] = 0;
  memcpy(buf + 8, p, n);
  return send(l->far[peer], buf, n + 8, MSG_NOSIGNAL) == (ssize_t)(n + 8);
}

/* A cycle step from `peer`, cut to `cut` bytes of payload when that is shorter. */
static bool far_step(struct lone *l, int peer, uint64_t cycle, uint8_t step, uint32_t nbytes,
                     const uint8_t *vec, size_t cut) {
  struct hora__wbuf w = {0};
  struct hora__cycle_msg m = {.cycle = cycle, .step = step, .nbytes = nbytes, .vec = vec};
  hora__encode_cycle(&w, &m);
  bool ok = !w.failed && far_send(l, peer, HORA_MSG_CYCLE, w.data, HORA_MIN(w.len, cut));
  hora__wbuf_free(&w);
  return ok;
}

static bool read_exact(int fd, uint8_t *p, size_t n, int ms) {
  uint64_t deadline = hora__now_ns() + (uint64_t)ms * MS;
  while (n > 0) {
    ssize_t got = recv(fd, p, n, 0);
    if (got > 0) {
      p += got;
      n -= (size_t)got;
      continue;
    }
    if (got == 0 || (errno != EAGAIN && errno != EINTR) || hora__now_ns() >= deadline) {
      return false;
    }
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    (void)poll(&pf, 1, 10);
  }
  return true;
}

/* The next frame the rank wrote to `peer`: a cycle step, decoded into *m
 * (its vectors copied to vec). */
static bool far_recv_step(struct lone *l, int peer, struct hora__cycle_msg *m, uint8_t *vec,
                          size_t vec_cap) {
  uint8_t h[8], body[256];
  if (l->far[peer] < 0 || !read_exact(l->far[peer], h, 8, 2000)) {
    return false;
  }
  uint32_t len = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
  uint16_t type = (uint16_t)(h[4] | h[5] << 8);
  if (len > sizeof(body) || !read_exact(l->far[peer], body, len, 2000) || type != HORA_MSG_CYCLE ||
      hora__decode_cycle(body, len, m) != HORA_SUCCESS ||
      HORA_CYCLE_VECTORS * (size_t)m->nbytes > vec_cap) {
    return false;
  }
  memcpy(vec, m->vec, HORA_CYCLE_VECTORS * (size_t)m->nbytes);
  m->vec = vec;
  return true;
}

/* Nothing from the rank on the connection to `peer`, now. */
static bool far_silent(struct lone *l, int peer) {
  struct pollfd pf = {.fd = l->far[peer], .events = POLLIN};
  return poll(&pf, 1, 0) == 0;
}

/* Turns of the rank's loop until one fails, or `until` holds, or `ms` pass
 * (then HORA_ERR_TIMEOUT: the rank hangs). */
static int lone_run(struct lone *l, bool (*until)(struct hora__set *), int ms) {
  uint64_t deadline = hora__now_ns() + (uint64_t)ms * MS;
  for (;;) {
    bool busy = false;
    HORA_CHECK(step(&l->k, &busy));
    if (until && until(l->k.set)) {
      return HORA_SUCCESS;
    }
    if (hora__now_ns() >= deadline) {
      return hora__error(HORA_ERR_TIMEOUT, "the rank neither failed nor got there in %d ms", ms);
    }
    if (!busy) {
      wait_input(&l->k, 5);
    }
  }
}

/* One turn, as soon as something has come: for a frame the test just wrote. */
static int lone_turn(struct lone *l) {
  wait_input(&l->k, 200);
  bool busy = false;
  return step(&l->k, &busy);
}

static bool cycle_1_done(struct hora__set *set) { return set->cycles >= 1; }

/* ---- 4. steps refused ------------------------------------------------------------ */

struct refusal {
  const char *what;
  int rank, n, from, cut;
  uint64_t cycle;
  uint8_t step;
  uint32_t nbytes;
  const char *expect;
};

/* Each a fresh rank, idle at cycle 0 with 3 cached slots (1 byte of bits),
 * that reads one raw step. */
static const struct refusal refusals[] = {
    {"a step from a rank that is not its partner", 1, 4, 3, -1, 1, 1, 1,
     "rank 3 sent step 1 of cycle 1, which this rank (at cycle 0) does not expect from it"},
    {"a fold from a rank that does not fold into it", 1, 4, 3, -1, 1, HORA_STEP_FOLD_IN, 1,
     "rank 3 sent step 0 of cycle 1, which this rank (at cycle 0) does not expect from it"},
    {"rank 0's step from rank 3", 0, 5, 3, -1, 1, HORA_STEP_FOLD_IN, 1,
     "rank 3 sent step 0 of cycle 1, which this rank (at cycle 0) does not expect from it"},
    {"a result to a rank that takes none", 0, 5, 4, -1, 1, HORA_STEP_FOLD_OUT, 1,
     "rank 4 sent step 32 of cycle 1, which this rank (at cycle 0) does not expect from it"},
    {"a step three cycles ahead", 1, 4, 0, -1, 3, 1, 1,
     "rank 0 sent step 1 of cycle 3, which this rank (at cycle 0) does not expect from it"},
    {"a step of cycle 0", 1, 4, 0, -1, 0, 1, 1,
     "rank 0 sent step 1 of cycle 0, which this rank (at cycle 0) does not expect from it"},
    {"a round that does not exist", 1, 4, 3, -1, 1, 3, 1, "rank 3 sent step 3 of cycle 1"},
    {"a truncated step", 1, 4, 0, 20, 1, 1, 1, "rank 0 sent a malformed cycle message"},
    {"more bits than the cache", 1, 4, 0, -1, 1, 1, CAPACITY / 8 + 1,
     "rank 0 sent 9 bytes of cache bits in step 1 of cycle 1; this rank's cache has 8"},
    {"an ask with bits", 5, 7, 1, -1, 1, HORA_STEP_ASK, 1,
     "rank 1 sent 1 bytes of cache bits in step 33 of cycle 1"},
};

/* Steps from a rank that is not the step's partner, for a cycle out of the
 * two ahead, malformed, or with more bits than the cache, fail the rank
 * with HORA_ERR_PROTOCOL naming the rank that sent them. So do a step sent
 * twice, a partner whose cache is out of step with ours, and, once a cycle
 * has ended, its steps again or steps of a cycle too far ahead. */
TEST(cycle_steps_from_the_wrong_rank_or_cycle_fail_naming_it) {
  char why[4096] = "";
  const uint8_t vec[HORA_CYCLE_VECTORS * (CAPACITY / 8 + 1)] = {0};
  params_for_cycles(64 << 20);
  for (size_t i = 0; i < HORA_ARRAY_SIZE(refusals) && !why[0]; i++) {
    const struct refusal *f = &refusals[i];
    struct lone l;
    int rc = lone_init(&l, f->rank, f->n, 3);
    bool sent = rc == HORA_SUCCESS &&
                far_step(&l, f->from, f->cycle, f->step, f->nbytes, vec,
                         f->cut < 0 ? SIZE_MAX : (size_t)f->cut);
    if (sent) {
      rc = lone_turn(&l);
    }
    if (!sent || rc != HORA_ERR_PROTOCOL || !strstr(hora__error_message(), f->expect)) {
      snprintf(why, sizeof(why), "%s (to rank %d of %d): %s, rc %d: '%s', expected '%s'", f->what,
               f->rank, f->n, sent ? "sent" : "not sent", rc, hora__error_message(), f->expect);
    }
    if (!why[0] && l.k.why[0]) {
      snprintf(why, sizeof(why), "%s", l.k.why);
    }
    lone_free(&l);
  }

  /* Rank 1 of 4, its partners played by the test: rank 0 in round 1, rank 3
   * in round 2. Its requests wait on slots 0 and 1. */
  struct hora__cycle_msg m;
  uint8_t got[HORA_CYCLE_VECTORS * 8];
  struct lone l;
  bool made = !why[0];
  int rc = made ? lone_init(&l, 1, 4, 3) : HORA_SUCCESS;
  if (made && rc != HORA_SUCCESS) {
    snprintf(why, sizeof(why), "setting up rank 1 of 4 failed: %s", hora__error_message());
  }
  if (!why[0]) {
    submit_slot(&l.k, 0);
    submit_slot(&l.k, 1);
    rc = lone_run(&l, NULL, 20); /* it starts: step 1 to rank 0, then waits */
    if (rc != HORA_ERR_TIMEOUT || !far_recv_step(&l, 0, &m, got, sizeof(got)) || m.cycle != 1 ||
        m.step != 1 || m.nbytes != 1 || got[0] != 0x03 || got[1] != 0x03 || got[2] != 0 ||
        !far_silent(&l, 3)) {
      snprintf(why, sizeof(why), "rank 1 of 4 did not send step 1 of cycle 1 (slots 0 and 1 "
               "ready and submitted) to rank 0 alone, and wait (rc %d)", rc);
    }
  }
  if (!why[0]) {
    /* Rank 0 sends its step twice, both there before the rank reads: the
     * second is refused, the first kept. */
    const uint8_t v0[4] = {0x01, 0x01, 0x04, 0x00}; /* ready: slot 0; evict: slot 2 */
    bool sent = far_step(&l, 0, 1, 1, 1, v0, SIZE_MAX) && far_step(&l, 0, 1, 1, 1, v0, SIZE_MAX);
    rc = sent ? lone_turn(&l) : -1;
    if (rc != HORA_ERR_PROTOCOL ||
        !strstr(hora__error_message(), "rank 0 sent step 1 of cycle 1 twice")) {
      snprintf(why, sizeof(why), "a step sent twice: rc %d: '%s'", rc, hora__error_message());
    } else {
      rc = lone_run(&l, NULL, 20); /* takes the first: round 2 goes out */
      if (rc != HORA_ERR_TIMEOUT) {
        snprintf(why, sizeof(why), "after the step sent twice: rc %d: '%s'", rc,
                 hora__error_message());
      }
    }
  }
  if (!why[0]) {
    /* Round 2 goes to rank 3 with what rank 0 added; rank 3's step ends the
     * cycle: slot 0 runs, slot 2 is emptied, slot 1 still waits. */
    const uint8_t v3[4] = {0x03, 0x02, 0x00, 0x00};
    bool out = far_recv_step(&l, 3, &m, got, sizeof(got)) && m.cycle == 1 && m.step == 2 &&
               m.nbytes == 1 && got[0] == 0x01 && got[1] == 0x03 && got[2] == 0x04;
    rc = out && far_step(&l, 3, 1, 2, 1, v3, SIZE_MAX) ? lone_run(&l, cycle_1_done, 2000) : -1;
    struct snap p = {0};
    take_snap(&l.k, &p);
    if (!out || rc != HORA_SUCCESS || strcmp(p.todo, "allreduce[Ns00]") != 0 || p.slot_used[2] ||
        !p.slot_used[1] || p.waiting[1] != l.k.on_slot[1] || p.waiting[0]) {
      snprintf(why, sizeof(why), "the played cycle: round 2 %s, rc %d (%s), todo '%s', slot 2 %s, "
               "slot 1 %s", out ? "right" : "wrong", rc, rc ? hora__error_message() : "",
               p.todo, p.slot_used[2] ? "kept" : "emptied",
               p.waiting[1] == l.k.on_slot[1] ? "waits" : "does not wait");
    }
  }
  /* At cycle 1: its steps again, and cycle 4, are refused; 2 and 3 are kept. */
  static const struct {
    int from;
    uint64_t cycle;
    uint8_t step;
    const char *expect; /* NULL: accepted */
  } after[] = {
      {3, 1, 2, "rank 3 sent step 2 of cycle 1, which this rank (at cycle 1) does not expect"},
      {0, 4, 1, "rank 0 sent step 1 of cycle 4, which this rank (at cycle 1) does not expect"},
      {0, 3, 1, NULL},
      {3, 2, 2, NULL},
      {3, 2, 2, "rank 3 sent step 2 of cycle 2 twice"},
  };
  for (size_t i = 0; i < HORA_ARRAY_SIZE(after) && !why[0]; i++) {
    const uint8_t v[4] = {0, 0, 0, 0};
    rc = far_step(&l, after[i].from, after[i].cycle, after[i].step, 1, v, SIZE_MAX)
             ? lone_turn(&l)
             : -1;
    bool ok = after[i].expect
                  ? rc == HORA_ERR_PROTOCOL && strstr(hora__error_message(), after[i].expect)
                  : rc == HORA_SUCCESS;
    if (!ok) {
      snprintf(why, sizeof(why), "at cycle 1, step %u of cycle %llu from rank %d: rc %d '%s', "
               "expected %s", after[i].step, (unsigned long long)after[i].cycle, after[i].from, rc,
               rc ? hora__error_message() : "", after[i].expect ? after[i].expect : "kept");
    }
  }
  if (!why[0]) {
    /* Rank 3's step of cycle 2 started cycle 2 (it asks this rank to take
     * part): it went to rank 0 first; rank 0's answer claims 2 bytes of bits
     * against our 1: the caches are out of step. */
    const uint8_t v[8] = {0};
    bool out = far_recv_step(&l, 0, &m, got, sizeof(got)) && m.cycle == 2 && m.step == 1;
    rc = out && far_step(&l, 0, 2, 1, 2, v, SIZE_MAX) ? lone_run(&l, NULL, 2000) : -1;
    if (!out || rc != HORA_ERR_PROTOCOL ||
        !strstr(hora__error_message(), "rank 0's response cache is out of step with this rank's "
                                       "(2 against 1 bytes of bits in cycle 2)")) {
      snprintf(why, sizeof(why), "a partner's cache out of step: step 1 of cycle 2 %s, rc %d: '%s'",
               out ? "out" : "not out", rc, hora__error_message());
    }
  }
  if (made) {
    if (!why[0] && l.k.why[0]) {
      snprintf(why, sizeof(why), "%s", l.k.why);
    }
    lone_free(&l);
  }
  params_restore();
  if (why[0]) {
    FAIL("%s", why);
  }
}

/* ---- 5. partners lost ------------------------------------------------------------ */

struct loss {
  const char *what;
  int rank, n;
  bool start_first; /* a cached request starts its cycle before the loss */
  int feed_from;    /* a partner whose step it gets first (-1: none) */
  uint8_t feed_step;
  int lose;         /* the partner whose socket the test closes */
  const char *expect;
};

static const struct loss losses[] = {
    {"rank 1 of 4 waits for round 2 from rank 3", 1, 4, true, 0, 1, 3,
     "lost rank 3: its control connection closed"},
    {"rank 1 of 4 waits for round 1 from rank 0", 1, 4, true, -1, 0, 0,
     "lost rank 0: its control connection closed"},
    {"rank 0 of 3 waits for rank 2's fold", 0, 3, true, -1, 0, 2,
     "lost rank 2: its control connection closed"},
    {"rank 2 of 3 waits for its result from rank 0", 2, 3, true, -1, 0, 0,
     "lost rank 0: its control connection closed"},
    {"rank 5 of 7 waits for its result from rank 1", 5, 7, true, -1, 0, 1,
     "lost rank 1: its control connection closed"},
    /* Idle, it takes the close of a partner it does not need now quietly
     * (rank 0 hears of a real loss); the cycle that needs it fails when it
     * would send it round 2. */
    {"idle rank 1 of 4 lost rank 3, then cycles", 1, 4, false, 0, 1, 3,
     "lost rank 3: its control connection closed"},
};

/* The job's other ranks, after one closed its sockets mid-cycle. */
static void lost_check(struct job *job, char *why, size_t n) {
  for (int r = 0; r < job->n && !why[0]; r++) {
    struct sim *k = &job->ranks[r];
    if (r == job->die_rank) {
      if (!k->died) {
        snprintf(why, n, "%d ranks: rank %d never started its cycle (rc %d: %s)", job->n, r, k->rc,
                 k->msg);
      }
    } else if (k->rc != HORA_ERR_PEER_LOST || !strstr(k->msg, "lost rank")) {
      snprintf(why, n, "%d ranks, rank %d gone mid-cycle: rank %d ended with rc %d (%s), "
               "expected HORA_ERR_PEER_LOST", job->n, job->die_rank, r, k->rc, k->msg);
    }
  }
}

/* A partner whose socket closes while this rank's cycle needs it fails the
 * rank with HORA_ERR_PEER_LOST naming it, whichever step it waited for (a
 * round, a fold, the result) or was about to send; it never hangs. And in a
 * job, a rank gone in the middle of its cycle fails every other rank so,
 * within seconds: those waiting for it, rank 0 (which hears every rank), and
 * through rank 0 all the others. */
TEST(cycle_partner_lost_mid_cycle_fails_with_peer_lost) {
  char why[4096] = "";
  params_for_cycles(64 << 20);
  for (size_t i = 0; i < HORA_ARRAY_SIZE(losses) && !why[0]; i++) {
    const struct loss *f = &losses[i];
    struct lone l;
    int rc = lone_init(&l, f->rank, f->n, 1);
    if (rc == HORA_SUCCESS && !f->start_first) {
      lone_close_far(&l, f->lose);
      rc = lone_run(&l, NULL, 50);
      rc = rc == HORA_ERR_TIMEOUT && !l.k.proc.ctrl[f->lose] ? HORA_SUCCESS : -2;
    }
    if (rc == HORA_SUCCESS) {
      submit_slot(&l.k, 0);
      rc = lone_run(&l, NULL, 20);
      rc = rc == HORA_ERR_TIMEOUT ? HORA_SUCCESS : rc; /* started, waiting */
    }
    if (rc == HORA_SUCCESS && f->feed_from >= 0) {
      const uint8_t v[4] = {1, 1, 0, 0};
      rc = far_step(&l, f->feed_from, 1, f->feed_step, 1, v, SIZE_MAX) ? lone_turn(&l) : -1;
    }
    int phase = l.k.set ? l.k.set->cycle_phase : -1;
    if (rc == HORA_SUCCESS) {
      if (f->start_first) {
        rc = lone_run(&l, NULL, 20);
        rc = rc == HORA_ERR_TIMEOUT ? HORA_SUCCESS : rc; /* still waiting */
        phase = l.k.set->cycle_phase;
        lone_close_far(&l, f->lose);
      }
      if (rc == HORA_SUCCESS) {
        rc = lone_run(&l, cycle_1_done, LOST_LIMIT_S * 1000);
      }
    }
    if (rc != HORA_ERR_PEER_LOST || !strstr(hora__error_message(), f->expect) ||
        phase == CYCLE_IDLE || phase == CYCLE_DONE) {
      snprintf(why, sizeof(why), "%s (phase %d when lost): rc %d '%s', expected '%s'", f->what,
               phase, rc, hora__error_message(), f->expect);
    }
    lone_free(&l);
  }
  params_restore();

  for (size_t i = 0; i < HORA_ARRAY_SIZE(sizes) && !why[0]; i++) {
    int n = sizes[i];
    int dying[2] = {0, n - 1};
    for (int t = 0; t < 2 && n > 1 && !why[0]; t++) {
      params_for_cycles(64 << 20);
      struct job job;
      int rc = job_init(&job, n);
      for (int r = 0; r < n && rc == HORA_SUCCESS; r++) {
        fill_cache(&job.ranks[r], 1);
      }
      /* Only the rank that goes starts a cycle: it is gone before any
       * partner's step can have reached it. */
      if (rc == HORA_SUCCESS) {
        submit_slot(&job.ranks[dying[t]], 0);
      }
      job.die_rank = dying[t];
      if (rc != HORA_SUCCESS) {
        snprintf(why, sizeof(why), "%d ranks: setting up failed: %s", n, hora__error_message());
      } else if (!job_run(&job, LOST_LIMIT_S, false, why, sizeof(why))) {
        lost_check(&job, why, sizeof(why));
      }
      job_free(&job);
      params_restore();
    }
  }
  if (why[0]) {
    FAIL("%s", why);
  }
}
