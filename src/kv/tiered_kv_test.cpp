// The device-generic tiered cache (tiered_kv + decode_step) on the CPU
// against the CPU store it replaces (tiered_store: the readable
// TieredKvStore::attend_one), for every kind of policy: the same prompt and
// decode tokens appended to both, the same queries, attention outputs equal
// to float rounding. Inputs are bf16-representable so that the resident
// tokens' bf16 rounding is exact in both.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/half.h"
#include "core/status.h"
#include "kv/decode_batch.h"
#include "kv/decode_groups.h"
#include "kv/dense_kv.h"
#include "kv/full_kv.h"
#include "kv/tiered_kv.h"
#include "kv/tiered_store.h"
#include "ops/index_score/index_rows.h"
#include "ops/quant/quant_scalar.h"

namespace kvtier {
namespace {

std::vector<float> inv_freq_table(int head_dim) {
  std::vector<float> f(size_t(head_dim / 2));
  for (int i = 0; i < head_dim / 2; ++i) f[size_t(i)] = float(std::pow(10000.0, -2.0 * i / head_dim));
  return f;
}

KvGeometry geometry(int n_layer, int n_head, int n_kv_head, int head_dim) {
  KvGeometry g{n_layer, n_head, n_kv_head, head_dim};
  g.rope_inv_freq = inv_freq_table(head_dim);
  g.rope_interleaved = false;
  const std::vector<float> inv = g.rope_inv_freq;
  g.apply_rope = [inv, n_kv_head, head_dim](float* k, const int64_t* pos, int64_t n) {
    const int half = head_dim / 2;
    for (int64_t t = 0; t < n; ++t)
      for (int h = 0; h < n_kv_head; ++h) {
        float* v = k + (t * n_kv_head + h) * head_dim;
        for (int i = 0; i < half; ++i) {
          const double a = double(pos[t]) * inv[size_t(i)];
          const float c = float(std::cos(a)), s = float(std::sin(a));
          const float x0 = v[i], x1 = v[i + half];
          v[i] = x0 * c - x1 * s;
          v[i + half] = x0 * s + x1 * c;
        }
      }
  };
  return g;
}

std::vector<float> bf16_values(std::mt19937& rng, size_t n, float spread) {
  std::normal_distribution<float> d(0.f, spread);
  std::vector<float> v(n);
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(d(rng)));
  return v;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) e += double(a[i] - b[i]) * (a[i] - b[i]), n += double(b[i]) * b[i];
  return std::sqrt(e / std::max(n, 1e-30));
}

struct Case {
  const char* policy;
  int head_dim = 64;
  int n_head = 4, n_kv_head = 2;
  double tol = 2e-5;
};

class TieredKvVsStore : public ::testing::TestWithParam<Case> {};

