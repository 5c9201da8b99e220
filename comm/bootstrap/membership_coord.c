/* The elastic agreement as its coordinator (membership_fsm.h says how it
 * works and why it is safe): waiting for the members, the two phases of
 * Paxos, the commit. */
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/bootstrap/membership_fsm_impl.h"

/* ---- the coordinator --------------------------------------------------------------- */


void hora__mf_gone(struct hora__mfsm *s, int i, bool certain, const char *why) {
  struct voter *v = &s->v[i];
  if (v->gone && (v->certain || !certain)) {
    return;
  }
  if (!v->gone) {
    hora__mf_log(s, HORA_LOG_WARN, "elastic: rank %d (id %u) of membership %llu is gone: %s", i,
          s->view.m[i].id, (unsigned long long)s->view.epoch, why);
  }
  v->gone = true;
  v->certain = certain;
  v->why = why;
}

/* Tells every member that asked this coordinator (and the newcomers
 * waiting here) that the reset failed: final, or go and ask another. */
void hora__mf_tell_asked(struct hora__mfsm *s, int code, bool final, const char *msg) {
  int me = hora__mf_my_index(s);
  for (int i = 0; i < s->view.n; i++) {
    if (i != me && s->v[i].asked && !s->v[i].gone) {
      hora__mf_send_refuse(s, s->view.m[i].ip, s->view.m[i].port, code, final, msg);
    }
  }
  if (final) {
    for (int j = 0; j < s->nnc; j++) {
      hora__mf_send_refuse(s, s->nc[j].ip, s->nc[j].port, code, true, msg);
    }
    s->nnc = 0;
  }
}

void hora__mf_coord_fail(struct hora__mfsm *s, int code, const char *msg) {
  hora__mf_tell_asked(s, code, true, msg);
  hora__mf_fail(s, code, "%s", msg);
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
  struct buf b = hora__mf_begin(s, M_PREPARE);
  hora__mf_put64(&b, s->ballot);
  hora__mf_put_view(&b, &s->view);
  hora__mf_send_to(s, &s->view.m[i], &b);
  s->v[i].sent = now;
}

static void send_propose(struct hora__mfsm *s, int i, uint64_t now) {
  struct buf b = hora__mf_begin(s, M_PROPOSE);
  hora__mf_put64(&b, s->ballot);
  hora__mf_put_view(&b, &s->value);
  hora__mf_send_to(s, &s->view.m[i], &b);
  s->v[i].sent = now;
}

static void p1_begin(struct hora__mfsm *s, uint64_t now) {
  int me = hora__mf_my_index(s);
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
    hora__mf_coord_fail(s, HORA_ERR_NO_MEMORY, "elastic: out of memory");
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
  int me = hora__mf_my_index(s);
  for (int i = 0; i < s->view.n; i++) {
    s->v[i].replied = i == me;
    if (i != me && s->v[i].promised && !s->v[i].gone) {
      send_propose(s, i, now);
    }
  }
  phase_check(s, now); /* alone, nobody to wait for */
}

