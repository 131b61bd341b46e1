// The MoE block on CUDA against the CPU reference (ops/moe/moe.h): routing
// ids exactly (ties included), the whole block on a grid of shapes covering
// the GEMV (≤ 8 tokens) and grouped-GEMM paths and every tile tail, and that
// only the chosen experts' weights are used (the others are NaN).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "backend/cuda_test_util.h"
#include "ops/moe/moe.h"
#include "ops/moe/moe_cuda.h"

namespace kvtier {
namespace {
using namespace cuda::testing;

MoeConfig config(int n_embd, int n_ff, int n_expert, int k, bool norm, float scale = 1.0f) {
  MoeConfig c;
  c.n_embd = n_embd;
  c.n_ff = n_ff;
  c.n_expert = n_expert;
  c.n_expert_used = k;
  c.norm_topk = norm;
  c.scale = scale;
  return c;
}

TEST(MoeCuda, RoutingMatchesReference) {
  KVT_REQUIRE_GPU();
  struct Case {
    int n_expert, k;
    bool norm;
    float scale;
    int n_tok;
    bool ties;  // integer logits: many exact ties, broken toward the lower id
  };
  for (const Case& p : {Case{8, 2, true, 1.0f, 37, false}, Case{128, 8, true, 1.0f, 300, false},
                        Case{128, 8, false, 2.5f, 5, false}, Case{5, 5, true, 1.0f, 9, false},
                        Case{1024, 32, true, 1.0f, 3, false}, Case{60, 4, false, 1.0f, 50, true}}) {
    const MoeConfig c = config(64, 32, p.n_expert, p.k, p.norm, p.scale);
    std::mt19937 rng(uint32_t(p.n_expert * 7 + p.k));
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::vector<float> logits(size_t(p.n_tok) * p.n_expert);  // [n_tok, n_expert]
    for (auto& v : logits) v = p.ties ? std::round(nd(rng)) : nd(rng);
    auto d_logits = to_device(logits);
    cuda::DeviceBuffer d_ids(logits.size() * 4), d_w(logits.size() * 4);
    cuda::moe_route(d_logits.data<float>(), p.n_tok, c, d_ids.data<int32_t>(), d_w.data<float>(), nullptr);
    const size_t n = size_t(p.n_tok) * p.k;
    const auto ids = to_host<int32_t>(d_ids, n);
    const auto w = to_host<float>(d_w, n);
    std::vector<int32_t> ids_ref(n);
    std::vector<float> w_ref(n);
    moe_route(logits.data(), p.n_tok, c, ids_ref.data(), w_ref.data());
    ASSERT_EQ(ids, ids_ref) << p.n_expert << " experts, k " << p.k;
    for (size_t i = 0; i < n; ++i) ASSERT_NEAR(w[i], w_ref[i], 2e-6 * p.scale + 1e-5 * w_ref[i]) << i;
  }
}

// A layer with bf16 weights (device) and the same values in f32 (CPU views).
struct Layer {
  MoeConfig c;
  std::vector<uint16_t> router, gate_up, down;  // bf16 bits, device layouts (moe_cuda.h)
  std::vector<float> router_f, gate_up_f, down_f;
  MoeWeights cpu;  // F32 views into the *_f vectors

