/* Tensor shapes: ranks that agree on a name's element count but not on
 * its shape get HORA_ERR_MISMATCH naming both shapes, on every rank, for
 * allreduce and broadcast (the whole shape) and allgather (every dimension
 * but the first); also once the name is in the response cache, and inside
 * a fused batch. Bad shapes fail at submission; callers compiled against
 * the options struct before it had a shape keep working; after every
 * failure the runtime still works. */
#include <stddef.h>

#include "mpitest.h"

static const int64_t flat[] = {17, 1311}, deep[] = {17, 23, 57}; /* 22287 elements each */
enum { N = 17 * 1311 };
static float x[N], y[N];

/* A plain allreduce still works and computes the right sum. */
static void still_works(const char *tag) {
  for (int i = 0; i < 64; i++) {
    x[i] = (float)(mt_rank + 1);
  }
  MT_OK(hora_allreduce("shape/after", x, y, 64, HORA_FLOAT32, HORA_SUM));
  float want = (float)(mt_size * (mt_size + 1) / 2);
  MT_CHECK(y[0] == want && y[63] == want, "after %s: %g, expected %g", tag, (double)y[0],
           (double)want);
}

static int allreduce_shaped(const char *name, size_t count, int ndims, const int64_t *dims) {
  hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
  o.ndims = ndims;
  o.dims = dims;
  hora_request *r = NULL;
  int rc = hora_allreduce_async_ex(name, x, y, count, HORA_FLOAT32, HORA_SUM, &o, &r);
  return rc == HORA_SUCCESS ? hora_wait(&r) : rc;
}

static int broadcast_shaped(const char *name, size_t count, int ndims, const int64_t *dims) {
  hora_op_options o = HORA_OP_OPTIONS_INIT;
  o.ndims = ndims;
  o.dims = dims;
  hora_request *r = NULL;
  int rc = hora_broadcast_async_ex(name, x, count, HORA_FLOAT32, 0, &o, &r);
  return rc == HORA_SUCCESS ? hora_wait(&r) : rc;
}

static int allgather_shaped(const char *name, size_t count, int ndims, const int64_t *dims,
                            float *out) {
  hora_op_options o = HORA_OP_OPTIONS_INIT;
  o.ndims = ndims;
  o.dims = dims;
  hora_request *r = NULL;
  int rc = hora_allgather_async_ex(name, x, count, HORA_FLOAT32, out, &o, &r);
  return rc == HORA_SUCCESS ? hora_wait(&r) : rc;
}

/* The last rank disagrees; the message names rank 0's shape and its. */
static void allreduce_same_count_other_shape(void) {
  if (mt_size < 2) {
    return;
  }
  bool odd = mt_rank == mt_size - 1;
  char want[160];
  snprintf(want, sizeof(want),
           "allreduce 'shape/ar': rank 0 submitted shape [17, 1311], rank %d shape [17, 23, 57]",
           mt_size - 1);
  MT_FAILS(allreduce_shaped("shape/ar", N, odd ? 3 : 2, odd ? deep : flat), HORA_ERR_MISMATCH, want);
  still_works("an allreduce shape mismatch");
  /* The reverse: rank 0 has the deeper shape. */
  snprintf(want, sizeof(want), "rank 0 submitted shape [17, 23, 57], rank 1 shape [17, 1311]");
  MT_FAILS(allreduce_shaped("shape/ar2", N, mt_rank == 0 ? 3 : 2, mt_rank == 0 ? deep : flat),
           HORA_ERR_MISMATCH, want);
  still_works("a second allreduce shape mismatch");
}

static void broadcast_same_count_other_shape(void) {
  if (mt_size < 2) {
    return;
  }
  bool odd = mt_rank == mt_size - 1;
  char want[160];
  snprintf(want, sizeof(want),
           "broadcast 'shape/bc': rank 0 submitted shape [17, 1311], rank %d shape [17, 23, 57]",
           mt_size - 1);
  MT_FAILS(broadcast_shaped("shape/bc", N, odd ? 3 : 2, odd ? deep : flat), HORA_ERR_MISMATCH, want);
  still_works("a broadcast shape mismatch");
}

