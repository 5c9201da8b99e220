/* Every collective algorithm end to end, run once per forced choice
 * (HORA_ALGORITHM_<KIND>=... as arguments, testlist) at rank counts powers
 * of two and not: allreduce of awkward counts (0, 1, below and above the
 * rank count) in several dtypes and ops, in place and not, fused batches,
 * wire compression (every rank must hold the same bits), broadcast from
 * several roots (0 bytes, fewer bytes than ranks, uneven blocks),
 * allgather, reducescatter (uneven blocks, rows, explicit counts, ops,
 * average, fp16 on the wire), a rank that has joined, a process set, the
 * same picks by the cost model on every rank, and small operations that
 * travel with their negotiation cycle. Values are small integers, so
 * results are exact (but for fp16 on the wire and averages). Lean on
 * purpose: it runs at up to 32 ranks on two cores. */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "mpitest.h"

static const size_t counts[] = {0, 1, 2, 3, 7, 31, 33, 1000, 65537, 300000};
#define NCOUNTS (sizeof(counts) / sizeof(counts[0]))

static float fval(int rank, size_t i) { return (float)((rank * 7 + (int)(i % 13)) % 11 - 5); }

static void allreduce_float_sum(void) {
  for (size_t c = 0; c < NCOUNTS; c++) {
    size_t n = counts[c];
    float *x = malloc((n + 1) * sizeof(float)), *y = malloc((n + 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) {
      x[i] = fval(mt_rank, i);
    }
    char name[64];
    snprintf(name, sizeof(name), "ar/f32/%zu", n);
    MT_OK(hora_allreduce(name, x, y, n, HORA_FLOAT32, HORA_SUM)); /* out of place */
    snprintf(name, sizeof(name), "ar/f32/inplace/%zu", n);
    MT_OK(hora_allreduce(name, x, x, n, HORA_FLOAT32, HORA_SUM));
    for (size_t i = 0; i < n; i++) {
      float want = 0;
      for (int r = 0; r < mt_size; r++) {
        want += fval(r, i);
      }
      if (y[i] != want || x[i] != want) {
        mt_fail(__FILE__, __LINE__, "count %zu: element %zu is %g / %g in place, expected %g", n,
                i, (double)y[i], (double)x[i], (double)want);
        break;
      }
    }
    free(x);
    free(y);
  }
}

static void allreduce_int_max_double_min(void) {
  size_t n = 4099;
  int32_t *a = malloc(n * sizeof(int32_t));
  double *d = malloc(n * sizeof(double));
  for (size_t i = 0; i < n; i++) {
    a[i] = (int32_t)((mt_rank * 13 + (int)i * 5) % 23) - 11;
    d[i] = (double)((mt_rank * 3 + (int)i) % 17) - 8;
  }
  hora_request *r1, *r2;
  MT_OK(hora_allreduce_async("ar/i32/max", a, a, n, HORA_INT32, HORA_MAX, &r1));
  MT_OK(hora_allreduce_async("ar/f64/min", d, d, n, HORA_FLOAT64, HORA_MIN, &r2));
  MT_OK(hora_wait(&r1));
  MT_OK(hora_wait(&r2));
  for (size_t i = 0; i < n; i++) {
    int32_t wa = -1000;
    double wd = 1000;
    for (int r = 0; r < mt_size; r++) {
      int32_t v = (int32_t)((r * 13 + (int)i * 5) % 23) - 11;
      double w = (double)((r * 3 + (int)i) % 17) - 8;
      wa = v > wa ? v : wa;
      wd = w < wd ? w : wd;
    }
    if (a[i] != wa || d[i] != wd) {
      mt_fail(__FILE__, __LINE__, "element %zu: max %d (want %d), min %g (want %g)", i, a[i], wa,
              d[i], wd);
      break;
    }
  }
  free(a);
  free(d);
}

/* Several tensors at once: fused into one operation, AVERAGE included. */
static void allreduce_fused(void) {
  enum { T = 5 };
  size_t n[T] = {5, 1000, 17, 1, 3000};
  float *b[T];
  hora_request *r[T];
  for (int t = 0; t < T; t++) {
    b[t] = malloc(n[t] * sizeof(float));
    for (size_t i = 0; i < n[t]; i++) {
      b[t][i] = (float)(mt_rank + t);
    }
    char name[32];
    snprintf(name, sizeof(name), "ar/fused/%d", t);
    MT_OK(hora_allreduce_async(name, b[t], b[t], n[t], HORA_FLOAT32,
                               t == 1 ? HORA_AVERAGE : HORA_SUM, &r[t]));
  }
  for (int t = 0; t < T; t++) {
    MT_OK(hora_wait(&r[t]));
    float sum = (float)(mt_size * (mt_size - 1) / 2 + mt_size * t);
    float want = t == 1 ? sum / (float)mt_size : sum;
    for (size_t i = 0; i < n[t]; i++) {
      if (fabsf(b[t][i] - want) > 1e-5f * fabsf(want)) {
        mt_fail(__FILE__, __LINE__, "tensor %d element %zu is %g, expected %g", t, i,
                (double)b[t][i], (double)want);
        break;
      }
    }
    free(b[t]);
  }
}

/* fp16 on the wire: close to the exact sum, and the same bits on every
 * rank (each must have added the same operands). */
static void allreduce_compressed(void) {
  size_t sizes[] = {3, 257, 100000};
  for (size_t k = 0; k < 3; k++) {
    size_t n = sizes[k];
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
      x[i] = 0.1f * (float)(mt_rank + 1) + 0.001f * (float)(i % 100);
    }
    hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
    o.compression = HORA_COMPRESSION_FP16;
    hora_request *r;
    char name[32];
    snprintf(name, sizeof(name), "ar/fp16/%zu", n);
    MT_OK(hora_allreduce_async_ex(name, x, x, n, HORA_FLOAT32, HORA_SUM, &o, &r));
    MT_OK(hora_wait(&r));
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
      float want = 0.1f * (float)(mt_size * (mt_size + 1) / 2) + 0.001f * (float)(i % 100) * mt_size;
      if (fabsf(x[i] - want) > 2e-3f * want + 1e-3f) {
        mt_fail(__FILE__, __LINE__, "n %zu element %zu is %g, expected about %g", n, i,
                (double)x[i], (double)want);
        break;
      }
      uint32_t bits;
      memcpy(&bits, &x[i], sizeof(bits));
      h = (h ^ bits) * 1099511628211ull;
    }
    uint64_t *all = malloc((size_t)mt_size * sizeof(uint64_t));
    mt_allgather(&h, sizeof(h), all);
    for (int r2 = 1; r2 < mt_size; r2++) {
      MT_CHECK(all[r2] == all[0], "n %zu: rank %d's result differs from rank 0's", n, r2);
    }
    free(all);
    free(x);
  }
}