  Layer(const MoeConfig& cfg, std::mt19937& rng) : c(cfg) {
    const int E = c.n_embd, F = c.n_ff, n = c.n_expert;
    const float ae = std::sqrt(3.0f / float(E)), af = std::sqrt(3.0f / float(F));
    router = random_bf16(size_t(n) * E, rng, -ae, ae);
    gate_up = random_bf16(size_t(n) * 2 * F * E, rng, -ae, ae);
    down = random_bf16(size_t(n) * E * F, rng, -af, af);
    router_f = bf16_to_f32_vec(router);
    gate_up_f = bf16_to_f32_vec(gate_up);
    down_f = bf16_to_f32_vec(down);
    const size_t row_e = sizeof(float) * size_t(E), row_f = sizeof(float) * size_t(F);
    cpu.router = WeightView{GgmlType::F32, router_f.data(), n, E, row_e};
    for (int e = 0; e < n; ++e) {
      const float* gu = &gate_up_f[size_t(e) * 2 * F * E];
      cpu.gate.push_back(WeightView{GgmlType::F32, gu, F, E, row_e});
      cpu.up.push_back(WeightView{GgmlType::F32, gu + size_t(F) * E, F, E, row_e});
      cpu.down.push_back(WeightView{GgmlType::F32, &down_f[size_t(e) * E * F], E, F, row_f});
    }
  }
};

struct GpuResult {
  std::vector<float> y;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

GpuResult run_gpu(const Layer& L, const std::vector<uint16_t>& x, int n_tok,
                  cuda::MoeExperts experts = cuda::MoeExperts::automatic) {
  auto d_router = to_device(L.router), d_gu = to_device(L.gate_up), d_down = to_device(L.down), d_x = to_device(x);
  cuda::DeviceBuffer d_y(x.size() * 2);
  poison(d_y);
  cuda::MoeRunner runner(L.c, n_tok);
  cuda::Gemm gemm;
  runner.run({d_router.data(), d_gu.data(), d_down.data()}, d_x.data(), n_tok, d_y.data(), gemm, nullptr, experts);
  KVT_CUDA_CHECK(cudaDeviceSynchronize());
  GpuResult r;
  r.y = bf16_to_f32_vec(to_host<uint16_t>(d_y, x.size()));
  const size_t n = size_t(n_tok) * L.c.n_expert_used;
  std::vector<int32_t> ids(n);
  std::vector<float> w(n);
  KVT_CUDA_CHECK(cudaMemcpy(ids.data(), runner.ids(), n * 4, cudaMemcpyDeviceToHost));
  KVT_CUDA_CHECK(cudaMemcpy(w.data(), runner.weights(), n * 4, cudaMemcpyDeviceToHost));
  r.ids = ids;
  r.weights = w;
  return r;
}

struct BlockCase {
  int n_embd, n_ff, n_expert, k, n_tok;
  bool norm;
  cuda::MoeExperts experts = cuda::MoeExperts::automatic;
};

const char* path_name(const BlockCase& p) {
  if (p.experts == cuda::MoeExperts::cublas ||
      (p.experts == cuda::MoeExperts::automatic && p.n_tok >= cuda::kMoeCublasMinTokens))
    return "cublaslt";
  return p.n_tok <= cuda::kMoeGemvMaxTokens ? "gemv" : "grouped gemm";
}

class MoeCudaBlock : public ::testing::TestWithParam<BlockCase> {};

TEST_P(MoeCudaBlock, MatchesReference) {
  KVT_REQUIRE_GPU();
  const BlockCase p = GetParam();
  const MoeConfig c = config(p.n_embd, p.n_ff, p.n_expert, p.k, p.norm);
  std::mt19937 rng(uint32_t(p.n_embd + p.n_tok * 13 + p.n_expert));
  const Layer L(c, rng);
  const auto x = random_bf16(size_t(p.n_tok) * p.n_embd, rng);  // [n_tok, n_embd]
  const auto xf = bf16_to_f32_vec(x);
  const GpuResult g = run_gpu(L, x, p.n_tok, p.experts);

  // Routing: the CPU's own choice from the same bf16 inputs, wherever the
  // k-th and (k+1)-th logits are not a near-tie (the GPU's router GEMM sums
  // in another order).
  std::vector<float> logits(size_t(p.n_tok) * p.n_expert);
  matmul_ref(L.cpu.router, xf.data(), p.n_tok, logits.data());
  std::vector<int32_t> ids_ref(g.ids.size());
  std::vector<float> w_ref(g.ids.size());
  moe_route(logits.data(), p.n_tok, c, ids_ref.data(), w_ref.data());
  int n_checked = 0;
  for (int t = 0; t < p.n_tok; ++t) {
    std::vector<float> l(logits.begin() + int64_t(t) * p.n_expert, logits.begin() + int64_t(t + 1) * p.n_expert);
    std::sort(l.begin(), l.end(), std::greater<float>());
    if (p.k < p.n_expert && l[size_t(p.k - 1)] - l[size_t(p.k)] < 1e-3f) continue;
    std::vector<int32_t> a(g.ids.begin() + int64_t(t) * p.k, g.ids.begin() + int64_t(t + 1) * p.k);
    std::vector<int32_t> b(ids_ref.begin() + int64_t(t) * p.k, ids_ref.begin() + int64_t(t + 1) * p.k);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    ASSERT_EQ(a, b) << "token " << t;
    ++n_checked;
  }
  EXPECT_GE(n_checked, p.n_tok * 9 / 10);
  // The experts, for the GPU's routing: bf16 rounding of gate|up, h, each
  // expert's output and y.
  std::vector<float> y_ref(x.size());
  moe_experts_ref(L.cpu, c, xf.data(), p.n_tok, g.ids.data(), g.weights.data(), y_ref.data());
  const double err = rel_l2(g.y.data(), y_ref.data(), y_ref.size());
  std::printf("[moe-cuda] E %d F %d experts %d k %d tokens %d: rel-L2 %.2e (%s)\n", p.n_embd, p.n_ff, p.n_expert, p.k,
              p.n_tok, err, path_name(p));
  EXPECT_LT(err, 1.5e-2);
}

INSTANTIATE_TEST_SUITE_P(
    Grid, MoeCudaBlock,
    ::testing::Values(BlockCase{64, 32, 8, 2, 1, true}, BlockCase{64, 32, 8, 2, 5, false},
                      BlockCase{64, 32, 8, 2, 8, true}, BlockCase{64, 32, 8, 2, 9, true},
                      BlockCase{200, 72, 16, 4, 100, true},  // K tails (200 % 64, 72 % 64), N tails (144, 200)
                      BlockCase{256, 64, 128, 8, 300, true},  // Qwen3-MoE's expert count and k
                      BlockCase{128, 48, 4, 4, 700, false},   // every expert gets all 700 rows: 11 tiles each
                      BlockCase{2048, 768, 16, 8, 1, true},  // Qwen3-30B-A3B's widths, decode
                      BlockCase{2048, 768, 16, 8, 24, true},
                      // The host plan + cuBLASLt experts (automatic from kMoeCublasMinTokens tokens).
                      BlockCase{64, 32, 8, 2, 1, true, cuda::MoeExperts::cublas},
                      BlockCase{200, 72, 16, 4, 100, true, cuda::MoeExperts::cublas},
                      BlockCase{128, 48, 4, 4, 700, false, cuda::MoeExperts::cublas},
                      BlockCase{256, 64, 128, 8, cuda::kMoeCublasMinTokens, true},
                      BlockCase{256, 64, 128, 8, cuda::kMoeCublasMinTokens, true, cuda::MoeExperts::device}),
    [](const ::testing::TestParamInfo<BlockCase>& i) {
      const BlockCase& p = i.param;
      const char* path = p.experts == cuda::MoeExperts::cublas   ? "_cublas"
                         : p.experts == cuda::MoeExperts::device ? "_device"
                                                                 : "";
      return "E" + std::to_string(p.n_embd) + "_F" + std::to_string(p.n_ff) + "_x" + std::to_string(p.n_expert) + "k" +
             std::to_string(p.k) + "_t" + std::to_string(p.n_tok) + path;
    });

TEST(MoeCuda, OnlyTheChosenExpertsWeightsAreUsed) {
  KVT_REQUIRE_GPU();
  // Positive activations and a router whose rows 0 and 1 are positive, the
  // rest negative: every token picks experts 0 and 1. The other experts'
  // weights are NaN: any use of them would show in y.
  const MoeConfig c = config(64, 32, 16, 2, true);
  std::mt19937 rng(9);
  Layer L(c, rng);
  for (int e = 0; e < c.n_expert; ++e)
    for (int i = 0; i < c.n_embd; ++i)
      L.router_f[size_t(e) * c.n_embd + i] = e < 2 ? 0.05f + 0.01f * e : -0.05f;
  for (size_t i = 0; i < L.router.size(); ++i) L.router[i] = f32_to_bf16(L.router_f[i]);
  const size_t gu_per = size_t(2) * c.n_ff * c.n_embd, dn_per = size_t(c.n_embd) * c.n_ff;
  std::fill(L.gate_up.begin() + 2 * gu_per, L.gate_up.end(), uint16_t(0xFFFF));
  std::fill(L.down.begin() + 2 * dn_per, L.down.end(), uint16_t(0xFFFF));
  for (const auto& [n_tok, experts] : {std::pair{1, cuda::MoeExperts::automatic}, {6, cuda::MoeExperts::automatic},
                                      {40, cuda::MoeExperts::automatic}, {40, cuda::MoeExperts::cublas}}) {
    std::vector<uint16_t> x = random_bf16(size_t(n_tok) * c.n_embd, rng, 0.1f, 1.0f);
    const GpuResult g = run_gpu(L, x, n_tok, experts);
    for (int32_t id : g.ids) ASSERT_LT(id, 2);
    const auto xf = bf16_to_f32_vec(x);
    std::vector<float> y_ref(x.size());
    moe_experts_ref(L.cpu, c, xf.data(), n_tok, g.ids.data(), g.weights.data(), y_ref.data());
    EXPECT_LT(rel_l2(g.y.data(), y_ref.data(), y_ref.size()), 1.5e-2) << n_tok << " tokens";
  }
}

TEST(MoeCuda, BadConfigsAndSizesAreRefused) {
  KVT_REQUIRE_GPU();
  EXPECT_THROW(cuda::MoeRunner(config(64, 32, 2048, 2, true), 4), Error);  // more experts than the plan holds
  EXPECT_THROW(cuda::MoeRunner(config(64, 30, 8, 2, true), 4), Error);     // expert width not a multiple of 8
  EXPECT_THROW(cuda::MoeRunner(config(64, 32, 8, 40, true), 4), Error);    // k > experts
  cuda::MoeRunner r(config(64, 32, 8, 2, true), 4);
  cuda::Gemm gemm;
  EXPECT_THROW(r.run({}, nullptr, 5, nullptr, gemm, nullptr), Error);  // more tokens than its capacity
  // The cuBLASLt experts synchronize with the host: refused inside a graph capture.
  cudaStream_t s = nullptr;
  KVT_CUDA_CHECK(cudaStreamCreate(&s));
  const MoeConfig c = config(64, 32, 8, 2, true);
  std::mt19937 rng(3);
  const Layer L(c, rng);
  auto d_router = to_device(L.router), d_gu = to_device(L.gate_up), d_down = to_device(L.down);
  auto d_x = to_device(random_bf16(size_t(4) * c.n_embd, rng));
  cuda::DeviceBuffer d_y(size_t(4) * c.n_embd * 2);
  KVT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  EXPECT_THROW(r.run({d_router.data(), d_gu.data(), d_down.data()}, d_x.data(), 4, d_y.data(), gemm, s,
                     cuda::MoeExperts::cublas),
               Error);
  cudaGraph_t g = nullptr;
  cudaStreamEndCapture(s, &g);
  if (g) cudaGraphDestroy(g);
  cudaGetLastError();
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace kvtier
