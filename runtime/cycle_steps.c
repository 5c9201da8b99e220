/* The negotiation cycles' steps (see the top of engine.c): our
 * contribution, the partners' steps sent and folded in, and the end of a
 * cycle, which schedules the cached responses and applies rank 0's
 * frames. The inbox and the partners, tested alone, are in cycle.c. */
#include <stdio.h>
#include <stdlib.h>

#include "base/log.h"
#include "base/params.h"
#include "runtime/engine.h"
#include "runtime/timeline.h"

/* ---- cycles ------------------------------------------------------------------ */

/* Where a partner's step of a cycle waits. */
static struct hora__cycle_inbox *inbox_of(struct hora__engine *e, uint64_t cycle, int step) {
  return hora__cycle_inbox_of(e->inbox, cycle, step);
}

static bool bit_set(const uint8_t *v, uint32_t s) { return (v[s / 8] >> (s % 8)) & 1u; }

/* Our part of the next cycle, against the cache as every rank has it. */
static void contribute(struct hora__engine *e, bool joined) {
  uint32_t used = e->cache.used, nb = (used + 7) / 8;
  uint8_t *ready = e->acc, *submitted = ready + nb, *evict = submitted + nb;
  memset(e->acc, 0, 3 * (size_t)nb);
  for (uint32_t s = 0; s < used; s++) {
    uint8_t b = (uint8_t)(1u << (s % 8));
    if (e->waiting[s]) {
      ready[s / 8] |= b;
      submitted[s / 8] |= b;
    } else if (joined && e->cache.e[s].used && e->cache.e[s].meta.kind == HORA_KIND_ALLREDUCE) {
      ready[s / 8] |= b; /* stands in with zeros */
    }
  }
  if (nb) {
    memcpy(evict, e->evict_wish, nb);
    memset(e->evict_wish, 0, nb);
  }
  e->evict_wanted = false;
  e->cycle_nbytes = nb;
  e->acc_frames = e->ctl ? e->frames_got : 0;
  e->frames_told = e->acc_frames;
  e->acc_flags = joined ? HORA_CYCLE_JOINED : 0;
  e->our_joined_flag = joined;
  hora__timeline_cycle(e->cycles + 1);
  e->new_hits = 0;
  e->cycle_started_ns = hora__now_ns();
  e->stuck_reported = false;
}

int hora__engine_lost_partner(struct hora__engine *e, int peer) {
  char name[160];
  return hora__error(HORA_ERR_PEER_LOST, "lost %s: its control connection closed",
                     hora__peer_name(e->comm->net, peer, name, sizeof(name)));
}

static int send_step(struct hora__engine *e, int peer, int step) {
  hora__ctrl *c = e->comm->proc->ctrl[peer];
  if (!c) {
    return e->shutdown_seen || e->shutting_down ? HORA_SUCCESS : hora__engine_lost_partner(e, peer);
  }
  bool ask = step == STEP_ASK;
  struct hora__cycle_msg m = {.cycle = e->cycles + 1,
                              .step = (uint8_t)step,
                              .flags = ask ? 0 : e->acc_flags,
                              .frames = ask ? 0 : e->acc_frames,
                              .nbytes = ask ? 0 : e->cycle_nbytes,
                              .vec = e->acc};
  hora__encode_cycle(&e->wbuf, &m);
  if (e->wbuf.failed) {
    return hora__error(HORA_ERR_NO_MEMORY, "out of memory encoding a cycle message");
  }
  return hora__engine_ctrl_send(e, c, HORA_MSG_CYCLE, e->wbuf.data, e->wbuf.len);
}

/* Folds a partner's step into ours (or, for the result, takes it), once
 * it has arrived. */
static int take_step(struct hora__engine *e, int peer, int step, bool *got) {
  struct hora__cycle_inbox *in = inbox_of(e, e->cycles + 1, step);
  *got = in->has;
  if (!in->has) {
    /* Its connection closed with the step not there: it never comes. */
    bool ended = e->shutdown_seen || e->shutting_down; /* it stopped after the job's end */
    return !e->comm->proc->ctrl[peer] && !ended ? hora__engine_lost_partner(e, peer) : HORA_SUCCESS;
  }
  uint32_t nb = e->cycle_nbytes;
  if (in->nbytes != nb) {
    return hora__error(HORA_ERR_PROTOCOL, "rank %d's response cache is out of step with this "
                       "rank's (%u against %u bytes of bits in cycle %llu)", peer, in->nbytes, nb,
                       (unsigned long long)(e->cycles + 1));
  }
  in->has = false;
  if (step == STEP_FOLD_OUT) {
    if (nb) { /* without a cache the vectors are empty (and vec may be NULL) */
      memcpy(e->acc, in->vec, 3 * (size_t)nb);
    }
    e->acc_frames = in->frames;
    e->acc_flags = in->flags;
    return HORA_SUCCESS;
  }
  for (uint32_t i = 0; i < nb; i++) {
    e->acc[i] &= in->vec[i];
    e->acc[nb + i] |= in->vec[nb + i];
    e->acc[2 * nb + i] |= in->vec[2 * nb + i];
  }
  e->acc_frames = HORA_MAX(e->acc_frames, in->frames);
  e->acc_flags |= in->flags;
  return HORA_SUCCESS;
}

