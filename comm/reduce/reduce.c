/* Reduction kernels. Each loop is written so the compiler vectorises it:
 * no aliasing assumptions it cannot check, no branches in the body, and
 * fp16/bf16 converted through float with branch-free bit manipulation. */
#include "comm/reduce/reduce.h"

#include "comm/reduce/half.h"

#define OP_SUM(x, y) ((x) + (y))
#define OP_PROD(x, y) ((x) * (y))
#define OP_MIN(x, y) ((x) < (y) ? (x) : (y))
#define OP_MAX(x, y) ((x) > (y) ? (x) : (y))
/* NaN-propagating float min/max: x + y is NaN whenever either is. */
#define OP_FMIN(x, y) (((x) != (x)) | ((y) != (y)) ? (x) + (y) : OP_MIN(x, y))
#define OP_FMAX(x, y) (((x) != (x)) | ((y) != (y)) ? (x) + (y) : OP_MAX(x, y))

/* Built for AVX-512, AVX2 and the baseline; the loader picks the best the
 * CPU has (GNU ifunc), so one binary runs everywhere at full width. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define KERNEL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KERNEL_CLONES
#endif

#define DEFINE_LOOP(fname, T, EXPR)                                                          \
  KERNEL_CLONES static void fname(void *dst_, const void *a_, const void *b_, size_t n) {    \
    T *dst = dst_;                                                                           \
    const T *a = a_;                                                                         \
    const T *b = b_;                                                                         \
    for (size_t i = 0; i < n; i++) {                                                         \
      T x = a[i];                                                                            \
      T y = b[i];                                                                            \
      dst[i] = (T)(EXPR);                                                                    \
    }                                                                                        \
  }

/* Signed integers add and multiply as unsigned so overflow wraps instead of
 * being undefined. */
