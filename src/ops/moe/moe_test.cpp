// The MoE block: routing and grouping exactly (hand-checked cases), the
// CPU block against the reference on a grid of weight types and shapes, and
// that experts no token is routed to are never read.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/half.h"
#include "core/status.h"
#include "core/threads.h"
#include "ops/dequant/dequant.h"
#include "ops/moe/moe.h"

namespace kvtier {
namespace {

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

TEST(MoeRoute, TopKDescendingTiesToLowerIdAndNormalization) {
  // Two tokens, 5 experts: token 0 has a tie between experts 1 and 3.
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f,  //
                                     -3.0f, 0.0f, 4.0f, 1.0f, 0.25f};
  std::vector<int32_t> ids(6);
  std::vector<float> w(6);
  moe_route(logits.data(), 2, config(8, 8, 5, 3, false), ids.data(), w.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 3, 4, 2, 3, 4}));
  double z0 = 0, z1 = 0;
  for (int e = 0; e < 5; ++e) {
    z0 += std::exp(double(logits[size_t(e)]));
    z1 += std::exp(double(logits[size_t(5 + e)]));
  }
  EXPECT_NEAR(w[0], std::exp(2.0) / z0, 1e-7);
  EXPECT_NEAR(w[1], std::exp(2.0) / z0, 1e-7);
  EXPECT_NEAR(w[2], std::exp(1.0) / z0, 1e-7);
  EXPECT_NEAR(w[3], std::exp(4.0) / z1, 1e-7);
  // Renormalized and scaled: the k weights sum to the scale.
  moe_route(logits.data(), 2, config(8, 8, 5, 3, true, 2.5f), ids.data(), w.data());
  EXPECT_NEAR(w[0] + w[1] + w[2], 2.5, 1e-6);
  EXPECT_NEAR(w[3] + w[4] + w[5], 2.5, 1e-6);
  EXPECT_NEAR(w[3] / w[4], std::exp(4.0 - 1.0), 1e-4);
  // k = n_expert with renormalization is the plain softmax.
  moe_route(logits.data(), 1, config(8, 8, 5, 5, true), ids.data(), w.data());
  EXPECT_NEAR(w[0], std::exp(2.0) / z0, 1e-7);
}

TEST(MoeGroup, RowsGroupedByExpertInTokenOrder) {
  // 4 tokens, k = 2, 5 experts; expert 2 is never chosen.
  const std::vector<int32_t> ids = {3, 0, 0, 4, 3, 1, 0, 3};
  MoeGroups g;
  moe_group(ids.data(), 4, config(8, 8, 5, 2, true), &g);
  EXPECT_EQ(g.indptr, (std::vector<int64_t>{0, 3, 4, 4, 7, 8}));
  EXPECT_EQ(g.token, (std::vector<int32_t>{0, 1, 3, 2, 0, 2, 3, 1}));
  EXPECT_EQ(g.slot, (std::vector<int32_t>{1, 0, 0, 1, 0, 0, 1, 1}));
  const std::vector<int32_t> bad = {0, 5};
  EXPECT_THROW(moe_group(bad.data(), 1, config(8, 8, 5, 2, true), &g), Error);
}

// Expert matrices stored as `type` (f32 values rounded through it).
struct ExpertSet {
  std::vector<std::vector<uint8_t>> bytes;  // one buffer per matrix
  MoeWeights w;
};

