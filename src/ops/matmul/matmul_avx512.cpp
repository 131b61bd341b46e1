// Quantized decode matmul kernel, AVX-512 VNNI: two 32-value blocks per
// 512-bit vector, each block's 32 int8 products summed by one vpdpbusd
// (u8 × s8 → i32, no 16-bit saturation step), one weight row at a time
// against up to 4 tokens (dot_tokens).
// Compiled with its own target flags (src/ops/CMakeLists.txt); called only
// where cpu_supports(CpuPath::avx512). Also built over SIMDe
// (KVT_EMULATE_AVX512) so that machines without AVX-512 test it.
#include <algorithm>
#include <cstdint>

#include "ops/cpu_isa_emulation.h"
#include "ops/matmul/matmul_kernels.h"

namespace kvtier::matmul_kernels {
namespace {

constexpr int kQK = 32;
constexpr int64_t kQ8_0Bytes = 34, kQ4_0Bytes = 18, kQ4_1Bytes = 20;

inline float h2f(const uint8_t* p) {
  uint16_t h;
  __builtin_memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline float hsum256(__m256 h) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline float hsum512(__m512 v) {
  return hsum256(_mm256_add_ps(_mm512_castps512_ps256(v),
                               _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

inline __m128i load128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// The quants of blocks b (at p0) and b + 1 (at p1) as 64 bytes in activation
// order: [b: elements 0..31 | b+1: elements 0..31], unsigned 0..15 for the
// nibble formats.
template <QType T>
inline __m512i two_blocks(const uint8_t* p0, const uint8_t* p1) {
  if constexpr (T == QType::q8_0) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(load256(p0)), load256(p1), 1);
  } else {
    const __m256i raw = _mm256_inserti128_si256(_mm256_castsi128_si256(load128(p0)), load128(p1), 1);
    const __m256i mask = _mm256_set1_epi8(0x0f);
    const __m256i lo = _mm256_and_si256(raw, mask);                         // [lo_b | lo_b1]
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);   // [hi_b | hi_b1]
    const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);  // lo_b lo_b1 hi_b hi_b1
    return _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0));              // lo_b hi_b lo_b1 hi_b1
  }
}

// The same for one block, 32 bytes.
template <QType T>
inline __m256i one_block(const uint8_t* p) {
  if constexpr (T == QType::q8_0) {
    return load256(p);
  } else {
    const __m128i raw = load128(p);
    const __m128i mask = _mm_set1_epi8(0x0f);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(raw, mask)),
                                   _mm_and_si128(_mm_srli_epi16(raw, 4), mask), 1);
  }
}

// Per-lane i32 sums of 4 products w·x; signed weights go through the
// unsigned × signed instruction as |w| · (x with w's sign).
template <QType T>
inline __m256i dot256(__m256i w, __m256i x) {
  if constexpr (T == QType::q4_1) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x);
  } else {
    if constexpr (T == QType::q4_0) w = _mm256_sub_epi8(w, _mm256_set1_epi8(8));
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
  }
}

constexpr int64_t block_bytes(QType T) {
  return T == QType::q8_0 ? kQ8_0Bytes : T == QType::q4_0 ? kQ4_0Bytes : kQ4_1Bytes;
}
constexpr int64_t quant_offset(QType T) { return T == QType::q4_1 ? 4 : 2; }