static void broadcast_from_roots(void) {
  size_t sizes[] = {0, 1, (size_t)mt_size + 3, 999, 200001};
  int roots[4] = {0, mt_size - 1, mt_size / 2, 1 % mt_size};
  for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
    size_t n = sizes[k];
    uint8_t *b = malloc(n + 1);
    for (int j = 0; j < 4; j++) {
      int root = roots[j];
      for (size_t i = 0; i < n; i++) {
        b[i] = mt_rank == root ? (uint8_t)(mt_hash(i + (uint64_t)root) & 0xff) : 0xee;
      }
      char name[48];
      snprintf(name, sizeof(name), "bc/%zu/%d/%d", n, root, j);
      MT_OK(hora_broadcast(name, b, n, HORA_UINT8, root));
      for (size_t i = 0; i < n; i++) {
        if (b[i] != (uint8_t)(mt_hash(i + (uint64_t)root) & 0xff)) {
          mt_fail(__FILE__, __LINE__, "%zu bytes from root %d: byte %zu wrong", n, root, i);
          break;
        }
      }
    }
    free(b);
  }
}

static void allgather_blocks(void) {
  size_t sizes[] = {1, 13, 50001};
  for (size_t k = 0; k < 3; k++) {
    size_t n = sizes[k];
    int32_t *mine = malloc(n * sizeof(int32_t));
    int32_t *all = malloc((size_t)mt_size * n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) {
      mine[i] = mt_rank * 100000 + (int32_t)i;
    }
    char name[32];
    snprintf(name, sizeof(name), "ag/%zu", n);
    MT_OK(hora_allgather(name, mine, n, HORA_INT32, all));
    for (int r = 0; r < mt_size; r++) {
      for (size_t i = 0; i < n; i++) {
        if (all[(size_t)r * n + i] != r * 100000 + (int32_t)i) {
          mt_fail(__FILE__, __LINE__, "%zu per rank: rank %d's element %zu wrong", n, r, i);
          r = mt_size;
          break;
        }
      }
    }
    free(mine);
    free(all);
  }
}

/* Broadcasts of several sizes from one root submitted together, so that
 * they may travel fused, in one buffer. */
static void broadcast_fused(void) {
  enum { N = 5 };
  static const size_t sizes[N] = {1, 0, 4099, 3, 70001};
  int root = mt_size - 1;
  uint8_t *b[N];
  hora_request *r[N];
  for (int t = 0; t < N; t++) {
    b[t] = malloc(sizes[t] + 1);
    for (size_t i = 0; i < sizes[t]; i++) {
      b[t][i] = mt_rank == root ? (uint8_t)(mt_hash(i * N + (uint64_t)t) & 0xff) : 0xee;
    }
    char name[32];
    snprintf(name, sizeof(name), "bcf/%d", t);
    MT_OK(hora_broadcast_async(name, b[t], sizes[t], HORA_UINT8, root, &r[t]));
  }
  for (int t = 0; t < N; t++) {
    MT_OK(hora_wait(&r[t]));
    for (size_t i = 0; i < sizes[t]; i++) {
      if (b[t][i] != (uint8_t)(mt_hash(i * N + (uint64_t)t) & 0xff)) {
        mt_fail(__FILE__, __LINE__, "tensor %d (%zu bytes): byte %zu wrong", t, sizes[t], i);
        break;
      }
    }
    free(b[t]);
  }
}

