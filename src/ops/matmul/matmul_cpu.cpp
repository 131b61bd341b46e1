#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cpu_features.h"
#include "core/half.h"
#include "core/status.h"
#include "core/threads.h"
#include "ops/dequant/dequant.h"
#include "ops/matmul/matmul.h"
#include "ops/matmul/matmul_kernels.h"

namespace kvtier {

void set_blas_threads(int n_threads) {
  if (n_threads > 0) openblas_set_num_threads(n_threads);
}
int blas_threads() { return openblas_get_num_threads(); }

namespace {

// Below this many tokens the quantized dot products beat dequantize + sgemm.
constexpr int64_t kSgemmMinTokens = 16;
// Rows of f32 weights dequantized at once for sgemm (bounds scratch memory).
constexpr int64_t kSliceFloats = int64_t(8) << 20;

// Activations of one token quantized per 32-block (matmul_kernels::QActs):
// q [n_in] int8, d [n_blk] block scale and s [n_blk] d·Σq (Q8_1), both
// rounded through f16 like the stored formats.
void quantize_activations(const float* x, int64_t n_in, int8_t* q_out, float* d_out, float* s_out) {
  const int64_t n_blk = n_in / kQK;
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
    int8_t* q = q_out + b * kQK;
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
    d_out[b] = f16_to_f32(f32_to_f16(d));
    s_out[b] = f16_to_f32(f32_to_f16(d * float(sum)));
  }
}

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
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

namespace matmul_kernels {

void matmul_quantized_with(RowsKernel kernel, const WeightView* const* ws, float* const* ys, int n,
                           const float* x, int64_t n_tok, ThreadPool& pool) {
  const int64_t n_in = ws[0]->n_in, n_blk = n_in / kQK;
  // [n_tok, n_in] int8 and [n_tok, n_blk] scales; reused (decode calls this
  // hundreds of times per token)
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> d, s;
  q.resize(size_t(n_tok * n_in));
  d.resize(size_t(n_tok * n_blk));
  s.resize(size_t(n_tok * n_blk));
  for (int64_t t = 0; t < n_tok; ++t)
    quantize_activations(x + t * n_in, n_in, q.data() + t * n_in, d.data() + t * n_blk, s.data() + t * n_blk);
  thread_local std::vector<float> d8;
  d8.resize(size_t(n_tok * n_blk * 8));
  for (int64_t i = 0; i < n_tok * n_blk; ++i)
    for (int k = 0; k < 8; ++k) d8[size_t(i * 8 + k)] = d[size_t(i)];
  QActs qa;
  qa.q = q.data();
  qa.d = d.data();
  qa.s = s.data();
  qa.d8 = d8.data();
  qa.n_tok = n_tok;
  constexpr int kMaxGroup = 8;
  KVT_CHECK(n >= 1 && n <= kMaxGroup, "matmul_group: {} matrices (1..{})", n, kMaxGroup);
  QWeights qw[kMaxGroup];
  int64_t row0[kMaxGroup + 1] = {0};  // first row of matrix i in the concatenated row space
  for (int i = 0; i < n; ++i) {
    const WeightView& w = *ws[i];
    qw[i].type = w.type == GgmlType::Q8_0 ? QType::q8_0 : w.type == GgmlType::Q4_0 ? QType::q4_0 : QType::q4_1;
    qw[i].data = static_cast<const uint8_t*>(w.data);
    qw[i].row_bytes = w.row_bytes;
    qw[i].n_out = w.n_out;
    qw[i].n_blk = n_blk;
    row0[i + 1] = row0[i] + w.n_out;
  }
  pool.parallel_for(row0[n], 16, [&](int64_t a, int64_t b, int) {
    for (int i = 0; i < n; ++i) {
      const int64_t r0 = std::max(a, row0[i]), r1 = std::min(b, row0[i + 1]);
      if (r0 < r1) kernel(qw[i], qa, r0 - row0[i], r1 - row0[i], ys[i]);
    }
  });
}

}  // namespace matmul_kernels

int64_t matmul_decode_max_tokens() { return kSgemmMinTokens - 1; }

bool matmul_supports(GgmlType type) {
  return type == GgmlType::F32 || type == GgmlType::Q4_0 || type == GgmlType::Q4_1 ||
         type == GgmlType::Q8_0;
}

void matmul(const WeightView& w, const float* x, int64_t n_tok, float* y, ThreadPool& pool) {
  const WeightView* ws[1] = {&w};
  float* ys[1] = {y};
  matmul_group(ws, ys, 1, x, n_tok, pool);
}

void matmul_group(const WeightView* const* ws, float* const* ys, int n, const float* x, int64_t n_tok,
                  ThreadPool& pool) {
  bool quantized = n_tok < kSgemmMinTokens;
  for (int i = 0; i < n; ++i) {
    const WeightView& w = *ws[i];
    KVT_CHECK(matmul_supports(w.type), "matmul: weight type {} is not supported (convert at load)",
              ggml_type_name(w.type));
    KVT_CHECK(w.type == GgmlType::F32 || w.n_in % kQK == 0, "matmul: row length {} is not a multiple of {}",
              w.n_in, kQK);
    KVT_CHECK(w.n_in == ws[0]->n_in, "matmul_group: row lengths {} and {} differ", w.n_in, ws[0]->n_in);
    quantized = quantized && w.type != GgmlType::F32;
  }
  if (quantized) {
    const matmul_kernels::RowsKernel kernel =
        cpu_path() == CpuPath::avx512 ? matmul_kernels::rows_avx512 : matmul_kernels::rows_avx2;
    return matmul_kernels::matmul_quantized_with(kernel, ws, ys, n, x, n_tok, pool);
  }
  for (int i = 0; i < n; ++i) {
    if (n_tok >= kSgemmMinTokens) matmul_sgemm(*ws[i], x, n_tok, ys[i], pool);
    else if (ws[i]->type == GgmlType::F32) matmul_f32_small(*ws[i], x, n_tok, ys[i], pool);
    else matmul_group(&ws[i], &ys[i], 1, x, n_tok, pool);
  }
}

}  // namespace kvtier
