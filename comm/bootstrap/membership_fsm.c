/* The elastic agreement as a state machine (see membership_fsm.h for the
 * protocol and why it is safe). No I/O, no clock, no entropy: everything it
 * does follows from its inputs, so the simulator can replay a schedule. */
#include "comm/bootstrap/membership_fsm.h"

#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/log.h"

#ifndef HORA_MB_MUTANTS
#define HORA_MB_MUTANTS 0
#endif
#define MUTANT(s, bit) (HORA_MB_MUTANTS && ((s)->c.mutants & (bit)))

enum {
  M_RESET = 1, /* member -> the member it takes for coordinator: promise, view */
  M_JOIN,      /* newcomer -> the door (rank 0) */
  M_PREPARE,   /* ballot, base view */
  M_PROMISE,   /* ballot, accepted ballot, accepted view */
  M_NACK,      /* ballot, the higher promise */
  M_PROPOSE,   /* ballot, view */
  M_ACCEPTED,  /* ballot */
  M_COMMIT,    /* ballot, build?, rendezvous address, view */
  M_REFUSE,    /* code, final?, text */
  M_REDIRECT,  /* the member to ask instead: id, address */
  M_BEAT,      /* pending?: the coordinator lives (or will coordinate) */
  M_TYPES
};
static const char *const type_names[M_TYPES] = {
    "?", "RESET", "JOIN", "PREPARE", "PROMISE", "NACK", "PROPOSE", "ACCEPTED", "COMMIT",
    "REFUSE", "REDIRECT", "BEAT"};

#define WIRE_MAGIC 0x484d4232u /* "HMB2": the protocol's version */
#define VIEW_MAX 65536
#define START_GRACE_NS (10000ull * 1000000ull) /* past the coordinator's own wait */

enum mode { IDLE, FOLLOW, COORD, JOINING, FAILED };
enum phase { WAIT, P1, P2, BACKOFF };

struct voter {
  bool asked;     /* it is in the reset and asked this coordinator */
  bool gone;      /* left out of this round */
  bool certain;   /* gone for sure: its listener refused */
  bool promised;  /* P1: promised this ballot */
  bool replied;   /* this phase's answer came */
  const char *why;
  uint64_t heard, sent;
  uint64_t promise; /* the highest promise it told of */
};

struct newcomer {
  uint32_t ip;
  uint16_t port;
  uint64_t heard;
};

struct commit_rec {
  uint64_t ballot;
  bool build;
  uint32_t ip;
  uint16_t port;
  struct hora__view v;
};

struct hora__mfsm {
  struct hora__mfsm_config c;
  uint64_t rng;
  bool started; /* holds a view */
  uint32_t my_id;
  struct hora__view view;
  struct commit_rec last; /* how view was decided: sent to laggards */
  enum mode mode;
  bool left_out;
  char out_msg[480];
  uint64_t asked_epoch; /* ASKED told the app for this epoch */
  /* The acceptor, for epoch view.epoch + 1. */
  uint64_t promised, accepted_b;
  struct hora__view accepted;
  uint64_t top_ballot; /* the highest ballot seen in any epoch */
  uint64_t last_now;   /* the clock at the last input */
  /* A reset. */
  uint64_t reset_deadline;
  uint16_t build_port;
  uint64_t *asked_at; /* [view.n]: when member i last asked (0: not) */
  bool *suspect;      /* [view.n]: a follower's verdicts */
  /* Follower. */
  int cand;
  uint64_t cand_since, cand_heard, next_resend;
  bool cand_started;
  /* Coordinator. */
  struct voter *v; /* [view.n] */
  enum phase phase;
  uint64_t ballot, phase_at, wait_until, noquorum_since, next_beat, backoff_until;
  struct hora__view value, best;
  uint64_t best_b;
  bool adopted;
  /* Newcomers waiting here (rank 0). */
  struct newcomer *nc;
  int nnc, cap_nc;
  /* A newcomer's own knocking. */
  uint32_t door_ip, target_ip;
  uint16_t door_port, target_port;
  uint64_t join_deadline, next_join;
  /* Outputs. */
  struct hora__mfsm_send *sends;
  size_t nsends, send_head, cap_sends;
  struct hora__mfsm_event *events;
  size_t nevents, event_head, cap_events;
};

/* ---- views ---------------------------------------------------------------------- */

void hora__mb_view_free(struct hora__view *v) {
  free(v->m);
  memset(v, 0, sizeof(*v));
}

int hora__mb_view_copy(struct hora__view *dst, const struct hora__view *src) {
  if (dst == src) {
    return HORA_SUCCESS;
  }
  struct hora__member *m = src->n ? malloc((size_t)src->n * sizeof(*m)) : NULL;
  if (src->n && !m) {
    return HORA_ERR_NO_MEMORY;
  }
  if (src->n) {
    memcpy(m, src->m, (size_t)src->n * sizeof(*m));
  }
  free(dst->m);
  *dst = *src;
  dst->m = m;
  return HORA_SUCCESS;
}

int hora__mb_view_index(const struct hora__view *v, uint32_t id) {
  for (int i = 0; i < v->n; i++) {
    if (v->m[i].id == id) {
      return i;
    }
  }
  return -1;
}

static int view_index_addr(const struct hora__view *v, uint32_t ip, uint16_t port) {
  for (int i = 0; i < v->n; i++) {
    if (v->m[i].ip == ip && v->m[i].port == port) {
      return i;
    }
  }
  return -1;
}

bool hora__mb_view_equal(const struct hora__view *a, const struct hora__view *b) {
  if (a->job != b->job || a->epoch != b->epoch || a->next_id != b->next_id || a->n != b->n) {
    return false;
  }
  for (int i = 0; i < a->n; i++) {
    if (a->m[i].id != b->m[i].id || a->m[i].ip != b->m[i].ip || a->m[i].port != b->m[i].port) {
      return false;
    }
  }
  return true;
}

bool hora__mb_quorum(const struct hora__view *v, const bool *in) {
  int n = 0;
  for (int i = 0; i < v->n; i++) {
    n += in[i];
  }
  return 2 * n > v->n || (2 * n == v->n && n > 0 && in[0]);
}

static bool quorum_of(const struct hora__mfsm *s, const bool *in) {
  if (MUTANT(s, HORA_MB_MUTANT_HALF_QUORUM)) {
    int n = 0;
    for (int i = 0; i < s->view.n; i++) {
      n += in[i];
    }
    return 2 * n >= s->view.n && n > 0;
  }
  return hora__mb_quorum(&s->view, in);
}

/* ---- the wire ---------------------------------------------------------------------- */

struct buf {
  uint8_t *p;
  size_t len, cap, off;
  bool bad;
};

static void put(struct buf *b, const void *d, size_t n) {
  if (b->bad) {
    return;
  }
  if (b->len + n > b->cap) {
    size_t cap = HORA_MAX(b->cap * 2, b->len + n + 64);
    uint8_t *p = realloc(b->p, cap);
    if (!p) {
      b->bad = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, d, n);
  b->len += n;
}
static void put32(struct buf *b, uint32_t v) {
  v = htonl(v);
  put(b, &v, 4);
}
static void put64(struct buf *b, uint64_t v) {
  put32(b, (uint32_t)(v >> 32));
  put32(b, (uint32_t)v);
}
static void put_view(struct buf *b, const struct hora__view *v) {
  put64(b, v->job);
  put64(b, v->epoch);
  put32(b, v->next_id);
  put32(b, (uint32_t)v->n);
  for (int i = 0; i < v->n; i++) {
    put32(b, v->m[i].id);
    put(b, &v->m[i].ip, 4);
    put32(b, v->m[i].port);
  }
}
static bool get(struct buf *b, void *d, size_t n) {
  if (b->bad || b->off + n > b->len) {
    b->bad = true;
    memset(d, 0, n);
    return false;
  }
  memcpy(d, b->p + b->off, n);
  b->off += n;
  return true;
}
static uint32_t get32(struct buf *b) {
  uint32_t v;
  get(b, &v, 4);
  return ntohl(v);
}
static uint64_t get64(struct buf *b) {
  uint64_t hi = get32(b);
  return hi << 32 | get32(b);
}
static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}
/* A view as sent: ids unique and below next_id, no address twice. */
static bool get_view(struct buf *b, struct hora__view *v) {
  hora__mb_view_free(v);
  v->job = get64(b);
  v->epoch = get64(b);
  v->next_id = get32(b);
  uint32_t n = get32(b);
  if (b->bad || n > VIEW_MAX || n > (b->len - b->off) / 12) {
    b->bad = true;
    return false;
  }
  v->n = (int)n;
  v->m = n ? calloc(n, sizeof(*v->m)) : NULL;
  uint32_t *ids = n ? malloc(n * sizeof(*ids)) : NULL;
  if (n && (!v->m || !ids)) {
    free(ids);
    hora__mb_view_free(v);
    b->bad = true;
    return false;
  }
  for (uint32_t i = 0; i < n; i++) {
    v->m[i].id = get32(b);
    get(b, &v->m[i].ip, 4);
    v->m[i].port = (uint16_t)get32(b);
    ids[i] = v->m[i].id;
    if (v->m[i].id >= v->next_id || v->m[i].id == HORA_MB_NO_ID) {
      b->bad = true;
    }
  }
  if (!b->bad && n > 1) {
    qsort(ids, n, sizeof(*ids), cmp_u32);
    for (uint32_t i = 1; i < n; i++) {
      b->bad |= ids[i] == ids[i - 1];
    }
    for (uint32_t i = 0; i < n && n <= 1024 && !b->bad; i++) {
      b->bad |= view_index_addr(v, v->m[i].ip, v->m[i].port) != (int)i;
    }
  }
  free(ids);
  if (b->bad) {
    hora__mb_view_free(v);
  }
  return !b->bad;
}

