/* The bootstrap's table of half-open connections under a flood: strangers
 * that have proved nothing make room for newcomers, a rank's handshake in
 * progress (its hello claims a connection this rank expects) never does. */
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include "../runner.h"
#include "comm/bootstrap/bootstrap.h"

static void add_stranger(struct plan *p, uint64_t since) {
  struct stranger *t = &p->half[p->nhalf++];
  memset(t, 0, sizeof(*t));
  t->fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  t->since = since;
  t->pfd = -1;
  snprintf(t->who, sizeof(t->who), "stranger %llu", (unsigned long long)since);
}

TEST(strangers_flood_never_pushes_out_a_ranks_handshake) {
  enum { MAX = 8, RANKS = 4 };
  struct stranger half[MAX];
  uint8_t want[RANKS * HORA_CONN_SLOTS] = {0};
  struct plan p;
  memset(&p, 0, sizeof(p));
  p.half = half;
  p.half_max = MAX;
  p.want_in = want;
  want[hora__boot_slot_of(1, HORA_CONN_DATA)] = 1;
  /* The oldest entry is rank 1's data connection: its hello has come, its
   * proof is on the way. The rest are strangers. */
  add_stranger(&p, 1);
  half[0].hs.claimed = true;
  half[0].hs.peer = 1;
  half[0].hs.kind = HORA_CONN_DATA;
  for (int i = 1; i < MAX; i++) {
    add_stranger(&p, 1 + (uint64_t)i);
  }
  /* A flood: each newcomer finds the table full. */
  for (int k = 0; k < 100; k++) {
    hora__boot_drop_oldest(&p, "dropped as the oldest");
    ASSERT_EQ_INT(p.nhalf, MAX - 1);
    add_stranger(&p, 100 + (uint64_t)k);
  }
  int kept = 0;
  for (int i = 0; i < p.nhalf; i++) {
    kept += half[i].hs.claimed && half[i].hs.peer == 1;
  }
  ASSERT_EQ_INT(p.refused, 100);
  while (p.nhalf > 0) {
    hora__boot_refuse(&p, p.nhalf - 1, "the end");
  }
  ASSERT(kept == 1);
}
