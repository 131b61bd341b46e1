#include <gtest/gtest.h>

#include <random>

#include "backend/cuda_test_util.h"
#include "ops/swiglu/swiglu.h"
#include "ops/swiglu/swiglu_cuda.h"

namespace kvtier::cuda {
namespace {
using namespace testing;

// The reference over gate|up rows [n, 2 ff] (bf16), element (r, c) times
// rs[r] · cs[c] when scales are given.
std::vector<float> reference(const std::vector<uint16_t>& gu, int64_t n, int ff, const std::vector<float>& rs = {},
                             const std::vector<float>& cs = {}) {
  std::vector<float> g(size_t(n * ff)), u(size_t(n * ff)), ref(size_t(n * ff));
  for (int64_t r = 0; r < n; ++r)
    for (int c = 0; c < ff; ++c) {
      const float sg = rs.empty() ? 1.f : rs[size_t(r)] * cs[size_t(c)];
      const float su = rs.empty() ? 1.f : rs[size_t(r)] * cs[size_t(ff + c)];
      g[size_t(r * ff + c)] = bf16_to_f32(gu[size_t(r * 2 * ff + c)]) * sg;
      u[size_t(r * ff + c)] = bf16_to_f32(gu[size_t(r * 2 * ff + ff + c)]) * su;
    }
  swiglu_ref(g.data(), u.data(), n * ff, ref.data());
  return ref;
}

// The kernel's output [n, ff] on the host (device scales, or none).
std::vector<float> run_swiglu(const std::vector<uint16_t>& gu, int64_t n, int ff, const float* rs = nullptr,
                              const float* cs = nullptr) {
  auto dgu = to_device(gu);
  DeviceBuffer dh(size_t(n * ff * 2));
  poison(dh);
  swiglu(dgu.data(), n, ff, dh.data(), nullptr, rs, cs);
  return bf16_to_f32_vec(to_host<uint16_t>(dh, size_t(n * ff)));
}

TEST(SwigluCuda, MatchesReference) {
  KVT_REQUIRE_GPU();
  std::mt19937 rng(5);
  const int64_t n = 3;
  const int ff = 1536;
  auto gu = random_bf16(size_t(n * 2 * ff), rng, -4.f, 4.f);
  const std::vector<float> ref = reference(gu, n, ff);
  const std::vector<float> h = run_swiglu(gu, n, ff);
  EXPECT_LT(rel_l2(h.data(), ref.data(), h.size()), 5e-3);
}

// With the scales of an FP8 product: element (r, c) of gate|up times
// row_scale[r] · col_scale[c] before the gate, against the reference over
// the scaled values.
TEST(SwigluCuda, ScaledInputMatchesReference) {
  KVT_REQUIRE_GPU();
  std::mt19937 rng(6);
  const int64_t n = 5;
  const int ff = 1024;
  auto gu = random_bf16(size_t(n * 2 * ff), rng, -300.f, 300.f);
  std::uniform_real_distribution<float> u01(0.001f, 0.03f);
  std::vector<float> rs(static_cast<size_t>(n)), cs(size_t(2 * ff));
  for (auto& v : rs) v = u01(rng);
  for (auto& v : cs) v = u01(rng);
  const std::vector<float> ref = reference(gu, n, ff, rs, cs);
  auto drs = to_device(rs), dcs = to_device(cs);
  const std::vector<float> h = run_swiglu(gu, n, ff, drs.data<float>(), dcs.data<float>());
  EXPECT_LT(rel_l2(h.data(), ref.data(), h.size()), 5e-3);
  EXPECT_THROW(run_swiglu(gu, n, ff, drs.data<float>(), nullptr), Error);
}

}  // namespace
}  // namespace kvtier::cuda
