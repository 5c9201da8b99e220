/* The elastic agreement's views, frames and outputs (the state machine of
 * membership_fsm.h): encoding and checking what crosses the wire, and the
 * frames and decisions handed to the driver. */
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/bootstrap/membership_fsm_impl.h"

const char *const hora__mf_type_names[M_TYPES] = {
    "?", "RESET", "JOIN", "PREPARE", "PROMISE", "NACK", "PROPOSE", "ACCEPTED", "COMMIT",
    "REFUSE", "REDIRECT", "BEAT"};

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

int hora__mf_view_index_addr(const struct hora__view *v, uint32_t ip, uint16_t port) {
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

bool hora__mf_quorum_of(const struct hora__mfsm *s, const bool *in) {
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


void hora__mf_put(struct buf *b, const void *d, size_t n) {
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
void hora__mf_put32(struct buf *b, uint32_t v) {
  v = htonl(v);
  hora__mf_put(b, &v, 4);
}
void hora__mf_put64(struct buf *b, uint64_t v) {
  hora__mf_put32(b, (uint32_t)(v >> 32));
  hora__mf_put32(b, (uint32_t)v);
}
void hora__mf_put_view(struct buf *b, const struct hora__view *v) {
  hora__mf_put64(b, v->job);
  hora__mf_put64(b, v->epoch);
  hora__mf_put32(b, v->next_id);
  hora__mf_put32(b, (uint32_t)v->n);
  for (int i = 0; i < v->n; i++) {
    hora__mf_put32(b, v->m[i].id);
    hora__mf_put(b, &v->m[i].ip, 4);
    hora__mf_put32(b, v->m[i].port);
  }
}
bool hora__mf_get(struct buf *b, void *d, size_t n) {
  if (b->bad || b->off + n > b->len) {
    b->bad = true;
    memset(d, 0, n);
    return false;
  }
  memcpy(d, b->p + b->off, n);
  b->off += n;
  return true;
}
uint32_t hora__mf_get32(struct buf *b) {
  uint32_t v;
  hora__mf_get(b, &v, 4);
  return ntohl(v);
}
uint64_t hora__mf_get64(struct buf *b) {
  uint64_t hi = hora__mf_get32(b);
  return hi << 32 | hora__mf_get32(b);
}
static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}
/* A view as sent: ids unique and below next_id, no address twice. */
bool hora__mf_get_view(struct buf *b, struct hora__view *v) {
  hora__mb_view_free(v);
  v->job = hora__mf_get64(b);
  v->epoch = hora__mf_get64(b);
  v->next_id = hora__mf_get32(b);
  uint32_t n = hora__mf_get32(b);
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
    v->m[i].id = hora__mf_get32(b);
    hora__mf_get(b, &v->m[i].ip, 4);
    v->m[i].port = (uint16_t)hora__mf_get32(b);
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
      b->bad |= hora__mf_view_index_addr(v, v->m[i].ip, v->m[i].port) != (int)i;
    }
  }
  free(ids);
  if (b->bad) {
    hora__mb_view_free(v);
  }
  return !b->bad;
}


/* ---- outputs, logging -------------------------------------------------------------- */

