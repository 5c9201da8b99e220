/* Deterministic simulation of the elastic membership agreement: the real
 * state machine (comm/bootstrap/membership_fsm.c) in N simulated processes,
 * one OS thread, driven by a seeded scheduler. The network delays, reorders,
 * drops and duplicates frames, and cuts and heals links (one way too);
 * processes crash at any step (between two frames of one step too), come
 * back as newcomers, pause past the timeouts, notice losses late; newcomers
 * knock at any time; a process of another job sharing the secret and, for
 * jobs without a secret, a forger spoofing a member's address send their
 * own frames. A model of the runtime above it (worlds trained in, builds,
 * commit points) turns decisions into the next events.
 *
 * After every event: no two processes hold different views of one epoch;
 * epochs only grow; a view holds a quorum of the one before it, only its
 * members and newcomers that asked, at most HORA_ELASTIC_MAX_SIZE and at
 * least HORA_ELASTIC_MIN_SIZE; at most one world trains at a time. At the
 * end (faults stop, links heal): with a quorum of the last view alive,
 * every member trains in it; every other process failed with a clear error.
 *
 * usage: membership_sim [--seeds N] [--first S] [--nmin A] [--nmax B]
 *                       [--mutant NAME --expect-find] [--quiet]
 * SEED=N reruns seed N alone with a trace of every event. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <arpa/inet.h>

#include "base/log.h"
#include "comm/bootstrap/membership_fsm.h"

#define MS 1000000ull
#define SEC 1000000000ull
#define MAXP 40       /* processes of one schedule, newcomers and strangers included */
#define MAXE 64       /* epochs recorded */

/* ---- randomness --------------------------------------------------------------------- */

