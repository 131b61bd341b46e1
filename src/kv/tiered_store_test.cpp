#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "core/status.h"
#include "kv/analysis.h"
#include "kv/key_index.h"
#include "kv/kv_store.h"
#include "kv/policy.h"
#include "kv/tiered_kv.h"
#include "kv/tiered_store.h"
#include "ops/attention/attention.h"

namespace kvtier {
namespace {

// Neox-style RoPE (rotates (i, i + D/2)), theta 10000: the test model's RoPE.
void test_rope(float* k, const int64_t* pos, int64_t n, int n_kv_head, int head_dim) {
  const int half = head_dim / 2;
  for (int64_t i = 0; i < n; ++i)
    for (int h = 0; h < n_kv_head; ++h) {
      float* x = k + (i * n_kv_head + h) * head_dim;
      for (int j = 0; j < half; ++j) {
        const double a = double(pos[i]) * std::pow(10000.0, -2.0 * j / head_dim);
        const double c = std::cos(a), s = std::sin(a);
        const double x0 = x[j], x1 = x[j + half];
        x[j] = float(x0 * c - x1 * s);
        x[j + half] = float(x0 * s + x1 * c);
      }
    }
}

KvGeometry small_geometry() {
  KvGeometry g;
  g.n_layer = 2;
  g.n_head = 4;
  g.n_kv_head = 2;
  g.head_dim = 32;
  g.apply_rope = [g](float* k, const int64_t* pos, int64_t n) {
    test_rope(k, pos, n, g.n_kv_head, g.head_dim);
  };
  for (int j = 0; j < g.head_dim / 2; ++j) g.rope_inv_freq.push_back(float(std::pow(10000.0, -2.0 * j / g.head_dim)));
  return g;
}

// Synthetic sequence: pre-RoPE keys with a low-rank structure plus noise (so
// that the SVD has something to find), a few "needle" keys aligned with the
// queries, values random.
struct Synthetic {
  KvGeometry g;
  int64_t n = 0;
  std::vector<float> k_pre, k, v, q;  // [n, H, D] / [n, QH, D]
  Synthetic(const KvGeometry& geo, int64_t n_tok, uint64_t seed) : g(geo), n(n_tok) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int H = g.n_kv_head, D = g.head_dim, W = H * D;
    std::vector<float> basis(8 * W);
    for (float& x : basis) x = nd(rng);
    k_pre.resize(n * W);
    for (int64_t t = 0; t < n; ++t)
      for (int d = 0; d < W; ++d) {
        float s = 0.3f * nd(rng);
        for (int r = 0; r < 8; ++r) s += basis[r * W + d] * (0.5f * nd(rng)) * 0.3f;
        k_pre[t * W + d] = s;
      }
    k = k_pre;
    std::vector<int64_t> pos(n);
    std::iota(pos.begin(), pos.end(), 0);
    g.apply_rope(k.data(), pos.data(), n);
    v.resize(n * W);
    for (float& x : v) x = nd(rng);
    q.resize(n * g.n_head * D);
    for (float& x : q) x = nd(rng);
  }
};

// Runs a sequence through a store: prefill n_prompt in chunks of 37 tokens,
// then decode one token at a time. Returns the outputs of the decode steps,
// per layer: [n_decode, n_head, head_dim].
std::vector<std::vector<float>> run(KvStore& store, const Synthetic& s, int64_t n_prompt) {
  const KvGeometry& g = s.g;
  const int W = g.n_kv_head * g.head_dim, QW = g.n_head * g.head_dim;
  const float scale = 1.0f / std::sqrt(float(g.head_dim));
  std::vector<std::vector<float>> outs(g.n_layer);
  std::vector<float> out;
  for (int64_t t = 0; t < s.n;) {
    const bool prefill = t < n_prompt;
    const int64_t n_tok = prefill ? std::min<int64_t>(37, n_prompt - t) : 1;
    if (!prefill && t == n_prompt) store.set_phase(KvPhase::decode);
    for (int l = 0; l < g.n_layer; ++l) {
      store.append(l, s.k_pre.data() + t * W, s.k.data() + t * W, s.v.data() + t * W, int(n_tok));
      out.assign(n_tok * QW, 0.0f);
      store.attend(l, s.q.data() + t * QW, int(n_tok), scale, out.data());
      if (!prefill) outs[l].insert(outs[l].end(), out.begin(), out.end());
    }
    t += n_tok;
  }
  return outs;
}

// The same through a KvCache (the engine's interface; kv_cache.h).
std::vector<std::vector<float>> run(KvCache& store, const Synthetic& s, int64_t n_prompt) {
  const KvGeometry& g = s.g;
  const int W = g.n_kv_head * g.head_dim, QW = g.n_head * g.head_dim;
  const float scale = 1.0f / std::sqrt(float(g.head_dim));
  std::vector<std::vector<float>> outs(g.n_layer);
  std::vector<float> out;
  for (int64_t t = 0; t < s.n;) {
    const bool prefill = t < n_prompt;
    const int64_t n_tok = prefill ? std::min<int64_t>(37, n_prompt - t) : 1;
    if (!prefill && t == n_prompt) store.start_decode();
    store.begin_step(int(n_tok));
    for (int l = 0; l < g.n_layer; ++l) {
      store.append(l, s.k_pre.data() + t * W, s.k.data() + t * W, s.v.data() + t * W, W, int(n_tok));
      out.assign(n_tok * QW, 0.0f);
      store.attend(l, s.q.data() + t * QW, QW, int(n_tok), scale, out.data());
      if (!prefill) outs[l].insert(outs[l].end(), out.begin(), out.end());
    }
    t += n_tok;
  }
  return outs;
}

// Dense reference: query t sees tokens [0, t].
std::vector<std::vector<float>> dense_reference(const Synthetic& s, int64_t n_prompt) {
  const KvGeometry& g = s.g;
  const int QW = g.n_head * g.head_dim;
  AttentionParams ap{g.n_head, g.n_kv_head, g.head_dim, 1.0f / std::sqrt(float(g.head_dim))};
  std::vector<float> all(s.n * QW);
  attention_causal_ref(ap, s.q.data(), int(s.n), s.k.data(), s.v.data(), s.n, all.data());
  std::vector<std::vector<float>> outs(g.n_layer);
  for (int l = 0; l < g.n_layer; ++l)
    outs[l].assign(all.begin() + n_prompt * QW, all.end());
  return outs;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    e += double(a[i] - b[i]) * (a[i] - b[i]);
    n += double(b[i]) * b[i];
  }
  return std::sqrt(e / n);
}

