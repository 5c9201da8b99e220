/* The registry's choices without a job: the point-to-point schedules'
 * partner sets (recursive.c), which the data connections are made for,
 * the selector's picks by the cost model (select.c, cost_model.c) and the
 * forms of HORA_COST_MODEL. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/params.h"
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

/* Both trees of the double binary tree span every size 1..64 (and some
 * larger): one root, parents and children agree, every position reaches
 * the root within ceil(log2 p) links; a position is inner in at most one
 * tree, but for one at most; every link is a partner, so
 * hora__comm_connect_partners made its connection. */
TEST(tree_links_two_spanning_trees_among_the_partners) {
  static const int extra[] = {100, 127, 128, 129, 1000, 1023, 1024, 1025};
  static int parts[3 * 32];
  for (int i = 0; i < 64 + (int)HORA_ARRAY_SIZE(extra); i++) {
    int size = i < 64 ? i + 1 : extra[i - 64], log2 = 0, both = 0;
    while ((1 << log2) < size) {
      log2++;
    }
    int *inner = calloc((size_t)size, sizeof(int));
    ASSERT(inner);
    for (int tree = 0; tree < 2; tree++) {
      int roots = 0;
      for (int pos = 0; pos < size; pos++) {
        int parent, child[2], gp, gc[2];
        hora__tree_links(size, pos, tree, &parent, child);
        int np = hora__coll_partners(pos, size, parts);
        roots += parent < 0;
        if (parent >= 0) {
          hora__tree_links(size, parent, tree, &gp, gc);
          if (gc[0] != pos && gc[1] != pos) {
            FAIL("size %d, tree %d: %d's parent %d does not name it a child", size, tree, pos,
                 parent);
          }
        }
        for (int j = 0; j < 2; j++) {
          if (child[j] < 0) {
            continue;
          }
          inner[pos] |= 1 << tree;
          hora__tree_links(size, child[j], tree, &gp, gc);
          if (gp != pos || child[j] == child[1 - j]) {
            FAIL("size %d, tree %d: %d's child %d names parent %d", size, tree, pos, child[j], gp);
          }
        }
        int links[3] = {parent, child[0], child[1]};
        for (int j = 0; j < 3; j++) {
          if (links[j] >= 0 && !has(parts, np, links[j])) {
            FAIL("size %d, tree %d: link %d - %d is not among the partners", size, tree, pos,
                 links[j]);
          }
        }
        int hops = 0;
        for (int up = pos; up >= 0 && hops <= log2 + 1; hops++) {
          hora__tree_links(size, up, tree, &up, gc);
        }
        if (hops - 1 > log2) {
          FAIL("size %d, tree %d: %d is more than %d links from the root", size, tree, pos, log2);
        }
      }
      if (roots != 1) {
        FAIL("size %d, tree %d: %d roots", size, tree, roots);
      }
    }
    for (int pos = 0; pos < size; pos++) {
      both += inner[pos] == 3;
    }
    free(inner);
    if (both > 1) {
      FAIL("size %d: %d positions inner in both trees", size, both);
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
 * pipelined chain from 2 MiB (its latency paid once per hop, it moves the
 * buffer once per link where scatter + allgather moves it about twice),
 * recursive halving for all but the largest reducescatters; the cheapest
 * usable one always, never one that cannot run. */
TEST(selector_picks_by_the_cost_model) {
  const struct hora__cost_model m = {.link = {60e-6, 1e-9, 0.25e-9},
                                     .local = {6e-6, 0.15e-9, 0.25e-9}};
  struct hora__layout s = {.size = 16, .hosts = 16, .chunk = 512 * 1024};
  const size_t MiB = 1024 * 1024;
  ASSERT_PICK(&s, &m, HORA_COLL_ALLREDUCE, 8, "rd");
  ASSERT_PICK(&s, &m, HORA_COLL_ALLREDUCE, 1 * MiB, "rabenseifner");
  ASSERT_PICK(&s, &m, HORA_COLL_ALLREDUCE, 64 * MiB, "ring");
  ASSERT_PICK(&s, &m, HORA_COLL_BROADCAST, 8, "binomial");
  ASSERT_PICK(&s, &m, HORA_COLL_BROADCAST, 256 * 1024, "binomial");
  ASSERT_PICK(&s, &m, HORA_COLL_BROADCAST, 2 * MiB, "ring");
  ASSERT_PICK(&s, &m, HORA_COLL_BROADCAST, 64 * MiB, "ring");
  ASSERT_PICK(&s, &m, HORA_COLL_REDUCESCATTER, 8, "halving");
  ASSERT_PICK(&s, &m, HORA_COLL_REDUCESCATTER, 2 * MiB, "halving");
  ASSERT_PICK(&s, &m, HORA_COLL_REDUCESCATTER, 64 * MiB, "ring");
  ASSERT_PICK(&s, &m, HORA_COLL_ALLGATHER, 8, "bruck");
  ASSERT_PICK(&s, &m, HORA_COLL_ALLGATHER, 16 * MiB, "ring");
  /* Rabenseifner priced 0.7% under the ring (the constants hora-info
   * --model --fit found on 16 fake hosts): the ring, which ran 12-14%
   * faster there; 6% under at 2 MiB: Rabenseifner. */
  const struct hora__cost_model fitted = {.link = {80e-6, 7.0e-9, 0.025e-9},
                                          .local = {6e-6, 0.1e-9, 0.25e-9}};
  ASSERT_PICK(&s, &fitted, HORA_COLL_ALLREDUCE, 16 * MiB, "ring");
  ASSERT_PICK(&s, &fitted, HORA_COLL_ALLREDUCE, 2 * MiB, "rabenseifner");
  const struct hora__algo *rab = hora__algo_find(HORA_COLL_ALLREDUCE, "rabenseifner");
  const struct hora__algo *ring = hora__algo_find(HORA_COLL_ALLREDUCE, "ring");
  ASSERT(rab->cost(&fitted, &s, 16 * MiB) < ring->cost(&fitted, &s, 16 * MiB));
  ASSERT(rab->lockstep && !ring->lockstep);
  for (int kind = 0; kind < HORA_ALGO_KINDS; kind++) {
    for (size_t bytes = 1; bytes <= 64 * MiB; bytes *= 2) {
      const struct hora__algo *a = hora__algo_pick(&s, &m, (enum hora__coll_kind)kind, bytes);
      if (!a || (int)a->kind != kind || !a->usable(&s)) {
        FAIL("%s of %zu bytes: picked %s", hora__algo_kind_name((enum hora__coll_kind)kind), bytes,
             a ? a->name : "nothing usable");
      }
      for (int i = 0; i < hora__nalgos; i++) {
        const struct hora__algo *b = hora__algos[i];
        if ((int)b->kind != kind || !b->usable(&s)) {
          continue;
        }
        double ca = a->cost(&m, &s, bytes), cb = b->cost(&m, &s, bytes);
        bool ring_kept = strcmp(a->name, "ring") == 0 && b->lockstep &&
                         ca <= cb * (1 + HORA_RING_MARGIN);
        if (cb < ca && !ring_kept) {
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
  /* Many ranks: the tree for medium sizes, where the ring takes 2(p-1)
   * steps and Rabenseifner folds 1000 ranks into 512 (whole buffers in
   * and out), or, with 8 ranks a host in blocks and no shared memory,
   * shares each host's link 8 ways in its long steps, where most of the
   * tree's links stay inside the hosts. */
  struct hora__layout many = {.size = 1000, .hosts = 1000, .chunk = 512 * 1024};
  ASSERT_PICK(&many, &m, HORA_COLL_ALLREDUCE, 8, "rd");
  ASSERT_PICK(&many, &m, HORA_COLL_ALLREDUCE, 16 * MiB, "tree");
  struct hora__layout blocks = {.size = 1024, .hosts = 128, .chunk = 512 * 1024};
  ASSERT_PICK(&blocks, &m, HORA_COLL_ALLREDUCE, 32 * 1024, "rabenseifner");
  ASSERT_PICK(&blocks, &m, HORA_COLL_ALLREDUCE, 2 * MiB, "tree");
  ASSERT_PICK(&blocks, &m, HORA_COLL_ALLREDUCE, 16 * MiB, "tree");
  /* The tree's chunk: HORA_CHUNK_SIZE without a model and for the largest
   * operations, else whole KiB, at least 4 KiB, growing with the size. */
  const struct hora__cost none = {0, 0, 0, 0};
  ASSERT(hora__tree_chunk(&none, 1000, 1 * MiB, 512 * 1024) == 512 * 1024);
  ASSERT(hora__tree_chunk(&m.link, 1000, (size_t)1 << 40, 512 * 1024) == 512 * 1024);
  ASSERT(hora__tree_chunk(&m.link, 1000, 8, 512 * 1024) == 4096);
  ASSERT(hora__tree_chunk(&m.link, 1000, 8, 256) == 256);
  for (size_t b = 1, was = 0; b <= 256 * MiB; b *= 2) {
    size_t c = hora__tree_chunk(&m.link, 1000, b, 512 * 1024);
    if (c < was || c % 1024 || c < 4096 || c > 512 * 1024) {
      FAIL("tree chunk for %zu bytes: %zu (for half as many: %zu)", b, c, was);
    }
    was = c;
  }
  /* The chain's chunk: HORA_CHUNK_SIZE for a chain of two (one transfer),
   * else whole KiB between 4 KiB and it, growing with the size. */
  struct hora__layout pair = {.size = 2, .hosts = 2, .chunk = 512 * 1024};
  ASSERT(hora__chain_chunk(&m, &pair, 1 * MiB) == 512 * 1024);
  for (size_t b = 1, was = 0; b <= 256 * MiB; b *= 2) {
    size_t c = hora__chain_chunk(&m, &s, b);
    if (c < was || c % 1024 || c < 4096 || c > 512 * 1024) {
      FAIL("chain chunk for %zu bytes: %zu (for half as many: %zu)", b, c, was);
    }
    was = c;
  }
  /* Pipelined in those chunks, a chain costs about one transfer of the
   * buffer from 1 MiB up, with 8 hosts of one rank or 4 of two (whose hops
   * within a host are cheap): on links of 1 Gbit/s (constants as hora-info
   * --calibrate measures them there) within 25% of n beta. */
  const struct hora__cost_model slow = {.link = {11.8e-6, 8.3e-9, 0.068e-9},
                                        .local = {6e-6, 0.1e-9, 0.25e-9}};
  const struct hora__algo *chain = hora__algo_find(HORA_COLL_BROADCAST, "ring");
  struct hora__layout eight = {.size = 8, .hosts = 8, .chunk = 512 * 1024};
  struct hora__layout four_by_two = {.size = 8, .hosts = 4, .hierarchical = true,
                                     .chunk = 512 * 1024};
  for (size_t b = 1 * MiB; b <= 64 * MiB; b *= 2) {
    double line = (double)b * slow.link.beta;
    double t8 = chain->cost(&slow, &eight, b), t42 = chain->cost(&slow, &four_by_two, b);
    if (!(t8 < 1.25 * line) || !(t42 < 1.25 * line) || !(t42 <= t8)) {
      FAIL("chain of %zu bytes: %.3g s on 8 x 1, %.3g s on 4 x 2, one transfer %.3g s", b, t8,
           t42, line);
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

/* Hosts of equal rank counts sharing a segment each: the hierarchical
 * broadcast and allgather win small operations (log2 of the hosts, not of
 * the ranks, steps over the links), and run nowhere else. Their step
 * across hosts is the flat pick over one member per host: the broadcast's
 * alone on the links, the allgather's L groups sharing them (as the
 * allreduce's), and the prediction adds the segment's part to it. */
TEST(selector_hierarchical_broadcast_and_allgather) {
  const struct hora__cost_model m = {.link = {60e-6, 1e-9, 0.25e-9},
                                     .local = {6e-6, 0.1e-9, 0.25e-9}};
  const size_t MiB = 1024 * 1024;
  struct hora__layout s = {.size = 8, .hosts = 4, .hierarchical = true, .chunk = 512 * 1024};
  ASSERT_PICK(&s, &m, HORA_COLL_BROADCAST, 8, "hierarchical");
  ASSERT_PICK(&s, &m, HORA_COLL_ALLGATHER, 8, "hierarchical");
  ASSERT_PICK(&s, &m, HORA_COLL_ALLGATHER, 1 * MiB, "hierarchical");
  const struct hora__algo *bc = hora__algo_find(HORA_COLL_BROADCAST, "hierarchical");
  const struct hora__algo *ag = hora__algo_find(HORA_COLL_ALLGATHER, "hierarchical");
  ASSERT(bc && ag && bc->broadcast && ag->allgather);
  struct hora__layout hosts = {.size = 4, .hosts = 4, .chunk = s.chunk};
  struct hora__cost_model shared = m;
  shared.link.beta *= 2;
  for (size_t bytes = 1; bytes <= 64 * MiB; bytes *= 8) {
    double cross;
    const struct hora__algo *a = hora__cross_pick(&s, &m, HORA_COLL_BROADCAST, bytes, &cross);
    ASSERT(a == hora__algo_pick(&hosts, &m, HORA_COLL_BROADCAST, bytes));
    ASSERT(cross == a->cost(&m, &hosts, bytes));
    ASSERT(bc->cost(&m, &s, bytes) == hora__cost_broadcast_shm(&m, &s, bytes) + cross);
    a = hora__cross_pick(&s, &m, HORA_COLL_ALLGATHER, bytes, &cross);
    ASSERT(a == hora__algo_pick(&hosts, &shared, HORA_COLL_ALLGATHER, bytes));
    ASSERT(cross == a->cost(&shared, &hosts, bytes));
    ASSERT(ag->cost(&m, &s, bytes) > cross);
  }
  /* One host, or hosts without shared memory (or of unequal rank counts,
   * which hora__comm_layout reports so): never picked, and not usable. */
  struct hora__layout one = {.size = 8, .hosts = 1, .shm_host = true, .chunk = s.chunk};
  struct hora__layout flat = {.size = 8, .hosts = 4, .chunk = s.chunk};
  ASSERT(!bc->usable(&one) && !ag->usable(&one) && !bc->usable(&flat) && !ag->usable(&flat));
  for (size_t bytes = 1; bytes <= 64 * MiB; bytes *= 8) {
    ASSERT(strcmp(pick(&flat, &m, HORA_COLL_BROADCAST, bytes), "hierarchical") != 0);
    ASSERT(strcmp(pick(&flat, &m, HORA_COLL_ALLGATHER, bytes), "hierarchical") != 0);
  }
}

/* ---- HORA_COST_MODEL's forms (cost_model.c) -------------------------------- */

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
    FAIL("cannot write %s", path);
  }
}

/* The call fails with HORA_ERR_INVALID_ARG and a message holding each of
 * the needles (NULL ends them). */
#define ASSERT_SETTING_FAILS(text, ...)                                              \
  do {                                                                               \
    struct hora__cost c_ = {1, 2, 3, 4};                                             \
    bool cal_ = false;                                                               \
    int rc_ = hora__cost_parse((text), &c_, &cal_);                                  \
    if (rc_ != HORA_ERR_INVALID_ARG) {                                               \
      FAIL("line %d: '%s' gave %s, expected invalid argument", __LINE__, (text),     \
           hora_strerror(rc_));                                                      \
    }                                                                                \
    const char *needles_[] = {__VA_ARGS__, NULL};                                    \
    for (int i_ = 0; needles_[i_]; i_++) {                                           \
      ASSERT_STR_CONTAINS(hora__error_message(), needles_[i_]);                      \
    }                                                                                \
    ASSERT(!cal_ && c_.alpha == 1 && c_.beta == 2 && c_.gamma == 3 && c_.op == 4);   \
  } while (0)

/* Numbers, `calibrate`, and `file:PATH` as hora-info --calibrate --save
 * writes it (read back to the same constants); a missing file, a malformed
 * one, an empty one and unknown words fail naming the path or the value. */
TEST(cost_model_setting_numbers_calibrate_and_file) {
  struct hora__cost c = {0};
  bool cal = true;
  ASSERT_EQ_INT(hora__cost_parse("60,8,0.25", &c, &cal), HORA_SUCCESS);
  ASSERT(!cal && fabs(c.alpha - 60e-6) < 1e-15 && fabs(c.beta - 8e-9) < 1e-20 &&
         fabs(c.gamma - 0.25e-9) < 1e-20 && c.op == 0);
  /* The fourth number: the runtime's cost per operation, in us. */
  ASSERT_EQ_INT(hora__cost_parse("60,8,0.25,150", &c, &cal), HORA_SUCCESS);
  ASSERT(fabs(c.op - 150e-6) < 1e-15 && fabs(c.alpha - 60e-6) < 1e-15);
  char four[96];
  hora__cost_format(&c, four, sizeof(four));
  ASSERT_STR_CONTAINS(four, "60,8,0.25,150");
  struct hora__cost before = c;
  ASSERT_EQ_INT(hora__cost_parse("calibrate", &c, &cal), HORA_SUCCESS);
  ASSERT(cal && memcmp(&c, &before, sizeof(c)) == 0);
  /* builtin: the constants given stay (the transport's, at start-up). */
  ASSERT_EQ_INT(hora__cost_parse("builtin", &c, &cal), HORA_SUCCESS);
  ASSERT(!cal && memcmp(&c, &before, sizeof(c)) == 0);
  /* Where no measurement can follow (hora-info --model --local), calibrate
   * is no value. */
  ASSERT_EQ_INT(hora__cost_parse("calibrate", &c, NULL), HORA_ERR_INVALID_ARG);

  char dir[] = "/tmp/hora-cost-XXXXXX";
  if (!mkdtemp(dir)) {
    FAIL("mkdtemp: %s", strerror(errno));
  }
  char good[128], bad[128], two[128], empty[128], missing[128], setting[160];
  snprintf(good, sizeof(good), "%s/good", dir);
  snprintf(bad, sizeof(bad), "%s/bad", dir);
  snprintf(two, sizeof(two), "%s/two", dir);
  snprintf(empty, sizeof(empty), "%s/empty", dir);
  snprintf(missing, sizeof(missing), "%s/missing", dir);
  const struct hora__cost saved = {3.25e-6, 0.1234e-9, 0.0677e-9, 0};
  ASSERT_EQ_INT(hora__cost_save(good, &saved, "a unit test"), HORA_SUCCESS);
  snprintf(setting, sizeof(setting), "file:%s", good);
  ASSERT_EQ_INT(hora__cost_parse(setting, &c, &cal), HORA_SUCCESS);
  char want[96], got[96];
  hora__cost_format(&saved, want, sizeof(want));
  hora__cost_format(&c, got, sizeof(got));
  if (cal || strcmp(want, got) != 0 || strcmp(got, "3.25,0.1234,0.0677") != 0) {
    FAIL("saved %s, read back %s%s", want, got, cal ? " (and calibrate)" : "");
  }
  /* Written by hand: comments, blank lines and spaces around the numbers. */
  write_text(two, "# measured by hand\n\n  5,1,0.5  \n");
  snprintf(setting, sizeof(setting), "file:%s", two);
  ASSERT_EQ_INT(hora__cost_parse(setting, &c, &cal), HORA_SUCCESS);
  ASSERT(fabs(c.alpha - 5e-6) < 1e-15 && fabs(c.beta - 1e-9) < 1e-20);

  snprintf(setting, sizeof(setting), "file:%s", missing);
  ASSERT_SETTING_FAILS(setting, missing, "cannot read", "hora-info --calibrate --save");
  write_text(bad, "# ok\n60,8\n");
  snprintf(setting, sizeof(setting), "file:%s", bad);
  ASSERT_SETTING_FAILS(setting, bad, "line 2 is '60,8'", "alpha_us,beta_ns_per_byte");
  write_text(bad, "60,8,0.25\n61,8,0.25\n");
  ASSERT_SETTING_FAILS(setting, bad, "line 2", "one line");
  write_text(bad, "60,-8,0.25\n");
  ASSERT_SETTING_FAILS(setting, bad, "line 1");
  write_text(empty, "# nothing\n\n");
  snprintf(setting, sizeof(setting), "file:%s", empty);
  ASSERT_SETTING_FAILS(setting, empty, "no constants");
  ASSERT_SETTING_FAILS("file:", "names no file");
  ASSERT_SETTING_FAILS("calibrat", "'calibrat'", "calibrate", "file:PATH");
  ASSERT_SETTING_FAILS("60,8", "'60,8'", "three or four numbers");
  ASSERT_SETTING_FAILS("60,8,0.25,1,2", "'60,8,0.25,1,2'");
  ASSERT_SETTING_FAILS("60,8,0.25,", "'60,8,0.25,'");
  ASSERT_SETTING_FAILS("60,8,0.25,x", "'60,8,0.25,x'");
  ASSERT_SETTING_FAILS("60,8,0.25,-1", "'60,8,0.25,-1'");
  ASSERT_SETTING_FAILS("60,8,0.25 x", "'60,8,0.25 x'");
  unlink(good);
  unlink(bad);
  unlink(two);
  unlink(empty);
  rmdir(dir);
}

/* Rank 0's setting alone is read: there `calibrate` asks for the
 * measurement and a file is read; elsewhere the built-in constants stand
 * (rank 0's model replaces them), so a file need exist on rank 0's host
 * only. */
TEST(cost_model_init_reads_rank_0s_setting_only) {
  const char *saved = hora__params.COST_MODEL;
  struct hora__proc proc = {.chunk_bytes = 512 * 1024};
  hora__comm c0 = {.proc = &proc, .rank = 0, .size = 2, .cross_size = 2};
  hora__comm c1 = c0;
  c1.rank = 1;
  struct hora__cost_model m;
  bool cal = false;
  hora__params.COST_MODEL = "calibrate";
  int rc0 = hora__cost_model_init(&c0, &m, &cal);
  bool cal0 = cal;
  int rc1 = hora__cost_model_init(&c1, &m, &cal);
  bool cal1 = cal;
  char src1[sizeof(m.source)];
  snprintf(src1, sizeof(src1), "%s", m.source);
  hora__params.COST_MODEL = "file:/nonexistent/hora-cost";
  int rc2 = hora__cost_model_init(&c1, &m, &cal);
  int rc3 = hora__cost_model_init(&c0, &m, &cal);
  char msg3[300];
  snprintf(msg3, sizeof(msg3), "%s", hora__error_message());
  hora__params.COST_MODEL = saved;
  ASSERT(rc0 == HORA_SUCCESS && cal0);
  ASSERT(rc1 == HORA_SUCCESS && !cal1);
  ASSERT_STR_CONTAINS(src1, "built-in (tcp)");
  ASSERT_EQ_INT(rc2, HORA_SUCCESS);
  ASSERT_EQ_INT(rc3, HORA_ERR_INVALID_ARG);
  ASSERT_STR_CONTAINS(msg3, "/nonexistent/hora-cost");
}