TEST_P(TieredKvVsStore, SameAttentionOutputs) {
  const Case c = GetParam();
  const int L = 2, D = c.head_dim, H = c.n_kv_head, QH = c.n_head, W = H * D;
  const KvGeometry g = geometry(L, QH, H, D);
  const PolicyConfig p = parse_policy(c.policy);
  Device cpu(DeviceKind::cpu);
  TieredKvStore ref(p, g);
  TieredKv kv(plan_kv(p, g, DeviceKind::cpu), cpu);
  // cache=all changes what is counted as read from the host tier, not what is attended to.
  TieredKv all(plan_kv(parse_policy(std::string(c.policy) + ",cache=all"), g, DeviceKind::cpu), cpu);
  std::mt19937 rng(7);
  const int n_prompt = 301, n_steps = 24;
  const float scale = 1.f / std::sqrt(float(D));
  // Keys with a few directions that stand out, so that selections are not ties.
  auto keys = [&](int n, int64_t pos0, std::vector<float>& pre, std::vector<float>& post) {
    pre = bf16_values(rng, size_t(n) * W, 1.0f);
    for (int t = 0; t < n; t += 7)
      for (int d = 0; d < W; d += 5) pre[size_t(t) * W + d] *= 4.f;
    post = pre;
    std::vector<int64_t> pos(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) pos[size_t(i)] = pos0 + i;
    g.apply_rope(post.data(), pos.data(), n);
    for (float& x : post) x = bf16_to_f32(f32_to_bf16(x));
  };
  for (int chunk0 : {0, 128, 256}) {
    const int n = std::min(128, n_prompt - chunk0);
    for (int l = 0; l < L; ++l) {
      std::vector<float> pre, post;
      keys(n, chunk0, pre, post);
      const std::vector<float> v = bf16_values(rng, size_t(n) * W, 1.0f);
      ref.append(l, pre.data(), post.data(), v.data(), n);
      kv.append(l, pre.data(), post.data(), v.data(), W, n);
      all.append(l, pre.data(), post.data(), v.data(), W, n);
    }
  }
  ref.set_phase(KvPhase::decode);
  kv.start_decode();
  all.start_decode();
  double worst = 0;
  bool same = true;
  for (int step = 0; step < n_steps; ++step)
    for (int l = 0; l < L; ++l) {
      std::vector<float> pre, post;
      keys(1, n_prompt + step, pre, post);
      const std::vector<float> v = bf16_values(rng, size_t(W), 1.0f);
      const std::vector<float> q = bf16_values(rng, size_t(QH) * D, 1.0f);
      if (l == 0) kv.begin_step(1), all.begin_step(1);
      ref.append(l, pre.data(), post.data(), v.data(), 1);
      kv.append(l, pre.data(), post.data(), v.data(), W, 1);
      all.append(l, pre.data(), post.data(), v.data(), W, 1);
      std::vector<float> a(size_t(QH) * D), b(size_t(QH) * D), b_all(size_t(QH) * D);
      ref.attend(l, q.data(), 1, scale, a.data());
      kv.attend(l, q.data(), QH * D, 1, scale, b.data());
      all.attend(l, q.data(), QH * D, 1, scale, b_all.data());
      same = same && b == b_all;
      worst = std::max(worst, rel_l2(b, a));
    }
  EXPECT_LT(worst, c.tol) << c.policy;
  const KvStats st = kv.stats();
  EXPECT_GT(st.n_selected, 0) << c.policy;
  EXPECT_LE(st.n_fetched, st.n_selected);
  // The same host-tier reuse as the store's own statistic.
  EXPECT_NEAR(st.hit_rate(), ref.stats().reuse_rate(), 0.02) << c.policy;
  // cache=all: the prompt is held from the start; a generated token is read
  // at most once per (layer, KV head), after it leaves the window.
  EXPECT_TRUE(same) << c.policy;
  EXPECT_TRUE(all.seq().cache_all());
  const KvStats sa = all.stats();
  EXPECT_EQ(sa.n_selected, st.n_selected) << c.policy;
  EXPECT_LE(sa.n_fetched, int64_t(n_steps) * L * H) << c.policy;
  EXPECT_LE(sa.n_fetched, st.n_fetched) << c.policy;
  // ... held as decoded K|V in RAM: a slot per token of the capacity, not
  // the step's kmax scratch slots.
  const int64_t slots = int64_t(L) * H * all.seq().capacity() * all.plan().slot_bytes;
  EXPECT_GE(all.memory().gpu_bytes, slots) << c.policy;
  // store=gpu on the CPU device: the same RAM and the same answers (the
  // store tests above), its bytes counted as the GPU tier's.
  if (p.store == StoreMode::gpu) {
    const KvMemory m = kv.memory();
    EXPECT_EQ(m.host_bytes, 0) << c.policy;
    EXPECT_GE(m.gpu_bytes, int64_t(L) * (n_prompt + n_steps) * kv.plan().host_tok_bytes) << c.policy;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Policies, TieredKvVsStore,
    ::testing::Values(Case{"yakv,budget=32"}, Case{"yakv,budget=32,kv=fp8"}, Case{"yakv,budget=32,kv=bf16"},
                      Case{"yakv,budget=32,kv=f32"}, Case{"yakv,budget=32,kv=higgs4"},
                      Case{"yakv,budget=32,kv=nvfp4"}, Case{"yakv,budget=32,gqa=mean"},
                      Case{"yakv,budget=32,sink=4,local=16"}, Case{"yakv,budget=32,keys_prerope=1"},
                      Case{"yakv,budget=32,lm=1bit"}, Case{"yakv,budget=32,lm=fp8s"},
                      Case{"yakv,budget=32,lm=higgs1:rs"}, Case{"yakv,budget=32,lm=int3:g16"},
                      Case{"yakv,budget=32,lm=higgs:U4"}, Case{"yakv,budget=32,lm=higgs:U4:g128:rs", 128, 8, 2},
                      Case{"yakv,budget=32,lm=residual,meta=higgs4,res=1bit,m=8"},
                      Case{"landmarks,chunk=4,lm=int4:g32,budget=32,local=8"},
                      Case{"landmarks,chunk=8,budget=40,sink=3,local=13"},
                      Case{"oracle,budget=32"}, Case{"oracle,budget=32,kv=f32"},
                      Case{"shadowkv,rank=24,budget=32,outliers=4"},
                      Case{"shadowkv,rank=24,budget=32,outliers=4,gqa=mean"},
                      Case{"yakv,budget=32", 128, 8, 2}, Case{"yakv,budget=32", 64, 7, 1},
                      Case{"yakv,budget=0.05,min_budget=24"}, Case{"yakv,budget=32,store=gpu"},
                      Case{"shadowkv,rank=24,budget=32,outliers=4,store=gpu"},
                      Case{"yakv,budget=32,reselect=3"}, Case{"yakv,budget=32,store=gpu,reselect=2"},
                      Case{"landmarks,chunk=8,budget=40,sink=3,local=13,reselect=2"},
                      Case{"yakv,budget=32,lm=residual,meta=higgs4,res=1bit,m=8,reselect=4"},
                      Case{"shadowkv,rank=24,budget=32,outliers=4,reselect=3"},
                      Case{"yakv,budget=32,reselect=2,rescore=2"}, Case{"yakv,budget=32,reselect=3,rescore=1,gqa=mean"},
                      Case{"oracle,budget=32,reselect=4,rescore=3"},
                      Case{"yakv,budget=32,store=gpu,reselect=3,rescore=2"},
                      Case{"yakv,budget=0.25,reselect=2,rescore=4"}));  // every token a candidate

// reselect=N: a sequence counts the selection it keeps between picks, 4 B
// per budget token, KV head and layer, and nothing else changes.
TEST(TieredKvMemory, ReselectCountsTheKeptSelection) {
  const int L = 2, D = 64, H = 2, QH = 4, W = H * D, n = 300;
  const KvGeometry g = geometry(L, QH, H, D);
  Device cpu(DeviceKind::cpu);
  TieredKv plain(plan_kv(parse_policy("yakv,budget=32"), g, DeviceKind::cpu), cpu);
  TieredKv kept(plan_kv(parse_policy("yakv,budget=32,reselect=3"), g, DeviceKind::cpu), cpu);
  std::mt19937 rng(5);
  for (int l = 0; l < L; ++l) {
    const auto k = bf16_values(rng, size_t(n) * W, 1.f), v = bf16_values(rng, size_t(n) * W, 1.f);
    plain.append(l, k.data(), k.data(), v.data(), W, n);
    kept.append(l, k.data(), k.data(), v.data(), W, n);
  }
  const int64_t before = kept.memory().gpu_bytes;
  EXPECT_EQ(before, plain.memory().gpu_bytes);  // nothing kept before decode starts
  plain.start_decode();
  kept.start_decode();
  EXPECT_EQ(kept.memory().gpu_bytes - plain.memory().gpu_bytes, int64_t(L) * H * kept.seq().kmax_tokens() * 4);
  EXPECT_EQ(kept.memory().host_bytes, plain.memory().host_bytes);
  // rescore=D: the candidates, (D + 1)·kmax words per KV head and layer.
  TieredKv re(plan_kv(parse_policy("yakv,budget=32,reselect=3,rescore=2"), g, DeviceKind::cpu), cpu);
  for (int l = 0; l < L; ++l) {
    const auto k = bf16_values(rng, size_t(n) * W, 1.f), v = bf16_values(rng, size_t(n) * W, 1.f);
    re.append(l, k.data(), k.data(), v.data(), W, n);
  }
  re.start_decode();
  EXPECT_EQ(re.memory().gpu_bytes - plain.memory().gpu_bytes, int64_t(L) * H * re.seq().kmax_tokens() * 3 * 4);
}

// cache=auto takes every token's cache only when free GPU memory holds it
// twice plus the margin (max(1 GiB, 10 % of the device)); never on the CPU.
TEST(CacheChoice, AutoLeavesRoomForTheNextPrefill) {
  const int64_t G = int64_t(1) << 30, total = 100 * G;  // margin 10 GiB
  EXPECT_TRUE(choose_cache_all(CacheMode::auto_, true, 20 * G, 50 * G, total));   // 40 + 10 <= 50
  EXPECT_FALSE(choose_cache_all(CacheMode::auto_, true, 20 * G, 49 * G, total));  // fits once, not twice
  EXPECT_TRUE(choose_cache_all(CacheMode::all, true, 20 * G, 30 * G, total));     // once is enough when asked
  EXPECT_FALSE(choose_cache_all(CacheMode::step, true, G, 100 * G, total));
  EXPECT_FALSE(choose_cache_all(CacheMode::auto_, false, G, 0, 0));               // the CPU: step
  EXPECT_TRUE(choose_cache_all(CacheMode::all, false, G, 0, 0));                  // asked for: decoded slots in RAM
  try {
    choose_cache_all(CacheMode::all, true, 20 * G, 29 * G, total);
    ADD_FAILURE() << "cache=all beyond free memory was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cache=step"), std::string::npos) << e.what();
  }
}