static void commit(struct hora__mfsm *s, uint64_t now) {
  int me = hora__mf_my_index(s);
  struct commit_rec rec = {.ballot = s->ballot, .build = !s->adopted, .ip = s->c.ip,
                           .port = s->build_port};
  hora__mb_view_copy(&rec.v, &s->value);
  /* Everyone of the new membership, and those who asked and are not in it. */
  struct buf b = hora__mf_begin(s, M_COMMIT);
  hora__mf_put64(&b, rec.ballot);
  hora__mf_put32(&b, rec.build);
  hora__mf_put(&b, &rec.ip, 4);
  hora__mf_put32(&b, rec.port);
  hora__mf_put_view(&b, &rec.v);
  for (int k = 0; k < rec.v.n; k++) {
    if (rec.v.m[k].id != s->my_id) {
      struct buf c = {0};
      hora__mf_put(&c, b.p, b.len);
      hora__mf_send_to(s, &rec.v.m[k], &c);
    }
  }
  for (int i = 0; i < s->view.n; i++) {
    if (i != me && s->v[i].asked && hora__mb_view_index(&rec.v, s->view.m[i].id) < 0) {
      struct buf c = {0};
      hora__mf_put(&c, b.p, b.len);
      hora__mf_send_to(s, &s->view.m[i], &c);
    }
  }
  free(b.p);
  /* Newcomers let in leave the queue; those past the limit are refused. */
  int keep = 0;
  for (int j = 0; j < s->nnc; j++) {
    if (hora__mf_view_index_addr(&rec.v, s->nc[j].ip, s->nc[j].port) >= 0) {
      continue;
    }
    if (!s->adopted && s->c.max_size > 0) {
      char msg[256];
      snprintf(msg, sizeof(msg), "elastic: the job has %d ranks and HORA_ELASTIC_MAX_SIZE=%d: "
               "no more may join", rec.v.n, s->c.max_size);
      hora__mf_send_refuse(s, s->nc[j].ip, s->nc[j].port, HORA_ERR_INVALID_USAGE, true, msg);
      continue;
    }
    s->nc[keep++] = s->nc[j];
  }
  s->nnc = keep;
  hora__mf_log(s, HORA_LOG_INFO, "elastic: committed membership %llu (%d ranks)%s",
        (unsigned long long)rec.v.epoch, rec.v.n,
        s->adopted ? ", which a previous coordinator had proposed" : "");
  hora__mf_learn(s, now, &rec, true);
  hora__mb_view_free(&rec.v);
}

/* P1 or P2 may be over: every member it waits for answered or is gone. */
static void phase_check(struct hora__mfsm *s, uint64_t now) {
  int me = hora__mf_my_index(s);
  bool *in = calloc((size_t)HORA_MAX(s->view.n, 1), 1);
  if (!in) {
    hora__mf_coord_fail(s, HORA_ERR_NO_MEMORY, "elastic: out of memory");
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
    bool q = hora__mf_quorum_of(s, in);
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
        hora__mf_coord_check(s, now);
      }
    } else if (q) {
      hora__mf_point(s, "accepted");
      commit(s, now);
    } else {
      backoff(s, now);
    }
  }
  free(in);
}

/* WAIT may be over: every member asked or is gone. */
void hora__mf_coord_check(struct hora__mfsm *s, uint64_t now) {
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
  int me = hora__mf_my_index(s);
  int n = s->view.n, alive = 0, possible = 0;
  bool *in = calloc((size_t)HORA_MAX(n, 1), 1), *maybe = calloc((size_t)HORA_MAX(n, 1), 1);
  if (!in || !maybe) {
    free(in);
    free(maybe);
    hora__mf_coord_fail(s, HORA_ERR_NO_MEMORY, "elastic: out of memory");
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
    if (!hora__mf_quorum_of(s, in)) {
      snprintf(msg, sizeof(msg), "elastic: only %d of the %d ranks of membership %llu are left: "
               "a reset needs more than half of them (or exactly half including its rank 0), "
               "so that the job never splits in two", alive, n, (unsigned long long)s->view.epoch);
      never = !hora__mf_quorum_of(s, maybe);
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
      hora__mf_coord_fail(s, HORA_ERR_PEER_LOST, msg);
    } else if (!s->noquorum_since) {
      /* Members left out for silence may come back (a partition heals). */
      s->noquorum_since = now;
      hora__mf_log(s, HORA_LOG_WARN, "%s; waiting up to %.0f s for the members that do not answer",
            msg, (double)s->c.elastic_timeout_ns * 1e-9);
    }
  }
  free(in);
  free(maybe);
}

void hora__mf_coord_begin(struct hora__mfsm *s, uint64_t now) {
  int me = hora__mf_my_index(s);
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
  hora__mf_log(s, HORA_LOG_INFO, "elastic: coordinating the reset of membership %llu (%d ranks)",
        (unsigned long long)s->view.epoch, s->view.n);
  for (int i = 0; i < s->view.n; i++) {
    if (i != me) {
      hora__mf_send_beat(s, &s->view.m[i], false);
    }
  }
  s->next_beat = now + HORA_MB_BEAT_NS;
  hora__mf_coord_check(s, now);
}