TEST(TieredStore, BudgetAboveContextEqualsDenseAttention) {
  const KvGeometry g = small_geometry();
  Synthetic s(g, 260, 1);
  const int64_t n_prompt = 200;
  auto ref = dense_reference(s, n_prompt);
  // Every policy with an f32 host store and a budget ≥ the context attends to
  // every token exactly (shadowkv at full rank rebuilds keys exactly).
  for (const char* pol :
       {"full,kv=f32", "oracle,kv=f32,budget=100000", "yakv,kv=f32,budget=100000",
        "yakv,kv=f32,budget=100000,gqa=mean,sink=4,local=0",
        "landmarks,kv=f32,chunk=8,budget=100000,local=5",
        "yakv,kv=f32,lm=residual,meta=higgs4,res=1bit,m=8,budget=100000",
        "yakv,kv=f32,keys_prerope=1,budget=100000",
        "shadowkv,kv=f32,rank=full,budget=100000", "shadowkv,kv=f32,rank=full,budget=0.9999"}) {
    auto store = make_kv_store(pol, g);
    auto got = run(*store, s, n_prompt);
    for (int l = 0; l < g.n_layer; ++l) EXPECT_LE(rel_l2(got[l], ref[l]), 1e-5) << pol;
    EXPECT_EQ(store->n_tokens(0), s.n) << pol;
  }
}

