// The GPU tiered KV (gpu_tiered_kv.h) against the CPU store it mirrors
// (TieredKvStore): the same prompt and decode tokens appended to both, the
// same queries; the attention outputs must agree to bf16 rounding, step after
// step, across KV-budget changes, reuse of the slot cache and tier growth.
// Queries aim at a few earlier keys, so that attention is peaked and a wrong
// selection shows.
#include <gtest/gtest.h>

#include <random>

#include "backend/cuda_test_util.h"
#include "gpu/gpu_model_kernels.h"
#include "gpu/gpu_tiered_kv.h"
#include "kv/tiered_store.h"
#include "ops/kv_append/kv_append.h"

namespace kvtier {
namespace {
using namespace cuda::testing;

struct Case {
  std::string policy;
  int64_t n_prompt;
  int prefill_chunk;
  int n_steps;
};

class GpuTieredKvCuda : public ::testing::TestWithParam<Case> {};

TEST_P(GpuTieredKvCuda, DecodeMatchesTheCpuStore) {
  KVT_REQUIRE_GPU();
  const Case c = GetParam();
  KvGeometry g;
  g.n_layer = 2;
  g.n_head = 8;
  g.n_kv_head = 2;
  g.head_dim = 128;
  const PolicyConfig pc = parse_policy(c.policy);
  ASSERT_EQ(gpu_tiered_unsupported(pc, g), "");
  TieredKvStore cpu(pc, g);
  GpuTieredKv gpu(pc, g);
  const int W = g.n_kv_head * g.head_dim, QW = g.n_head * g.head_dim;
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<std::vector<float>> keys(size_t(g.n_layer));  // [layer][tok, W] as appended (bf16 values)
  cuda::DeviceBuffer d_k(size_t(c.prefill_chunk) * W * 2), d_v(d_k.bytes()), d_q(size_t(QW) * 2),
      d_out(size_t(QW) * 2);
  cuda::Stream stream;
  auto append = [&](int l, int64_t pos0, int n) {
    std::vector<uint16_t> kb(size_t(n) * W), vb(kb.size());
    for (int64_t t = 0; t < n; ++t) {
      const float norm = 0.3f + float((pos0 + t) % 5);  // keys of varied norm, as real ones
      for (int i = 0; i < W; ++i) {
        kb[size_t(t * W + i)] = f32_to_bf16(norm * nd(rng));
        vb[size_t(t * W + i)] = f32_to_bf16(nd(rng));
      }
    }
    const auto kf = bf16_to_f32_vec(kb), vf = bf16_to_f32_vec(vb);
    keys[size_t(l)].insert(keys[size_t(l)].end(), kf.begin(), kf.end());
    cpu.append(l, kf.data(), kf.data(), vf.data(), n);
    KVT_CUDA_CHECK(cudaMemcpy(d_k.data(), kb.data(), kb.size() * 2, cudaMemcpyHostToDevice));
    KVT_CUDA_CHECK(cudaMemcpy(d_v.data(), vb.data(), vb.size() * 2, cudaMemcpyHostToDevice));
    gpu.append(l, d_k.data(), d_v.data(), W, pos0, n, stream.get());
    stream.synchronize();  // d_k / d_v are refilled next
  };
  for (int64_t i = 0; i < c.n_prompt; i += c.prefill_chunk)
    for (int l = 0; l < g.n_layer; ++l) append(l, i, int(std::min<int64_t>(c.prefill_chunk, c.n_prompt - i)));
  cpu.set_phase(KvPhase::decode);
  gpu.start_decode(c.n_prompt);
  const float scale = 1.f / std::sqrt(128.f);
  int n_bad = 0;
  double worst = 0;
  uint64_t misses_before = 0;
  std::vector<std::vector<uint16_t>> qb(size_t(g.n_layer));  // per layer, kept for the repeated step
  for (int step = 0; step < c.n_steps; ++step) {
    const int64_t pos = c.n_prompt + step;
    // Steps 2i+1 repeat step 2i's query: their selection is the same but for
    // the token that left the window, so almost nothing crosses PCIe.
    const bool repeat = step % 2 == 1;
    for (int l = 0; l < g.n_layer; ++l) {
      append(l, pos, 1);
      if (!repeat) {
        // Each query head aims at one random earlier key of its KV head, plus noise.
        qb[size_t(l)].assign(size_t(QW), 0);
        for (int h = 0; h < g.n_head; ++h) {
          const int kvh = h / (g.n_head / g.n_kv_head);
          const int64_t target = std::uniform_int_distribution<int64_t>(0, pos)(rng);
          for (int d = 0; d < 128; ++d)
            qb[size_t(l)][size_t(h * 128 + d)] =
                f32_to_bf16(0.6f * keys[size_t(l)][size_t(target * W + kvh * 128 + d)] + 0.3f * nd(rng));
        }
      }
      const auto qf = bf16_to_f32_vec(qb[size_t(l)]);
      std::vector<float> want(static_cast<size_t>(QW));
      cpu.attend(l, qf.data(), 1, scale, want.data());
      KVT_CUDA_CHECK(cudaMemcpy(d_q.data(), qb[size_t(l)].data(), size_t(QW) * 2, cudaMemcpyHostToDevice));
      gpu.attend(l, d_q.data(), scale, d_out.data(), stream.get());
      stream.synchronize();
      const auto got = bf16_to_f32_vec(to_host<uint16_t>(d_out, size_t(QW)));
      const double rel = rel_l2(got.data(), want.data(), size_t(QW));
      worst = std::max(worst, rel);
      if (rel > 1e-2) ++n_bad;
    }
    const uint64_t misses = gpu.host_entries_read();
    if (repeat && pos - pc.local - pc.sink > gpu.budget())  // k unchanged since the last step
      EXPECT_LE(misses - misses_before, uint64_t(g.n_layer * g.n_kv_head)) << "step " << step;
    misses_before = misses;
  }
  std::printf("[gpu-tiered] %-44s %lld-token prompt, %d steps: worst rel-L2 %.2e, %d of %d over 1e-2, %llu host reads\n",
              c.policy.c_str(), (long long)c.n_prompt, c.n_steps, worst, n_bad, c.n_steps * g.n_layer,
              (unsigned long long)gpu.host_entries_read());
  // A step may pick another token at a near-tie of index scores (their f32
  // sums run in another order); it must stay rare.
  EXPECT_LE(n_bad, 1);
  EXPECT_LT(worst, 0.2);
  const KvMemory m = gpu.memory();
  const int64_t n = c.n_prompt + c.n_steps;
  const bool plain = pc.kv.kind == QuantKind::fp8 || pc.kv.kind == QuantKind::bf16;
  const int64_t tok_bytes = plain ? g.n_kv_head * kv_entry_bytes(pc.kv.kind == QuantKind::fp8 ? KvElt::fp8 : KvElt::bf16, 128)
                                  : higgs_record_layout(to_string(pc.kv), W).tok_bytes;
  EXPECT_EQ(m.host_bytes, n * g.n_layer * tok_bytes);
  EXPECT_GT(m.gpu_bytes, n * g.n_layer * g.n_kv_head * 34);
}

INSTANTIATE_TEST_SUITE_P(
    Policies, GpuTieredKvCuda,
    ::testing::Values(Case{"yakv,kv=fp8,gqa=mean", 3000, 1000, 12}, Case{"yakv,kv=fp8", 3000, 1000, 12},
                      Case{"yakv", 3000, 1000, 12}, Case{"yakv,kv=higgs4:rs,budget=100,sink=3,local=20", 700, 128, 14},
                      Case{"yakv,kv=higgs4:g128", 3000, 1000, 12},
                      Case{"yakv,kv=bf16,sink=4,local=16,budget=40", 1500, 256, 10},
                      Case{"yakv,kv=bf16,gqa=mean,sink=4,local=16,budget=40", 1500, 256, 10},
                      // budget above the selectable tokens at first: k grows every step
                      Case{"yakv,kv=fp8,gqa=mean,lm=higgs2:g128:rs,sink=2,local=8,budget=64", 60, 7, 24}),
    [](const auto& info) { return "case" + std::to_string(info.index); });

TEST(GpuTieredKv, PoliciesWithoutANativePathSayWhy) {
  KvGeometry g;
  g.n_layer = 1;
  g.n_head = 8;
  g.n_kv_head = 2;
  g.head_dim = 128;
  EXPECT_EQ(gpu_tiered_unsupported(parse_policy("yakv"), g), "");  // HIGGS4 host records
  EXPECT_NE(gpu_tiered_unsupported(parse_policy("yakv,kv=nvfp4"), g).find("kv=nvfp4"), std::string::npos);
  EXPECT_EQ(gpu_tiered_unsupported(parse_policy("yakv,kv=fp8"), g), "");  // gqa=shadowkv, a group of 4
  EXPECT_NE(gpu_tiered_unsupported(parse_policy("shadowkv"), g).find("landmarks"), std::string::npos);
  EXPECT_EQ(gpu_tiered_unsupported(parse_policy("yakv,kv=bf16,gqa=mean"), g), "");
  g.n_head = 16;
  EXPECT_NE(gpu_tiered_unsupported(parse_policy("yakv,kv=fp8"), g).find("group of 8"), std::string::npos);
  EXPECT_EQ(gpu_tiered_unsupported(parse_policy("yakv,kv=fp8,gqa=mean"), g), "");
  g.head_dim = 64;
  g.n_head = 2;
  g.n_kv_head = 1;
  EXPECT_NE(gpu_tiered_unsupported(parse_policy("yakv,kv=fp8,gqa=mean"), g).find("head_dim 64"), std::string::npos);
}

}  // namespace
}  // namespace kvtier
