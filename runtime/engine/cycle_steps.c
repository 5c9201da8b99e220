/* The negotiation cycles' steps (see the top of engine.c): our
 * contribution, the partners' steps sent and folded in, and the end of a
 * cycle, which schedules the cached responses and applies rank 0's
 * frames. The inbox and the partners, tested alone, are in
 * negotiate/cycle.c. */
#include <stdio.h>
#include <stdlib.h>

#include "base/log.h"
#include "base/params.h"
#include "comm/reduce/reduce.h"
#include "comm/shm/shm.h"
#include "runtime/engine/engine.h"
#include "runtime/negotiate/fusion.h"
#include "runtime/observe/timeline.h"

/* ---- cycles ------------------------------------------------------------------ */

/* Where a partner's step of a cycle waits. */
static struct hora__cycle_inbox *inbox_of(struct hora__set *set, uint64_t cycle, int step) {
  return hora__cycle_inbox_of(set->inbox, cycle, step);
}

static bool bit_set(const uint8_t *v, uint32_t s) { return (v[s / 8] >> (s % 8)) & 1u; }

/* ---- eager operations ---------------------------------------------------------
 * A small operation that ran before is one bit of the cycle, and its data
 * can travel with that bit: each rank adds its part to its contribution,
 * and each step folds the data of the slots both sides carry (the eager
 * vector is ANDed, so a slot's data at the end is every rank's). A
 * reduction (allreduce, reducescatter) adds its whole tensor, prescaled,
 * and a step reduces; a broadcast's root adds its buffer and the others
 * zeros, an allgather's ranks zeros with their own block in its place, and
 * a step ORs the bytes, which leaves every byte as its one owner sent it.
 * Partners of a step hold the same two operands and the kernels are
 * commutative, so every rank ends with the same bits, as after any other
 * collective. Slots whose data did not come from everyone (a joined rank
 * stands in, a rank over its byte budget) run as usual. */

/* What a slot's operation carries: an allgather's whole result, the
 * others' whole input. */
static size_t eager_bytes(const struct hora__op_meta *m, int size) {
  size_t b = (size_t)m->count * hora_dtype_size((hora_dtype)m->dtype);
  return m->kind == HORA_KIND_ALLGATHER ? b * (size_t)size : b;
}

static bool eager_reduces(const struct hora__op_meta *m) {
  return m->kind == HORA_KIND_ALLREDUCE || m->kind == HORA_KIND_REDUCESCATTER;
}

static void or_bytes(uint8_t *dst, const uint8_t *src, size_t n) {
  for (size_t i = 0; i < n; i++) {
    dst[i] |= src[i];
  }
}

/* Each tensor's data starts at a multiple of 8 bytes, so that the kernels
 * read every dtype aligned (the buffers themselves come from malloc). */
static size_t eager_align(size_t off) { return (off + 7) & ~(size_t)7; }

/* What may travel eagerly: decided from the cached operation alone, which
 * every rank has alike (the cost model's hora__eager says the same). A
 * reducescatter split by explicit counts does not. */
static bool eager_kind(const struct hora__op_meta *m, int size) {
  bool kind = m->kind == HORA_KIND_ALLREDUCE || m->kind == HORA_KIND_BROADCAST ||
              m->kind == HORA_KIND_ALLGATHER ||
              (m->kind == HORA_KIND_REDUCESCATTER && m->split == 0 && m->root >= 0);
  return kind && !m->device && m->op != HORA_ADASUM && m->compression == HORA_COMPRESSION_NONE &&
         m->group == 0 &&
         (m->kind != HORA_KIND_ALLGATHER || m->count <= SIZE_MAX / 16 / (size_t)size) &&
         eager_bytes(m, size) <= (size_t)hora__params.EAGER_THRESHOLD;
}

/* Zeros up to the next tensor's start (they are sent: no stray bytes). */
static void eager_pad(struct hora__wbuf *w) {
  static const uint8_t zeros[8];
  hora__wbuf_put(w, zeros, eager_align(w->len) - w->len);
}