TEST(TieredStore, LossyPoliciesStayCloseToDense) {
  const KvGeometry g = small_geometry();
  Synthetic s(g, 260, 2);
  auto ref = dense_reference(s, 200);
  // Budget ≥ context: only the storage precision differs from dense.
  for (auto [pol, tol] : std::vector<std::pair<const char*, double>>{
           {"full", 0.01}, {"yakv,kv=bf16,budget=100000", 0.01},
           {"yakv,kv=fp8,budget=100000", 0.08}, {"yakv,budget=100000", 0.2}}) {
    auto store = make_kv_store(pol, g);
    auto got = run(*store, s, 200);
    for (int l = 0; l < g.n_layer; ++l) {
      double e = rel_l2(got[l], ref[l]);
      EXPECT_LE(e, tol) << pol;
      EXPECT_GT(e, 0.0) << pol;  // the storage really is lossy
    }
  }
}

// The oracle's top-k, computed independently: exact scores, GQA-aggregated,
// sorted, the best `budget` outside sinks/window, then the union.
std::vector<std::set<int64_t>> independent_topk(const KvGeometry& g, const float* q,
                                                const float* k, int64_t n, int64_t budget,
                                                int sink, int local, bool mean_gqa) {
  const int H = g.n_kv_head, D = g.head_dim, group = g.n_head / H;
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<std::set<int64_t>> sel(H);
  for (int kv = 0; kv < H; ++kv) {
    std::vector<double> agg(n, mean_gqa ? 0.0 : -1e300);
    for (int j = 0; j < group; ++j) {
      const int h = kv * group + j;
      std::vector<double> sc(n);
      for (int64_t t = 0; t < n; ++t) {
        double d = 0;
        for (int i = 0; i < D; ++i) d += double(q[h * D + i]) * k[(t * H + kv) * D + i];
        sc[t] = d * scale;
      }
      double mx = *std::max_element(sc.begin(), sc.end()), z = 0;
      for (double x : sc) z += std::exp(x - mx);
      for (int64_t t = 0; t < n; ++t)
        agg[t] = mean_gqa ? agg[t] + sc[t] / group : std::max(agg[t], std::exp(sc[t] - mx) / z);
    }
    std::vector<int64_t> cand;
    for (int64_t t = 0; t < n; ++t) {
      if (t < sink || t >= n - local) sel[kv].insert(t);
      else cand.push_back(t);
    }
    std::sort(cand.begin(), cand.end(), [&](int64_t a, int64_t b) { return agg[a] > agg[b]; });
    for (int64_t i = 0; i < std::min<int64_t>(budget, cand.size()); ++i) sel[kv].insert(cand[i]);
  }
  return sel;
}

void check_selection_shape(const Selection& sel, int n_kv_head, int64_t n, int sink, int local) {
  ASSERT_EQ(int(sel.indptr.size()), n_kv_head + 1);
  for (int h = 0; h < n_kv_head; ++h) {
    std::vector<int64_t> idx(sel.indices.begin() + sel.indptr[h],
                             sel.indices.begin() + sel.indptr[h + 1]);
    EXPECT_TRUE(std::is_sorted(idx.begin(), idx.end()));
    EXPECT_EQ(std::adjacent_find(idx.begin(), idx.end()), idx.end()) << "duplicate";
    for (int64_t t : idx) EXPECT_TRUE(t >= 0 && t < n);
    std::set<int64_t> s(idx.begin(), idx.end());
    for (int64_t t = 0; t < std::min<int64_t>(sink, n); ++t) EXPECT_TRUE(s.count(t)) << "sink " << t;
    for (int64_t t = std::max<int64_t>(0, n - local); t < n; ++t)
      EXPECT_TRUE(s.count(t)) << "window " << t;
  }
}