/* Starts the next cycle when there is a reason to, and moves the one in
 * progress on as far as the partners' steps that have arrived allow. */
int hora__engine_cycle_advance(struct hora__engine *e, bool *progressed) {
  const struct hora__cycle_partners *cp = &e->partners;
  if (e->cycle_phase == CYCLE_IDLE) {
    bool joined = e->join_pending, asked = false;
    for (int i = 0; i < INBOX_STEPS && !asked; i++) {
      asked = inbox_of(e, e->cycles + 1, i)->has;
    }
    if (!asked && !e->new_hits && !e->evict_wanted && joined == e->our_joined_flag &&
        !(e->ctl && e->frames_got > e->frames_told)) {
      return HORA_SUCCESS;
    }
    HORA_TRACE("cycle %llu: starting (%s; %llu new cached requests)",
               (unsigned long long)(e->cycles + 1), asked ? "asked" : "our own",
               (unsigned long long)e->new_hits);
    contribute(e, joined);
    *progressed = true;
    e->cycle_round = 0;
    e->round_sent = false;
    e->cycle_phase = cp->folds_out ? CYCLE_RESULT : cp->fold >= 0 ? CYCLE_FOLD_IN : CYCLE_ROUNDS;
    if (cp->folds_out) {
      HORA_CHECK(send_step(e, cp->fold, STEP_FOLD_IN));
    } else if (cp->fold >= 0 && !inbox_of(e, e->cycles + 1, STEP_FOLD_IN)->has) {
      HORA_CHECK(send_step(e, cp->fold, STEP_ASK));
    }
  }
  for (;;) {
    bool got;
    switch (e->cycle_phase) {
      case CYCLE_FOLD_IN:
        HORA_CHECK(take_step(e, cp->fold, STEP_FOLD_IN, &got));
        if (!got) {
          return HORA_SUCCESS;
        }
        e->cycle_phase = CYCLE_ROUNDS;
        *progressed = true;
        break;
      case CYCLE_ROUNDS:
        if (e->cycle_round == cp->nrounds) {
          if (cp->fold >= 0) {
            HORA_CHECK(send_step(e, cp->fold, STEP_FOLD_OUT));
          }
          e->cycle_phase = CYCLE_DONE;
          *progressed = true;
          return HORA_SUCCESS;
        }
        if (!e->round_sent) {
          HORA_CHECK(send_step(e, cp->round[e->cycle_round], 1 + e->cycle_round));
          e->round_sent = true;
          *progressed = true;
        }
        HORA_CHECK(take_step(e, cp->round[e->cycle_round], 1 + e->cycle_round, &got));
        if (!got) {
          return HORA_SUCCESS;
        }
        e->cycle_round++;
        e->round_sent = false;
        *progressed = true;
        break;
      case CYCLE_RESULT:
        HORA_CHECK(take_step(e, cp->fold, STEP_FOLD_OUT, &got));
        if (got) {
          e->cycle_phase = CYCLE_DONE;
          *progressed = true;
        }
        return HORA_SUCCESS;
      default:
        return HORA_SUCCESS;
    }
  }
}

/* Rank 0's timeline rows of a tensor that ran from the cache. */
static void timeline_cached(const struct hora__response *r, int size) {
  if (!hora__timeline_enabled()) {
    return;
  }
  const struct hora__resp_tensor *t = &r->tensors[0];
  hora__timeline_begin(t->key, t->key_len, hora__negotiate_phase(r->kind));
  for (int rank = 0; rank < size; rank++) {
    char mark[32];
    snprintf(mark, sizeof(mark), "rank %d ready", rank);
    hora__timeline_mark(t->key, t->key_len, mark);
  }
  hora__timeline_end(t->key, t->key_len);
  hora__timeline_begin(t->key, t->key_len, HORA_PHASE_QUEUE);
}

/* Our waiting requests whose slot no longer holds them (emptied, or taken
 * by another key), or that may not wait while someone has joined, go to
 * rank 0 in full. */