/* The header every frame's payload opens with. */
struct header {
  uint32_t type;
  uint64_t job;
  struct hora__member from;
  uint64_t epoch;
};

/* ---- outputs, logging -------------------------------------------------------------- */

static void logf_(struct hora__mfsm *s, int level, const char *fmt, ...) HORA_PRINTF(3, 4);
static void logf_(struct hora__mfsm *s, int level, const char *fmt, ...) {
  if (!s->c.log) {
    return;
  }
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  s->c.log(s->c.log_arg, level, msg);
}

static struct hora__mfsm_event *push_event(struct hora__mfsm *s, enum hora__mfsm_event_kind k) {
  if (s->nevents == s->cap_events) {
    size_t cap = s->cap_events ? 2 * s->cap_events : 4;
    struct hora__mfsm_event *e = realloc(s->events, cap * sizeof(*e));
    if (!e) {
      return NULL;
    }
    s->events = e;
    s->cap_events = cap;
  }
  struct hora__mfsm_event *e = &s->events[s->nevents++];
  memset(e, 0, sizeof(*e));
  e->kind = k;
  return e;
}

static struct buf begin(const struct hora__mfsm *s, uint32_t type) {
  struct buf b = {0};
  put32(&b, type);
  put32(&b, 0); /* the payload's length, filled in by finish */
  put32(&b, WIRE_MAGIC);
  put64(&b, s->started ? s->view.job : 0);
  put32(&b, s->started ? s->my_id : HORA_MB_NO_ID);
  put(&b, &s->c.ip, 4);
  put32(&b, s->c.port);
  put64(&b, s->started ? s->view.epoch : 0);
  return b;
}

static void finish(struct hora__mfsm *s, uint32_t ip, uint16_t port, struct buf *b) {
  if (b->bad || (ip == s->c.ip && port == s->c.port)) {
    free(b->p);
    return;
  }
  uint32_t len = htonl((uint32_t)(b->len - HORA_MB_HEADER));
  memcpy(b->p + 4, &len, 4);
  if (s->nsends == s->cap_sends) {
    size_t cap = s->cap_sends ? 2 * s->cap_sends : 8;
    struct hora__mfsm_send *p = realloc(s->sends, cap * sizeof(*p));
    if (!p) {
      free(b->p);
      return;
    }
    s->sends = p;
    s->cap_sends = cap;
  }
  s->sends[s->nsends++] = (struct hora__mfsm_send){ip, port, b->p, b->len};
}

static void send_to(struct hora__mfsm *s, const struct hora__member *to, struct buf *b) {
  finish(s, to->ip, to->port, b);
}

static void send_refuse(struct hora__mfsm *s, uint32_t ip, uint16_t port, int code, bool final,
                        const char *msg) {
  struct buf b = begin(s, M_REFUSE);
  put32(&b, (uint32_t)code);
  put32(&b, final);
  put(&b, msg, strlen(msg));
  finish(s, ip, port, &b);
}

static void send_beat(struct hora__mfsm *s, const struct hora__member *to, bool pending) {
  struct buf b = begin(s, M_BEAT);
  put32(&b, pending);
  send_to(s, to, &b);
}

static void send_reset(struct hora__mfsm *s, const struct hora__member *to) {
  struct buf b = begin(s, M_RESET);
  put64(&b, s->promised);
  put_view(&b, &s->view);
  send_to(s, to, &b);
}

static void send_redirect(struct hora__mfsm *s, uint32_t ip, uint16_t port,
                          const struct hora__member *to) {
  struct buf b = begin(s, M_REDIRECT);
  put32(&b, to->id);
  put(&b, &to->ip, 4);
  put32(&b, to->port);
  finish(s, ip, port, &b);
}

/* How this process's view was decided, to one that missed it. */
static void send_commit(struct hora__mfsm *s, uint32_t ip, uint16_t port) {
  struct buf b = begin(s, M_COMMIT);
  put64(&b, s->last.ballot);
  put32(&b, s->last.build);
  put(&b, &s->last.ip, 4);
  put32(&b, s->last.port);
  put_view(&b, &s->view);
  finish(s, ip, port, &b);
}

static void fail(struct hora__mfsm *s, int code, const char *fmt, ...) HORA_PRINTF(3, 4);
static void fail(struct hora__mfsm *s, int code, const char *fmt, ...) {
  struct hora__mfsm_event *e = push_event(s, HORA_MFSM_FAILED);
  if (e) {
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    logf_(s, HORA_LOG_INFO, "%s", e->msg);
  }
  s->mode = FAILED;
}

/* The app's world is older than what the job agreed, or a member asks for
 * a reset: told once per epoch. */
static void ask_app(struct hora__mfsm *s, uint32_t from) {
  if (s->mode != IDLE || s->asked_epoch == s->view.epoch + 1) {
    return;
  }
  s->asked_epoch = s->view.epoch + 1;
  struct hora__mfsm_event *e = push_event(s, HORA_MFSM_ASKED);
  if (e) {
    e->from = from;
  }
}

static void point(struct hora__mfsm *s, const char *name) {
  if (s->c.point) {
    s->c.point(s->c.point_arg, name);
  }
}

static int my_index(const struct hora__mfsm *s) { return hora__mb_view_index(&s->view, s->my_id); }

static void addr_str(uint32_t ip, uint16_t port, char *out, size_t n) {
  char a[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &ip, a, sizeof(a));
  snprintf(out, n, "%s:%u", a, (unsigned)port);
}

/* ---- the view and the per-member arrays ------------------------------------------- */

/* view := nv, the arrays kept by id (a newcomer's slots start empty). */
static int set_view(struct hora__mfsm *s, const struct hora__view *nv) {
  int n = HORA_MAX(nv->n, 1);
  uint64_t *asked = calloc((size_t)n, sizeof(*asked));
  bool *suspect = calloc((size_t)n, sizeof(*suspect));
  struct voter *v = calloc((size_t)n, sizeof(*v));
  struct hora__view copy = {0};
  if (!asked || !suspect || !v || hora__mb_view_copy(&copy, nv) != HORA_SUCCESS) {
    free(asked);
    free(suspect);
    free(v);
    return HORA_ERR_NO_MEMORY;
  }
  for (int k = 0; k < nv->n; k++) {
    int old = s->started ? hora__mb_view_index(&s->view, nv->m[k].id) : -1;
    if (old >= 0) {
      asked[k] = s->asked_at[old];
      suspect[k] = s->suspect[old];
      v[k] = s->v[old];
    }
  }
  free(s->asked_at);
  free(s->suspect);
  free(s->v);
  s->asked_at = asked;
  s->suspect = suspect;
  s->v = v;
  hora__mb_view_free(&s->view);
  s->view = copy;
  s->started = true;
  return HORA_SUCCESS;
}

static void forget_acceptor(struct hora__mfsm *s) {
  s->promised = s->accepted_b = 0;
  hora__mb_view_free(&s->accepted);
}

/* ---- the coordinator --------------------------------------------------------------- */

static void coord_begin(struct hora__mfsm *s, uint64_t now);
static void coord_check(struct hora__mfsm *s, uint64_t now);
static void follow_begin(struct hora__mfsm *s, uint64_t now);
static void learn(struct hora__mfsm *s, uint64_t now, const struct commit_rec *rec, bool carry);

static void gone(struct hora__mfsm *s, int i, bool certain, const char *why) {
  struct voter *v = &s->v[i];
  if (v->gone && (v->certain || !certain)) {
    return;
  }
  if (!v->gone) {
    logf_(s, HORA_LOG_WARN, "elastic: rank %d (id %u) of membership %llu is gone: %s", i,
          s->view.m[i].id, (unsigned long long)s->view.epoch, why);
  }
  v->gone = true;
  v->certain = certain;
  v->why = why;
}

/* Tells every member that asked this coordinator (and the newcomers
 * waiting here) that the reset failed: final, or go and ask another. */
static void tell_asked(struct hora__mfsm *s, int code, bool final, const char *msg) {
  int me = my_index(s);
  for (int i = 0; i < s->view.n; i++) {
    if (i != me && s->v[i].asked && !s->v[i].gone) {
      send_refuse(s, s->view.m[i].ip, s->view.m[i].port, code, final, msg);
    }
  }
  if (final) {
    for (int j = 0; j < s->nnc; j++) {
      send_refuse(s, s->nc[j].ip, s->nc[j].port, code, true, msg);
    }
    s->nnc = 0;
  }
}