TEST(TieredStore, OracleSelectionIsTheExactTopK) {
  const KvGeometry g = small_geometry();
  Synthetic s(g, 300, 3);
  for (bool mean : {false, true}) {
    PolicyConfig p = parse_policy(mean ? "oracle,kv=f32,budget=17,sink=3,local=5,gqa=mean"
                                       : "oracle,kv=f32,budget=17,sink=3,local=5");
    TieredKvStore store(p, g);
    run(store, s, 250);
    const int W = g.n_kv_head * g.head_dim, QW = g.n_head * g.head_dim;
    std::vector<float> out(QW);
    for (int64_t t : {100, 250, 299}) {
      Selection sel;
      store.attend_one(1, s.q.data() + t * QW, 1.0f / std::sqrt(32.0f), t + 1, out.data(), &sel);
      auto want = independent_topk(g, s.q.data() + t * QW, s.k.data(), t + 1, 17, 3, 5, mean);
      for (int h = 0; h < g.n_kv_head; ++h) {
        std::set<int64_t> got(sel.indices.begin() + sel.indptr[h],
                              sel.indices.begin() + sel.indptr[h + 1]);
        EXPECT_EQ(got, want[h]) << "t=" << t << " head " << h << " mean=" << mean;
        EXPECT_EQ(got.size(), 3u + 5u + 17u);
      }
      (void)W;
    }
  }
}

TEST(TieredStore, SelectionsHoldSinksAndWindowSortedUnique) {
  const KvGeometry g = small_geometry();
  Synthetic s(g, 300, 4);
  for (const char* pol : {"yakv,sink=4,local=16,budget=20", "landmarks,chunk=8,sink=2,local=7",
                          "shadowkv,budget=40,outliers=3,sink=1", "oracle,sink=5,local=3",
                          "yakv,lm=residual,budget=0.1,sink=2"}) {
    PolicyConfig p = parse_policy(pol);
    TieredKvStore store(p, g);
    run(store, s, 240);
    const int QW = g.n_head * g.head_dim;
    std::vector<float> out(QW);
    for (int64_t t : {240, 271, 299}) {
      Selection sel;
      store.attend_one(0, s.q.data() + t * QW, 0.17f, t + 1, out.data(), &sel);
      check_selection_shape(sel, g.n_kv_head, t + 1, p.sink, p.local);
      for (float x : out) ASSERT_TRUE(std::isfinite(x)) << pol;
    }
  }
}

TEST(TieredStore, GeneratedTokensAreNeverDropped) {
  const KvGeometry g = small_geometry();
  Synthetic s(g, 100 + 300, 5);
  for (const char* pol : {"yakv", "shadowkv,local=8", "landmarks,chunk=8,local=4",
                          "yakv,lm=residual,m=8,local=2"}) {
    PolicyConfig p = parse_policy(pol);
    p.budget = 100000;  // every indexed token is then selectable and selected
    TieredKvStore store(p, g);
    run(store, s, 100);
    EXPECT_EQ(store.n_tokens(0), 400) << pol;
    EXPECT_EQ(store.host().n_tokens(1), 400) << pol;
    const int QW = g.n_head * g.head_dim;
    std::vector<float> out(QW);
    Selection sel;
    store.attend_one(1, s.q.data() + 399 * QW, 0.17f, 400, out.data(), &sel);
    for (int h = 0; h < g.n_kv_head; ++h)
      EXPECT_EQ(sel.indptr[h + 1] - sel.indptr[h], 400) << pol;  // every token reachable
  }
}

