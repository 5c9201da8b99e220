/* The elastic agreement's state machine receiving a frame (membership_fsm.h
 * says how the protocol works and why it is safe): checked, then handled
 * as the process's part in the reset makes it, an acceptor's answers
 * included. */
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/bootstrap/membership_fsm_impl.h"

/* ---- receiving ------------------------------------------------------------------------ */

static void on_join(struct hora__mfsm *s, uint64_t now, const struct header *h) {
  if (!s->started || s->mode == JOINING) {
    return;
  }
  char who[64];
  hora__mf_addr_str(h->from.ip, h->from.port, who, sizeof(who));
  if (hora__mf_view_index_addr(&s->view, h->from.ip, h->from.port) >= 0) {
    hora__mf_send_commit(s, h->from.ip, h->from.port); /* let in already: it missed the commit */
    return;
  }
  if (hora__mf_my_index(s) != 0) {
    hora__mf_send_redirect(s, h->from.ip, h->from.port, &s->view.m[0]);
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
    hora__mf_send_refuse(s, h->from.ip, h->from.port, HORA_ERR_INVALID_USAGE, true, msg);
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
    hora__mf_log(s, HORA_LOG_WARN, "elastic: refused the process at %s asking to join: %s", who, msg);
    hora__mf_send_refuse(s, h->from.ip, h->from.port, HORA_ERR_INVALID_USAGE, true, msg);
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
  hora__mf_log(s, HORA_LOG_INFO, "elastic: the process at %s asks to join; it is admitted at the next "
        "commit", who);
}

static void on_reset(struct hora__mfsm *s, uint64_t now, const struct header *h, struct buf *b) {
  uint64_t promise = hora__mf_get64(b);
  struct hora__view rv = {0};
  if (!hora__mf_get_view(b, &rv)) {
    return;
  }
  if (rv.job != s->view.job && !MUTANT(s, HORA_MB_MUTANT_NO_JOB_CHECK)) {
    hora__mb_view_free(&rv);
    return;
  }
  if (rv.epoch > s->view.epoch && s->mode != FAILED) {
    hora__mf_catch_up(s, now, &rv); /* it knows a decision this process missed */
  }
  hora__mb_view_free(&rv);
  int k = hora__mb_view_index(&s->view, h->from.id);
  if (h->epoch < s->view.epoch) {
    if (k >= 0) {
      hora__mf_send_commit(s, h->from.ip, h->from.port);
    } else {
      char msg[200];
      snprintf(msg, sizeof(msg), "elastic: this process (id %u) was left out of the job's "
               "membership %llu", h->from.id, (unsigned long long)s->view.epoch);
      hora__mf_send_refuse(s, h->from.ip, h->from.port, HORA_ERR_PEER_LOST, true, msg);
    }
    return;
  }
  if (h->epoch > s->view.epoch || k < 0 || k == hora__mf_my_index(s)) {
    return;
  }
  if (s->left_out) {
    return;
  }
  s->asked_at[k] = now;
  switch (s->mode) {
    case IDLE:
      hora__mf_ask_app(s, h->from.id);
      hora__mf_send_beat(s, &s->view.m[k], true);
      break;
    case FOLLOW:
      hora__mf_send_redirect(s, h->from.ip, h->from.port, &s->view.m[s->cand]);
      break;
    case COORD:
      hora__mf_voter_asked(s, now, k, promise);
      break;
    case FAILED:
      hora__mf_send_refuse(s, h->from.ip, h->from.port, HORA_ERR_PEER_LOST, false,
                  "elastic: this member's reset failed: ask the next");
      break;
    case JOINING:
      break;
  }
}

static void on_prepare(struct hora__mfsm *s, uint64_t now, const struct header *h, struct buf *b) {
  uint64_t ballot = hora__mf_get64(b);
  struct hora__view base = {0};
  if (!hora__mf_get_view(b, &base)) {
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
    hora__mf_catch_up(s, now, &base);
  }
  hora__mb_view_free(&base);
  if (h->epoch < s->view.epoch) {
    hora__mf_send_commit(s, h->from.ip, h->from.port); /* its base is old */
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
    r = hora__mf_begin(s, M_PROMISE);
    hora__mf_put64(&r, ballot);
    hora__mf_put64(&r, s->accepted_b);
    struct hora__view none = {.job = s->view.job};
    hora__mf_put_view(&r, s->accepted_b ? &s->accepted : &none);
  } else {
    r = hora__mf_begin(s, M_NACK);
    hora__mf_put64(&r, ballot);
    hora__mf_put64(&r, s->promised);
  }
  hora__mf_finish(s, h->from.ip, h->from.port, &r);
  hora__mf_heard_coordinator(s, now, k, true);
}

static void on_propose(struct hora__mfsm *s, uint64_t now, const struct header *h, struct buf *b) {
  uint64_t ballot = hora__mf_get64(b);
  struct hora__view pv = {0};
  if (!hora__mf_get_view(b, &pv)) {
    return;
  }
  int k = hora__mb_view_index(&s->view, h->from.id);
  bool forget = MUTANT(s, HORA_MB_MUTANT_FORGET_ACCEPTED);
  if ((pv.epoch != s->view.epoch + 1 || h->epoch != s->view.epoch) && !forget) {
    if (pv.epoch <= s->view.epoch) {
      hora__mf_send_commit(s, h->from.ip, h->from.port);
    }
    hora__mb_view_free(&pv);
    return;
  }
  if (k < 0 || s->left_out || (pv.job != s->view.job && !MUTANT(s, HORA_MB_MUTANT_NO_JOB_CHECK))) {
    hora__mb_view_free(&pv);
    return;
  }
  hora__mf_point(s, "propose");
  struct buf r;
  if (ballot >= s->promised) {
    s->promised = ballot;
    s->accepted_b = ballot;
    hora__mb_view_free(&s->accepted);
    s->accepted = pv;
    r = hora__mf_begin(s, M_ACCEPTED);
    hora__mf_put64(&r, ballot);
  } else {
    hora__mb_view_free(&pv);
    r = hora__mf_begin(s, M_NACK);
    hora__mf_put64(&r, ballot);
    hora__mf_put64(&r, s->promised);
  }
  hora__mf_finish(s, h->from.ip, h->from.port, &r);
  hora__mf_heard_coordinator(s, now, k, true);
}

static void on_commit(struct hora__mfsm *s, uint64_t now, struct buf *b) {
  struct commit_rec rec = {.ballot = hora__mf_get64(b)};
  rec.build = hora__mf_get32(b) != 0;
  hora__mf_get(b, &rec.ip, 4);
  rec.port = (uint16_t)hora__mf_get32(b);
  if (!hora__mf_get_view(b, &rec.v)) {
    return;
  }
  if (MUTANT(s, HORA_MB_MUTANT_FORGET_ACCEPTED) && s->started && s->mode != JOINING) {
    s->accepted_b = 0; /* what the review found: any commit, any epoch */
    hora__mb_view_free(&s->accepted);
  }
  bool ours = s->mode == JOINING || rec.v.job == s->view.job ||
              MUTANT(s, HORA_MB_MUTANT_NO_JOB_CHECK);
  if (ours && (s->mode == JOINING || rec.v.epoch > s->view.epoch) && s->mode != FAILED) {
    hora__mf_learn(s, now, &rec, false);
  } else if (ours && s->mode == FAILED && !s->left_out && rec.v.epoch > s->view.epoch &&
             hora__mb_view_index(&rec.v, s->my_id) >= 0) {
    s->mode = IDLE; /* a later reset starts from it */
    hora__mf_learn(s, now, &rec, false);
  }
  hora__mb_view_free(&rec.v);
}

static void on_refuse(struct hora__mfsm *s, uint64_t now, const struct header *h, struct buf *b) {
  int code = (int)hora__mf_get32(b);
  bool final = hora__mf_get32(b) != 0 || MUTANT(s, HORA_MB_MUTANT_FINAL_REFUSALS);
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
    hora__mf_addr_str(s->door_ip, s->door_port, where, sizeof(where));
    hora__mf_fail(s, code, "elastic: the job at %s refused to admit this process: %s", where, msg);
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
    hora__mf_fail(s, code, "%s", msg);
  } else if (k == s->cand) {
    hora__mf_suspect_cand(s, now, "gave way");
  }
}