/* No shape on one rank and a shape on another is a mismatch too. */
static void shape_against_none(void) {
  if (mt_size < 2) {
    return;
  }
  char want[160];
  snprintf(want, sizeof(want), "allreduce 'shape/none': rank 0 submitted no shape, rank 1 shape "
           "[17, 1311]");
  MT_FAILS(allreduce_shaped("shape/none", N, mt_rank == 0 ? -1 : 2, flat), HORA_ERR_MISMATCH, want);
  still_works("shape against none");
  /* A scalar (0 dimensions) is not a vector of one. */
  static const int64_t one[] = {1};
  MT_FAILS(allreduce_shaped("shape/scalar", 1, mt_rank == 0 ? 0 : 1, one), HORA_ERR_MISMATCH,
           "rank 0 submitted shape [], rank 1 shape [1]");
  still_works("a scalar against a vector");
}

/* Allgather compares every dimension but the first. */
static void allgather_tails(void) {
  float *out = malloc(sizeof(float) * 12 * (size_t)mt_size);
  for (int i = 0; i < 12; i++) {
    x[i] = (float)(mt_rank * 100 + i);
  }
  static const int64_t rows[] = {4, 3};
  MT_OK(allgather_shaped("shape/ag", 12, 2, rows, out));
  MT_CHECK(out[12 * (mt_size - 1) + 5] == (float)((mt_size - 1) * 100 + 5), "allgather result %g",
           (double)out[12 * (mt_size - 1) + 5]);
  /* Empty rows: the first dimension differs, the tails agree. */
  int64_t empty[] = {mt_rank + 1, 0};
  MT_OK(allgather_shaped("shape/ag0", 0, 2, empty, out));
  if (mt_size > 1) {
    static const int64_t other[] = {2, 6};
    bool odd = mt_rank == mt_size - 1;
    char want[160];
    snprintf(want, sizeof(want),
             "allgather 'shape/ag-bad': rank 0 submitted shape [4, 3], rank %d shape [2, 6]",
             mt_size - 1);
    MT_FAILS(allgather_shaped("shape/ag-bad", 12, 2, odd ? other : rows, out), HORA_ERR_MISMATCH,
             want);
    still_works("an allgather shape mismatch");
    /* The same empty rows differ in the first dimension: for an allreduce
     * that is a mismatch. */
    MT_FAILS(allreduce_shaped("shape/ar0", 0, 2, empty), HORA_ERR_MISMATCH, "shape [1, 0], rank 1 shape [2, 0]");
    still_works("an empty allreduce shape mismatch");
  }
  free(out);
}

/* Equal shapes pass, also from the cache, and compute the right values. */
static void same_shapes_pass(void) {
  float *out = malloc(sizeof(float) * N * (size_t)mt_size);
  /* A name whose shape changes on every rank alike between steps. */
  for (int step = 0; step < 4; step++) {
    MT_OK(allreduce_shaped("shape/same", N, step % 2 ? 3 : 2, step % 2 ? deep : flat));
  }
  /* Each shape several times, so the later runs come from the cache. */
  for (int step = 0; step < 4; step++) {
    for (int i = 0; i < N; i++) {
      x[i] = (float)(mt_rank + step);
    }
    MT_OK(allreduce_shaped("shape/same-ar", N, 3, deep));
    float want = (float)(mt_size * step + mt_size * (mt_size - 1) / 2);
    MT_CHECK(y[0] == want && y[N - 1] == want, "step %d: %g, expected %g", step, (double)y[0],
             (double)want);
    MT_OK(broadcast_shaped("shape/same-bc", N, 2, flat));
    MT_CHECK(x[N - 1] == (float)step, "broadcast step %d: %g", step, (double)x[N - 1]);
    MT_OK(allgather_shaped("shape/same-ag", N, 3, deep, out));
  }
  /* A scalar. */
  x[0] = 2;
  MT_OK(allreduce_shaped("shape/scalar-ok", 1, 0, NULL));
  MT_CHECK(y[0] == (float)(2 * mt_size), "scalar: %g", (double)y[0]);
  free(out);
}

/* A name that ran several times (so it is in the response cache) and then
 * changes its shape on one rank is caught, and named; the old shape works
 * again after. Also a cached name without a shape that gets one. */
