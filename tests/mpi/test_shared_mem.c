/* Intra-host allreduce paths.
 *
 * hora_mem_alloc blocks: the calls' errors, and allreduces whose buffers lie
 * in blocks on every rank, on some ranks, carved many to a block, one block
 * per tensor (more blocks than a rank keeps mapped), and in blocks freed and
 * allocated again while the peers hold mappings of the old ones. With the
 * argument "direct" (a testlist line where every rank shares one host and
 * may map the others' blocks) it also checks, through
 * hora_stats.direct_bytes, that the blocks were reduced in place.
 *
 * Ordinary buffers on one host: with HORA_SHM_SINGLE_COPY=1, staged or 0,
 * that each allreduce takes the path it names; with auto, that the ranks try
 * both and then agree on one (hora_stats.kernel_bytes, staged_bytes). */
#include <unistd.h>

#include "mpitest.h"

static bool expect_direct;

static uint64_t direct_bytes(void) {
  hora_stats st = {.struct_size = sizeof(st)};
  MT_OK(hora_get_stats(&st));
  return st.direct_bytes;
}

static float value(int rank, size_t i) { return (float)((rank * 5 + i * 3) % 17); }

/* value(r, i) depends on i only through i % 17: the sums are computed once. */
static float sum_of(size_t i) {
  static float sums[17];
  static bool ready;
  if (!ready) {
    for (size_t k = 0; k < 17; k++) {
      for (int r = 0; r < mt_size; r++) {
        sums[k] += value(r, k);
      }
    }
    ready = true;
  }
  return sums[i % 17];
}

static void check_sum(const char *what, const float *got, size_t n) {
  int bad = 0;
  for (size_t i = 0; i < n && bad < 3; i++) {
    if (got[i] != sum_of(i)) {
      mt_fail(__FILE__, __LINE__, "%s: element %zu is %g, expected %g", what, i, (double)got[i],
              (double)sum_of(i));
      bad++;
    }
  }
}

static void alloc_and_free_errors(void) {
  void *p = (void *)1;
  MT_FAILS(hora_mem_alloc(0, &p), HORA_ERR_INVALID_ARG, "0 bytes");
  MT_CHECK(p == NULL, "a failed hora_mem_alloc left *ptr set");
  MT_FAILS(hora_mem_alloc(64, NULL), HORA_ERR_INVALID_ARG, "ptr is NULL");
  MT_OK(hora_mem_free(NULL));
  long page = sysconf(_SC_PAGESIZE);
  MT_OK(hora_mem_alloc(10000, &p));
  MT_CHECK(p && (uintptr_t)p % (uintptr_t)page == 0, "block %p is not page-aligned", p);
  const unsigned char *c = p;
  int nonzero = 0;
  for (size_t i = 0; i < 10000; i++) {
    nonzero += c[i] != 0;
  }
  MT_CHECK(nonzero == 0, "a new block has %d non-zero bytes", nonzero);
  MT_FAILS(hora_mem_free((char *)p + 64), HORA_ERR_INVALID_ARG, "did not come from hora_mem_alloc");
  void *m = malloc(64);
  MT_FAILS(hora_mem_free(m), HORA_ERR_INVALID_ARG, "did not come from hora_mem_alloc");
  free(m);
  MT_OK(hora_mem_free(p));
  MT_FAILS(hora_mem_free(p), HORA_ERR_INVALID_ARG, "did not come from hora_mem_alloc");
}

/* Not in place and in place, on an odd count over the single-copy threshold. */
static void allreduce_in_blocks(void) {
  const size_t n = 300001; /* 1.2 MB of float32 */
  float *in, *out;
  MT_OK(hora_mem_alloc(n * sizeof(float), (void **)&in));
  MT_OK(hora_mem_alloc(n * sizeof(float), (void **)&out));
  if (!in || !out) {
    return;
  }
  for (size_t i = 0; i < n; i++) {
    in[i] = value(mt_rank, i);
  }
  uint64_t before = direct_bytes();
  MT_OK(hora_allreduce("mem/out", in, out, n, HORA_FLOAT32, HORA_SUM));
  check_sum("into another block", out, n);
  MT_OK(hora_allreduce("mem/inplace", in, in, n, HORA_FLOAT32, HORA_SUM));
  check_sum("in place", in, n);
  uint64_t moved = direct_bytes() - before;
  if (expect_direct) {
    MT_CHECK(moved == 2 * n * sizeof(float), "direct_bytes grew by %llu, expected %zu",
             (unsigned long long)moved, 2 * n * sizeof(float));
  }
  MT_OK(hora_mem_free(in));
  MT_OK(hora_mem_free(out));
}