void hora__mf_log(struct hora__mfsm *s, int level, const char *fmt, ...) {
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

struct hora__mfsm_event *hora__mf_push_event(struct hora__mfsm *s, enum hora__mfsm_event_kind k) {
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

struct buf hora__mf_begin(const struct hora__mfsm *s, uint32_t type) {
  struct buf b = {0};
  hora__mf_put32(&b, type);
  hora__mf_put32(&b, 0); /* the payload's length, filled in by finish */
  hora__mf_put32(&b, WIRE_MAGIC);
  hora__mf_put64(&b, s->started ? s->view.job : 0);
  hora__mf_put32(&b, s->started ? s->my_id : HORA_MB_NO_ID);
  hora__mf_put(&b, &s->c.ip, 4);
  hora__mf_put32(&b, s->c.port);
  hora__mf_put64(&b, s->started ? s->view.epoch : 0);
  return b;
}

void hora__mf_finish(struct hora__mfsm *s, uint32_t ip, uint16_t port, struct buf *b) {
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

void hora__mf_send_to(struct hora__mfsm *s, const struct hora__member *to, struct buf *b) {
  hora__mf_finish(s, to->ip, to->port, b);
}

void hora__mf_send_refuse(struct hora__mfsm *s, uint32_t ip, uint16_t port, int code, bool final,
                        const char *msg) {
  struct buf b = hora__mf_begin(s, M_REFUSE);
  hora__mf_put32(&b, (uint32_t)code);
  hora__mf_put32(&b, final);
  hora__mf_put(&b, msg, strlen(msg));
  hora__mf_finish(s, ip, port, &b);
}

void hora__mf_send_beat(struct hora__mfsm *s, const struct hora__member *to, bool pending) {
  struct buf b = hora__mf_begin(s, M_BEAT);
  hora__mf_put32(&b, pending);
  hora__mf_send_to(s, to, &b);
}

void hora__mf_send_reset(struct hora__mfsm *s, const struct hora__member *to) {
  struct buf b = hora__mf_begin(s, M_RESET);
  hora__mf_put64(&b, s->promised);
  hora__mf_put_view(&b, &s->view);
  hora__mf_send_to(s, to, &b);
}

void hora__mf_send_redirect(struct hora__mfsm *s, uint32_t ip, uint16_t port,
                          const struct hora__member *to) {
  struct buf b = hora__mf_begin(s, M_REDIRECT);
  hora__mf_put32(&b, to->id);
  hora__mf_put(&b, &to->ip, 4);
  hora__mf_put32(&b, to->port);
  hora__mf_finish(s, ip, port, &b);
}

/* How this process's view was decided, to one that missed it. */
void hora__mf_send_commit(struct hora__mfsm *s, uint32_t ip, uint16_t port) {
  struct buf b = hora__mf_begin(s, M_COMMIT);
  hora__mf_put64(&b, s->last.ballot);
  hora__mf_put32(&b, s->last.build);
  hora__mf_put(&b, &s->last.ip, 4);
  hora__mf_put32(&b, s->last.port);
  hora__mf_put_view(&b, &s->view);
  hora__mf_finish(s, ip, port, &b);
}

void hora__mf_fail(struct hora__mfsm *s, int code, const char *fmt, ...) {
  struct hora__mfsm_event *e = hora__mf_push_event(s, HORA_MFSM_FAILED);
  if (e) {
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    hora__mf_log(s, HORA_LOG_INFO, "%s", e->msg);
  }
  s->mode = FAILED;
}

/* The app's world is older than what the job agreed, or a member asks for
 * a reset: told once per epoch. */
void hora__mf_ask_app(struct hora__mfsm *s, uint32_t from) {
  if (s->mode != IDLE || s->asked_epoch == s->view.epoch + 1) {
    return;
  }
  s->asked_epoch = s->view.epoch + 1;
  struct hora__mfsm_event *e = hora__mf_push_event(s, HORA_MFSM_ASKED);
  if (e) {
    e->from = from;
  }
}

void hora__mf_point(struct hora__mfsm *s, const char *name) {
  if (s->c.point) {
    s->c.point(s->c.point_arg, name);
  }
}

int hora__mf_my_index(const struct hora__mfsm *s) { return hora__mb_view_index(&s->view, s->my_id); }

void hora__mf_addr_str(uint32_t ip, uint16_t port, char *out, size_t n) {
  char a[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &ip, a, sizeof(a));
  snprintf(out, n, "%s:%u", a, (unsigned)port);
}

/* " vEPOCH[ids...]" after the t bytes out already holds. */
static void describe_view(const struct hora__view *v, char *out, size_t n, int t) {
  if (t < 0 || (size_t)t >= n) {
    return;
  }
  t += snprintf(out + t, n - (size_t)t, " v%llu[", (unsigned long long)v->epoch);
  for (int i = 0; i < v->n && t > 0 && (size_t)t < n - 12; i++) {
    t += snprintf(out + t, n - (size_t)t, "%s%u", i ? " " : "", v->m[i].id);
  }
  if (t > 0 && (size_t)t < n - 2) {
    snprintf(out + t, n - (size_t)t, "]");
  }
}

void hora__mfsm_describe(const uint8_t *frame, size_t len, char *out, size_t n) {
  struct buf b = {.p = (uint8_t *)frame, .len = len};
  uint32_t type = hora__mf_get32(&b);
  (void)hora__mf_get32(&b);
  (void)hora__mf_get32(&b);
  (void)hora__mf_get64(&b);
  uint32_t id = hora__mf_get32(&b);
  uint32_t ip;
  hora__mf_get(&b, &ip, 4);
  (void)hora__mf_get32(&b);
  uint64_t epoch = hora__mf_get64(&b);
  const char *name = type < M_TYPES ? hora__mf_type_names[type] : "?";
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
      uint64_t ballot = hora__mf_get64(&b);
      if (hora__mf_get_view(&b, &v)) {
        int t = snprintf(tail, sizeof(tail), " b%llu.%u", (unsigned long long)(ballot >> 32),
                         (unsigned)(uint32_t)ballot);
        describe_view(&v, tail, sizeof(tail), t);
      }
      break;
    }
    case M_PROMISE: {
      uint64_t ballot = hora__mf_get64(&b), ab = hora__mf_get64(&b);
      hora__mf_get_view(&b, &v);
      snprintf(tail, sizeof(tail), " b%llu.%u accepted b%llu.%u v%llu",
               (unsigned long long)(ballot >> 32), (unsigned)(uint32_t)ballot,
               (unsigned long long)(ab >> 32), (unsigned)(uint32_t)ab, (unsigned long long)v.epoch);
      break;
    }
    case M_NACK:
    case M_ACCEPTED: {
      uint64_t ballot = hora__mf_get64(&b);
      snprintf(tail, sizeof(tail), " b%llu.%u", (unsigned long long)(ballot >> 32),
               (unsigned)(uint32_t)ballot);
      break;
    }
    case M_COMMIT: {
      (void)hora__mf_get64(&b);
      uint32_t build = hora__mf_get32(&b);
      uint32_t ip2;
      hora__mf_get(&b, &ip2, 4);
      (void)hora__mf_get32(&b);
      if (hora__mf_get_view(&b, &v)) {
        describe_view(&v, tail, sizeof(tail), snprintf(tail, sizeof(tail), " build=%u", build));
      }
      break;
    }
    case M_REFUSE: {
      (void)hora__mf_get32(&b);
      uint32_t final = hora__mf_get32(&b);
      snprintf(tail, sizeof(tail), " final=%u", final);
      break;
    }
    case M_BEAT:
      snprintf(tail, sizeof(tail), " pending=%u", hora__mf_get32(&b));
      break;
    default:
      break;
  }
  hora__mb_view_free(&v);
  snprintf(out + w, n - (size_t)w, "%s", tail);
}
