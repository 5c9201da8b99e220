/* Collectives end to end: every dtype x op for allreduce, in place and not,
 * counts from 1 to several MiB; int16 wraparound and scaling, and bool's
 * refusals; broadcast from every root; allgather; barrier; unnamed
 * operations; names submitted in different orders; and hora_test polling.
 * Expected values are exact by construction (small integers), computed
 * here independently of the library. */
#include <math.h>
#include <unistd.h>

#include "comm/reduce/half.h"
#include "mpitest.h"

/* Bool bytes by element class (i % 4): false everywhere; true everywhere;
 * true on one rank only; false on one rank only, so that both OR and AND
 * give both answers at any rank count. True is any nonzero byte. */
static double bool_value(int rank, size_t i) {
  int odd_one = (int)((i / 4) % (size_t)mt_size);
  size_t cls = i % 4;
  bool t = cls == 1 || (cls == 2 && rank == odd_one) || (cls == 3 && rank != odd_one);
  return t ? (double)(1 + ((size_t)rank * 37 + i) % 255) : 0;
}

/* Small integers, chosen per op so every result is exact in every dtype
 * (bf16 holds integers exactly up to 256). */
static double value(int op, hora_dtype dt, int rank, size_t i) {
  bool unsig = dt == HORA_UINT8;
  if (dt == HORA_BOOL) {
    return bool_value(rank, i);
  }
  switch (op) {
    case HORA_SUM:
    case HORA_AVERAGE: {
      int v = (int)((rank * 7 + i * 3) % 11);
      return unsig ? v : v - 5;
    }
    case HORA_MIN:
    case HORA_MAX: {
      int v = (int)((rank * 13 + i * 5) % 23);
      return unsig ? v : v - 11;
    }
    default: {
      if ((rank + i) % 7 == 0) {
        return 2;
      }
      return !unsig && (rank * 3 + i) % 5 == 0 ? -1 : 1;
    }
  }
}

static void store(hora_dtype dt, void *p, size_t i, double v) {
  switch (dt) {
    case HORA_UINT8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case HORA_INT8: ((int8_t *)p)[i] = (int8_t)v; break;
    case HORA_INT16: ((int16_t *)p)[i] = (int16_t)v; break;
    case HORA_BOOL: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case HORA_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
    case HORA_INT64: ((int64_t *)p)[i] = (int64_t)v; break;
    case HORA_FLOAT16: ((uint16_t *)p)[i] = hora__f32_to_f16((float)v); break;
    case HORA_BFLOAT16: ((uint16_t *)p)[i] = hora__f32_to_bf16((float)v); break;
    case HORA_FLOAT32: ((float *)p)[i] = (float)v; break;
    case HORA_FLOAT64: ((double *)p)[i] = v; break;
  }
}

/* The expected result, rounded the way the API defines it. */
static void expected(hora_dtype dt, int op, size_t i, int nranks, void *out) {
  if (dt == HORA_BOOL) {
    bool conj = op == HORA_MIN || op == HORA_PRODUCT, acc = conj;
    for (int r = 0; r < nranks; r++) {
      bool v = value(op, dt, r, i) != 0;
      acc = conj ? acc && v : acc || v;
    }
    ((uint8_t *)out)[0] = acc; /* 0 or 1, whatever the bytes were */
    return;
  }
  double acc = value(op, dt, 0, i);
  for (int r = 1; r < nranks; r++) {
    double v = value(op, dt, r, i);
    switch (op) {
      case HORA_SUM:
      case HORA_AVERAGE: acc += v; break;
      case HORA_MIN: acc = fmin(acc, v); break;
      case HORA_MAX: acc = fmax(acc, v); break;
      default: acc *= v; break;
    }
  }
  if (op == HORA_AVERAGE) {
    /* Horovod's: one multiplication by 1/size (float types by it in float). */
    double f = 1.0 / nranks;
    switch (dt) {
      case HORA_FLOAT16: ((uint16_t *)out)[0] = hora__f32_to_f16((float)f * (float)acc); return;
      case HORA_BFLOAT16: ((uint16_t *)out)[0] = hora__f32_to_bf16((float)f * (float)acc); return;
      case HORA_FLOAT32: ((float *)out)[0] = (float)f * (float)acc; return;
      case HORA_FLOAT64: acc *= f; break;
      default: acc = trunc(acc * f); break;
    }
  }
  store(dt, out, 0, acc);
}

