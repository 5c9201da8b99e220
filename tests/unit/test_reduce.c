/* Reduction kernels and fp16/bf16 conversions against independent
 * references: every half pattern, the compiler's own _Float16 conversion,
 * the scalar reference kernel, and hand-picked edge values. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "comm/reduce/half.h"
#include "comm/reduce/reduce.h"
#include "../runner.h"

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

TEST(half_roundtrip_exhaustive) {
  for (uint32_t h = 0; h < 65536; h++) {
    float f = hora__f16_to_f32((uint16_t)h);
    uint16_t back = hora__f32_to_f16(f);
    bool nan = ((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff);
    if (nan) {
      ASSERT(isnan(f));
      ASSERT(((back >> 10) & 0x1f) == 0x1f && (back & 0x3ff));
    } else if (back != h) {
      FAIL("half 0x%04x -> %a -> 0x%04x", h, (double)f, back);
    }
  }
}

TEST(half_rounding) {
#ifdef __FLT16_MAX__
  /* The compiler's conversion (libgcc) is correctly rounded: compare with it
   * on random floats across the whole half range, subnormals included. */
  for (int i = 0; i < 2000000; i++) {
    uint32_t bits = (uint32_t)rnd();
    /* Bias towards exponents near the half range. */
    uint32_t exp = 96 + (uint32_t)(rnd() % 50);
    bits = (bits & 0x807fffffu) | (exp << 23);
    float f = hora__f32_from_bits(bits);
    _Float16 ref = (_Float16)f;
    uint16_t rbits;
    memcpy(&rbits, &ref, 2);
    uint16_t got = hora__f32_to_f16(f);
    if (got != rbits) {
      FAIL("float %a: got half 0x%04x, compiler says 0x%04x", (double)f, got, rbits);
    }
  }
#endif
  /* Hand-checked values: ties go to even, overflow to infinity. */
  ASSERT_EQ_INT(hora__f32_to_f16(1.0f), 0x3c00);
  ASSERT_EQ_INT(hora__f32_to_f16(65504.0f), 0x7bff);
  ASSERT_EQ_INT(hora__f32_to_f16(65519.0f), 0x7bff);
  ASSERT_EQ_INT(hora__f32_to_f16(65520.0f), 0x7c00);
  ASSERT_EQ_INT(hora__f32_to_f16(1e10f), 0x7c00);
  ASSERT_EQ_INT(hora__f32_to_f16(-INFINITY), 0xfc00);
  ASSERT_EQ_INT(hora__f32_to_f16(0x1p-24f), 0x0001);
  ASSERT_EQ_INT(hora__f32_to_f16(0x1p-25f), 0x0000);     /* tie to even: 0 */
  ASSERT_EQ_INT(hora__f32_to_f16(0x1.8p-24f), 0x0002);   /* tie to even: 2 */
  ASSERT_EQ_INT(hora__f32_to_f16(1.0f + 0x1p-11f), 0x3c00); /* tie to even */
  ASSERT_EQ_INT(hora__f32_to_f16(-0.0f), 0x8000);
}

static uint16_t bf16_reference(float f) {
  uint32_t u = hora__f32_bits(f);
  if (isnan(f)) {
    return (uint16_t)((u >> 16) | 0x40);
  }
  uint32_t upper = u >> 16, lower = u & 0xffff;
  if (lower > 0x8000 || (lower == 0x8000 && (upper & 1))) {
    upper++;
  }
  return (uint16_t)upper;
}

TEST(bf16_conversion) {
  for (int i = 0; i < 2000000; i++) {
    float f = hora__f32_from_bits((uint32_t)rnd());
    uint16_t got = hora__f32_to_bf16(f);
    uint16_t want = bf16_reference(f);
    if (isnan(f)) {
      ASSERT(isnan(hora__bf16_to_f32(got)));
    } else if (got != want) {
      FAIL("float %a: bf16 0x%04x, expected 0x%04x", (double)f, got, want);
    }
  }
  for (uint32_t b = 0; b < 65536; b++) {
    float f = hora__bf16_to_f32((uint16_t)b);
    if (!isnan(f)) {
      ASSERT_EQ_INT(hora__f32_to_bf16(f), b);
    }
  }
  ASSERT_EQ_INT(hora__f32_to_bf16(INFINITY), 0x7f80);
  ASSERT_EQ_INT(hora__f32_to_bf16(FLT_MAX), 0x7f80); /* rounds up to infinity */
}