static int unwait_stale(struct hora__engine *e) {
  size_t n = 0;
  for (uint32_t s = 0; s < e->cache.capacity && e->nwaiting > n; s++) {
    struct hora_request *q = e->waiting[s];
    if (!q) {
      continue;
    }
    const struct hora__cache_entry *ce = hora__cache_entry(&e->cache, (int32_t)s);
    bool ours = ce && ce->key_len == q->key_len && memcmp(ce->key, q->key, q->key_len) == 0;
    bool stale = !ours || !hora__meta_equal(&ce->meta, &q->meta) ||
                 (e->others_joined && q->meta.kind != HORA_KIND_ALLREDUCE);
    if (!stale) {
      n++;
      continue;
    }
    if (ours) {
      hora__engine_wish_evicted(e,
                                (int32_t)s); /* ranks that submit it later must not wait either */
    }
    HORA_CHECK(hora__engine_grow_reqs(e, 1));
    e->waiting[s] = NULL;
    e->nwaiting--;
    q->sent_slot = -1;
    HORA_CHECK(hora__engine_send_full(e, &q, 1));
  }
  return HORA_SUCCESS;
}

/* The end of a cycle, once rank 0's frames it counts have all arrived:
 * the same steps, in the same order, on every rank. */
int hora__engine_cycle_end(struct hora__engine *e, bool *progressed) {
  if (e->cycle_phase != CYCLE_DONE || e->frames_got < e->acc_frames) {
    return HORA_SUCCESS;
  }
  uint32_t nb = e->cycle_nbytes;
  const uint8_t *ready = e->acc, *submitted = ready + nb, *evict = submitted + nb;
  struct hora__response *head = NULL, **tail = &head;
  int rc = HORA_SUCCESS;
  for (uint32_t s = 0; s < nb * 8 && rc == HORA_SUCCESS; s++) {
    if (!bit_set(ready, s) || !bit_set(submitted, s)) {
      continue;
    }
    const struct hora__cache_entry *ce = hora__cache_entry(&e->cache, (int32_t)s);
    struct hora__response *r = ce ? hora__response_for(&ce->meta, ce->key, ce->key_len) : NULL;
    if (!r) {
      rc = ce ? HORA_ERR_NO_MEMORY
              : hora__error(HORA_ERR_PROTOCOL, "cycle %llu scheduled cache slot %u, which is "
                            "empty here: the ranks' caches are out of step",
                            (unsigned long long)(e->cycles + 1), s);
      break;
    }
    *tail = r;
    tail = &r->next;
    int32_t noted;
    struct hora__op_meta m = ce->meta;
    rc = hora__cache_note(&e->cache, r->tensors[0].key, r->tensors[0].key_len, &m, &noted);
    if (e->waiting[s]) {
      e->waiting[s] = NULL;
      e->nwaiting--;
    }
    timeline_cached(r, e->comm->size);
  }
  if (rc == HORA_SUCCESS) {
    rc = hora__responses_fuse(head, &tail, hora__params.FUSION_THRESHOLD);
  }
  for (uint32_t s = 0; s < nb * 8 && rc == HORA_SUCCESS; s++) {
    if (bit_set(evict, s) && !(bit_set(ready, s) && bit_set(submitted, s))) {
      hora__cache_forget(&e->cache, (int32_t)s);
    }
  }
  while (rc == HORA_SUCCESS && e->frames_applied < e->acc_frames) {
    struct frame *f = e->frames_head;
    e->frames_head = f->next;
    if (!e->frames_head) {
      e->frames_tail = &e->frames_head;
    }
    if (hora__decode_responses(f->data, f->len, &tail, &e->cache) != HORA_SUCCESS) {
      rc = hora__error(HORA_ERR_PROTOCOL, "rank 0 sent a malformed response list: %s",
                       hora__error_message());
    }
    free(f);
    e->frames_applied++;
  }
  bool join_done = false;
  for (struct hora__response *r = head; r; r = r->next) {
    join_done |= r->kind == HORA_KIND_JOIN;
  }
  e->join_pending &= !join_done;
  *e->todo_tail = head; /* queued even on failure, so they are freed */
  if (head) {
    e->todo_tail = tail;
  }
  HORA_CHECK(rc);
  /* An ask that crossed our own start is spent with the cycle. */
  inbox_of(e, e->cycles + 1, STEP_ASK)->has = false;
  e->cycles++;
  HORA_TRACE("cycle %llu: done, frames %llu", (unsigned long long)e->cycles,
             (unsigned long long)e->acc_frames);
  atomic_fetch_add(&e->rt->stats.cycles, 1);
  /* The all-joined response ends every rank's join: from this cycle on no
   * one stands in, on every rank alike. */
  e->others_joined = (e->acc_flags & HORA_CYCLE_JOINED) != 0 && !join_done;
  e->cycle_phase = CYCLE_IDLE;
  *progressed = true;
  return unwait_stale(e);
}
