/* The elastic agreement as a state machine (see membership_fsm.h for the
 * protocol and why it is safe): a member's part (following a coordinator,
 * learning decisions), the app's calls and the clock; frames are
 * membership_receive.c's, the coordinator membership_coord.c's, the wire
 * membership_wire.c's. No I/O, no clock, no entropy: everything it does
 * follows from its inputs, so the simulator can replay a schedule. */
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/bootstrap/membership_fsm_impl.h"

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

/* ---- a follower --------------------------------------------------------------------- */

static void choose_cand(struct hora__mfsm *s, uint64_t now) {
  int me = hora__mf_my_index(s);
  int i = 0;
  while (i < s->view.n && i != me && s->suspect[i]) {
    i++;
  }
  if (i == me || i == s->view.n) {
    hora__mf_coord_begin(s, now);
    return;
  }
  s->cand = i;
  s->cand_since = now;
  s->cand_heard = 0;
  s->cand_started = false;
  hora__mf_send_reset(s, &s->view.m[i]);
  s->next_resend = now + HORA_MB_RESEND_NS;
}

void hora__mf_follow_begin(struct hora__mfsm *s, uint64_t now) {
  s->mode = FOLLOW;
  choose_cand(s, now);
}

void hora__mf_suspect_cand(struct hora__mfsm *s, uint64_t now, const char *why) {
  hora__mf_log(s, HORA_LOG_INFO, "elastic: rank %d (id %u) %s: asking the next", s->cand,
        s->view.m[s->cand].id, why);
  s->suspect[s->cand] = true;
  choose_cand(s, now);
}

static void follow_tick(struct hora__mfsm *s, uint64_t now) {
  uint64_t last = s->cand_heard ? s->cand_heard : s->cand_since;
  if (now - last > HORA_MB_SILENCE_NS) {
    hora__mf_suspect_cand(s, now, "does not answer");
  } else if (!s->cand_started &&
             now - s->cand_since > s->c.elastic_timeout_ns + START_GRACE_NS) {
    hora__mf_suspect_cand(s, now, "lives but has not started the reset");
  } else if (now >= s->next_resend) {
    hora__mf_send_reset(s, &s->view.m[s->cand]);
    s->next_resend = now + HORA_MB_RESEND_NS;
  }
}

/* A member of this view was heard coordinating (or about to). */
void hora__mf_heard_coordinator(struct hora__mfsm *s, uint64_t now, int k, bool started) {
  if (s->mode == FOLLOW) {
    if (k == s->cand) {
      s->cand_heard = now;
      s->cand_started |= started;
    } else if (started && k < s->cand) {
      s->suspect[k] = false;
      s->cand = k;
      s->cand_since = s->cand_heard = now;
      s->cand_started = true;
      hora__mf_send_reset(s, &s->view.m[k]);
      s->next_resend = now + HORA_MB_RESEND_NS;
    } else if (started) {
      /* Another coordinator this one hears, which the one it follows may
       * not (a partition that is not clean): it is counted there too, so
       * whichever can make a quorum does. */
      hora__mf_send_reset(s, &s->view.m[k]);
    }
  } else if (s->mode == COORD && started) {
    int me = hora__mf_my_index(s);
    if (k < me) {
      hora__mf_step_down(s, now, k);
    } else {
      hora__mf_send_beat(s, &s->view.m[k], false); /* it should follow this one */
    }
  } else if (s->mode == IDLE && started) {
    hora__mf_ask_app(s, s->view.m[k].id);
  }
}

/* ---- learning a decision ----------------------------------------------------------- */

/* rec->v (epoch above this view's) was committed. carry: this coordinator
 * committed a previous one's value; its voters go on with it. */
void hora__mf_learn(struct hora__mfsm *s, uint64_t now, const struct commit_rec *rec, bool carry) {
  int old_n = s->started ? s->view.n : 0;
  int lost = 0, joined = 0;
  bool was_member = s->started;
  for (int i = 0; i < old_n; i++) {
    lost += hora__mb_view_index(&rec->v, s->view.m[i].id) < 0;
  }
  int me = s->mode == JOINING ? hora__mf_view_index_addr(&rec->v, s->c.ip, s->c.port)
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
      hora__mf_tell_asked(s, HORA_ERR_PEER_LOST, false, "elastic: the coordinator was left out of the "
                 "membership: ask the next");
    }
    if (s->mode == FOLLOW || s->mode == COORD) {
      hora__mf_fail(s, HORA_ERR_PEER_LOST, "%s", s->out_msg);
    } else {
      hora__mf_ask_app(s, HORA_MB_NO_ID);
    }
    return;
  }
  if (s->mode == JOINING) {
    s->my_id = rec->v.m[me].id;
  }
  enum mode mode = s->mode;
  if (set_view(s, &rec->v) != HORA_SUCCESS) {
    hora__mf_fail(s, HORA_ERR_NO_MEMORY, "elastic: out of memory");
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
      struct hora__mfsm_event *e = hora__mf_push_event(s, HORA_MFSM_COMMITTED);
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
      hora__mf_coord_begin(s, now);
    } else {
      hora__mf_follow_begin(s, now);
    }
  } else {
    hora__mf_ask_app(s, HORA_MB_NO_ID);
  }
}