/* Blocks of single bytes: fewer bytes than ranks, odd sizes. */
static void allgather_bytes(void) {
  static const size_t sizes[] = {1, 3, 4097};
  for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
    size_t n = sizes[k];
    uint8_t *mine = malloc(n), *all = malloc((size_t)mt_size * n);
    for (size_t i = 0; i < n; i++) {
      mine[i] = (uint8_t)(mt_hash((uint64_t)mt_rank * 1000003u + i) & 0xff);
    }
    char name[32];
    snprintf(name, sizeof(name), "agb/%zu", n);
    MT_OK(hora_allgather(name, mine, n, HORA_UINT8, all));
    for (size_t i = 0; i < (size_t)mt_size * n; i++) {
      if (all[i] != (uint8_t)(mt_hash((uint64_t)(i / n) * 1000003u + i % n) & 0xff)) {
        mt_fail(__FILE__, __LINE__, "%zu bytes per rank: rank %zu's byte %zu wrong", n, i / n,
                i % n);
        break;
      }
    }
    free(mine);
    free(all);
  }
}

static void reducescatter_blocks(void) {
  size_t sizes[] = {1, (size_t)mt_size * 3 + 1, 100003};
  for (size_t k = 0; k < 3; k++) {
    size_t n = sizes[k];
    float *x = malloc(n * sizeof(float)), *y = malloc((n + 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) {
      x[i] = fval(mt_rank, i);
    }
    char name[32];
    snprintf(name, sizeof(name), "rs/%zu", n);
    MT_OK(hora_reducescatter(name, x, y, n, HORA_FLOAT32, HORA_SUM));
    size_t first = 0;
    for (int r = 0; r < mt_rank; r++) {
      first += hora_reducescatter_block(n, 0, mt_size, r);
    }
    size_t mine = hora_reducescatter_block(n, 0, mt_size, mt_rank);
    for (size_t i = 0; i < mine; i++) {
      float want = 0;
      for (int r = 0; r < mt_size; r++) {
        want += fval(r, first + i);
      }
      if (y[i] != want) {
        mt_fail(__FILE__, __LINE__, "%zu elements: block element %zu is %g, expected %g", n, i,
                (double)y[i], (double)want);
        break;
      }
    }
    free(x);
    free(y);
  }
}

/* Rows of 3 elements (blocks of whole rows, uneven) with int32 max,
 * explicit counts (some 0, uneven) with int32 min, and an average of
 * float32 with fp16 on the wire. */
static void reducescatter_rows_counts_ops(void) {
  enum { ROWS = 41, W = 3 };
  size_t n = ROWS * W;
  int32_t *x = malloc(n * sizeof(int32_t)), *y = malloc((n + 1) * sizeof(int32_t));
  for (size_t i = 0; i < n; i++) {
    x[i] = (int32_t)((mt_rank * 13 + (int)i * 5) % 23) - 11;
  }
  int64_t dims[2] = {ROWS, W};
  hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
  o.ndims = 2;
  o.dims = dims;
  hora_request *r;
  MT_OK(hora_reducescatter_async_ex("rs/rows/max", x, y, n, HORA_INT32, HORA_MAX, &o, &r));
  MT_OK(hora_wait(&r));
  size_t first = 0;
  for (int q = 0; q < mt_rank; q++) {
    first += hora_reducescatter_block(n, ROWS, mt_size, q);
  }
  size_t mine = hora_reducescatter_block(n, ROWS, mt_size, mt_rank);
  MT_CHECK(mine % W == 0, "rows: block of %zu elements", mine);
  for (size_t i = 0; i < mine; i++) {
    int32_t want = -1000;
    for (int q = 0; q < mt_size; q++) {
      int32_t v = (int32_t)((q * 13 + (int)(first + i) * 5) % 23) - 11;
      want = v > want ? v : want;
    }
    if (y[i] != want) {
      mt_fail(__FILE__, __LINE__, "rows: block element %zu is %d, expected %d", i, y[i], want);
      break;
    }
  }
  /* Explicit counts: rank j keeps (j * 5) % 7 elements. */
  size_t *kept = malloc((size_t)mt_size * sizeof(size_t)), total = 0;
  first = 0;
  for (int q = 0; q < mt_size; q++) {
    kept[q] = (size_t)(q * 5 % 7);
    first += q < mt_rank ? kept[q] : 0;
    total += kept[q];
  }
  int32_t *v = malloc((total + 1) * sizeof(int32_t)), *w = malloc((total + 1) * sizeof(int32_t));
  for (size_t i = 0; i < total; i++) {
    v[i] = (int32_t)((mt_rank * 3 + (int)i) % 17) - 8;
  }
  MT_OK(hora_reducescatterv("rs/counts/min", v, w, kept, HORA_INT32, HORA_MIN, NULL));
  for (size_t i = 0; i < kept[mt_rank]; i++) {
    int32_t want = 1000;
    for (int q = 0; q < mt_size; q++) {
      int32_t e = (int32_t)((q * 3 + (int)(first + i)) % 17) - 8;
      want = e < want ? e : want;
    }
    if (w[i] != want) {
      mt_fail(__FILE__, __LINE__, "counts: block element %zu is %d, expected %d", i, w[i], want);
      break;
    }
  }
  /* Average over fp16: close to the exact mean. */
  size_t m = 10007;
  float *f = malloc(m * sizeof(float)), *g = malloc((m + 1) * sizeof(float));
  for (size_t i = 0; i < m; i++) {
    f[i] = 0.25f * (float)(mt_rank + 1) + 0.01f * (float)(i % 50);
  }
  hora_allreduce_options c = HORA_ALLREDUCE_OPTIONS_INIT;
  c.compression = HORA_COMPRESSION_FP16;
  MT_OK(hora_reducescatter_async_ex("rs/avg/fp16", f, g, m, HORA_FLOAT32, HORA_AVERAGE, &c, &r));
  MT_OK(hora_wait(&r));
  first = 0;
  for (int q = 0; q < mt_rank; q++) {
    first += hora_reducescatter_block(m, 0, mt_size, q);
  }
  for (size_t i = 0; i < hora_reducescatter_block(m, 0, mt_size, mt_rank); i++) {
    float want = 0.25f * (float)(mt_size + 1) / 2 + 0.01f * (float)((first + i) % 50);
    /* The ring rounds a partial sum to fp16 p - 1 times, each off by up to
     * half an fp16 step (2^-11 relative) of a sum that grows from one to p
     * times the mean: after the division, about (p - 1) 2^-12 of the mean.
     * A block from the wrong place, or a rank of average size missing,
     * moves it by more. */
    float tol = 4e-3f * want + 1e-3f + (float)(mt_size - 1) * ldexpf(want, -12);
    if (fabsf(g[i] - want) > tol) {
      mt_fail(__FILE__, __LINE__, "average: block element %zu is %g, expected about %g", i,
              (double)g[i], (double)want);
      break;
    }
  }
  free(x);
  free(y);
  free(kept);
  free(v);
  free(w);
  free(f);
  free(g);
}

/* The last rank runs out of data first: the others' allreduces go on with
 * its zeros. */
static void with_a_joined_rank(void) {
  enum { N = 777 };
  float x[N];
  if (mt_size > 1 && mt_rank == mt_size - 1) {
    int last;
    MT_OK(hora_join(&last));
    MT_CHECK(last >= 0 && last != mt_size - 1, "hora_join reported rank %d as the last", last);
    return;
  }
  for (int step = 0; step < 3; step++) {
    for (int i = 0; i < N; i++) {
      x[i] = (float)(mt_rank + 1);
    }
    MT_OK(hora_allreduce("join/grad", x, x, N, HORA_FLOAT32, HORA_SUM));
    int active = mt_size > 1 ? mt_size - 1 : 1;
    float want = (float)(active * (active + 1) / 2);
    MT_CHECK(x[0] == want && x[N - 1] == want, "step %d: %g, expected %g", step, (double)x[0],
             (double)want);
  }
  int last;
  MT_OK(hora_join(&last));
  /* Rank size-1 joined first, so someone else joined last. */
  MT_CHECK(last >= 0 && last < mt_size && (last != mt_size - 1 || mt_size == 1),
           "hora_join reported rank %d as the last to join", last);
}

/* The even ranks as a set of their own. */
static void in_a_process_set(void) {
  int n = (mt_size + 1) / 2, *ranks = malloc((size_t)n * sizeof(int));
  for (int i = 0; i < n; i++) {
    ranks[i] = 2 * i;
  }
  hora_process_set *ps;
  MT_OK(hora_process_set_create(ranks, n, &ps));
  if (mt_rank % 2 == 0) {
    enum { N = 5001 };
    float *x = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) {
      x[i] = (float)mt_rank;
    }
    hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
    o.process_set = ps;
    hora_request *r;
    MT_OK(hora_allreduce_async_ex("ps/even", x, x, N, HORA_FLOAT32, HORA_SUM, &o, &r));
    MT_OK(hora_wait(&r));
    float want = (float)(n * (n - 1)); /* 2 * (0 + 1 + ... + n-1) */
    MT_CHECK(x[0] == want && x[N - 1] == want, "set of %d: %g, expected %g", n, (double)x[0],
             (double)want);
    free(x);
  }
  MT_OK(hora_process_set_destroy(ps));
  free(ranks);
}