/* Our own data for the slots we can send, within the budget. */
static int eager_contribute(struct hora__set *set, uint8_t *eager, uint32_t used) {
  struct hora__wbuf *w = &set->eager;
  hora__wbuf_reset(w);
  if (hora__params.EAGER_THRESHOLD <= 0 || hora__params.VERIFY || set->comm->size < 2) {
    return HORA_SUCCESS;
  }
  size_t budget = (size_t)hora__params.EAGER_THRESHOLD;
  int size = set->comm->size, rank = set->comm->rank;
  for (uint32_t s = 0; s < used; s++) {
    struct hora_request *q = set->waiting[s];
    const struct hora__op_meta *m = &set->cache.e[s].meta;
    if (!q || !set->cache.e[s].used || !eager_kind(m, size) || !hora__meta_equal(m, &q->meta)) {
      continue;
    }
    size_t b = eager_bytes(m, size);
    if (eager_align(w->len) + b > budget) {
      break;
    }
    eager_pad(w);
    size_t at = w->len;
    if (eager_reduces(m) || (m->kind == HORA_KIND_BROADCAST && m->root == rank)) {
      hora__wbuf_put(w, q->sendbuf, b);
    } else {
      /* Zeros, and an allgather's own block in its place. */
      hora__wbuf_put_zeros(w, b);
      if (m->kind == HORA_KIND_ALLGATHER && !w->failed && b) {
        size_t block = b / (size_t)size;
        memcpy(w->data + at + (size_t)rank * block, q->sendbuf, block);
      }
    }
    if (w->failed) {
      return HORA_ERR_NO_MEMORY;
    }
    if (eager_reduces(m) && m->prescale != 1.0) {
      hora__scale((hora_dtype)m->dtype, w->data + at, (size_t)m->count, m->prescale);
    }
    eager[s / 8] |= (uint8_t)(1u << (s % 8));
  }
  return HORA_SUCCESS;
}

/* Folds a partner's eager data into ours: the slots both carry, reduced. */
static int eager_fold(struct hora__set *set, const uint8_t *theirs_bits, const uint8_t *theirs,
                      size_t theirs_len, uint32_t nb, int peer) {
  uint8_t *mine_bits = set->acc + 3 * (size_t)nb;
  const struct hora__wbuf *mine = &set->eager;
  struct hora__wbuf *out = &set->eager_tmp;
  hora__wbuf_reset(out);
  size_t mo = 0, to = 0;
  for (uint32_t s = 0; s < nb * 8; s++) {
    if (!(mine_bits[s / 8] | theirs_bits[s / 8])) {
      s |= 7; /* a byte of slots neither side carries */
      continue;
    }
    bool m = bit_set(mine_bits, s), t = bit_set(theirs_bits, s);
    if (!m && !t) {
      continue;
    }
    const struct hora__cache_entry *ce = hora__cache_entry(&set->cache, (int32_t)s);
    if (!ce || !eager_kind(&ce->meta, set->comm->size)) {
      return hora__error(HORA_ERR_PROTOCOL, "rank %d sent eager data for cache slot %u, which "
                         "holds no small operation that travels so here: the ranks' caches "
                         "are out of step", peer, s);
    }
    size_t b = eager_bytes(&ce->meta, set->comm->size);
    mo = m ? eager_align(mo) : mo;
    to = t ? eager_align(to) : to;
    if ((t && to + b > theirs_len) || (m && mo + b > mine->len)) {
      return hora__error(HORA_ERR_PROTOCOL, "rank %d's eager data is shorter (%zu bytes) than "
                         "its slots need", peer, theirs_len);
    }
    if (m && t) {
      eager_pad(out);
      hora__wbuf_put(out, mine->data + mo, b);
      if (out->failed) {
        return HORA_ERR_NO_MEMORY;
      }
      uint8_t *dst = out->data + out->len - b;
      if (eager_reduces(&ce->meta)) {
        hora__reduce((hora_dtype)ce->meta.dtype, (hora_op)ce->meta.op, dst, dst, theirs + to,
                     (size_t)ce->meta.count);
      } else {
        or_bytes(dst, theirs + to, b);
      }
    }
    mo += m ? b : 0;
    to += t ? b : 0;
  }
  if (to != theirs_len) {
    return hora__error(HORA_ERR_PROTOCOL, "rank %d's eager data is longer (%zu bytes) than its "
                       "slots need (%zu)", peer, theirs_len, to);
  }
  for (uint32_t i = 0; i < nb; i++) {
    mine_bits[i] &= theirs_bits[i];
  }
  struct hora__wbuf folded = *out;
  *out = set->eager;
  set->eager = folded;
  return HORA_SUCCESS;
}