TEST(TieredStore, ReuseCountsTheHostRowsThePreviousQueryFetched) {
  const KvGeometry g = small_geometry();
  Synthetic s(g, 300, 8);
  TieredKvStore store(parse_policy("yakv,sink=2,local=8,budget=24"), g);
  run(store, s, 240);  // 60 decode steps per layer
  const TieredStats a = store.stats();
  EXPECT_GT(a.n_host_head_rows, 0);
  EXPECT_LE(a.n_host_reused, a.n_host_head_rows);
  // The same query twice: the second fetches exactly the rows of the first.
  const int QW = g.n_head * g.head_dim;
  std::vector<float> out(QW);
  store.attend_one(0, s.q.data() + 17 * QW, 0.17f, 300, out.data(), nullptr);
  const TieredStats b = store.stats();
  store.attend_one(0, s.q.data() + 17 * QW, 0.17f, 300, out.data(), nullptr);
  const TieredStats c = store.stats();
  const int64_t rows = c.n_host_head_rows - b.n_host_head_rows;
  EXPECT_EQ(rows, b.n_host_head_rows - a.n_host_head_rows);
  EXPECT_EQ(c.n_host_reused - b.n_host_reused, rows);
  // A different query (token 250's) shares only part of them.
  store.attend_one(0, s.q.data() + 250 * QW, 0.17f, 300, out.data(), nullptr);
  const TieredStats d = store.stats();
  EXPECT_LT(d.n_host_reused - c.n_host_reused, d.n_host_head_rows - c.n_host_head_rows);
}

TEST(TieredStore, DistinctRateCountsTokensSharedByTheHeads) {
  const KvGeometry g = small_geometry();
  Synthetic s(g, 300, 9);
  // Every head selects every token: each token is read by all heads.
  PolicyConfig all = parse_policy("yakv,local=4");
  all.budget = 100000;
  TieredKvStore everything(all, g);
  run(everything, s, 4);
  EXPECT_DOUBLE_EQ(everything.stats().distinct_rate(), 1.0 / g.n_kv_head);
  // A small budget: the heads pick partly different tokens.
  TieredKvStore few(parse_policy("yakv,local=4,budget=8"), g);
  run(few, s, 40);
  EXPECT_GT(few.stats().distinct_rate(), 1.0 / g.n_kv_head);
  EXPECT_LE(few.stats().distinct_rate(), 1.0);
}

TEST(TieredKv, MemoryMatchesFootprint) {
  const KvGeometry g = small_geometry();
  Synthetic s(g, 256, 6);
  Device cpu(DeviceKind::cpu);
  for (const char* pol : {"yakv", "yakv,kv=fp8", "oracle", "landmarks,chunk=8,lm=int4", "yakv,kv=nvfp4",
                          "yakv,lm=residual,m=8", "shadowkv,rank=16,outliers=2"}) {
    const KvPlan plan = plan_kv(parse_policy(pol), g, DeviceKind::cpu);
    TieredKv kv(plan, cpu);
    run(kv, s, 256);  // prompt only: 256 tokens, a multiple of every chunk
    const KvMemory m = kv.memory();
    const KvFootprint f = plan_footprint(plan, 256);
    EXPECT_EQ(m.host_bytes, f.host_bytes) << pol;
    EXPECT_EQ(m.gpu_bytes, f.gpu_bytes) << pol;
  }
}

// Both stores refuse a geometry they cannot hold, with one message.
TEST(KvStore, InvalidGeometryIsRefusedByEveryStore) {
  for (const char* pol : {"full", "yakv"})
    for (auto [n_head, n_kv_head] : {std::pair{6, 4}, std::pair{0, 1}, std::pair{4, 0}}) {
      KvGeometry g = small_geometry();
      g.n_head = n_head;
      g.n_kv_head = n_kv_head;
      try {
        make_kv_store(pol, g);
        ADD_FAILURE() << pol << ": " << n_head << "/" << n_kv_head << " accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("is not valid"), std::string::npos) << e.what();
      }
    }
}