static void coord_fail(struct hora__mfsm *s, int code, const char *msg) {
  tell_asked(s, code, true, msg);
  fail(s, code, "%s", msg);
}

static uint64_t next_ballot(struct hora__mfsm *s) {
  uint64_t top = HORA_MAX(s->top_ballot, s->promised);
  for (int i = 0; i < s->view.n; i++) {
    top = HORA_MAX(top, s->v[i].promise);
  }
  uint64_t b = ((top >> 32) + 1) << 32 | s->my_id;
  s->top_ballot = b;
  return b;
}

static uint64_t jitter(struct hora__mfsm *s, uint64_t max_ns) {
  s->rng ^= s->rng << 13;
  s->rng ^= s->rng >> 7;
  s->rng ^= s->rng << 17;
  return s->rng % (max_ns + 1);
}

static void send_prepare(struct hora__mfsm *s, int i, uint64_t now) {
  struct buf b = begin(s, M_PREPARE);
  put64(&b, s->ballot);
  put_view(&b, &s->view);
  send_to(s, &s->view.m[i], &b);
  s->v[i].sent = now;
}

static void send_propose(struct hora__mfsm *s, int i, uint64_t now) {
  struct buf b = begin(s, M_PROPOSE);
  put64(&b, s->ballot);
  put_view(&b, &s->value);
  send_to(s, &s->view.m[i], &b);
  s->v[i].sent = now;
}

static void p1_begin(struct hora__mfsm *s, uint64_t now) {
  int me = my_index(s);
  s->phase = P1;
  s->phase_at = now;
  s->ballot = next_ballot(s);
  s->promised = s->ballot; /* its own promise */
  s->best_b = 0;
  hora__mb_view_free(&s->best);
  if (s->accepted_b && s->accepted.epoch == s->view.epoch + 1) {
    s->best_b = s->accepted_b;
    hora__mb_view_copy(&s->best, &s->accepted);
  }
  for (int i = 0; i < s->view.n; i++) {
    s->v[i].promised = s->v[i].replied = false;
    if (i != me && s->v[i].asked && !s->v[i].gone) {
      send_prepare(s, i, now);
    }
  }
  s->v[me].promised = s->v[me].replied = true;
}

static void backoff(struct hora__mfsm *s, uint64_t now) {
  s->phase = BACKOFF;
  s->backoff_until = now + 10 * 1000000ull + jitter(s, 90 * 1000000ull);
}

/* The value when no promise carried one: the members that promised, in
 * rank order, then the newcomers waiting here (up to HORA_ELASTIC_MAX_SIZE). */
static int fresh_value(struct hora__mfsm *s) {
  hora__mb_view_free(&s->value);
  s->value.job = s->view.job;
  s->value.epoch = s->view.epoch + 1;
  s->value.next_id = s->view.next_id;
  s->value.m = calloc((size_t)(s->view.n + s->nnc + 1), sizeof(*s->value.m));
  if (!s->value.m) {
    return HORA_ERR_NO_MEMORY;
  }
  for (int i = 0; i < s->view.n; i++) {
    if (s->v[i].promised) {
      s->value.m[s->value.n++] = s->view.m[i];
    }
  }
  int max = s->c.max_size;
  for (int j = 0; j < s->nnc; j++) {
    if (max > 0 && s->value.n >= max && !MUTANT(s, HORA_MB_MUTANT_NO_MAX_AT_RESET)) {
      break;
    }
    s->value.m[s->value.n++] =
        (struct hora__member){s->value.next_id++, s->nc[j].ip, s->nc[j].port};
  }
  return HORA_SUCCESS;
}

static void commit(struct hora__mfsm *s, uint64_t now);
static void phase_check(struct hora__mfsm *s, uint64_t now);

static void p2_begin(struct hora__mfsm *s, uint64_t now) {
  s->adopted = s->best_b != 0;
  if (s->adopted) {
    hora__mb_view_copy(&s->value, &s->best);
  } else if (fresh_value(s) != HORA_SUCCESS) {
    coord_fail(s, HORA_ERR_NO_MEMORY, "elastic: out of memory");
    return;
  }
  if (MUTANT(s, HORA_MB_MUTANT_COMMIT_EARLY)) {
    commit(s, now);
    return;
  }
  if (s->promised > s->ballot) { /* it promised a higher ballot meanwhile */
    backoff(s, now);
    return;
  }
  s->accepted_b = s->ballot;
  hora__mb_view_copy(&s->accepted, &s->value);
  s->phase = P2;
  s->phase_at = now;
  int me = my_index(s);
  for (int i = 0; i < s->view.n; i++) {
    s->v[i].replied = i == me;
    if (i != me && s->v[i].promised && !s->v[i].gone) {
      send_propose(s, i, now);
    }
  }
  phase_check(s, now); /* alone, nobody to wait for */
}

static void commit(struct hora__mfsm *s, uint64_t now) {
  int me = my_index(s);
  struct commit_rec rec = {.ballot = s->ballot, .build = !s->adopted, .ip = s->c.ip,
                           .port = s->build_port};
  hora__mb_view_copy(&rec.v, &s->value);
  /* Everyone of the new membership, and those who asked and are not in it. */
  struct buf b = begin(s, M_COMMIT);
  put64(&b, rec.ballot);
  put32(&b, rec.build);
  put(&b, &rec.ip, 4);
  put32(&b, rec.port);
  put_view(&b, &rec.v);
  for (int k = 0; k < rec.v.n; k++) {
    if (rec.v.m[k].id != s->my_id) {
      struct buf c = {0};
      put(&c, b.p, b.len);
      send_to(s, &rec.v.m[k], &c);
    }
  }
  for (int i = 0; i < s->view.n; i++) {
    if (i != me && s->v[i].asked && hora__mb_view_index(&rec.v, s->view.m[i].id) < 0) {
      struct buf c = {0};
      put(&c, b.p, b.len);
      send_to(s, &s->view.m[i], &c);
    }
  }
  free(b.p);
  /* Newcomers let in leave the queue; those past the limit are refused. */
  int keep = 0;
  for (int j = 0; j < s->nnc; j++) {
    if (view_index_addr(&rec.v, s->nc[j].ip, s->nc[j].port) >= 0) {
      continue;
    }
    if (!s->adopted && s->c.max_size > 0) {
      char msg[256];
      snprintf(msg, sizeof(msg), "elastic: the job has %d ranks and HORA_ELASTIC_MAX_SIZE=%d: "
               "no more may join", rec.v.n, s->c.max_size);
      send_refuse(s, s->nc[j].ip, s->nc[j].port, HORA_ERR_INVALID_USAGE, true, msg);
      continue;
    }
    s->nc[keep++] = s->nc[j];
  }
  s->nnc = keep;
  logf_(s, HORA_LOG_INFO, "elastic: committed membership %llu (%d ranks)%s",
        (unsigned long long)rec.v.epoch, rec.v.n,
        s->adopted ? ", which a previous coordinator had proposed" : "");
  learn(s, now, &rec, true);
  hora__mb_view_free(&rec.v);
}

/* P1 or P2 may be over: every member it waits for answered or is gone. */
static void phase_check(struct hora__mfsm *s, uint64_t now) {
  int me = my_index(s);
  bool *in = calloc((size_t)HORA_MAX(s->view.n, 1), 1);
  if (!in) {
    coord_fail(s, HORA_ERR_NO_MEMORY, "elastic: out of memory");
    return;
  }
  bool waiting = false;
  for (int i = 0; i < s->view.n; i++) {
    struct voter *v = &s->v[i];
    bool wanted = s->phase == P1 ? v->asked : v->promised;
    waiting |= i != me && wanted && !v->gone && !v->replied;
    in[i] = i == me || (wanted && v->replied && !v->gone);
  }
  if (!waiting) {
    bool q = quorum_of(s, in);
    if (s->phase == P1) {
      int n = 0;
      for (int i = 0; i < s->view.n; i++) {
        s->v[i].promised = in[i];
        n += in[i];
      }
      int room = s->c.max_size > 0 ? HORA_MAX(s->c.max_size - n, 0) : s->nnc;
      bool enough = s->best_b || n + HORA_MIN(s->nnc, room) >= s->c.min_size;
      if (q && enough) {
        p2_begin(s, now);
      } else {
        s->phase = WAIT;
        coord_check(s, now);
      }
    } else if (q) {
      point(s, "accepted");
      commit(s, now);
    } else {
      backoff(s, now);
    }
  }
  free(in);
}