/* Whether small cached operations travel with their cycle in this run:
 * not at one rank, nor with HORA_EAGER_THRESHOLD=0 (as a testlist line
 * passes it). */
static bool eager_expected(void) {
  const char *env = getenv("HORA_EAGER_THRESHOLD");
  return mt_size > 1 && !(env && strcmp(env, "0") == 0);
}

/* Small allreduces that ran before travel with the negotiation cycle that
 * schedules them (HORA_EAGER_THRESHOLD, 16K by default): dtypes and ops,
 * prescale, postscale and AVERAGE, in place and not, several in one
 * cycle, beside one too big to go that way. Float sums of values that
 * round must give every rank the same bits. The count of eager ones is
 * exact: every cached small one goes, unless the setting is 0 (as the
 * testlist line passes it) or there is one rank. */
static void allreduce_eager(void) {
  enum { ITERS = 4, NSMALL = 5, BIG = 5000 };
  bool eager_on = eager_expected();
  hora_stats s0 = {.struct_size = sizeof(s0)}, s1 = {.struct_size = sizeof(s1)};
  MT_OK(hora_get_stats(&s0));
  float f[7], fin[7], avg[33], avg_in[33], *big = malloc(BIG * sizeof(float));
  int32_t imax[3];
  double dmin[1];
  int64_t prod[2], prod_out[2];
  for (int it = 0; it < ITERS; it++) {
    for (int i = 0; i < 7; i++) {
      fin[i] = 1.0f / (float)(mt_rank + 3 + i) + (float)it;
    }
    for (int i = 0; i < 33; i++) {
      avg_in[i] = (float)(mt_rank + i + it);
    }
    for (int i = 0; i < 3; i++) {
      imax[i] = (mt_rank * 5 + i + it) % 7;
    }
    dmin[0] = (double)(mt_rank - it);
    for (int i = 0; i < 2; i++) {
      prod[i] = mt_rank % 2 ? 2 : 1;
    }
    for (int i = 0; i < BIG; i++) {
      big[i] = (float)((mt_rank + i) % 5);
    }
    hora_allreduce_options scaled = HORA_ALLREDUCE_OPTIONS_INIT;
    scaled.prescale = 0.5;
    scaled.postscale = 4.0;
    hora_request *q[NSMALL + 1] = {NULL};
    MT_OK(hora_allreduce_async_ex("eager/f32", fin, f, 7, HORA_FLOAT32, HORA_SUM, NULL, &q[0]));
    MT_OK(hora_allreduce_async_ex("eager/i32/inplace", imax, imax, 3, HORA_INT32, HORA_MAX, NULL,
                                  &q[1]));
    MT_OK(hora_allreduce_async_ex("eager/f64", dmin, dmin, 1, HORA_FLOAT64, HORA_MIN, NULL, &q[2]));
    MT_OK(hora_allreduce_async_ex("eager/avg", avg_in, avg, 33, HORA_FLOAT32, HORA_AVERAGE,
                                  &scaled, &q[3]));
    MT_OK(hora_allreduce_async_ex("eager/i64", prod, prod_out, 2, HORA_INT64, HORA_PRODUCT, NULL,
                                  &q[4]));
    MT_OK(hora_allreduce_async_ex("eager/big", big, big, BIG, HORA_FLOAT32, HORA_SUM, NULL, &q[5]));
    for (int k = 0; k <= NSMALL; k++) {
      MT_OK(hora_wait(&q[k]));
    }
    for (int i = 0; i < 7; i++) {
      double want = 0;
      for (int r = 0; r < mt_size; r++) {
        want += 1.0 / (double)(r + 3 + i) + it;
      }
      if (fabs(f[i] - want) > 1e-4 * fabs(want)) {
        mt_fail(__FILE__, __LINE__, "iteration %d: float32 sum %d is %.9g, expected %.9g", it, i,
                (double)f[i], want);
      }
    }
    float *all = malloc((size_t)mt_size * sizeof(f));
    mt_allgather(f, sizeof(f), all);
    for (int r = 1; r < mt_size; r++) {
      if (memcmp(all, all + 7 * r, sizeof(f)) != 0) {
        mt_fail(__FILE__, __LINE__, "iteration %d: rank %d's float32 sums differ in their bits "
                "from rank 0's", it, r);
      }
    }
    free(all);
    for (int i = 0; i < 33; i++) {
      double sum = 0;
      for (int r = 0; r < mt_size; r++) {
        sum += 0.5 * (r + i + it);
      }
      double want = 4.0 * sum / mt_size;
      if (fabs(avg[i] - want) > 1e-4 * fabs(want) + 1e-6) {
        mt_fail(__FILE__, __LINE__, "iteration %d: scaled average %d is %g, expected %g", it, i,
                (double)avg[i], want);
      }
    }
    for (int i = 0; i < 3; i++) {
      int32_t want = 0;
      for (int r = 0; r < mt_size; r++) {
        int32_t v = (r * 5 + i + it) % 7;
        want = v > want ? v : want;
      }
      if (imax[i] != want) {
        mt_fail(__FILE__, __LINE__, "iteration %d: int32 max %d is %d, expected %d", it, i,
                imax[i], want);
      }
    }
    int64_t want_prod = (int64_t)1 << (mt_size / 2);
    if (dmin[0] != (double)-it || prod_out[0] != want_prod || prod_out[1] != want_prod) {
      mt_fail(__FILE__, __LINE__, "iteration %d: float64 min %g (expected %d), int64 product "
              "%lld %lld (expected %lld)", it, dmin[0], -it, (long long)prod_out[0],
              (long long)prod_out[1], (long long)want_prod);
    }
    for (int i = 0; i < BIG; i++) {
      float want = 0;
      for (int r = 0; r < mt_size; r++) {
        want += (float)((r + i) % 5);
      }
      if (big[i] != want) {
        mt_fail(__FILE__, __LINE__, "iteration %d: the big tensor's element %d is %g, expected %g",
                it, i, (double)big[i], (double)want);
        break;
      }
    }
  }
  free(big);
  MT_OK(hora_get_stats(&s1));
  uint64_t eager = s1.eager_allreduces - s0.eager_allreduces;
  uint64_t want = eager_on ? (uint64_t)(ITERS - 1) * NSMALL : 0;
  if (eager != want) {
    mt_fail(__FILE__, __LINE__, "%llu allreduces travelled with their cycle, expected %llu "
            "(the first of each name goes through rank 0, the big one never)",
            (unsigned long long)eager, (unsigned long long)want);
  }
}

