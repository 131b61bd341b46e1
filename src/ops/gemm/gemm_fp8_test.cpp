#include "ops/gemm/gemm_fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ops/quant/quant_scalar.h"

namespace kvtier {
namespace {

// Every element comes back within half an E4M3 step of its row's scale
// grid: relative 2^-4 for normal codes, 2^-10 · s absolute below them; the
// row's largest magnitude becomes ±448 exactly; an all-zero row has scale 1.
TEST(GemmFp8Ref, RowsRoundTripWithinHalfAStep) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t rows = 6, cols = 200, ld = 208;
  std::vector<float> x(size_t(rows * ld), 0.f);
  for (int64_t r = 1; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) x[size_t(r * ld + c)] = nd(rng) * float(1 << (3 * r));
  x[size_t(4 * ld + 7)] = -1e6f;  // an outlier sets its row's scale
  std::vector<uint8_t> q(size_t(rows * cols));
  std::vector<float> scale(static_cast<size_t>(rows));
  quantize_rows_fp8_ref(x.data(), rows, cols, ld, q.data(), scale.data());
  EXPECT_EQ(scale[0], 1.f);
  for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(q[size_t(c)], 0) << c;
  for (int64_t r = 1; r < rows; ++r) {
    float amax = 0.f;
    for (int64_t c = 0; c < cols; ++c) amax = std::fmax(amax, std::fabs(x[size_t(r * ld + c)]));
    EXPECT_FLOAT_EQ(scale[size_t(r)], amax / 448.f) << r;
    int at_max = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const float v = x[size_t(r * ld + c)], back = e4m3_to_f32(q[size_t(r * cols + c)]) * scale[size_t(r)];
      const float tol = std::fmax(std::fabs(v) * 0.0625f, scale[size_t(r)] * 0.001f);
      EXPECT_LE(std::fabs(back - v), tol) << r << "," << c;
      at_max += (q[size_t(r * cols + c)] & 0x7f) == 0x7e;
    }
    EXPECT_GE(at_max, 1) << "row " << r << ": its largest magnitude must map to 448";
  }
}

// The FP8 product stays within E4M3's rounding of the exact product, and
// equals the product of the dequantized operands.
TEST(GemmFp8Ref, ProductOfDequantizedRows) {
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const int64_t m = 5, n = 7, k = 96;
  std::vector<float> x(size_t(m * k)), w(size_t(n * k));
  for (auto& v : x) v = u(rng) * 3.f;
  for (auto& v : w) v = u(rng) * 0.05f;
  std::vector<uint8_t> xq(x.size()), wq(w.size());
  std::vector<float> xs(static_cast<size_t>(m)), ws(static_cast<size_t>(n)), y(static_cast<size_t>(m * n));
  quantize_rows_fp8_ref(x.data(), m, k, 0, xq.data(), xs.data());
  quantize_rows_fp8_ref(w.data(), n, k, 0, wq.data(), ws.data());
  gemm_fp8_ref(m, n, k, xq.data(), xs.data(), wq.data(), ws.data(), y.data());
  double num = 0, den = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double exact = 0, deq = 0;
      for (int64_t c = 0; c < k; ++c) {
        exact += double(x[size_t(i * k + c)]) * w[size_t(j * k + c)];
        deq += double(e4m3_to_f32(xq[size_t(i * k + c)]) * xs[size_t(i)]) *
               double(e4m3_to_f32(wq[size_t(j * k + c)]) * ws[size_t(j)]);
      }
      EXPECT_NEAR(y[size_t(i * n + j)], deq, 1e-5 * (1 + std::fabs(deq)));
      num += (y[size_t(i * n + j)] - exact) * (y[size_t(i * n + j)] - exact);
      den += exact * exact;
    }
  EXPECT_LT(std::sqrt(num / den), 0.05);
  EXPECT_GT(std::sqrt(num / den), 1e-4) << "FP8 rounding must show against the exact product";
}

}  // namespace
}  // namespace kvtier