std::vector<uint8_t> encode(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng, float scale) {
  std::normal_distribution<float> nd(0.0f, scale);
  const size_t row_bytes = ggml_row_bytes(type, cols);
  std::vector<uint8_t> out(row_bytes * size_t(rows));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    if (type == GgmlType::Q4_K || type == GgmlType::Q6_K) {
      // K-quants (dequantized on use): random codes, sane f16 scales.
      std::uniform_int_distribution<int> byte(0, 255);
      uint8_t* p = out.data() + size_t(r) * row_bytes;
      for (size_t i = 0; i < row_bytes; ++i) p[i] = uint8_t(byte(rng));
      const uint16_t d = f32_to_f16(scale / 64.0f);
      for (int64_t b = 0; b < cols / kQKK; ++b) {
        if (type == GgmlType::Q4_K) {
          auto* blk = reinterpret_cast<BlockQ4_K*>(p) + b;
          blk->d = d;
          blk->dmin = d;
        } else {
          auto* blk = reinterpret_cast<BlockQ6_K*>(p) + b;
          blk->d = d;
        }
      }
      continue;
    }
    for (auto& x : row) x = nd(rng);
    quantize_row(type, row.data(), out.data() + size_t(r) * row_bytes, cols);
  }
  return out;
}

ExpertSet make_experts(GgmlType type, const MoeConfig& c, std::mt19937& rng) {
  ExpertSet s;
  auto add = [&](GgmlType t, int64_t rows, int64_t cols, float scale) {
    s.bytes.push_back(encode(t, rows, cols, rng, scale));
    return WeightView{t, s.bytes.back().data(), rows, cols, ggml_row_bytes(t, cols)};
  };
  s.bytes.reserve(size_t(3 * c.n_expert + 1));  // views point into these buffers
  s.w.router = add(GgmlType::F32, c.n_expert, c.n_embd, 1.0f / std::sqrt(float(c.n_embd)));
  for (int e = 0; e < c.n_expert; ++e) {
    s.w.gate.push_back(add(type, c.n_ff, c.n_embd, 1.0f / std::sqrt(float(c.n_embd))));
    s.w.up.push_back(add(type, c.n_ff, c.n_embd, 1.0f / std::sqrt(float(c.n_embd))));
    s.w.down.push_back(add(type, c.n_embd, c.n_ff, 1.0f / std::sqrt(float(c.n_ff))));
  }
  return s;
}

struct Case {
  GgmlType type;
  int n_embd, n_ff, n_expert, k;
  int64_t n_tok;
  bool norm;
};

class MoeFfn : public ::testing::TestWithParam<Case> {};

TEST_P(MoeFfn, MatchesReference) {
  const Case p = GetParam();
  const MoeConfig c = config(p.n_embd, p.n_ff, p.n_expert, p.k, p.norm, p.norm ? 1.0f : 1.5f);
  std::mt19937 rng(uint32_t(17 + int(p.type) * 31 + p.n_tok * 7 + p.n_expert));
  ExpertSet s = make_experts(p.type, c, rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(p.n_tok) * c.n_embd);  // [n_tok, n_embd]
  for (auto& v : x) v = nd(rng);
  std::vector<float> y(x.size(), NAN), y_ref(x.size());
  ThreadPool pool(2);
  MoeScratch scratch;
  moe_ffn(s.w, c, x.data(), p.n_tok, y.data(), scratch, pool);
  moe_ffn_ref(s.w, c, x.data(), p.n_tok, y_ref.data());
  double err = 0, norm = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    ASSERT_TRUE(std::isfinite(y[i])) << i;
    err += (double(y[i]) - y_ref[i]) * (double(y[i]) - y_ref[i]);
    norm += double(y_ref[i]) * y_ref[i];
  }
  // Types matmul runs on quantized activations (Q4_0, Q4_1, Q8_0 with fewer
  // than 16 rows per expert) lose ~1/254 of each block's range; the others
  // (f32, and f16/bf16/K-quants dequantized to f32) agree to float rounding.
  const bool q8_path = p.type == GgmlType::Q4_0 || p.type == GgmlType::Q4_1 || p.type == GgmlType::Q8_0;
  EXPECT_GT(norm, 0.0);
  EXPECT_LT(std::sqrt(err / norm), q8_path ? 2e-2 : 2e-5);
  // A second call reuses the scratch.
  std::vector<float> y2(x.size());
  moe_ffn(s.w, c, x.data(), p.n_tok, y2.data(), scratch, pool);
  EXPECT_EQ(y, y2);
}