/* Small broadcasts, allgathers and reducescatters that ran before travel
 * with their cycle too: from the first rank and from the last, bytes that
 * no sum would keep (-0.0, a NaN's payload) arriving bit for bit, an
 * allgather of bytes, a reducescatter by rows, averaged and scaled, beside
 * an allgather whose whole result is over HORA_EAGER_THRESHOLD. The count
 * is exact, as for the allreduces. */
static uint32_t eager_word(int rank, int i, int it) {
  if (i == 0) {
    return 0x80000000u; /* -0.0f */
  }
  if (i == 1) {
    return 0x7fc00000u | (uint32_t)(rank * 16 + it); /* a quiet NaN with a payload */
  }
  return (uint32_t)(rank * 1000 + i * 7 + it) * 2654435761u;
}

static void eager_collectives(void) {
  enum { ITERS = 4, NSMALL = 5, BC = 9, AG = 5, ROWS = 7, W = 3 };
  bool eager_on = eager_expected();
  hora_stats s0 = {.struct_size = sizeof(s0)}, s1 = {.struct_size = sizeof(s1)};
  MT_OK(hora_get_stats(&s0));
  size_t p = (size_t)mt_size, big = 16384 / 4 / p + 1; /* floats per rank: p * big * 4 > 16 KiB */
  uint32_t b0[BC], b1[BC];
  uint8_t ag[AG], *ag_out = malloc(p * AG);
  uint32_t agf[2], *agf_out = malloc(p * sizeof(agf));
  float *agbig = malloc(big * sizeof(float)), *agbig_out = malloc(p * big * sizeof(float));
  size_t n = ROWS * W;
  float rs[ROWS * W], rs_out[ROWS * W];
  int64_t dims[2] = {ROWS, W};
  for (int it = 0; it < ITERS; it++) {
    int last = mt_size - 1;
    for (int i = 0; i < BC; i++) {
      b0[i] = mt_rank == 0 ? eager_word(0, i, it) : 0xdeadbeefu;
      b1[i] = mt_rank == last ? eager_word(last, i, it) : 0xdeadbeefu;
    }
    for (int i = 0; i < AG; i++) {
      ag[i] = (uint8_t)(mt_rank * 31 + i * 3 + it);
    }
    agf[0] = eager_word(mt_rank, 0, it);
    agf[1] = eager_word(mt_rank, 1, it);
    for (size_t i = 0; i < big; i++) {
      agbig[i] = (float)(mt_rank + (int)i + it);
    }
    for (size_t i = 0; i < n; i++) {
      rs[i] = (float)(mt_rank + (int)i + it);
    }
    hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
    o.ndims = 2;
    o.dims = dims;
    o.prescale = 0.5;
    o.postscale = 4.0;
    hora_request *q[NSMALL + 1] = {NULL};
    MT_OK(hora_broadcast_async("eager/bcast/first", b0, BC, HORA_FLOAT32, 0, &q[0]));
    MT_OK(hora_broadcast_async("eager/bcast/last", b1, BC, HORA_FLOAT32, last, &q[1]));
    MT_OK(hora_allgather_async("eager/allgather/u8", ag, AG, HORA_UINT8, ag_out, &q[2]));
    MT_OK(hora_allgather_async("eager/allgather/f32", agf, 2, HORA_FLOAT32, agf_out, &q[3]));
    MT_OK(hora_reducescatter_async_ex("eager/reducescatter/rows", rs, rs_out, n, HORA_FLOAT32,
                                      HORA_AVERAGE, &o, &q[4]));
    MT_OK(hora_allgather_async("eager/allgather/big", agbig, big, HORA_FLOAT32, agbig_out, &q[5]));
    for (int k = 0; k <= NSMALL; k++) {
      MT_OK(hora_wait(&q[k]));
    }
    for (int i = 0; i < BC; i++) {
      if (b0[i] != eager_word(0, i, it) || b1[i] != eager_word(last, i, it)) {
        mt_fail(__FILE__, __LINE__, "iteration %d: broadcast word %d is %08x / %08x, expected "
                "%08x / %08x", it, i, b0[i], b1[i], eager_word(0, i, it), eager_word(last, i, it));
        break;
      }
    }
    for (int r = 0; r < mt_size; r++) {
      for (int i = 0; i < AG; i++) {
        if (ag_out[(size_t)r * AG + i] != (uint8_t)(r * 31 + i * 3 + it)) {
          mt_fail(__FILE__, __LINE__, "iteration %d: allgather byte %d of rank %d is %u", it, i,
                  r, ag_out[(size_t)r * AG + i]);
          r = mt_size;
          break;
        }
      }
      if (r < mt_size && (agf_out[2 * r] != eager_word(r, 0, it) ||
                          agf_out[2 * r + 1] != eager_word(r, 1, it))) {
        mt_fail(__FILE__, __LINE__, "iteration %d: rank %d's -0.0 and NaN came as %08x %08x", it,
                r, agf_out[2 * r], agf_out[2 * r + 1]);
        break;
      }
      for (size_t i = 0; r < mt_size && i < big; i++) {
        if (agbig_out[(size_t)r * big + i] != (float)(r + (int)i + it)) {
          mt_fail(__FILE__, __LINE__, "iteration %d: big allgather element %zu of rank %d is %g",
                  it, i, r, (double)agbig_out[(size_t)r * big + i]);
          r = mt_size;
        }
      }
    }
    size_t first = 0, mine = hora_reducescatter_block(n, ROWS, mt_size, mt_rank);
    for (int r = 0; r < mt_rank; r++) {
      first += hora_reducescatter_block(n, ROWS, mt_size, r);
    }
    for (size_t i = 0; i < mine; i++) {
      double sum = 0;
      for (int r = 0; r < mt_size; r++) {
        sum += 0.5 * (r + (int)(first + i) + it);
      }
      double want = 4.0 * sum / mt_size;
      if (fabs(rs_out[i] - want) > 1e-4 * fabs(want) + 1e-6) {
        mt_fail(__FILE__, __LINE__, "iteration %d: reducescatter element %zu is %g, expected %g",
                it, first + i, (double)rs_out[i], want);
        break;
      }
    }
  }
  free(ag_out);
  free(agf_out);
  free(agbig);
  free(agbig_out);
  MT_OK(hora_get_stats(&s1));
  uint64_t eager = s1.eager_collectives - s0.eager_collectives;
  uint64_t want = eager_on ? (uint64_t)(ITERS - 1) * NSMALL : 0;
  if (eager != want) {
    mt_fail(__FILE__, __LINE__, "%llu broadcasts, allgathers and reducescatters travelled with "
            "their cycle, expected %llu (the first of each name goes through rank 0, the big "
            "allgather never)", (unsigned long long)eager, (unsigned long long)want);
  }
}