// A sequence's index planes, and its store where it is not in the pinned
// pool (always on the CPU), are carved from one allocation each (cudaMalloc
// rounds every allocation to 2 MiB pages): layer l + 1's buffers follow
// layer l's, and a growth keeps the records.
TEST(TieredKv, EachSequenceHoldsItsIndexAndStoreInOneAllocation) {
  const KvGeometry g = small_geometry();
  Device cpu(DeviceKind::cpu);
  TieredKv kv(plan_kv(parse_policy("yakv,lm=residual,m=8"), g, DeviceKind::cpu), cpu);
  auto check = [&] {
    TieredSeq& q = kv.seq();
    const auto* p0 = q.layer(0).plane0.data<uint8_t>();
    const auto* h0 = q.layer(0).host.data<uint8_t>();
    const int64_t p0_bytes = q.layer(0).plane0.bytes(), p1_bytes = q.layer(0).plane1.bytes();
    const int64_t h_bytes = q.layer(0).host.bytes();
    ASSERT_GT(p1_bytes, 0);
    for (int l = 1; l < g.n_layer; ++l) {
      const int64_t idx = (p0_bytes + 255) / 256 * 256 + (p1_bytes + 255) / 256 * 256;
      EXPECT_EQ(q.layer(l).plane0.data<uint8_t>(), p0 + l * idx) << l;
      EXPECT_EQ(q.layer(l).plane1.data<uint8_t>(), p0 + l * idx + (p0_bytes + 255) / 256 * 256) << l;
      EXPECT_EQ(q.layer(l).host.data<uint8_t>(), h0 + l * ((h_bytes + 255) / 256 * 256)) << l;
    }
  };
  kv.reserve(300);
  check();
  Synthetic s(g, 1200, 3);
  const auto grown = run(kv, s, 1000);  // grows past the reservation (twice)
  check();
  // The records moved with the growths: the decode steps equal those of a
  // sequence that never grew.
  TieredKv whole(plan_kv(parse_policy("yakv,lm=residual,m=8"), g, DeviceKind::cpu), cpu);
  whole.reserve(1200);
  const auto want = run(whole, s, 1000);
  for (int l = 0; l < g.n_layer; ++l) EXPECT_EQ(grown[size_t(l)], want[size_t(l)]) << l;
}

TEST(KeySvd, ReconstructionErrorFallsWithRankAndVanishesAtFullRank) {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd;
  const int64_t n = 300;
  const int w = 48;
  std::vector<float> k(n * w);
  for (int64_t t = 0; t < n; ++t)
    for (int d = 0; d < w; ++d) k[t * w + d] = nd(rng) * float(std::exp(-0.1 * d));
  std::vector<int64_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  double prev = 1e30;
  for (int r : {1, 4, 12, 24, 40, 48}) {
    KeySvd s = key_svd(k.data(), n, w, r);
    std::vector<float> rec(n * w);
    key_svd_reconstruct(s, all.data(), n, rec.data());
    double e = rel_l2(rec, k);
    EXPECT_LT(e, prev) << "rank " << r;
    prev = e;
    if (r == w) {
      EXPECT_LT(e, 1e-5);
    }
  }
  EXPECT_THROW(key_svd(k.data(), n, w, w + 1), Error);
}

TEST(HostStore, PreRopeKeysComeBackRotated) {
  const KvGeometry g = small_geometry();
  Synthetic s(g, 50, 8);
  HostStore h(1, g.n_kv_head, g.head_dim, "f32", true, g.apply_rope);
  h.append(0, s.k_pre.data(), s.k.data(), s.v.data(), 50);
  std::vector<int64_t> tok = {0, 7, 8, 9, 49};
  const int W = g.n_kv_head * g.head_dim;
  std::vector<float> k(tok.size() * W), v(tok.size() * W);
  h.fetch(0, tok.data(), int64_t(tok.size()), k.data(), v.data());
  for (size_t i = 0; i < tok.size(); ++i)
    for (int d = 0; d < W; ++d) {
      EXPECT_NEAR(k[i * W + d], s.k[tok[i] * W + d], 1e-5);
      EXPECT_EQ(v[i * W + d], s.v[tok[i] * W + d]);
    }
  KvGeometry no_rope = g;
  no_rope.apply_rope = nullptr;
  EXPECT_THROW(make_kv_store("yakv,keys_prerope=1", no_rope), Error);
  EXPECT_THROW(make_kv_store("shadowkv", no_rope), Error);
}