/* Our part of the next cycle, against the cache as every rank has it. */
static int contribute(struct hora__set *set, bool joined) {
  uint32_t used = set->cache.used, nb = (used + 7) / 8;
  uint8_t *ready = set->acc, *submitted = ready + nb, *evict = submitted + nb;
  uint8_t *eager = evict + nb;
  memset(set->acc, 0, HORA_CYCLE_VECTORS * (size_t)nb);
  for (uint32_t s = 0; s < used; s++) {
    uint8_t b = (uint8_t)(1u << (s % 8));
    if (set->waiting[s]) {
      ready[s / 8] |= b;
      submitted[s / 8] |= b;
    } else if (joined && set->cache.e[s].used && hora__kind_stands_in(set->cache.e[s].meta.kind)) {
      ready[s / 8] |= b; /* stands in with zeros */
    }
  }
  int rc = eager_contribute(set, eager, used);
  if (nb) {
    memcpy(evict, set->evict_wish, nb);
    memset(set->evict_wish, 0, nb);
  }
  set->evict_wanted = false;
  set->cycle_nbytes = nb;
  set->acc_frames = set->ctl ? set->frames_got : 0;
  set->frames_told = set->acc_frames;
  set->acc_flags = joined ? HORA_CYCLE_JOINED : 0;
  set->our_joined_flag = joined;
  hora__engine_late_contribute(set);
  hora__timeline_cycle(set->cycles + 1);
  set->new_hits = 0;
  set->cycle_started_ns = hora__now_ns();
  set->stuck_reported = false;
  return rc;
}

int hora__engine_lost_partner(struct hora__engine *e, int peer) {
  char name[160];
  return hora__error(HORA_ERR_PEER_LOST, "lost %s: its control connection closed",
                     hora__peer_name(&e->proc->net, peer, name, sizeof(name)));
}

static int send_step(struct hora__set *set, int peer, int step) {
  hora__ctrl *c = set->comm->proc->ctrl[peer];
  if (!c) {
    return set->shutdown_seen || set->e->shutting_down ? HORA_SUCCESS : hora__engine_lost_partner(set->e, peer);
  }
  bool ask = step == STEP_ASK;
  struct hora__cycle_msg m = {.cycle = set->cycles + 1,
                              .step = (uint8_t)step,
                              .flags = ask ? 0 : set->acc_flags,
                              .frames = ask ? 0 : set->acc_frames,
                              .nbytes = ask ? 0 : set->cycle_nbytes,
                              .vec = set->acc,
                              .late = set->acc_late,
                              .eager_len = ask ? 0 : (uint32_t)set->eager.len,
                              .eager = set->eager.data};
  hora__encode_cycle(&set->e->wbuf, &m);
  if (set->e->wbuf.failed) {
    return hora__error(HORA_ERR_NO_MEMORY, "out of memory encoding a cycle message");
  }
  /* A partner on this host: through its mailbox (no system call at either
   * end), unless it sleeps in poll(), which only a socket wakes. */
  struct hora__shm *shm = set->comm->proc->shm;
  bool nudge = false;
  if (shm && hora__shm_mail_send(shm, hora__shm_local_of(shm, peer), set->e->wbuf.data,
                                 set->e->wbuf.len, &nudge)) {
    return nudge ? hora__engine_ctrl_send(set->e, c, HORA_MSG_HEARTBEAT, NULL, 0) : HORA_SUCCESS;
  }
  return hora__engine_ctrl_send(set->e, c, HORA_MSG_CYCLE, set->e->wbuf.data, set->e->wbuf.len);
}

/* Folds a partner's step into ours (or, for the result, takes it), once
 * it has arrived. */