// The CPU's full attention decodes through the decode-attention op (the
// vector row kernels over the stored rows), with the prefill loop's outputs.
TEST(DenseKvCpu, DecodeRunsTheDecodeAttentionOp) {
  const int L = 2, D = 64, H = 2, QH = 6, W = H * D;
  const KvGeometry g = geometry(L, QH, H, D);
  const PolicyConfig p = parse_policy("full,kv=f32");
  Device cpu(DeviceKind::cpu);
  DenseKv kv(plan_kv(p, g, DeviceKind::cpu), cpu);
  FullKvStore ref(p, g);
  std::mt19937 rng(3);
  const int n_prompt = 200;
  const float scale = 1.f / std::sqrt(float(D));
  for (int l = 0; l < L; ++l) {
    const auto k = bf16_values(rng, size_t(n_prompt) * W, 1.f), v = bf16_values(rng, size_t(n_prompt) * W, 1.f);
    kv.append(l, k.data(), k.data(), v.data(), W, n_prompt);
    ref.append(l, k.data(), k.data(), v.data(), n_prompt);
  }
  kv.start_decode();
  ref.set_phase(KvPhase::decode);
  for (int step = 0; step < 3; ++step) {
    kv.begin_step(1);
    for (int l = 0; l < L; ++l) {
      const auto k = bf16_values(rng, size_t(W), 1.f), v = bf16_values(rng, size_t(W), 1.f);
      const auto q = bf16_values(rng, size_t(QH) * D, 1.f);
      kv.append(l, k.data(), k.data(), v.data(), W, 1);
      ref.append(l, k.data(), k.data(), v.data(), 1);
      std::vector<float> a(size_t(QH) * D), b(size_t(QH) * D);
      const int64_t before = cpu_decode_op_calls();
      kv.attend(l, q.data(), QH * D, 1, scale, b.data());
      EXPECT_GT(cpu_decode_op_calls(), before) << "the CPU decode step bypassed the decode-attention op";
      ref.attend(l, q.data(), 1, scale, a.data());
      EXPECT_LT(rel_l2(b, a), 1e-5);
    }
  }
}