/* Every rank chooses by rank 0's cost model (with HORA_COST_MODEL=calibrate
 * its measurement, which no other rank could repeat to the bit): each
 * kind's pick and predicted seconds at a few sizes are the same on every
 * rank. */
static void every_rank_predicts_alike(void) {
  static const char *const kinds[] = {"allreduce", "broadcast", "allgather", "reducescatter"};
  static const size_t sizes[] = {8, 65536, (size_t)4 << 20};
  enum { N = 4 * 3 };
  struct {
    double seconds[N];
    char names[N][24];
  } mine, *all = calloc((size_t)mt_size, sizeof(mine));
  memset(&mine, 0, sizeof(mine));
  for (int k = 0; k < 4; k++) {
    for (int j = 0; j < 3; j++) {
      const char *name = "";
      double t = -1;
      MT_OK(hora_collective_algorithm(kinds[k], sizes[j], &name, &t));
      MT_CHECK(mt_size == 1 || (t > 0 && t < 1e3), "%s of %zu bytes: predicted %g s", kinds[k],
               sizes[j], t);
      mine.seconds[k * 3 + j] = t;
      snprintf(mine.names[k * 3 + j], sizeof(mine.names[0]), "%s", name);
    }
  }
  mt_allgather(&mine, sizeof(mine), all);
  for (int r = 1; r < mt_size; r++) {
    for (int i = 0; i < N; i++) {
      if (all[r].seconds[i] != all[0].seconds[i] || strcmp(all[r].names[i], all[0].names[i])) {
        mt_fail(__FILE__, __LINE__, "%s of %zu bytes: rank %d picks %s (%.9g s), rank 0 %s (%.9g s)",
                kinds[i / 3], sizes[i % 3], r, all[r].names[i], all[r].seconds[i],
                all[0].names[i], all[0].seconds[i]);
        r = mt_size;
        break;
      }
    }
  }
  free(all);
}