#define DEFINE_INT(suffix, T, UT)                                                            \
  DEFINE_LOOP(sum_##suffix, T, (UT)x + (UT)y)                                                \
  DEFINE_LOOP(prod_##suffix, T, (UT)x * (UT)y)                                               \
  DEFINE_LOOP(min_##suffix, T, OP_MIN(x, y))                                                 \
  DEFINE_LOOP(max_##suffix, T, OP_MAX(x, y))

DEFINE_INT(u8, uint8_t, uint32_t)
DEFINE_INT(i8, int8_t, uint32_t)
DEFINE_INT(i16, int16_t, uint32_t)
DEFINE_INT(i32, int32_t, uint32_t)
DEFINE_INT(i64, int64_t, uint64_t)

#define DEFINE_FLOAT(suffix, T)                                                              \
  DEFINE_LOOP(sum_##suffix, T, OP_SUM(x, y))                                                 \
  DEFINE_LOOP(prod_##suffix, T, OP_PROD(x, y))                                               \
  DEFINE_LOOP(min_##suffix, T, OP_FMIN(x, y))                                                \
  DEFINE_LOOP(max_##suffix, T, OP_FMAX(x, y))

/* Bool: any nonzero byte is true, results are 0 or 1. No branches, so the
 * loops vectorise like the integer ones. */
DEFINE_LOOP(or_b, uint8_t, (x != 0) | (y != 0))
DEFINE_LOOP(and_b, uint8_t, (x != 0) & (y != 0))

DEFINE_FLOAT(f32, float)
DEFINE_FLOAT(f64, double)

#define DEFINE_HALF_LOOP(fname, TO_F, FROM_F, EXPR)                                          \
  KERNEL_CLONES static void fname(void *dst_, const void *a_, const void *b_, size_t n) {    \
    uint16_t *dst = dst_;                                                                    \
    const uint16_t *a = a_;                                                                  \
    const uint16_t *b = b_;                                                                  \
    for (size_t i = 0; i < n; i++) {                                                         \
      float x = TO_F(a[i]);                                                                  \
      float y = TO_F(b[i]);                                                                  \
      dst[i] = FROM_F(EXPR);                                                                 \
    }                                                                                        \
  }

#define DEFINE_HALF(suffix, TO_F, FROM_F)                                                    \
  DEFINE_HALF_LOOP(sum_##suffix, TO_F, FROM_F, OP_SUM(x, y))                                 \
  DEFINE_HALF_LOOP(prod_##suffix, TO_F, FROM_F, OP_PROD(x, y))                               \
  DEFINE_HALF_LOOP(min_##suffix, TO_F, FROM_F, OP_FMIN(x, y))                                \
  DEFINE_HALF_LOOP(max_##suffix, TO_F, FROM_F, OP_FMAX(x, y))

DEFINE_HALF(f16, hora__f16_to_f32, hora__f32_to_f16)
DEFINE_HALF(bf16, hora__bf16_to_f32, hora__f32_to_bf16)

typedef void (*reduce_fn)(void *dst, const void *a, const void *b, size_t n);

/* [dtype][op]; AVERAGE reduces as SUM. Bool: SUM and MAX are OR, MIN and
 * PRODUCT are AND (AVERAGE is refused at submission). */
static const reduce_fn kernels[HORA__DTYPE_COUNT][5] = {
#define ROW(s) {sum_##s, sum_##s, min_##s, max_##s, prod_##s}
    [HORA_UINT8] = ROW(u8),      [HORA_INT8] = ROW(i8),    [HORA_INT32] = ROW(i32),
    [HORA_INT64] = ROW(i64),     [HORA_FLOAT16] = ROW(f16), [HORA_BFLOAT16] = ROW(bf16),
    [HORA_FLOAT32] = ROW(f32),   [HORA_FLOAT64] = ROW(f64), [HORA_INT16] = ROW(i16),
    [HORA_BOOL] = {or_b, or_b, and_b, or_b, and_b},
#undef ROW
};

/* ---- float16 and bfloat16 with AVX2 (and F16C for float16) ---------------
 * The vectorised portable conversions above still cost some twenty
 * instructions a value; the hardware converts eight values in one. Chosen
 * at run time, per call: CPUs without the features keep the portable loops. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define HALF_SIMD 1
#define HALF_TARGET __attribute__((target("avx2,f16c")))

HALF_TARGET static inline __m256 load8_f16(const uint16_t *p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}

HALF_TARGET static inline void store8_f16(uint16_t *p, __m256 v) {
  _mm_storeu_si128((__m128i *)(void *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

HALF_TARGET static inline __m256 load8_bf16(const uint16_t *p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* Round to nearest even as hora__f32_to_bf16 does; NaN stays NaN, quieted. */
HALF_TARGET static inline void store8_bf16(uint16_t *p, __m256 v) {
  __m256i x = _mm256_castps_si256(v);
  __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), odd), 16);
  __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
  /* Values fit 16 bits, so the saturating pack is exact; it packs within
   * 128-bit lanes, and the permute gathers the two halves. */
  __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xd8);
  _mm_storeu_si128((__m128i *)(void *)p, _mm256_castsi256_si128(packed));
}

#define V_SUM(x, y) _mm256_add_ps(x, y)
#define V_PROD(x, y) _mm256_mul_ps(x, y)
/* x < y ? x : y, as minps is, but NaN when either is, as OP_FMIN. */
#define V_MIN(x, y) \
  _mm256_blendv_ps(_mm256_min_ps(x, y), _mm256_add_ps(x, y), _mm256_cmp_ps(x, y, _CMP_UNORD_Q))
#define V_MAX(x, y) \
  _mm256_blendv_ps(_mm256_max_ps(x, y), _mm256_add_ps(x, y), _mm256_cmp_ps(x, y, _CMP_UNORD_Q))

#define DEFINE_HALF_SIMD(fname, LOAD8, STORE8, TO_F, FROM_F, VOP, SOP)                       \
  HALF_TARGET static void fname(void *dst_, const void *a_, const void *b_, size_t n) {      \
    uint16_t *dst = dst_;                                                                    \
    const uint16_t *a = a_;                                                                  \
    const uint16_t *b = b_;                                                                  \
    size_t i = 0;                                                                            \
    for (; i + 8 <= n; i += 8) {                                                             \
      __m256 x = LOAD8(a + i), y = LOAD8(b + i);                                             \
      STORE8(dst + i, VOP(x, y));                                                            \
    }                                                                                        \
    for (; i < n; i++) {                                                                     \
      float x = TO_F(a[i]), y = TO_F(b[i]);                                                  \
      dst[i] = FROM_F(SOP(x, y));                                                            \
    }                                                                                        \
  }

#define DEFINE_HALF_SIMD_OPS(s, LOAD8, STORE8, TO_F, FROM_F)                                 \
  DEFINE_HALF_SIMD(simd_sum_##s, LOAD8, STORE8, TO_F, FROM_F, V_SUM, OP_SUM)                 \
  DEFINE_HALF_SIMD(simd_prod_##s, LOAD8, STORE8, TO_F, FROM_F, V_PROD, OP_PROD)              \
  DEFINE_HALF_SIMD(simd_min_##s, LOAD8, STORE8, TO_F, FROM_F, V_MIN, OP_FMIN)                \
  DEFINE_HALF_SIMD(simd_max_##s, LOAD8, STORE8, TO_F, FROM_F, V_MAX, OP_FMAX)

DEFINE_HALF_SIMD_OPS(f16, load8_f16, store8_f16, hora__f16_to_f32, hora__f32_to_f16)
DEFINE_HALF_SIMD_OPS(bf16, load8_bf16, store8_bf16, hora__bf16_to_f32, hora__f32_to_bf16)

/* [0: float16, 1: bfloat16][op] */
static const reduce_fn half_simd[2][5] = {
    {simd_sum_f16, simd_sum_f16, simd_min_f16, simd_max_f16, simd_prod_f16},
    {simd_sum_bf16, simd_sum_bf16, simd_min_bf16, simd_max_bf16, simd_prod_bf16},
};

static bool half_simd_ok(void) {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}

/* Wire compression of float32, the same conversions eight at a time. */
HALF_TARGET static void compress_f32_simd(hora_dtype wire, uint16_t *dst, const float *src,
                                          size_t n) {
  size_t i = 0;
  if (wire == HORA_FLOAT16) {
    for (; i + 8 <= n; i += 8) {
      store8_f16(dst + i, _mm256_loadu_ps(src + i));
    }
    for (; i < n; i++) {
      dst[i] = hora__f32_to_f16(src[i]);
    }
  } else {
    for (; i + 8 <= n; i += 8) {
      store8_bf16(dst + i, _mm256_loadu_ps(src + i));
    }
    for (; i < n; i++) {
      dst[i] = hora__f32_to_bf16(src[i]);
    }
  }
}

HALF_TARGET static void decompress_f32_simd(float *dst, hora_dtype wire, const uint16_t *src,
                                            size_t n) {
  size_t i = 0;
  if (wire == HORA_FLOAT16) {
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(dst + i, load8_f16(src + i));
    }
    for (; i < n; i++) {
      dst[i] = hora__f16_to_f32(src[i]);
    }
  } else {
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(dst + i, load8_bf16(src + i));
    }
    for (; i < n; i++) {
      dst[i] = hora__bf16_to_f32(src[i]);
    }
  }
}

#define REDUCE_WIRE_SIMD(LOAD8, TO_F, VOP, SOP)                                              \
  do {                                                                                       \
    size_t i = 0;                                                                            \
    for (; i + 8 <= n; i += 8) {                                                             \
      __m256 x = LOAD8(wire + i), y = _mm256_loadu_ps(src + i);                              \
      _mm256_storeu_ps(dst + i, VOP(x, y));                                                  \
    }                                                                                        \
    for (; i < n; i++) {                                                                     \
      float x = TO_F(wire[i]), y = src[i];                                                   \
      dst[i] = SOP(x, y);                                                                    \
    }                                                                                        \
  } while (0)

#define REDUCE_WIRE_SIMD_OPS(LOAD8, TO_F)                                                    \
  switch (op) {                                                                              \
    case HORA_SUM:                                                                           \
    case HORA_ADASUM: /* (never elementwise: comm/coll/adasum.c) */                          \
    case HORA_AVERAGE: REDUCE_WIRE_SIMD(LOAD8, TO_F, V_SUM, OP_SUM); break;                  \
    case HORA_PRODUCT: REDUCE_WIRE_SIMD(LOAD8, TO_F, V_PROD, OP_PROD); break;                \
    case HORA_MIN: REDUCE_WIRE_SIMD(LOAD8, TO_F, V_MIN, OP_FMIN); break;                     \
    case HORA_MAX: REDUCE_WIRE_SIMD(LOAD8, TO_F, V_MAX, OP_FMAX); break;                     \
  }

HALF_TARGET static void reduce_wire_f32_simd(hora_op op, float *dst, hora_dtype wire_dtype,
                                             const uint16_t *wire, const float *src, size_t n) {
  if (wire_dtype == HORA_FLOAT16) {
    REDUCE_WIRE_SIMD_OPS(load8_f16, hora__f16_to_f32)
  } else {
    REDUCE_WIRE_SIMD_OPS(load8_bf16, hora__bf16_to_f32)
  }
}
#endif

void hora__reduce_portable(hora_dtype dtype, hora_op op, void *dst, const void *a, const void *b,
                           size_t n) {
  kernels[dtype][op](dst, a, b, n);
}

void hora__reduce(hora_dtype dtype, hora_op op, void *dst, const void *a, const void *b,
                  size_t n) {
#ifdef HALF_SIMD
  if ((dtype == HORA_FLOAT16 || dtype == HORA_BFLOAT16) && half_simd_ok()) {
    half_simd[dtype == HORA_BFLOAT16][op](dst, a, b, n);
    return;
  }
#endif
  kernels[dtype][op](dst, a, b, n);
}

/* A scaled integer element: Horovod casts factor * x (a double) back to the
 * element type, which truncates toward zero; out of int64's range it
 * saturates (a C cast would be undefined), then narrows as integers wrap. */
static inline int64_t scaled_int(double v) {
  if (v != v) {
    return 0;
  }
  if (v >= 9223372036854775807.0) {
    return INT64_MAX;
  }
  if (v <= -9223372036854775808.0) {
    return INT64_MIN;
  }
  return (int64_t)v;
}

void hora__scale(hora_dtype dtype, void *buf, size_t n, double factor) {
  switch (dtype) {
#define SCALE_INT(D, T)                                                                      \
  case D: {                                                                                  \
    T *p = buf;                                                                              \
    for (size_t i = 0; i < n; i++) {                                                         \
      p[i] = (T)scaled_int(factor * (double)p[i]);                                           \
    }                                                                                        \
    break;                                                                                   \
  }
    SCALE_INT(HORA_UINT8, uint8_t)
    SCALE_INT(HORA_INT8, int8_t)
    SCALE_INT(HORA_INT16, int16_t)
    SCALE_INT(HORA_INT32, int32_t)
    SCALE_INT(HORA_INT64, int64_t)
    case HORA_FLOAT32: {
      float *p = buf;
      float f = (float)factor;
      for (size_t i = 0; i < n; i++) {
        p[i] *= f;
      }
      break;
    }
    case HORA_FLOAT64: {
      double *p = buf;
      for (size_t i = 0; i < n; i++) {
        p[i] *= factor;
      }
      break;
    }
    case HORA_FLOAT16: {
      uint16_t *p = buf;
      for (size_t i = 0; i < n; i++) {
        p[i] = hora__f32_to_f16(hora__f16_to_f32(p[i]) * (float)factor);
      }
      break;
    }
    case HORA_BFLOAT16: {
      uint16_t *p = buf;
      for (size_t i = 0; i < n; i++) {
        p[i] = hora__f32_to_bf16(hora__bf16_to_f32(p[i]) * (float)factor);
      }
      break;
    }
    case HORA_BOOL: break; /* scales other than 1 are refused for bool at submission */
  }
}

void hora__normalize_bool(void *buf, size_t n) {
  uint8_t *p = buf;
  for (size_t i = 0; i < n; i++) {
    p[i] = p[i] != 0;
  }
}

/* ---- scalar reference: one element at a time, through double ----------- */

static double load_as_double(hora_dtype dtype, const void *p, size_t i) {
  switch (dtype) {
    case HORA_UINT8: return ((const uint8_t *)p)[i];
    case HORA_INT8: return ((const int8_t *)p)[i];
    case HORA_INT16: return ((const int16_t *)p)[i];
    case HORA_BOOL: return ((const uint8_t *)p)[i] != 0;
    case HORA_INT32: return ((const int32_t *)p)[i];
    case HORA_INT64: return (double)((const int64_t *)p)[i];
    case HORA_FLOAT16: return hora__f16_to_f32(((const uint16_t *)p)[i]);
    case HORA_BFLOAT16: return hora__bf16_to_f32(((const uint16_t *)p)[i]);
    case HORA_FLOAT32: return ((const float *)p)[i];
    case HORA_FLOAT64: return ((const double *)p)[i];
  }
  return 0;
}

static double ref_float_op(hora_op op, double x, double y) {
  if (op != HORA_SUM && op != HORA_AVERAGE && op != HORA_PRODUCT && (x != x || y != y)) {
    return x + y;
  }
  switch (op) {
    case HORA_SUM:
    case HORA_ADASUM: /* (never elementwise: comm/coll/adasum.c) */
    case HORA_AVERAGE: return x + y;
    case HORA_PRODUCT: return x * y;
    case HORA_MIN: return x < y ? x : y;
    case HORA_MAX: return x > y ? x : y;
  }
  return 0;
}

#define REF_INT(T, UT)                                                                       \
  {                                                                                          \
    const T *pa = a;                                                                         \
    const T *pb = b;                                                                         \
    T *pd = dst;                                                                             \
    for (size_t i = 0; i < n; i++) {                                                         \
      T x = pa[i], y = pb[i], r = 0;                                                         \
      switch (op) {                                                                          \
        case HORA_SUM:                                                                       \
        case HORA_ADASUM: /* (never elementwise: comm/coll/adasum.c) */                      \
        case HORA_AVERAGE: r = (T)((UT)x + (UT)y); break;                                    \
        case HORA_PRODUCT: r = (T)((UT)x * (UT)y); break;                                    \
        case HORA_MIN: r = x < y ? x : y; break;                                             \
        case HORA_MAX: r = x > y ? x : y; break;                                             \
      }                                                                                      \
      pd[i] = r;                                                                             \
    }                                                                                        \
  }

void hora__reduce_reference(hora_dtype dtype, hora_op op, void *dst, const void *a,
                            const void *b, size_t n) {
  switch (dtype) {
    case HORA_UINT8: REF_INT(uint8_t, uint32_t) return;
    case HORA_INT8: REF_INT(int8_t, uint32_t) return;
    case HORA_INT32: REF_INT(int32_t, uint32_t) return;
    case HORA_INT64: REF_INT(int64_t, uint64_t) return;
    case HORA_INT16: REF_INT(int16_t, uint32_t) return;
    case HORA_BOOL:
      for (size_t i = 0; i < n; i++) {
        bool x = ((const uint8_t *)a)[i] != 0, y = ((const uint8_t *)b)[i] != 0;
        bool conj = op == HORA_MIN || op == HORA_PRODUCT;
        ((uint8_t *)dst)[i] = (uint8_t)(conj ? x && y : x || y);
      }
      return;
    default: break;
  }
  for (size_t i = 0; i < n; i++) {
    double x = load_as_double(dtype, a, i);
    double y = load_as_double(dtype, b, i);
    double r = ref_float_op(op, x, y);
    switch (dtype) {
      case HORA_FLOAT16: ((uint16_t *)dst)[i] = hora__f32_to_f16((float)r); break;
      case HORA_BFLOAT16: ((uint16_t *)dst)[i] = hora__f32_to_bf16((float)r); break;
      case HORA_FLOAT32: ((float *)dst)[i] = (float)r; break;
      case HORA_FLOAT64: ((double *)dst)[i] = r; break;
      default: break;
    }
  }
}

/* ---- wire compression: float32/float64 <-> float16/bfloat16 --------------- */

#define WIRE_TO_F(wire_dtype, v) \
  ((wire_dtype) == HORA_FLOAT16 ? hora__f16_to_f32(v) : hora__bf16_to_f32(v))

void hora__compress(hora_dtype wire_dtype, uint16_t *dst, hora_dtype src_dtype, const void *src,
                    size_t n) {
#ifdef HALF_SIMD
  if (src_dtype == HORA_FLOAT32 && half_simd_ok()) {
    compress_f32_simd(wire_dtype, dst, src, n);
    return;
  }
#endif
  if (src_dtype == HORA_FLOAT32) {
    const float *s = src;
    if (wire_dtype == HORA_FLOAT16) {
      for (size_t i = 0; i < n; i++) {
        dst[i] = hora__f32_to_f16(s[i]);
      }
    } else {
      for (size_t i = 0; i < n; i++) {
        dst[i] = hora__f32_to_bf16(s[i]);
      }
    }
  } else {
    const double *s = src;
    /* Through float: a double that rounds to a float first can round again
     * to half, as any two-step conversion would; the error stays below one
     * half-precision ulp. */
    if (wire_dtype == HORA_FLOAT16) {
      for (size_t i = 0; i < n; i++) {
        dst[i] = hora__f32_to_f16((float)s[i]);
      }
    } else {
      for (size_t i = 0; i < n; i++) {
        dst[i] = hora__f32_to_bf16((float)s[i]);
      }
    }
  }
}

void hora__decompress(hora_dtype dst_dtype, void *dst, hora_dtype wire_dtype, const uint16_t *src,
                      size_t n) {
#ifdef HALF_SIMD
  if (dst_dtype == HORA_FLOAT32 && half_simd_ok()) {
    decompress_f32_simd(dst, wire_dtype, src, n);
    return;
  }
#endif
  if (dst_dtype == HORA_FLOAT32) {
    float *d = dst;
    for (size_t i = 0; i < n; i++) {
      d[i] = WIRE_TO_F(wire_dtype, src[i]);
    }
  } else {
    double *d = dst;
    for (size_t i = 0; i < n; i++) {
      d[i] = WIRE_TO_F(wire_dtype, src[i]);
    }
  }
}

#define REDUCE_WIRE_LOOP(T, EXPR)                                                            \
  do {                                                                                       \
    T *d = dst;                                                                              \
    const T *b = src;                                                                        \
    for (size_t i = 0; i < n; i++) {                                                         \
      T x = (T)WIRE_TO_F(wire_dtype, wire[i]);                                               \
      T y = b[i];                                                                            \
      d[i] = (EXPR);                                                                         \
    }                                                                                        \
  } while (0)

#define REDUCE_WIRE_OPS(T)                                                                   \
  switch (op) {                                                                              \
    case HORA_SUM:                                                                           \
    case HORA_ADASUM: /* (never elementwise: comm/coll/adasum.c) */                          \
    case HORA_AVERAGE: REDUCE_WIRE_LOOP(T, OP_SUM(x, y)); break;                             \
    case HORA_PRODUCT: REDUCE_WIRE_LOOP(T, OP_PROD(x, y)); break;                            \
    case HORA_MIN: REDUCE_WIRE_LOOP(T, OP_FMIN(x, y)); break;                                \
    case HORA_MAX: REDUCE_WIRE_LOOP(T, OP_FMAX(x, y)); break;                                \
  }

void hora__reduce_wire(hora_dtype acc_dtype, hora_op op, void *dst, hora_dtype wire_dtype,
                       const uint16_t *wire, const void *src, size_t n) {
#ifdef HALF_SIMD
  if (acc_dtype == HORA_FLOAT32 && half_simd_ok()) {
    reduce_wire_f32_simd(op, dst, wire_dtype, wire, src, n);
    return;
  }
#endif
  if (acc_dtype == HORA_FLOAT32) {
    REDUCE_WIRE_OPS(float)
  } else {
    REDUCE_WIRE_OPS(double)
  }
}
