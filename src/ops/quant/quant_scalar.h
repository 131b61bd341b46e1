// Scalar element formats of the quantizers: FP8 E4M3 ("fn": finite only,
// max 448, one NaN code per sign), FP4 E2M1 (NVFP4 elements), and the b-bit
// code streams of uniform/HIGGS. The inline versions here are the fast ones;
// quant_fp8_ref.cpp holds the definitions by exhaustive nearest-value search
// that the tests compare them with.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/half.h"

namespace kvtier {

constexpr float kE4m3Max = 448.0f;
constexpr float kE2m1Max = 6.0f;

// E4M3 code → value: bias 7, subnormals m·2^-9, S.1111.111 is NaN.
inline float e4m3_to_f32(uint8_t c) {
  int exp = (c >> 3) & 15;
  int man = c & 7;
  float mag;
  if (exp == 0) {
    mag = float(man) * (1.0f / 512.0f);
  } else if (exp == 15 && man == 7) {
    return NAN;
  } else {
    mag = std::ldexp(1.0f + float(man) * 0.125f, exp - 7);
  }
  return (c & 0x80) ? -mag : mag;
}

// f32 → E4M3, round to nearest even, saturating to ±448 (infinities too); NaN
// stays NaN (0x7f / 0xff). Bit arithmetic on the f32 pattern.
inline uint8_t f32_to_e4m3(float f) {
  uint32_t u = f32_to_bits(f);
  uint8_t sign = uint8_t((u >> 24) & 0x80u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint8_t(sign | 0x7f);
  if (a >= 0x43e00000u) return uint8_t(sign | 0x7e);  // ≥ 448
  if (a < 0x3c800000u) {                               // < 2^-6: subnormal grid m·2^-9
    float v = bits_to_f32(a) * 512.0f;                 // exact: a power-of-two scale
    uint32_t m = uint32_t(v);
    float r = v - float(m);
    if (r > 0.5f || (r == 0.5f && (m & 1u))) ++m;      // m == 8 is the smallest normal: right code
    return uint8_t(sign | m);
  }
  // Keep 3 mantissa bits, rounding the 20 dropped ones to nearest even, then
  // rebias the exponent from 127 to 7 (120 << 3 in code units).
  uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
  uint32_t code = r - (120u << 3);
  if (code > 0x7eu) code = 0x7eu;
  return uint8_t(sign | code);
}

// E2M1 magnitudes by code 0..7; bit 3 is the sign.
inline float e2m1_to_f32(uint8_t c) {
  static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  float m = kMag[c & 7];
  return (c & 8) ? -m : m;
}

// f32 → E2M1, round to nearest even (ties go to the even code), saturating to
// ±6. Thresholds are the midpoints between neighbouring magnitudes. NaN → 0.
inline uint8_t f32_to_e2m1(float f) {
  uint8_t sign = std::signbit(f) ? 8 : 0;
  float a = std::fabs(f);
  uint8_t c;
  if (!(a > 0.25f)) c = 0;  // also NaN
  else if (a < 0.75f) c = 1;
  else if (a <= 1.25f) c = 2;
  else if (a < 1.75f) c = 3;
  else if (a <= 2.5f) c = 4;
  else if (a < 3.5f) c = 5;
  else if (a <= 5.0f) c = 6;
  else c = 7;
  return uint8_t(sign | c);
}

// b-bit fields in an LSB-first bit stream (b ≤ 16).
inline void put_bits(uint8_t* p, int64_t bit, uint32_t value, int n_bits) {
  for (int i = 0; i < n_bits; ++i, ++bit) {
    uint8_t mask = uint8_t(1u << (bit & 7));
    if ((value >> i) & 1u) p[bit >> 3] |= mask;
    else p[bit >> 3] &= uint8_t(~mask);
  }
}
inline uint32_t get_bits(const uint8_t* p, int64_t bit, int n_bits) {
  uint32_t v = 0;
  for (int i = 0; i < n_bits; ++i, ++bit) v |= uint32_t((p[bit >> 3] >> (bit & 7)) & 1u) << i;
  return v;
}

// The definitions (quant_fp8_ref.cpp): nearest representable value by search
// over all codes, ties to the even code, saturating.
uint8_t f32_to_e4m3_ref(float f);
uint8_t f32_to_e2m1_ref(float f);

}  // namespace kvtier