static bool same_value(hora_dtype dt, const void *a, const void *b, size_t i) {
  size_t es = hora_dtype_size(dt);
  const uint8_t *pa = (const uint8_t *)a + i * es, *pb = (const uint8_t *)b + i * es;
  if (dt == HORA_FLOAT32) {
    float x, y;
    memcpy(&x, pa, 4);
    memcpy(&y, pb, 4);
    if (isnan(x) || isnan(y)) {
      return isnan(x) && isnan(y);
    }
  } else if (dt == HORA_FLOAT64) {
    double x, y;
    memcpy(&x, pa, 8);
    memcpy(&y, pb, 8);
    if (isnan(x) || isnan(y)) {
      return isnan(x) && isnan(y);
    }
  } else if (dt == HORA_FLOAT16 || dt == HORA_BFLOAT16) {
    uint16_t x, y;
    memcpy(&x, pa, 2);
    memcpy(&y, pb, 2);
    float fx = dt == HORA_FLOAT16 ? hora__f16_to_f32(x) : hora__bf16_to_f32(x);
    float fy = dt == HORA_FLOAT16 ? hora__f16_to_f32(y) : hora__bf16_to_f32(y);
    if (isnan(fx) || isnan(fy)) {
      return isnan(fx) && isnan(fy);
    }
  }
  return memcmp(pa, pb, es) == 0;
}

static void fill_random(hora_dtype dt, void *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint64_t r = rnd();
    switch (dt) {
      case HORA_FLOAT32: ((float *)p)[i] = (float)((double)(int64_t)(r % 2000001) - 1e6) / 997.0f; break;
      case HORA_FLOAT64: ((double *)p)[i] = ((double)(int64_t)(r % 2000001) - 1e6) / 997.0; break;
      case HORA_FLOAT16: ((uint16_t *)p)[i] = hora__f32_to_f16((float)((int)(r % 2001) - 1000) / 7.0f); break;
      case HORA_BFLOAT16: ((uint16_t *)p)[i] = hora__f32_to_bf16((float)((int)(r % 2001) - 1000) / 7.0f); break;
      /* A third false, the rest any nonzero byte: true is not only 1. */
      case HORA_BOOL: ((uint8_t *)p)[i] = r % 3 == 0 ? 0 : (uint8_t)(1 + (r >> 8) % 255); break;
      default: memcpy((uint8_t *)p + i * hora_dtype_size(dt), &r, hora_dtype_size(dt)); break;
    }
  }
}

/* The dispatching entry point and the portable loops alike: on a CPU with
 * AVX2 and F16C the first runs other code for float16 and bfloat16. */
typedef void (*reduce_entry)(hora_dtype, hora_op, void *, const void *, const void *, size_t);
static const reduce_entry entries[2] = {hora__reduce, hora__reduce_portable};
static const char *const entry_names[2] = {"hora__reduce", "hora__reduce_portable"};

TEST(reduce_matches_reference) {
  enum { N = 1037 };
  static uint8_t a[N * 8], b[N * 8], got[N * 8], want[N * 8];
  for (int e = 0; e < 2; e++)
  for (int dt = HORA_UINT8; dt <= HORA_BOOL; dt++) {
    for (int op = HORA_SUM; op <= HORA_PRODUCT; op++) {
      for (size_t n = 1; n <= N; n = n < 40 ? n + 1 : n * 3 + 1) {
        size_t m = HORA_MIN(n, (size_t)N);
        fill_random((hora_dtype)dt, a, m);
        fill_random((hora_dtype)dt, b, m);
        entries[e]((hora_dtype)dt, (hora_op)op, got, a, b, m);
        hora__reduce_reference((hora_dtype)dt, (hora_op)op, want, a, b, m);
        for (size_t i = 0; i < m; i++) {
          if (!same_value((hora_dtype)dt, got, want, i)) {
            FAIL("%s: %s %s n=%zu: element %zu differs from the reference", entry_names[e],
                 hora_dtype_name((hora_dtype)dt), hora_op_name((hora_op)op), m, i);
          }
        }
      }
    }
  }
}

