// Attention statistics of the analysis store: entropy and top-k mass on
// hand-computed distributions, and the store measuring them with no policy.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/status.h"
#include "kv/analysis.h"
#include "backend/device.h"

namespace kvtier {
namespace {

KvGeometry one_head(int head_dim) {
  KvGeometry g;
  g.n_layer = 1;
  g.n_head = 1;
  g.n_kv_head = 1;
  g.head_dim = head_dim;
  return g;
}

TEST(AttentionStats, HandComputedDistribution) {
  // head_dim 1, q = 1, scale 1: the scores are the keys; p ∝ (1, 1, 2, 4).
  const KvGeometry g = one_head(1);
  const float q = 1.0f;
  const float k[] = {0.0f, 0.0f, float(std::log(2.0)), float(std::log(4.0))};
  AttentionStats s;
  accumulate_attention(g, &q, 1.0f, k, 4, 0.5, &s);  // top 2 of 4
  const double p[] = {1.0 / 8, 1.0 / 8, 2.0 / 8, 4.0 / 8};
  double ent = 0;
  for (double x : p) ent -= x * std::log(x);
  EXPECT_EQ(s.n, 1);
  EXPECT_NEAR(s.mean_entropy(), ent, 1e-6);
  EXPECT_NEAR(s.mean_norm_entropy(), ent / std::log(4.0), 1e-6);
  EXPECT_NEAR(s.mean_top_mass(), 0.75, 1e-6);
  accumulate_attention(g, &q, 1.0f, k, 4, 0.01, &s);  // at least one token: the largest
  EXPECT_EQ(s.n, 2);
  EXPECT_NEAR(s.top_mass, 0.75 + 0.5, 1e-6);
  EXPECT_THROW(accumulate_attention(g, &q, 1.0f, k, 4, 0.0, &s), Error);
}

TEST(AttentionStats, UniformAndPeakedExtremes) {
  const KvGeometry g = one_head(8);
  const int64_t n = 1000;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> k(size_t(n) * 8);
  for (float& x : k) x = nd(rng);
  const std::vector<float> zero(8, 0.0f);
  AttentionStats u;
  accumulate_attention(g, zero.data(), 1.0f, k.data(), n, 0.03, &u);  // q = 0: uniform
  EXPECT_NEAR(u.mean_entropy(), std::log(double(n)), 1e-6);
  EXPECT_NEAR(u.mean_norm_entropy(), 1.0, 1e-6);
  EXPECT_NEAR(u.mean_top_mass(), 30.0 / 1000.0, 1e-6);
  // A query aligned with token 123's key, scaled up: all mass on it.
  std::vector<float> q(k.begin() + 123 * 8, k.begin() + 124 * 8);
  for (float& x : q) x *= 200.0f;
  AttentionStats peaked;
  accumulate_attention(g, q.data(), 1.0f, k.data(), n, 0.03, &peaked);
  EXPECT_LT(peaked.mean_norm_entropy(), 0.01);
  EXPECT_GT(peaked.mean_top_mass(), 0.999);
}

TEST(AttentionStats, StoreWithoutPoliciesMeasuresEveryLayerAndHead) {
  KvGeometry g;
  g.n_layer = 2;
  g.n_head = 4;
  g.n_kv_head = 2;
  g.head_dim = 16;
  Device cpu(DeviceKind::cpu);
  AnalysisKv an("", g, cpu);
  AnalysisKv* a = &an;
  EXPECT_TRUE(a->results().empty());
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  const int n_prompt = 64, width = g.n_kv_head * g.head_dim, qwidth = g.n_head * g.head_dim;
  std::vector<float> k(size_t(n_prompt) * width), v(k.size());
  std::vector<float> q(static_cast<size_t>(qwidth)), out(q.size());
  for (float& x : k) x = nd(rng);
  for (float& x : v) x = nd(rng);
  an.reserve(n_prompt + 3);
  for (int l = 0; l < g.n_layer; ++l) an.append(l, k.data(), k.data(), v.data(), width, n_prompt);
  an.start_decode();
  for (int step = 0; step < 3; ++step) {
    an.begin_step(1);
    for (int l = 0; l < g.n_layer; ++l) {
      an.append(l, k.data(), k.data(), v.data(), width, 1);
      for (float& x : q) x = nd(rng);
      an.attend(l, q.data(), qwidth, 1, 0.25f, out.data());
    }
  }
  ASSERT_EQ(a->attention().size(), size_t(g.n_layer * g.n_head));
  for (const AttentionStats& s : a->attention()) {
    EXPECT_EQ(s.n, 3);
    EXPECT_GT(s.mean_norm_entropy(), 0.5);  // random keys and queries: diffuse
    EXPECT_LE(s.mean_norm_entropy(), 1.0 + 1e-9);
    EXPECT_GE(s.mean_top_mass(), 2.0 / 67.0 - 1e-9);  // ⌈0.03 · n⌉ = 2 tokens hold at least 2/n
  }
}

}  // namespace
}  // namespace kvtier