/* WAIT may be over: every member asked or is gone. */
static void coord_check(struct hora__mfsm *s, uint64_t now) {
  if (s->mode != COORD) {
    return;
  }
  if (s->phase == P1 || s->phase == P2) {
    phase_check(s, now);
    return;
  }
  if (s->phase != WAIT) {
    return;
  }
  int me = my_index(s);
  int n = s->view.n, alive = 0, possible = 0;
  bool *in = calloc((size_t)HORA_MAX(n, 1), 1), *maybe = calloc((size_t)HORA_MAX(n, 1), 1);
  if (!in || !maybe) {
    free(in);
    free(maybe);
    coord_fail(s, HORA_ERR_NO_MEMORY, "elastic: out of memory");
    return;
  }
  bool pending = false;
  for (int i = 0; i < n; i++) {
    struct voter *v = &s->v[i];
    pending |= i != me && !v->asked && !v->gone;
    in[i] = i == me || (v->asked && !v->gone);
    maybe[i] = in[i] || (v->gone && !v->certain);
    alive += in[i];
    possible += maybe[i];
  }
  if (!pending) {
    int room = s->c.max_size > 0 ? HORA_MAX(s->c.max_size - alive, 0) : s->nnc;
    int newcomers = HORA_MIN(s->nnc, room);
    char msg[400] = "";
    bool never = false;
    if (!quorum_of(s, in)) {
      snprintf(msg, sizeof(msg), "elastic: only %d of the %d ranks of membership %llu are left: "
               "a reset needs more than half of them (or exactly half including its rank 0), "
               "so that the job never splits in two", alive, n, (unsigned long long)s->view.epoch);
      never = !quorum_of(s, maybe);
    } else if (alive + newcomers < s->c.min_size) {
      snprintf(msg, sizeof(msg), "elastic: only %d ranks are left, and HORA_ELASTIC_MIN_SIZE=%d",
               alive + newcomers, s->c.min_size);
      never = possible + newcomers < s->c.min_size;
    }
    if (!msg[0]) {
      s->noquorum_since = 0;
      p1_begin(s, now);
      phase_check(s, now);
    } else if (never || MUTANT(s, HORA_MB_MUTANT_FINAL_REFUSALS) ||
               (s->noquorum_since && now - s->noquorum_since >= s->c.elastic_timeout_ns)) {
      coord_fail(s, HORA_ERR_PEER_LOST, msg);
    } else if (!s->noquorum_since) {
      /* Members left out for silence may come back (a partition heals). */
      s->noquorum_since = now;
      logf_(s, HORA_LOG_WARN, "%s; waiting up to %.0f s for the members that do not answer",
            msg, (double)s->c.elastic_timeout_ns * 1e-9);
    }
  }
  free(in);
  free(maybe);
}

static void coord_begin(struct hora__mfsm *s, uint64_t now) {
  int me = my_index(s);
  s->mode = COORD;
  s->phase = WAIT;
  s->noquorum_since = 0;
  s->wait_until = now + s->c.elastic_timeout_ns;
  s->next_beat = now;
  for (int i = 0; i < s->view.n; i++) {
    bool asked = s->asked_at[i] && now - s->asked_at[i] < HORA_MB_SILENCE_NS;
    s->v[i] = (struct voter){.asked = asked, .heard = s->asked_at[i], .promise = s->v[i].promise};
  }
  s->v[me].asked = true;
  logf_(s, HORA_LOG_INFO, "elastic: coordinating the reset of membership %llu (%d ranks)",
        (unsigned long long)s->view.epoch, s->view.n);
  for (int i = 0; i < s->view.n; i++) {
    if (i != me) {
      send_beat(s, &s->view.m[i], false);
    }
  }
  s->next_beat = now + HORA_MB_BEAT_NS;
  coord_check(s, now);
}

/* A lower member coordinates: follow it, and send this one's own there. */
static void step_down(struct hora__mfsm *s, uint64_t now, int k) {
  int me = my_index(s);
  logf_(s, HORA_LOG_INFO, "elastic: rank %d (id %u) coordinates the reset: following it", k,
        s->view.m[k].id);
  for (int i = 0; i < s->view.n; i++) {
    if (i != me && i != k && s->v[i].asked && !s->v[i].gone) {
      send_redirect(s, s->view.m[i].ip, s->view.m[i].port, &s->view.m[k]);
    }
  }
  for (int i = 0; i < k; i++) {
    s->suspect[i] = true; /* it is the lowest alive */
  }
  s->suspect[k] = false;
  s->mode = FOLLOW;
  follow_begin(s, now);
}

static void coord_tick(struct hora__mfsm *s, uint64_t now) {
  int me = my_index(s);
  for (int i = 0; i < s->view.n; i++) {
    struct voter *v = &s->v[i];
    if (i == me || v->gone) {
      continue;
    }
    if (s->phase == WAIT || s->phase == BACKOFF) {
      if (!v->asked && now >= s->wait_until) {
        gone(s, i, false, "it is alive but did not call hora_elastic_reset in time "
             "(HORA_ELASTIC_TIMEOUT_SECONDS)");
      } else if (v->asked && now - v->heard > HORA_MB_SILENCE_NS) {
        gone(s, i, false, "it stopped answering during the reset");
      }
      continue;
    }
    bool wanted = s->phase == P1 ? v->asked : v->promised;
    if (!wanted || v->replied) {
      continue;
    }
    if (now - s->phase_at >= HORA_MB_REPLY_NS) {
      gone(s, i, false, "it stopped answering during the reset");
    } else if (now - v->sent >= HORA_MB_RETRY_NS) {
      if (s->phase == P1) {
        send_prepare(s, i, now);
      } else {
        send_propose(s, i, now);
      }
    }
  }
  if (now >= s->next_beat) {
    for (int i = 0; i < s->view.n; i++) {
      if (i != me && (!s->v[i].gone || !s->v[i].certain)) {
        send_beat(s, &s->view.m[i], false);
      }
    }
    s->next_beat = now + HORA_MB_BEAT_NS;
  }
  if (s->phase == BACKOFF && now >= s->backoff_until) {
    s->phase = WAIT;
  }
  coord_check(s, now);
}

/* A member asked this coordinator (again). */
static void voter_asked(struct hora__mfsm *s, uint64_t now, int k, uint64_t promise) {
  struct voter *v = &s->v[k];
  v->heard = now;
  v->promise = HORA_MAX(v->promise, promise);
  bool was = v->asked && !v->gone;
  if ((s->phase == P2) && !was) {
    return; /* too late for this ballot: the next reset */
  }
  v->asked = true;
  v->gone = false;
  if (!was) {
    logf_(s, HORA_LOG_DEBUG, "elastic: rank %d (id %u) asks for the reset", k, s->view.m[k].id);
    if (s->phase == P1) {
      send_prepare(s, k, now);
    }
    send_beat(s, &s->view.m[k], false); /* the next beats come on the clock */
  }
  coord_check(s, now);
}

/* ---- a follower --------------------------------------------------------------------- */

static void choose_cand(struct hora__mfsm *s, uint64_t now) {
  int me = my_index(s);
  int i = 0;
  while (i < s->view.n && i != me && s->suspect[i]) {
    i++;
  }
  if (i == me || i == s->view.n) {
    coord_begin(s, now);
    return;
  }
  s->cand = i;
  s->cand_since = now;
  s->cand_heard = 0;
  s->cand_started = false;
  send_reset(s, &s->view.m[i]);
  s->next_resend = now + HORA_MB_RESEND_NS;
}

static void follow_begin(struct hora__mfsm *s, uint64_t now) {
  s->mode = FOLLOW;
  choose_cand(s, now);
}

static void suspect_cand(struct hora__mfsm *s, uint64_t now, const char *why) {
  logf_(s, HORA_LOG_INFO, "elastic: rank %d (id %u) %s: asking the next", s->cand,
        s->view.m[s->cand].id, why);
  s->suspect[s->cand] = true;
  choose_cand(s, now);
}

static void follow_tick(struct hora__mfsm *s, uint64_t now) {
  uint64_t last = s->cand_heard ? s->cand_heard : s->cand_since;
  if (now - last > HORA_MB_SILENCE_NS) {
    suspect_cand(s, now, "does not answer");
  } else if (!s->cand_started &&
             now - s->cand_since > s->c.elastic_timeout_ns + START_GRACE_NS) {
    suspect_cand(s, now, "lives but has not started the reset");
  } else if (now >= s->next_resend) {
    send_reset(s, &s->view.m[s->cand]);
    s->next_resend = now + HORA_MB_RESEND_NS;
  }
}

/* A member of this view was heard coordinating (or about to). */
static void heard_coordinator(struct hora__mfsm *s, uint64_t now, int k, bool started) {
  if (s->mode == FOLLOW) {
    if (k == s->cand) {
      s->cand_heard = now;
      s->cand_started |= started;
    } else if (started && k < s->cand) {
      s->suspect[k] = false;
      s->cand = k;
      s->cand_since = s->cand_heard = now;
      s->cand_started = true;
      send_reset(s, &s->view.m[k]);
      s->next_resend = now + HORA_MB_RESEND_NS;
    } else if (started) {
      /* Another coordinator this one hears, which the one it follows may
       * not (a partition that is not clean): it is counted there too, so
       * whichever can make a quorum does. */
      send_reset(s, &s->view.m[k]);
    }
  } else if (s->mode == COORD && started) {
    int me = my_index(s);
    if (k < me) {
      step_down(s, now, k);
    } else {
      send_beat(s, &s->view.m[k], false); /* it should follow this one */
    }
  } else if (s->mode == IDLE && started) {
    ask_app(s, s->view.m[k].id);
  }
}