static void cached_then_reshaped(void) {
  if (mt_size < 2) {
    return;
  }
  hora_stats before = {.struct_size = sizeof(before)}, after = {.struct_size = sizeof(after)};
  for (int step = 0; step < 4; step++) {
    MT_OK(allreduce_shaped("shape/cached", N, 2, flat));
    MT_OK(allreduce_shaped("shape/cached-none", N, -1, NULL));
    MT_OK(broadcast_shaped("shape/cached-bc", N, 2, flat));
  }
  MT_OK(hora_get_stats(&before));
  MT_OK(allreduce_shaped("shape/cached", N, 2, flat));
  MT_OK(hora_get_stats(&after));
  const char *cap = getenv("HORA_CACHE_CAPACITY");
  if (!cap || atoi(cap) > 8) {
    MT_CHECK(after.cache_hits > before.cache_hits, "shape/cached did not run from the cache");
  }
  bool odd = mt_rank == mt_size - 1;
  char want[160];
  snprintf(want, sizeof(want),
           "allreduce 'shape/cached': rank 0 submitted shape [17, 1311], rank %d shape [17, 23, 57]",
           mt_size - 1);
  MT_FAILS(allreduce_shaped("shape/cached", N, odd ? 3 : 2, odd ? deep : flat), HORA_ERR_MISMATCH,
           want);
  still_works("a cached shape change");
  MT_OK(allreduce_shaped("shape/cached", N, 2, flat));
  snprintf(want, sizeof(want), "rank 0 submitted no shape, rank %d shape [17, 1311]", mt_size - 1);
  MT_FAILS(allreduce_shaped("shape/cached-none", N, odd ? 2 : -1, flat), HORA_ERR_MISMATCH, want);
  still_works("a cached name given a shape");
  snprintf(want, sizeof(want),
           "broadcast 'shape/cached-bc': rank 0 submitted shape [17, 1311], rank %d shape "
           "[17, 23, 57]",
           mt_size - 1);
  MT_FAILS(broadcast_shaped("shape/cached-bc", N, odd ? 3 : 2, odd ? deep : flat),
           HORA_ERR_MISMATCH, want);
  still_works("a cached broadcast shape change");
  for (int step = 0; step < 2; step++) {
    MT_OK(allreduce_shaped("shape/cached", N, 2, flat));
    MT_OK(allreduce_shaped("shape/cached-none", N, -1, NULL));
    MT_OK(broadcast_shaped("shape/cached-bc", N, 2, flat));
  }
}

/* Many small tensors submitted together travel fused; each keeps its own
 * shape, and one of them changing its shape fails alone. */
static void fused_batch(void) {
  enum { T = 24 };
  static float b[T][12];
  static const int64_t shapes[3][2] = {{3, 4}, {2, 6}, {12, 1}};
  hora_request *r[T];
  for (int step = 0; step < 5; step++) {
    bool change = step == 3 && mt_size > 1; /* the last rank reshapes tensor 7 */
    for (int k = 0; k < T; k++) {
      for (int i = 0; i < 12; i++) {
        b[k][i] = (float)(k + mt_rank);
      }
      hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
      o.ndims = 2;
      o.dims = shapes[k % 3];
      if (change && k == 7 && mt_rank == mt_size - 1) {
        o.dims = shapes[2];
      }
      char name[32];
      snprintf(name, sizeof(name), "shape/fused.%d", k);
      MT_OK(hora_allreduce_async_ex(name, b[k], b[k], 12, HORA_FLOAT32, HORA_SUM, &o, &r[k]));
    }
    for (int k = 0; k < T; k++) {
      if (change && k == 7) {
        MT_FAILS(hora_wait(&r[k]), HORA_ERR_MISMATCH, "shape [2, 6], rank");
        continue;
      }
      MT_OK(hora_wait(&r[k]));
      float want = (float)(mt_size * k + mt_size * (mt_size - 1) / 2);
      MT_CHECK(b[k][11] == want, "step %d tensor %d: %g, expected %g", step, k, (double)b[k][11],
               (double)want);
    }
  }
  still_works("a fused batch");
}