static const size_t counts[] = {1, 2, 3, 7, 16, 17, 1000, 65537};

static void allreduce_every_dtype_and_op(void) {
  for (int dt = HORA_UINT8; dt <= HORA_BOOL; dt++) {
    size_t es = hora_dtype_size((hora_dtype)dt);
    for (int op = HORA_SUM; op <= HORA_PRODUCT; op++) {
      if (dt == HORA_BOOL && op == HORA_AVERAGE) {
        continue; /* refused: bool_refusals */
      }
      for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        size_t n = counts[c];
        for (int in_place = 0; in_place < 2; in_place++) {
          uint8_t *send = malloc(n * es), *recv = malloc(n * es), *want = malloc(es);
          for (size_t i = 0; i < n; i++) {
            store((hora_dtype)dt, send, i, value(op, (hora_dtype)dt, mt_rank, i));
          }
          memset(recv, 0xcd, n * es);
          char name[96];
          snprintf(name, sizeof(name), "ar/%s/%s/%zu/%d", hora_dtype_name((hora_dtype)dt),
                   hora_op_name((hora_op)op), n, in_place);
          void *dst = in_place ? send : recv;
          MT_OK(hora_allreduce(name, send, dst, n, (hora_dtype)dt, (hora_op)op));
          int bad = 0;
          for (size_t i = 0; i < n && bad < 3; i++) {
            expected((hora_dtype)dt, op, i, mt_size, want);
            if (memcmp((uint8_t *)dst + i * es, want, es) != 0) {
              mt_fail(__FILE__, __LINE__, "%s: element %zu is wrong", name, i);
              bad++;
            }
          }
          free(send);
          free(recv);
          free(want);
        }
      }
    }
  }
}

/* Reducescatter: each rank's block of the reduction, by Horovod's split
 * (the first count % size ranks one element more), for every dtype and op,
 * counts below and above the rank count (blocks of zero elements too), in
 * place and not. */
static void reducescatter_every_dtype_and_op(void) {
  static const size_t rs_counts[] = {0, 1, 3, 17, 1000, 65537};
  for (int dt = HORA_UINT8; dt <= HORA_BOOL; dt++) {
    size_t es = hora_dtype_size((hora_dtype)dt);
    for (int op = HORA_SUM; op <= HORA_PRODUCT; op++) {
      if (dt == HORA_BOOL && op == HORA_AVERAGE) {
        continue;
      }
      for (size_t c = 0; c < sizeof(rs_counts) / sizeof(rs_counts[0]); c++) {
        size_t n = rs_counts[c];
        size_t mine = hora_reducescatter_block(n, 0, mt_size, mt_rank), start = 0;
        for (int r = 0; r < mt_rank; r++) {
          start += hora_reducescatter_block(n, 0, mt_size, r);
        }
        int in_place = c % 2;
        uint8_t *send = malloc(n * es + 1), *recv = malloc(mine * es + 1), *want = malloc(es);
        for (size_t i = 0; i < n; i++) {
          store((hora_dtype)dt, send, i, value(op, (hora_dtype)dt, mt_rank, i));
        }
        char name[96];
        snprintf(name, sizeof(name), "rs/%s/%s/%zu", hora_dtype_name((hora_dtype)dt),
                 hora_op_name((hora_op)op), n);
        void *dst = in_place ? send : recv;
        MT_OK(hora_reducescatter(name, send, dst, n, (hora_dtype)dt, (hora_op)op));
        int bad = 0;
        for (size_t i = 0; i < mine && bad < 3; i++) {
          expected((hora_dtype)dt, op, start + i, mt_size, want);
          if (memcmp((uint8_t *)dst + i * es, want, es) != 0) {
            mt_fail(__FILE__, __LINE__, "%s: element %zu of the block (%zu of the whole) is wrong",
                    name, i, start + i);
            bad++;
          }
        }
        free(send);
        free(recv);
        free(want);
      }
    }
  }
}

/* With a shape, the split is by rows; scales, AVERAGE and fp16 on the wire
 * as for allreduce; ranks that disagree get HORA_ERR_MISMATCH. */
