// Policy knobs that size memory are bounded by the context when a sequence
// starts, and what a sequence may hold is charged to the host KV budget (on
// the CPU device the GPU tier, windows included, is host memory too) and, on
// a CUDA device, to the GPU KV budget (kv_gpu_charge).
#include <gtest/gtest.h>

#include <string>

#include "kv/policy.h"
#include "kvtier/engine.h"
#include "model/model.h"

namespace kvtier {
namespace {

const std::string kModel = std::string(KVT_SOURCE_DIR) + "/tests/fixtures/hf_tiny_qwen2";

std::unique_ptr<Engine> tiny_engine(int64_t ctx, int64_t budget = 0) {
  EngineOptions o;
  o.model_path = kModel;
  o.n_threads = 1;
  o.max_context = ctx;
  o.host_kv_budget_bytes = budget;
  return Engine::load(o);
}

SamplingParams few_tokens(int n) {
  SamplingParams s;
  s.max_new_tokens = n;
  s.ignore_eos = true;
  return s;
}

std::string limit_error(Engine& e, const std::string& policy) {
  try {
    e.start({1, 2, 3}, few_tokens(2), policy);
  } catch (const LimitError& err) {
    return err.what();
  }
  return "";
}

TEST(EngineLimits, KnobsAboveTheContextAreRefusedBeforeAllocating) {
  auto e = tiny_engine(256);
  // Before the bound, local=1000000000 allocated its ring up front (bad_alloc or GBs).
  for (const std::string knob : {"local=1000000000", "local=257", "sink=300", "budget=1000",
                                 "min_budget=100000", "chunk=512"}) {
    const std::string policy = "landmarks," + knob;
    const std::string err = limit_error(*e, policy);
    const std::string key = knob.substr(0, knob.find('='));
    EXPECT_NE(err.find(key + "="), std::string::npos) << policy << ": " << err;
    EXPECT_NE(err.find("context of 256"), std::string::npos) << policy << ": " << err;
  }
  EXPECT_NE(limit_error(*e, "shadowkv,outliers=40,chunk=8,rank=4").find("outliers"), std::string::npos);
  // A residual unit of m chunks longer than the context is never indexed (its
  // unindexed tail would be sized by it): refused, naming m.
  EXPECT_NE(limit_error(*e, "yakv,lm=residual,m=512").find("m (x chunk)=512"), std::string::npos);
}

TEST(EngineLimits, KnobsWithinTheContextRun) {
  auto e = tiny_engine(256);
  for (const std::string policy : {"yakv,local=256", "landmarks,sink=256,local=200", "oracle,budget=256"}) {
    const GenerationResult r = e->generate({1, 2, 3, 4}, few_tokens(3), policy);
    EXPECT_EQ(r.tokens.size(), 3u) << policy;
  }
}

TEST(EngineLimits, LargeLocalWindowHoldsOnlyTheTokensThatExist) {
  auto e = tiny_engine(4096);
  auto held = [&](const std::string& policy) {
    auto seq = e->start({1, 2, 3, 4}, few_tokens(2), policy);
    std::string piece;
    while (seq->step(&piece)) {
    }
    return seq->result().kv_memory;
  };
  // 6 tokens exist: a window of 4096 holds what a window of 8 holds (both
  // cover every token), not 4096 rows of K/V per layer.
  const KvMemory big = held("yakv,local=4096"), small = held("yakv,local=8");
  EXPECT_EQ(big.gpu_bytes, small.gpu_bytes);
  EXPECT_EQ(big.host_bytes, small.host_bytes);
  const KvGeometry g = e->model().kv_geometry();
  const int64_t row = int64_t(g.n_kv_head) * g.head_dim * 2 /*bf16*/ * 2 /*K,V*/ * g.n_layer;
  EXPECT_LT(big.gpu_bytes, 64 * row);
}

TEST(EngineLimits, HostBudgetIsChargedTheResidentWindowOnCpu) {
  const KvGeometry g = tiny_engine(256)->model().kv_geometry();
  const PolicyConfig p = parse_policy("yakv,local=256");
  const int64_t n_ctx = 100;
  const KvFootprint f = kv_footprint(p, g, n_ctx);
  const int64_t charge = kv_charge_bytes(p, g, n_ctx, true);
  // The window is counted for at most n_ctx tokens, plus the host tier and the index.
  EXPECT_GT(charge, f.host_bytes);
  EXPECT_EQ(kv_charge_bytes(p, g, n_ctx, false), f.host_bytes);
  // A budget just under the charge refuses the request; one at the charge admits it.
  auto tight = tiny_engine(256, charge - 1);
  EXPECT_THROW(tight->start(std::vector<int32_t>(96, 5), few_tokens(4), "yakv,local=256"), LimitError);
  auto enough = tiny_engine(256, charge);
  EXPECT_NO_THROW(enough->start(std::vector<int32_t>(96, 5), few_tokens(4), "yakv,local=256"));
}

// What a sequence holds on a CUDA device, by phase, at Llama-3.1-8B's KV
// shapes (32 layers, 8 KV heads of 128): full holds bf16 K/V in both;
// an offloaded policy holds a bf16 copy of the prompt's K/V while the prompt
// runs, then its index, windows and slot cache.
TEST(EngineLimits, GpuChargeFollowsThePhases) {
  KvGeometry g;
  g.n_layer = 32;
  g.n_head = 32;
  g.n_kv_head = 8;
  g.head_dim = 128;
  const int64_t n_prompt = 32768, n_total = n_prompt + 512;
  const int64_t kv_row = int64_t(g.n_layer) * g.n_kv_head * g.head_dim * 2 * 2;  // bf16 K|V of one token
  const KvGpuCharge full = kv_gpu_charge(parse_policy("full"), g, n_prompt, n_total);
  EXPECT_EQ(full.prefill_bytes, n_total * kv_row);
  EXPECT_EQ(full.decode_bytes, n_total * kv_row);
  const KvGpuCharge step = kv_gpu_charge(parse_policy("yakv,cache=step"), g, n_prompt, n_total);
  const KvGpuCharge all = kv_gpu_charge(parse_policy("yakv,cache=all"), g, n_prompt, n_total);
  const KvGpuCharge autoc = kv_gpu_charge(parse_policy("yakv"), g, n_prompt, n_total);
  EXPECT_GT(step.prefill_bytes, n_prompt * kv_row);  // the prompt's K/V and its index
  EXPECT_LT(step.prefill_bytes, n_prompt * kv_row * 11 / 10);
  EXPECT_EQ(all.prefill_bytes, step.prefill_bytes);  // no slot exists before decode
  // Decode: the index, the windows and budget-sized slots (3.125 % of the prompt).
  const KvFootprint f = kv_footprint(parse_policy("yakv,cache=step"), g, n_total);
  EXPECT_GT(step.decode_bytes, f.gpu_bytes);
  EXPECT_LT(step.decode_bytes, full.decode_bytes / 8);
  EXPECT_GT(all.decode_bytes, step.decode_bytes);  // every token's slot
  EXPECT_EQ(autoc.decode_bytes, step.decode_bytes);  // auto is charged as step
  EXPECT_EQ(step.peak(), step.prefill_bytes);
  EXPECT_THROW(kv_gpu_charge(parse_policy("full"), g, 10, 5), Error);
  // prefill=stream holds two layers' bf16 K|V copies instead of every
  // layer's (the attended one and the next one being read, each with
  // fetch_dense's staging); the decode charge is the same.
  const KvGpuCharge stream = kv_gpu_charge(parse_policy("yakv,cache=step,prefill=stream"), g, n_prompt, n_total);
  EXPECT_EQ(stream.decode_bytes, step.decode_bytes);
  EXPECT_LT(stream.prefill_bytes, step.prefill_bytes - n_total * kv_row * 30 / 32 + (int64_t(1) << 26));
  EXPECT_GT(stream.prefill_bytes, step.prefill_bytes - n_total * kv_row * 30 / 32);
  EXPECT_EQ(stream.peak(), std::max(stream.prefill_bytes, stream.decode_bytes));
  // A model of two layers holds one layer's copy streamed (two would cost
  // the dense copy's memory): the streamed charge stays under the dense one.
  KvGeometry two = g;
  two.n_layer = 2;
  const int64_t row2 = kv_row / 16;  // bf16 K|V of one token in two layers
  const KvGpuCharge dense2 = kv_gpu_charge(parse_policy("yakv,cache=step"), two, n_prompt, n_total);
  const KvGpuCharge stream2 = kv_gpu_charge(parse_policy("yakv,cache=step,prefill=stream"), two, n_prompt, n_total);
  EXPECT_LT(stream2.prefill_bytes, dense2.prefill_bytes - n_total * row2 / 2 + (int64_t(1) << 24));
  EXPECT_GT(stream2.prefill_bytes, dense2.prefill_bytes - n_total * row2 / 2);
}

// Under a GPU budget the automatic choices follow the charge: cache=auto is
// step, and prefill=auto is dense while the dense copy's charge fits, else stream.
TEST(EngineLimits, GpuBudgetStreamsThePrefillThatWouldNotFit) {
  KvGeometry g;
  g.n_layer = 32;
  g.n_head = 32;
  g.n_kv_head = 8;
  g.head_dim = 128;
  const int64_t n_prompt = 131072, n_total = n_prompt + 512;
  const PolicyConfig yakv = parse_policy("yakv");
  const int64_t dense = kv_gpu_charge(policy_under_gpu_budget(yakv, g, n_prompt, n_total, int64_t(1) << 50), g,
                                      n_prompt, n_total).peak();
  const PolicyConfig roomy = policy_under_gpu_budget(yakv, g, n_prompt, n_total, dense);
  EXPECT_EQ(roomy.prefill, PrefillMode::dense);
  EXPECT_EQ(roomy.cache, CacheMode::step);
  const PolicyConfig tight = policy_under_gpu_budget(yakv, g, n_prompt, n_total, dense - 1);
  EXPECT_EQ(tight.prefill, PrefillMode::stream);
  EXPECT_LT(kv_gpu_charge(tight, g, n_prompt, n_total).peak(), dense / 4);
  // What was asked for stays.
  EXPECT_EQ(policy_under_gpu_budget(parse_policy("yakv,prefill=dense"), g, n_prompt, n_total, 1).prefill,
            PrefillMode::dense);
  EXPECT_EQ(policy_under_gpu_budget(parse_policy("full"), g, n_prompt, n_total, 1).prefill, PrefillMode::auto_);
}

TEST(EngineLimits, GpuBudgetNeedsTheCudaDevice) {
  EngineOptions o;
  o.model_path = kModel;
  o.gpu_kv_budget = 1e9;
  try {
    Engine::load(o);
    FAIL() << "--gpu-kv-budget was accepted on the CPU device";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--device cuda"), std::string::npos) << e.what();
  }
  o.gpu_kv_budget = -1;
  o.device = "cuda";
  EXPECT_THROW(Engine::load(o), Error);
}

TEST(EngineLimits, Fp8PrefillNeedsTheCudaDeviceAndAKnownName) {
  EngineOptions o;
  o.model_path = kModel;
  auto refused = [&](const std::string& gemm, const std::string& why) {
    o.prefill_gemm = gemm;
    try {
      Engine::load(o);
      ADD_FAILURE() << "--prefill-gemm " << gemm << " was accepted on the CPU device";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refused("fp8", "--device cuda");
  refused("int4", "expected bf16 or fp8");
  o.prefill_gemm = "bf16";
  EXPECT_NO_THROW(Engine::load(o));
}

}  // namespace
}  // namespace kvtier