/* Shapes that do not describe count elements fail at submission. */
static void bad_shapes(void) {
  static const int64_t neg[] = {-17, -1311}, many[33] = {1};
  static const int64_t big[] = {INT64_MAX, INT64_MAX, 4};
  hora_request *r = NULL;
  MT_FAILS(allreduce_shaped("shape/bad", N + 1, 2, flat), HORA_ERR_INVALID_ARG,
           "shape [17, 1311] holds 22287 elements, but count is 22288");
  MT_FAILS(allreduce_shaped("shape/bad", N, 2, neg), HORA_ERR_INVALID_ARG, "dimension 0 is -17");
  MT_FAILS(allreduce_shaped("shape/bad", 1, 33, many), HORA_ERR_INVALID_ARG,
           "ndims is 33; a shape has -1 (none) to 32 dimensions");
  MT_FAILS(allreduce_shaped("shape/bad", 1, -2, NULL), HORA_ERR_INVALID_ARG, "ndims is -2");
  MT_FAILS(allreduce_shaped("shape/bad", 4, 2, NULL), HORA_ERR_INVALID_ARG, "dims is NULL");
  MT_FAILS(allreduce_shaped("shape/bad", 0, 3, big), HORA_ERR_INVALID_ARG, "holds more than");
  MT_FAILS(allreduce_shaped("shape/bad", 2, 0, NULL), HORA_ERR_INVALID_ARG,
           "shape [] holds 1 elements, but count is 2");
  MT_FAILS(broadcast_shaped("shape/bad", N, 2, neg), HORA_ERR_INVALID_ARG, "hora_broadcast_async");
  MT_FAILS(allgather_shaped("shape/bad", 7, 2, flat, y), HORA_ERR_INVALID_ARG,
           "hora_allgather_async");
  /* struct_size too small or absurd. */
  hora_op_options o = {.struct_size = 3, .ndims = -1};
  MT_FAILS(hora_broadcast_async_ex("shape/bad", x, 4, HORA_FLOAT32, 0, &o, &r),
           HORA_ERR_INVALID_ARG, "struct_size");
  MT_CHECK(r == NULL, "a failed submission left a request");
  /* A NULL options pointer is the defaults. */
  MT_OK(hora_broadcast_async_ex("shape/nullopts", x, 4, HORA_FLOAT32, 0, NULL, &r));
  MT_OK(hora_wait(&r));
  MT_OK(hora_allgather_async_ex("shape/nullopts-ag", x, 4, HORA_FLOAT32, y, NULL, &r));
  MT_OK(hora_wait(&r));
  still_works("bad shapes");
}

/* A caller built against hora_allreduce_options before it had a shape:
 * its struct ends after `compression` (with the padding the compiler put
 * there, which the new `ndims` now overlaps). */
struct old_allreduce_options {
  size_t struct_size;
  double prescale, postscale;
  int compression;
};

static void old_options_struct(void) {
  for (int i = 0; i < 8; i++) {
    x[i] = 1;
  }
  hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
  o.struct_size = offsetof(hora_allreduce_options, ndims);
  o.ndims = 5; /* beyond struct_size: never read */
  o.dims = flat;
  o.postscale = 2.0;
  hora_request *r = NULL;
  MT_OK(hora_allreduce_async_ex("shape/old", x, y, 8, HORA_FLOAT32, HORA_SUM, &o, &r));
  MT_OK(hora_wait(&r));
  MT_CHECK(y[7] == (float)(2 * mt_size), "old struct: %g, expected %d", (double)y[7], 2 * mt_size);
  union {
    struct old_allreduce_options s;
    hora_allreduce_options pad; /* so that the call may read as far as it likes */
  } u;
  memset(&u, 0x7f, sizeof(u)); /* garbage in the old struct's padding */
  u.s.struct_size = sizeof(struct old_allreduce_options);
  u.s.prescale = 1.0;
  u.s.postscale = 3.0;
  u.s.compression = HORA_COMPRESSION_NONE;
  MT_OK(hora_allreduce_async_ex("shape/old", x, y, 8, HORA_FLOAT32, HORA_SUM,
                                (const hora_allreduce_options *)&u, &r));
  MT_OK(hora_wait(&r));
  MT_CHECK(y[7] == (float)(3 * mt_size), "old struct with padding: %g, expected %d", (double)y[7],
           3 * mt_size);
  /* An old caller on one rank and a new one without a shape agree. */
  hora_allreduce_options n = HORA_ALLREDUCE_OPTIONS_INIT;
  n.postscale = 3.0;
  MT_OK(hora_allreduce_async_ex("shape/old", x, y, 8, HORA_FLOAT32, HORA_SUM,
                                mt_rank % 2 ? (const hora_allreduce_options *)&u : &n, &r));
  MT_OK(hora_wait(&r));
  still_works("old options");
}

int main(int argc, char **argv) {
  mt_setenv_args(argc, argv);
  mt_init();
  mt_run("shapes/bad_shapes_fail_at_submission", bad_shapes);
  mt_run("shapes/old_options_struct", old_options_struct);
  mt_run("shapes/same_shapes_pass", same_shapes_pass);
  mt_run("shapes/allreduce_same_count_other_shape", allreduce_same_count_other_shape);
  mt_run("shapes/broadcast_same_count_other_shape", broadcast_same_count_other_shape);
  mt_run("shapes/shape_against_none", shape_against_none);
  mt_run("shapes/allgather_compares_all_but_first", allgather_tails);
  mt_run("shapes/cached_then_reshaped", cached_then_reshaped);
  mt_run("shapes/fused_batch", fused_batch);
  int failures = mt_total_failures();
  MT_OK(hora_finalize());
  return failures ? 1 : 0;
}