static void reducescatter_rows_scales_and_mismatch(void) {
  enum { COLS = 5 };
  int64_t rows = mt_size + 3;
  size_t n = (size_t)rows * COLS;
  size_t mine = hora_reducescatter_block(n, (size_t)rows, mt_size, mt_rank);
  size_t first_row = 0;
  for (int r = 0; r < mt_rank; r++) {
    first_row += hora_reducescatter_block(n, (size_t)rows, mt_size, r) / COLS;
  }
  MT_CHECK(mine % COLS == 0, "a block of %zu elements is not whole rows of %d", mine, COLS);
  float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) {
    x[i] = (float)(mt_rank + 1) * (float)(i % 7);
  }
  hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
  int64_t dims[2] = {rows, COLS};
  o.ndims = 2;
  o.dims = dims;
  o.prescale = 2.0;
  o.postscale = 0.5;
  o.compression = HORA_COMPRESSION_FP16;
  hora_request *r;
  MT_OK(hora_reducescatter_async_ex("rs/rows", x, y, n, HORA_FLOAT32, HORA_AVERAGE, &o, &r));
  MT_OK(hora_wait(&r));
  float ranks_sum = (float)(mt_size * (mt_size + 1) / 2);
  for (size_t i = 0; i < mine; i++) {
    size_t g = first_row * COLS + i;
    float want = ranks_sum * (float)(g % 7) * 2.0f / (float)mt_size * 0.5f;
    if (fabsf(y[i] - want) > 1e-2f * fabsf(want) + 1e-3f) {
      mt_fail(__FILE__, __LINE__, "rs/rows: element %zu is %g, expected %g", g, (double)y[i],
              (double)want);
      break;
    }
  }
  if (mt_size > 1) {
    MT_OK(hora_reducescatter_async("rs/mismatch", x, y, mt_rank == 0 ? n : n - 1, HORA_FLOAT32,
                                   HORA_SUM, &r));
    MT_FAILS(hora_wait(&r), HORA_ERR_MISMATCH, "reducescatter 'rs/mismatch': rank 0 sent");
  }
  MT_CHECK(hora_reducescatter_block(10, 3, 2, 0) == 0, "10 elements in 3 rows split");
  /* A shape with a zero dimension: nothing to split, nothing to receive. */
  int64_t empty_dims[2] = {3, 0};
  hora_allreduce_options eo = HORA_ALLREDUCE_OPTIONS_INIT;
  eo.ndims = 2;
  eo.dims = empty_dims;
  MT_OK(hora_reducescatter_async_ex("rs/empty", NULL, NULL, 0, HORA_FLOAT32, HORA_SUM, &eo, &r));
  MT_OK(hora_wait(&r));
  MT_CHECK(hora_reducescatter_block(0, 3, 2, 1) == 0, "no elements in 3 rows");
  MT_CHECK(hora_reducescatter_block(10, 0, 4, 1) == 3 && hora_reducescatter_block(10, 0, 4, 2) == 2,
           "10 elements over 4 ranks: 3,3,2,2");
  free(x);
  free(y);
}

static void allreduce_large(void) {
  /* Several MiB, crossing many pipeline chunks, float32 and int8. */
  const size_t n = (size_t)3 << 19; /* 1.5 Mi elements = 6 MiB of float32 */
  float *f = malloc(n * sizeof(float));
  int8_t *c = malloc(n);
  for (size_t i = 0; i < n; i++) {
    f[i] = (float)((mt_rank + i) % 100);
    c[i] = (int8_t)((mt_rank * 3 + i) % 5);
  }
  hora_request *r1, *r2;
  MT_OK(hora_allreduce_async("big/f32", f, f, n, HORA_FLOAT32, HORA_SUM, &r1));
  MT_OK(hora_allreduce_async("big/i8", c, c, n, HORA_INT8, HORA_MAX, &r2));
  MT_OK(hora_wait(&r2));
  MT_OK(hora_wait(&r1));
  MT_CHECK(r1 == NULL && r2 == NULL, "hora_wait did not clear the request pointer");
  int bad = 0;
  for (size_t i = 0; i < n && bad < 3; i++) {
    double s = 0;
    int m = 0;
    for (int r = 0; r < mt_size; r++) {
      s += (double)((r + i) % 100);
      m = (int)((r * 3 + i) % 5) > m ? (int)((r * 3 + i) % 5) : m;
    }
    if (f[i] != (float)s || c[i] != m) {
      mt_fail(__FILE__, __LINE__, "large allreduce element %zu: %g/%d, expected %g/%d", i,
              (double)f[i], c[i], s, m);
      bad++;
    }
  }
  free(f);
  free(c);
}