/* Rank 0's buffers in a block, everyone else's from malloc: right answers,
 * and rank 0, whose peers have no blocks, reduces nothing in place. */
static void some_ranks_in_blocks(void) {
  const size_t n = 300001;
  float *buf = NULL;
  if (mt_rank == 0) {
    MT_OK(hora_mem_alloc(n * sizeof(float), (void **)&buf));
  } else {
    buf = malloc(n * sizeof(float));
  }
  if (!buf) {
    return;
  }
  for (size_t i = 0; i < n; i++) {
    buf[i] = value(mt_rank, i);
  }
  uint64_t before = direct_bytes();
  MT_OK(hora_allreduce("mem/mixed", buf, buf, n, HORA_FLOAT32, HORA_SUM));
  check_sum("rank 0 in a block", buf, n);
  if (mt_rank == 0) {
    MT_CHECK(direct_bytes() == before, "rank 0 counted direct bytes with no peer in a block");
    MT_OK(hora_mem_free(buf));
  } else {
    free(buf);
  }
}

/* Many tensors carved from one block, submitted in an order that differs by
 * rank, fused by the engine. */
static void fused_tensors_in_one_block(void) {
  enum { T = 60 };
  size_t sizes[T], total = 0;
  for (int t = 0; t < T; t++) {
    sizes[t] = 1000 + (size_t)t * 997; /* 60 tensors, 1.9 MB in all */
    total += sizes[t];
  }
  float *arena;
  MT_OK(hora_mem_alloc(total * sizeof(float), (void **)&arena));
  if (!arena) {
    return;
  }
  float *t_at[T];
  size_t at = 0;
  for (int t = 0; t < T; t++) {
    t_at[t] = arena + at;
    at += sizes[t];
    for (size_t i = 0; i < sizes[t]; i++) {
      t_at[t][i] = value(mt_rank, i + (size_t)t);
    }
  }
  hora_request *req[T];
  for (int k = 0; k < T; k++) {
    int t = (k * 7 + mt_rank * 11) % T; /* 7 and 11 are prime to 60 */
    char name[32];
    snprintf(name, sizeof(name), "mem/fused/%d", t);
    MT_OK(hora_allreduce_async(name, t_at[t], t_at[t], sizes[t], HORA_FLOAT32, HORA_SUM, &req[t]));
  }
  for (int t = 0; t < T; t++) {
    MT_OK(hora_wait(&req[t]));
  }
  int bad = 0;
  for (int t = 0; t < T && bad < 3; t++) {
    for (size_t i = 0; i < sizes[t] && bad < 3; i++) {
      if (t_at[t][i] != sum_of(i + (size_t)t)) {
        mt_fail(__FILE__, __LINE__, "tensor %d element %zu is %g, expected %g", t, i,
                (double)t_at[t][i], (double)sum_of(i + (size_t)t));
        bad++;
      }
    }
  }
  MT_OK(hora_mem_free(arena));
}

/* Every tensor of one fused operation in a block of its own: 100 blocks
 * (all kept mapped) and then 300 (more than a rank keeps mapped per peer:
 * the operation must neither unmap a block it is using nor fail). */