TEST(Analysis, OracleScoresPerfectAndBudgetAboveContextIsExact) {
  const KvGeometry g = small_geometry();
  Synthetic s(g, 230, 9);
  Device cpu(DeviceKind::cpu);
  AnalysisKv a("oracle,kv=f32,budget=20|yakv,budget=20|yakv,kv=f32,budget=100000", g, cpu);
  run(a, s, 200);
  ASSERT_EQ(a.results().size(), 3u);
  EXPECT_EQ(a.n_decode_queries(), 30);
  HeadMetrics o = a.results()[0].total();
  EXPECT_EQ(o.n, 30 * g.n_layer * g.n_head);
  EXPECT_DOUBLE_EQ(o.mean_token_recall(), 1.0);
  EXPECT_NEAR(o.mean_mass_recall(), 1.0, 1e-9);
  EXPECT_GT(o.mean_rel_error(), 0.0);  // 20 of ~200 tokens: not dense
  HeadMetrics y = a.results()[1].total();
  EXPECT_LT(y.mean_token_recall(), 1.0);
  EXPECT_GT(y.mean_token_recall(), 0.2);
  HeadMetrics full = a.results()[2].total();
  EXPECT_DOUBLE_EQ(full.mean_token_recall(), 1.0);
  EXPECT_LT(full.mean_rel_error(), 1e-5);
  EXPECT_THROW(AnalysisKv("full", g, cpu), Error);
  EXPECT_THROW(AnalysisKv("yakv||oracle", g, cpu), Error);
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

// Pearson correlation of an index's scores with exact scores over all tokens.
double index_score_correlation(const std::string& pol, const Synthetic& s) {
  PolicyConfig p = parse_policy(pol);
  KeyIndex idx(p, s.g);
  idx.append(0, s.k_pre.data(), s.k.data(), s.n);
  const int64_t n = idx.n_chunks(0);
  std::vector<float> got(size_t(s.g.n_kv_head) * n);
  idx.score(0, s.q.data(), 1.0f, n, got.data());
  PolicyConfig o = parse_policy("oracle,gqa=mean");
  KeyIndex ex(o, s.g);
  ex.append(0, s.k_pre.data(), s.k.data(), s.n);
  std::vector<float> want(got.size());
  ex.score(0, s.q.data(), 1.0f, n, want.data());
  double ma = 0, mb = 0;
  for (size_t i = 0; i < got.size(); ++i) ma += got[i], mb += want[i];
  ma /= got.size(), mb /= got.size();
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    sab += (got[i] - ma) * (want[i] - mb);
    saa += (got[i] - ma) * (got[i] - ma);
    sbb += (want[i] - mb) * (want[i] - mb);
  }
  return sab / std::sqrt(saa * sbb);
}

TEST(KeyIndex, QuantizedLandmarkScoresTrackExactScores) {
  Synthetic s(small_geometry(), 512, 11);
  const double bf16 = index_score_correlation("yakv,lm=bf16,gqa=mean", s);
  const double h2 = index_score_correlation("yakv,gqa=mean", s);
  const double res1 = index_score_correlation("yakv,lm=residual,meta=higgs4,res=1bit,m=8,gqa=mean", s);
  const double resh = index_score_correlation("yakv,lm=residual,meta=higgs4,res=higgs1,m=8,gqa=mean", s);
  std::printf("score correlation: bf16 %.4f higgs2 %.4f residual(1bit) %.4f residual(higgs1) %.4f\n",
              bf16, h2, res1, resh);
  EXPECT_GT(bf16, 0.999);
  EXPECT_GT(h2, 0.93);
  EXPECT_GT(res1, 0.78);
  EXPECT_GT(resh, 0.78);
}

}  // namespace
}  // namespace kvtier