/* A whole operation's prediction: a small allreduce travels with the
 * cycle ("eager", unless HORA_EAGER_THRESHOLD=0 or one rank), a large one
 * runs the chosen algorithm after the cycle and costs more than the
 * algorithm alone by at least the runtime's cost per operation
 * (HORA_COST_MODEL's fourth number, where the testlist sets one). */
static void predict_operation(void) {
  const char *model = getenv("HORA_COST_MODEL");
  bool eager_on = eager_expected();
  double op = 0, v[4];
  if (model && sscanf(model, "%lf,%lf,%lf,%lf", &v[0], &v[1], &v[2], &v[3]) == 4) {
    op = v[3] * 1e-6;
  }
  const char *name = NULL, *algo = NULL;
  double t = -1, ta = -1;
  MT_OK(hora_predict_operation("allreduce", 64, &name, &t));
  MT_CHECK((strcmp(name, "eager") == 0) == eager_on, "a 64-byte allreduce: %s, expected %s", name,
           eager_on ? "eager" : "an algorithm");
  MT_CHECK(t >= op && t < 1, "a 64-byte allreduce: predicted %g s", t);
  MT_OK(hora_predict_operation("allreduce", (size_t)1 << 20, &name, &t));
  MT_OK(hora_collective_algorithm("allreduce", (size_t)1 << 20, &algo, &ta));
  MT_CHECK(strcmp(name, algo) == 0, "a 1 MiB allreduce: %s, the algorithm %s", name, algo);
  MT_CHECK(mt_size == 1 ? t == ta : t >= ta + op && t > ta,
           "a 1 MiB allreduce: predicted %g s, its algorithm alone %g s, op %g s", t, ta, op);
  MT_OK(hora_predict_operation("broadcast", 64, &name, &t));
  MT_CHECK((strcmp(name, "eager") == 0) == eager_on, "a 64-byte broadcast: %s", name);
  /* An allgather's block of 8 KiB: eager only while the whole result fits. */
  MT_OK(hora_predict_operation("allgather", 8192, &name, &t));
  MT_CHECK((strcmp(name, "eager") == 0) == (eager_on && mt_size == 2), "an allgather of 8 KiB "
           "blocks at %d ranks: %s", mt_size, name);
  MT_CHECK(hora_predict_operation("alltoall", 64, &name, &t) == HORA_ERR_INVALID_ARG,
           "an unknown kind was accepted");
  MT_CHECK(hora_predict_operation("allreduce", 64, NULL, &t) == HORA_ERR_INVALID_ARG,
           "a NULL name was accepted");
}