// kv=bf16 and kv=fp8 on the CPU: f32 rows through prefill, bf16 rows from
// the start of decode, the same attention as an f32 cache given the values
// the format rounds to (decode steps and a continuation of several tokens).
TEST(DenseKvCpu, NarrowsToBf16AtDecodeWithTheSameOutputs) {
  const int L = 2, D = 64, H = 2, QH = 6, W = H * D;
  const KvGeometry g = geometry(L, QH, H, D);
  const float scale = 1.f / std::sqrt(float(D));
  Device cpu(DeviceKind::cpu);
  for (const char* kv_fmt : {"bf16", "fp8"}) {
    SCOPED_TRACE(kv_fmt);
    const bool fp8 = std::string(kv_fmt) == "fp8";
    std::mt19937 rng(11);
    // Values the format holds exactly, so the f32 cache sees what the format keeps.
    auto values = [&](size_t n) {
      std::vector<float> x = bf16_values(rng, n, 1.f);
      if (fp8)
        for (float& e : x) e = e4m3_to_f32(f32_to_e4m3(e));
      return x;
    };
    DenseKv kv(plan_kv(parse_policy(std::string("full,kv=") + kv_fmt), g, DeviceKind::cpu), cpu);
    DenseKv ref(plan_kv(parse_policy("full,kv=f32"), g, DeviceKind::cpu), cpu);
    auto append_both = [&](int l, int n) {
      const auto k = values(size_t(n) * W), v = values(size_t(n) * W);
      kv.append(l, k.data(), k.data(), v.data(), W, n);
      ref.append(l, k.data(), k.data(), v.data(), W, n);
    };
    auto attend_both = [&](int l, int n) {
      const auto q = bf16_values(rng, size_t(n) * QH * D, 1.f);
      std::vector<float> a(q.size()), b(q.size());
      kv.attend(l, q.data(), QH * D, n, scale, a.data());
      ref.attend(l, q.data(), QH * D, n, scale, b.data());
      EXPECT_LT(rel_l2(a, b), 1e-5) << "layer " << l << ", " << n << " queries";
    };
    for (int l = 0; l < L; ++l) append_both(l, 300);
    EXPECT_EQ(kv.element(), KvElt::f32);
    kv.start_decode();
    ref.start_decode();
    EXPECT_EQ(kv.element(), KvElt::bf16);
    EXPECT_EQ(ref.element(), KvElt::f32);
    for (int step = 0; step < 3; ++step) {
      kv.begin_step(1);
      ref.begin_step(1);
      for (int l = 0; l < L; ++l) {
        append_both(l, 1);
        attend_both(l, 1);
      }
    }
    for (int l = 0; l < L; ++l) {  // a continuation: 5 tokens at once, causal among themselves
      append_both(l, 5);
      attend_both(l, 5);
    }
    // Past the capacity: rows grow as bf16.
    for (int l = 0; l < L; ++l) {
      append_both(l, 400);
      attend_both(l, 1);
    }
  }
}


