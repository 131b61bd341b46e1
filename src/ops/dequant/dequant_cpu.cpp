// dequantize_row / quantize_row: AVX2 + F16C paths for the formats the default
// model and the f16/bf16 checkpoints use (F16, BF16, Q4_0, Q4_1, Q8_0); every
// other format goes to the reference. x86-64-v3 is the project baseline, so no
// run-time dispatch is needed. Tested against dequant_ref.cpp in dequant_test.cpp.
#include <immintrin.h>

#include <cstring>

#include "core/half.h"
#include "core/status.h"
#include "ops/dequant/dequant.h"

namespace kvtier {

namespace {

void f16_row(const uint8_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  if (i < n) dequantize_row_ref(GgmlType::F16, src + 2 * i, dst + i, n - i);
}

void bf16_row(const uint8_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(w));
  }
  if (i < n) dequantize_row_ref(GgmlType::BF16, src + 2 * i, dst + i, n - i);
}

// The 32 4-bit values of a legacy block as 32 bytes in value order: low
// nibbles (values 0..15) then high nibbles (16..31).
inline __m256i unpack_nibbles(const uint8_t* qs) {
  __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  __m128i lo = _mm_and_si128(packed, _mm_set1_epi8(0xF));
  __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0xF));
  return _mm256_set_m128i(hi, lo);
}

// Stores d * q + m for 32 unsigned bytes q.
inline void store_affine(__m256i q, __m256 d, __m256 m, float* y) {
  __m128i q_lo = _mm256_castsi256_si128(q);
  __m128i q_hi = _mm256_extracti128_si256(q, 1);
  __m256i parts[4] = {_mm256_cvtepu8_epi32(q_lo), _mm256_cvtepu8_epi32(_mm_srli_si128(q_lo, 8)),
                      _mm256_cvtepu8_epi32(q_hi), _mm256_cvtepu8_epi32(_mm_srli_si128(q_hi, 8))};
  for (int k = 0; k < 4; ++k)
    _mm256_storeu_ps(y + 8 * k, _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(parts[k])), m));
}

void q4_0_row(const BlockQ4_0* b, float* y, int64_t n_blocks) {
  for (int64_t k = 0; k < n_blocks; ++k, y += kQK) {
    __m256 d = _mm256_set1_ps(f16_to_f32(b[k].d));
    // d * (q - 8) = d * q + (-8 d)
    store_affine(unpack_nibbles(b[k].qs), d, _mm256_mul_ps(d, _mm256_set1_ps(-8.0f)), y);
  }
}

void q4_1_row(const BlockQ4_1* b, float* y, int64_t n_blocks) {
  for (int64_t k = 0; k < n_blocks; ++k, y += kQK)
    store_affine(unpack_nibbles(b[k].qs), _mm256_set1_ps(f16_to_f32(b[k].d)),
                 _mm256_set1_ps(f16_to_f32(b[k].m)), y);
}

void q8_0_row(const BlockQ8_0* b, float* y, int64_t n_blocks) {
  for (int64_t k = 0; k < n_blocks; ++k, y += kQK) {
    __m256 d = _mm256_set1_ps(f16_to_f32(b[k].d));
    for (int j = 0; j < kQK; j += 8) {
      __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b[k].qs + j));
      __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
      _mm256_storeu_ps(y + j, _mm256_mul_ps(d, q));
    }
  }
}

}  // namespace

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  GgmlTypeTraits tr;
  if (!ggml_type_traits(uint32_t(type), &tr) || n < 0 || n % tr.block_size != 0)
    return dequantize_row_ref(type, src, dst, n);  // the reference raises the error
  const uint8_t* p = static_cast<const uint8_t*>(src);
  switch (type) {
    case GgmlType::F16: return f16_row(p, dst, n);
    case GgmlType::BF16: return bf16_row(p, dst, n);
    case GgmlType::Q4_0: return q4_0_row(static_cast<const BlockQ4_0*>(src), dst, n / kQK);
    case GgmlType::Q4_1: return q4_1_row(static_cast<const BlockQ4_1*>(src), dst, n / kQK);
    case GgmlType::Q8_0: return q8_0_row(static_cast<const BlockQ8_0*>(src), dst, n / kQK);
    default: return dequantize_row_ref(type, src, dst, n);
  }
}

void quantize_row(GgmlType type, const float* src, void* dst, int64_t n) {
  // Quantization only runs when writing test and tiny models; the reference is fast enough.
  quantize_row_ref(type, src, dst, n);
}

}  // namespace kvtier