static void each_tensor_in_its_own_block(void) {
  enum { TMAX = 300 };
  static const int counts[2] = {100, TMAX};
  for (int c = 0; c < 2; c++) {
    int T = counts[c];
    float *t_at[TMAX];
    const size_t len = 1200; /* 4.8 KB each */
    for (int t = 0; t < T; t++) {
      t_at[t] = NULL;
      MT_OK(hora_mem_alloc(len * sizeof(float), (void **)&t_at[t]));
      if (!t_at[t]) {
        return;
      }
      for (size_t i = 0; i < len; i++) {
        t_at[t][i] = value(mt_rank, i + (size_t)t);
      }
    }
    uint64_t before = direct_bytes();
    hora_request *req[TMAX];
    for (int t = 0; t < T; t++) {
      char name[48];
      snprintf(name, sizeof(name), "mem/own/%d/%d", T, t);
      MT_OK(hora_allreduce_async(name, t_at[t], t_at[t], len, HORA_FLOAT32, HORA_SUM, &req[t]));
    }
    for (int t = 0; t < T; t++) {
      MT_OK(hora_wait(&req[t]));
    }
    int bad = 0;
    for (int t = 0; t < T && bad < 3; t++) {
      for (size_t i = 0; i < len && bad < 3; i++) {
        if (t_at[t][i] != sum_of(i + (size_t)t)) {
          mt_fail(__FILE__, __LINE__, "%d blocks: tensor %d element %zu is %g, expected %g", T, t, i,
                  (double)t_at[t][i], (double)sum_of(i + (size_t)t));
          bad++;
        }
      }
    }
    /* Where every fused batch takes the single-copy path whatever its size. */
    const char *min = getenv("HORA_SHM_SINGLE_COPY_MIN");
    if (expect_direct && T == 100 && min && strcmp(min, "0") == 0) {
      MT_CHECK(direct_bytes() > before, "100 blocks of one operation were not reduced in place");
    }
    for (int t = 0; t < T; t++) {
      MT_OK(hora_mem_free(t_at[t]));
    }
  }
}

/* Blocks made one after another, each freed before the next is made, often
 * at the same address: the peers must drop their old mappings. */
static void blocks_freed_and_made_again(void) {
  const size_t n = 300001;
  for (int round = 0; round < 8; round++) {
    float *buf;
    MT_OK(hora_mem_alloc(n * sizeof(float), (void **)&buf));
    if (!buf) {
      return;
    }
    for (size_t i = 0; i < n; i++) {
      buf[i] = value(mt_rank, i + (size_t)round);
    }
    MT_OK(hora_allreduce("mem/again", buf, buf, n, HORA_FLOAT32, HORA_SUM));
    int bad = 0;
    for (size_t i = 0; i < n && bad < 3; i += 97) {
      if (buf[i] != sum_of(i + (size_t)round)) {
        mt_fail(__FILE__, __LINE__, "round %d element %zu is %g, expected %g", round, i,
                (double)buf[i], (double)sum_of(i + (size_t)round));
        bad++;
      }
    }
    MT_OK(hora_mem_free(buf));
  }
}

/* ---- buffers outside blocks: the kernel or the staged path -------------------- */

static bool one_shm_host(void) {
  const char *t = getenv("HORA_TRANSPORT");
  return mt_size > 1 && hora_local_size() == mt_size && (!t || !strcmp(t, "auto") || !strcmp(t, "shm"));
}

static const char *single_copy_setting(void) {
  const char *v = getenv("HORA_SHM_SINGLE_COPY");
  return v ? v : "auto";
}

/* One allreduce of malloc'd floats that gives each local rank about `share`
 * bytes, checked; returns the path hora_stats says moved it: 'k' (kernel
 * copies), 's' (staged) or '?' (neither or both). */
static char malloc_allreduce_path(const char *name, size_t share) {
  size_t n = share * (size_t)hora_local_size() / sizeof(float) + 1;
  float *buf = malloc(n * sizeof(float));
  if (!buf) {
    mt_fail(__FILE__, __LINE__, "out of memory for %zu floats", n);
    return '?';
  }
  for (size_t i = 0; i < n; i++) {
    buf[i] = value(mt_rank, i);
  }
  hora_stats a = {.struct_size = sizeof(a)}, b = {.struct_size = sizeof(b)};
  MT_OK(hora_get_stats(&a));
  MT_OK(hora_allreduce(name, buf, buf, n, HORA_FLOAT32, HORA_SUM));
  MT_OK(hora_get_stats(&b));
  check_sum(name, buf, n);
  free(buf);
  uint64_t bytes = n * sizeof(float), k = b.kernel_bytes - a.kernel_bytes,
           st = b.staged_bytes - a.staged_bytes;
  return k == bytes && st == 0 ? 'k' : st == bytes && k == 0 ? 's' : '?';
}

/* HORA_SHM_SINGLE_COPY=1, staged or 0: every large allreduce of malloc'd
 * buffers takes the path it names. */