// Policy prefill=stream: the prompt's attention reads each layer's K/V
// decoded from the host tier (fetch_dense) instead of a dense copy of every
// layer. Prefilled in chunks of 64 it equals the same prompt prefilled in one
// chunk to f32 rounding (each query reads the same decoded values); against
// prefill=dense it differs only by the host precision (none for f32, and
// none for bf16 here since the inputs are bf16 values); and the decode steps
// that follow are those of the dense prefill, bit for bit (the index and host
// records are written the same way).
struct StreamCase {
  const char* policy;
  double tol_vs_dense = 0;  // rel-L2 of the prompt's attention outputs
  int head_dim = 64;
  bool decode_exact = true;
  bool first_rows_scale = false;  // nvfp4: the per-tensor scale comes from the first chunk's rows
};

class StreamedPrefill : public ::testing::TestWithParam<StreamCase> {};

TEST_P(StreamedPrefill, ChunkedEqualsOneShotAndDecodeFollowsTheDensePrefill) {
  const StreamCase c = GetParam();
  const int L = 2, D = c.head_dim, H = 2, QH = 4, W = H * D, n_prompt = 301, n_steps = 8;
  const KvGeometry g = geometry(L, QH, H, D);
  const std::string pol = c.policy;
  Device cpu(DeviceKind::cpu);
  TieredKv chunked(plan_kv(parse_policy(pol + ",prefill=stream"), g, DeviceKind::cpu), cpu);
  TieredKv one_shot(plan_kv(parse_policy(pol + ",prefill=stream"), g, DeviceKind::cpu), cpu);
  TieredKv dense(plan_kv(parse_policy(pol + ",prefill=dense"), g, DeviceKind::cpu), cpu);
  std::mt19937 rng(11);
  const float scale = 1.f / std::sqrt(float(D));
  std::vector<std::vector<float>> pre(L), post(L), v(L), q(L);
  for (int l = 0; l < L; ++l) {
    pre[size_t(l)] = bf16_values(rng, size_t(n_prompt) * W, 1.0f);
    for (int t = 0; t < n_prompt; t += 7)
      for (int d = 0; d < W; d += 5) pre[size_t(l)][size_t(t) * W + d] *= 4.f;
    post[size_t(l)] = pre[size_t(l)];
    std::vector<int64_t> pos(static_cast<size_t>(n_prompt));
    for (int i = 0; i < n_prompt; ++i) pos[size_t(i)] = i;
    g.apply_rope(post[size_t(l)].data(), pos.data(), n_prompt);
    for (float& x : post[size_t(l)]) x = bf16_to_f32(f32_to_bf16(x));
    v[size_t(l)] = bf16_values(rng, size_t(n_prompt) * W, 1.0f);
    q[size_t(l)] = bf16_values(rng, size_t(n_prompt) * QH * D, 1.0f);
  }
  const size_t out_n = size_t(n_prompt) * QH * D;
  std::vector<std::vector<float>> out_c(L, std::vector<float>(out_n)), out_o = out_c, out_d = out_c;
  auto prefill = [&](TieredKv& kv, int chunk, std::vector<std::vector<float>>& out) {
    for (int c0 = 0; c0 < n_prompt; c0 += chunk) {
      const int n = std::min(chunk, n_prompt - c0);
      for (int l = 0; l < L; ++l) {
        const size_t kv0 = size_t(c0) * W, q0 = size_t(c0) * QH * D;
        kv.append(l, pre[size_t(l)].data() + kv0, post[size_t(l)].data() + kv0, v[size_t(l)].data() + kv0, W, n);
        kv.attend(l, q[size_t(l)].data() + q0, QH * D, n, scale, out[size_t(l)].data() + q0);
      }
    }
  };
  prefill(chunked, 64, out_c);
  prefill(one_shot, n_prompt, out_o);
  prefill(dense, 64, out_d);
  EXPECT_TRUE(chunked.seq().prefill_streamed());
  EXPECT_FALSE(dense.seq().prefill_streamed());
  double worst = 0;
  for (int l = 0; l < L; ++l) {
    // f32 rounding only: the CPU's prefill attention takes a GEMM path whose
    // blocking depends on the queries per call.
    if (!c.first_rows_scale) {
      EXPECT_LT(rel_l2(out_c[size_t(l)], out_o[size_t(l)]), 1e-6) << c.policy << " layer " << l << ": chunked vs one-shot";
    }
    worst = std::max(worst, rel_l2(out_c[size_t(l)], out_d[size_t(l)]));
  }
  if (c.tol_vs_dense == 0) {
    EXPECT_EQ(worst, 0.0) << c.policy;
  } else {
    EXPECT_LT(worst, c.tol_vs_dense) << c.policy;
  }
  if (c.tol_vs_dense > 0) {
    EXPECT_GT(worst, 0.0) << c.policy << ": a quantized host tier reads other values";
  }
  // Decode after the prompt: the same records, the same steps.
  chunked.start_decode();
  dense.start_decode();
  double worst_decode = 0;
  for (int step = 0; step < n_steps; ++step)
    for (int l = 0; l < L; ++l) {
      const auto kp = bf16_values(rng, size_t(W), 1.0f), vv = bf16_values(rng, size_t(W), 1.0f),
                 qq = bf16_values(rng, size_t(QH) * D, 1.0f);
      if (l == 0) chunked.begin_step(1), dense.begin_step(1);
      chunked.append(l, kp.data(), kp.data(), vv.data(), W, 1);
      dense.append(l, kp.data(), kp.data(), vv.data(), W, 1);
      std::vector<float> a(size_t(QH) * D), b(size_t(QH) * D);
      chunked.attend(l, qq.data(), QH * D, 1, scale, a.data());
      dense.attend(l, qq.data(), QH * D, 1, scale, b.data());
      worst_decode = std::max(worst_decode, rel_l2(a, b));
    }
  if (c.decode_exact) EXPECT_EQ(worst_decode, 0.0) << c.policy;
  else EXPECT_LT(worst_decode, 1e-2) << c.policy;
}