/* ---- learning a decision ----------------------------------------------------------- */

/* rec->v (epoch above this view's) was committed. carry: this coordinator
 * committed a previous one's value; its voters go on with it. */
static void learn(struct hora__mfsm *s, uint64_t now, const struct commit_rec *rec, bool carry) {
  int old_n = s->started ? s->view.n : 0;
  int lost = 0, joined = 0;
  bool was_member = s->started;
  for (int i = 0; i < old_n; i++) {
    lost += hora__mb_view_index(&rec->v, s->view.m[i].id) < 0;
  }
  int me = s->mode == JOINING ? view_index_addr(&rec->v, s->c.ip, s->c.port)
                              : hora__mb_view_index(&rec->v, s->my_id);
  for (int k = 0; k < rec->v.n && was_member; k++) {
    joined += hora__mb_view_index(&s->view, rec->v.m[k].id) < 0;
  }
  if (me < 0) {
    if (s->mode == JOINING) {
      return; /* a commit that does not name this newcomer */
    }
    s->left_out = true;
    snprintf(s->out_msg, sizeof(s->out_msg), "elastic: this process (id %u) was left out of the "
             "job's membership %llu", s->my_id, (unsigned long long)rec->v.epoch);
    if (s->mode == COORD) {
      tell_asked(s, HORA_ERR_PEER_LOST, false, "elastic: the coordinator was left out of the "
                 "membership: ask the next");
    }
    if (s->mode == FOLLOW || s->mode == COORD) {
      fail(s, HORA_ERR_PEER_LOST, "%s", s->out_msg);
    } else {
      ask_app(s, HORA_MB_NO_ID);
    }
    return;
  }
  if (s->mode == JOINING) {
    s->my_id = rec->v.m[me].id;
  }
  enum mode mode = s->mode;
  if (set_view(s, &rec->v) != HORA_SUCCESS) {
    fail(s, HORA_ERR_NO_MEMORY, "elastic: out of memory");
    return;
  }
  hora__mb_view_free(&s->last.v);
  s->last = *rec;
  s->last.v = (struct hora__view){0};
  forget_acceptor(s);
  for (int i = 0; i < s->view.n; i++) {
    s->asked_at[i] = 0;
    s->v[i].promise = 0;
  }
  bool coordinator = mode == COORD && rec->ip == s->c.ip && rec->port == s->build_port;
  if (mode == FOLLOW || mode == COORD || mode == JOINING) {
    if (rec->build) {
      struct hora__mfsm_event *e = push_event(s, HORA_MFSM_COMMITTED);
      if (e) {
        e->rank = me;
        e->size = s->view.n;
        e->epoch = s->view.epoch;
        e->host_ip = rec->ip;
        e->port = rec->port;
        e->builder = coordinator;
        e->joined = joined;
        e->lost = lost;
      }
      s->mode = IDLE;
      s->asked_epoch = 0;
    } else if (mode == COORD) {
      /* A previous coordinator's value: go on from it with those here. */
      for (int i = 0; i < s->view.n && carry; i++) {
        s->asked_at[i] = s->v[i].promised && s->v[i].asked ? now : 0;
      }
      coord_begin(s, now);
    } else {
      follow_begin(s, now);
    }
  } else {
    ask_app(s, HORA_MB_NO_ID);
  }
}

/* A committed view newer than this one, sent by a member (its RESET, or a
 * coordinator's base): learned as decided without a build. */
static void catch_up(struct hora__mfsm *s, uint64_t now, const struct hora__view *v) {
  if (MUTANT(s, HORA_MB_MUTANT_FINAL_REFUSALS) && s->mode == COORD) {
    coord_fail(s, HORA_ERR_PEER_LOST, "elastic: a member knows a membership this coordinator "
               "does not: it gives way");
    return;
  }
  struct commit_rec rec = {.v = *v};
  learn(s, now, &rec, false);
}

/* ---- receiving ------------------------------------------------------------------------ */

static void on_join(struct hora__mfsm *s, uint64_t now, const struct header *h) {
  if (!s->started || s->mode == JOINING) {
    return;
  }
  char who[64];
  addr_str(h->from.ip, h->from.port, who, sizeof(who));
  if (view_index_addr(&s->view, h->from.ip, h->from.port) >= 0) {
    send_commit(s, h->from.ip, h->from.port); /* let in already: it missed the commit */
    return;
  }
  if (my_index(s) != 0) {
    send_redirect(s, h->from.ip, h->from.port, &s->view.m[0]);
    return;
  }
  for (int j = 0; j < s->nnc; j++) {
    if (s->nc[j].ip == h->from.ip && s->nc[j].port == h->from.port) {
      s->nc[j].heard = now;
      return;
    }
  }
  if (s->c.insecure && s->nnc >= HORA_MAX(s->view.n, 8)) {
    char msg[200];
    snprintf(msg, sizeof(msg), "elastic: the job runs without a secret (HORA_INSECURE=1) and %d "
             "newcomers already wait: no more may wait at once", s->nnc);
    send_refuse(s, h->from.ip, h->from.port, HORA_ERR_INVALID_USAGE, true, msg);
    return;
  }
  /* During a reset the members known gone leave room; the commit refuses
   * whoever the new membership has no room for. */
  int max = s->c.max_size, members = s->view.n;
  for (int i = 0; s->mode == COORD && i < s->view.n; i++) {
    members -= s->v[i].gone;
  }
  int queued = MUTANT(s, HORA_MB_MUTANT_NO_MAX_AT_RESET) && s->mode == COORD ? 0 : s->nnc;
  if (max > 0 && members + queued >= max) {
    char msg[256];
    snprintf(msg, sizeof(msg), "elastic: the job has %d ranks%s and HORA_ELASTIC_MAX_SIZE=%d: no "
             "more may join", s->view.n, s->nnc ? " and more waiting to join" : "", max);
    logf_(s, HORA_LOG_WARN, "elastic: refused the process at %s asking to join: %s", who, msg);
    send_refuse(s, h->from.ip, h->from.port, HORA_ERR_INVALID_USAGE, true, msg);
    return;
  }
  if (s->nnc == s->cap_nc) {
    int cap = s->cap_nc ? 2 * s->cap_nc : 8;
    struct newcomer *p = realloc(s->nc, (size_t)cap * sizeof(*p));
    if (!p) {
      return;
    }
    s->nc = p;
    s->cap_nc = cap;
  }
  s->nc[s->nnc++] = (struct newcomer){h->from.ip, h->from.port, now};
  logf_(s, HORA_LOG_INFO, "elastic: the process at %s asks to join; it is admitted at the next "
        "commit", who);
}

static void on_reset(struct hora__mfsm *s, uint64_t now, const struct header *h, struct buf *b) {
  uint64_t promise = get64(b);
  struct hora__view rv = {0};
  if (!get_view(b, &rv)) {
    return;
  }
  if (rv.job != s->view.job && !MUTANT(s, HORA_MB_MUTANT_NO_JOB_CHECK)) {
    hora__mb_view_free(&rv);
    return;
  }
  if (rv.epoch > s->view.epoch && s->mode != FAILED) {
    catch_up(s, now, &rv); /* it knows a decision this process missed */
  }
  hora__mb_view_free(&rv);
  int k = hora__mb_view_index(&s->view, h->from.id);
  if (h->epoch < s->view.epoch) {
    if (k >= 0) {
      send_commit(s, h->from.ip, h->from.port);
    } else {
      char msg[200];
      snprintf(msg, sizeof(msg), "elastic: this process (id %u) was left out of the job's "
               "membership %llu", h->from.id, (unsigned long long)s->view.epoch);
      send_refuse(s, h->from.ip, h->from.port, HORA_ERR_PEER_LOST, true, msg);
    }
    return;
  }
  if (h->epoch > s->view.epoch || k < 0 || k == my_index(s)) {
    return;
  }
  if (s->left_out) {
    return;
  }
  s->asked_at[k] = now;
  switch (s->mode) {
    case IDLE:
      ask_app(s, h->from.id);
      send_beat(s, &s->view.m[k], true);
      break;
    case FOLLOW:
      send_redirect(s, h->from.ip, h->from.port, &s->view.m[s->cand]);
      break;
    case COORD:
      voter_asked(s, now, k, promise);
      break;
    case FAILED:
      send_refuse(s, h->from.ip, h->from.port, HORA_ERR_PEER_LOST, false,
                  "elastic: this member's reset failed: ask the next");
      break;
    case JOINING:
      break;
  }
}

