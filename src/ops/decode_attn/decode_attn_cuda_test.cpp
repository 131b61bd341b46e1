#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "backend/cuda_test_util.h"
#include "ops/decode_attn/decode_attn.h"
#include "ops/decode_attn/decode_attn_cuda.h"
#include "ops/quant/quant_scalar.h"

namespace kvtier::cuda {
namespace {
using namespace testing;

struct Case {
  KvElt elt;
  int n_seq, n_head, n_kv_head;
  int64_t n_slots, n_tok;
  bool use_idx, interleaved;
  int n_split;
  int head_dim = 128;
};

class DecodeAttnCuda : public ::testing::TestWithParam<Case> {};

TEST_P(DecodeAttnCuda, SplitsMergeToTheReference) {
  KVT_REQUIRE_GPU();
  const Case c = GetParam();
  std::mt19937 rng(5 + int(c.n_tok) + c.n_head);
  const int hd = c.head_dim;
  const int64_t eb = c.elt == KvElt::bf16 ? 2 : 1;
  const int64_t n_rows = int64_t(c.n_seq) * c.n_kv_head;
  DecodeAttnParams p;
  p.n_seq = c.n_seq;
  p.n_head = c.n_head;
  p.n_kv_head = c.n_kv_head;
  p.head_dim = hd;
  p.scale = 1.f / std::sqrt(float(hd));
  p.elt = c.elt;
  // interleaved: [rows, slots, K|V] (the gathered buffer); else separate K and V.
  p.tok_stride = (c.interleaved ? 2 : 1) * hd * eb;
  p.row_stride = c.n_slots * p.tok_stride + 64;
  p.n_tok = c.n_tok;
  std::vector<uint8_t> kv(size_t(n_rows * p.row_stride * (c.interleaved ? 1 : 2)));
  std::normal_distribution<float> g(0.f, 1.f);
  for (size_t i = 0; i < kv.size(); i += size_t(eb)) {
    const float x = 2.f * g(rng);
    if (eb == 2) {
      uint16_t b = f32_to_bf16(x);
      std::memcpy(&kv[i], &b, 2);
    } else {
      kv[i] = f32_to_e4m3(x);
    }
  }
  const int64_t k_off = 0;
  const int64_t v_off = c.interleaved ? hd * eb : n_rows * p.row_stride;
  std::vector<int32_t> idx;
  if (c.use_idx) {
    p.idx_stride = c.n_tok + 3;
    idx.assign(size_t(n_rows * p.idx_stride), 0);
    for (int64_t r = 0; r < n_rows; ++r)
      for (int64_t j = 0; j < c.n_tok; ++j)
        idx[size_t(r * p.idx_stride + j)] = (j % 7 == 3) ? -1 : int32_t(rng() % uint32_t(c.n_slots));
  }
  auto qb = random_bf16(size_t(c.n_seq * c.n_head * hd), rng, -2.f, 2.f);
  auto qf = bf16_to_f32_vec(qb);
  const int64_t n_qh = int64_t(c.n_seq) * c.n_head;
  std::vector<float> ref_out(size_t(n_qh * hd)), ref_lse(static_cast<size_t>(n_qh));
  decode_attn_ref(p, qf.data(), kv.data() + k_off, kv.data() + v_off, c.use_idx ? idx.data() : nullptr,
                  ref_out.data(), ref_lse.data());

  auto d_kv = to_device(kv);
  auto d_idx = to_device(idx);
  auto d_q = to_device(qb);
  // Two calls into disjoint part ranges (as resident + gathered would): the
  // first over the whole set split n_split ways, the second over nothing.
  DecodeAttnParams p1 = p;
  p1.n_split = c.n_split;
  DecodeAttnParams p2 = p;
  p2.n_tok = 0;
  p2.part0 = c.n_split;
  const int n_part = c.n_split + 1;
  DeviceBuffer d_po(size_t(n_part * n_qh * hd * 4)), d_pl(size_t(n_part * n_qh * 4));
  poison(d_po);
  poison(d_pl);
  const uint8_t* base = d_kv.data<uint8_t>();
  decode_attn(p1, d_q.data(), base + k_off, base + v_off, c.use_idx ? d_idx.data<int32_t>() : nullptr,
              d_po.data<float>(), d_pl.data<float>(), nullptr);
  decode_attn(p2, d_q.data(), base + k_off, base + v_off, nullptr, d_po.data<float>(), d_pl.data<float>(),
              nullptr);
  DeviceBuffer d_out(size_t(n_qh * hd * 4)), d_lse(size_t(n_qh * 4)), d_out16(size_t(n_qh * hd * 2));
  poison(d_out);
  attn_merge(n_part, n_qh, hd, d_po.data<float>(), d_pl.data<float>(), d_out16.data(), d_out.data<float>(),
             d_lse.data<float>(), nullptr);
  auto out = to_host<float>(d_out, ref_out.size());
  auto lse = to_host<float>(d_lse, ref_lse.size());
  EXPECT_LT(rel_l2(out.data(), ref_out.data(), out.size()), 2e-5);
  for (size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse[i], ref_lse[i], 1e-3 * (1 + std::abs(ref_lse[i])));
  // The CPU merge of the GPU parts agrees with the GPU merge.
  auto po = to_host<float>(d_po, size_t(n_part * n_qh * hd));
  auto pl = to_host<float>(d_pl, size_t(n_part * n_qh));
  std::vector<float> cpu_out(ref_out.size()), cpu_lse(ref_lse.size());
  attn_merge_ref(n_part, n_qh, hd, po.data(), pl.data(), cpu_out.data(), cpu_lse.data());
  EXPECT_LT(rel_l2(out.data(), cpu_out.data(), out.size()), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Grid, DecodeAttnCuda,
    ::testing::Values(Case{KvElt::bf16, 1, 32, 8, 4096, 4096, false, false, 16},
                      Case{KvElt::bf16, 2, 32, 8, 3000, 2999, false, false, 7},
                      Case{KvElt::bf16, 1, 32, 8, 5000, 1024, true, true, 4},
                      Case{KvElt::fp8, 1, 32, 8, 2048, 2048, false, true, 8},
                      Case{KvElt::fp8, 3, 8, 4, 700, 900, true, false, 3},
                      Case{KvElt::bf16, 2, 9, 3, 100, 5, false, false, 1},
                      Case{KvElt::bf16, 1, 8, 8, 64, 64, false, false, 40},
                      Case{KvElt::bf16, 1, 16, 2, 300, 300, false, false, 2},
                      // head_dim 64 (SmolLM2, Llama 3.2 1B): quarter-warp lane groups
                      Case{KvElt::bf16, 1, 9, 3, 1000, 1000, false, false, 5, 64},
                      Case{KvElt::bf16, 2, 32, 8, 3000, 2999, false, false, 7, 64},
                      Case{KvElt::bf16, 1, 32, 8, 5000, 1024, true, true, 4, 64},
                      Case{KvElt::fp8, 3, 8, 4, 700, 900, true, false, 3, 64},
                      Case{KvElt::bf16, 1, 8, 8, 64, 64, false, false, 40, 64}));

TEST(DecodeAttnCuda, RejectsUnsupportedShapes) {
  KVT_REQUIRE_GPU();
  DecodeAttnParams p;
  p.n_head = 10;
  p.n_kv_head = 4;
  EXPECT_THROW(decode_attn(p, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr), Error);
  p.n_head = 12;
  p.n_kv_head = 2;  // group 6
  p.row_stride = 256;
  p.tok_stride = 256;
  EXPECT_THROW(decode_attn(p, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr), Error);
}

}  // namespace
}  // namespace kvtier::cuda
