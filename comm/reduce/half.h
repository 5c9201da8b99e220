/* IEEE binary16 and bfloat16 conversions, round to nearest even. NaN stays
 * NaN (quieted), infinities stay infinite, overflow becomes infinity. */
#ifndef HORA_HALF_H
#define HORA_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t hora__f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

static inline float hora__f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

/* The conversions compute every case and pick the answer with masks, not
 * branches or ternaries the compiler might turn into branches, so the
 * reduction loops that call them vectorise. */
static inline uint32_t hora__pick(uint32_t cond, uint32_t yes, uint32_t no) {
  uint32_t mask = 0u - cond;
  return (yes & mask) | (no & ~mask);
}

static inline float hora__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t em = h & 0x7fffu;
  /* Zero or subnormal: mant * 2^-24 is exact in float. */
  uint32_t small = hora__f32_bits((float)em * 0x1p-24f);
  uint32_t special = (em << 13) | 0x7f800000u; /* infinity or NaN */
  uint32_t normal = (em << 13) + (112u << 23); /* rebias the exponent */
  uint32_t r = hora__pick(em < 0x400u, small, hora__pick(em >= 0x7c00u, special, normal));
  return hora__f32_from_bits(r | sign);
}

static inline uint16_t hora__f32_to_f16(float f) {
  uint32_t x = hora__f32_bits(f);
  uint32_t sign = (x & 0x80000000u) >> 16;
  x &= 0x7fffffffu;
  /* |f| >= 65536 (exponent 143 = 127 + 16): infinity, or NaN kept quiet. */
  uint32_t big = hora__pick(x > 0x7f800000u, 0x7e00u | ((x >> 13) & 0x3ffu), 0x7c00u);
  /* Below 2^-14 the result is subnormal or zero. Adding 0.5 shifts the
   * mantissa so that the FPU's own round-to-nearest-even does the work. */
  const uint32_t magic = 126u << 23;
  uint32_t small = hora__f32_bits(hora__f32_from_bits(x) + hora__f32_from_bits(magic)) - magic;
  /* Rebias the exponent (-112 << 23) and add half an ulp minus one, plus one
   * when odd; 65520 and above round up to 0x7c00, which is infinity. */
  uint32_t normal = (x + 0xc8000fffu + ((x >> 13) & 1u)) >> 13;
  uint32_t h = hora__pick(x >= (143u << 23), big, hora__pick(x < (113u << 23), small, normal));
  return (uint16_t)(h | sign);
}

static inline float hora__bf16_to_f32(uint16_t b) { return hora__f32_from_bits((uint32_t)b << 16); }

static inline uint16_t hora__f32_to_bf16(float f) {
  uint32_t x = hora__f32_bits(f);
  uint32_t nan = (x >> 16) | 0x40u;
  uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return (uint16_t)hora__pick((x & 0x7fffffffu) > 0x7f800000u, nan, rounded);
}

#endif