/* Every pair of special values, for every float dtype and op, against the
 * reference; then the facts that matter spelled out. */
TEST(reduce_nan_inf_and_edges) {
  const double specials[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 1.0, -1.0, 65504.0, -65504.0,
                             FLT_MAX, -FLT_MAX, FLT_MIN, 1e-40, DBL_MAX, 0x1p-24, 3.0};
  enum { S = sizeof(specials) / sizeof(specials[0]) };
  uint8_t a[S * S * 8], b[S * S * 8], got[S * S * 8], want[S * S * 8];
  for (int dt = HORA_FLOAT16; dt <= HORA_FLOAT64; dt++) {
    for (int i = 0; i < S; i++) {
      for (int j = 0; j < S; j++) {
        size_t k = (size_t)(i * S + j);
        switch (dt) {
          case HORA_FLOAT16:
            ((uint16_t *)a)[k] = hora__f32_to_f16((float)specials[i]);
            ((uint16_t *)b)[k] = hora__f32_to_f16((float)specials[j]);
            break;
          case HORA_BFLOAT16:
            ((uint16_t *)a)[k] = hora__f32_to_bf16((float)specials[i]);
            ((uint16_t *)b)[k] = hora__f32_to_bf16((float)specials[j]);
            break;
          case HORA_FLOAT32:
            ((float *)a)[k] = (float)specials[i];
            ((float *)b)[k] = (float)specials[j];
            break;
          default:
            ((double *)a)[k] = specials[i];
            ((double *)b)[k] = specials[j];
            break;
        }
      }
    }
    for (int e = 0; e < 2; e++)
    for (int op = HORA_SUM; op <= HORA_PRODUCT; op++) {
      entries[e]((hora_dtype)dt, (hora_op)op, got, a, b, S * S);
      hora__reduce_reference((hora_dtype)dt, (hora_op)op, want, a, b, S * S);
      for (size_t k = 0; k < S * S; k++) {
        if (!same_value((hora_dtype)dt, got, want, k)) {
          FAIL("%s: %s %s: %g (op) %g differs from the reference", entry_names[e],
               hora_dtype_name((hora_dtype)dt), hora_op_name((hora_op)op), specials[k / S],
               specials[k % S]);
        }
      }
    }
  }
  float x[3] = {NAN, 1.0f, INFINITY}, y[3] = {1.0f, NAN, -INFINITY}, r[3];
  hora__reduce(HORA_FLOAT32, HORA_MIN, r, x, y, 3);
  ASSERT(isnan(r[0]) && isnan(r[1]) && r[2] == -INFINITY);
  hora__reduce(HORA_FLOAT32, HORA_MAX, r, x, y, 3);
  ASSERT(isnan(r[0]) && isnan(r[1]) && r[2] == INFINITY);
  hora__reduce(HORA_FLOAT32, HORA_SUM, r, x, y, 3);
  ASSERT(isnan(r[2])); /* inf + -inf */
  uint16_t h1 = hora__f32_to_f16(65504.0f), hr;
  hora__reduce(HORA_FLOAT16, HORA_SUM, &hr, &h1, &h1, 1);
  ASSERT_EQ_INT(hr, 0x7c00); /* overflow to +inf */
  int32_t i1 = INT32_MAX, i2 = 1, ir;
  hora__reduce(HORA_INT32, HORA_SUM, &ir, &i1, &i2, 1);
  ASSERT_EQ_INT(ir, INT32_MIN); /* wraps, no undefined behaviour */
  int64_t l1 = INT64_MIN, l2 = -1, lr;
  hora__reduce(HORA_INT64, HORA_PRODUCT, &lr, &l1, &l2, 1);
  ASSERT(lr == INT64_MIN);
  int8_t c1 = -128, c2 = 127, cr;
  hora__reduce(HORA_INT8, HORA_MIN, &cr, &c1, &c2, 1);
  ASSERT_EQ_INT(cr, -128);
  hora__reduce(HORA_INT8, HORA_SUM, &cr, &c1, &c2, 1);
  ASSERT_EQ_INT(cr, -1);
  uint8_t u1 = 200, u2 = 100, ur;
  hora__reduce(HORA_UINT8, HORA_SUM, &ur, &u1, &u2, 1);
  ASSERT_EQ_INT(ur, 44);
  hora__reduce(HORA_UINT8, HORA_MAX, &ur, &u1, &u2, 1);
  ASSERT_EQ_INT(ur, 200);
}

