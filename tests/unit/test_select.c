/* The registry's choices without a job: the point-to-point schedules'
 * partner sets (recursive.c), which the data connections are made for,
 * and the selector's picks by the cost model (select.c, cost_model.c). */
#include "comm/coll/collectives.h"
#include "../runner.h"

static bool has(const int *set, int n, int v) {
  for (int i = 0; i < n; i++) {
    if (set[i] == v) {
      return true;
    }
  }
  return false;
}

/* Every size 1..64 and every position: the set is symmetric (a connection
 * is made by both ends), holds no self and no duplicates, and names every
 * partner the schedules talk to: r ^ 2^k below the largest power of two
 * (recursive doubling, Rabenseifner, recursive halving), r +- 2^k (Bruck,
 * the binomial tree and the scatter + allgather from any root) and the
 * fold partner r +- p2. */
TEST(coll_partners_symmetric_and_cover_every_schedule) {
  static int parts[64][3 * 32];
  static int np[64];
  for (int size = 1; size <= 64; size++) {
    int p2 = 1, log2 = 0;
    while (p2 * 2 <= size) {
      p2 *= 2;
    }
    while ((1 << log2) < size) {
      log2++;
    }
    for (int pos = 0; pos < size; pos++) {
      np[pos] = hora__coll_partners(pos, size, parts[pos]);
      if (np[pos] < 0 || np[pos] > 3 * log2 + 1) {
        FAIL("size %d, pos %d: %d partners, at most %d expected", size, pos, np[pos], 3 * log2 + 1);
      }
      for (int i = 0; i < np[pos]; i++) {
        int q = parts[pos][i];
        if (q < 0 || q >= size || q == pos || has(parts[pos], i, q)) {
          FAIL("size %d, pos %d: partner %d (entry %d) is out of range, itself or repeated", size,
               pos, q, i);
        }
      }
      for (int d = 1; d < size; d *= 2) {
        int want[3] = {(pos + d) % size, (pos - d + size) % size, pos ^ d};
        for (int w = 0; w < 3; w++) {
          if (w == 2 && (pos >= p2 || d >= p2)) {
            continue;
          }
          if (want[w] != pos && !has(parts[pos], np[pos], want[w])) {
            FAIL("size %d, pos %d: partner %d (distance %d) missing", size, pos, want[w], d);
          }
        }
      }
      int fold = pos >= p2 ? pos - p2 : pos + p2 < size ? pos + p2 : -1;
      if (fold >= 0 && !has(parts[pos], np[pos], fold)) {
        FAIL("size %d, pos %d: fold partner %d missing", size, pos, fold);
      }
    }
    for (int pos = 0; pos < size; pos++) {
      for (int i = 0; i < np[pos]; i++) {
        int q = parts[pos][i];
        if (!has(parts[q], np[q], pos)) {
          FAIL("size %d: %d names %d as a partner but not the other way", size, pos, q);
        }
      }
    }
  }
}

static const char *pick(const struct hora__layout *s, const struct hora__cost_model *m,
                        enum hora__coll_kind kind, size_t bytes) {
  const struct hora__algo *a = hora__algo_pick(s, m, kind, bytes);
  return a ? a->name : "(none)";
}

#define ASSERT_PICK(s, m, kind, bytes, want)                                         \
  do {                                                                               \
    const char *got_ = pick((s), (m), (kind), (bytes));                              \
    if (strcmp(got_, (want)) != 0) {                                                 \
      FAIL("line %d: %s of %zu bytes at %d ranks: picked %s, expected %s", __LINE__, \
           hora__algo_kind_name(kind), (size_t)(bytes), (s)->size, got_, (want));    \
    }                                                                                \
  } while (0)

/* The built-in tcp constants at 16 hosts of one rank: recursive doubling
 * for small allreduces, the ring for the largest (Rabenseifner between),
 * the binomial tree and Bruck for small broadcasts and allgathers, the
 * scatter + allgather for mid-sized broadcasts, recursive halving for all
 * but the largest reducescatters; the cheapest usable one always, never
 * one that cannot run. */
