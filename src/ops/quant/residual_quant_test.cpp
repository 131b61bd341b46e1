// Residual landmarks: the residual corrects the meta's error, scores equal
// q·dequantized, bytes add up.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/quant/higgs_grid.h"
#include "ops/quant/residual_quant.h"

namespace kvtier {
namespace {

TEST(ResidualQuant, ReconstructsBetterThanMetaOrResidualAlone) {
  const int dim = 128, n_vec = 83;  // 83 = 10 groups of 8 + a partial group of 3
  ResidualSpec spec{parse_quant_spec("higgs4:g128"), parse_quant_spec("1bit"), 8};
  // vectors = shared direction per group + per-vector noise: [n_vec, dim] f32
  std::vector<float> x(static_cast<size_t>(n_vec * dim)), noise(x.size()), base(x.size());
  gaussian_fill(base.data(), int64_t(base.size()), 1);
  gaussian_fill(noise.data(), int64_t(noise.size()), 2);
  for (int i = 0; i < n_vec; ++i)
    for (int t = 0; t < dim; ++t)
      x[size_t(i * dim + t)] = 3.0f * base[size_t((i / 8) * dim + t)] + noise[size_t(i * dim + t)];
  const int64_t n_meta = residual_n_meta(spec, n_vec);
  ASSERT_EQ(n_meta, 11);
  std::vector<uint8_t> meta(bytes_per_vector(spec.meta, dim) * size_t(n_meta));
  std::vector<uint8_t> resid(bytes_per_vector(spec.resid, dim) * size_t(n_vec));
  quantize_residual(spec, x.data(), n_vec, dim, meta.data(), resid.data());
  std::vector<float> y(x.size());
  dequantize_residual(spec, meta.data(), resid.data(), n_vec, dim, y.data());

  // error of the residual scheme vs the meta alone vs 1 bit alone
  std::vector<float> y1(x.size());
  std::vector<uint8_t> c1(bytes_per_vector(spec.resid, dim) * size_t(n_vec));
  quantize(spec.resid, x.data(), n_vec, dim, c1.data());
  dequantize(spec.resid, c1.data(), n_vec, dim, y1.data());
  double e_res = 0, e_meta = 0, e_1bit = 0;
  for (int i = 0; i < n_vec; ++i) {
    for (int t = 0; t < dim; ++t) {
      size_t k = size_t(i * dim + t);
      e_res += (x[k] - y[k]) * (x[k] - y[k]);
      e_1bit += (x[k] - y1[k]) * (x[k] - y1[k]);
      e_meta += noise[k] * noise[k];  // ≈ error of replacing x by its group mean
    }
  }
  EXPECT_LT(e_res, 0.6 * e_meta);
  EXPECT_LT(e_res, 0.6 * e_1bit);

  std::vector<float> q(static_cast<size_t>(2 * dim)), s(static_cast<size_t>(2 * n_vec));
  gaussian_fill(q.data(), int64_t(q.size()), 3);
  score_residual(spec, q.data(), 2, meta.data(), resid.data(), n_vec, dim, s.data());
  for (int j = 0; j < 2; ++j)
    for (int i = 0; i < n_vec; ++i) {
      double dot = 0, sum_abs = 0;
      for (int t = 0; t < dim; ++t) {
        dot += double(q[size_t(j * dim + t)]) * y[size_t(i * dim + t)];
        sum_abs += std::fabs(double(q[size_t(j * dim + t)]) * y[size_t(i * dim + t)]);
      }
      ASSERT_NEAR(s[size_t(j * n_vec + i)], dot, 1e-5 * sum_abs) << "query " << j << " vector " << i;
    }
  EXPECT_DOUBLE_EQ(residual_bytes_per_vector(spec, dim), 20.0 + 66.0 / 8);
}

}  // namespace
}  // namespace kvtier
