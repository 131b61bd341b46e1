#include <gtest/gtest.h>

#include <random>

#include "backend/cuda_test_util.h"
#include "ops/rope/rope.h"
#include "ops/rope/rope_cuda.h"

namespace kvtier::cuda {
namespace {
using namespace testing;

TEST(RopeCuda, MatchesReferenceForBothPairingsAndLlama3Scaling) {
  KVT_REQUIRE_GPU();
  std::mt19937 rng(4);
  for (bool inter : {false, true}) {
    ModelConfig cfg;
    cfg.head_dim = 128;
    cfg.rope_theta = 500000.f;
    cfg.rope_interleaved = inter;
    cfg.rope_scaling = RopeScaling::llama3;
    cfg.rope_factor = 8.f;
    Rope rope_cpu(cfg);
    const int64_t n_tok = 7;
    const int n_heads = 5, stride = n_heads * 128 + 64;  // padding after the heads stays untouched
    auto x = random_bf16(size_t(n_tok * stride), rng);
    std::vector<int64_t> pos = {0, 1, 17, 4095, 65537, 131071, 200000};
    std::vector<float> packed(size_t(n_tok * n_heads * 128));
    for (int64_t t = 0; t < n_tok; ++t)
      for (int i = 0; i < n_heads * 128; ++i) packed[size_t(t * n_heads * 128 + i)] = bf16_to_f32(x[size_t(t * stride + i)]);
    rope_cpu.apply_ref(packed.data(), n_tok, n_heads, pos.data());
    auto dx = to_device(x), dp = to_device(pos), df = to_device(rope_cpu.inv_freq());
    rope(dx.data(), n_tok, stride, n_heads, 128, dp.data<int64_t>(), df.data<float>(), inter, nullptr);
    auto got = to_host<uint16_t>(dx, x.size());
    std::vector<float> g(packed.size());
    for (int64_t t = 0; t < n_tok; ++t) {
      for (int i = 0; i < n_heads * 128; ++i) g[size_t(t * n_heads * 128 + i)] = bf16_to_f32(got[size_t(t * stride + i)]);
      for (int i = n_heads * 128; i < stride; ++i) ASSERT_EQ(got[size_t(t * stride + i)], x[size_t(t * stride + i)]);
    }
    EXPECT_LT(rel_l2(g.data(), packed.data(), g.size()), 5e-3);
  }
}

}  // namespace
}  // namespace kvtier::cuda