TEST(selector_picks_by_the_cost_model) {
  const struct hora__cost_model m = {.link = {60e-6, 1e-9, 0.25e-9},
                                     .local = {6e-6, 0.15e-9, 0.25e-9}};
  struct hora__layout s = {.size = 16, .hosts = 16, .chunk = 512 * 1024};
  const size_t MiB = 1024 * 1024;
  ASSERT_PICK(&s, &m, HORA_COLL_ALLREDUCE, 8, "rd");
  ASSERT_PICK(&s, &m, HORA_COLL_ALLREDUCE, 1 * MiB, "rabenseifner");
  ASSERT_PICK(&s, &m, HORA_COLL_ALLREDUCE, 64 * MiB, "ring");
  ASSERT_PICK(&s, &m, HORA_COLL_BROADCAST, 8, "binomial");
  ASSERT_PICK(&s, &m, HORA_COLL_BROADCAST, 2 * MiB, "scatter_allgather");
  ASSERT_PICK(&s, &m, HORA_COLL_BROADCAST, 64 * MiB, "ring");
  ASSERT_PICK(&s, &m, HORA_COLL_REDUCESCATTER, 8, "halving");
  ASSERT_PICK(&s, &m, HORA_COLL_REDUCESCATTER, 2 * MiB, "halving");
  ASSERT_PICK(&s, &m, HORA_COLL_REDUCESCATTER, 64 * MiB, "ring");
  ASSERT_PICK(&s, &m, HORA_COLL_ALLGATHER, 8, "bruck");
  ASSERT_PICK(&s, &m, HORA_COLL_ALLGATHER, 16 * MiB, "ring");
  for (int kind = 0; kind < HORA_ALGO_KINDS; kind++) {
    for (size_t bytes = 1; bytes <= 64 * MiB; bytes *= 2) {
      const struct hora__algo *a = hora__algo_pick(&s, &m, (enum hora__coll_kind)kind, bytes);
      if (!a || (int)a->kind != kind || !a->usable(&s)) {
        FAIL("%s of %zu bytes: picked %s", hora__algo_kind_name((enum hora__coll_kind)kind), bytes,
             a ? a->name : "nothing usable");
      }
      for (int i = 0; i < hora__nalgos; i++) {
        const struct hora__algo *b = hora__algos[i];
        if ((int)b->kind == kind && b->usable(&s) &&
            b->cost(&m, &s, bytes) < a->cost(&m, &s, bytes)) {
          FAIL("%s of %zu bytes: picked %s, but %s costs less", a->name, bytes, a->name, b->name);
        }
      }
      if (kind == HORA_COLL_ALLREDUCE && bytes <= 64 * 1024 && strcmp(a->name, "ring") == 0) {
        FAIL("allreduce of %zu bytes at 16 ranks: the ring", bytes);
      }
      if (kind == HORA_COLL_ALLREDUCE && bytes >= 1 * MiB && strcmp(a->name, "rd") == 0) {
        FAIL("allreduce of %zu bytes at 16 ranks: recursive doubling", bytes);
      }
    }
  }
  /* One host sharing a segment: shared memory, which is unusable above. */
  struct hora__layout one = {.size = 8, .hosts = 1, .shm_host = true, .chunk = 512 * 1024};
  ASSERT_PICK(&one, &m, HORA_COLL_ALLREDUCE, 8, "shm");
  ASSERT_PICK(&one, &m, HORA_COLL_BROADCAST, 8, "shm");
  ASSERT_PICK(&one, &m, HORA_COLL_REDUCESCATTER, 8, "allreduce");
  /* The forced one wins whatever the model says; the pick otherwise. */
  struct hora__proc proc = {.chunk_bytes = 512 * 1024};
  hora__comm c = {.proc = &proc, .size = 16, .cross_size = 16, .model = m};
  ASSERT(strcmp(hora__algo_select(&c, HORA_COLL_ALLREDUCE, 8)->name, "rd") == 0);
  c.forced[HORA_COLL_ALLREDUCE] = hora__algo_find(HORA_COLL_ALLREDUCE, "ring");
  ASSERT(strcmp(hora__algo_select(&c, HORA_COLL_ALLREDUCE, 8)->name, "ring") == 0);
  /* Every registered algorithm is found by its kind and name, and only so. */
  for (int i = 0; i < hora__nalgos; i++) {
    ASSERT(hora__algo_find(hora__algos[i]->kind, hora__algos[i]->name) == hora__algos[i]);
  }
  ASSERT(hora__algo_find(HORA_COLL_ALLREDUCE, "nope") == NULL);
  ASSERT(hora__algo_find(HORA_COLL_ALLREDUCE, "") == NULL);
  ASSERT(hora__algo_find(HORA_COLL_ALLREDUCE, "bruck") == NULL);
  ASSERT(hora__algo_find(HORA_COLL_BROADCAST, "rd") == NULL);
  ASSERT(hora__algo_find(HORA_COLL_ALLGATHER, "binomial") == NULL);
  ASSERT(hora__algo_find(HORA_COLL_REDUCESCATTER, "rabenseifner") == NULL);
}