static void on_prepare(struct hora__mfsm *s, uint64_t now, const struct header *h, struct buf *b) {
  uint64_t ballot = get64(b);
  struct hora__view base = {0};
  if (!get_view(b, &base)) {
    return;
  }
  if (base.epoch != h->epoch || (base.job != s->view.job && !MUTANT(s, HORA_MB_MUTANT_NO_JOB_CHECK))) {
    hora__mb_view_free(&base);
    return;
  }
  if (base.epoch > s->view.epoch && !MUTANT(s, HORA_MB_MUTANT_FORGET_ACCEPTED)) {
    if (s->mode == FAILED) {
      hora__mb_view_free(&base);
      return;
    }
    catch_up(s, now, &base);
  }
  hora__mb_view_free(&base);
  if (h->epoch < s->view.epoch) {
    send_commit(s, h->from.ip, h->from.port); /* its base is old */
    return;
  }
  int k = hora__mb_view_index(&s->view, h->from.id);
  bool forget = MUTANT(s, HORA_MB_MUTANT_FORGET_ACCEPTED); /* epochs unchecked, as before */
  if ((h->epoch != s->view.epoch && !forget) || k < 0 || s->left_out) {
    return;
  }
  struct buf r;
  if (ballot > s->promised) {
    s->promised = ballot;
    s->top_ballot = HORA_MAX(s->top_ballot, ballot);
    r = begin(s, M_PROMISE);
    put64(&r, ballot);
    put64(&r, s->accepted_b);
    struct hora__view none = {.job = s->view.job};
    put_view(&r, s->accepted_b ? &s->accepted : &none);
  } else {
    r = begin(s, M_NACK);
    put64(&r, ballot);
    put64(&r, s->promised);
  }
  finish(s, h->from.ip, h->from.port, &r);
  heard_coordinator(s, now, k, true);
}

static void on_propose(struct hora__mfsm *s, uint64_t now, const struct header *h, struct buf *b) {
  uint64_t ballot = get64(b);
  struct hora__view pv = {0};
  if (!get_view(b, &pv)) {
    return;
  }
  int k = hora__mb_view_index(&s->view, h->from.id);
  bool forget = MUTANT(s, HORA_MB_MUTANT_FORGET_ACCEPTED);
  if ((pv.epoch != s->view.epoch + 1 || h->epoch != s->view.epoch) && !forget) {
    if (pv.epoch <= s->view.epoch) {
      send_commit(s, h->from.ip, h->from.port);
    }
    hora__mb_view_free(&pv);
    return;
  }
  if (k < 0 || s->left_out || (pv.job != s->view.job && !MUTANT(s, HORA_MB_MUTANT_NO_JOB_CHECK))) {
    hora__mb_view_free(&pv);
    return;
  }
  point(s, "propose");
  struct buf r;
  if (ballot >= s->promised) {
    s->promised = ballot;
    s->accepted_b = ballot;
    hora__mb_view_free(&s->accepted);
    s->accepted = pv;
    r = begin(s, M_ACCEPTED);
    put64(&r, ballot);
  } else {
    hora__mb_view_free(&pv);
    r = begin(s, M_NACK);
    put64(&r, ballot);
    put64(&r, s->promised);
  }
  finish(s, h->from.ip, h->from.port, &r);
  heard_coordinator(s, now, k, true);
}

/* A voter's answer to this coordinator's ballot. */
static struct voter *answer(struct hora__mfsm *s, const struct header *h, uint64_t ballot,
                            enum phase phase) {
  if (s->mode != COORD || s->phase != phase || ballot != s->ballot ||
      (h->epoch != s->view.epoch && !MUTANT(s, HORA_MB_MUTANT_FORGET_ACCEPTED))) {
    return NULL;
  }
  int k = hora__mb_view_index(&s->view, h->from.id);
  if (k < 0 || k == my_index(s)) {
    return NULL;
  }
  return &s->v[k];
}

static void on_promise(struct hora__mfsm *s, uint64_t now, const struct header *h, struct buf *b) {
  uint64_t ballot = get64(b), ab = get64(b);
  struct hora__view av = {0};
  if (!get_view(b, &av)) {
    return;
  }
  struct voter *v = answer(s, h, ballot, P1);
  if (v && !v->replied && (v->asked || v->gone)) {
    v->asked = v->replied = true;
    v->gone = false;
    v->heard = now;
    if (ab && av.epoch == s->view.epoch + 1 && ab > s->best_b) {
      s->best_b = ab;
      hora__mb_view_free(&s->best);
      s->best = av;
      av = (struct hora__view){0};
    }
    phase_check(s, now);
  }
  hora__mb_view_free(&av);
}

static void on_nack(struct hora__mfsm *s, uint64_t now, const struct header *h, struct buf *b) {
  uint64_t ballot = get64(b), promised = get64(b);
  struct voter *v = answer(s, h, ballot, s->phase == P2 ? P2 : P1);
  if (v && !b->bad) {
    v->promise = HORA_MAX(v->promise, promised);
    s->top_ballot = HORA_MAX(s->top_ballot, promised);
    v->heard = now;
    backoff(s, now);
  }
}

static void on_accepted(struct hora__mfsm *s, uint64_t now, const struct header *h, struct buf *b) {
  uint64_t ballot = get64(b);
  struct voter *v = answer(s, h, ballot, P2);
  if (v && !b->bad && v->promised && !v->replied) {
    v->replied = true;
    v->gone = false;
    v->heard = now;
    phase_check(s, now);
  }
}

static void on_commit(struct hora__mfsm *s, uint64_t now, struct buf *b) {
  struct commit_rec rec = {.ballot = get64(b)};
  rec.build = get32(b) != 0;
  get(b, &rec.ip, 4);
  rec.port = (uint16_t)get32(b);
  if (!get_view(b, &rec.v)) {
    return;
  }
  if (MUTANT(s, HORA_MB_MUTANT_FORGET_ACCEPTED) && s->started && s->mode != JOINING) {
    s->accepted_b = 0; /* what the review found: any commit, any epoch */
    hora__mb_view_free(&s->accepted);
  }
  bool ours = s->mode == JOINING || rec.v.job == s->view.job ||
              MUTANT(s, HORA_MB_MUTANT_NO_JOB_CHECK);
  if (ours && (s->mode == JOINING || rec.v.epoch > s->view.epoch) && s->mode != FAILED) {
    learn(s, now, &rec, false);
  } else if (ours && s->mode == FAILED && !s->left_out && rec.v.epoch > s->view.epoch &&
             hora__mb_view_index(&rec.v, s->my_id) >= 0) {
    s->mode = IDLE; /* a later reset starts from it */
    learn(s, now, &rec, false);
  }
  hora__mb_view_free(&rec.v);
}

static void on_refuse(struct hora__mfsm *s, uint64_t now, const struct header *h, struct buf *b) {
  int code = (int)get32(b);
  bool final = get32(b) != 0 || MUTANT(s, HORA_MB_MUTANT_FINAL_REFUSALS);
  if (b->bad) {
    return;
  }
  char msg[400];
  size_t n = HORA_MIN(b->len - b->off, sizeof(msg) - 1);
  memcpy(msg, b->p + b->off, n);
  msg[n] = '\0';
  for (size_t i = 0; i < n; i++) {
    if ((unsigned char)msg[i] < 0x20 || (unsigned char)msg[i] > 0x7e) {
      msg[i] = '?';
    }
  }
  code = code > 0 && code < 64 ? code : HORA_ERR_PEER_LOST;
  if (s->mode == JOINING && final) {
    char where[64];
    addr_str(s->door_ip, s->door_port, where, sizeof(where));
    fail(s, code, "elastic: the job at %s refused to admit this process: %s", where, msg);
    return;
  }
  int k = s->started ? hora__mb_view_index(&s->view, h->from.id) : -1;
  if (s->mode != FOLLOW || k < 0) {
    return;
  }
  if (final) {
    if (strstr(msg, "left out")) {
      s->left_out = true;
      snprintf(s->out_msg, sizeof(s->out_msg), "%s", msg);
    }
    fail(s, code, "%s", msg);
  } else if (k == s->cand) {
    suspect_cand(s, now, "gave way");
  }
}

static void on_redirect(struct hora__mfsm *s, uint64_t now, const struct header *h, struct buf *b) {
  struct hora__member to = {.id = get32(b)};
  get(b, &to.ip, 4);
  to.port = (uint16_t)get32(b);
  if (b->bad) {
    return;
  }
  if (s->mode == JOINING) {
    s->target_ip = to.ip;
    s->target_port = to.port;
    struct buf j = begin(s, M_JOIN);
    finish(s, to.ip, to.port, &j);
    s->next_join = now + HORA_MB_RESEND_NS;
    return;
  }
  int k = hora__mb_view_index(&s->view, to.id);
  int from = hora__mb_view_index(&s->view, h->from.id);
  if (s->mode != FOLLOW || k < 0 || k == my_index(s) || from != s->cand || k == s->cand) {
    return;
  }
  s->suspect[k] = false;
  s->cand = k;
  s->cand_since = now;
  s->cand_heard = 0;
  s->cand_started = false;
  send_reset(s, &s->view.m[k]);
  s->next_resend = now + HORA_MB_RESEND_NS;
}