INSTANTIATE_TEST_SUITE_P(
    Policies, StreamedPrefill,
    ::testing::Values(StreamCase{"yakv,budget=32,kv=f32"}, StreamCase{"yakv,budget=32,kv=bf16"},
                      StreamCase{"yakv,budget=32", 0.2}, StreamCase{"yakv,budget=32,kv=higgs4:g64", 0.2},
                      StreamCase{"yakv,budget=32,kv=fp8", 0.1},
                      StreamCase{"yakv,budget=32,kv=nvfp4", 0.25, 64, true, true},
                      // pre-RoPE keys, RoPE at the read: the dense copy holds the bf16-rounded rotated keys
                      StreamCase{"yakv,budget=32,keys_prerope=1,kv=f32", 5e-3},
                      StreamCase{"oracle,budget=32,kv=bf16"}, StreamCase{"landmarks,chunk=8,budget=40,kv=fp8", 0.1},
                      StreamCase{"shadowkv,rank=24,budget=32,outliers=4", 1e-2, 64, false},
                      StreamCase{"yakv,budget=32,kv=bf16", 0, 128}));

// A streamed prefill's layer copies exist only while the prompt attends: a
// sequence that is reserved and filled but not yet attending (the engine
// starts a batch's sequences before their prompts run) holds none, and
// start_decode releases them. Many reserved sequences then do not each
// hold a copy of a whole layer. A dense prefill's copies come with the
// prompt's first append, not with the reservation.
TEST(StreamedPrefill, LayerCopiesExistOnlyWhileThePromptAttends) {
  const int L = 2, D = 64, H = 2, QH = 4, W = H * D, n = 300;
  const KvGeometry g = geometry(L, QH, H, D);
  Device cpu(DeviceKind::cpu);
  const KvPlan plan = plan_kv(parse_policy("yakv,budget=32,prefill=stream"), g, DeviceKind::cpu);
  TieredKv a(plan, cpu), b(plan, cpu);
  std::mt19937 rng(5);
  const std::vector<float> k = bf16_values(rng, size_t(n) * W, 1.f), v = bf16_values(rng, size_t(n) * W, 1.f);
  const std::vector<float> q = bf16_values(rng, size_t(n) * QH * D, 1.f);
  std::vector<float> out(size_t(n) * QH * D);
  for (TieredKv* kv : {&a, &b}) {
    kv->reserve(n + 8);
    for (int l = 0; l < L; ++l) kv->append(l, k.data(), k.data(), v.data(), W, n);
    EXPECT_EQ(kv->seq().prefill_work_bytes(), 0) << "reserved and filled, not attending";
  }
  a.attend(0, q.data(), QH * D, n, 0.125f, out.data());
  EXPECT_GE(a.seq().prefill_work_bytes(), int64_t(2) * n * W * 4) << "one layer's K and V (f32 on the CPU)";
  EXPECT_LT(a.seq().prefill_work_bytes(), int64_t(2) * L * n * W * 4) << "not every layer's";
  EXPECT_EQ(b.seq().prefill_work_bytes(), 0);
  a.attend(1, q.data(), QH * D, n, 0.125f, out.data());
  a.start_decode();
  EXPECT_EQ(a.seq().prefill_work_bytes(), 0);
  // The dense prefill holds every layer's copy from the prompt's first append on.
  TieredKv d(plan_kv(parse_policy("yakv,budget=32,prefill=dense"), g, DeviceKind::cpu), cpu);
  d.reserve(n + 8);
  EXPECT_EQ(d.seq().prefill_work_bytes(), 0) << "reserved, the prompt not started";
  d.append(0, k.data(), k.data(), v.data(), W, n);
  EXPECT_GE(d.seq().prefill_work_bytes(), int64_t(2) * L * n * W * 4);
  d.attend(0, q.data(), QH * D, n, 0.125f, out.data());
  d.append(1, k.data(), k.data(), v.data(), W, n);
  d.attend(1, q.data(), QH * D, n, 0.125f, out.data());
  d.start_decode();
  EXPECT_EQ(d.seq().prefill_work_bytes(), 0);
}

