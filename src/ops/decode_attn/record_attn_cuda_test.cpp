// decode_attn_records (CUDA) against decode_attn_records_ref: HIGGS records
// quantized by the CPU quantizer, laid out as the store lays them out (token,
// then KV head, K then V), read in place from device memory; selection rows
// with −1 holes and repeated tokens, splits merged with an empty part, GQA
// groups 1..8, head_dim 64/128, with and without random signs. The kernel
// rounds the rotated query and the grid points to bf16, so it agrees with
// the f64 reference to bf16 accuracy, not exactly.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backend/cuda_test_util.h"
#include "ops/decode_attn/record_attn.h"
#include "ops/quant/hadamard.h"
#include "ops/quant/higgs_grid.h"
#include "ops/quant/quant_format.h"

namespace kvtier {
namespace {
using namespace cuda::testing;

struct Case {
  const char* spec;
  int head_dim, n_seq, n_head, n_kv_head;
  int64_t n_tok, n_sel;  // tokens in the store, selected per row
  int n_split;
};

class RecordAttnCuda : public ::testing::TestWithParam<Case> {};

TEST_P(RecordAttnCuda, MatchesTheDecodedReference) {
  KVT_REQUIRE_GPU();
  const Case c = GetParam();
  const int D = c.head_dim, H = c.n_kv_head;
  std::mt19937 rng(11 + D + c.n_head + int(c.n_sel));
  const QuantSpec spec = parse_quant_spec(c.spec);
  RecordFormat fmt{spec, D, int64_t(bytes_per_vector(spec, D))};
  ASSERT_TRUE(record_attn_supported(fmt, D, c.n_head, H)) << c.spec;
  const int64_t entry = (2 * fmt.bytes + 15) / 16 * 16, tok_bytes = H * entry;
  // The stores: keys and values of varied scale, a few tokens far larger.
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<std::vector<uint8_t>> store(size_t(c.n_seq), std::vector<uint8_t>(size_t(c.n_tok * tok_bytes), 0));
  std::vector<float> x(static_cast<size_t>(D));
  for (int s = 0; s < c.n_seq; ++s)
    for (int64_t t = 0; t < c.n_tok; ++t)
      for (int h = 0; h < H; ++h)
        for (int kv = 0; kv < 2; ++kv) {
          const float amp = (t % 97 == 5 ? 6.f : 1.f) * (0.5f + float(h % 3));
          for (float& v : x) v = amp * nd(rng);
          quantize(spec, x.data(), 1, D, store[size_t(s)].data() + t * tok_bytes + h * entry + kv * fmt.bytes);
        }
  // Selections: ascending token ids, −1 first (right-aligned), repeats allowed.
  const int64_t rows = int64_t(c.n_seq) * H, stride = c.n_sel + 5;
  std::vector<int32_t> sel(size_t(rows * stride), -1);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < c.n_sel; ++j)
      if (j % 11 != 4) sel[size_t(r * stride + j)] = int32_t(rng() % uint32_t(c.n_tok));
  auto qb = random_bf16(size_t(c.n_seq) * c.n_head * D, rng, -2.f, 2.f);
  const auto qf = bf16_to_f32_vec(qb);
  const int64_t n_qh = int64_t(c.n_seq) * c.n_head;

  RecordAttnParams p;
  p.attn.n_seq = c.n_seq;
  p.attn.n_head = c.n_head;
  p.attn.n_kv_head = H;
  p.attn.head_dim = D;
  p.attn.scale = 1.f / std::sqrt(float(D));
  p.attn.idx_stride = stride;
  p.attn.n_tok_fixed = p.attn.n_tok_max = c.n_sel;
  p.attn.n_split = c.n_split;
  p.fmt = fmt;
  p.entry_bytes = entry;
  p.tok_bytes = tok_bytes;
  std::vector<const uint8_t*> host_ptrs;
  for (auto& st : store) host_ptrs.push_back(st.data());
  const int n_part = c.n_split + 1;
  std::vector<float> ref_po(size_t(n_part * n_qh * D)), ref_pl(size_t(n_part * n_qh));
  decode_attn_records_ref(p, qf.data(), host_ptrs.data(), sel.data(), ref_po.data(), ref_pl.data());
  RecordAttnParams pe = p;  // the second call: an empty part after the splits
  pe.attn.n_tok_fixed = 0;
  pe.attn.n_split = 1;
  pe.attn.part0 = c.n_split;
  decode_attn_records_ref(pe, qf.data(), host_ptrs.data(), sel.data(), ref_po.data(), ref_pl.data());

