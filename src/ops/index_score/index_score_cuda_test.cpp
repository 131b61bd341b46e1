#include <gtest/gtest.h>

#include <random>

#include "backend/cuda_test_util.h"
#include "ops/index_score/index_score.h"
#include "ops/index_score/index_score_cuda.h"
#include "kv/selector.h"
#include "ops/quant/quant_scalar.h"

namespace kvtier::cuda {
namespace {
using namespace testing;

struct Case {
  IndexElt elt;
  int n_seq, n_kv_head, n_q;
  int64_t n_tok, tok_offset, pad_tok;
  bool per_query = false;
};

class IndexScoreCuda : public ::testing::TestWithParam<Case> {};

TEST_P(IndexScoreCuda, MatchesReference) {
  KVT_REQUIRE_GPU();
  const Case c = GetParam();
  std::mt19937 rng(1234 + int(c.n_tok));
  IndexScoreParams p;
  p.n_seq = c.n_seq;
  p.n_kv_head = c.n_kv_head;
  p.n_q = c.n_q;
  p.n_tok = c.n_tok;
  p.tok_offset = c.tok_offset;
  p.per_query = c.per_query;
  const int64_t rec = index_record_bytes(c.elt, 128);
  const int64_t cap = c.tok_offset + c.n_tok + c.pad_tok;
  p.row_stride = (cap * rec + 15) / 16 * 16;
  if (c.elt == IndexElt::higgs2) p.scale_offset = cap * 32;  // codes plane, then scales plane
  const int64_t n_rows = int64_t(c.n_seq) * c.n_kv_head;
  std::vector<uint8_t> index(size_t(n_rows * p.row_stride));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : index) b = uint8_t(byte(rng));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  // Valid scales (bf16 in [0, 1)) and no FP8 NaN codes.
  for (int64_t r = 0; r < n_rows; ++r)
    for (int64_t t = 0; t < cap; ++t) {
      uint8_t* e = index.data() + r * p.row_stride + t * rec;
      if (c.elt == IndexElt::higgs2) {
        uint16_t sb = f32_to_bf16(std::abs(u(rng)));
        std::memcpy(index.data() + r * p.row_stride + p.scale_offset + 2 * t, &sb, 2);
      } else if (c.elt == IndexElt::bf16) {
        for (int d = 0; d < 128; ++d) {
          uint16_t b = f32_to_bf16(u(rng));
          std::memcpy(e + 2 * d, &b, 2);
        }
      } else {
        for (int d = 0; d < 128; ++d) e[d] = f32_to_e4m3(4 * u(rng));
      }
    }
  std::vector<float> q(size_t(n_rows * c.n_q * 128)), grid(256 * 4);
  for (auto& x : q) x = u(rng);
  for (auto& x : grid) x = 2 * u(rng);
  std::vector<float> ref(size_t(n_rows * (c.per_query ? c.n_q : 1) * c.n_tok));
  index_score_ref(c.elt, p, q.data(), index.data(), grid.data(), ref.data());
  auto d_index = to_device(index);
  auto d_q = to_device(q);
  auto d_grid = to_device(grid);
  DeviceBuffer d_scores(ref.size() * 4);
  poison(d_scores);
  index_score(c.elt, p, d_q.data<float>(), d_index.data<uint8_t>(), d_grid.data<float>(), d_scores.data<float>(),
              nullptr);
  auto got = to_host<float>(d_scores, ref.size());
  EXPECT_LT(rel_l2(got.data(), ref.data(), ref.size()), 1e-5);
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], 1e-3 * (1 + std::abs(ref[i]))) << i;
}

INSTANTIATE_TEST_SUITE_P(
    Grid, IndexScoreCuda,
    ::testing::Values(Case{IndexElt::higgs2, 1, 8, 1, 4096, 0, 0}, Case{IndexElt::higgs2, 2, 3, 2, 1000, 4, 3},
                      Case{IndexElt::higgs2, 1, 2, 4, 257, 1, 5}, Case{IndexElt::higgs2, 1, 1, 1, 1, 0, 0},
                      Case{IndexElt::higgs2, 2, 8, 1, 70000, 4, 7},
                      Case{IndexElt::higgs2, 1, 8, 4, 5000, 3, 1, true}, Case{IndexElt::higgs2, 2, 2, 2, 999, 0, 0, true},
                      Case{IndexElt::bf16, 1, 8, 1, 4096, 0, 0}, Case{IndexElt::bf16, 2, 3, 4, 777, 5, 1},
                      Case{IndexElt::fp8, 1, 8, 1, 4099, 0, 0}, Case{IndexElt::fp8, 3, 2, 2, 33, 2, 9}));

