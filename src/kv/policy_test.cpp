#include <gtest/gtest.h>

#include <string>

#include "core/status.h"
#include "kv/kv_plan.h"
#include "kv/policy.h"

namespace kvtier {
namespace {

KvGeometry llama31_8b() {
  KvGeometry g;
  g.n_layer = 32;
  g.n_head = 32;
  g.n_kv_head = 8;
  g.head_dim = 128;
  return g;
}

std::string error_of(const std::string& s) {
  try {
    parse_policy(s);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Policy, PresetsResolveToThePaperNumbers) {
  PolicyConfig s = parse_policy("shadowkv");
  EXPECT_EQ(s.index, IndexKind::shadowkv);
  EXPECT_EQ(s.chunk, 8);
  EXPECT_EQ(resolved_rank(s, 1024), 160);
  EXPECT_EQ(resolved_rank(s, 192), 30);  // 15.6 % of SmolLM2's 3·64
  EXPECT_EQ(budget_tokens(s, 131072), 2048);
  EXPECT_EQ(s.local, 32);
  EXPECT_EQ(s.outliers, 48);
  EXPECT_EQ(s.sink, 0);
  EXPECT_EQ(to_string(s.lm), "bf16");

  PolicyConfig y = parse_policy("yakv");
  EXPECT_EQ(y.index, IndexKind::landmarks);
  EXPECT_EQ(y.chunk, 1);
  EXPECT_EQ(budget_tokens(y, 131072), 4096);
  EXPECT_EQ(y.local, 64);
  EXPECT_EQ(y.outliers, 0);
  EXPECT_EQ(y.rank, 0);
  EXPECT_EQ(to_string(y.kv), "higgs4:g128");  // per KV head (SPEC: the engine lays records out per head)
  EXPECT_EQ(to_string(resolved_lm_spec(y.lm, 128)), "higgs2:g128");
  EXPECT_EQ(to_string(resolved_lm_spec(y.lm, 64)), "higgs2:g64");  // head smaller than 128

  PolicyConfig o = parse_policy("oracle");
  EXPECT_EQ(o.index, IndexKind::exact);
  EXPECT_EQ(o.chunk, 1);
  EXPECT_EQ(parse_policy("full").index, IndexKind::none);
  EXPECT_EQ(to_string(parse_policy("full").kv), "bf16");
}

TEST(Policy, Overrides) {
  PolicyConfig a = parse_policy("yakv,budget=0.05,local=128");
  EXPECT_DOUBLE_EQ(a.budget, 0.05);
  EXPECT_EQ(a.local, 128);
  EXPECT_EQ(budget_tokens(a, 1000), 50);
  PolicyConfig b = parse_policy("shadowkv,rank=0.156,budget=2048");
  EXPECT_EQ(resolved_rank(b, 1024), 160);
  EXPECT_EQ(budget_tokens(b, 10), 2048);
  EXPECT_EQ(resolved_rank(parse_policy("shadowkv,rank=160"), 1024), 160);
  EXPECT_EQ(resolved_rank(parse_policy("shadowkv,rank=1"), 1024), 1);
  EXPECT_EQ(resolved_rank(parse_policy("shadowkv,rank=full"), 1024), 1024);
  EXPECT_EQ(resolved_rank(parse_policy("shadowkv,rank=50%"), 1024), 512);
  EXPECT_EQ(to_string(parse_policy("full,kv=f32").kv), "f32");
  EXPECT_EQ(budget_tokens(parse_policy("oracle,budget=512"), 100000), 512);
  PolicyConfig c = parse_policy("landmarks,chunk=1,lm=higgs2:g64,budget=0.03125");
  EXPECT_EQ(c.chunk, 1);
  EXPECT_EQ(to_string(c.lm), "higgs2:g64");
  PolicyConfig r = parse_policy("yakv,lm=residual:meta=higgs4,res=1bit,m=8");
  EXPECT_TRUE(r.residual);
  EXPECT_EQ(r.res_m, 8);
  EXPECT_EQ(to_string(r.res_meta), "higgs4");
  EXPECT_EQ(to_string(r.res), "1bit");
  EXPECT_EQ(parse_policy("yakv,gqa=mean").gqa, GqaMode::mean);
  EXPECT_TRUE(parse_policy("yakv,keys_prerope=1").keys_prerope);
  EXPECT_EQ(to_string(parse_policy("yakv,kv=fp8").kv), "fp8");
  EXPECT_EQ(parse_policy("yakv,index=exact").chunk, 1);
  EXPECT_EQ(parse_policy("yakv").cache, CacheMode::auto_);
  EXPECT_EQ(parse_policy("yakv,cache=all").cache, CacheMode::all);
  EXPECT_EQ(parse_policy("shadowkv,cache=step").cache, CacheMode::step);
  EXPECT_EQ(to_string(parse_policy("yakv")).find("cache"), std::string::npos);  // auto: not printed
  EXPECT_NE(to_string(parse_policy("yakv,cache=all")).find(",cache=all"), std::string::npos);
  EXPECT_EQ(parse_policy("yakv").prefill, PrefillMode::auto_);
  EXPECT_EQ(parse_policy("yakv,prefill=stream").prefill, PrefillMode::stream);
  EXPECT_EQ(parse_policy("shadowkv,prefill=dense").prefill, PrefillMode::dense);
  EXPECT_EQ(to_string(parse_policy("yakv")).find("prefill"), std::string::npos);  // auto: not printed
  EXPECT_NE(to_string(parse_policy("oracle,prefill=stream")).find(",prefill=stream"), std::string::npos);
  EXPECT_EQ(parse_policy("yakv").store, StoreMode::host);
  EXPECT_EQ(parse_policy("shadowkv,store=gpu").store, StoreMode::gpu);
  EXPECT_EQ(to_string(parse_policy("yakv,store=host")).find("store"), std::string::npos);  // the default: not printed
  EXPECT_NE(to_string(parse_policy("yakv,store=gpu")).find(",store=gpu"), std::string::npos);
}

TEST(Policy, BudgetFloorInTokens) {
  const PolicyConfig p = parse_policy("yakv,min_budget=1024");
  EXPECT_EQ(budget_tokens(p, 8192), 1024);      // 1/32 of 8K = 256 < 1024
  EXPECT_EQ(budget_tokens(p, 131072), 4096);    // the fraction wins at 128K
  EXPECT_EQ(budget_tokens(parse_policy("oracle,budget=100,min_budget=300"), 50000), 300);
  EXPECT_NE(error_of("yakv,min_budget=-1").find("min_budget"), std::string::npos);
  EXPECT_NE(error_of("full,min_budget=10").find("min_budget"), std::string::npos);
}

TEST(Policy, ReselectEveryNSteps) {
  EXPECT_EQ(parse_policy("yakv").reselect, 1);
  EXPECT_EQ(parse_policy("yakv,reselect=4").reselect, 4);
  EXPECT_EQ(to_string(parse_policy("yakv")).find("reselect"), std::string::npos);  // the default: not printed
  EXPECT_NE(to_string(parse_policy("oracle,reselect=2")).find(",reselect=2"), std::string::npos);
  EXPECT_NE(error_of("yakv,reselect=0").find("reselect"), std::string::npos);
  EXPECT_NE(error_of("yakv,reselect=1.5").find("reselect"), std::string::npos);
  EXPECT_NE(error_of("full,reselect=2").find("reselect"), std::string::npos);
}

TEST(Policy, RescoreBetweenPicks) {
  EXPECT_EQ(parse_policy("yakv,reselect=2").rescore, 0);
  EXPECT_EQ(parse_policy("yakv,reselect=2,rescore=3").rescore, 3);
  EXPECT_EQ(parse_policy("oracle,reselect=4,rescore=1").rescore, 1);
  EXPECT_NE(to_string(parse_policy("yakv,reselect=2,rescore=2")).find(",rescore=2"), std::string::npos);
  // Refused: nothing to rescore between picks, chunks, outliers, residual landmarks, bad values.
  EXPECT_NE(error_of("yakv,rescore=2").find("reselect > 1"), std::string::npos);
  EXPECT_NE(error_of("landmarks,reselect=2,rescore=2").find("chunk=1"), std::string::npos);
  EXPECT_NE(error_of("shadowkv,reselect=2,rescore=2").find("chunk=1"), std::string::npos);
  EXPECT_NE(error_of("yakv,lm=residual,reselect=2,rescore=2").find("residual"), std::string::npos);
  EXPECT_NE(error_of("yakv,reselect=2,rescore=-1").find("rescore"), std::string::npos);
  EXPECT_NE(error_of("full,rescore=1").find("rescore"), std::string::npos);
}

TEST(Policy, RoundTripsThroughToString) {
  for (const char* s :
       {"full", "full,kv=f32", "shadowkv", "shadowkv,rank=160", "yakv", "oracle",
        "landmarks,chunk=4,lm=int4:g32", "yakv,lm=residual,meta=higgs4,res=1bit,m=4",
        "yakv,gqa=mean,sink=4,keys_prerope=1", "oracle,budget=512", "yakv,min_budget=1024",
        "yakv,cache=step", "oracle,cache=all", "yakv,prefill=stream", "shadowkv,prefill=dense",
        "yakv,store=gpu,cache=step", "shadowkv,reselect=3", "yakv,reselect=2,rescore=2"}) {
    PolicyConfig p = parse_policy(s);
    std::string t = to_string(p);
    EXPECT_EQ(to_string(parse_policy(t)), t) << s;
  }
}

TEST(Policy, ErrorsNameTheKeyAndTheValidValues) {
  EXPECT_NE(error_of("fast").find("full, shadowkv, yakv, oracle"), std::string::npos);
  EXPECT_NE(error_of("yakv,colour=red").find("colour"), std::string::npos);
  EXPECT_NE(error_of("yakv,colour=red").find("budget"), std::string::npos);  // lists keys
  EXPECT_NE(error_of("yakv,budget=-1").find("budget=-1"), std::string::npos);
  EXPECT_NE(error_of("yakv,budget=abc").find("budget"), std::string::npos);
  EXPECT_NE(error_of("yakv,budget=2.5").find("budget"), std::string::npos);
  EXPECT_NE(error_of("yakv,chunk=0").find("chunk"), std::string::npos);
  EXPECT_NE(error_of("yakv,gqa=min").find("shadowkv, mean"), std::string::npos);
  EXPECT_NE(error_of("yakv,cache=some").find("auto, step, all"), std::string::npos);
  EXPECT_NE(error_of("full,cache=all").find("cache"), std::string::npos);
  EXPECT_NE(error_of("yakv,prefill=lazy").find("auto, dense, stream"), std::string::npos);
  EXPECT_NE(error_of("full,prefill=stream").find("prefill"), std::string::npos);
  EXPECT_NE(error_of("yakv,store=disk").find("host, gpu"), std::string::npos);
  EXPECT_NE(error_of("full,store=gpu").find("store"), std::string::npos);
  EXPECT_NE(error_of("yakv,cache=none").find("store=gpu"), std::string::npos);
  EXPECT_NE(error_of("yakv,cache=never").find("none"), std::string::npos);
  EXPECT_EQ(parse_policy("yakv,store=gpu,cache=none").cache, CacheMode::none);
  EXPECT_NE(to_string(parse_policy("yakv,store=gpu,cache=none")).find(",cache=none"), std::string::npos);
  // A store the attention cannot read in place, on CUDA: cache=none is refused (step would serve).
  try {
    plan_kv(parse_policy("yakv,store=gpu,cache=none,kv=fp8"), KvGeometry{32, 32, 8, 128}, DeviceKind::cuda);
    ADD_FAILURE() << "cache=none with an fp8 store was planned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cache=step"), std::string::npos) << e.what();
  }
  // U<n> grids score each landmark in integers: not as a residual's parts.
  for (const char* bad : {"yakv,lm=residual,meta=higgs:U4,res=1bit", "yakv,lm=residual,meta=higgs4,res=higgs:U4",
                          "yakv,kv=higgs:U4:g128", "full,kv=higgs:U16"}) {
    try {
      plan_kv(parse_policy(bad), KvGeometry{32, 32, 8, 128}, DeviceKind::cpu);
      ADD_FAILURE() << bad << " was planned";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("U<n>"), std::string::npos) << e.what();
    }
  }
  EXPECT_NE(error_of("yakv,lm=higgs:U5").find("U<n>"), std::string::npos);
  EXPECT_NE(error_of("yakv,index=svd").find("none, landmarks, exact, shadowkv"),
            std::string::npos);
  EXPECT_NE(error_of("yakv,kv=int9").find("kv=int9"), std::string::npos);
  EXPECT_NE(error_of("yakv,lm=banana").find("lm=banana"), std::string::npos);
  EXPECT_NE(error_of("yakv,local").find("key=value"), std::string::npos);
  EXPECT_NE(error_of("yakv,local=1,local=2").find("twice"), std::string::npos);
  // contradictions
  EXPECT_NE(error_of("yakv,rank=160").find("rank"), std::string::npos);
  EXPECT_NE(error_of("landmarks,outliers=4").find("outliers"), std::string::npos);
  EXPECT_NE(error_of("full,budget=0.1").find("budget"), std::string::npos);
  EXPECT_NE(error_of("oracle,chunk=8").find("chunk"), std::string::npos);
  EXPECT_NE(error_of("yakv,m=8").find("lm=residual"), std::string::npos);
  EXPECT_NE(error_of("shadowkv,lm=residual").find("index=landmarks"), std::string::npos);
  EXPECT_NE(error_of("shadowkv,keys_prerope=1").find("keys_prerope"), std::string::npos);
  EXPECT_NE(error_of("shadowkv,rank=0").find("rank"), std::string::npos);
  EXPECT_NE(error_of("shadowkv,rank=2.5").find("rank"), std::string::npos);
  EXPECT_NE(error_of("").find("preset"), std::string::npos);
  EXPECT_THROW(resolved_rank(parse_policy("shadowkv,rank=2000"), 1024), Error);
}

