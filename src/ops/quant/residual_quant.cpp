// Residual landmarks, composed from quantize/dequantize/score.
#include "ops/quant/residual_quant.h"

#include <algorithm>
#include <vector>

#include "core/status.h"

namespace kvtier {

double residual_bytes_per_vector(const ResidualSpec& spec, int dim) {
  KVT_CHECK(spec.group >= 1, "residual landmarks: group {} (expected >= 1)", spec.group);
  return double(bytes_per_vector(spec.resid, dim)) + double(bytes_per_vector(spec.meta, dim)) / spec.group;
}

void quantize_residual(const ResidualSpec& spec, const float* x, int64_t n_vec, int dim, uint8_t* meta_out,
                       uint8_t* resid_out) {
  KVT_CHECK(spec.group >= 1, "residual landmarks: group {} (expected >= 1)", spec.group);
  const size_t meta_bpv = bytes_per_vector(spec.meta, dim);
  const int64_t n_meta = residual_n_meta(spec, n_vec);
  std::vector<float> mean(static_cast<size_t>(dim)), meta_hat(static_cast<size_t>(dim));  // [dim] f32
  std::vector<float> r(static_cast<size_t>(int64_t(spec.group) * dim));                   // [M, dim] f32
  for (int64_t m = 0; m < n_meta; ++m) {
    const int64_t first = m * spec.group;
    const int n_in = int(std::min<int64_t>(spec.group, n_vec - first));
    std::fill(mean.begin(), mean.end(), 0.0f);
    for (int i = 0; i < n_in; ++i)
      for (int t = 0; t < dim; ++t) mean[size_t(t)] += x[(first + i) * dim + t];
    for (int t = 0; t < dim; ++t) mean[size_t(t)] /= float(n_in);
    uint8_t* mq = meta_out + size_t(m) * meta_bpv;
    quantize(spec.meta, mean.data(), 1, dim, mq);
    dequantize(spec.meta, mq, 1, dim, meta_hat.data());
    for (int i = 0; i < n_in; ++i)
      for (int t = 0; t < dim; ++t) r[size_t(i) * dim + t] = x[(first + i) * dim + t] - meta_hat[size_t(t)];
    quantize(spec.resid, r.data(), n_in, dim, resid_out + size_t(first) * bytes_per_vector(spec.resid, dim));
  }
}

void dequantize_residual(const ResidualSpec& spec, const uint8_t* meta, const uint8_t* resid, int64_t n_vec,
                         int dim, float* out) {
  const size_t meta_bpv = bytes_per_vector(spec.meta, dim);
  dequantize(spec.resid, resid, n_vec, dim, out);
  std::vector<float> meta_hat(static_cast<size_t>(dim));  // [dim] f32
  for (int64_t m = 0; m < residual_n_meta(spec, n_vec); ++m) {
    dequantize(spec.meta, meta + size_t(m) * meta_bpv, 1, dim, meta_hat.data());
    for (int64_t i = m * spec.group; i < std::min<int64_t>((m + 1) * spec.group, n_vec); ++i)
      for (int t = 0; t < dim; ++t) out[i * dim + t] += meta_hat[size_t(t)];
  }
}

void score_residual(const ResidualSpec& spec, const float* q, int n_q, const uint8_t* meta, const uint8_t* resid,
                    int64_t n_vec, int dim, float* scores) {
  const int64_t n_meta = residual_n_meta(spec, n_vec);
  std::vector<float> meta_scores(static_cast<size_t>(n_q * n_meta));  // [n_q, n_meta] f32
  ScoreParams p;
  p.q = q, p.n_q = n_q, p.codes = meta, p.n_vec = n_meta, p.dim = dim, p.scores = meta_scores.data();
  score(spec.meta, p);
  p.codes = resid, p.n_vec = n_vec, p.scores = scores;
  score(spec.resid, p);
  for (int j = 0; j < n_q; ++j)
    for (int64_t i = 0; i < n_vec; ++i) scores[j * n_vec + i] += meta_scores[size_t(j * n_meta + i / spec.group)];
}

}  // namespace kvtier