/* What HORA_ALGORITHM_<KIND> forces is what runs: the selector falls back
 * to the cost model's pick, with a warning, where the algorithm cannot run
 * on the communicator, and a test of an algorithm that never ran would
 * prove nothing. With the argument `falls-back` the opposite is expected
 * (the hierarchical ones on one host). */
static bool expect_fallback;

static void forced_ones_run(void) {
  static const char *const kinds[] = {"allreduce", "broadcast", "allgather", "reducescatter"};
  static const char *const vars[] = {"HORA_ALGORITHM_ALLREDUCE", "HORA_ALGORITHM_BROADCAST",
                                     "HORA_ALGORITHM_ALLGATHER", "HORA_ALGORITHM_REDUCESCATTER"};
  for (int k = 0; k < 4; k++) {
    const char *forced = getenv(vars[k]);
    if (!forced || strcmp(forced, "auto") == 0) {
      continue;
    }
    static const size_t sizes[] = {8, (size_t)1 << 20};
    for (int j = 0; j < 2; j++) {
      const char *name = "";
      double t = -1;
      MT_OK(hora_collective_algorithm(kinds[k], sizes[j], &name, &t));
      if (expect_fallback) {
        MT_CHECK(strcmp(name, forced) != 0, "%s=%s: ran, where it should have fallen back", vars[k],
                 forced);
      } else {
        MT_CHECK(strcmp(name, forced) == 0, "%s=%s: %s runs for %zu bytes instead", vars[k], forced,
                 name, sizes[j]);
      }
    }
  }
}

int main(int argc, char **argv) {
  mt_setenv_args(argc, argv);
  for (int i = 1; i < argc; i++) {
    expect_fallback |= strcmp(argv[i], "falls-back") == 0;
  }
  mt_init();
  mt_run("algorithms/allreduce_float_sum_every_count", allreduce_float_sum);
  mt_run("algorithms/allreduce_int_max_double_min", allreduce_int_max_double_min);
  mt_run("algorithms/allreduce_fused", allreduce_fused);
  mt_run("algorithms/allreduce_fp16_wire_same_bits", allreduce_compressed);
  mt_run("algorithms/broadcast_from_roots", broadcast_from_roots);
  mt_run("algorithms/broadcast_fused", broadcast_fused);
  mt_run("algorithms/allgather", allgather_blocks);
  mt_run("algorithms/allgather_bytes", allgather_bytes);
  mt_run("algorithms/reducescatter", reducescatter_blocks);
  mt_run("algorithms/reducescatter_rows_counts_ops", reducescatter_rows_counts_ops);
  mt_run("algorithms/with_a_joined_rank", with_a_joined_rank);
  mt_run("algorithms/in_a_process_set", in_a_process_set);
  mt_run("algorithms/allreduce_eager", allreduce_eager);
  mt_run("algorithms/eager_collectives", eager_collectives);
  mt_run("algorithms/predict_operation", predict_operation);
  mt_run("algorithms/every_rank_predicts_alike", every_rank_predicts_alike);
  mt_run("algorithms/forced_ones_run", forced_ones_run);
  int failures = mt_total_failures();
  MT_OK(hora_finalize());
  return failures ? 1 : 0;
}
