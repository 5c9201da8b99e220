/* A partner's step of a negotiation cycle: see cycle.h. */
#include "runtime/negotiate/cycle.h"

#include <stdlib.h>

struct hora__cycle_inbox *hora__cycle_inbox_of(struct hora__cycle_inbox *inbox, uint64_t cycle,
                                               int step) {
  return &inbox[(cycle & 1) * HORA_INBOX_STEPS + step];
}

struct hora__cycle_inbox *hora__cycle_take(struct hora__cycle_inbox *inbox, uint64_t cycle,
                                           int step) {
  struct hora__cycle_inbox *in = hora__cycle_inbox_of(inbox, cycle, step);
  if (!in->has || in->cycle != cycle) {
    return NULL;
  }
  in->has = false;
  in->taken = cycle;
  return in;
}

void hora__cycle_inbox_free(struct hora__cycle_inbox *inbox) {
  if (inbox) {
    for (int i = 0; i < 2 * HORA_INBOX_STEPS; i++) {
      free(inbox[i].vec);
      free(inbox[i].eager);
    }
  }
  free(inbox);
}

int hora__cycle_accept(struct hora__cycle_inbox *inbox, const struct hora__cycle_partners *cp,
                       uint64_t cycles, uint32_t max_nbytes, int from, const uint8_t *p,
                       size_t n) {
  struct hora__cycle_msg m;
  if (hora__decode_cycle(p, n, &m) != HORA_SUCCESS) {
    return hora__error(HORA_ERR_PROTOCOL, "rank %d sent a malformed cycle message", from);
  }
  bool from_fold =
      from == cp->fold && (cp->folds_out ? m.step == HORA_STEP_FOLD_OUT || m.step == HORA_STEP_ASK
                                         : m.step == HORA_STEP_FOLD_IN);
  bool from_round = m.step >= 1 && m.step <= cp->nrounds && cp->round[m.step - 1] == from;
  /* An ask goes by socket where the partner sleeps in poll(), and the
   * cycle's result may then overtake it through the mailbox: an ask for a
   * cycle this rank has finished is spent, not an error. */
  bool spent_ask = from_fold && m.step == HORA_STEP_ASK && m.cycle >= 1 && m.cycle <= cycles;
  if ((!from_fold && !from_round) || (!spent_ask && m.cycle <= cycles) || m.cycle > cycles + 2) {
    return hora__error(HORA_ERR_PROTOCOL, "rank %d sent step %u of cycle %llu, which this rank "
                       "(at cycle %llu) does not expect from it", from, m.step,
                       (unsigned long long)m.cycle, (unsigned long long)cycles);
  }
  if (m.nbytes > max_nbytes || (m.step == HORA_STEP_ASK && (m.nbytes != 0 || m.eager_len != 0))) {
    return hora__error(HORA_ERR_PROTOCOL, "rank %d sent %u bytes of cache bits in step %u of "
                       "cycle %llu; this rank's cache has %u", from, m.nbytes, m.step,
                       (unsigned long long)m.cycle, max_nbytes);
  }
  if (spent_ask) {
    return HORA_SUCCESS;
  }
  struct hora__cycle_inbox *in = hora__cycle_inbox_of(inbox, m.cycle, m.step);
  if (in->has || m.cycle <= in->taken) {
    return hora__error(HORA_ERR_PROTOCOL, "rank %d sent step %u of cycle %llu twice", from,
                       m.step, (unsigned long long)m.cycle);
  }
  size_t need = HORA_CYCLE_VECTORS * (size_t)m.nbytes;
  if (need > in->cap) {
    uint8_t *v = hora__realloc(in->vec, need);
    if (!v) {
      return HORA_ERR_NO_MEMORY;
    }
    in->vec = v;
    in->cap = need;
  }
  if (need) {
    memcpy(in->vec, m.vec, need);
  }
  if (m.eager_len > in->eager_cap) {
    uint8_t *v = hora__realloc(in->eager, m.eager_len);
    if (!v) {
      return HORA_ERR_NO_MEMORY;
    }
    in->eager = v;
    in->eager_cap = m.eager_len;
  }
  if (m.eager_len) {
    memcpy(in->eager, m.eager, m.eager_len);
  }
  in->eager_len = m.eager_len;
  in->late = m.late;
  in->has = true;
  in->cycle = m.cycle;
  in->flags = m.flags;
  in->frames = m.frames;
  in->nbytes = m.nbytes;
  return HORA_SUCCESS;
}

void hora__cycle_partners(int rank, int size, struct hora__cycle_partners *p) {
  int p2 = 1;
  while (p2 * 2 <= size) {
    p2 *= 2;
  }
  p->fold = rank >= p2 ? rank - p2 : rank + p2 < size ? rank + p2 : -1;
  p->folds_out = rank >= p2;
  p->nrounds = 0;
  for (int d = 1; !p->folds_out && d < p2; d *= 2) {
    p->round[p->nrounds++] = rank ^ d;
  }
}
