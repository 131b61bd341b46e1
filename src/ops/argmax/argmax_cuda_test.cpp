#include "ops/argmax/argmax_cuda.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backend/cuda_test_util.h"
#include "ops/argmax/argmax.h"

namespace kvtier::cuda {
namespace {
using namespace testing;

// Rows that stress the combine: random values, exact ties far apart (the
// first must win across threads and warps), NaNs (first or not), rows of
// -inf, a row shorter than the block, a vocabulary-sized row.
TEST(ArgmaxCuda, MatchesReferenceExactly) {
  KVT_REQUIRE_GPU();
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-20.f, 20.f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const int64_t n : {int64_t(1), int64_t(7), int64_t(1000), int64_t(32000), int64_t(128256), int64_t(151937)}) {
    const int64_t rows = 9;
    std::vector<float> x(size_t(rows * n));
    for (float& v : x) v = u(rng);
    auto row = [&](int64_t r) { return x.data() + r * n; };
    if (n > 1) {
      // r1: the maximum twice, the later copy in an earlier thread's slice.
      row(1)[n - 1] = 100.f;
      row(1)[n / 2] = 100.f;
      // r2: NaNs everywhere but a few values.
      for (int64_t i = 0; i < n; ++i) row(2)[i] = i % 3 == 1 ? u(rng) : nan;
      row(2)[0] = -50.f;
      // r3: starts with NaN.
      row(3)[0] = nan;
      // r4: all -inf; r5: -inf then one finite value at the end.
      for (int64_t i = 0; i < n; ++i) row(4)[i] = row(5)[i] = -INFINITY;
      row(5)[n - 1] = -1e30f;
      // r6: +inf twice; r7: coarse grid (many ties).
      row(6)[n / 3] = row(6)[n - 1] = INFINITY;
      for (int64_t i = 0; i < n; ++i) row(7)[i] = float(int(rng() % 8));
    }
    std::vector<int32_t> want(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) want[size_t(r)] = argmax_ref(row(r), n);
    auto dx = to_device(x);
    DeviceBuffer dout(size_t(rows) * 4);
    poison(dout);
    argmax_rows(dx.data<float>(), rows, n, dout.data<int32_t>(), nullptr);
    KVT_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(to_host<int32_t>(dout, size_t(rows)), want) << "n " << n;
  }
}

TEST(ArgmaxCuda, RefusesEmptyRows) {
  KVT_REQUIRE_GPU();
  EXPECT_THROW(argmax_rows(nullptr, 1, 0, nullptr, nullptr), Error);
}

}  // namespace
}  // namespace kvtier::cuda