// prefill=auto streams on the GPU when every layer's copy and the margin
// (max(1 GiB, 10 % of the device)) do not fit in free memory; dense on the CPU.
TEST(PrefillChoice, AutoStreamsWhenTheDenseCopyDoesNotFit) {
  const int64_t G = int64_t(1) << 30, total = 100 * G;  // margin 10 GiB
  EXPECT_FALSE(choose_prefill_stream(PrefillMode::auto_, true, 40 * G, 50 * G, total));  // 40 + 10 <= 50
  EXPECT_TRUE(choose_prefill_stream(PrefillMode::auto_, true, 41 * G, 50 * G, total));
  EXPECT_FALSE(choose_prefill_stream(PrefillMode::dense, true, 400 * G, 50 * G, total));  // asked for
  EXPECT_TRUE(choose_prefill_stream(PrefillMode::stream, false, G, 0, 0));
  EXPECT_FALSE(choose_prefill_stream(PrefillMode::auto_, false, 400 * G, 0, 0));  // the CPU: dense
}

// DecodeGroups (the GPU batch's arrangement, run here on the CPU): sequences
// of one tiered policy side by side, stepping through one DecodeBatch; each
// row's output equals its twin's stepped alone (within float rounding: the
// CPU's attention splits depend on the rows); a group whose members change
// rebuilds its tables.
// reselect=3: each sequence keeps its selection through the steps it sits
// out and the rows it moves to.
class DecodeGroupsPolicy : public ::testing::TestWithParam<const char*> {};