static void paths_as_set(void) {
  const char *set = single_copy_setting();
  char want = !strcmp(set, "1") ? 'k' : 's';
  for (int i = 0; i < 3; i++) {
    char got = malloc_allreduce_path("paths/as_set", (size_t)256 << 10);
    MT_CHECK(got == want, "HORA_SHM_SINGLE_COPY=%s: allreduce %d took path '%c', expected '%c'",
             set, i, got, want);
  }
}

/* HORA_SHM_SINGLE_COPY=auto: the first operations of one size take both
 * paths (a run of 4 each), then all take one; every rank takes the same path
 * every time. */
static void auto_chooses_one_path(void) {
  enum { OPS = 20, SETTLED = 6 };
  char seq[OPS + 1] = {0};
  for (int i = 0; i < OPS; i++) {
    seq[i] = malloc_allreduce_path("paths/auto", (size_t)256 << 10);
  }
  char *all = calloc((size_t)mt_size, OPS + 1);
  MPI_Allgather(seq, OPS + 1, MPI_CHAR, all, OPS + 1, MPI_CHAR, MPI_COMM_WORLD);
  for (int r = 1; r < mt_size; r++) {
    MT_CHECK(memcmp(all, all + (size_t)r * (OPS + 1), OPS) == 0,
             "ranks took different paths: rank 0 %s, rank %d %s", all, r, all + (size_t)r * (OPS + 1));
  }
  free(all);
  int k = 0, s = 0;
  for (int i = 0; i < OPS; i++) {
    k += seq[i] == 'k';
    s += seq[i] == 's';
  }
  MT_CHECK(k + s == OPS, "paths %s: some allreduce took neither path or both", seq);
  MT_CHECK(seq[0] == 'k', "paths %s: the first allreduce of a size was not a kernel trial", seq);
  MT_CHECK(k >= 4 && s >= 4, "paths %s: not both paths tried 4 times", seq);
  for (int i = OPS - SETTLED; i < OPS; i++) {
    MT_CHECK(seq[i] == seq[OPS - 1], "paths %s: the last %d allreduces did not settle on one path",
             seq, SETTLED);
  }
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    expect_direct = expect_direct || strcmp(argv[i], "direct") == 0;
  }
  mt_setenv_args(argc, argv);
  /* Before hora_init, as the header promises. */
  void *early = NULL;
  int early_rc = hora_mem_alloc(4096, &early);
  mt_init();
  MT_CHECK(early_rc == HORA_SUCCESS && early, "hora_mem_alloc before hora_init failed");
  /* First, while no allreduce of these sizes has been timed yet. */
  const char *set = single_copy_setting();
  if (!one_shm_host()) {
    mt_skip("shared_mem/paths", "needs 2 or more ranks on one host over shared memory");
  } else if (strcmp(set, "auto") != 0) {
    mt_run("shared_mem/paths_as_set", paths_as_set);
  } else if (malloc_allreduce_path("paths/probe", 64 << 10) != 'k') {
    /* The first allreduce of a size tries the kernel path where it works. */
    mt_skip("shared_mem/auto_chooses_one_path",
            "the kernel does not let these ranks read each other's memory (process_vm_readv)");
  } else {
    mt_run("shared_mem/auto_chooses_one_path", auto_chooses_one_path);
  }
  mt_run("shared_mem/alloc_and_free_errors", alloc_and_free_errors);
  mt_run("shared_mem/allreduce_in_blocks", allreduce_in_blocks);
  mt_run("shared_mem/some_ranks_in_blocks", some_ranks_in_blocks);
  mt_run("shared_mem/fused_tensors_in_one_block", fused_tensors_in_one_block);
  mt_run("shared_mem/blocks_freed_and_made_again", blocks_freed_and_made_again);
  mt_run("shared_mem/each_tensor_in_its_own_block", each_tensor_in_its_own_block);
  int failures = mt_total_failures();
  int rc = hora_finalize();
  if (rc != HORA_SUCCESS) {
    fprintf(stderr, "hora_finalize: %s\n", hora_last_error());
    return 1;
  }
  if (hora_mem_free(early) != HORA_SUCCESS) {
    fprintf(stderr, "hora_mem_free after hora_finalize: %s\n", hora_last_error());
    return 1;
  }
  return failures ? 1 : 0;
}
