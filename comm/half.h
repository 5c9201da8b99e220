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

static inline float hora__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    /* Zero or subnormal: mant * 2^-24 is exact in float. */
    float f = (float)mant * 0x1p-24f;
    return hora__f32_from_bits(hora__f32_bits(f) | sign);
  }
  if (exp == 31) {
    return hora__f32_from_bits(sign | 0x7f800000u | (mant << 13));
  }
  return hora__f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

static inline uint16_t hora__f32_to_f16(float f) {
  uint32_t x = hora__f32_bits(f);
  uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint16_t h;
  if (x >= (143u << 23)) {
    /* |f| >= 65536, infinity or NaN (exponent 143 = 127 + 16). */
    h = x > 0x7f800000u ? (uint16_t)(0x7e00u | ((x >> 13) & 0x3ffu)) : 0x7c00u;
  } else if (x < (113u << 23)) {
    /* Below 2^-14: the result is subnormal or zero. Adding 0.5 shifts the
     * mantissa so that the FPU's own round-to-nearest-even does the work. */
    const uint32_t magic = 126u << 23;
    float r = hora__f32_from_bits(x) + hora__f32_from_bits(magic);
    h = (uint16_t)(hora__f32_bits(r) - magic);
  } else {
    uint32_t odd = (x >> 13) & 1u;
    x += 0xc8000fffu; /* rebias exponent (-112 << 23) and add half an ulp minus one */
    x += odd;
    h = (uint16_t)(x >> 13);
    /* 65520 and above round up to 0x7c00, which is infinity: correct. */
  }
  return (uint16_t)(h | (sign >> 16));
}

static inline float hora__bf16_to_f32(uint16_t b) { return hora__f32_from_bits((uint32_t)b << 16); }

static inline uint16_t hora__f32_to_bf16(float f) {
  uint32_t x = hora__f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return (uint16_t)((x >> 16) | 0x40u);
  }
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

#endif