  Device dev(DeviceKind::cuda);
  const Exec& ex = dev.exec();
  std::vector<cuda::DeviceBuffer> d_store;
  std::vector<const uint8_t*> d_ptrs;
  for (auto& st : store) {
    d_store.push_back(to_device(st));
    d_ptrs.push_back(d_store.back().data<uint8_t>());
  }
  cuda::DeviceBuffer d_grid = to_device(higgs_grid(spec.grid_dim, spec.grid_size).points), d_signs;
  RecordAttnParams pg = p;
  pg.fmt.grid = d_grid.data<float>();
  if (spec.random_signs) {
    std::vector<float> sg(static_cast<size_t>(D));
    hadamard_signs(spec.sign_seed, D, sg.data());
    d_signs = to_device(sg);
    pg.fmt.signs = d_signs.data<float>();
  }
  auto d_host = to_device(d_ptrs);
  auto d_sel = to_device(sel);
  auto d_q = to_device(qb);
  cuda::DeviceBuffer d_po(ref_po.size() * 4), d_pl(ref_pl.size() * 4);
  poison(d_po);
  poison(d_pl);
  const auto* hp = d_host.data<const uint8_t*>();
  decode_attn_records(ex, pg, d_q.data(), hp, d_sel.data<int32_t>(), d_po.data<float>(), d_pl.data<float>());
  RecordAttnParams pge = pg;
  pge.attn = pe.attn;
  decode_attn_records(ex, pge, d_q.data(), hp, d_sel.data<int32_t>(), d_po.data<float>(), d_pl.data<float>());
  sync(ex);
  const auto po = to_host<float>(d_po, ref_po.size());
  const auto pl = to_host<float>(d_pl, ref_pl.size());
  for (size_t i = 0; i < pl.size(); ++i)
    if (std::isinf(ref_pl[i]))
      ASSERT_TRUE(std::isinf(pl[i]) && pl[i] < 0) << i;
    else
      ASSERT_NEAR(pl[i], ref_pl[i], 2e-2 * (1 + std::abs(ref_pl[i]))) << i;
  EXPECT_LT(rel_l2(po.data(), ref_po.data(), po.size()), 1e-2);
  // Merged, as the decode step merges its parts.
  std::vector<float> out(static_cast<size_t>(n_qh * D)), ref_out(out.size()), lse(static_cast<size_t>(n_qh)),
      ref_lse(lse.size());
  attn_merge_ref(n_part, n_qh, D, po.data(), pl.data(), out.data(), lse.data());
  attn_merge_ref(n_part, n_qh, D, ref_po.data(), ref_pl.data(), ref_out.data(), ref_lse.data());
  EXPECT_LT(rel_l2(out.data(), ref_out.data(), out.size()), 1e-2);
}

// The splits fill one wave of three blocks per SM, never start a second,
// and leave each split ≥ 128 tokens.
TEST(RecordAttnSplits, OneWaveOfThreeBlocksPerSm) {
  KVT_REQUIRE_GPU();
  const int64_t slots = int64_t(cuda::device_info().n_sm) * 3;
  for (const int64_t rows : {int64_t(1), int64_t(8), int64_t(72), int64_t(168), slots, 3 * slots}) {
    for (const int64_t n_tok : {int64_t(100), int64_t(4096), int64_t(131072)}) {
      const int s = cuda::record_attn_splits(rows, n_tok);
      SCOPED_TRACE(::testing::Message() << rows << " rows of " << n_tok << " tokens: " << s << " splits");
      ASSERT_GE(s, 1);
      if (s > 1) {
        EXPECT_LE(s * rows, slots);
        EXPECT_GE(n_tok / s, kRecordSplitTokens);
      }
      EXPECT_TRUE((s + 1) * rows > slots || n_tok / (s + 1) < kRecordSplitTokens);  // none left out
    }
  }
  EXPECT_EQ(cuda::record_attn_splits(72, 4096), int(slots / 72));
}

INSTANTIATE_TEST_SUITE_P(
    Grid, RecordAttnCuda,
    ::testing::Values(Case{"higgs4:g128", 128, 2, 32, 8, 5000, 1040, 5},
                      Case{"higgs4:g128:rs", 128, 3, 12, 3, 700, 333, 2}, Case{"higgs4:g128", 128, 1, 8, 8, 300, 64, 1},
                      Case{"higgs4:g128:rs", 128, 2, 16, 2, 900, 500, 3}, Case{"higgs4:g64", 64, 2, 8, 2, 600, 257, 4},
                      Case{"higgs4:g64:rs", 64, 1, 6, 1, 400, 130, 1}, Case{"higgs4:g128", 128, 1, 40, 8, 200, 17, 8}));

}  // namespace
}  // namespace kvtier
