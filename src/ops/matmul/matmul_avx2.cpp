// Quantized decode matmul kernel, AVX2 (the x86-64-v3 baseline): int8 dot
// products with vpmaddubsw + vpmaddwd, one weight row at a time against up
// to 4 tokens (dot_tokens).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "ops/matmul/matmul_kernels.h"

namespace kvtier::matmul_kernels {
namespace {

constexpr int kQK = 32;
// Block sizes in bytes: f16 d (+ f16 m for Q4_1), then the quants.
constexpr int64_t kQ8_0Bytes = 34, kQ4_0Bytes = 18, kQ4_1Bytes = 20;

inline float h2f(const uint8_t* p) {
  uint16_t h;
  __builtin_memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// Sum of 32 products of unsigned bytes `u` with signed bytes `s`, as 8 i32 lanes.
inline __m256i dot_u8s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// 16 bytes of nibble pairs → 32 values 0..15: low nibbles (elements 0..15)
// then high nibbles (16..31), the ggml block order.
inline __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), _mm_and_si128(raw, mask));
}

// out[t · out_stride] = row · token t for NT tokens (activations n_blk
// blocks apart), unpacking each weight block once for all of them. Each
// token's arithmetic is the same whatever NT, so a token's result does not
// depend on its batch. (Interleaving rows instead, sharing each activation
// load, measured equal on DRAM-streamed Q4_1 and 1.6-2x slower on the Q8_0
// output matrix: Zen 3, 30 MB per token.)
template <QType T, int NT>
void dot_tokens(const uint8_t* row, const int8_t* xq, const float* xd, const float* xs, int64_t n_blk,
                float* out, int64_t out_stride) {
  const int64_t n_in = n_blk * kQK;
  __m256 acc[NT];
  float acc_m[NT];
  for (int t = 0; t < NT; ++t) {
    acc[t] = _mm256_setzero_ps();
    acc_m[t] = 0.f;
  }
  for (int64_t b = 0; b < n_blk; ++b) {
    if constexpr (T == QType::q4_1) {
      const uint8_t* blk = row + b * kQ4_1Bytes;
      const __m256i wq = unpack_nibbles(blk + 4);
      const float d = h2f(blk), m = h2f(blk + 2);
      for (int t = 0; t < NT; ++t) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + t * n_in + b * kQK));
        const __m256i p = dot_u8s8(wq, x);
        acc_m[t] += m * xs[t * n_blk + b];
        acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * xd[t * n_blk + b]), _mm256_cvtepi32_ps(p), acc[t]);
      }
    } else {
      // Signed × signed through the unsigned × signed instruction: |w| and
      // x with w's sign.
      const uint8_t* blk = row + b * (T == QType::q8_0 ? kQ8_0Bytes : kQ4_0Bytes);
      const __m256i wq = T == QType::q8_0 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2))
                                          : _mm256_sub_epi8(unpack_nibbles(blk + 2), _mm256_set1_epi8(8));
      const __m256i wabs = _mm256_sign_epi8(wq, wq);
      const float d = h2f(blk);
      for (int t = 0; t < NT; ++t) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + t * n_in + b * kQK));
        const __m256i p = dot_u8s8(wabs, _mm256_sign_epi8(x, wq));
        acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * xd[t * n_blk + b]), _mm256_cvtepi32_ps(p), acc[t]);
      }
    }
  }
  for (int t = 0; t < NT; ++t) out[t * out_stride] = hsum(acc[t]) + acc_m[t];
}

template <QType T>
void rows_typed(const QWeights& w, const QActs& x, int64_t r0, int64_t r1, float* y) {
  const int64_t n_in = w.n_blk * kQK;
  // Blocks of rows small enough to stay in L1/L2 while every token passes
  // over them: a batch of decode tokens reads each weight from DRAM once,
  // and each block of a row is unpacked once for up to 4 tokens.
  const int64_t block = std::max<int64_t>(1, kRowBlockBytes / int64_t(w.row_bytes));
  for (int64_t b0 = r0; b0 < r1; b0 += block) {
    const int64_t b1 = std::min(r1, b0 + block);
    for (int64_t t = 0; t < x.n_tok;) {
      const int8_t* xq = x.q + t * n_in;
      const float* xd = x.d + t * w.n_blk;
      const float* xs = x.s ? x.s + t * w.n_blk : nullptr;
      float* yt = y + t * w.n_out;
      const int64_t nt = std::min<int64_t>(4, x.n_tok - t);
      for (int64_t r = b0; r < b1; ++r) {
        const uint8_t* row = w.data + r * w.row_bytes;
        switch (nt) {
          case 4: dot_tokens<T, 4>(row, xq, xd, xs, w.n_blk, yt + r, w.n_out); break;
          case 3: dot_tokens<T, 3>(row, xq, xd, xs, w.n_blk, yt + r, w.n_out); break;
          case 2: dot_tokens<T, 2>(row, xq, xd, xs, w.n_blk, yt + r, w.n_out); break;
          default: dot_tokens<T, 1>(row, xq, xd, xs, w.n_blk, yt + r, w.n_out); break;
        }
      }
      t += nt;
    }
  }
}

}  // namespace

void rows_avx2(const QWeights& w, const QActs& x, int64_t r0, int64_t r1, float* y) {
  switch (w.type) {
    case QType::q8_0: return rows_typed<QType::q8_0>(w, x, r0, r1, y);
    case QType::q4_0: return rows_typed<QType::q4_0>(w, x, r0, r1, y);
    case QType::q4_1: return rows_typed<QType::q4_1>(w, x, r0, r1, y);
  }
}

}  // namespace kvtier::matmul_kernels
