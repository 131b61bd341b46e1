// The `full` store on the CPU: after prefill it keeps K/V in their stored
// precision (bf16, fp8) and decode reads them in place. Its outputs must equal
// the reference (attention_causal_ref over the same rounded K/V) to float
// rounding, on a grid of head dims, GQA groups and lengths around the decode
// kernel's tiles and splits.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/status.h"
#include "kv/full_kv.h"
#include "kv/policy.h"
#include "ops/attention/attention.h"
#include "ops/quant/quant_format.h"

namespace kvtier {
namespace {

double rel_l2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

struct Case {
  std::string kv;
  int head_dim, n_head, n_kv_head;
  int64_t n_prompt;
  int n_decode;  // decode steps, one token each
};

// Random rows [n, H·D] and their values after the storage format's rounding.
struct Rows {
  std::vector<float> x, rounded;
};
Rows make_rows(const QuantSpec& spec, int64_t n, int w, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  Rows r;
  r.x.resize(size_t(n) * w);
  for (float& v : r.x) v = 1.5f * nd(rng);
  std::vector<uint8_t> rec(size_t(n) * bytes_per_vector(spec, w));
  quantize(spec, r.x.data(), n, w, rec.data());
  r.rounded.resize(r.x.size());
  dequantize(spec, rec.data(), n, w, r.rounded.data());
  return r;
}

void run_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE(c.kv + " d" + std::to_string(c.head_dim) + " " + std::to_string(c.n_head) + "/" +
               std::to_string(c.n_kv_head) + " prompt " + std::to_string(c.n_prompt));
  KvGeometry g;
  g.n_layer = 2;
  g.n_head = c.n_head;
  g.n_kv_head = c.n_kv_head;
  g.head_dim = c.head_dim;
  FullKvStore store(parse_policy("full,kv=" + c.kv), g);
  const QuantSpec spec = parse_quant_spec(c.kv);
  const int w = c.n_kv_head * c.head_dim, qw = c.n_head * c.head_dim;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t n_total = c.n_prompt + c.n_decode;
  std::vector<Rows> k, v;
  for (int l = 0; l < g.n_layer; ++l) {
    k.push_back(make_rows(spec, n_total, w, rng));
    v.push_back(make_rows(spec, n_total, w, rng));
  }
  store.set_phase(KvPhase::prefill);
  for (int l = 0; l < g.n_layer; ++l)
    store.append(l, k[l].x.data(), k[l].x.data(), v[l].x.data(), int(c.n_prompt));
  store.set_phase(KvPhase::decode);
  AttentionParams ap;
  ap.n_head = c.n_head;
  ap.n_kv_head = c.n_kv_head;
  ap.head_dim = c.head_dim;
  ap.scale = 1.f / std::sqrt(float(c.head_dim));
  std::vector<float> q(static_cast<size_t>(qw)), out(q.size()), ref(q.size());
  for (int64_t t = c.n_prompt; t < n_total; ++t)
    for (int l = 0; l < g.n_layer; ++l) {
      store.append(l, k[l].x.data() + t * w, k[l].x.data() + t * w, v[l].x.data() + t * w, 1);
      for (float& x : q) x = nd(rng);
      store.attend(l, q.data(), 1, ap.scale, out.data());
      attention_causal_ref(ap, q.data(), 1, k[l].rounded.data(), v[l].rounded.data(), t + 1, ref.data());
      ASSERT_LT(rel_l2(out.data(), ref.data(), out.size()), 1e-5) << "layer " << l << " token " << t;
    }
  EXPECT_EQ(store.n_tokens(0), n_total);
}

TEST(FullKvStore, DecodeReadsStoredElementsAndMatchesReference) {
  uint32_t seed = 3;
  for (const char* kv : {"bf16", "fp8"})
    for (int hd : {64, 128})
      for (int group = 1; group <= 8; ++group) {
        const int n_kv = group <= 2 ? 3 : 2;
        // lengths at the 32-token tiles and the 256-token split boundary
        for (int64_t n : {1, 31, 32, 255, 256})
          run_case({kv, hd, n_kv * group, n_kv, n, 2}, seed++);
      }
  // Long enough to split across threads and to grow the cache past its reserve.
  run_case({"bf16", 64, 9, 3, 1500, 300}, seed++);
  run_case({"fp8", 128, 32, 8, 700, 3}, seed++);
}

TEST(FullKvStore, MultiTokenAttendsAfterPrefill) {
  KvGeometry g;
  g.n_layer = 1;
  g.n_head = 6;
  g.n_kv_head = 2;
  g.head_dim = 64;
  FullKvStore store(parse_policy("full"), g);
  const QuantSpec spec = parse_quant_spec("bf16");
  const int w = g.n_kv_head * g.head_dim, qw = g.n_head * g.head_dim;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  const Rows k = make_rows(spec, 300, w, rng), v = make_rows(spec, 300, w, rng);
  store.append(0, k.x.data(), k.x.data(), v.x.data(), 100);
  store.set_phase(KvPhase::decode);
  AttentionParams ap;
  ap.n_head = g.n_head;
  ap.n_kv_head = g.n_kv_head;
  ap.head_dim = g.head_dim;
  ap.scale = 0.125f;
  // 3 queries (per-query decode path), then 20 (widened to f32, sgemm path).
  int64_t n = 100;
  for (int n_q : {3, 20}) {
    store.append(0, k.x.data() + n * w, k.x.data() + n * w, v.x.data() + n * w, n_q);
    n += n_q;
    std::vector<float> q(size_t(n_q) * qw), out(q.size()), ref(q.size());
    for (float& x : q) x = nd(rng);
    store.attend(0, q.data(), n_q, ap.scale, out.data());
    attention_causal_ref(ap, q.data(), n_q, k.rounded.data(), v.rounded.data(), n, ref.data());
    EXPECT_LT(rel_l2(out.data(), ref.data(), out.size()), 1e-5) << n_q << " queries";
  }
  // Back to prefill: rows widened to f32 again, same results.
  store.set_phase(KvPhase::prefill);
  std::vector<float> q(static_cast<size_t>(qw)), out(q.size()), ref(q.size());
  for (float& x : q) x = nd(rng);
  store.attend(0, q.data(), 1, ap.scale, out.data());
  attention_causal_ref(ap, q.data(), 1, k.rounded.data(), v.rounded.data(), n, ref.data());
  EXPECT_LT(rel_l2(out.data(), ref.data(), out.size()), 1e-5);
  EXPECT_EQ(store.keys(0)[5], k.rounded[5]);
  store.set_phase(KvPhase::decode);
  EXPECT_THROW(store.keys(0), Error);
}

}  // namespace
}  // namespace kvtier