/* int16 wraps like the other integers; bool reads any nonzero byte as true
 * and writes 0 or 1, with OR for SUM and MAX and AND for MIN and PRODUCT. */
TEST(reduce_int16_and_bool) {
  for (int e = 0; e < 2; e++) {
    int16_t x[5] = {INT16_MAX, INT16_MIN, 300, -7, 12}, y[5] = {1, -1, 300, 5, -12}, r[5];
    entries[e](HORA_INT16, HORA_SUM, r, x, y, 5);
    ASSERT(r[0] == INT16_MIN && r[1] == INT16_MAX && r[2] == 600 && r[3] == -2 && r[4] == 0);
    entries[e](HORA_INT16, HORA_PRODUCT, r, x, y, 5);
    ASSERT(r[0] == INT16_MAX && r[1] == INT16_MIN && r[2] == 24464 && r[3] == -35 && r[4] == -144);
    entries[e](HORA_INT16, HORA_MIN, r, x, y, 5);
    ASSERT(r[0] == 1 && r[1] == INT16_MIN && r[2] == 300 && r[3] == -7 && r[4] == -12);
    entries[e](HORA_INT16, HORA_MAX, r, x, y, 5);
    ASSERT(r[0] == INT16_MAX && r[1] == -1 && r[2] == 300 && r[3] == 5 && r[4] == 12);
    entries[e](HORA_INT16, HORA_AVERAGE, r, x, y, 5); /* a sum until the postscale by 1/size */
    ASSERT(r[0] == INT16_MIN && r[3] == -2);

    /* Every pair of bytes from the ones that matter, 33 elements so the
     * vectorised loops run too. */
    const uint8_t v[] = {0, 1, 2, 0x80, 0xff, 0, 0x10};
    enum { V = sizeof(v), N = V * V };
    uint8_t a[N], b[N], got[N];
    for (int i = 0; i < N; i++) {
      a[i] = v[i / V];
      b[i] = v[i % V];
    }
    for (int op = HORA_SUM; op <= HORA_PRODUCT; op++) {
      entries[e](HORA_BOOL, (hora_op)op, got, a, b, N);
      bool conj = op == HORA_MIN || op == HORA_PRODUCT;
      for (int i = 0; i < N; i++) {
        int want = conj ? a[i] && b[i] : a[i] || b[i];
        if (got[i] != want) {
          FAIL("%s: bool %s of 0x%02x and 0x%02x: %d, expected %d", entry_names[e],
               hora_op_name((hora_op)op), a[i], b[i], got[i], want);
        }
      }
    }
    /* In place, as the collectives reduce. */
    uint8_t p[3] = {0, 4, 0}, q[3] = {9, 0, 0};
    entries[e](HORA_BOOL, HORA_MAX, p, p, q, 3);
    ASSERT(p[0] == 1 && p[1] == 1 && p[2] == 0);
  }
  uint8_t raw[4] = {0, 1, 2, 0xff};
  hora__normalize_bool(raw, 4);
  ASSERT(raw[0] == 0 && raw[1] == 1 && raw[2] == 1 && raw[3] == 1);
}