/* A committed view newer than this one, sent by a member (its RESET, or a
 * coordinator's base): learned as decided without a build. */
void hora__mf_catch_up(struct hora__mfsm *s, uint64_t now, const struct hora__view *v) {
  if (MUTANT(s, HORA_MB_MUTANT_FINAL_REFUSALS) && s->mode == COORD) {
    hora__mf_coord_fail(s, HORA_ERR_PEER_LOST, "elastic: a member knows a membership this coordinator "
               "does not: it gives way");
    return;
  }
  struct commit_rec rec = {.v = *v};
  hora__mf_learn(s, now, &rec, false);
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
    hora__mf_fail(s, HORA_ERR_PEER_LOST, "%s", s->out_msg);
    return;
  }
  s->build_port = build_port;
  s->last_now = now;
  s->reset_deadline = now + 2 * s->c.elastic_timeout_ns + 30000ull * 1000000ull;
  for (int i = 0; i < s->view.n; i++) {
    s->suspect[i] = false;
  }
  hora__mf_follow_begin(s, now);
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
  struct buf b = hora__mf_begin(s, M_JOIN);
  hora__mf_finish(s, door_ip, door_port, &b);
  s->next_join = now + HORA_MB_RESEND_NS;
}

void hora__mfsm_unreachable(struct hora__mfsm *s, uint64_t now, uint32_t ip, uint16_t port,
                            enum hora__mb_unreachable why) {
  hora__mf_stall_check(s, now);
  if (s->mode == JOINING) {
    if (why == HORA_MB_FOREIGN && ip == s->door_ip && port == s->door_port) {
      char where[64];
      hora__mf_addr_str(ip, port, where, sizeof(where));
      hora__mf_fail(s, HORA_ERR_INVALID_ARG, "elastic: the process listening at %s did not prove this "
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
  int k = hora__mf_view_index_addr(&s->view, ip, port);
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
    hora__mf_suspect_cand(s, now, text);
  } else if (s->mode == COORD && k != hora__mf_my_index(s)) {
    bool late = s->phase == P2 && !s->v[k].promised;
    /* A peer that does not prove the members' key may be a newcomer a
     * decision named before it learned the job's key: it asks once it has,
     * or is left out as any member that does not ask in time. */
    bool newcomer = why == HORA_MB_FOREIGN && !MUTANT(s, HORA_MB_MUTANT_FOREIGN_IS_GONE);
    if (!late && !newcomer) {
      hora__mf_gone(s, k, why != HORA_MB_SILENT, text);
      hora__mf_coord_check(s, now);
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
          hora__mf_tell_asked(s, HORA_ERR_TIMEOUT, false, "elastic: the coordinator ran out of time");
        }
        hora__mf_fail(s, HORA_ERR_TIMEOUT, "elastic: no membership was agreed in time");
      } else if (s->mode == FOLLOW) {
        follow_tick(s, now);
      } else {
        hora__mf_coord_tick(s, now);
      }
      break;
    case JOINING:
      if (now >= s->join_deadline) {
        char where[64];
        hora__mf_addr_str(s->door_ip, s->door_port, where, sizeof(where));
        hora__mf_fail(s, HORA_ERR_TIMEOUT, "elastic: not admitted by the job at %s within %.0f s "
             "(HORA_ELASTIC_TIMEOUT_SECONDS): no commit point came, or nothing listens there",
             where, (double)s->c.elastic_timeout_ns * 1e-9);
      } else if (now >= s->next_join) {
        struct buf b = hora__mf_begin(s, M_JOIN);
        hora__mf_finish(s, s->target_ip, s->target_port, &b);
        s->next_join = now + HORA_MB_RESEND_NS;
      }
      break;
    default:
      break;
  }
}

void hora__mfsm_tick(struct hora__mfsm *s, uint64_t now) {
  hora__mf_stall_check(s, now);
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
      int me = hora__mf_my_index(s);
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