TEST(IndexGqaCuda, SoftmaxMaxMatchesReferenceAndTheCpuSelector) {
  KVT_REQUIRE_GPU();
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.f, 30.f);
  for (int n_q : {1, 2, 4})
    for (int64_t n_tok : {int64_t(1), int64_t(37), int64_t(100000)}) {
      const int64_t n_rows = 3, sel_off = n_tok > 10 ? 4 : 0, n_sel = n_tok > 10 ? n_tok - 9 : n_tok;
      const float scale = 0.088f;
      std::vector<float> raw(size_t(n_rows * n_q * n_tok));
      for (auto& x : raw) x = nd(rng);
      std::vector<float> ref(size_t(n_rows * n_sel));
      index_gqa_softmax_max_ref(raw.data(), n_rows, n_q, n_tok, scale, sel_off, n_sel, ref.data());
      auto d_raw = to_device(raw);
      DeviceBuffer d_out(ref.size() * 4), d_scratch(size_t(index_gqa_scratch_bytes(n_rows, n_q)));
      poison(d_out);
      index_gqa_softmax_max(d_raw.data<float>(), n_rows, n_q, n_tok, scale, sel_off, n_sel, d_scratch.data(),
                            d_out.data<float>(), nullptr);
      const auto got = to_host<float>(d_out, ref.size());
      for (size_t i = 0; i < ref.size(); ++i)
        ASSERT_NEAR(got[i], ref[i], 1e-4 * (1 + std::abs(ref[i]))) << n_q << " " << n_tok << " " << i;
      // exp of it is the CPU selector's softmax-then-max (where f32 does not underflow).
      if (n_rows * n_q * n_tok > 1000) continue;
      std::vector<float> scaled(raw.size()), cpu(size_t(n_rows * n_tok));
      for (size_t i = 0; i < raw.size(); ++i) scaled[i] = scale * raw[i];
      aggregate_gqa(GqaMode::shadowkv, int(n_rows) * n_q, int(n_rows), n_tok, scaled.data(), cpu.data());
      for (int64_t r = 0; r < n_rows; ++r)
        for (int64_t i = 0; i < n_sel; ++i) {
          const float want = cpu[size_t(r * n_tok + sel_off + i)];
          if (want > 1e-30f) ASSERT_NEAR(std::exp(double(got[size_t(r * n_sel + i)])), want, 1e-4 * want + 1e-12);
        }
    }
}

TEST(IndexQueryCuda, MeanAndRotationMatchReference) {
  KVT_REQUIRE_GPU();
  std::mt19937 rng(7);
  for (bool mean : {true, false})
    for (bool rot : {true, false}) {
      const int n_seq = 2, n_head = 8, n_kv = 2, hd = 128;
      auto qb = random_bf16(size_t(n_seq * n_head * hd), rng);
      auto qf = bf16_to_f32_vec(qb);
      std::vector<float> signs(hd);
      for (int i = 0; i < hd; ++i) signs[size_t(i)] = (rng() & 1) ? 1.f : -1.f;
      const int n_q = mean ? 1 : n_head / n_kv;
      std::vector<float> ref(size_t(n_seq * n_kv * n_q * hd));
      index_query_ref(qf.data(), n_seq, n_head, n_kv, hd, mean, rot, signs.data(), ref.data());
      auto d_q = to_device(qb);
      auto d_s = to_device(signs);
      DeviceBuffer d_out(ref.size() * 4);
      poison(d_out);
      index_query(d_q.data(), n_seq, n_head, n_kv, hd, mean, rot, d_s.data<float>(), d_out.data<float>(), nullptr);
      auto got = to_host<float>(d_out, ref.size());
      EXPECT_LT(rel_l2(got.data(), ref.data(), ref.size()), 1e-5) << mean << rot;
    }
}

}  // namespace
}  // namespace kvtier::cuda