TEST(reduce_in_place_aliasing) {
  enum { N = 333 };
  double a[N], b[N], want[N];
  for (int i = 0; i < N; i++) {
    a[i] = i * 0.5;
    b[i] = 100 - i;
    want[i] = a[i] + b[i];
  }
  double a2[N];
  memcpy(a2, a, sizeof(a));
  hora__reduce(HORA_FLOAT64, HORA_SUM, a2, a2, b, N); /* dst == a */
  ASSERT(memcmp(a2, want, sizeof(want)) == 0);
  double b2[N];
  memcpy(b2, b, sizeof(b));
  hora__reduce(HORA_FLOAT64, HORA_SUM, b2, a, b2, N); /* dst == b */
  ASSERT(memcmp(b2, want, sizeof(want)) == 0);
}

/* Horovod's ScaleBuffer, element for element: integers scaled in double and
 * cast back toward zero, half types in float by the factor rounded to float,
 * float32 by the float factor, float64 in double; AVERAGE is a postscale
 * by 1/size (hora__post_apply). */
TEST(scale_as_horovod) {
  int32_t iv[4] = {-7, 7, -8, 9};
  hora__scale(HORA_INT32, iv, 4, 0.5);
  ASSERT(iv[0] == -3 && iv[1] == 3 && iv[2] == -4 && iv[3] == 4); /* toward zero */
  int64_t lv = 5;
  hora__scale(HORA_INT64, &lv, 1, 0.5);
  ASSERT_EQ_INT(lv, 2);
  /* 49 * (1.0 / 49) is just below 1 in double: Horovod's average gives 0. */
  int32_t e = 49;
  hora__scale(HORA_INT32, &e, 1, 1.0 / 49);
  ASSERT_EQ_INT(e, 0);
  int16_t ws[4] = {5, -5, 1000, -3};
  hora__scale(HORA_INT16, ws, 4, 0.5);
  ASSERT(ws[0] == 2 && ws[1] == -2 && ws[2] == 500 && ws[3] == -1);
  int16_t wt[3] = {7, -7, 20000};
  hora__scale(HORA_INT16, wt, 3, 1.5);
  ASSERT(wt[0] == 10 && wt[1] == -10 && wt[2] == 30000);
  int8_t cv[2] = {-127, 127};
  hora__scale(HORA_INT8, cv, 2, 1.0 / 16);
  ASSERT(cv[0] == -7 && cv[1] == 7);
  uint8_t uv[2] = {255, 7};
  hora__scale(HORA_UINT8, uv, 2, 1.0 / 256);
  ASSERT(uv[0] == 0 && uv[1] == 0);
  int64_t big = INT64_MAX;
  hora__scale(HORA_INT64, &big, 1, 4.0); /* saturates instead of undefined */
  ASSERT(big == INT64_MAX);
  float fv[2] = {10.0f, 1.0f};
  hora__scale(HORA_FLOAT32, fv, 2, 1.0 / 3);
  ASSERT(fv[0] == (float)(1.0 / 3) * 10.0f && fv[1] == (float)(1.0 / 3));
  double dv = 3.0;
  hora__scale(HORA_FLOAT64, &dv, 1, 0.25);
  ASSERT(dv == 0.75);
  uint16_t hv = hora__f32_to_f16(3.0f);
  hora__scale(HORA_FLOAT16, &hv, 1, 0.3);
  ASSERT(hv == hora__f32_to_f16(3.0f * (float)0.3));
  uint16_t bv = hora__f32_to_bf16(3.0f);
  hora__scale(HORA_BFLOAT16, &bv, 1, 0.25);
  ASSERT(hora__bf16_to_f32(bv) == 0.75f);
  uint8_t bv2[3] = {0, 1, 7};
  hora__scale(HORA_BOOL, bv2, 3, 2.0); /* refused before it gets here: left alone */
  ASSERT(bv2[0] == 0 && bv2[1] == 1 && bv2[2] == 7);
}