// out[t · out_stride] = row · token t for NT tokens (activations n_blk
// blocks apart). Each pair of weight blocks is unpacked, and its scales
// spread over the vector's two halves, once for all NT tokens; a token's
// block scales come pre-spread (QActs::d8), so that a pair costs each token
// one vpdpbusd, one multiply and one FMA (and Q4_1's scalar offset term).
// Each token's arithmetic is the same whatever NT, so a token's result does
// not depend on its batch, and it is that of the one-token kernel before.
template <QType T, int NT>
void dot_tokens(const uint8_t* row, const QActs& x, int64_t t0, int64_t n_blk, float* out, int64_t out_stride) {
  constexpr int64_t kB = block_bytes(T), kOff = quant_offset(T);
  const int64_t n_in = n_blk * kQK;
  const int8_t* xq = x.q + t0 * n_in;
  const float* xd = x.d + t0 * n_blk;
  const float* xs = x.s ? x.s + t0 * n_blk : nullptr;
  const float* xd8 = x.d8 + t0 * n_blk * 8;
  __m512 acc[NT];
  float acc_m[NT];
  for (int t = 0; t < NT; ++t) {
    acc[t] = _mm512_setzero_ps();
    acc_m[t] = 0.f;
  }
  int64_t b = 0;
  for (; b + 2 <= n_blk; b += 2) {
    const uint8_t* blk = row + b * kB;
    __m512i w = two_blocks<T>(blk + kOff, blk + kB + kOff);
    // lanes 0..7 hold block b, 8..15 block b + 1
    const __m512 d = _mm512_mask_blend_ps(__mmask16(0xff00), _mm512_set1_ps(h2f(blk)), _mm512_set1_ps(h2f(blk + kB)));
    __mmask64 neg = 0;
    if constexpr (T != QType::q4_1) {
      // Signed weights through the unsigned × signed instruction: |w| and x with w's sign.
      if constexpr (T == QType::q4_0) w = _mm512_sub_epi8(w, _mm512_set1_epi8(8));
      neg = _mm512_movepi8_mask(w);
      w = _mm512_abs_epi8(w);
    }
    for (int t = 0; t < NT; ++t) {
      __m512i xv = _mm512_loadu_si512(xq + t * n_in + b * kQK);
      if constexpr (T != QType::q4_1) xv = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
      const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, xv);
      const __m512 scale = _mm512_mul_ps(d, _mm512_loadu_ps(xd8 + t * n_blk * 8 + b * 8));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, acc[t]);
    }
    if constexpr (T == QType::q4_1) {
      // Q4_1's offset term m · Σx, per block (the order of the one-token kernel this replaced).
      const float m0 = h2f(blk + 2), m1 = h2f(blk + kB + 2);
      for (int t = 0; t < NT; ++t) acc_m[t] += m0 * xs[t * n_blk + b] + m1 * xs[t * n_blk + b + 1];
    }
  }
  float tail[NT] = {};
  if (b < n_blk) {
    const uint8_t* blk = row + b * kB;
    const __m256i w = one_block<T>(blk + kOff);
    for (int t = 0; t < NT; ++t) {
      const __m256i p = dot256<T>(w, load256(reinterpret_cast<const uint8_t*>(xq + t * n_in + b * kQK)));
      tail[t] = hsum256(_mm256_mul_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(h2f(blk) * xd[t * n_blk + b])));
      if constexpr (T == QType::q4_1) acc_m[t] += h2f(blk + 2) * xs[t * n_blk + b];
    }
  }
  for (int t = 0; t < NT; ++t) out[t * out_stride] = hsum512(acc[t]) + tail[t] + acc_m[t];
}

template <QType T>
void rows_typed(const QWeights& w, const QActs& x, int64_t r0, int64_t r1, float* y) {
  // Blocks of rows small enough to stay in L1/L2 while every token passes
  // over them: a batch of decode tokens reads each weight from DRAM once,
  // and each pair of blocks of a row is unpacked once for up to 4 tokens.
  // (Interleaving rows instead, sharing each activation load, measured equal
  // on DRAM-streamed Q4_1 and 1.6-2x slower on the Q8_0 output matrix.)
  const int64_t block = std::max<int64_t>(1, kRowBlockBytes / int64_t(w.row_bytes));
  for (int64_t b0 = r0; b0 < r1; b0 += block) {
    const int64_t b1 = std::min(r1, b0 + block);
    for (int64_t t = 0; t < x.n_tok;) {
      const int64_t nt = std::min<int64_t>(4, x.n_tok - t);
      float* yt = y + t * w.n_out;
      for (int64_t r = b0; r < b1; ++r) {
        const uint8_t* row = w.data + r * w.row_bytes;
        switch (nt) {
          case 4: dot_tokens<T, 4>(row, x, t, w.n_blk, yt + r, w.n_out); break;
          case 3: dot_tokens<T, 3>(row, x, t, w.n_blk, yt + r, w.n_out); break;
          case 2: dot_tokens<T, 2>(row, x, t, w.n_blk, yt + r, w.n_out); break;
          default: dot_tokens<T, 1>(row, x, t, w.n_blk, yt + r, w.n_out); break;
        }
      }
      t += nt;
    }
  }
}

}  // namespace

void KVT_AVX512_NAME(rows_avx512)(const QWeights& w, const QActs& x, int64_t r0, int64_t r1, float* y) {
  switch (w.type) {
    case QType::q8_0: return rows_typed<QType::q8_0>(w, x, r0, r1, y);
    case QType::q4_0: return rows_typed<QType::q4_0>(w, x, r0, r1, y);
    case QType::q4_1: return rows_typed<QType::q4_1>(w, x, r0, r1, y);
  }
}

}  // namespace kvtier::matmul_kernels