static void on_redirect(struct hora__mfsm *s, uint64_t now, const struct header *h, struct buf *b) {
  struct hora__member to = {.id = hora__mf_get32(b)};
  hora__mf_get(b, &to.ip, 4);
  to.port = (uint16_t)hora__mf_get32(b);
  if (b->bad) {
    return;
  }
  if (s->mode == JOINING) {
    s->target_ip = to.ip;
    s->target_port = to.port;
    struct buf j = hora__mf_begin(s, M_JOIN);
    hora__mf_finish(s, to.ip, to.port, &j);
    s->next_join = now + HORA_MB_RESEND_NS;
    return;
  }
  int k = hora__mb_view_index(&s->view, to.id);
  int from = hora__mb_view_index(&s->view, h->from.id);
  if (s->mode != FOLLOW || k < 0 || k == hora__mf_my_index(s) || from != s->cand || k == s->cand) {
    return;
  }
  s->suspect[k] = false;
  s->cand = k;
  s->cand_since = now;
  s->cand_heard = 0;
  s->cand_started = false;
  hora__mf_send_reset(s, &s->view.m[k]);
  s->next_resend = now + HORA_MB_RESEND_NS;
}

static void on_beat(struct hora__mfsm *s, uint64_t now, const struct header *h, struct buf *b) {
  bool pending = hora__mf_get32(b) != 0;
  int k = hora__mb_view_index(&s->view, h->from.id);
  if (!b->bad && h->epoch < s->view.epoch) {
    hora__mf_send_commit(s, h->from.ip, h->from.port); /* it missed a decision, or was left out of it */
    return;
  }
  if (b->bad || k < 0 || s->left_out) {
    return;
  }
  if (h->epoch > s->view.epoch) {
    if (s->mode == FOLLOW || s->mode == COORD || s->mode == IDLE) {
      hora__mf_send_reset(s, &s->view.m[k]); /* it knows a newer view: ask it */
    }
    return;
  }
  hora__mf_heard_coordinator(s, now, k, !pending);
}