static void on_beat(struct hora__mfsm *s, uint64_t now, const struct header *h, struct buf *b) {
  bool pending = get32(b) != 0;
  int k = hora__mb_view_index(&s->view, h->from.id);
  if (!b->bad && h->epoch < s->view.epoch) {
    send_commit(s, h->from.ip, h->from.port); /* it missed a decision, or was left out of it */
    return;
  }
  if (b->bad || k < 0 || s->left_out) {
    return;
  }
  if (h->epoch > s->view.epoch) {
    if (s->mode == FOLLOW || s->mode == COORD || s->mode == IDLE) {
      send_reset(s, &s->view.m[k]); /* it knows a newer view: ask it */
    }
    return;
  }
  heard_coordinator(s, now, k, !pending);
}

/* During a reset something is due every second at most: a longer gap since
 * the last input means this process did not run (stopped, swapped out, a
 * stalled VM). Peers' silence over that gap is its own deafness, not
 * theirs: the timers that judge silence move on by the gap. */
#define STALL_NS (2000ull * 1000000ull)
static void stall_check(struct hora__mfsm *s, uint64_t now) {
  uint64_t last = s->last_now;
  s->last_now = now;
  if (!last || now < last + STALL_NS || (s->mode != FOLLOW && s->mode != COORD)) {
    return;
  }
  uint64_t gap = now - last;
  logf_(s, HORA_LOG_WARN, "elastic: this process did not run for %.1f s during the reset; its "
        "peers' silence over that time does not count against them", (double)gap * 1e-9);
  if (s->mode == FOLLOW) {
    s->cand_since += gap;
    s->cand_heard = s->cand_heard ? s->cand_heard + gap : 0;
    return;
  }
  for (int i = 0; i < s->view.n; i++) {
    s->v[i].heard += s->v[i].heard ? gap : 0;
    s->v[i].sent += gap;
  }
  s->phase_at += gap;
  s->wait_until += gap;
  s->noquorum_since += s->noquorum_since ? gap : 0;
  s->backoff_until += gap;
}

void hora__mfsm_receive(struct hora__mfsm *s, uint64_t now, uint32_t src_ip, const uint8_t *frame,
                        size_t len) {
  stall_check(s, now);
  struct buf b = {.p = (uint8_t *)frame, .len = len};
  struct header h;
  h.type = get32(&b);
  uint32_t plen = get32(&b);
  uint32_t magic = get32(&b);
  h.job = get64(&b);
  h.from.id = get32(&b);
  get(&b, &h.from.ip, 4);
  h.from.port = (uint16_t)get32(&b);
  h.epoch = get64(&b);
  if (b.bad || plen != len - HORA_MB_HEADER || magic != WIRE_MAGIC || h.type == 0 ||
      h.type >= M_TYPES) {
    char who[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &src_ip, who, sizeof(who));
    logf_(s, HORA_LOG_WARN, "elastic: dropped a malformed membership frame from %s", who);
    return;
  }
  if (s->c.insecure && src_ip != h.from.ip && !MUTANT(s, HORA_MB_MUTANT_NO_ADDR_CHECK)) {
    char who[64];
    addr_str(h.from.ip, h.from.port, who, sizeof(who));
    logf_(s, HORA_LOG_WARN, "elastic: dropped a %s claiming to come from %s, from another address",
          type_names[h.type], who);
    return;
  }
  if (h.type == M_JOIN) {
    on_join(s, now, &h);
    return;
  }
  bool joining = s->mode == JOINING;
  if (!s->started && !joining) {
    return;
  }
  if (!joining && h.job != s->view.job && !MUTANT(s, HORA_MB_MUTANT_NO_JOB_CHECK)) {
    char who[64];
    addr_str(h.from.ip, h.from.port, who, sizeof(who));
    logf_(s, HORA_LOG_WARN, "elastic: dropped a %s from %s: it belongs to another job that holds "
          "the same secret", type_names[h.type], who);
    return;
  }
  if (joining && h.type != M_COMMIT && h.type != M_REFUSE && h.type != M_REDIRECT) {
    return;
  }
  switch (h.type) {
    case M_RESET: on_reset(s, now, &h, &b); break;
    case M_PREPARE: on_prepare(s, now, &h, &b); break;
    case M_PROMISE: on_promise(s, now, &h, &b); break;
    case M_NACK: on_nack(s, now, &h, &b); break;
    case M_PROPOSE: on_propose(s, now, &h, &b); break;
    case M_ACCEPTED: on_accepted(s, now, &h, &b); break;
    case M_COMMIT: on_commit(s, now, &b); break;
    case M_REFUSE: on_refuse(s, now, &h, &b); break;
    case M_REDIRECT: on_redirect(s, now, &h, &b); break;
    case M_BEAT: on_beat(s, now, &h, &b); break;
    default: break;
  }
}

/* ---- the app's calls, hints, the clock ------------------------------------------------ */

int hora__mfsm_new(const struct hora__mfsm_config *c, struct hora__mfsm **out) {
  struct hora__mfsm *s = calloc(1, sizeof(*s));
  if (!s) {
    return HORA_ERR_NO_MEMORY;
  }
  s->c = *c;
  s->rng = c->seed ? c->seed : 0x9e3779b97f4a7c15ull;
  s->my_id = HORA_MB_NO_ID;
  *out = s;
  return HORA_SUCCESS;
}

void hora__mfsm_free(struct hora__mfsm *s) {
  if (!s) {
    return;
  }
  hora__mb_view_free(&s->view);
  hora__mb_view_free(&s->accepted);
  hora__mb_view_free(&s->value);
  hora__mb_view_free(&s->best);
  hora__mb_view_free(&s->last.v);
  free(s->asked_at);
  free(s->suspect);
  free(s->v);
  free(s->nc);
  for (size_t i = s->send_head; i < s->nsends; i++) {
    free(s->sends[i].frame);
  }
  free(s->sends);
  free(s->events);
  free(s);
}

int hora__mfsm_start(struct hora__mfsm *s, const struct hora__view *v, uint32_t my_id) {
  if (hora__mb_view_index(v, my_id) < 0) {
    return HORA_ERR_INVALID_ARG;
  }
  s->my_id = my_id;
  HORA_CHECK(set_view(s, v));
  s->last = (struct commit_rec){0};
  s->mode = IDLE;
  return HORA_SUCCESS;
}

void hora__mfsm_reset(struct hora__mfsm *s, uint64_t now, uint16_t build_port) {
  if (!s->started || s->mode == FOLLOW || s->mode == COORD || s->mode == JOINING) {
    return;
  }
  if (s->left_out) {
    fail(s, HORA_ERR_PEER_LOST, "%s", s->out_msg);
    return;
  }
  s->build_port = build_port;
  s->last_now = now;
  s->reset_deadline = now + 2 * s->c.elastic_timeout_ns + 30000ull * 1000000ull;
  for (int i = 0; i < s->view.n; i++) {
    s->suspect[i] = false;
  }
  follow_begin(s, now);
}

void hora__mfsm_join(struct hora__mfsm *s, uint64_t now, uint32_t door_ip, uint16_t door_port,
                     uint16_t build_port) {
  s->mode = JOINING;
  s->build_port = build_port;
  s->door_ip = s->target_ip = door_ip;
  s->door_port = s->target_port = door_port;
  s->last_now = now;
  s->join_deadline = now + s->c.elastic_timeout_ns;
  s->reset_deadline = now + 3 * s->c.elastic_timeout_ns + 30000ull * 1000000ull;
  struct buf b = begin(s, M_JOIN);
  finish(s, door_ip, door_port, &b);
  s->next_join = now + HORA_MB_RESEND_NS;
}

void hora__mfsm_unreachable(struct hora__mfsm *s, uint64_t now, uint32_t ip, uint16_t port,
                            enum hora__mb_unreachable why) {
  stall_check(s, now);
  if (s->mode == JOINING) {
    if (why == HORA_MB_FOREIGN && ip == s->door_ip && port == s->door_port) {
      char where[64];
      addr_str(ip, port, where, sizeof(where));
      fail(s, HORA_ERR_INVALID_ARG, "elastic: the process listening at %s did not prove this "
           "job's secret: another job, or a different HORA_SECRET_FILE/HORA_SECRET", where);
    } else if (ip == s->target_ip && port == s->target_port) {
      s->target_ip = s->door_ip; /* the one it was sent to went away: the door again */
      s->target_port = s->door_port;
    }
    return;
  }
  if (!s->started) {
    return;
  }
  int k = view_index_addr(&s->view, ip, port);
  if (k < 0) {
    for (int j = 0; j < s->nnc; j++) {
      if (s->nc[j].ip == ip && s->nc[j].port == port && why != HORA_MB_SILENT) {
        s->nc[j] = s->nc[--s->nnc]; /* a newcomer that gave up */
        break;
      }
    }
    return;
  }
  const char *text = why == HORA_MB_REFUSED   ? "its listener refuses connections (the process is gone)"
                     : why == HORA_MB_FOREIGN ? "another program listens at its address"
                                              : "its host does not answer";
  if (s->mode == FOLLOW && k == s->cand) {
    suspect_cand(s, now, text);
  } else if (s->mode == COORD && k != my_index(s)) {
    bool late = s->phase == P2 && !s->v[k].promised;
    if (!late) {
      gone(s, k, why != HORA_MB_SILENT, text);
      coord_check(s, now);
    }
  }
}

