#include <gtest/gtest.h>

#include <random>

#include "backend/cuda_test_util.h"
#include "ops/gemm/gemm_cuda.h"

namespace kvtier::cuda {
namespace {
using namespace testing;

// Reference: y = x Wᵀ in f64 over the bf16 values.
std::vector<float> gemm_ref(const std::vector<uint16_t>& x, const std::vector<uint16_t>& w, int m, int n, int k) {
  std::vector<float> ref(size_t(m) * n);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double acc = 0;
      for (int c = 0; c < k; ++c)
        acc += double(bf16_to_f32(x[size_t(i) * k + c])) * bf16_to_f32(w[size_t(j) * k + c]);
      ref[size_t(i) * n + j] = float(acc);
    }
  return ref;
}

TEST(GemmCuda, Bf16MatchesF64ReferenceOnGrid) {
  KVT_REQUIRE_GPU();
  std::mt19937 rng(6);
  Gemm gemm;
  for (auto [m, n, k] : std::vector<std::tuple<int, int, int>>{{1, 256, 128}, {3, 1000, 576}, {64, 512, 4096}, {129, 96, 64}}) {
    auto x = random_bf16(size_t(m * k), rng), w = random_bf16(size_t(n * k), rng);
    const std::vector<float> ref = gemm_ref(x, w, m, n, k);
    auto dx = to_device(x), dw = to_device(w);
    DeviceBuffer dy(size_t(m * n * 2));
    poison(dy);
    gemm.run(m, n, k, dx.data(), dw.data(), dy.data(), nullptr);
    auto y = bf16_to_f32_vec(to_host<uint16_t>(dy, size_t(m * n)));
    EXPECT_LT(rel_l2(y.data(), ref.data(), y.size()), 1e-2) << m << "x" << n << "x" << k;
    // f32 output: only the f32 accumulation order separates it from f64.
    DeviceBuffer dy32(size_t(m * n * 4));
    poison(dy32);
    gemm.run_f32(m, n, k, dx.data(), dw.data(), dy32.data<float>(), nullptr);
    auto y32 = to_host<float>(dy32, size_t(m * n));
    EXPECT_LT(rel_l2(y32.data(), ref.data(), y32.size()), 1e-5) << "f32 out " << m << "x" << n << "x" << k;
  }
}

// Every candidate cuBLASLt offers for a decode step's shapes computes the
// product (kvt_gemm_bench times them all): each against the reference, bf16
// and f32 out; and each gets a finite time.
TEST(GemmCuda, EveryCandidateAlgorithmMatchesReference) {
  KVT_REQUIRE_GPU();
  std::mt19937 rng(61);
  Gemm gemm;
  int tried = 0;
  for (auto [m, n, k] : std::vector<std::tuple<int, int, int>>{{1, 1024, 4096}, {21, 3072, 1024}, {64, 512, 2048}}) {
    auto x = random_bf16(size_t(m) * k, rng), w = random_bf16(size_t(n) * k, rng);
    const std::vector<float> ref = gemm_ref(x, w, m, n, k);
    auto dx = to_device(x), dw = to_device(w);
    for (Gemm::Kind kind : {Gemm::Kind::bf16, Gemm::Kind::bf16_to_f32}) {
      const bool f32 = kind == Gemm::Kind::bf16_to_f32;
      const int nc = gemm.candidates(m, n, k, kind);
      ASSERT_GE(nc, 1);
      for (int i = 0; i < nc; ++i, ++tried) {
        DeviceBuffer dy(size_t(m) * n * (f32 ? 4 : 2));
        poison(dy);
        gemm.run_candidate(i, m, n, k, kind, dx.data(), dw.data(), dy.data(), nullptr);
        const std::vector<float> y =
            f32 ? to_host<float>(dy, size_t(m) * n) : bf16_to_f32_vec(to_host<uint16_t>(dy, size_t(m) * n));
        EXPECT_LT(rel_l2(y.data(), ref.data(), y.size()), f32 ? 1e-5 : 1e-2)
            << "candidate " << i << " of " << nc << ", " << m << "x" << n << "x" << k << (f32 ? " f32" : " bf16");
      }
      const std::vector<double> t = gemm.time_candidates(m, n, k, kind, dw.data(), 2);
      ASSERT_EQ(int(t.size()), nc);
      for (double ms : t) EXPECT_TRUE(ms > 0 && ms < 1e3) << ms;
    }
  }
  EXPECT_GT(tried, 6);  // several candidates per shape
}

}  // namespace
}  // namespace kvtier::cuda