INSTANTIATE_TEST_SUITE_P(
    Grid, MoeFfn,
    ::testing::Values(Case{GgmlType::F32, 64, 32, 8, 2, 1, true}, Case{GgmlType::F32, 64, 32, 8, 2, 5, false},
                      Case{GgmlType::F32, 64, 48, 16, 4, 40, true},  // ≥ 16 rows for some experts: sgemm
                      Case{GgmlType::F32, 96, 64, 4, 4, 23, false},  // k = n_expert
                      Case{GgmlType::F32, 64, 32, 8, 1, 9, true},
                      Case{GgmlType::F16, 64, 32, 8, 2, 6, true}, Case{GgmlType::BF16, 64, 32, 8, 3, 33, false},
                      Case{GgmlType::Q8_0, 64, 64, 8, 2, 1, true}, Case{GgmlType::Q8_0, 128, 64, 8, 2, 50, true},
                      Case{GgmlType::Q4_0, 64, 96, 6, 2, 7, true}, Case{GgmlType::Q4_1, 64, 64, 8, 2, 3, false},
                      Case{GgmlType::Q4_K, 256, 256, 4, 2, 5, true}, Case{GgmlType::Q6_K, 256, 256, 4, 2, 20, true}),
    [](const ::testing::TestParamInfo<Case>& i) {
      const Case& p = i.param;
      return std::string(ggml_type_name(p.type)) + "_e" + std::to_string(p.n_expert) + "k" + std::to_string(p.k) + "_t" +
             std::to_string(p.n_tok) + (p.norm ? "_norm" : "_raw");
    });

TEST(MoeFfnDecode, ExpertsNoTokenChoseAreNeverRead) {
  // Positive activations and a router whose rows 0..k-1 are positive, the
  // rest negative: every token picks experts 0..k-1. The other experts'
  // views point nowhere: reading them would fault.
  const MoeConfig c = config(64, 32, 8, 2, true);
  std::mt19937 rng(5);
  ExpertSet s = make_experts(GgmlType::Q8_0, c, rng);
  std::vector<float> router(size_t(c.n_expert) * c.n_embd);
  for (int e = 0; e < c.n_expert; ++e)
    for (int i = 0; i < c.n_embd; ++i) router[size_t(e) * c.n_embd + i] = e < c.n_expert_used ? 0.1f + 0.01f * e : -0.1f;
  s.w.router = WeightView{GgmlType::F32, router.data(), c.n_expert, c.n_embd, sizeof(float) * size_t(c.n_embd)};
  MoeWeights live = s.w;
  for (int e = c.n_expert_used; e < c.n_expert; ++e) live.gate[size_t(e)].data = live.up[size_t(e)].data =
      live.down[size_t(e)].data = nullptr;
  std::uniform_real_distribution<float> ud(0.1f, 1.0f);
  std::vector<float> x(size_t(3) * c.n_embd);
  for (auto& v : x) v = ud(rng);
  std::vector<float> y(x.size()), y_ref(x.size());
  ThreadPool pool(2);
  MoeScratch scratch;
  moe_ffn(live, c, x.data(), 3, y.data(), scratch, pool);
  moe_ffn_ref(s.w, c, x.data(), 3, y_ref.data());
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], y_ref[i], 2e-2 * (1 + std::fabs(y_ref[i])));
}

TEST(MoeFfnDecode, BadShapesAreRefused) {
  const MoeConfig c = config(64, 32, 8, 2, true);
  std::mt19937 rng(6);
  ExpertSet s = make_experts(GgmlType::F32, c, rng);
  std::vector<float> x(64), y(64);
  ThreadPool pool(1);
  MoeScratch scratch;
  MoeWeights missing = s.w;
  missing.down.pop_back();
  EXPECT_THROW(moe_ffn(missing, c, x.data(), 1, y.data(), scratch, pool), Error);
  MoeConfig too_many = c;
  too_many.n_expert_used = 9;
  EXPECT_THROW(moe_ffn(s.w, too_many, x.data(), 1, y.data(), scratch, pool), Error);
}

}  // namespace
}  // namespace kvtier
