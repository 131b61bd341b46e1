// The decode step on the GPU against the same step on the CPU (its
// reference), for every kind of policy: the same prompt and decode tokens
// (bf16-representable, so both devices start from the same values) appended
// to a CPU and a GPU TieredKv, the same queries, attention outputs equal to
// bf16 rounding; the slot cache's hit statistics equal the CPU's count of what
// a cache would hit. Batched decoding (several sequences of different lengths
// in one DecodeBatch) gives each sequence the output it gets alone.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cuda_test_util.h"
#include "core/half.h"
#include "kv/decode_batch.h"
#include "kv/tiered_kv.h"
#include "ops/index_score/index_rows.h"

namespace kvtier {
namespace {
using namespace cuda::testing;

KvGeometry geometry(int n_layer, int n_head, int n_kv_head, int head_dim) {
  KvGeometry g{n_layer, n_head, n_kv_head, head_dim};
  g.rope_inv_freq.resize(size_t(head_dim / 2));
  for (int i = 0; i < head_dim / 2; ++i) g.rope_inv_freq[size_t(i)] = float(std::pow(10000.0, -2.0 * i / head_dim));
  return g;
}

std::vector<float> bf16_values(std::mt19937& rng, size_t n, float spread) {
  std::normal_distribution<float> d(0.f, spread);
  std::vector<float> v(n);
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(d(rng)));
  return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
  return b;
}

double rel(const std::vector<float>& a, const std::vector<float>& b) { return rel_l2(a.data(), b.data(), a.size()); }

// One sequence's inputs: the prompt per layer, then per step and layer the new token and the query.
struct Inputs {
  std::vector<std::vector<float>> pre, post, v;                // [layer] [n_prompt, W]
  std::vector<std::vector<std::vector<float>>> dpre, dpost, dv, q;  // [step][layer]
};

Inputs make_inputs(std::mt19937& rng, const KvGeometry& g, int n_prompt, int n_steps) {
  const int W = g.n_kv_head * g.head_dim, QH = g.n_head, D = g.head_dim;
  auto keys = [&](int n) {
    auto k = bf16_values(rng, size_t(n) * W, 1.0f);
    for (int t = 0; t < n; t += 7)
      for (int d = 0; d < W; d += 5) k[size_t(t) * W + d] = bf16_to_f32(f32_to_bf16(4.f * k[size_t(t) * W + d]));
    return k;
  };
  Inputs in;
  for (int l = 0; l < g.n_layer; ++l) {
    in.pre.push_back(keys(n_prompt));
    in.post.push_back(keys(n_prompt));  // post-RoPE keys as given (the cache never rotates them)
    in.v.push_back(bf16_values(rng, size_t(n_prompt) * W, 1.0f));
  }
  in.dpre.resize(size_t(n_steps));
  in.dpost.resize(size_t(n_steps));
  in.dv.resize(size_t(n_steps));
  in.q.resize(size_t(n_steps));
  for (int s = 0; s < n_steps; ++s)
    for (int l = 0; l < g.n_layer; ++l) {
      in.dpre[size_t(s)].push_back(keys(1));
      in.dpost[size_t(s)].push_back(keys(1));
      in.dv[size_t(s)].push_back(bf16_values(rng, size_t(W), 1.0f));
      in.q[size_t(s)].push_back(bf16_values(rng, size_t(QH) * D, 1.0f));
    }
  return in;
}

// Prefill of `in` into `kv` in chunks of 128 (device activations: f32 on the CPU, bf16 on the GPU).
void prefill(KvCache& kv, const Device& dev, const KvGeometry& g, const Inputs& in, int n_prompt) {
  const int W = g.n_kv_head * g.head_dim;
  for (int c0 = 0; c0 < n_prompt; c0 += 128) {
    const int n = std::min(128, n_prompt - c0);
    for (int l = 0; l < g.n_layer; ++l) {
      auto slice = [&](const std::vector<float>& x) {
        return std::vector<float>(x.begin() + int64_t(c0) * W, x.begin() + int64_t(c0 + n) * W);
      };
      const auto pre = slice(in.pre[size_t(l)]), post = slice(in.post[size_t(l)]), v = slice(in.v[size_t(l)]);
      if (dev.kind() == DeviceKind::cpu) {
        kv.append(l, pre.data(), post.data(), v.data(), W, n);
      } else {
        auto dp = to_device(to_bf16(pre)), dk = to_device(to_bf16(post)), dv = to_device(to_bf16(v));
        kv.append(l, dp.data(), dk.data(), dv.data(), W, n);
        sync(dev.exec());
      }
    }
  }
  kv.start_decode();
}

struct Case {
  const char* policy;
  int head_dim = 128, n_head = 8, n_kv_head = 2;
  double tol = 1.2e-2;
};

class DecodeStepCuda : public ::testing::TestWithParam<Case> {};

// Both slot caches: the last step's selection (cache=step) and every token
// (cache=all: the prompt filled from the host tier when decode starts, then
// only generated tokens are read, once per row); and no slot cache
// (cache=none, store=gpu: the attention reads the records in place) where
// the store's format allows it.
TEST_P(DecodeStepCuda, GpuMatchesCpu) {
  KVT_REQUIRE_GPU();
  for (const char* cache : {"step", "all", "none"}) {
  const Case c = GetParam();
  const KvGeometry g = geometry(2, c.n_head, c.n_kv_head, c.head_dim);
  const int W = g.n_kv_head * g.head_dim, QH = g.n_head, D = g.head_dim;
  const bool none = std::string(cache) == "none";
  if (none && !plan_kv(parse_policy(std::string(c.policy) + ",store=gpu"), g, DeviceKind::cuda).in_place) continue;
  const std::string policy = std::string(c.policy) + (none ? ",store=gpu" : "") + ",cache=" + cache;
  SCOPED_TRACE(policy);
  const PolicyConfig p = parse_policy(policy);
  Device cpu(DeviceKind::cpu), gpu(DeviceKind::cuda);
  TieredKv a(plan_kv(p, g, DeviceKind::cpu), cpu), b(plan_kv(p, g, DeviceKind::cuda), gpu);
  std::mt19937 rng(11);
  const int n_prompt = 777, n_steps = 20;
  const Inputs in = make_inputs(rng, g, n_prompt, n_steps);
  a.reserve(n_prompt + n_steps);
  b.reserve(n_prompt + n_steps);
  prefill(a, cpu, g, in, n_prompt);
  prefill(b, gpu, g, in, n_prompt);
  const float scale = 1.f / std::sqrt(float(D));
  const int64_t cpu_ops = cpu_decode_op_calls();
  double worst = 0;
  cuda::DeviceBuffer d_out(size_t(QH) * D * 2);
  for (int s = 0; s < n_steps; ++s)
    for (int l = 0; l < g.n_layer; ++l) {
      const auto& pre = in.dpre[size_t(s)][size_t(l)];
      const auto& post = in.dpost[size_t(s)][size_t(l)];
      const auto& v = in.dv[size_t(s)][size_t(l)];
      const auto& q = in.q[size_t(s)][size_t(l)];
      if (l == 0) {
        a.begin_step(1);
        b.begin_step(1);
      }
      a.append(l, pre.data(), post.data(), v.data(), W, 1);
      std::vector<float> want(size_t(QH) * D);
      a.attend(l, q.data(), QH * D, 1, scale, want.data());
      const int64_t before = cpu_decode_op_calls();
      auto dp = to_device(to_bf16(pre)), dk = to_device(to_bf16(post)), dv = to_device(to_bf16(v));
      auto dq = to_device(to_bf16(q));
      poison(d_out);
      b.append(l, dp.data(), dk.data(), dv.data(), W, 1);
      b.attend(l, dq.data(), QH * D, 1, scale, d_out.data());
      sync(gpu.exec());
      EXPECT_EQ(cpu_decode_op_calls(), before) << c.policy << ": a decode op ran on the CPU";
      const auto got = bf16_to_f32_vec(to_host<uint16_t>(d_out, size_t(QH) * D));
      worst = std::max(worst, rel(got, want));
    }
  std::printf("[decode-step gpu vs cpu] %-64s max rel-L2 %.2e  hit rate gpu %.3f cpu %.3f\n", policy.c_str(), worst,
              b.stats().hit_rate(), a.stats().hit_rate());
  EXPECT_LT(worst, c.tol);
  EXPECT_EQ(b.stats().n_selected, a.stats().n_selected);
  if (none) {  // nothing decoded into slots, nothing fetched
    EXPECT_EQ(b.stats().n_fetched, 0);
    EXPECT_EQ(b.seq().slot_row_tokens(), 0);
    EXPECT_GT(a.stats().n_fetched, 0);
    continue;
  }
  EXPECT_NEAR(b.stats().hit_rate(), a.stats().hit_rate(), 0.03);
  EXPECT_EQ(b.seq().cache_all(), std::string(cache) == "all");
  if (std::string(cache) == "all") {  // the prompt was filled: only generated tokens miss, each once per row
    EXPECT_EQ(b.stats().n_fetched, a.stats().n_fetched);
    EXPECT_LE(b.stats().n_fetched, int64_t(n_steps) * g.n_layer * g.n_kv_head);
  }
  (void)cpu_ops;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Policies, DecodeStepCuda,
    ::testing::Values(Case{"yakv,budget=48"}, Case{"yakv,budget=48,kv=fp8"}, Case{"yakv,budget=48,kv=bf16"},
                      Case{"yakv,budget=48,kv=f32"}, Case{"yakv,budget=48,kv=higgs4"},
                      Case{"yakv,budget=48,kv=nvfp4"}, Case{"yakv,budget=48,gqa=mean"},
                      Case{"yakv,budget=48,sink=4,local=16"}, Case{"yakv,budget=48,keys_prerope=1"},
                      Case{"yakv,budget=48,lm=1bit"}, Case{"yakv,budget=48,lm=fp8s"},
                      Case{"yakv,budget=48,lm=higgs1:rs"}, Case{"yakv,budget=48,lm=higgs2:rs"},
                      Case{"yakv,budget=48,lm=int3:g16"}, Case{"yakv,budget=48,lm=nvfp4"},
                      Case{"yakv,budget=48,lm=residual,meta=higgs4,res=1bit,m=8"},
                      Case{"landmarks,chunk=4,lm=int4:g32,budget=48,local=8"},
                      Case{"landmarks,chunk=8,budget=40,sink=3,local=13"},
                      Case{"oracle,budget=48"}, Case{"shadowkv,rank=32,budget=48,outliers=4"},
                      Case{"shadowkv,rank=32,budget=48,outliers=4,gqa=mean"},
                      Case{"yakv,budget=48", 64, 9, 3}, Case{"yakv,budget=48,kv=fp8", 64, 9, 3},
                      Case{"shadowkv,rank=24,budget=48,outliers=4", 64, 9, 3},
                      Case{"yakv,budget=48", 128, 28, 4}, Case{"yakv,budget=48", 128, 64, 4},
                      Case{"yakv,budget=48,gqa=mean", 256, 8, 2}, Case{"oracle,budget=48", 256, 8, 2},
                      Case{"yakv,budget=48,reselect=3"}, Case{"yakv,budget=48,gqa=mean,reselect=2"},
                      Case{"landmarks,chunk=8,budget=40,sink=3,local=13,reselect=4"},
                      Case{"shadowkv,rank=32,budget=48,outliers=4,reselect=2"},
                      Case{"yakv,budget=48,reselect=2,rescore=2"}, Case{"yakv,budget=48,gqa=mean,reselect=3,rescore=1"},
                      Case{"oracle,budget=48,reselect=2,rescore=3"}, Case{"yakv,budget=48,reselect=2,rescore=2", 128, 28, 4},
                      Case{"yakv,budget=48,lm=higgs:U4:g128"}, Case{"yakv,budget=48,lm=higgs:U4:g128:rs", 128, 28, 4},
                      Case{"yakv,budget=48,lm=higgs:U4:g128,reselect=2,rescore=2"}));

// cache=auto: every token's decoded K/V where GPU memory allows (a small
// sequence: always), and on the CPU the last step's selection.
TEST(DecodeStepCuda, AutoCacheHoldsEveryTokenWhenItFits) {
  KVT_REQUIRE_GPU();
  const KvGeometry g = geometry(2, 8, 2, 128);
  const PolicyConfig p = parse_policy("yakv,budget=48");
  Device cpu(DeviceKind::cpu), gpu(DeviceKind::cuda);
  TieredKv a(plan_kv(p, g, DeviceKind::cpu), cpu), b(plan_kv(p, g, DeviceKind::cuda), gpu);
  std::mt19937 rng(5);
  const int n_prompt = 500;
  const Inputs in = make_inputs(rng, g, n_prompt, 1);
  a.reserve(n_prompt + 8);
  b.reserve(n_prompt + 8);
  prefill(a, cpu, g, in, n_prompt);
  prefill(b, gpu, g, in, n_prompt);
  EXPECT_FALSE(a.seq().cache_all());
  EXPECT_TRUE(b.seq().cache_all());
  EXPECT_EQ(b.seq().slot_row_tokens(), b.seq().capacity());
  const int64_t slots = int64_t(g.n_layer) * g.n_kv_head * b.seq().capacity() * b.plan().slot_bytes;
  EXPECT_GE(b.memory().gpu_bytes, slots);
}

// Three sequences of different lengths and budgets decoding in one batch:
// each step's outputs equal each sequence's outputs alone. Under
// reselect=3 the first sequence leaves halfway, so the others' rows move
// while they keep their selections.
class DecodeStepBatch : public ::testing::TestWithParam<const char*> {};

TEST_P(DecodeStepBatch, BatchEqualsSolo) {
  KVT_REQUIRE_GPU();
  const KvGeometry g = geometry(2, 8, 2, 128);
  const int W = g.n_kv_head * g.head_dim, QH = g.n_head, D = g.head_dim;
  const PolicyConfig p = parse_policy(GetParam());
  Device gpu(DeviceKind::cuda);
  const KvPlan plan = plan_kv(p, g, DeviceKind::cuda);
  std::mt19937 rng(3);
  const int n_steps = 8;
  const std::vector<int> lens{300, 777, 1500};
  std::vector<Inputs> ins;
  std::vector<std::unique_ptr<TieredKv>> solo, member;
  for (int n : lens) {
    ins.push_back(make_inputs(rng, g, n, n_steps));
    solo.push_back(std::make_unique<TieredKv>(plan, gpu));
    member.push_back(std::make_unique<TieredKv>(plan, gpu));
    for (auto* kv : {solo.back().get(), member.back().get()}) {
      kv->reserve(n + n_steps);
      prefill(*kv, gpu, g, ins.back(), n);
    }
  }
  DecodeBatch batch(plan, gpu);
  std::vector<TieredSeq*> seqs;
  for (auto& m : member) seqs.push_back(&m->seq());
  batch.set_sequences(seqs);
  const float scale = 1.f / std::sqrt(float(D));
  std::vector<int> active{0, 1, 2};
  double worst = 0;
  for (int s = 0; s < n_steps; ++s) {
    if (p.reselect > 1 && s == n_steps / 2) {
      active = {1, 2};
      batch.set_sequences({seqs[1], seqs[2]});
    }
    const int B = int(active.size());
    batch.begin_step();
    for (int l = 0; l < g.n_layer; ++l) {
      std::vector<uint16_t> kp, kk, vv, qq;  // [B, ...] bf16
      for (int i : active) {
        const Inputs& in = ins[size_t(i)];
        for (float f : in.dpre[size_t(s)][size_t(l)]) kp.push_back(f32_to_bf16(f));
        for (float f : in.dpost[size_t(s)][size_t(l)]) kk.push_back(f32_to_bf16(f));
        for (float f : in.dv[size_t(s)][size_t(l)]) vv.push_back(f32_to_bf16(f));
        for (float f : in.q[size_t(s)][size_t(l)]) qq.push_back(f32_to_bf16(f));
      }
      auto dkp = to_device(kp), dkk = to_device(kk), dvv = to_device(vv), dqq = to_device(qq);
      cuda::DeviceBuffer d_out(size_t(B) * QH * D * 2);
      poison(d_out);
      batch.append(l, dkp.data(), dkk.data(), dvv.data(), W);
      batch.attend(l, dqq.data(), scale, d_out.data());
      sync(gpu.exec());
      const auto got = bf16_to_f32_vec(to_host<uint16_t>(d_out, size_t(B) * QH * D));
      for (int j = 0; j < B; ++j) {
        const int i = active[size_t(j)];
        cuda::DeviceBuffer d_one(size_t(QH) * D * 2);
        auto o_kp = to_device(std::vector<uint16_t>(kp.begin() + int64_t(j) * W, kp.begin() + int64_t(j + 1) * W));
        auto o_kk = to_device(std::vector<uint16_t>(kk.begin() + int64_t(j) * W, kk.begin() + int64_t(j + 1) * W));
        auto o_vv = to_device(std::vector<uint16_t>(vv.begin() + int64_t(j) * W, vv.begin() + int64_t(j + 1) * W));
        auto o_qq =
            to_device(std::vector<uint16_t>(qq.begin() + int64_t(j) * QH * D, qq.begin() + int64_t(j + 1) * QH * D));
        if (l == 0) solo[size_t(i)]->begin_step(1);
        solo[size_t(i)]->append(l, o_kp.data(), o_kk.data(), o_vv.data(), W, 1);
        solo[size_t(i)]->attend(l, o_qq.data(), QH * D, 1, scale, d_one.data());
        sync(gpu.exec());
        const auto want = bf16_to_f32_vec(to_host<uint16_t>(d_one, size_t(QH) * D));
        const std::vector<float> mine(got.begin() + int64_t(j) * QH * D, got.begin() + int64_t(j + 1) * QH * D);
        worst = std::max(worst, rel(mine, want));
      }
    }
  }
  std::printf("[decode-step batch vs solo] %s: max rel-L2 %.2e\n", GetParam(), worst);
  EXPECT_LT(worst, 8e-3);  // the same kernels on the same data; splits differ, so bf16 roundings may
}

INSTANTIATE_TEST_SUITE_P(Policies, DecodeStepBatch,
                         ::testing::Values("yakv,budget=0.0625,min_budget=16",
                                           "yakv,budget=0.0625,min_budget=16,reselect=3",
                                           "yakv,budget=0.0625,min_budget=16,reselect=3,rescore=2"));

}  // namespace
}  // namespace kvtier