TEST(Accounting, Llama31_8BMatchesSpecArithmetic) {
  const KvGeometry g = llama31_8b();
  const int64_t ctx = 131072;
  // full bf16: K and V, 8 heads × 128 × 2 B, 32 layers = 128 KiB per token.
  KvFootprint full = kv_footprint(parse_policy("full"), g, ctx);
  EXPECT_EQ(full.gpu_bytes_per_token, 131072);
  EXPECT_EQ(full.host_bytes_per_token, 0);
  EXPECT_EQ(full.gpu_bytes, int64_t(131072) * ctx);  // 16 GiB at 128K
  EXPECT_EQ(kv_footprint(parse_policy("full,kv=fp8"), g, ctx).gpu_bytes_per_token, 65536);
  EXPECT_EQ(kv_footprint(parse_policy("full,kv=f32"), g, ctx).gpu_bytes_per_token, 262144);

  // yakv: 2-bit landmarks (128·2/8 = 32 B) + one bf16 scale per head per token:
  // 34 B × 8 heads × 32 layers = 8704 B ≈ 8.5 KiB per token.
  KvFootprint y = kv_footprint(parse_policy("yakv"), g, ctx);
  EXPECT_EQ(y.gpu_bytes_per_token, 8704);
  // host: HIGGS-4 per KV head (group 128): 64 B codes + 2 B scale for K and for V,
  // padded to 144 B, × 8 heads × 32 layers.
  EXPECT_EQ(y.host_bytes_per_token, 144 * 8 * 32);
  EXPECT_EQ(kv_footprint(parse_policy("yakv,kv=fp8"), g, ctx).host_bytes_per_token, 65536);
  // Local window: 64 tokens of bf16 K and V resident.
  EXPECT_EQ(y.gpu_fixed_bytes, int64_t(64) * 4096 * 32);
  // cache=all: every token's decoded K|V slot and a bit, per KV head and
  // layer, on top of the index: bf16 on the GPU (512 B), f32 on the CPU (1 KiB).
  const KvFootprint ya = plan_footprint(plan_kv(parse_policy("yakv,cache=all"), g, DeviceKind::cuda), ctx);
  const KvFootprint yg = plan_footprint(plan_kv(parse_policy("yakv"), g, DeviceKind::cuda), ctx);
  EXPECT_EQ(ya.gpu_bytes_per_token - yg.gpu_bytes_per_token, (512 + 1.0 / 8) * 8 * 32);
  EXPECT_EQ(kv_footprint(parse_policy("yakv,cache=all"), g, ctx).gpu_bytes_per_token, 8704 + (1024 + 1.0 / 8) * 8 * 32);
  // store=gpu: the HIGGS-4 store counted on the GPU, nothing on the host; the
  // host budget charges nothing, the GPU budget the store on top.
  const KvFootprint ys = kv_footprint(parse_policy("yakv,store=gpu"), g, ctx);
  EXPECT_EQ(ys.gpu_bytes_per_token, 8704 + 144 * 8 * 32);
  EXPECT_EQ(ys.host_bytes_per_token, 0);
  EXPECT_EQ(ys.host_bytes, 0);
  EXPECT_EQ(ys.gpu_bytes, y.gpu_bytes + y.host_bytes);
  EXPECT_EQ(kv_charge_bytes(parse_policy("yakv,store=gpu"), g, ctx, false), 0);
  EXPECT_EQ(kv_charge_bytes(parse_policy("yakv,store=gpu"), g, ctx, true), kv_charge_bytes(parse_policy("yakv"), g, ctx, true));
  const KvGpuCharge cs = kv_gpu_charge(parse_policy("yakv,store=gpu,cache=step"), g, 4096, 4160);
  const KvGpuCharge ch = kv_gpu_charge(parse_policy("yakv,cache=step"), g, 4096, 4160);
  EXPECT_EQ(cs.decode_bytes - ch.decode_bytes, int64_t(144) * 8 * 32 * 4160);
  EXPECT_EQ(cs.prefill_bytes - ch.prefill_bytes, int64_t(144) * 8 * 32 * 4160);
  // ... read in place (cache=none, or auto under store=gpu on CUDA): no
  // slots, 512 B per selected token, KV head and layer less than step.
  const int64_t kmax = budget_tokens(parse_policy("yakv"), 4096);  // chunk 1
  for (const char* in_place : {"yakv,store=gpu,cache=none", "yakv,store=gpu"}) {
    SCOPED_TRACE(in_place);
    EXPECT_TRUE(plan_kv(parse_policy(in_place), g, DeviceKind::cuda).in_place);
    EXPECT_FALSE(plan_kv(parse_policy(in_place), g, DeviceKind::cpu).in_place);  // the CPU keeps its slot cache
    EXPECT_EQ(cs.decode_bytes - kv_gpu_charge(parse_policy(in_place), g, 4096, 4160).decode_bytes,
              kmax * 512 * 8 * 32);
  }
  // reselect: the selection kept between picks, 4 B per budget token, KV head and layer.
  EXPECT_EQ(kv_gpu_charge(parse_policy("yakv,store=gpu,cache=step,reselect=2"), g, 4096, 4160).decode_bytes -
                cs.decode_bytes,
            kmax * 4 * 8 * 32);
  EXPECT_EQ(kv_gpu_charge(parse_policy("yakv,store=gpu,cache=step,reselect=2,rescore=2"), g, 4096, 4160).decode_bytes -
                cs.decode_bytes,
            kmax * 3 * 4 * 8 * 32);  // rescore=2: the candidates, 3 per budget token
  EXPECT_EQ(kv_gpu_charge(parse_policy("yakv,store=gpu,reselect=4"), g, 4096, 4160).prefill_bytes,
            kv_gpu_charge(parse_policy("yakv,store=gpu"), g, 4096, 4160).prefill_bytes);
  EXPECT_FALSE(plan_kv(parse_policy("yakv,store=gpu,cache=step"), g, DeviceKind::cuda).in_place);
  EXPECT_FALSE(plan_kv(parse_policy("yakv"), g, DeviceKind::cuda).in_place);
  EXPECT_FALSE(plan_kv(parse_policy("yakv,store=gpu,kv=fp8"), g, DeviceKind::cuda).in_place);  // auto: step

  // bf16 chunk-8 landmarks: 128·2/8 = 32 B per head per token — SPEC: the same
  // order of GPU memory as 2-bit per-token landmarks (8192 vs 8704).
  EXPECT_EQ(kv_footprint(parse_policy("landmarks,chunk=8"), g, ctx).gpu_bytes_per_token, 8192);

  // shadowkv: U·S rows 160 × bf16 + bf16 chunk-8 landmarks, per layer.
  KvFootprint s = kv_footprint(parse_policy("shadowkv"), g, ctx);
  EXPECT_EQ(s.gpu_bytes_per_token, (160 * 2 + 256) * 32);
  EXPECT_EQ(s.host_bytes_per_token, 65536);  // values only, bf16
  // fixed: Vᵀ [160, 1024] bf16 + 48·8 outlier tokens K/V bf16 + 32 local tokens, per layer
  EXPECT_EQ(s.gpu_fixed_bytes, (int64_t(160) * 1024 * 2 + 48 * 8 * 4096 + 32 * 4096) * 32);

  // oracle: exact keys in bf16 on the GPU.
  EXPECT_EQ(kv_footprint(parse_policy("oracle"), g, ctx).gpu_bytes_per_token, 65536);

  // residual: per landmark a 1-bit residual (16 B codes + bf16 min/step) and
  // 1/8 of a HIGGS-4 meta-landmark (64 B + 2 B): (20 + 66/8) B × 8 × 32.
  KvFootprint r = kv_footprint(parse_policy("yakv,lm=residual,meta=higgs4,res=1bit,m=8"), g, ctx);
  EXPECT_DOUBLE_EQ(r.gpu_bytes_per_token, (20 + 66.0 / 8) * 8 * 32);
}

}  // namespace
}  // namespace kvtier