static int take_step(struct hora__set *set, int peer, int step, bool *got) {
  struct hora__cycle_inbox *in = inbox_of(set, set->cycles + 1, step);
  *got = in->has;
  if (!in->has) {
    /* Its connection closed with the step not there: it never comes. */
    bool ended = set->shutdown_seen || set->e->shutting_down; /* it stopped after the job's end */
    return !set->comm->proc->ctrl[peer] && !ended ? hora__engine_lost_partner(set->e, peer) : HORA_SUCCESS;
  }
  uint32_t nb = set->cycle_nbytes;
  if (in->nbytes != nb) {
    return hora__error(HORA_ERR_PROTOCOL, "rank %d's response cache is out of step with this "
                       "rank's (%u against %u bytes of bits in cycle %llu)", peer, in->nbytes, nb,
                       (unsigned long long)(set->cycles + 1));
  }
  hora__cycle_take(set->inbox, set->cycles + 1, step);
  if (step == STEP_FOLD_OUT) {
    if (nb) { /* without a cache the vectors are empty (and vec may be NULL) */
      memcpy(set->acc, in->vec, HORA_CYCLE_VECTORS * (size_t)nb);
    }
    hora__wbuf_reset(&set->eager);
    hora__wbuf_put(&set->eager, in->eager, in->eager_len);
    if (set->eager.failed) {
      return HORA_ERR_NO_MEMORY;
    }
    set->acc_frames = in->frames;
    set->acc_flags = in->flags;
    set->acc_late = in->late;
    return HORA_SUCCESS;
  }
  HORA_CHECK(eager_fold(set, in->vec + 3 * (size_t)nb, in->eager, in->eager_len, nb, peer));
  for (uint32_t i = 0; i < nb; i++) {
    set->acc[i] &= in->vec[i];
    set->acc[nb + i] |= in->vec[nb + i];
    set->acc[2 * nb + i] |= in->vec[2 * nb + i];
  }
  set->acc_frames = HORA_MAX(set->acc_frames, in->frames);
  set->acc_flags |= in->flags;
  hora__engine_late_fold(set, &in->late);
  return HORA_SUCCESS;
}

/* Ranks finish an operation at slightly different times, and the first to
 * submit the next one asks its partners before their callers have: a cycle
 * joined at once would end with nothing ready and need a second one (every
 * small operation across hosts took two). So a rank that has nothing for
 * the cycle (no cached request waiting, no submission queued, none of rank
 * 0's frames to apply, no join) waits a little for its own submission
 * first, whether its waits spin or sleep, and even while it still runs
 * the last cycle's operations: the cycle could schedule nothing of
 * this rank's without it anyway. */
#define JOIN_DEFER_NS (300 * 1000ull)

static bool defer_join(struct hora__set *set) {
  if (set->nwaiting > 0 || set->join_pending || set->frames_got > set->frames_applied) {
    return false;
  }
  struct hora__runtime *rt = set->e->rt;
  pthread_mutex_lock(&rt->mu);
  bool idle = !rt->queue_head;
  pthread_mutex_unlock(&rt->mu);
  if (!idle) {
    return false;
  }
  uint64_t now = hora__now_ns();
  if (set->join_defer_ns == UINT64_MAX) {
    set->join_defer_ns = now + JOIN_DEFER_NS;
  }
  return now < set->join_defer_ns;
}

/* Starts the next cycle when there is a reason to, and moves the one in
 * progress on as far as the partners' steps that have arrived allow. */
