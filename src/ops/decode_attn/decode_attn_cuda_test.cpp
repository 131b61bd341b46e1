// decode_attn (CUDA) against decode_attn_ref: ragged rows (each sequence its
// own length, rows through a pointer table), slot lists with −1 holes, K|V
// interleaved or apart (negative v_offset included), splits merged with an
// empty part, bf16 and fp8, head_dim 64/128/256, GQA groups 1..16 (the
// tensor-core kernel for 1..8, the general one beyond).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "backend/cuda_test_util.h"
#include "ops/decode_attn/decode_attn.h"
#include "ops/quant/quant_scalar.h"

namespace kvtier {
namespace {
using namespace cuda::testing;

struct Case {
  KvElt elt;
  int n_seq, n_head, n_kv_head;
  int64_t n_slots;  // slots per row
  bool use_idx, interleaved;
  int n_split;
  int head_dim = 128;
};

class DecodeAttnCuda : public ::testing::TestWithParam<Case> {};

TEST_P(DecodeAttnCuda, RaggedSplitsMergeToTheReference) {
  KVT_REQUIRE_GPU();
  const Case c = GetParam();
  std::mt19937 rng(5 + int(c.n_slots) + c.n_head + c.head_dim);
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
  // interleaved: rows of [slots, K|V]; else a K region, then (after padding) a V region.
  p.tok_stride = (c.interleaved ? 2 : 1) * hd * eb;
  const int64_t row_bytes = c.n_slots * p.tok_stride + 64;
  const int64_t region = n_rows * row_bytes;
  std::vector<uint8_t> kv(size_t(region * (c.interleaved ? 1 : 2)));
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
  // Rows: K bases; V = K + v_offset. Non-interleaved: rows point into the V
  // region and K lies before (a negative offset).
  p.v_offset = c.interleaved ? hd * eb : -region;
  const int64_t k_base = c.interleaved ? 0 : region;
  // Ragged lengths: sequence s reads n(s) slots (or idx entries).
  std::vector<int64_t> n_tok(static_cast<size_t>(c.n_seq));
  for (int s = 0; s < c.n_seq; ++s) n_tok[size_t(s)] = std::max<int64_t>(0, c.n_slots - 37 * s);
  p.n_tok_max = c.n_slots;
  std::vector<int32_t> idx;
  if (c.use_idx) {
    p.idx_stride = c.n_slots + 3;
    idx.assign(size_t(n_rows * p.idx_stride), 0);
    for (int64_t r = 0; r < n_rows; ++r)
      for (int64_t j = 0; j < p.idx_stride; ++j)
        idx[size_t(r * p.idx_stride + j)] = (j % 7 == 3) ? -1 : int32_t(rng() % uint32_t(c.n_slots));
  }
  auto qb = random_bf16(size_t(c.n_seq * c.n_head * hd), rng, -2.f, 2.f);
  auto qf = bf16_to_f32_vec(qb);
  const int64_t n_qh = int64_t(c.n_seq) * c.n_head;
  std::vector<const uint8_t*> host_rows(static_cast<size_t>(n_rows));
  for (int64_t r = 0; r < n_rows; ++r) host_rows[size_t(r)] = kv.data() + k_base + r * row_bytes;
  DecodeAttnParams pr = p;
  pr.n_tok = n_tok.data();
  pr.n_split = 1;
  std::vector<float> ref_out(size_t(n_qh * hd)), ref_lse(static_cast<size_t>(n_qh));
  decode_attn_ref(pr, qf.data(), host_rows.data(), c.use_idx ? idx.data() : nullptr, ref_out.data(), ref_lse.data());

  Device dev(DeviceKind::cuda);
  const Exec& x = dev.exec();
  auto d_kv = to_device(kv);
  auto d_idx = to_device(idx);
  auto d_q = to_device(qb);
  auto d_n = to_device(n_tok);
  std::vector<const uint8_t*> dev_rows(static_cast<size_t>(n_rows));
  for (int64_t r = 0; r < n_rows; ++r) dev_rows[size_t(r)] = d_kv.data<uint8_t>() + k_base + r * row_bytes;
  auto d_rows = to_device(dev_rows);
  // Two calls into disjoint part ranges (as resident + fetched would): the
  // first over each row's slots split n_split ways, the second over nothing.
  DecodeAttnParams p1 = p;
  p1.n_tok = d_n.data<int64_t>();
  p1.n_split = c.n_split;
  DecodeAttnParams p2 = p;
  p2.n_tok_fixed = 0;
  p2.part0 = c.n_split;
  const int n_part = c.n_split + 1;
  cuda::DeviceBuffer d_po(size_t(n_part * n_qh * hd * 4)), d_pl(size_t(n_part * n_qh * 4));
  poison(d_po);
  poison(d_pl);
  const auto* rows = d_rows.data<const uint8_t*>();
  decode_attn(x, p1, d_q.data(), rows, c.use_idx ? d_idx.data<int32_t>() : nullptr, d_po.data<float>(),
              d_pl.data<float>());
  decode_attn(x, p2, d_q.data(), rows, nullptr, d_po.data<float>(), d_pl.data<float>());
  cuda::DeviceBuffer d_out(size_t(n_qh * hd * 4)), d_lse(size_t(n_qh * 4));
  poison(d_out);
  attn_merge(x, n_part, n_qh, hd, d_po.data<float>(), d_pl.data<float>(), d_out.data<float>(), true,
             d_lse.data<float>());
  sync(x);
  auto out = to_host<float>(d_out, ref_out.size());
  auto lse = to_host<float>(d_lse, ref_lse.size());
  EXPECT_LT(rel_l2(out.data(), ref_out.data(), out.size()), 2e-5);
  for (size_t i = 0; i < lse.size(); ++i)
    if (std::isinf(ref_lse[i])) ASSERT_TRUE(std::isinf(lse[i]) && lse[i] < 0) << i;
    else ASSERT_NEAR(lse[i], ref_lse[i], 1e-3 * (1 + std::abs(ref_lse[i])));
  // The CPU merge of the GPU parts agrees with the GPU merge.
  auto po = to_host<float>(d_po, size_t(n_part * n_qh * hd));
  auto pl = to_host<float>(d_pl, size_t(n_part * n_qh));
  std::vector<float> cpu_out(ref_out.size()), cpu_lse(ref_lse.size());
  attn_merge_ref(n_part, n_qh, hd, po.data(), pl.data(), cpu_out.data(), cpu_lse.data());
  EXPECT_LT(rel_l2(out.data(), cpu_out.data(), out.size()), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Grid, DecodeAttnCuda,
    ::testing::Values(Case{KvElt::bf16, 1, 32, 8, 4096, false, false, 16},
                      Case{KvElt::bf16, 2, 32, 8, 3000, false, false, 7},
                      Case{KvElt::bf16, 3, 32, 8, 1024, true, true, 4},
                      Case{KvElt::fp8, 1, 32, 8, 2048, false, true, 8},
                      Case{KvElt::fp8, 3, 8, 4, 700, true, false, 3},
                      Case{KvElt::bf16, 2, 9, 3, 100, false, false, 1},
                      Case{KvElt::bf16, 1, 8, 8, 64, false, false, 40},
                      Case{KvElt::bf16, 1, 16, 2, 300, false, false, 2},
                      Case{KvElt::bf16, 2, 28, 4, 500, true, false, 3},   // group 7 (Qwen2.5-7B)
                      Case{KvElt::bf16, 2, 48, 8, 500, true, true, 3},    // group 6
                      Case{KvElt::bf16, 2, 40, 8, 400, false, true, 2},   // group 5
                      Case{KvElt::bf16, 2, 64, 4, 400, true, false, 2},   // group 16: the general kernel
                      Case{KvElt::bf16, 1, 9, 3, 1000, false, false, 5, 64},
                      Case{KvElt::bf16, 2, 32, 8, 3000, false, false, 7, 64},
                      Case{KvElt::bf16, 3, 32, 8, 1024, true, true, 4, 64},
                      Case{KvElt::fp8, 3, 8, 4, 700, true, false, 3, 64},
                      Case{KvElt::bf16, 1, 8, 8, 64, false, false, 40, 64},
                      Case{KvElt::bf16, 2, 16, 8, 600, true, true, 3, 256},  // head_dim 256: the general kernel
                      Case{KvElt::fp8, 1, 8, 2, 500, false, false, 2, 256}));

// attn_merge alone: more parts than one round of staged weights, empty parts
// (lse −inf) among them, a (sequence, head) with no part at all, and the bf16
// output; against attn_merge_ref.
TEST(DecodeAttnCuda, MergeOfManyPartsMatchesTheReference) {
  KVT_REQUIRE_GPU();
  Device dev(DeviceKind::cuda);
  const Exec& x = dev.exec();
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  for (const int hd : {64, 128, 256})
    for (const int n_part : {1, 34, 300}) {
      const int64_t n_qh = 5;
      std::vector<float> po(size_t(n_part * n_qh * hd)), pl(size_t(n_part * n_qh));
      for (float& v : po) v = nd(rng);
      for (size_t i = 0; i < pl.size(); ++i) pl[i] = (rng() % 5 == 0) ? -INFINITY : 4.f * nd(rng);
      for (int j = 0; j < n_part; ++j) pl[size_t(j * n_qh + 2)] = -INFINITY;  // head 2: nothing attended
      std::vector<float> want(static_cast<size_t>(n_qh * hd)), want_lse(static_cast<size_t>(n_qh));
      attn_merge_ref(n_part, n_qh, hd, po.data(), pl.data(), want.data(), want_lse.data());
      auto d_po = to_device(po);
      auto d_pl = to_device(pl);
      cuda::DeviceBuffer d_out(want.size() * 4), d_bf(want.size() * 2), d_lse(want_lse.size() * 4);
      poison(d_out);
      poison(d_bf);
      poison(d_lse);
      attn_merge(x, n_part, n_qh, hd, d_po.data<float>(), d_pl.data<float>(), d_out.data<float>(), true,
                 d_lse.data<float>());
      attn_merge(x, n_part, n_qh, hd, d_po.data<float>(), d_pl.data<float>(), d_bf.data<uint16_t>(), false, nullptr);
      sync(x);
      const auto out = to_host<float>(d_out, want.size());
      const auto bf = to_host<uint16_t>(d_bf, want.size());
      const auto lse = to_host<float>(d_lse, want_lse.size());
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(out[i], want[i], 1e-5f * (1.f + std::abs(want[i]))) << hd << " " << n_part << " " << i;
        uint32_t u = uint32_t(bf[i]) << 16;
        float b;
        std::memcpy(&b, &u, 4);
        ASSERT_NEAR(b, want[i], 1e-2f * (1.f + std::abs(want[i]))) << hd << " " << n_part << " " << i;
      }
      for (int64_t i = 0; i < n_qh; ++i) {
        if (std::isinf(want_lse[size_t(i)])) ASSERT_TRUE(std::isinf(lse[size_t(i)]) && lse[size_t(i)] < 0) << i;
        else ASSERT_NEAR(lse[size_t(i)], want_lse[size_t(i)], 1e-4f * (1.f + std::abs(want_lse[size_t(i)]))) << i;
      }
      for (int d = 0; d < hd; ++d) ASSERT_EQ(out[size_t(2 * hd + d)], 0.f);
    }
}

TEST(DecodeAttnCuda, RejectsUnsupportedShapes) {
  KVT_REQUIRE_GPU();
  Device dev(DeviceKind::cuda);
  DecodeAttnParams p;
  p.n_head = 10;
  p.n_kv_head = 4;
  EXPECT_THROW(decode_attn(dev.exec(), p, nullptr, nullptr, nullptr, nullptr, nullptr), Error);
  p.n_head = 8;
  p.head_dim = 96;
  EXPECT_THROW(decode_attn(dev.exec(), p, nullptr, nullptr, nullptr, nullptr, nullptr), Error);
  p.head_dim = 128;
  p.elt = KvElt::f32;  // the CPU's
  EXPECT_THROW(decode_attn(dev.exec(), p, nullptr, nullptr, nullptr, nullptr, nullptr), Error);
}

}  // namespace
}  // namespace kvtier
