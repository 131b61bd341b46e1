#include <cmath>
#include <limits>
#include <vector>

#include "ops/attention/attention.h"

namespace kvtier {
namespace {

// out_h = softmax(scale * q·K[rows]) · V[rows]; returns the log-sum-exp.
double attend_rows_ref(const float* q, const float* k, const float* v, int64_t n_rows,
                       int64_t row_stride, int head_dim, float scale, float* out) {
  if (n_rows == 0) {
    for (int d = 0; d < head_dim; ++d) out[d] = 0;
    return -std::numeric_limits<double>::infinity();
  }
  std::vector<double> s(static_cast<size_t>(n_rows));
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n_rows; ++j) {
    double dot = 0;
    for (int d = 0; d < head_dim; ++d) dot += double(q[d]) * k[j * row_stride + d];
    s[size_t(j)] = dot * scale;
    mx = std::max(mx, s[size_t(j)]);
  }
  double sum = 0;
  std::vector<double> acc(size_t(head_dim), 0.0);
  for (int64_t j = 0; j < n_rows; ++j) {
    const double p = std::exp(s[size_t(j)] - mx);
    sum += p;
    for (int d = 0; d < head_dim; ++d) acc[size_t(d)] += p * v[j * row_stride + d];
  }
  for (int d = 0; d < head_dim; ++d) out[d] = float(acc[size_t(d)] / sum);
  return mx + std::log(sum);
}

}  // namespace

void attention_causal_ref(const AttentionParams& p, const float* q, int n_q, const float* k,
                          const float* v, int64_t n_kv, float* out) {
  const int group = p.n_head / p.n_kv_head;
  const int64_t kv_stride = int64_t(p.n_kv_head) * p.head_dim;
  for (int i = 0; i < n_q; ++i) {
    const int64_t n_visible = n_kv - n_q + i + 1;
    for (int h = 0; h < p.n_head; ++h) {
      const int g = h / group;
      attend_rows_ref(q + (int64_t(i) * p.n_head + h) * p.head_dim, k + g * p.head_dim,
                      v + g * p.head_dim, n_visible, kv_stride, p.head_dim, p.scale,
                      out + (int64_t(i) * p.n_head + h) * p.head_dim);
    }
  }
}

void attention_gathered_ref(const AttentionParams& p, const float* q, const float* k,
                            const float* v, const int64_t* indptr, float* out, float* lse) {
  const int group = p.n_head / p.n_kv_head;
  for (int h = 0; h < p.n_head; ++h) {
    const int g = h / group;
    const int64_t r0 = indptr[g], r1 = indptr[g + 1];
    const double l = attend_rows_ref(q + int64_t(h) * p.head_dim, k + r0 * p.head_dim,
                                     v + r0 * p.head_dim, r1 - r0, p.head_dim, p.head_dim, p.scale,
                                     out + int64_t(h) * p.head_dim);
    if (lse) lse[h] = float(l);
  }
}

void merge_attention(int n_head, int head_dim, float* out_a, float* lse_a, const float* out_b,
                     const float* lse_b) {
  // softmax over the union = weights exp(lse_a - m), exp(lse_b - m) renormalised.
  for (int h = 0; h < n_head; ++h) {
    const float la = lse_a[h], lb = lse_b[h];
    if (std::isinf(lb) && lb < 0) continue;
    if (std::isinf(la) && la < 0) {
      for (int d = 0; d < head_dim; ++d) out_a[h * head_dim + d] = out_b[h * head_dim + d];
      lse_a[h] = lb;
      continue;
    }
    const float m = std::max(la, lb);
    const float wa = std::exp(la - m), wb = std::exp(lb - m);
    const float inv = 1.0f / (wa + wb);
    for (int d = 0; d < head_dim; ++d)
      out_a[h * head_dim + d] = (out_a[h * head_dim + d] * wa + out_b[h * head_dim + d] * wb) * inv;
    lse_a[h] = m + std::log(wa + wb);
  }
}

}  // namespace kvtier