/* int16 beyond small values: sums and products wrap, MIN and MAX reach the
 * extremes, AVERAGE and the scales truncate toward zero. Fused:
 * all in flight at once. */
static void int16_wraps_and_scales(void) {
  enum { K = 6 };
  int16_t x[K][2], want[K][2];
  uint32_t sum = 0, prod = 1;
  for (int r = 0; r < mt_size; r++) {
    sum += (uint32_t)(30000 + r);
    prod *= 300u;
  }
  uint16_t us = (uint16_t)sum, up = (uint16_t)prod;
  memcpy(&want[0][0], &us, 2); /* two's complement, as the library wraps */
  memcpy(&want[1][0], &up, 2);
  want[0][1] = (int16_t)(-mt_size);
  want[1][1] = -1; /* -1 on rank 0, 1 elsewhere */
  bool one = mt_rank == 0, alone = mt_size == 1;
  /* SUM, PRODUCT, MIN, MAX, AVERAGE, and SUM with prescale 0.5 and
   * postscale 1.5 (each truncating toward zero). */
  const int16_t mine[K][2] = {
      {(int16_t)(30000 + mt_rank), -1},
      {300, (int16_t)(one ? -1 : 1)},
      {(int16_t)(one ? INT16_MIN : 2), (int16_t)(one ? INT16_MAX : 1)},
      {(int16_t)(one ? INT16_MIN : 2), (int16_t)(one ? INT16_MAX : 1)},
      {(int16_t)(one ? -3 : 0), 7},
      {3, -3},
  };
  memcpy(x, mine, sizeof(x));
  want[2][0] = INT16_MIN;
  want[2][1] = (int16_t)(alone ? INT16_MAX : 1);
  want[3][0] = (int16_t)(alone ? INT16_MIN : 2);
  want[3][1] = INT16_MAX;
  want[4][0] = (int16_t)(-3 / mt_size); /* toward zero */
  want[4][1] = 7;
  /* 3 * 0.5 and -3 * 0.5 truncate to 1 and -1 per rank, as Horovod's. */
  want[5][0] = (int16_t)trunc(1.5 * mt_size);
  want[5][1] = (int16_t)trunc(-1.5 * mt_size);
  hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
  o.prescale = 0.5;
  o.postscale = 1.5;
  hora_request *r[K];
  MT_OK(hora_allreduce_async("i16/sum", x[0], x[0], 2, HORA_INT16, HORA_SUM, &r[0]));
  MT_OK(hora_allreduce_async("i16/prod", x[1], x[1], 2, HORA_INT16, HORA_PRODUCT, &r[1]));
  MT_OK(hora_allreduce_async("i16/min", x[2], x[2], 2, HORA_INT16, HORA_MIN, &r[2]));
  MT_OK(hora_allreduce_async("i16/max", x[3], x[3], 2, HORA_INT16, HORA_MAX, &r[3]));
  MT_OK(hora_allreduce_async("i16/avg", x[4], x[4], 2, HORA_INT16, HORA_AVERAGE, &r[4]));
  MT_OK(hora_allreduce_async_ex("i16/scaled", x[5], x[5], 2, HORA_INT16, HORA_SUM, &o, &r[5]));
  for (int k = 0; k < K; k++) {
    MT_OK(hora_wait(&r[k]));
    MT_CHECK(x[k][0] == want[k][0] && x[k][1] == want[k][1], "int16 case %d: %d %d, expected %d %d",
             k, x[k][0], x[k][1], want[k][0], want[k][1]);
  }
}

/* Bool has no AVERAGE and no scaling: refused on every rank at submission,
 * naming the tensor, and nothing of the refused calls is left behind (the
 * same names and the next unnamed operation work afterwards). */
