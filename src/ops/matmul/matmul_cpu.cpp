#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/half.h"
#include "core/status.h"
#include "core/threads.h"
#include "ops/dequant/dequant.h"
#include "ops/matmul/matmul.h"

namespace kvtier {
namespace {

// Below this many tokens the quantized dot products beat dequantize + sgemm.
constexpr int64_t kSgemmMinTokens = 16;
// Rows of f32 weights dequantized at once for sgemm (bounds scratch memory).
constexpr int64_t kSliceFloats = int64_t(8) << 20;

// F16C conversion (x86-64-v3 baseline); the scalar f16_to_f32 branches.
inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// Activations of one token quantized per 32-block.
struct QuantizedRow {
  std::vector<int8_t> q;  // [n_in]
  std::vector<float> d;   // [n_blk] block scale (rounded through f16 like the stored format)
  std::vector<float> s;   // [n_blk] d * sum(q) (Q8_1), rounded through f16
};

void quantize_activations(const float* x, int64_t n_in, QuantizedRow* out) {
  const int64_t n_blk = n_in / kQK;
  out->q.resize(size_t(n_in));
  out->d.resize(size_t(n_blk));
  out->s.resize(size_t(n_blk));
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < n_blk; ++b) {
    const float* xb = x + b * kQK;
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(xb + 8 * j);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, v[j]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float d = _mm_cvtss_f32(m) / 127.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    int8_t* q = &out->q[size_t(b * kQK)];
    int sum = 0;
    for (int j = 0; j < 4; ++j) {
      // Round half to even, as nearbyint does in the reference.
      __m256i qi = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], vid),
                                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      alignas(32) int32_t tmp[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), qi);
      for (int i = 0; i < 8; ++i) {
        q[8 * j + i] = int8_t(tmp[i]);
        sum += tmp[i];
      }
    }
    out->d[size_t(b)] = f16_to_f32(f32_to_f16(d));
    out->s[size_t(b)] = f16_to_f32(f32_to_f16(d * float(sum)));
  }
}

// Sum of 32 products of unsigned bytes `u` with signed bytes `s`, as 8 i32 lanes.
inline __m256i dot_u8s8(__m256i u, __m256i s) {
  const __m256i ones = _mm256_set1_epi16(1);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones);
}

inline __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  __m128i lo = _mm_and_si128(raw, mask);
  __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
  return _mm256_set_m128i(hi, lo);
}

float dot_q8_0(const BlockQ8_0* w, const QuantizedRow& x, int64_t n_blk) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blk; ++b) {
    __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs));
    __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&x.q[size_t(b * kQK)]));
    __m256i p = dot_u8s8(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[b].d) * x.d[size_t(b)]),
                          _mm256_cvtepi32_ps(p), acc);
  }
  return hsum(acc);
}

float dot_q4_0(const BlockQ4_0* w, const QuantizedRow& x, int64_t n_blk) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i eight = _mm256_set1_epi8(8);
  for (int64_t b = 0; b < n_blk; ++b) {
    __m256i wq = _mm256_sub_epi8(unpack_nibbles(w[b].qs), eight);
    __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&x.q[size_t(b * kQK)]));
    __m256i p = dot_u8s8(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[b].d) * x.d[size_t(b)]),
                          _mm256_cvtepi32_ps(p), acc);
  }
  return hsum(acc);
}

float dot_q4_1(const BlockQ4_1* w, const QuantizedRow& x, int64_t n_blk) {
  __m256 acc = _mm256_setzero_ps();
  float acc_m = 0;
  for (int64_t b = 0; b < n_blk; ++b) {
    __m256i wq = unpack_nibbles(w[b].qs);
    __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&x.q[size_t(b * kQK)]));
    __m256i p = dot_u8s8(wq, xq);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[b].d) * x.d[size_t(b)]),
                          _mm256_cvtepi32_ps(p), acc);
    acc_m += h2f(w[b].m) * x.s[size_t(b)];
  }
  return hsum(acc) + acc_m;
}

float dot_f32(const float* w, const float* x, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
  }
  float s = hsum(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) s += w[i] * x[i];
  return s;
}

