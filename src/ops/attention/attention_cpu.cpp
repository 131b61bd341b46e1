#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/threads.h"
#include "ops/attention/attention.h"
#include "ops/decode_attn/decode_attn_kernels.h"

namespace kvtier {
namespace {

// Query rows processed per sgemm block (bounds the score matrix).
constexpr int kQueryBlock = 256;
// Below this many queries, per-head dot products beat sgemm.
constexpr int kSgemmMinQueries = 8;

inline float dot(const float* a, const float* b, int n) {
  __m256 acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  alignas(32) float t[8];
  _mm256_store_ps(t, acc);
  float s = t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline void axpy(float a, const float* x, float* y, int n) {
  const __m256 va = _mm256_set1_ps(a);
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

// One query over n_rows keys with the given stride; returns log-sum-exp.
float attend_rows(const float* q, const float* k, const float* v, int64_t n_rows, int64_t stride,
                  int head_dim, float scale, float* out, std::vector<float>& s) {
  std::fill(out, out + head_dim, 0.0f);
  if (n_rows == 0) return -std::numeric_limits<float>::infinity();
  s.resize(size_t(n_rows));
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n_rows; ++j) {
    s[size_t(j)] = dot(q, k + j * stride, head_dim) * scale;
    mx = std::max(mx, s[size_t(j)]);
  }
  float sum = 0;
  for (int64_t j = 0; j < n_rows; ++j) {
    const float p = std::exp(s[size_t(j)] - mx);
    sum += p;
    axpy(p, v + j * stride, out, head_dim);
  }
  const float inv = 1.0f / sum;
  for (int d = 0; d < head_dim; ++d) out[d] *= inv;
  return mx + std::log(sum);
}

void causal_small(const AttentionParams& p, const float* q, int n_q, const float* k, const float* v,
                  int64_t n_kv, float* out) {
  const int group = p.n_head / p.n_kv_head;
  const int64_t stride = int64_t(p.n_kv_head) * p.head_dim;
  default_pool().parallel_for(int64_t(n_q) * p.n_head, 1, [&](int64_t a, int64_t b, int) {
    std::vector<float> s;
    for (int64_t job = a; job < b; ++job) {
      const int i = int(job / p.n_head), h = int(job % p.n_head);
      const int g = h / group;
      attend_rows(q + job * p.head_dim, k + g * p.head_dim, v + g * p.head_dim,
                  n_kv - n_q + i + 1, stride, p.head_dim, p.scale, out + job * p.head_dim, s);
    }
  });
}

void causal_sgemm(const AttentionParams& p, const float* q, int n_q, const float* k,
                  const float* v, int64_t n_kv, float* out) {
  const int group = p.n_head / p.n_kv_head;
  const int64_t kv_stride = int64_t(p.n_kv_head) * p.head_dim;
  const int64_t q_stride = int64_t(p.n_head) * p.head_dim;
  std::vector<float> scores;  // [block rows, n_kv] f32
  for (int i0 = 0; i0 < n_q; i0 += kQueryBlock) {
    const int n_rows = std::min(kQueryBlock, n_q - i0);
    // Keys past the last row's position are masked for every row: skip them.
    const int64_t n_cols = n_kv - n_q + i0 + n_rows;
    scores.resize(size_t(n_rows) * size_t(n_cols));
    for (int h = 0; h < p.n_head; ++h) {
      const int g = h / group;
      const float* qh = q + int64_t(i0) * q_stride + h * p.head_dim;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_rows, int(n_cols), p.head_dim, p.scale,
                  qh, int(q_stride), k + g * p.head_dim, int(kv_stride), 0.0f, scores.data(),
                  int(n_cols));
      default_pool().parallel_for(n_rows, 4, [&](int64_t a, int64_t b, int) {
        for (int64_t r = a; r < b; ++r) {
          float* row = &scores[size_t(r) * size_t(n_cols)];
          const int64_t n_visible = n_kv - n_q + i0 + r + 1;
          float mx = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j < n_visible; ++j) mx = std::max(mx, row[j]);
          for (int64_t j = 0; j < n_visible; ++j) row[j] -= mx;
          // The decode kernel's vector e^x (a scalar expf per score was ~7 %
          // of an 8K prefill).
          attn_kernels::exp_avx2(row, n_visible, row);
          float sum = 0;
          for (int64_t j = 0; j < n_visible; ++j) sum += row[j];
          const float inv = 1.0f / sum;
          for (int64_t j = 0; j < n_visible; ++j) row[j] *= inv;
          std::fill(row + n_visible, row + n_cols, 0.0f);
        }
      });
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n_rows, p.head_dim, int(n_cols), 1.0f,
                  scores.data(), int(n_cols), v + g * p.head_dim, int(kv_stride), 0.0f,
                  out + int64_t(i0) * q_stride + h * p.head_dim, int(q_stride));
    }
  }
}

}  // namespace

void attention_causal(const AttentionParams& p, const float* q, int n_q, const float* k,
                      const float* v, int64_t n_kv, float* out) {
  if (n_q < kSgemmMinQueries) return causal_small(p, q, n_q, k, v, n_kv, out);
  causal_sgemm(p, q, n_q, k, v, n_kv, out);
}

void attention_gathered(const AttentionParams& p, const float* q, const float* k, const float* v,
                        const int64_t* indptr, float* out, float* lse) {
  const int group = p.n_head / p.n_kv_head;
  default_pool().parallel_for(p.n_head, 1, [&](int64_t a, int64_t b, int) {
    std::vector<float> s;
    for (int64_t h = a; h < b; ++h) {
      const int g = int(h) / group;
      const int64_t r0 = indptr[g], r1 = indptr[g + 1];
      const float l = attend_rows(q + h * p.head_dim, k + r0 * p.head_dim, v + r0 * p.head_dim,
                                  r1 - r0, p.head_dim, p.head_dim, p.scale, out + h * p.head_dim, s);
      if (lse) lse[h] = l;
    }
  });
}

}  // namespace kvtier