static void bool_refusals(void) {
  uint8_t b[4] = {0, 2, (uint8_t)(mt_rank == 0 ? 5 : 0), 0}, out[4];
  hora_request *r = (hora_request *)b; /* must come back NULL */
  MT_FAILS(hora_allreduce("mask/avg", b, out, 4, HORA_BOOL, HORA_AVERAGE), HORA_ERR_INVALID_ARG,
           "'mask/avg': AVERAGE of bool");
  MT_FAILS(hora_allreduce_async("mask/avg", b, out, 4, HORA_BOOL, HORA_AVERAGE, &r),
           HORA_ERR_INVALID_ARG, "AVERAGE of bool");
  MT_CHECK(r == NULL, "*req not cleared by a refused call");
  MT_FAILS(hora_allreduce(NULL, b, b, 4, HORA_BOOL, HORA_AVERAGE), HORA_ERR_INVALID_ARG, "(unnamed)");
  hora_allreduce_options o = HORA_ALLREDUCE_OPTIONS_INIT;
  o.prescale = 2.0;
  MT_FAILS(hora_allreduce_async_ex("mask/pre", b, out, 4, HORA_BOOL, HORA_SUM, &o, &r),
           HORA_ERR_INVALID_ARG, "'mask/pre': bool cannot be scaled (prescale 2");
  o.prescale = 1.0;
  o.postscale = 0.5;
  MT_FAILS(hora_allreduce_async_ex("mask/pre", b, out, 4, HORA_BOOL, HORA_MAX, &o, &r),
           HORA_ERR_INVALID_ARG, "postscale 0.5");
  MT_CHECK(r == NULL, "*req not cleared by a refused call");
  /* Scales of exactly 1 are no scaling. */
  o.postscale = 1.0;
  MT_OK(hora_allreduce_async_ex("mask/pre", b, out, 4, HORA_BOOL, HORA_PRODUCT, &o, &r));
  MT_OK(hora_wait(&r));
  MT_CHECK(out[0] == 0 && out[1] == 1 && out[2] == (mt_size == 1) && out[3] == 0,
           "bool AND after refusals: %d %d %d %d", out[0], out[1], out[2], out[3]);
  MT_OK(hora_allreduce("mask/avg", b, out, 4, HORA_BOOL, HORA_SUM));
  MT_CHECK(out[0] == 0 && out[1] == 1 && out[2] == 1 && out[3] == 0,
           "bool OR after refusals: %d %d %d %d", out[0], out[1], out[2], out[3]);
  int32_t v = mt_rank + 1, total = 0;
  MT_OK(hora_allreduce(NULL, &v, &total, 1, HORA_INT32, HORA_SUM));
  MT_CHECK(total == mt_size * (mt_size + 1) / 2, "unnamed allreduce after refusals: %d", total);
}

static void allreduce_zero_count(void) {
  MT_OK(hora_allreduce("empty", NULL, NULL, 0, HORA_FLOAT32, HORA_SUM));
  MT_OK(hora_broadcast("empty-bcast", NULL, 0, HORA_INT32, 0));
  MT_OK(hora_allgather("empty-gather", NULL, 0, HORA_INT64, NULL));
}

static void broadcast_from_every_root(void) {
  const size_t sizes[] = {1, 1000, 300001};
  for (int root = 0; root < mt_size; root++) {
    for (size_t s = 0; s < 9; s++) {
      /* A rotating dtype at each size, and int16 and bool (bytes as they
       * are: a broadcast bool keeps its 0x80) at each size too. */
      hora_dtype dt = s < 3 ? (hora_dtype)((root + (int)s) % (HORA_BOOL + 1))
                            : s < 6 ? HORA_INT16 : HORA_BOOL;
      size_t es = hora_dtype_size(dt), n = sizes[s % 3];
      uint8_t *buf = malloc(n * es);
      for (size_t b = 0; b < n * es; b++) {
        buf[b] = mt_rank == root ? (uint8_t)mt_hash(b * 31 + (size_t)root) : 0xee;
      }
      char name[64];
      snprintf(name, sizeof(name), "bcast/%d/%zu/%s", root, n, hora_dtype_name(dt));
      MT_OK(hora_broadcast(name, buf, n, dt, root));
      for (size_t b = 0; b < n * es; b++) {
        if (buf[b] != (uint8_t)mt_hash(b * 31 + (size_t)root)) {
          mt_fail(__FILE__, __LINE__, "%s: byte %zu differs from the root's", name, b);
          break;
        }
      }
      free(buf);
    }
  }
}

/* Rank r's byte b of an allgather block. */
static uint8_t gather_byte(int r, size_t b) { return (uint8_t)mt_hash((uint64_t)r * 1000003 + b); }

