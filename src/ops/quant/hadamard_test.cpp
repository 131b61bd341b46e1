// The Walsh–Hadamard transform is orthonormal (H·Hᵀ = I), norm preserving,
// its own inverse, and the butterflies equal the matrix definition. The
// vector butterflies compute, bit for bit, the scalar ones in stage order
// (the quantized records stored before them decode the same).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/status.h"
#include "ops/quant/hadamard.h"
#include "ops/quant/higgs_grid.h"

namespace kvtier {
namespace {

TEST(Hadamard, RowsAreOrthonormal) {
  for (int n : {1, 2, 4, 16, 128}) {
    std::vector<float> rows(size_t(n) * n, 0.0f);  // [n, n] f32: row i = H e_i
    for (int i = 0; i < n; ++i) {
      rows[size_t(i) * n + i] = 1.0f;
      hadamard_transform(rows.data() + size_t(i) * n, n);
    }
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        double dot = 0;
        for (int k = 0; k < n; ++k) dot += double(rows[size_t(i) * n + k]) * rows[size_t(j) * n + k];
        EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-6) << "n " << n << " rows " << i << ", " << j;
      }
  }
}

TEST(Hadamard, FastEqualsDefinitionNormPreservingSelfInverse) {
  for (int n : {2, 8, 64, 256, 1024}) {
    std::vector<float> x(static_cast<size_t>(n));
    gaussian_fill(x.data(), n, 11 + uint64_t(n));
    std::vector<float> fast = x, ref = x;
    hadamard_transform(fast.data(), n);
    hadamard_transform_ref(ref.data(), n);
    double nx = 0, nf = 0;
    for (int i = 0; i < n; ++i) {
      EXPECT_NEAR(fast[size_t(i)], ref[size_t(i)], 1e-4) << "n " << n << " i " << i;
      nx += double(x[size_t(i)]) * x[size_t(i)];
      nf += double(fast[size_t(i)]) * fast[size_t(i)];
    }
    EXPECT_NEAR(nf / nx, 1.0, 1e-5);
    hadamard_transform(fast.data(), n);
    for (int i = 0; i < n; ++i) EXPECT_NEAR(fast[size_t(i)], x[size_t(i)], 1e-5);
  }
}

TEST(Hadamard, VectorButterfliesAreTheScalarOnesBitForBit) {
  for (int n : {8, 16, 64, 128, 512}) {
    std::vector<float> x(static_cast<size_t>(n));
    gaussian_fill(x.data(), n, 5 + uint64_t(n));
    std::vector<float> want = x;
    for (int h = 1; h < n; h *= 2)
      for (int i = 0; i < n; i += 2 * h)
        for (int j = i; j < i + h; ++j) {
          const float u = want[size_t(j)], v = want[size_t(j + h)];
          want[size_t(j)] = u + v;
          want[size_t(j + h)] = u - v;
        }
    const float s = 1.0f / std::sqrt(float(n));
    for (float& w : want) w *= s;
    hadamard_transform(x.data(), n);
    for (int i = 0; i < n; ++i) ASSERT_EQ(x[size_t(i)], want[size_t(i)]) << "n " << n << " i " << i;
  }
}

TEST(Hadamard, RejectsNonPowerOfTwo) {
  std::vector<float> x(12);
  EXPECT_THROW(hadamard_transform(x.data(), 12), Error);
  EXPECT_THROW(hadamard_transform_ref(x.data(), 0), Error);
}

TEST(Hadamard, SignsAreSeededAndBalanced) {
  std::vector<float> a(1024), b(1024), c(1024);
  hadamard_signs(1, 1024, a.data());
  hadamard_signs(1, 1024, b.data());
  hadamard_signs(2, 1024, c.data());
  int n_neg = 0, n_diff = 0;
  for (int i = 0; i < 1024; ++i) {
    EXPECT_TRUE(a[size_t(i)] == 1.0f || a[size_t(i)] == -1.0f);
    EXPECT_EQ(a[size_t(i)], b[size_t(i)]);
    n_neg += a[size_t(i)] < 0;
    n_diff += a[size_t(i)] != c[size_t(i)];
  }
  EXPECT_GT(n_neg, 400);
  EXPECT_LT(n_neg, 624);
  EXPECT_GT(n_diff, 400);
}

}  // namespace
}  // namespace kvtier