void matmul_quantized(const WeightView& w, const float* x, int64_t n_tok, float* y,
                      ThreadPool& pool) {
  const int64_t n_blk = w.n_in / kQK;
  std::vector<QuantizedRow> xq(static_cast<size_t>(n_tok));
  for (int64_t t = 0; t < n_tok; ++t) quantize_activations(x + t * w.n_in, w.n_in, &xq[size_t(t)]);
  pool.parallel_for(w.n_out, 16, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* row = w.row(r);
      for (int64_t t = 0; t < n_tok; ++t) {
        float v;
        switch (w.type) {
          case GgmlType::Q8_0: v = dot_q8_0(reinterpret_cast<const BlockQ8_0*>(row), xq[size_t(t)], n_blk); break;
          case GgmlType::Q4_0: v = dot_q4_0(reinterpret_cast<const BlockQ4_0*>(row), xq[size_t(t)], n_blk); break;
          default: v = dot_q4_1(reinterpret_cast<const BlockQ4_1*>(row), xq[size_t(t)], n_blk); break;
        }
        y[t * w.n_out + r] = v;
      }
    }
  });
}

void matmul_f32_small(const WeightView& w, const float* x, int64_t n_tok, float* y,
                      ThreadPool& pool) {
  pool.parallel_for(w.n_out, 16, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = reinterpret_cast<const float*>(w.row(r));
      for (int64_t t = 0; t < n_tok; ++t) y[t * w.n_out + r] = dot_f32(row, x + t * w.n_in, w.n_in);
    }
  });
}

void matmul_sgemm(const WeightView& w, const float* x, int64_t n_tok, float* y, ThreadPool& pool) {
  if (w.type == GgmlType::F32) {
    // y[n_tok, n_out] = x[n_tok, n_in] · W[n_out, n_in]ᵀ
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n_tok), int(w.n_out), int(w.n_in), 1.0f,
                x, int(w.n_in), reinterpret_cast<const float*>(w.data), int(w.n_in), 0.0f, y,
                int(w.n_out));
    return;
  }
  thread_local std::vector<float> scratch;  // [slice_rows, n_in] f32
  const int64_t slice_rows = std::max<int64_t>(1, std::min(w.n_out, kSliceFloats / w.n_in));
  scratch.resize(size_t(slice_rows * w.n_in));
  // The pool's workers must write the caller's buffer: inside the lambda the
  // name `scratch` would denote each worker's own (empty) thread_local.
  float* buf = scratch.data();
  for (int64_t r0 = 0; r0 < w.n_out; r0 += slice_rows) {
    const int64_t n_rows = std::min(slice_rows, w.n_out - r0);
    pool.parallel_for(n_rows, 8, [&](int64_t a, int64_t b, int) {
      for (int64_t r = a; r < b; ++r)
        dequantize_row(w.type, w.row(r0 + r), buf + r * w.n_in, w.n_in);
    });
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n_tok), int(n_rows), int(w.n_in), 1.0f,
                x, int(w.n_in), scratch.data(), int(w.n_in), 0.0f, y + r0, int(w.n_out));
  }
}

}  // namespace

bool matmul_supports(GgmlType type) {
  return type == GgmlType::F32 || type == GgmlType::Q4_0 || type == GgmlType::Q4_1 ||
         type == GgmlType::Q8_0;
}

void matmul(const WeightView& w, const float* x, int64_t n_tok, float* y, ThreadPool& pool) {
  KVT_CHECK(matmul_supports(w.type), "matmul: weight type {} is not supported (convert at load)",
            ggml_type_name(w.type));
  KVT_CHECK(w.type == GgmlType::F32 || w.n_in % kQK == 0,
            "matmul: row length {} is not a multiple of {}", w.n_in, kQK);
  if (n_tok >= kSgemmMinTokens) return matmul_sgemm(w, x, n_tok, y, pool);
  if (w.type == GgmlType::F32) return matmul_f32_small(w, x, n_tok, y, pool);
  matmul_quantized(w, x, n_tok, y, pool);
}

}  // namespace kvtier