static void allgather_blocks(void) {
  const size_t counts_ag[] = {1, 5, 100003};
  const hora_dtype dts[] = {HORA_INT32, HORA_INT16, HORA_BOOL}; /* bool: bytes as they are */
  for (size_t d = 0; d < 3; d++)
  for (size_t c = 0; c < 3; c++) {
    for (int in_place = 0; in_place < 2; in_place++) {
      size_t n = counts_ag[c], bytes = n * hora_dtype_size(dts[d]);
      uint8_t *recv = malloc(bytes * (size_t)mt_size);
      uint8_t *send = in_place ? recv + (size_t)mt_rank * bytes : malloc(bytes);
      memset(recv, 0xee, bytes * (size_t)mt_size);
      for (size_t b = 0; b < bytes; b++) {
        send[b] = gather_byte(mt_rank, b);
      }
      char name[64];
      snprintf(name, sizeof(name), "gather/%s/%zu/%d", hora_dtype_name(dts[d]), n, in_place);
      MT_OK(hora_allgather(name, send, n, dts[d], recv));
      for (int r = 0; r < mt_size; r++) {
        for (size_t b = 0; b < bytes; b++) {
          if (recv[(size_t)r * bytes + b] != gather_byte(r, b)) {
            mt_fail(__FILE__, __LINE__, "%s: rank %d's byte %zu is wrong", name, r, b);
            r = mt_size;
            break;
          }
        }
      }
      if (!in_place) {
        free(send);
      }
      free(recv);
    }
  }
}

static void barrier_waits_for_everyone(void) {
  for (int i = 0; i < 20; i++) {
    MT_OK(hora_barrier());
  }
  if (mt_size < 2) {
    return;
  }
  /* The last rank arrives 300 ms late; nobody may leave before it came. */
  double t0 = mt_wtime();
  if (mt_rank == mt_size - 1) {
    usleep(300000);
  }
  MT_OK(hora_barrier());
  double waited = mt_wtime() - t0;
  MT_CHECK(waited > 0.25, "rank %d left the barrier after %.3f s, before the late rank arrived",
           mt_rank, waited);
}

static void unnamed_in_order(void) {
  enum { N = 24 };
  int32_t bufs[N][5];
  hora_request *reqs[N];
  for (int k = 0; k < N; k++) {
    for (int i = 0; i < 5; i++) {
      bufs[k][i] = k * 100 + mt_rank + i;
    }
    if (k % 3 == 2) {
      MT_OK(hora_broadcast_async(NULL, bufs[k], 5, HORA_INT32, k % mt_size, &reqs[k]));
    } else {
      MT_OK(hora_allreduce_async(NULL, bufs[k], bufs[k], 5, HORA_INT32, HORA_SUM, &reqs[k]));
    }
  }
  for (int k = N - 1; k >= 0; k--) {
    MT_OK(hora_wait(&reqs[k]));
  }
  for (int k = 0; k < N; k++) {
    for (int i = 0; i < 5; i++) {
      int32_t want = k % 3 == 2 ? k * 100 + (k % mt_size) + i
                                : mt_size * (k * 100 + i) + mt_size * (mt_size - 1) / 2;
      MT_CHECK(bufs[k][i] == want, "unnamed op %d element %d: %d, expected %d", k, i, bufs[k][i],
               want);
    }
  }
}

static void names_in_different_orders(void) {
  enum { N = 64, LEN = 33 };
  float bufs[N][LEN];
  hora_request *reqs[N];
  int order[N];
  for (int k = 0; k < N; k++) {
    order[k] = k;
  }
  /* A different permutation on every rank. */
  uint64_t seed = 12345 + (uint64_t)mt_rank * 7919;
  for (int k = N - 1; k > 0; k--) {
    seed = mt_hash(seed + (uint64_t)k);
    int j = (int)(seed % (uint64_t)(k + 1));
    int t = order[k];
    order[k] = order[j];
    order[j] = t;
  }
  for (int idx = 0; idx < N; idx++) {
    int k = order[idx];
    for (int i = 0; i < LEN; i++) {
      bufs[k][i] = (float)(k + mt_rank * i);
    }
    char name[32];
    snprintf(name, sizeof(name), "grad.%d", k);
    MT_OK(hora_allreduce_async(name, bufs[k], bufs[k], LEN, HORA_FLOAT32, HORA_SUM, &reqs[k]));
  }
  for (int k = 0; k < N; k++) {
    MT_OK(hora_wait(&reqs[k]));
    for (int i = 0; i < LEN; i++) {
      float want = (float)(mt_size * k + i * mt_size * (mt_size - 1) / 2);
      MT_CHECK(bufs[k][i] == want, "grad.%d[%d] = %g, expected %g", k, i, (double)bufs[k][i],
               (double)want);
    }
  }
}

