/* A partner's cycle step as it arrives (cycle.c): kept when it comes from
 * the right partner, for the next two cycles, once, within the cache's
 * size; refused as a protocol error otherwise. */
#include <stdlib.h>

#include "runtime/negotiate/cycle.h"
#include "../runner.h"

static size_t encode(struct hora__wbuf *w, uint64_t cycle, uint8_t step, uint32_t nbytes,
                     const uint8_t *vec) {
  struct hora__cycle_msg m = {.cycle = cycle, .step = step, .frames = 4, .nbytes = nbytes,
                              .vec = vec};
  hora__encode_cycle(w, &m);
  return w->len;
}

TEST(cycle_steps_are_checked_on_arrival) {
  struct hora__cycle_partners cp; /* rank 0 of 4: rounds with 1 and 2 */
  hora__cycle_partners(0, 4, &cp);
  struct hora__cycle_inbox *inbox = calloc(2 * HORA_INBOX_STEPS, sizeof(*inbox));
  ASSERT(inbox);
  struct hora__wbuf w = {0};
  const uint8_t vec[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  int rc[8];
  char msg[8][160];
  size_t n = encode(&w, 6, 1, 2, vec);
  rc[0] = hora__cycle_accept(inbox, &cp, 5, 2, 1, w.data, n); /* fine */
  rc[1] = hora__cycle_accept(inbox, &cp, 5, 2, 1, w.data, n); /* twice */
  snprintf(msg[1], sizeof(msg[1]), "%s", hora__error_message());
  rc[2] = hora__cycle_accept(inbox, &cp, 5, 2, 3, w.data, n); /* not the partner of step 1 */
  snprintf(msg[2], sizeof(msg[2]), "%s", hora__error_message());
  n = encode(&w, 8, 2, 2, vec);
  rc[3] = hora__cycle_accept(inbox, &cp, 5, 2, 2, w.data, n); /* three cycles ahead */
  n = encode(&w, 7, 2, 2, vec);
  rc[4] = hora__cycle_accept(inbox, &cp, 5, 1, 2, w.data, n); /* more bits than the cache */
  snprintf(msg[4], sizeof(msg[4]), "%s", hora__error_message());
  rc[5] = hora__cycle_accept(inbox, &cp, 5, 2, 2, w.data, n - 1); /* truncated */
  rc[6] = hora__cycle_accept(inbox, &cp, 5, 2, 2, w.data, n); /* fine */
  struct hora__cycle_inbox *in = hora__cycle_inbox_of(inbox, 6, 1);
  int kept = in->has && in->nbytes == 2 && in->frames == 4 && memcmp(in->vec, vec, 8) == 0;
  hora__cycle_inbox_free(inbox);
  hora__wbuf_free(&w);
  ASSERT_EQ_INT(rc[0], HORA_SUCCESS);
  ASSERT(kept);
  ASSERT_EQ_INT(rc[1], HORA_ERR_PROTOCOL);
  ASSERT_STR_CONTAINS(msg[1], "rank 1 sent step 1 of cycle 6 twice");
  ASSERT_EQ_INT(rc[2], HORA_ERR_PROTOCOL);
  ASSERT_STR_CONTAINS(msg[2], "does not expect from it");
  ASSERT_EQ_INT(rc[3], HORA_ERR_PROTOCOL);
  ASSERT_EQ_INT(rc[4], HORA_ERR_PROTOCOL);
  ASSERT_STR_CONTAINS(msg[4], "this rank's cache has 1");
  ASSERT_EQ_INT(rc[5], HORA_ERR_PROTOCOL);
  ASSERT_EQ_INT(rc[6], HORA_SUCCESS);
}

/* A step taken by the cycle in progress and then sent again must not wait
 * in the inbox to be used as a later cycle's (its slot is shared by
 * parity with cycle + 2). */
TEST(cycle_step_sent_again_after_it_was_taken_is_refused) {
  struct hora__cycle_partners cp; /* rank 1 of 4: rounds with 0 and 3 */
  hora__cycle_partners(1, 4, &cp);
  struct hora__cycle_inbox *inbox = calloc(2 * HORA_INBOX_STEPS, sizeof(*inbox));
  ASSERT(inbox);
  struct hora__wbuf w = {0};
  const uint8_t vec[4] = {1, 2, 3, 4};
  size_t n = encode(&w, 1, 1, 1, vec);
  int rc0 = hora__cycle_accept(inbox, &cp, 0, 1, 0, w.data, n);
  struct hora__cycle_inbox *in = hora__cycle_take(inbox, 1, 1);
  int taken = in != NULL;
  int rc1 = hora__cycle_accept(inbox, &cp, 0, 1, 0, w.data, n); /* the same step again */
  char msg[160];
  snprintf(msg, sizeof(msg), "%s", hora__error_message());
  int held = hora__cycle_inbox_of(inbox, 3, 1)->has;
  n = encode(&w, 3, 1, 1, vec); /* the real step of cycle 3 comes later */
  int rc2 = hora__cycle_accept(inbox, &cp, 2, 1, 0, w.data, n);
  hora__cycle_inbox_free(inbox);
  hora__wbuf_free(&w);
  ASSERT_EQ_INT(rc0, HORA_SUCCESS);
  ASSERT(taken);
  ASSERT_EQ_INT(rc1, HORA_ERR_PROTOCOL);
  ASSERT_STR_CONTAINS(msg, "rank 0 sent step 1 of cycle 1 twice");
  ASSERT(!held);
  ASSERT_EQ_INT(rc2, HORA_SUCCESS);
}

/* A rank's ask travels by socket when the partner's mailbox is full, and
 * its result of the same cycle may then come by mailbox first: the
 * folded-out rank finishes the cycle before the ask arrives. The ask is
 * spent (the rank took part), not a broken protocol; any other step of a
 * finished cycle, or an ask from elsewhere, still is. */
TEST(cycle_ask_overtaken_by_its_result_is_dropped) {
  struct hora__cycle_partners cp; /* rank 4 of 6: folds out into rank 0 */
  hora__cycle_partners(4, 6, &cp);
  struct hora__cycle_inbox *inbox = calloc(2 * HORA_INBOX_STEPS, sizeof(*inbox));
  ASSERT(inbox);
  struct hora__wbuf w = {0};
  int rc[4];
  size_t n = encode(&w, 5, HORA_STEP_ASK, 0, NULL);
  rc[0] = hora__cycle_accept(inbox, &cp, 5, 1, 0, w.data, n); /* cycle 5 done here */
  int held = hora__cycle_inbox_of(inbox, 5, HORA_STEP_ASK)->has;
  rc[1] = hora__cycle_accept(inbox, &cp, 6, 1, 0, w.data, n); /* two cycles on */
  rc[2] = hora__cycle_accept(inbox, &cp, 5, 1, 1, w.data, n); /* not its fold partner */
  const uint8_t vec[HORA_CYCLE_VECTORS] = {1, 2, 3, 4}; /* one byte of bits per vector */
  n = encode(&w, 5, HORA_STEP_FOLD_OUT, 1, vec);
  rc[3] = hora__cycle_accept(inbox, &cp, 5, 1, 0, w.data, n); /* a result of a finished cycle */
  hora__cycle_inbox_free(inbox);
  hora__wbuf_free(&w);
  ASSERT_EQ_INT(rc[0], HORA_SUCCESS);
  ASSERT(!held);
  ASSERT_EQ_INT(rc[1], HORA_SUCCESS);
  ASSERT_EQ_INT(rc[2], HORA_ERR_PROTOCOL);
  ASSERT_EQ_INT(rc[3], HORA_ERR_PROTOCOL);
}