/* A lower member coordinates: follow it, and send this one's own there. */
void hora__mf_step_down(struct hora__mfsm *s, uint64_t now, int k) {
  int me = hora__mf_my_index(s);
  hora__mf_log(s, HORA_LOG_INFO, "elastic: rank %d (id %u) coordinates the reset: following it", k,
        s->view.m[k].id);
  for (int i = 0; i < s->view.n; i++) {
    if (i != me && i != k && s->v[i].asked && !s->v[i].gone) {
      hora__mf_send_redirect(s, s->view.m[i].ip, s->view.m[i].port, &s->view.m[k]);
    }
  }
  for (int i = 0; i < k; i++) {
    s->suspect[i] = true; /* it is the lowest alive */
  }
  s->suspect[k] = false;
  s->mode = FOLLOW;
  hora__mf_follow_begin(s, now);
}

void hora__mf_coord_tick(struct hora__mfsm *s, uint64_t now) {
  int me = hora__mf_my_index(s);
  for (int i = 0; i < s->view.n; i++) {
    struct voter *v = &s->v[i];
    if (i == me || v->gone) {
      continue;
    }
    if (s->phase == WAIT || s->phase == BACKOFF) {
      if (!v->asked && now >= s->wait_until) {
        hora__mf_gone(s, i, false, "it is alive but did not call hora_elastic_reset in time "
             "(HORA_ELASTIC_TIMEOUT_SECONDS)");
      } else if (v->asked && now - v->heard > HORA_MB_SILENCE_NS) {
        hora__mf_gone(s, i, false, "it stopped answering during the reset");
      }
      continue;
    }
    bool wanted = s->phase == P1 ? v->asked : v->promised;
    if (!wanted || v->replied) {
      continue;
    }
    if (now - s->phase_at >= HORA_MB_REPLY_NS) {
      hora__mf_gone(s, i, false, "it stopped answering during the reset");
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
        hora__mf_send_beat(s, &s->view.m[i], false);
      }
    }
    s->next_beat = now + HORA_MB_BEAT_NS;
  }
  if (s->phase == BACKOFF && now >= s->backoff_until) {
    s->phase = WAIT;
  }
  hora__mf_coord_check(s, now);
}

/* A member asked this coordinator (again). */
void hora__mf_voter_asked(struct hora__mfsm *s, uint64_t now, int k, uint64_t promise) {
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
    hora__mf_log(s, HORA_LOG_DEBUG, "elastic: rank %d (id %u) asks for the reset", k, s->view.m[k].id);
    if (s->phase == P1) {
      send_prepare(s, k, now);
    }
    hora__mf_send_beat(s, &s->view.m[k], false); /* the next beats come on the clock */
  }
  hora__mf_coord_check(s, now);
}

/* A voter's answer to this coordinator's ballot. */
static struct voter *answer(struct hora__mfsm *s, const struct header *h, uint64_t ballot,
                            enum phase phase) {
  if (s->mode != COORD || s->phase != phase || ballot != s->ballot ||
      (h->epoch != s->view.epoch && !MUTANT(s, HORA_MB_MUTANT_FORGET_ACCEPTED))) {
    return NULL;
  }
  int k = hora__mb_view_index(&s->view, h->from.id);
  if (k < 0 || k == hora__mf_my_index(s)) {
    return NULL;
  }
  return &s->v[k];
}

void hora__mf_on_promise(struct hora__mfsm *s, uint64_t now, const struct header *h, struct buf *b) {
  uint64_t ballot = hora__mf_get64(b), ab = hora__mf_get64(b);
  struct hora__view av = {0};
  if (!hora__mf_get_view(b, &av)) {
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

void hora__mf_on_nack(struct hora__mfsm *s, uint64_t now, const struct header *h, struct buf *b) {
  uint64_t ballot = hora__mf_get64(b), promised = hora__mf_get64(b);
  struct voter *v = answer(s, h, ballot, s->phase == P2 ? P2 : P1);
  if (v && !b->bad) {
    v->promise = HORA_MAX(v->promise, promised);
    s->top_ballot = HORA_MAX(s->top_ballot, promised);
    v->heard = now;
    backoff(s, now);
  }
}

void hora__mf_on_accepted(struct hora__mfsm *s, uint64_t now, const struct header *h, struct buf *b) {
  uint64_t ballot = hora__mf_get64(b);
  struct voter *v = answer(s, h, ballot, P2);
  if (v && !b->bad && v->promised && !v->replied) {
    v->replied = true;
    v->gone = false;
    v->heard = now;
    phase_check(s, now);
  }
}