struct rng {
  uint64_t s;
};
static uint64_t rnd(struct rng *r) { /* splitmix64 */
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static uint64_t below(struct rng *r, uint64_t n) { return n ? rnd(r) % n : 0; }
static uint64_t between(struct rng *r, uint64_t lo, uint64_t hi) {
  return hi <= lo ? lo : lo + below(r, hi - lo + 1);
}
static bool chance(struct rng *r, double p) { return (double)(rnd(r) >> 11) * 0x1.0p-53 < p; }

/* ---- events ------------------------------------------------------------------------ */

enum ev_kind {
  E_DELIVER, E_HINT, E_TIMER, E_APP_RESET, E_BUILD_FAIL, E_CRASH, E_PAUSE, E_RESUME, E_CUT,
  E_HEAL, E_NEWCOMER, E_COMMIT_POINT, E_CALM, E_STRANGER, E_FORGER,
};

struct event {
  uint64_t t, seq;
  enum ev_kind kind;
  int p, q;
  uint32_t ip, src_ip;
  uint16_t port;
  int why;
  uint64_t aux;
  uint8_t *frame;
  size_t len;
};

struct heap {
  struct event *e;
  size_t n, cap;
};

static bool ev_before(const struct event *a, const struct event *b) {
  return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}
static void heap_push(struct heap *h, struct event ev) {
  if (h->n == h->cap) {
    h->cap = h->cap ? 2 * h->cap : 1024;
    h->e = realloc(h->e, h->cap * sizeof(*h->e));
    if (!h->e) {
      abort();
    }
  }
  size_t i = h->n++;
  while (i > 0 && ev_before(&ev, &h->e[(i - 1) / 2])) {
    h->e[i] = h->e[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h->e[i] = ev;
}
static struct event heap_pop(struct heap *h) {
  struct event top = h->e[0], last = h->e[--h->n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= h->n) {
      break;
    }
    if (c + 1 < h->n && ev_before(&h->e[c + 1], &h->e[c])) {
      c++;
    }
    if (!ev_before(&h->e[c], &last)) {
      break;
    }
    h->e[i] = h->e[c];
    i = c;
  }
  if (h->n) {
    h->e[i] = last;
  }
  return top;
}

/* ---- the simulated job ------------------------------------------------------------- */

enum app { A_TRAIN, A_RESET, A_BUILD, A_JOIN, A_FAILED, A_DEAD };
static const char *const app_names[] = {"train", "reset", "build", "join", "failed", "dead"};

struct proc {
  int idx;
  uint32_t ip; /* network order */
  uint16_t port, build_port;
  struct hora__mfsm *sm;
  enum app app;
  bool alive;     /* not crashed, not exited */
  bool host_down; /* crashed with its host: peers' dials time out, not refused */
  bool newcomer, outsider; /* outsider: of another job, or a forger: not checked */
  bool forger;             /* spoofs another's address; cannot prove a secret */
  uint32_t true_ip;        /* a forger's own address (its frames claim another) */
  uint64_t paused_until;
  uint64_t timer_due;
  uint64_t world; /* A_TRAIN: the epoch of the world it trains in */
  uint64_t build_epoch, build_deadline;
  uint32_t build_ip;
  uint16_t build_host_port;
  int attempts;
  bool reset_planned, slow, mid_crash;
  uint64_t last_epoch;
  uint64_t promised_seen; /* the acceptor's promise, for the monotony check */
  int fail_code;
  char fail_msg[480];
  uint64_t hint_at[MAXP + 2]; /* rate limit of unreachable hints, by destination */
};

struct config {
  int n, min_size, max_size;
  uint64_t timeout;
  bool insecure;
  double drop, dup, slow_msg;
  uint64_t lat_min, lat_max;
  uint64_t chaos_end;
  unsigned mutants;
};

struct sim {
  uint64_t seed;
  struct rng r;
  struct config c;
  struct heap h;
  uint64_t now, seq;
  struct proc p[MAXP];
  int np;
  bool cut[MAXP][MAXP]; /* cut[a][b]: frames from a to b are lost */
  int door;             /* the process holding the door, or -1 */
  uint64_t job;
  struct hora__view views[MAXE]; /* the committed view of each epoch, as first learned */
  bool have_view[MAXE];
  struct span {
    int a, b; /* a cut from a to b, or a pause of a (b = -1) */
    uint64_t t0, t1;
  } spans[16];
  int nspans;
  bool calm;
  bool strict; /* only crashes, drops and delays: no cut, pause or late member */
  bool trace;
  char violation[1024];
  /* counts */
  uint64_t events, commits, crashes, resets_seen, joins_admitted;
  uint64_t final_epoch;
  uint64_t window, in_window; /* events in the current 100 ms */
};

static const uint32_t DOOR_IP = 0x0a00fffe;
static const uint16_t DOOR_PORT = 29500;

static void trace(struct sim *S, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void trace(struct sim *S, const char *fmt, ...) {
  if (!S->trace) {
    return;
  }
  va_list ap;
  va_start(ap, fmt);
  printf("%9.3f  ", (double)S->now / SEC);
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
}

static void violate(struct sim *S, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void violate(struct sim *S, const char *fmt, ...) {
  if (S->violation[0]) {
    return;
  }
  va_list ap;
  va_start(ap, fmt);
  int w = snprintf(S->violation, sizeof(S->violation), "at %.3f s: ", (double)S->now / SEC);
  vsnprintf(S->violation + w, sizeof(S->violation) - (size_t)w, fmt, ap);
  va_end(ap);
  trace(S, "VIOLATION %s", S->violation);
}

static void push(struct sim *S, struct event e) {
  e.seq = S->seq++;
  heap_push(&S->h, e);
}

static int proc_by_addr(struct sim *S, uint32_t ip, uint16_t port) {
  for (int i = 0; i < S->np; i++) {
    if (S->p[i].ip == ip && S->p[i].port == port && !S->p[i].outsider) {
      return i;
    }
  }
  for (int i = 0; i < S->np; i++) {
    if (S->p[i].ip == ip && S->p[i].port == port) {
      return i;
    }
  }
  return -1;
}

static int proc_of_member(struct sim *S, const struct hora__member *m) {
  return proc_by_addr(S, m->ip, m->port);
}

static bool paused(const struct sim *S, const struct proc *p) { return p->paused_until > S->now; }

static void sm_log(void *arg, int level, const char *msg) {
  struct proc *p = arg;
  (void)level;
  extern struct sim *current_sim;
  if (current_sim && current_sim->trace) {
    printf("%9.3f  p%d log: %s\n", (double)current_sim->now / SEC, p->idx, msg);
  }
}
struct sim *current_sim;
static bool skip_spurious; /* --safety-only: leave out the checks of needless resets */

/* ---- processes ------------------------------------------------------------------------ */

static struct proc *new_proc(struct sim *S, bool newcomer) {
  if (S->np == MAXP) {
    return NULL;
  }
  struct proc *p = &S->p[S->np];
  memset(p, 0, sizeof(*p));
  p->idx = S->np++;
  p->ip = htonl(0x0a000001u + (uint32_t)p->idx);
  p->true_ip = p->ip;
  p->port = (uint16_t)(5000 + p->idx);
  p->build_port = (uint16_t)(7000 + p->idx);
  p->alive = true;
  p->newcomer = newcomer;
  p->timer_due = UINT64_MAX;
  struct hora__mfsm_config c = {
      .ip = p->ip, .port = p->port, .min_size = S->c.min_size, .max_size = S->c.max_size,
      .elastic_timeout_ns = S->c.timeout, .insecure = S->c.insecure,
      .seed = S->seed * 1000003u + (uint64_t)p->idx + 1, .log = sm_log, .log_arg = p,
      .mutants = S->c.mutants};
  if (hora__mfsm_new(&c, &p->sm) != 0) {
    abort();
  }
  return p;
}

static void check_all(struct sim *S);
static void handle_outputs(struct sim *S, struct proc *p);

static void schedule_timer(struct sim *S, struct proc *p) {
  if (!p->alive) {
    return;
  }
  uint64_t due = hora__mfsm_next_tick(p->sm);
  if (due == UINT64_MAX) {
    return;
  }
  due = due < S->now ? S->now : due;
  if (due < p->timer_due) {
    p->timer_due = due;
    push(S, (struct event){.t = due, .kind = E_TIMER, .p = p->idx});
  }
}

static void kill_proc(struct sim *S, struct proc *p, bool host_down, const char *why) {
  if (!p->alive) {
    return;
  }
  trace(S, "p%d %s%s", p->idx, why, host_down ? " (its host down)" : "");
  p->alive = false;
  p->host_down = host_down;
  if (p->app != A_FAILED) {
    p->app = A_DEAD;
  }
  if (S->door == p->idx) {
    S->door = -1;
  }
}

/* ---- the network --------------------------------------------------------------------- */

static void hint(struct sim *S, struct proc *src, uint32_t ip, uint16_t port, int dst,
                 enum hora__mb_unreachable why) {
  int slot = dst >= 0 ? dst : MAXP + (ip == DOOR_IP);
  uint64_t wait = why == HORA_MB_SILENT ? HORA_MB_PROBE_NS : 200 * MS;
  if (src->hint_at[slot] && S->now < src->hint_at[slot] + wait) {
    return;
  }
  src->hint_at[slot] = S->now;
  uint64_t delay = why == HORA_MB_SILENT ? HORA_MB_PROBE_NS : between(&S->r, 50000, 1 * MS);
  push(S, (struct event){.t = S->now + delay, .kind = E_HINT, .p = src->idx, .ip = ip,
                         .port = port, .why = why});
}

static void net_send(struct sim *S, struct proc *src, struct hora__mfsm_send *m) {
  int d = m->ip == DOOR_IP && m->port == DOOR_PORT ? S->door : proc_by_addr(S, m->ip, m->port);
  if (S->trace) {
    char what[400];
    hora__mfsm_describe(m->frame, m->len, what, sizeof(what));
    trace(S, "p%d -> p%d%s: %s", src->idx, d, m->ip == DOOR_IP ? " (door)" : "", what);
  }
  struct proc *dst = d >= 0 ? &S->p[d] : NULL;
  if (src->forger && !S->c.insecure) {
    free(m->frame); /* a forger cannot prove the secret: the handshake stops it */
    return;
  }
  if (!dst || !dst->alive) {
    hint(S, src, m->ip, m->port, d, dst && dst->host_down ? HORA_MB_SILENT : HORA_MB_REFUSED);
    free(m->frame);
    return;
  }
  uint32_t type = m->len >= 4 ? ntohl(*(uint32_t *)m->frame) : 0;
  bool door_frame = type == 2 || type == 8 || type == 9 || type == 10; /* join, commit, refuse, redirect */
  if (!door_frame && !dst->outsider && !src->outsider && hora__mfsm_view(dst->sm)->n == 0) {
    /* A newcomer not yet admitted knows no member key: the member-kind
     * handshake fails, as in the real driver. */
    hint(S, src, m->ip, m->port, d, HORA_MB_FOREIGN);
    free(m->frame);
    return;
  }
  if (S->cut[src->idx][d]) {
    hint(S, src, m->ip, m->port, d, HORA_MB_SILENT);
    free(m->frame);
    return;
  }
  if (!S->calm && chance(&S->r, S->c.drop)) {
    trace(S, "  (dropped)");
    free(m->frame);
    return;
  }
  int copies = !S->calm && chance(&S->r, S->c.dup) ? 2 : 1;
  for (int k = 0; k < copies; k++) {
    uint64_t lat = between(&S->r, S->c.lat_min, S->c.lat_max);
    if (!S->calm && chance(&S->r, S->c.slow_msg)) {
      lat += between(&S->r, 100 * MS, 3 * SEC);
    }
    uint8_t *f = k == 0 ? m->frame : malloc(m->len);
    if (!f) {
      abort();
    }
    if (k) {
      memcpy(f, m->frame, m->len);
    }
    push(S, (struct event){.t = S->now + lat, .kind = E_DELIVER, .p = d, .frame = f, .len = m->len,
                           .src_ip = src->true_ip});
  }
}

/* ---- the runtime above the agreement ---------------------------------------------- */

static void plan_reset(struct sim *S, struct proc *p, uint64_t delay) {
  if (p->reset_planned || !p->alive || p->app != A_TRAIN || p->outsider) {
    return;
  }
  p->reset_planned = true;
  push(S, (struct event){.t = S->now + delay, .kind = E_APP_RESET, .p = p->idx});
}

static uint64_t notice_delay(struct sim *S, struct proc *p) {
  return p->slow ? between(&S->r, S->c.timeout / 2, S->c.timeout * 3 / 2)
                 : between(&S->r, 1 * MS, 800 * MS);
}

static void start_reset(struct sim *S, struct proc *p) {
  p->app = A_RESET;
  S->resets_seen++;
  trace(S, "p%d calls hora_elastic_reset", p->idx);
  hora__mfsm_reset(p->sm, S->now, p->build_port);
  handle_outputs(S, p);
}

static bool span_hits(const struct sim *S, int a, int b, uint64_t t0, uint64_t t1) {
  for (int k = 0; k < S->nspans; k++) {
    const struct span *x = &S->spans[k];
    bool who = x->b < 0 ? (x->a == a || x->a == b) : (x->a == a && x->b == b) ||
                                                      (x->a == b && x->b == a);
    if (who && x->t0 <= t1 && x->t1 >= t0) {
      return true;
    }
  }
  return false;
}

/* A failure for want of a quorum while a quorum of its view, this process
 * among them, lived and reached each other the whole while before: the
 * liveness the protocol promises is broken. */
static void check_quorum_failure(struct sim *S, struct proc *p) {
  const struct hora__view *v = hora__mfsm_view(p->sm);
  uint64_t t1 = S->now, t0 = t1 > 2 * S->c.timeout + 20 * SEC ? t1 - 2 * S->c.timeout - 20 * SEC : 0;
  bool in[4096] = {false};
  int set[64], n = 0;
  set[n++] = p->idx;
  for (int k = 0; k < v->n && k < 4096; k++) {
    int q = proc_of_member(S, &v->m[k]);
    if (q == p->idx) {
      in[k] = true;
      continue;
    }
    if (q < 0 || !S->p[q].alive || S->p[q].slow || span_hits(S, q, q, t0, t1) || n >= 64) {
      continue;
    }
    bool ok = true;
    for (int j = 0; j < n && ok; j++) {
      ok = !span_hits(S, q, set[j], t0, t1);
    }
    if (ok) {
      in[k] = true;
      set[n++] = q;
    }
  }
  if (!p->slow && !span_hits(S, p->idx, p->idx, t0, t1) && hora__mb_quorum(v, in) &&
      n >= S->c.min_size) {
    violate(S, "p%d failed for want of a quorum while %d of the %d members of membership %llu, "
            "it among them, lived and reached each other for %.0f s before", p->idx, n, v->n,
            (unsigned long long)v->epoch, (double)(t1 - t0) / SEC);
  }
}

/* Every member of p's world trains in it, and none is about to reset. */
static bool world_whole(struct sim *S, const struct proc *p) {
  const struct hora__view *w = &S->views[p->world];
  for (int k = 0; k < w->n; k++) {
    int q = proc_of_member(S, &w->m[k]);
    const struct proc *o = q >= 0 ? &S->p[q] : NULL;
    if (!o || !o->alive || paused(S, o) || o->app != A_TRAIN || o->world != p->world ||
        o->reset_planned) {
      return false;
    }
  }
  return true;
}

static void on_sm_event(struct sim *S, struct proc *p, const struct hora__mfsm_event *e) {
  switch (e->kind) {
    case HORA_MFSM_COMMITTED: {
      const struct hora__view *v = hora__mfsm_view(p->sm);
      trace(S, "p%d COMMITTED epoch %llu rank %d of %d%s", p->idx, (unsigned long long)e->epoch,
            e->rank, e->size, e->builder ? " (builder)" : "");
      if (e->epoch != v->epoch || e->size != v->n || e->rank < 0 || e->rank >= v->n ||
          v->m[e->rank].id != hora__mfsm_my_id(p->sm)) {
        violate(S, "p%d: a decision that does not match its view (epoch %llu rank %d size %d)",
                p->idx, (unsigned long long)e->epoch, e->rank, e->size);
      }
      if (p->app != A_RESET && p->app != A_JOIN) {
        violate(S, "p%d: a decision while it was not agreeing (%s)", p->idx, app_names[p->app]);
      }
      p->app = A_BUILD;
      p->build_epoch = e->epoch;
      p->build_ip = e->host_ip;
      p->build_host_port = e->port;
      p->build_deadline = S->now + S->c.timeout;
      push(S, (struct event){.t = p->build_deadline, .kind = E_BUILD_FAIL, .p = p->idx,
                             .aux = e->epoch});
      break;
    }
    case HORA_MFSM_FAILED:
      trace(S, "p%d FAILED: %s", p->idx, e->msg);
      if (strstr(e->msg, "more than half")) {
        check_quorum_failure(S, p);
      }
      p->fail_code = e->code;
      snprintf(p->fail_msg, sizeof(p->fail_msg), "%s", e->msg);
      if (p->app != A_RESET && p->app != A_JOIN) {
        violate(S, "p%d: a failure while it was not agreeing (%s): %s", p->idx,
                app_names[p->app], e->msg);
      }
      p->app = A_FAILED;
      kill_proc(S, p, false, "exits after its failure");
      break;
    case HORA_MFSM_ASKED:
      trace(S, "p%d asked to reset (by id %d)", p->idx, (int)e->from);
      if (!skip_spurious && p->app == A_TRAIN && world_whole(S, p) && !(S->door >= 0 &&
                                                       hora__mfsm_waiting(S->p[S->door].sm))) {
        violate(S, "p%d was asked to reset while its world was whole and no newcomer waited",
                p->idx);
      }
      plan_reset(S, p, between(&S->r, 0, 200 * MS));
      break;
  }
}

static void handle_outputs(struct sim *S, struct proc *p) {
  struct hora__mfsm_send m;
  int sent = 0;
  while (hora__mfsm_take_send(p->sm, &m)) {
    if (!p->alive) {
      free(m.frame);
      continue;
    }
    if (p->mid_crash && sent >= 1 && chance(&S->r, 0.5)) {
      p->mid_crash = false;
      S->crashes++;
      kill_proc(S, p, false, "crashes between two frames of one step");
      free(m.frame);
      continue;
    }
    net_send(S, p, &m);
    sent++;
  }
  struct hora__mfsm_event e;
  while (hora__mfsm_take_event(p->sm, &e)) {
    if (p->alive && !p->outsider) {
      on_sm_event(S, p, &e);
    }
  }
  schedule_timer(S, p);
}

/* Builds that have every member are done; those whose host died fail soon. */
static void check_builds(struct sim *S) {
  for (int i = 0; i < S->np; i++) {
    struct proc *p = &S->p[i];
    if (!p->alive || p->app != A_BUILD || paused(S, p) || p->build_epoch >= MAXE) {
      continue;
    }
    const struct hora__view *v = &S->views[p->build_epoch];
    bool complete = S->have_view[p->build_epoch];
    bool host_alive = false;
    for (int k = 0; complete && k < v->n; k++) {
      int q = proc_of_member(S, &v->m[k]);
      struct proc *o = q >= 0 ? &S->p[q] : NULL;
      complete = o && o->alive && !paused(S, o) && o->app == A_BUILD &&
                 o->build_epoch == p->build_epoch && o->build_ip == p->build_ip &&
                 o->build_host_port == p->build_host_port;
    }
    for (int q = 0; q < S->np; q++) {
      host_alive |= S->p[q].alive && S->p[q].ip == p->build_ip && !S->p[q].outsider &&
                    S->p[q].build_port == p->build_host_port;
    }
    if (complete) {
      for (int k = 0; k < v->n; k++) {
        struct proc *o = &S->p[proc_of_member(S, &v->m[k])];
        o->app = A_TRAIN;
        o->world = p->build_epoch;
        o->attempts = 0;
        o->reset_planned = false;
      }
      S->door = proc_of_member(S, &v->m[0]);
      trace(S, "world %llu built: %d ranks; p%d holds the door", (unsigned long long)p->build_epoch,
            v->n, S->door);
    } else if (!host_alive && p->build_deadline > S->now + 50 * MS) {
      p->build_deadline = S->now + between(&S->r, 1 * MS, 50 * MS);
      push(S, (struct event){.t = p->build_deadline, .kind = E_BUILD_FAIL, .p = p->idx,
                             .aux = p->build_epoch});
    }
  }
}

/* Members of a world whose peers left notice it, after a while. */
static void check_worlds(struct sim *S) {
  for (int i = 0; i < S->np; i++) {
    struct proc *p = &S->p[i];
    if (!p->alive || p->app != A_TRAIN || p->reset_planned || p->outsider) {
      continue;
    }
    const struct hora__view *v = &S->views[p->world];
    bool healthy = true;
    for (int k = 0; healthy && k < v->n; k++) {
      int q = proc_of_member(S, &v->m[k]);
      struct proc *o = q >= 0 ? &S->p[q] : NULL;
      healthy = o && o->alive && !paused(S, o) && o->app == A_TRAIN && o->world == p->world;
    }
    if (!healthy) {
      plan_reset(S, p, notice_delay(S, p));
    }
  }
}

/* ---- invariants ------------------------------------------------------------------------ */

static bool quorum_ids(const struct hora__view *base, const struct hora__view *next) {
  bool in[4096] = {false};
  for (int i = 0; i < base->n && i < 4096; i++) {
    in[i] = hora__mb_view_index(next, base->m[i].id) >= 0;
  }
  return hora__mb_quorum(base, in);
}

static void check_new_view(struct sim *S, const struct hora__view *v) {
  if (v->job != S->job) {
    violate(S, "a view of another job (%llx) learned", (unsigned long long)v->job);
    return;
  }
  if (v->epoch == 0 || v->epoch >= MAXE || !S->have_view[v->epoch - 1]) {
    violate(S, "view %llu committed, but no view %llu before it", (unsigned long long)v->epoch,
            (unsigned long long)v->epoch - 1);
    return;
  }
  const struct hora__view *b = &S->views[v->epoch - 1];
  if (!quorum_ids(b, v)) {
    violate(S, "view %llu holds no quorum of view %llu", (unsigned long long)v->epoch,
            (unsigned long long)b->epoch);
  }
  if (S->c.max_size > 0 && v->n > S->c.max_size) {
    violate(S, "view %llu has %d members, above HORA_ELASTIC_MAX_SIZE=%d",
            (unsigned long long)v->epoch, v->n, S->c.max_size);
  }
  if (v->n < S->c.min_size) {
    violate(S, "view %llu has %d members, below HORA_ELASTIC_MIN_SIZE=%d",
            (unsigned long long)v->epoch, v->n, S->c.min_size);
  }
  if (v->next_id < b->next_id) {
    violate(S, "view %llu's next id went down", (unsigned long long)v->epoch);
  }
  for (int k = 0; k < v->n; k++) {
    const struct hora__member *m = &v->m[k];
    int old = hora__mb_view_index(b, m->id);
    if (old >= 0) {
      if (b->m[old].ip != m->ip || b->m[old].port != m->port) {
        violate(S, "view %llu moved member %u to another address", (unsigned long long)v->epoch,
                m->id);
      }
      continue;
    }
    int q = proc_of_member(S, m);
    if (m->id < b->next_id || q < 0 || !S->p[q].newcomer || S->p[q].outsider) {
      violate(S, "view %llu holds id %u, neither a member of view %llu nor a newcomer that "
              "asked to join", (unsigned long long)v->epoch, m->id, (unsigned long long)b->epoch);
    }
    for (uint64_t e = 1; e < v->epoch; e++) {
      if (S->have_view[e] && hora__mb_view_index(&S->views[e], m->id) >= 0) {
        violate(S, "view %llu brings back id %u of view %llu", (unsigned long long)v->epoch,
                m->id, (unsigned long long)e);
      }
    }
  }
  S->commits++;
}

static void check_all(struct sim *S) {
  int worlds = 0;
  uint64_t world_epoch = 0;
  for (int i = 0; i < S->np; i++) {
    struct proc *p = &S->p[i];
    if (p->outsider || (!p->alive && p->app != A_FAILED && p->app != A_DEAD)) {
      continue;
    }
    const struct hora__view *v = hora__mfsm_view(p->sm);
    if (v->n == 0 || v->epoch == p->last_epoch) {
      goto acceptor;
    }
    if (v->epoch < p->last_epoch) {
      violate(S, "p%d went back from epoch %llu to %llu", i, (unsigned long long)p->last_epoch,
              (unsigned long long)v->epoch);
    }
    if (v->epoch >= MAXE) {
      violate(S, "p%d: epoch %llu: more resets than the simulator records", i,
              (unsigned long long)v->epoch);
      return;
    }
    if (!S->have_view[v->epoch]) {
      check_new_view(S, v);
      hora__mb_view_copy(&S->views[v->epoch], v);
      S->have_view[v->epoch] = true;
      if (v->epoch > S->final_epoch) {
        S->final_epoch = v->epoch;
      }
    } else if (!hora__mb_view_equal(&S->views[v->epoch], v)) {
      char a[200] = "", b[200] = "";
      for (int k = 0, w = 0; k < v->n && w < 180; k++) {
        w += snprintf(a + w, sizeof(a) - (size_t)w, " %u", v->m[k].id);
      }
      const struct hora__view *o = &S->views[v->epoch];
      for (int k = 0, w = 0; k < o->n && w < 180; k++) {
        w += snprintf(b + w, sizeof(b) - (size_t)w, " %u", o->m[k].id);
      }
      violate(S, "two views of epoch %llu: p%d holds [%s ] where another holds [%s ]",
              (unsigned long long)v->epoch, i, a, b);
    }
    if (hora__mb_view_index(v, hora__mfsm_my_id(p->sm)) < 0 && p->alive) {
      violate(S, "p%d holds view %llu, which does not name it", i, (unsigned long long)v->epoch);
    }
    p->last_epoch = v->epoch;
    p->promised_seen = 0;
  acceptor:;
    uint64_t promised, ab;
    const struct hora__view *acc;
    hora__mfsm_acceptor(p->sm, &promised, &ab, &acc);
    if (promised < p->promised_seen && !skip_spurious) {
      violate(S, "p%d's promise went down in one epoch", i);
    }
    if (ab > promised) {
      violate(S, "p%d accepted a ballot above its promise", i);
    }
    p->promised_seen = promised;
    if (p->alive && p->app == A_TRAIN) {
      const struct hora__view *w = &S->views[p->world];
      bool whole = true;
      for (int k = 0; whole && k < w->n; k++) {
        int q = proc_of_member(S, &w->m[k]);
        whole = q >= 0 && S->p[q].alive && S->p[q].app == A_TRAIN && S->p[q].world == p->world;
      }
      if (whole && (worlds == 0 || world_epoch != p->world)) {
        worlds++;
        world_epoch = p->world;
      }
    }
  }
  if (worlds > 1) {
    violate(S, "two worlds train at once");
  }
}

/* ---- the schedule -------------------------------------------------------------------- */

static void make_config(struct sim *S, int nmin, int nmax) {
  struct rng *r = &S->r;
  struct config *c = &S->c;
  c->n = nmin + (int)(S->seed % (uint64_t)(nmax - nmin + 1));
  static const uint64_t timeouts[] = {3, 5, 8, 15};
  c->timeout = timeouts[below(r, 4)] * SEC;
  c->min_size = chance(r, 0.8) ? 1 : (int)between(r, 2, (uint64_t)c->n);
  c->max_size = chance(r, 0.6) ? 0 : (int)between(r, (uint64_t)c->n, (uint64_t)c->n + 2);
  c->insecure = chance(r, 0.2);
  c->drop = chance(r, 0.4) ? 0 : (double)between(r, 1, 10) / 100.0;
  c->dup = chance(r, 0.5) ? 0 : (double)between(r, 1, 5) / 100.0;
  c->slow_msg = chance(r, 0.5) ? 0 : (double)between(r, 1, 20) / 1000.0;
  c->lat_min = 50000;
  c->lat_max = between(r, 100000, 5 * MS);
  c->chaos_end = between(r, 2 * SEC, 40 * SEC);
}

static void make_faults(struct sim *S) {
  struct rng *r = &S->r;
  const struct config *c = &S->c;
  uint64_t end = c->chaos_end;
  int crashes = (int)below(r, (uint64_t)c->n + 1);
  for (int k = 0; k < crashes; k++) {
    push(S, (struct event){.t = between(r, 0, end), .kind = E_CRASH, .p = (int)below(r, (uint64_t)c->n + 3),
                           .why = chance(r, 0.3), .aux = chance(r, 0.3)});
  }
  int newcomers = (int)below(r, 4);
  for (int k = 0; k < newcomers; k++) {
    push(S, (struct event){.t = between(r, 0, end), .kind = E_NEWCOMER});
  }
  int pauses = (int)below(r, 3);
  for (int k = 0; k < pauses; k++) {
    uint64_t t = between(r, 0, end);
    uint64_t d = between(r, 500 * MS, 2 * c->timeout);
    push(S, (struct event){.t = t, .kind = E_PAUSE, .p = (int)below(r, (uint64_t)c->n),
                           .aux = t + d < end ? t + d : end});
  }
  int cuts = (int)below(r, 3);
  for (int k = 0; k < cuts; k++) {
    uint64_t t = between(r, 0, end);
    uint64_t d = between(r, 500 * MS, 2 * c->timeout);
    push(S, (struct event){.t = t, .kind = E_CUT, .p = (int)below(r, (uint64_t)c->n),
                           .q = (int)below(r, (uint64_t)c->n), .why = (int)below(r, 3),
                           .aux = t + d < end ? t + d : end});
  }
  bool slow = chance(r, 0.3);
  if (slow) {
    S->p[below(r, (uint64_t)c->n)].slow = true;
  }
  S->strict = pauses == 0 && cuts == 0 && !slow;
  if (chance(r, 0.1)) {
    push(S, (struct event){.t = between(r, 0, end), .kind = E_STRANGER});
  }
  if (c->insecure && chance(r, 0.5)) {
    push(S, (struct event){.t = between(r, 0, end), .kind = E_FORGER});
  }
  push(S, (struct event){.t = end, .kind = E_CALM});
  uint64_t step = 300 * MS;
  for (uint64_t t = step; t < end + 8 * c->timeout + 120 * SEC; t += step) {
    push(S, (struct event){.t = t, .kind = E_COMMIT_POINT});
  }
}

/* A process of another job holding the same secret, whose stale view names
 * this job's addresses (its ports were reused), asking for a reset. */
static void spawn_stranger(struct sim *S) {
  struct proc *g = new_proc(S, false);
  if (!g) {
    return;
  }
  g->outsider = true;
  struct hora__view v = {.job = S->job ^ 0x5555, .epoch = S->final_epoch + below(&S->r, 3),
                         .next_id = (uint32_t)S->c.n + 1};
  v.n = S->c.n;
  v.m = calloc((size_t)v.n, sizeof(*v.m));
  for (int k = 0; k < v.n; k++) {
    v.m[k] = (struct hora__member){(uint32_t)k, S->p[k].ip, S->p[k].port};
  }
  v.m[v.n - 1] = (struct hora__member){(uint32_t)v.n - 1, g->ip, g->port};
  hora__mfsm_start(g->sm, &v, (uint32_t)v.n - 1);
  hora__mb_view_free(&v);
  trace(S, "p%d: a process of another job with the same secret asks for a reset", g->idx);
  hora__mfsm_reset(g->sm, S->now, g->build_port);
  handle_outputs(S, g);
}

/* Without a secret: a process elsewhere spoofing member 0's address, with a
 * made-up later view naming itself. */
static void spawn_forger(struct sim *S) {
  struct proc *f = new_proc(S, false);
  if (!f) {
    return;
  }
  f->outsider = f->forger = true;
  const struct hora__view *cur = &S->views[S->final_epoch];
  struct hora__view v = {.job = S->job, .epoch = S->final_epoch + 5,
                         .next_id = cur->next_id + 10, .n = 3};
  v.m = calloc(3, sizeof(*v.m));
  v.m[0] = cur->m[0];
  v.m[1] = cur->m[cur->n - 1];
  v.m[2] = (struct hora__member){cur->next_id + 5, f->ip, f->port};
  /* It claims member v.m[1]'s address, and asks v.m[0] with its view. */
  hora__mfsm_free(f->sm);
  struct hora__mfsm_config c = {.ip = v.m[1].ip, .port = v.m[1].port,
                                .elastic_timeout_ns = S->c.timeout, .insecure = true,
                                .seed = 7, .log = sm_log, .log_arg = f};
  hora__mfsm_new(&c, &f->sm);
  hora__mfsm_start(f->sm, &v, v.m[1].id);
  hora__mb_view_free(&v);
  trace(S, "p%d: a forger claims the address of id %u", f->idx, cur->m[cur->n - 1].id);
  hora__mfsm_reset(f->sm, S->now, f->build_port);
  handle_outputs(S, f);
}

static void run_event(struct sim *S, struct event *e) {
  struct proc *p = e->p >= 0 && e->p < S->np ? &S->p[e->p] : NULL;
  switch (e->kind) {
    case E_DELIVER:
      if (!p || !p->alive) {
        break;
      }
      if (paused(S, p)) {
        e->t = p->paused_until + between(&S->r, 0, 1 * MS);
        push(S, *e);
        return; /* the frame waits in the kernel */
      }
      hora__mfsm_receive(p->sm, S->now, e->src_ip, e->frame, e->len);
      handle_outputs(S, p);
      break;
    case E_HINT:
      if (p && p->alive && !paused(S, p)) {
        hora__mfsm_unreachable(p->sm, S->now, e->ip, e->port, (enum hora__mb_unreachable)e->why);
        handle_outputs(S, p);
      }
      break;
    case E_TIMER:
      if (!p || !p->alive || e->t != p->timer_due) {
        break;
      }
      p->timer_due = UINT64_MAX;
      if (paused(S, p)) {
        p->timer_due = p->paused_until;
        push(S, (struct event){.t = p->paused_until, .kind = E_TIMER, .p = p->idx});
        break;
      }
      hora__mfsm_tick(p->sm, S->now);
      if (hora__mfsm_next_tick(p->sm) <= S->now) {
        violate(S, "p%d: the state machine's next tick is not after the one it just had", p->idx);
      }
      handle_outputs(S, p);
      break;
    case E_APP_RESET:
      if (p && p->alive && paused(S, p)) {
        e->t = p->paused_until;
        push(S, *e);
        return;
      }
      if (p && p->alive && p->app == A_TRAIN && p->reset_planned) {
        p->reset_planned = false;
        start_reset(S, p);
      }
      break;
    case E_BUILD_FAIL:
      if (p && p->alive && paused(S, p)) {
        e->t = p->paused_until;
        push(S, *e);
        return;
      }
      if (p && p->alive && p->app == A_BUILD && p->build_epoch == e->aux &&
          S->now >= p->build_deadline) {
        trace(S, "p%d: building membership %llu failed", p->idx, (unsigned long long)e->aux);
        if (++p->attempts >= 8) {
          p->app = A_FAILED;
          snprintf(p->fail_msg, sizeof(p->fail_msg), "elastic: building failed 8 times");
          kill_proc(S, p, false, "gives up building");
        } else {
          start_reset(S, p);
        }
      }
      break;
    case E_CRASH:
      if (p && p->alive && !p->outsider) {
        if (e->aux) {
          p->mid_crash = true; /* at its next step that sends two frames */
        } else {
          S->crashes++;
          kill_proc(S, p, e->why, "crashes");
        }
        if (chance(&S->r, 0.3) && S->now < S->c.chaos_end) {
          push(S, (struct event){.t = S->now + between(&S->r, 500 * MS, 5 * SEC),
                                 .kind = E_NEWCOMER});
        }
      }
      break;
    case E_PAUSE:
      if (p && p->alive && !paused(S, p)) {
        trace(S, "p%d paused until %.3f", p->idx, (double)e->aux / SEC);
        if (S->nspans < 16) {
          S->spans[S->nspans++] = (struct span){p->idx, -1, S->now, e->aux};
        }
        p->paused_until = e->aux;
        push(S, (struct event){.t = e->aux, .kind = E_RESUME, .p = p->idx});
      }
      break;
    case E_RESUME:
      trace(S, "p%d resumes", e->p);
      break;
    case E_CUT: {
      int a = e->p, b = e->q;
      if (a == b) {
        break;
      }
      bool both = e->why != 0;
      trace(S, "link p%d -> p%d cut%s until %.3f", a, b, both ? " both ways" : "",
            (double)e->aux / SEC);
      S->cut[a][b] = true;
      if (S->nspans < 16) {
        S->spans[S->nspans++] = (struct span){a, b, S->now, e->aux};
      }
      if (both) {
        S->cut[b][a] = true;
      }
      push(S, (struct event){.t = e->aux, .kind = E_HEAL, .p = a, .q = b, .why = both});
      break;
    }
    case E_HEAL:
      S->cut[e->p][e->q] = false;
      if (e->why) {
        S->cut[e->q][e->p] = false;
      }
      break;
    case E_NEWCOMER: {
      if (S->now >= S->c.chaos_end) {
        break;
      }
      struct proc *n = new_proc(S, true);
      if (n) {
        n->app = A_JOIN;
        trace(S, "p%d starts as a newcomer", n->idx);
        hora__mfsm_join(n->sm, S->now, DOOR_IP, DOOR_PORT, n->build_port);
        handle_outputs(S, n);
      }
      break;
    }
    case E_COMMIT_POINT:
      /* A world at a commit point: rank 0 says newcomers wait, all reset. */
      for (int i = 0; i < S->np; i++) {
        struct proc *o = &S->p[i];
        if (o->alive && o->app == A_TRAIN && !o->outsider && i == S->door &&
            hora__mfsm_waiting(o->sm) > 0) {
          const struct hora__view *w = &S->views[o->world];
          for (int k = 0; k < w->n; k++) {
            int q = proc_of_member(S, &w->m[k]);
            if (q >= 0) {
              plan_reset(S, &S->p[q], between(&S->r, 0, 20 * MS));
            }
          }
        }
      }
      break;
    case E_CALM:
      trace(S, "faults stop; every link heals");
      S->calm = true;
      memset(S->cut, 0, sizeof(S->cut));
      break;
    case E_STRANGER:
      spawn_stranger(S);
      break;
    case E_FORGER:
      spawn_forger(S);
      break;
  }
  free(e->frame);
}

/* Faults have stopped and nothing is left to happen. */
static bool settled(struct sim *S) {
  if (!S->calm) {
    return false;
  }
  for (int i = 0; i < S->np; i++) {
    struct proc *p = &S->p[i];
    if (p->outsider || !p->alive) {
      continue;
    }
    if (p->app != A_TRAIN || p->reset_planned || paused(S, p) || hora__mfsm_in_reset(p->sm)) {
      return false;
    }
    if (S->door == i && hora__mfsm_waiting(p->sm) > 0) {
      return false;
    }
  }
  for (int i = 0; i < S->np; i++) {
    struct proc *p = &S->p[i];
    if (!p->outsider && p->alive) {
      const struct hora__view *w = &S->views[p->world];
      for (int k = 0; k < w->n; k++) {
        int q = proc_of_member(S, &w->m[k]);
        if (q < 0 || !S->p[q].alive || S->p[q].app != A_TRAIN || S->p[q].world != p->world) {
          return false;
        }
      }
    }
  }
  return true;
}

static bool clear_failure(const char *msg) {
  static const char *const known[] = {
      "was left out", "more than half of them", "HORA_ELASTIC_MIN_SIZE", "HORA_ELASTIC_MAX_SIZE",
      "not admitted by the job", "no membership was agreed in time", "building failed",
      "is not a member"};
  if (strncmp(msg, "elastic: ", 9) != 0 && !strstr(msg, "elastic: ")) {
    return false;
  }
  for (size_t k = 0; k < sizeof(known) / sizeof(known[0]); k++) {
    if (strstr(msg, known[k])) {
      return true;
    }
  }
  return false;
}

/* The end: with a quorum of the last view alive, all of it trains in it;
 * every other process failed, saying why. */
static void check_end(struct sim *S, bool timed_out) {
  const struct hora__view *last = &S->views[S->final_epoch];
  bool alive[4096] = {false};
  int n_alive = 0;
  for (int k = 0; k < last->n; k++) {
    int q = proc_of_member(S, &last->m[k]);
    alive[k] = q >= 0 && S->p[q].alive;
    n_alive += alive[k];
  }
  bool can = hora__mb_quorum(last, alive) && n_alive >= S->c.min_size;
  for (int i = 0; i < S->np; i++) {
    struct proc *p = &S->p[i];
    if (p->outsider) {
      continue;
    }
    bool member = hora__mb_view_index(last, hora__mfsm_my_id(p->sm)) >= 0 &&
                  hora__mfsm_view(p->sm)->epoch > 0;
    if (p->app == A_FAILED) {
      if (!clear_failure(p->fail_msg)) {
        violate(S, "p%d failed without a clear reason: \"%s\"", i, p->fail_msg);
      }
      continue;
    }
    if (!p->alive) {
      continue;
    }
    if (can && member && p->app == A_TRAIN && p->world == last->epoch) {
      continue;
    }
    violate(S, "p%d neither trains in the last membership (%llu, %d of %d alive: %s) nor failed: "
            "%s at epoch %llu%s", i, (unsigned long long)last->epoch, n_alive, last->n,
            can ? "a quorum" : "no quorum", app_names[p->app],
            (unsigned long long)hora__mfsm_view(p->sm)->epoch,
            timed_out ? " (the run never settled)" : "");
  }
}

static void free_sim(struct sim *S) {
  for (int i = 0; i < S->np; i++) {
    hora__mfsm_free(S->p[i].sm);
  }
  while (S->h.n) {
    struct event e = heap_pop(&S->h);
    free(e.frame);
  }
  free(S->h.e);
  for (int e = 0; e < MAXE; e++) {
    hora__mb_view_free(&S->views[e]);
  }
}

/* One schedule; 0 when every check held. */
static int run_seed(uint64_t seed, int nmin, int nmax, unsigned mutants, bool trace_it,
                    struct sim *out_stats) {
  struct sim *S = calloc(1, sizeof(*S));
  if (!S) {
    abort();
  }
  current_sim = S;
  S->seed = seed;
  S->r.s = seed * 0x2545f4914f6cdd1dull + 1;
  S->trace = trace_it;
  S->door = 0;
  S->job = 0x1000 + seed;
  make_config(S, nmin, nmax);
  S->c.mutants = mutants;
  struct hora__view v = {.job = S->job, .epoch = 1, .next_id = (uint32_t)S->c.n, .n = S->c.n};
  v.m = calloc((size_t)v.n, sizeof(*v.m));
  for (int k = 0; k < S->c.n; k++) {
    struct proc *p = new_proc(S, false);
    v.m[k] = (struct hora__member){(uint32_t)k, p->ip, p->port};
  }
  for (int k = 0; k < S->c.n; k++) {
    hora__mfsm_start(S->p[k].sm, &v, (uint32_t)k);
    S->p[k].app = A_TRAIN;
    S->p[k].world = 1;
    S->p[k].last_epoch = 1;
  }
  hora__mb_view_copy(&S->views[1], &v);
  S->have_view[1] = true;
  S->final_epoch = 1;
  hora__mb_view_free(&v);
  trace(S, "seed %llu: n=%d timeout=%.0fs min=%d max=%d%s drop=%.2f dup=%.2f slow=%.3f "
        "lat<=%.1fms faults until %.1fs", (unsigned long long)seed, S->c.n,
        (double)S->c.timeout / SEC, S->c.min_size, S->c.max_size, S->c.insecure ? " insecure" : "",
        S->c.drop, S->c.dup, S->c.slow_msg, (double)S->c.lat_max / MS,
        (double)S->c.chaos_end / SEC);
  make_faults(S);
  uint64_t deadline = S->c.chaos_end + 6 * S->c.timeout + 90 * SEC;
  bool timed_out = true;
  while (S->h.n && !S->violation[0]) {
    struct event e = heap_pop(&S->h);
    if (e.t > deadline) {
      free(e.frame);
      break;
    }
    if (e.t / (100 * MS) != S->window) {
      S->window = e.t / (100 * MS);
      S->in_window = 0;
    }
    if (++S->in_window > 20000) {
      violate(S, "a storm: more than 20,000 events in 100 ms of simulated time");
    }
    S->now = e.t;
    S->events++;
    run_event(S, &e);
    check_builds(S);
    check_worlds(S);
    check_all(S);
    if (settled(S)) {
      timed_out = false;
      break;
    }
  }
  if (!S->violation[0]) {
    check_end(S, timed_out);
  }
  int rc = S->violation[0] ? 1 : 0;
  if (rc && !trace_it) {
    printf("  seed %llu (n=%d, timeout %.0f s%s): %s\n", (unsigned long long)seed, S->c.n,
           (double)S->c.timeout / SEC, S->c.insecure ? ", no secret" : "", S->violation);
  }
  if (out_stats) {
    out_stats->events += S->events;
    out_stats->commits += S->commits;
    out_stats->crashes += S->crashes;
    out_stats->resets_seen += S->resets_seen;
    out_stats->final_epoch += S->final_epoch;
    snprintf(out_stats->violation, sizeof(out_stats->violation), "%s", S->violation);
  }
  free_sim(S);
  free(S);
  current_sim = NULL;
  return rc;
}

static const struct {
  const char *name;
  unsigned bit;
} mutant_names[] = {
    {"forget-accepted", HORA_MB_MUTANT_FORGET_ACCEPTED},
    {"no-max-at-reset", HORA_MB_MUTANT_NO_MAX_AT_RESET},
    {"no-job-check", HORA_MB_MUTANT_NO_JOB_CHECK},
    {"final-refusals", HORA_MB_MUTANT_FINAL_REFUSALS},
    {"half-quorum", HORA_MB_MUTANT_HALF_QUORUM},
    {"commit-early", HORA_MB_MUTANT_COMMIT_EARLY},
    {"no-addr-check", HORA_MB_MUTANT_NO_ADDR_CHECK},
    {"foreign-is-gone", HORA_MB_MUTANT_FOREIGN_IS_GONE},
};

int main(int argc, char **argv) {
  uint64_t seeds = 1000, first = 1;
  int nmin = 2, nmax = 9;
  unsigned mutants = 0;
  const char *mutant = NULL;
  bool expect_find = false, quiet = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--seeds") && i + 1 < argc) {
      seeds = strtoull(argv[++i], NULL, 10);
    } else if (!strcmp(argv[i], "--first") && i + 1 < argc) {
      first = strtoull(argv[++i], NULL, 10);
    } else if (!strcmp(argv[i], "--nmin") && i + 1 < argc) {
      nmin = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--nmax") && i + 1 < argc) {
      nmax = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--mutant") && i + 1 < argc) {
      mutant = argv[++i];
      size_t k = 0;
      for (; k < sizeof(mutant_names) / sizeof(mutant_names[0]); k++) {
        if (!strcmp(mutant, mutant_names[k].name)) {
          mutants = mutant_names[k].bit;
          break;
        }
      }
      if (!mutants) {
        fprintf(stderr, "membership_sim: no mutant named %s\n", mutant);
        return 2;
      }
    } else if (!strcmp(argv[i], "--expect-find")) {
      expect_find = true;
    } else if (!strcmp(argv[i], "--safety-only")) {
      skip_spurious = true;
    } else if (!strcmp(argv[i], "--quiet")) {
      quiet = true;
    } else {
      fprintf(stderr, "usage: membership_sim [--seeds N] [--first S] [--nmin A] [--nmax B] "
              "[--mutant NAME --expect-find] [--quiet]\n");
      return 2;
    }
  }
  if (nmin < 2 || nmax > 16 || nmin > nmax) {
    fprintf(stderr, "membership_sim: N from 2 to 16\n");
    return 2;
  }
  const char *one = getenv("SEED");
  if (one && *one) {
    uint64_t seed = strtoull(one, NULL, 10);
    int rc = run_seed(seed, nmin, nmax, mutants, true, NULL);
    printf("%s membership-sim: seed %llu%s\n", rc ? "FAIL" : "PASS", (unsigned long long)seed,
           mutant ? " (with a planted defect)" : "");
    return rc;
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  struct sim stats = {0};
  uint64_t failed = 0, ran = 0, found_at = 0;
  for (uint64_t s = first; s < first + seeds; s++) {
    ran++;
    if (run_seed(s, nmin, nmax, mutants, false, &stats)) {
      failed++;
      if (expect_find) {
        found_at = s;
        break;
      }
      if (failed >= 5) {
        break;
      }
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  if (expect_find) {
    if (found_at) {
      printf("PASS membership-sim/%s: the planted defect was found by seed %llu (the %llu%s "
             "schedule): %s (rerun: SEED=%llu %s --mutant %s)\n", mutant,
             (unsigned long long)found_at, (unsigned long long)ran,
             ran % 10 == 1 && ran % 100 != 11 ? "st" : ran % 10 == 2 && ran % 100 != 12 ? "nd"
             : ran % 10 == 3 && ran % 100 != 13 ? "rd" : "th", stats.violation,
             (unsigned long long)found_at, argv[0], mutant);
      return 0;
    }
    printf("FAIL membership-sim/%s: %llu schedules did not find the planted defect\n", mutant,
           (unsigned long long)ran);
    return 1;
  }
  if (failed) {
    printf("FAIL membership-sim: %llu of %llu schedules broke an invariant (above; rerun one with "
           "SEED=N %s)\n", (unsigned long long)failed, (unsigned long long)ran, argv[0]);
    return 1;
  }
  if (!quiet || true) {
    printf("PASS membership-sim: %llu schedules (seeds %llu-%llu, N %d-%d) in %.1f s: %llu events, "
           "%llu views committed, %llu crashes, %llu resets; every invariant held\n",
           (unsigned long long)ran, (unsigned long long)first,
           (unsigned long long)(first + ran - 1), nmin, nmax, secs,
           (unsigned long long)stats.events, (unsigned long long)stats.commits,
           (unsigned long long)stats.crashes, (unsigned long long)stats.resets_seen);
  }
  return 0;
}