static void door_tick(struct hora__mfsm *s, uint64_t now) {
  for (int j = 0; j < s->nnc; j++) {
    if (now - s->nc[j].heard > HORA_MB_STALE_NS &&
        !(s->mode == COORD && s->phase == P2)) {
      s->nc[j--] = s->nc[--s->nnc]; /* it stopped knocking: it gave up */
    }
  }
}

static void tick_once(struct hora__mfsm *s, uint64_t now) {
  if (s->started && s->nnc) {
    door_tick(s, now);
  }
  switch (s->mode) {
    case FOLLOW:
    case COORD:
      if (now >= s->reset_deadline) {
        if (s->mode == COORD) {
          tell_asked(s, HORA_ERR_TIMEOUT, false, "elastic: the coordinator ran out of time");
        }
        fail(s, HORA_ERR_TIMEOUT, "elastic: no membership was agreed in time");
      } else if (s->mode == FOLLOW) {
        follow_tick(s, now);
      } else {
        coord_tick(s, now);
      }
      break;
    case JOINING:
      if (now >= s->join_deadline) {
        char where[64];
        addr_str(s->door_ip, s->door_port, where, sizeof(where));
        fail(s, HORA_ERR_TIMEOUT, "elastic: not admitted by the job at %s within %.0f s "
             "(HORA_ELASTIC_TIMEOUT_SECONDS): no commit point came, or nothing listens there",
             where, (double)s->c.elastic_timeout_ns * 1e-9);
      } else if (now >= s->next_join) {
        struct buf b = begin(s, M_JOIN);
        finish(s, s->target_ip, s->target_port, &b);
        s->next_join = now + HORA_MB_RESEND_NS;
      }
      break;
    default:
      break;
  }
}

void hora__mfsm_tick(struct hora__mfsm *s, uint64_t now) {
  stall_check(s, now);
  /* A step may leave another deadline due (a phase ended): take it now. */
  for (int k = 0; k < 8; k++) {
    tick_once(s, now);
    if (hora__mfsm_next_tick(s) > now) {
      break;
    }
  }
}

uint64_t hora__mfsm_next_tick(const struct hora__mfsm *s) {
  uint64_t t = UINT64_MAX;
  if (s->started && s->mode != JOINING && !(s->mode == COORD && s->phase == P2)) {
    for (int j = 0; j < s->nnc; j++) {
      t = HORA_MIN(t, s->nc[j].heard + HORA_MB_STALE_NS + 1);
    }
  }
  switch (s->mode) {
    case FOLLOW: {
      uint64_t last = s->cand_heard ? s->cand_heard : s->cand_since;
      t = HORA_MIN(t, s->next_resend);
      t = HORA_MIN(t, last + HORA_MB_SILENCE_NS + 1);
      if (!s->cand_started) {
        t = HORA_MIN(t, s->cand_since + s->c.elastic_timeout_ns + START_GRACE_NS + 1);
      }
      t = HORA_MIN(t, s->reset_deadline);
      break;
    }
    case COORD: {
      int me = my_index(s);
      t = HORA_MIN(t, s->next_beat);
      t = HORA_MIN(t, s->reset_deadline);
      if (s->phase == BACKOFF) {
        t = HORA_MIN(t, s->backoff_until);
      }
      if (s->noquorum_since) {
        t = HORA_MIN(t, s->noquorum_since + s->c.elastic_timeout_ns);
      }
      for (int i = 0; i < s->view.n; i++) {
        const struct voter *v = &s->v[i];
        if (i == me || v->gone) {
          continue;
        }
        if (s->phase == WAIT || s->phase == BACKOFF) {
          t = HORA_MIN(t, v->asked ? v->heard + HORA_MB_SILENCE_NS + 1 : s->wait_until);
        } else if ((s->phase == P1 ? v->asked : v->promised) && !v->replied) {
          t = HORA_MIN(t, v->sent + HORA_MB_RETRY_NS);
          t = HORA_MIN(t, s->phase_at + HORA_MB_REPLY_NS);
        }
      }
      break;
    }
    case JOINING:
      t = HORA_MIN(t, HORA_MIN(s->next_join, s->join_deadline));
      break;
    default:
      break;
  }
  return t;
}

bool hora__mfsm_take_send(struct hora__mfsm *s, struct hora__mfsm_send *out) {
  if (s->send_head == s->nsends) {
    s->send_head = s->nsends = 0;
    return false;
  }
  *out = s->sends[s->send_head++];
  return true;
}

bool hora__mfsm_take_event(struct hora__mfsm *s, struct hora__mfsm_event *out) {
  if (s->event_head == s->nevents) {
    s->event_head = s->nevents = 0;
    return false;
  }
  *out = s->events[s->event_head++];
  return true;
}

const struct hora__view *hora__mfsm_view(const struct hora__mfsm *s) { return &s->view; }
uint32_t hora__mfsm_my_id(const struct hora__mfsm *s) { return s->my_id; }
int hora__mfsm_waiting(const struct hora__mfsm *s) { return s->nnc; }
bool hora__mfsm_in_reset(const struct hora__mfsm *s) {
  return s->mode == FOLLOW || s->mode == COORD || s->mode == JOINING;
}

void hora__mfsm_acceptor(const struct hora__mfsm *s, uint64_t *promised, uint64_t *accepted_b,
                         const struct hora__view **accepted) {
  *promised = s->promised;
  *accepted_b = s->accepted_b;
  *accepted = &s->accepted;
}

void hora__mfsm_describe(const uint8_t *frame, size_t len, char *out, size_t n) {
  struct buf b = {.p = (uint8_t *)frame, .len = len};
  uint32_t type = get32(&b);
  (void)get32(&b);
  (void)get32(&b);
  (void)get64(&b);
  uint32_t id = get32(&b);
  uint32_t ip;
  get(&b, &ip, 4);
  (void)get32(&b);
  uint64_t epoch = get64(&b);
  const char *name = type < M_TYPES ? type_names[type] : "?";
  int w = snprintf(out, n, "%s from id %d e%llu", name, id == HORA_MB_NO_ID ? -1 : (int)id,
                   (unsigned long long)epoch);
  if (b.bad || w < 0 || (size_t)w >= n) {
    return;
  }
  struct hora__view v = {0};
  char tail[256] = "";
  switch (type) {
    case M_PREPARE:
    case M_PROPOSE: {
      uint64_t ballot = get64(&b);
      if (get_view(&b, &v)) {
        int t = snprintf(tail, sizeof(tail), " b%llu.%u v%llu[", (unsigned long long)(ballot >> 32),
                         (unsigned)(uint32_t)ballot, (unsigned long long)v.epoch);
        for (int i = 0; i < v.n && t > 0 && (size_t)t < sizeof(tail) - 12; i++) {
          t += snprintf(tail + t, sizeof(tail) - (size_t)t, "%s%u", i ? " " : "", v.m[i].id);
        }
        if (t > 0 && (size_t)t < sizeof(tail) - 2) {
          snprintf(tail + t, sizeof(tail) - (size_t)t, "]");
        }
      }
      break;
    }
    case M_PROMISE: {
      uint64_t ballot = get64(&b), ab = get64(&b);
      get_view(&b, &v);
      snprintf(tail, sizeof(tail), " b%llu.%u accepted b%llu.%u v%llu",
               (unsigned long long)(ballot >> 32), (unsigned)(uint32_t)ballot,
               (unsigned long long)(ab >> 32), (unsigned)(uint32_t)ab, (unsigned long long)v.epoch);
      break;
    }
    case M_NACK:
    case M_ACCEPTED: {
      uint64_t ballot = get64(&b);
      snprintf(tail, sizeof(tail), " b%llu.%u", (unsigned long long)(ballot >> 32),
               (unsigned)(uint32_t)ballot);
      break;
    }
    case M_COMMIT: {
      (void)get64(&b);
      uint32_t build = get32(&b);
      uint32_t ip2;
      get(&b, &ip2, 4);
      (void)get32(&b);
      if (get_view(&b, &v)) {
        int t = snprintf(tail, sizeof(tail), " build=%u v%llu[", build, (unsigned long long)v.epoch);
        for (int i = 0; i < v.n && t > 0 && (size_t)t < sizeof(tail) - 12; i++) {
          t += snprintf(tail + t, sizeof(tail) - (size_t)t, "%s%u", i ? " " : "", v.m[i].id);
        }
        if (t > 0 && (size_t)t < sizeof(tail) - 2) {
          snprintf(tail + t, sizeof(tail) - (size_t)t, "]");
        }
      }
      break;
    }
    case M_REFUSE: {
      (void)get32(&b);
      uint32_t final = get32(&b);
      snprintf(tail, sizeof(tail), " final=%u", final);
      break;
    }
    case M_BEAT:
      snprintf(tail, sizeof(tail), " pending=%u", get32(&b));
      break;
    default:
      break;
  }
  hora__mb_view_free(&v);
  snprintf(out + w, n - (size_t)w, "%s", tail);
}