/* During a reset something is due every second at most: a longer gap since
 * the last input means this process did not run (stopped, swapped out, a
 * stalled VM). Peers' silence over that gap is its own deafness, not
 * theirs: the timers that judge silence move on by the gap. */
#define STALL_NS (2000ull * 1000000ull)
void hora__mf_stall_check(struct hora__mfsm *s, uint64_t now) {
  uint64_t last = s->last_now;
  s->last_now = now;
  if (!last || now < last + STALL_NS || (s->mode != FOLLOW && s->mode != COORD)) {
    return;
  }
  uint64_t gap = now - last;
  hora__mf_log(s, HORA_LOG_WARN, "elastic: this process did not run for %.1f s during the reset; its "
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
  hora__mf_stall_check(s, now);
  struct buf b = {.p = (uint8_t *)frame, .len = len};
  struct header h;
  h.type = hora__mf_get32(&b);
  uint32_t plen = hora__mf_get32(&b);
  uint32_t magic = hora__mf_get32(&b);
  h.job = hora__mf_get64(&b);
  h.from.id = hora__mf_get32(&b);
  hora__mf_get(&b, &h.from.ip, 4);
  h.from.port = (uint16_t)hora__mf_get32(&b);
  h.epoch = hora__mf_get64(&b);
  if (b.bad || plen != len - HORA_MB_HEADER || magic != WIRE_MAGIC || h.type == 0 ||
      h.type >= M_TYPES) {
    char who[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &src_ip, who, sizeof(who));
    hora__mf_log(s, HORA_LOG_WARN, "elastic: dropped a malformed membership frame from %s", who);
    return;
  }
  if (s->c.insecure && src_ip != h.from.ip && !MUTANT(s, HORA_MB_MUTANT_NO_ADDR_CHECK)) {
    char who[64];
    hora__mf_addr_str(h.from.ip, h.from.port, who, sizeof(who));
    hora__mf_log(s, HORA_LOG_WARN, "elastic: dropped a %s claiming to come from %s, from another address",
          hora__mf_type_names[h.type], who);
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
    hora__mf_addr_str(h.from.ip, h.from.port, who, sizeof(who));
    hora__mf_log(s, HORA_LOG_WARN, "elastic: dropped a %s from %s: it belongs to another job that holds "
          "the same secret", hora__mf_type_names[h.type], who);
    return;
  }
  if (joining && h.type != M_COMMIT && h.type != M_REFUSE && h.type != M_REDIRECT) {
    return;
  }
  switch (h.type) {
    case M_RESET: on_reset(s, now, &h, &b); break;
    case M_PREPARE: on_prepare(s, now, &h, &b); break;
    case M_PROMISE: hora__mf_on_promise(s, now, &h, &b); break;
    case M_NACK: hora__mf_on_nack(s, now, &h, &b); break;
    case M_PROPOSE: on_propose(s, now, &h, &b); break;
    case M_ACCEPTED: hora__mf_on_accepted(s, now, &h, &b); break;
    case M_COMMIT: on_commit(s, now, &b); break;
    case M_REFUSE: on_refuse(s, now, &h, &b); break;
    case M_REDIRECT: on_redirect(s, now, &h, &b); break;
    case M_BEAT: on_beat(s, now, &h, &b); break;
    default: break;
  }
}
