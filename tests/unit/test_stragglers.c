/* The straggler notes and their report (runtime/negotiate/stragglers.c). */
#include <string.h>

#include "runtime/negotiate/stragglers.h"
#include "../runner.h"

#define MS 1000000ull
#define S (1000 * MS)

static const char *const hosts8[8] = {"h0", "h0", "h1", "h1", "h2", "h2", "h3", "h3"};

/* One rank last nearly always: named, with its share and the wait per
 * step (steps marked) or in the window (none marked). */
TEST(stragglers_name_the_late_rank) {
  struct hora__stragglers s;
  const int names[8] = {10, 11, 12, 13, 14, 15, 16, 17};
  ASSERT(hora__stragglers_init(&s, 8, names, hosts8, 0) == HORA_SUCCESS);
  ASSERT(s.nhosts == 4 && s.host[5] == 2 && strcmp(s.host_name[2], "h2") == 0);
  for (int i = 0; i < 87; i++) {
    hora__stragglers_note(&s, 5, 1, 20 * MS);
  }
  for (int i = 0; i < 13; i++) {
    hora__stragglers_note(&s, i % 8 == 5 ? 0 : i % 8, 1, MS / 10);
  }
  char line[512];
  /* 100 steps of 100 ms: 1.74 s of 10 s waited for rank 5 (index 5, job rank 15). */
  ASSERT(hora__stragglers_report(&s, 10 * S, 100, 10 * S, 0.05, line, sizeof(line)));
  ASSERT(strstr(line, "rank 15 (host h2) was last in 87% of the last 100 operations") != NULL);
  ASSERT(strstr(line, "17 ms per step for it (17% of step time)") != NULL);
  ASSERT(s.last_ops[5] == 87 && s.ops == 100);
  /* The metrics' view: the two waited for longest, longest first. */
  struct hora__straggler_row rows[2];
  uint64_t ops, waited;
  ASSERT(hora__stragglers_top(&s, rows, 2, &ops, &waited) == 2);
  ASSERT(rows[0].rank == 15 && rows[0].ops == 87 && strcmp(rows[0].host, "h2") == 0);
  ASSERT(rows[1].rank == 10 && rows[1].waited_ns == 3 * (MS / 10) && rows[1].ops == 3 && ops == 100);
  ASSERT(waited == 87 * 20 * MS + 13 * (MS / 10));
  /* A new window: nothing noted, nothing said. */
  ASSERT(!hora__stragglers_report(&s, 20 * S, 100, 10 * S, 0.05, line, sizeof(line)));
  for (int i = 0; i < 10; i++) {
    hora__stragglers_note(&s, 2, 1, 200 * MS);
  }
  ASSERT(hora__stragglers_report(&s, 40 * S, 100, 10 * S, 0.05, line, sizeof(line)));
  ASSERT(strstr(line, "rank 12 (host h1) was last in 100% of the last 10 operations; the others "
                      "waited 2.0 s for it in 20 s (10% of the time)") != NULL);
  hora__stragglers_free(&s);
}

/* Lateness spread over a host's ranks names the host; an even spread, or
 * waits under the share, name nobody. */
TEST(stragglers_name_a_slow_host_and_not_an_even_run) {
  struct hora__stragglers s;
  ASSERT(hora__stragglers_init(&s, 8, NULL, hosts8, 0) == HORA_SUCCESS);
  for (int i = 0; i < 100; i++) {
    hora__stragglers_note(&s, 6 + i % 2, 1, 10 * MS);
  }
  char line[512];
  ASSERT(hora__stragglers_report(&s, 10 * S, 0, 0, 0.05, line, sizeof(line)));
  ASSERT(strstr(line, "host h3 (ranks 6-7) was last in 100% of the last 100 operations") != NULL);
  for (int i = 0; i < 800; i++) {
    hora__stragglers_note(&s, i % 8, 1, MS / 2);
  }
  /* 0.4 s waited in all over 10 s, 0.05 s for each rank: under 5%. */
  ASSERT(!hora__stragglers_report(&s, 20 * S, 0, 0, 0.05, line, sizeof(line)));
  hora__stragglers_free(&s);
  /* One rank per host: the rank is named, with its host. */
  const char *const own[3] = {"a", "b", "c"};
  ASSERT(hora__stragglers_init(&s, 3, NULL, own, 0) == HORA_SUCCESS);
  hora__stragglers_note(&s, 1, 4, S);
  hora__stragglers_note(&s, -1, 4, S); /* out of range: ignored */
  hora__stragglers_note(&s, 3, 4, S);
  ASSERT(hora__stragglers_report(&s, 10 * S, 0, 0, 0.05, line, sizeof(line)));
  ASSERT(strstr(line, "rank 1 (host b) was last in 100% of the last 4 operations") != NULL);
  hora__stragglers_free(&s);
}