static void test_polls_to_completion(void) {
  double x[3] = {1, 2, 3};
  hora_request *r;
  MT_OK(hora_allreduce_async("polled", x, x, 3, HORA_FLOAT64, HORA_MAX, &r));
  int done = 0, rc = HORA_SUCCESS, polls = 0;
  while (!done && rc == HORA_SUCCESS) {
    rc = hora_test(&r, &done);
    if (!done) {
      polls++;
      usleep(100);
    }
  }
  MT_CHECK(rc == HORA_SUCCESS && done && r == NULL, "hora_test: rc %d done %d", rc, done);
  MT_CHECK(x[0] == 1 && x[2] == 3, "polled allreduce gave %g %g", x[0], x[2]);
}

/* hora's ranks against the launcher's (MPI's, or the file bookkeeping's
 * without MPI), and its hosts against the launcher's view of them. */
static void ranks_match_launcher(void) {
  MT_CHECK(hora_initialized() == 1, "hora_initialized() is not 1");
  MT_CHECK(hora_rank() == mt_rank && hora_size() == mt_size, "rank %d/%d vs the launcher's %d/%d",
           hora_rank(), hora_size(), mt_rank, mt_size);
  /* Started without MPI, hora never starts it. */
  const char *boot = hora_bootstrap(), *asked = getenv("HORA_BOOTSTRAP");
  int mpi_up = 0;
  MPI_Initialized(&mpi_up);
  if (mt_launched_by_mpi()) {
    MT_CHECK(boot && strcmp(boot, "mpi") == 0, "started by mpirun, bootstrap %s", boot);
  } else {
    MT_CHECK(boot && strcmp(boot, "mpi") != 0 && !mpi_up, "bootstrap %s, MPI initialised: %d",
             boot, mpi_up);
    MT_CHECK(!asked || strcmp(asked, "auto") == 0 || (boot && strcmp(asked, boot) == 0),
             "HORA_BOOTSTRAP=%s, but bootstrap %s", asked, boot);
  }
  int lr, ls, first;
  mt_host(&lr, &ls, &first);
  MT_CHECK(hora_local_rank() == lr && hora_local_size() == ls, "local %d/%d vs the launcher's %d/%d",
           hora_local_rank(), hora_local_size(), lr, ls);
  MT_CHECK(hora_cross_rank() >= 0 && hora_cross_rank() < hora_cross_size(),
           "cross rank %d of %d", hora_cross_rank(), hora_cross_size());
  /* Every rank of one host reports the same host index. */
  int mine[2] = {first, hora_cross_rank()};
  int *all = malloc(sizeof(mine) * (size_t)mt_size);
  mt_allgather(mine, sizeof(mine), all);
  for (int r = 0; r < mt_size; r++) {
    if (all[2 * r] == first && all[2 * r + 1] != mine[1]) {
      mt_fail(__FILE__, __LINE__, "ranks %d and %d of one host disagree on its index (%d vs %d)",
              mt_rank, r, mine[1], all[2 * r + 1]);
    }
  }
  free(all);
}

int main(int argc, char **argv) {
  mt_setenv_args(argc, argv);
  mt_init();
  mt_run("collectives/ranks_match_launcher", ranks_match_launcher);
  mt_run("collectives/allreduce_every_dtype_and_op", allreduce_every_dtype_and_op);
  mt_run("collectives/allreduce_large", allreduce_large);
  mt_run("collectives/reducescatter_every_dtype_and_op", reducescatter_every_dtype_and_op);
  mt_run("collectives/reducescatter_rows_scales_and_mismatch",
         reducescatter_rows_scales_and_mismatch);
  mt_run("collectives/int16_wraps_and_scales", int16_wraps_and_scales);
  mt_run("collectives/bool_refusals", bool_refusals);
  mt_run("collectives/zero_count", allreduce_zero_count);
  mt_run("collectives/broadcast_from_every_root", broadcast_from_every_root);
  mt_run("collectives/allgather", allgather_blocks);
  mt_run("collectives/barrier", barrier_waits_for_everyone);
  mt_run("collectives/unnamed_in_order", unnamed_in_order);
  mt_run("collectives/names_in_different_orders", names_in_different_orders);
  mt_run("collectives/test_polls_to_completion", test_polls_to_completion);
  int failures = mt_total_failures();
  int rc = hora_finalize();
  if (rc != HORA_SUCCESS) {
    fprintf(stderr, "hora_finalize: %s\n", hora_last_error());
    return 1;
  }
  return failures ? 1 : 0;
}