int hora__engine_cycle_advance(struct hora__set *set, bool *progressed) {
  const struct hora__cycle_partners *cp = &set->partners;
  if (set->cycle_phase == CYCLE_IDLE) {
    bool joined = set->join_pending, asked = false;
    for (int i = 0; i < INBOX_STEPS && !asked; i++) {
      asked = inbox_of(set, set->cycles + 1, i)->has;
    }
    bool ours = set->new_hits || set->evict_wanted || joined != set->our_joined_flag ||
                (set->ctl && set->frames_got > set->frames_told);
    if (!asked && !ours) {
      return HORA_SUCCESS;
    }
    if (!ours && defer_join(set)) {
      return HORA_SUCCESS;
    }
    set->join_defer_ns = UINT64_MAX;
    HORA_TRACE("cycle %llu: starting (%s; %llu new cached requests)",
               (unsigned long long)(set->cycles + 1), asked ? "asked" : "our own",
               (unsigned long long)set->new_hits);
    HORA_CHECK(contribute(set, joined));
    *progressed = true;
    set->cycle_round = 0;
    set->round_sent = false;
    set->cycle_phase = cp->folds_out ? CYCLE_RESULT : cp->fold >= 0 ? CYCLE_FOLD_IN : CYCLE_ROUNDS;
    if (cp->folds_out) {
      HORA_CHECK(send_step(set, cp->fold, STEP_FOLD_IN));
    } else if (cp->fold >= 0 && !inbox_of(set, set->cycles + 1, STEP_FOLD_IN)->has) {
      HORA_CHECK(send_step(set, cp->fold, STEP_ASK));
    }
  }
  for (;;) {
    bool got;
    switch (set->cycle_phase) {
      case CYCLE_FOLD_IN:
        HORA_CHECK(take_step(set, cp->fold, STEP_FOLD_IN, &got));
        if (!got) {
          return HORA_SUCCESS;
        }
        set->cycle_phase = CYCLE_ROUNDS;
        *progressed = true;
        break;
      case CYCLE_ROUNDS:
        if (set->cycle_round == cp->nrounds) {
          if (cp->fold >= 0) {
            HORA_CHECK(send_step(set, cp->fold, STEP_FOLD_OUT));
          }
          set->cycle_phase = CYCLE_DONE;
          *progressed = true;
          return HORA_SUCCESS;
        }
        if (!set->round_sent) {
          HORA_CHECK(send_step(set, cp->round[set->cycle_round], 1 + set->cycle_round));
          set->round_sent = true;
          *progressed = true;
        }
        HORA_CHECK(take_step(set, cp->round[set->cycle_round], 1 + set->cycle_round, &got));
        if (!got) {
          return HORA_SUCCESS;
        }
        set->cycle_round++;
        set->round_sent = false;
        *progressed = true;
        break;
      case CYCLE_RESULT:
        HORA_CHECK(take_step(set, cp->fold, STEP_FOLD_OUT, &got));
        if (got) {
          set->cycle_phase = CYCLE_DONE;
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
  /* Marked cached: its marks come all at once, saying nothing of who was late. */
  hora__timeline_begin_args(t->key, t->key_len, hora__negotiate_phase(r->kind),
                            "{\"cached\":true}");
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
static int unwait_stale(struct hora__set *set) {
  size_t n = 0;
  for (uint32_t s = 0; s < set->cache.capacity && set->nwaiting > n; s++) {
    struct hora_request *q = set->waiting[s];
    if (!q) {
      continue;
    }
    const struct hora__cache_entry *ce = hora__cache_entry(&set->cache, (int32_t)s);
    bool ours = ce && ce->key_len == q->key_len && memcmp(ce->key, q->key, q->key_len) == 0;
    bool stale = !ours || !hora__meta_equal(&ce->meta, &q->meta) ||
                 (set->others_joined && !hora__kind_stands_in(q->meta.kind));
    if (!stale) {
      n++;
      continue;
    }
    if (ours) {
      hora__engine_wish_evicted(set,
                                (int32_t)s); /* ranks that submit it later must not wait either */
    }
    HORA_CHECK(hora__engine_grow_reqs(set, 1));
    set->waiting[s] = NULL;
    set->nwaiting--;
    q->sent_slot = -1;
    HORA_CHECK(hora__engine_send_full(set, &q, 1));
  }
  return HORA_SUCCESS;
}

/* The end of a cycle, once rank 0's frames it counts have all arrived:
 * the same steps, in the same order, on every rank. */
int hora__engine_cycle_end(struct hora__set *set, bool *progressed) {
  if (set->cycle_phase != CYCLE_DONE || set->frames_got < set->acc_frames) {
    return HORA_SUCCESS;
  }
  uint32_t nb = set->cycle_nbytes;
  const uint8_t *ready = set->acc, *submitted = ready + nb, *evict = submitted + nb;
  const uint8_t *eager = evict + nb;
  struct hora__response *head = NULL, **tail = &head;
  struct hora__response *ehead = NULL, **etail = &ehead; /* eager: nothing left to fuse */
  uint64_t now = hora__now_ns();
  int rc = hora__engine_late_cycle_end(set, now);
  size_t eoff = 0;
  /* Our wait for what this cycle schedules (lateness.c). */
  uint64_t late_ops = 0, earliest = UINT64_MAX;
  bool late_valid = true;
  for (uint32_t s = 0; s < nb * 8 && rc == HORA_SUCCESS; s++) {
    bool is_eager = bit_set(eager, s);
    if (!bit_set(ready, s) || !bit_set(submitted, s)) {
      if (is_eager) {
        rc = hora__error(HORA_ERR_PROTOCOL, "cycle %llu carried eager data for cache slot %u, "
                         "which it did not schedule", (unsigned long long)(set->cycles + 1), s);
      }
      continue;
    }
    const struct hora__cache_entry *ce = hora__cache_entry(&set->cache, (int32_t)s);
    struct hora__response *r = ce ? hora__response_for(&ce->meta, ce->key, ce->key_len) : NULL;
    if (!r) {
      rc = ce ? HORA_ERR_NO_MEMORY
              : hora__error(HORA_ERR_PROTOCOL, "cycle %llu scheduled cache slot %u, which is "
                            "empty here: the ranks' caches are out of step",
                            (unsigned long long)(set->cycles + 1), s);
      break;
    }
    if (is_eager) {
      eoff = eager_align(eoff);
      int size = set->comm->size;
      size_t b = eager_kind(&ce->meta, size) ? eager_bytes(&ce->meta, size) : SIZE_MAX;
      bool fits = eoff <= set->eager.len && b <= set->eager.len - eoff;
      r->eager = fits ? hora__malloc(b + 1) : NULL;
      if (!r->eager) {
        rc = !fits
                 ? hora__error(HORA_ERR_PROTOCOL, "cycle %llu's eager data does not match its "
                               "slots (%zu bytes)", (unsigned long long)(set->cycles + 1),
                               set->eager.len)
                 : HORA_ERR_NO_MEMORY;
        hora__response_free(r);
        break;
      }
      if (b) {
        memcpy(r->eager, set->eager.data + eoff, b);
      }
      eoff += b;
      *etail = r;
      etail = &r->next;
    } else {
      *tail = r;
      tail = &r->next;
    }
    int32_t noted;
    struct hora__op_meta m = ce->meta;
    rc = hora__cache_note(&set->cache, r->tensors[0].key, r->tensors[0].key_len, &m, &noted);
    late_ops++;
    late_valid &= set->waiting[s] != NULL;
    if (set->waiting[s]) {
      earliest = HORA_MIN(earliest, set->waiting[s]->submit_ns);
      set->waiting[s] = NULL;
      set->nwaiting--;
    }
    timeline_cached(r, set->comm->size);
  }
  hora__engine_late_measured(set, late_ops, late_valid, earliest, now);
  if (rc == HORA_SUCCESS && eoff != set->eager.len) {
    rc = hora__error(HORA_ERR_PROTOCOL, "cycle %llu's eager data does not match its slots "
                     "(%zu bytes, %zu used)", (unsigned long long)(set->cycles + 1),
                     set->eager.len, eoff);
  }
  if (rc == HORA_SUCCESS) {
    rc = hora__responses_fuse(head, &tail, hora__params.FUSION_THRESHOLD);
  }
  *tail = ehead; /* queued even on failure, so they are freed */
  if (ehead) {
    tail = etail;
  }
  for (uint32_t s = 0; s < nb * 8 && rc == HORA_SUCCESS; s++) {
    if (bit_set(evict, s) && !(bit_set(ready, s) && bit_set(submitted, s))) {
      hora__cache_forget(&set->cache, (int32_t)s);
    }
  }
  while (rc == HORA_SUCCESS && set->frames_applied < set->acc_frames) {
    struct frame *f = set->frames_head;
    set->frames_head = f->next;
    if (!set->frames_head) {
      set->frames_tail = &set->frames_head;
    }
    if (hora__decode_responses(f->data, f->len, &tail, &set->cache) != HORA_SUCCESS) {
      rc = hora__error(HORA_ERR_PROTOCOL, "rank 0 sent a malformed response list: %s",
                       hora__error_message());
    }
    free(f);
    set->frames_applied++;
  }
  bool join_done = false;
  for (struct hora__response *r = head; r; r = r->next) {
    join_done |= r->kind == HORA_KIND_JOIN;
  }
  set->join_pending &= !join_done;
  *set->todo_tail = head; /* queued even on failure, so they are freed */
  if (head) {
    set->todo_tail = tail;
  }
  HORA_CHECK(rc);
  /* An ask that crossed our own start is spent with the cycle. */
  hora__cycle_take(set->inbox, set->cycles + 1, STEP_ASK);
  set->cycles++;
  HORA_TRACE("cycle %llu: done, frames %llu", (unsigned long long)set->cycles,
             (unsigned long long)set->acc_frames);
  atomic_fetch_add(&set->e->rt->stats.cycles, 1);
  /* The all-joined response ends every rank's join: from this cycle on no
   * one stands in, on every rank alike. */
  set->others_joined = (set->acc_flags & HORA_CYCLE_JOINED) != 0 && !join_done;
  set->cycle_phase = CYCLE_IDLE;
  *progressed = true;
  return unwait_stale(set);
}

bool hora__engine_set_idle(const struct hora__set *set) {
  if (set->cycle_phase != CYCLE_IDLE || set->nwaiting > 0 || set->todo || set->join_pending ||
      set->new_hits || set->evict_wanted || set->frames_got > set->frames_applied ||
      (set->ctl && hora__controller_has_ready(set->ctl))) {
    return false;
  }
  for (int i = 0; i < 2 * INBOX_STEPS; i++) {
    if (set->inbox[i].has) {
      return false;
    }
  }
  return true;
}