TEST_P(DecodeGroupsPolicy, APolicysSequencesStepTogetherAsEachAlone) {
  const int L = 2, D = 64, H = 2, QH = 4, W = H * D, n_steps = 6;
  const KvGeometry g = geometry(L, QH, H, D);
  Device cpu(DeviceKind::cpu);
  // A budget of 300+ tokens: a row's attention takes more than one split alone.
  const std::string y = GetParam();
  const std::vector<std::string> pols{y, "full", y, "yakv,kv=fp8", y};
  const int n = int(pols.size());
  std::vector<std::unique_ptr<KvCache>> grouped, alone;
  std::mt19937 rng(11);
  for (int i = 0; i < n; ++i) {
    const KvPlan plan = plan_kv(parse_policy(pols[size_t(i)]), g, DeviceKind::cpu);
    grouped.push_back(make_kv_cache(plan, cpu));
    alone.push_back(make_kv_cache(plan, cpu));
    const int len = 650 + 37 * i;
    grouped.back()->reserve(len + n_steps);
    alone.back()->reserve(len + n_steps);
    for (int l = 0; l < L; ++l) {
      const auto k = bf16_values(rng, size_t(len) * W, 1.f), v = bf16_values(rng, size_t(len) * W, 1.f);
      grouped.back()->append(l, k.data(), k.data(), v.data(), W, len);
      alone.back()->append(l, k.data(), k.data(), v.data(), W, len);
    }
    grouped.back()->start_decode();
    alone.back()->start_decode();
  }
  std::vector<KvCache*> kvs;
  for (auto& c : grouped) kvs.push_back(c.get());
  DecodeGroups groups(cpu);
  groups.arrange(kvs.data(), n);
  // full first (no group); the three yakv sequences side by side, in the
  // caller's order, as one group; yakv,kv=fp8 alone.
  EXPECT_EQ(groups.order()[0], 1);
  ASSERT_EQ(groups.groups().size(), 1u);
  const DecodeGroups::Group& g0 = groups.groups()[0];
  ASSERT_EQ(g0.n, 3);
  EXPECT_EQ(std::vector<int>(groups.order().begin() + g0.first, groups.order().begin() + g0.first + 3),
            (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(groups.starting_at(g0.first), &g0);
  EXPECT_EQ(groups.starting_at(g0.first + 1), nullptr);
  const float scale = 0.125f;
  uint64_t builds = 0;
  for (int step = 0; step < n_steps; ++step) {
    // Steps 3 and 4 without the second yakv sequence: its group shrinks, then it joins again.
    std::vector<int> active;
    for (int i = 0; i < n; ++i)
      if (i != 2 || step < 3 || step > 4) active.push_back(i);
    const int m = int(active.size());
    std::vector<KvCache*> batch;
    for (int i : active) batch.push_back(kvs[size_t(i)]);
    groups.arrange(batch.data(), m);
    ASSERT_EQ(groups.groups().size(), 1u);
    EXPECT_EQ(groups.groups()[0].n, m - 2);
    std::vector<int> seq;  // row j → sequence index
    std::vector<KvCache*> rows;
    for (int j : groups.order()) {
      seq.push_back(active[size_t(j)]);
      rows.push_back(batch[size_t(j)]);
    }
    groups.begin_step(rows.data(), m);
    if (step == 3) {
      EXPECT_GT(groups.groups()[0].batch->builds(), builds) << "a member left: tables rebuilt";
    }
    builds = groups.groups()[0].batch->builds();
    for (int i : active) alone[size_t(i)]->begin_step(1);
    for (int l = 0; l < L; ++l) {
      const auto k = bf16_values(rng, size_t(m) * W, 1.f), v = bf16_values(rng, size_t(m) * W, 1.f);
      const auto q = bf16_values(rng, size_t(m) * QH * D, 1.f);  // row j: sequence seq[j]
      std::vector<float> out(size_t(m) * QH * D), want(out.size());
      for (int j = 0; j < m;) {
        const size_t kv_at = size_t(j) * W, q_at = size_t(j) * QH * D;
        if (const DecodeGroups::Group* gr = groups.starting_at(j)) {
          gr->batch->append(l, &k[kv_at], &k[kv_at], &v[kv_at], W);
          gr->batch->attend(l, &q[q_at], scale, &out[q_at]);
          j += gr->n;
        } else {
          rows[size_t(j)]->append(l, &k[kv_at], &k[kv_at], &v[kv_at], W, 1);
          rows[size_t(j)]->attend(l, &q[q_at], QH * D, 1, scale, &out[q_at]);
          ++j;
        }
      }
      for (int j = 0; j < m; ++j) {
        KvCache& a = *alone[size_t(seq[size_t(j)])];
        const size_t kv_at = size_t(j) * W, q_at = size_t(j) * QH * D;
        a.append(l, &k[kv_at], &k[kv_at], &v[kv_at], W, 1);
        a.attend(l, &q[q_at], QH * D, 1, scale, &want[q_at]);
      }
      ASSERT_LT(rel_l2(out, want), 1e-5) << "step " << step << " layer " << l;
    }
  }
  for (int i = 0; i < n; ++i) EXPECT_EQ(grouped[size_t(i)]->n_tokens(0), alone[size_t(i)]->n_tokens(0));
}

INSTANTIATE_TEST_SUITE_P(Policies, DecodeGroupsPolicy,
                         ::testing::Values("yakv,budget=0.5", "yakv,budget=0.5,reselect=3"));

}  // namespace
}  // namespace kvtier
