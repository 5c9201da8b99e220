/* A partner's step of a negotiation cycle (engine/cycle_steps.c), as it
 * arrives: checked against where this rank stands, then kept until the
 * cycle gets to it. Plain data and no sockets, so that it is unit-tested
 * and fuzzed alone. */
#ifndef HORA_CYCLE_H
#define HORA_CYCLE_H

#include "runtime/negotiate/message.h"

/* The partners of the cycles' allreduce of cache bit vectors (cycle.c),
 * by recursive doubling: with p2 the largest power of two <= size, rank
 * r >= p2 folds into r - p2 and takes the result back from it; the ranks
 * below p2 (taking in their fold first) swap with r ^ 1, r ^ 2, ... */
struct hora__cycle_partners {
  int fold;       /* -1, or the rank this one folds into or takes in */
  bool folds_out; /* this rank is beyond p2: it talks to fold only */
  int nrounds;
  int round[31];
};
void hora__cycle_partners(int rank, int size, struct hora__cycle_partners *p);

/* Cycle steps on the wire: 0 a fold in, 1 + i round i, FOLD_OUT the result,
 * ASK a rank's request that its fold partner take part (it sends first). */
#define HORA_STEP_FOLD_IN 0
#define HORA_STEP_FOLD_OUT 32
#define HORA_STEP_ASK 33
#define HORA_INBOX_STEPS 34

struct hora__cycle_inbox {
  bool has;
  uint64_t cycle; /* of the step held (has) */
  uint64_t taken; /* the last cycle whose step was taken from here (0: none) */
  uint8_t flags;
  uint64_t frames;
  uint32_t nbytes;
  uint8_t *vec; /* HORA_CYCLE_VECTORS x nbytes */
  struct hora__cycle_late late;
  size_t cap;
  uint8_t *eager; /* eager_len bytes: the eager slots' data */
  size_t eager_len, eager_cap;
};

/* inbox has 2 * HORA_INBOX_STEPS entries: at most the next two cycles can
 * have steps in flight, so it is indexed by the cycle's parity. */
struct hora__cycle_inbox *hora__cycle_inbox_of(struct hora__cycle_inbox *inbox, uint64_t cycle,
                                               int step);
void hora__cycle_inbox_free(struct hora__cycle_inbox *inbox);
/* Takes the step of `cycle` from the inbox: NULL if it has not arrived.
 * The entry stays valid until the next accept; a step of that cycle sent
 * again later is refused. */
struct hora__cycle_inbox *hora__cycle_take(struct hora__cycle_inbox *inbox, uint64_t cycle,
                                           int step);

/* Decodes a CYCLE message from rank `from` and keeps it in the inbox: it
 * must come from the partner of its step (cp), for one of the next two
 * cycles after `cycles` (those applied here), once per step, with at most
 * max_nbytes bytes per vector (this rank's cache bitmap). Anything else is
 * HORA_ERR_PROTOCOL, with a message naming the rank and what was wrong. */
int hora__cycle_accept(struct hora__cycle_inbox *inbox, const struct hora__cycle_partners *cp,
                       uint64_t cycles, uint32_t max_nbytes, int from, const uint8_t *p,
                       size_t n);

#endif