TEST(compression_roundtrip_and_reduce) {
  enum { N = 1000 };
  float f[N], back[N], acc[N];
  double d[N], dback[N];
  uint16_t wire[N];
  for (int i = 0; i < N; i++) {
    f[i] = (float)(i - 500) / 8.0f; /* exact in fp16 and bf16 */
    d[i] = f[i];
    acc[i] = 1.0f;
  }
  for (int w = 0; w < 2; w++) {
    hora_dtype wd = w ? HORA_BFLOAT16 : HORA_FLOAT16;
    hora__compress(wd, wire, HORA_FLOAT32, f, N);
    hora__decompress(HORA_FLOAT32, back, wd, wire, N);
    hora__compress(wd, wire, HORA_FLOAT64, d, N);
    hora__decompress(HORA_FLOAT64, dback, wd, wire, N);
    for (int i = 0; i < N; i++) {
      if (w == 0 || fabsf(f[i]) <= 32) { /* bf16 keeps 8 bits: |x| <= 32 in steps of 1/8 */
        ASSERT(back[i] == f[i] && dback[i] == d[i]);
      }
    }
    float r[N];
    hora__reduce_wire(HORA_FLOAT32, HORA_SUM, r, wd, wire, acc, N);
    for (int i = 0; i < N; i++) {
      ASSERT(r[i] == (float)dback[i] + 1.0f);
    }
    hora__reduce_wire(HORA_FLOAT32, HORA_MAX, r, wd, wire, acc, N);
    ASSERT(r[0] == 1.0f && r[N - 1] == (float)dback[N - 1]);
  }
  /* The wire value is rounded: 1 + 2^-12 is not a half. */
  float one = 1.0f + 0x1p-12f;
  hora__compress(HORA_FLOAT16, wire, HORA_FLOAT32, &one, 1);
  hora__decompress(HORA_FLOAT32, back, HORA_FLOAT16, wire, 1);
  ASSERT(back[0] == 1.0f);
}

/* The compression calls against the one-value conversions, on random bit
 * patterns (NaN, infinities, subnormals, every rounding case among them),
 * for every op of the reducing form. */
TEST(compression_matches_scalar_conversions) {
  enum { N = 4099 };
  static float f[N], acc[N], got_acc[N];
  static uint16_t wire[N];
  for (int i = 0; i < N; i++) {
    uint32_t u = (uint32_t)rnd();
    memcpy(&f[i], &u, sizeof(u));
    acc[i] = (float)((int)(rnd() % 2001) - 1000) / 3.0f;
  }
  for (int w = 0; w < 2; w++) {
    hora_dtype wd = w ? HORA_BFLOAT16 : HORA_FLOAT16;
    hora__compress(wd, wire, HORA_FLOAT32, f, N);
    for (int i = 0; i < N; i++) {
      uint16_t want = w ? hora__f32_to_bf16(f[i]) : hora__f32_to_f16(f[i]);
      if (wire[i] != want) {
        FAIL("%s compress of 0x%08x: 0x%04x, expected 0x%04x", hora_dtype_name(wd),
             hora__f32_bits(f[i]), wire[i], want);
      }
    }
    float back[N];
    hora__decompress(HORA_FLOAT32, back, wd, wire, N);
    for (int i = 0; i < N; i++) {
      float want = w ? hora__bf16_to_f32(wire[i]) : hora__f16_to_f32(wire[i]);
      if (!(back[i] == want || (isnan(back[i]) && isnan(want)))) {
        FAIL("%s decompress of 0x%04x: %g, expected %g", hora_dtype_name(wd), wire[i],
             (double)back[i], (double)want);
      }
    }
    for (int op = HORA_SUM; op <= HORA_PRODUCT; op++) {
      hora__reduce_wire(HORA_FLOAT32, (hora_op)op, got_acc, wd, wire, acc, N);
      for (int i = 0; i < N; i++) {
        float x = w ? hora__bf16_to_f32(wire[i]) : hora__f16_to_f32(wire[i]), y = acc[i], want;
        switch (op) {
          case HORA_MIN: want = isnan(x) || isnan(y) ? x + y : x < y ? x : y; break;
          case HORA_MAX: want = isnan(x) || isnan(y) ? x + y : x > y ? x : y; break;
          case HORA_PRODUCT: want = x * y; break;
          default: want = x + y; break;
        }
        if (!(got_acc[i] == want || (isnan(got_acc[i]) && isnan(want)))) {
          FAIL("%s %s wire reduce at %d: %g, expected %g", hora_dtype_name(wd),
               hora_op_name((hora_op)op), i, (double)got_acc[i], (double)want);
        }
      }
    }
  }
}
