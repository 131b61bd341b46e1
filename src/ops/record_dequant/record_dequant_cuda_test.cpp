// HIGGS host entries on the GPU against the CPU quantizer: record_append's
// records (codes may differ only at rounding ties of the nearest-point
// search) and record_dequant's per-head K/V slices against dequantize() of
// the whole record.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backend/cuda_test_util.h"
#include "ops/kv_append/kv_append.h"
#include "ops/kv_append/kv_append_cuda.h"
#include "ops/quant/hadamard.h"
#include "ops/quant/higgs_grid.h"
#include "ops/quant/quant_format.h"
#include "ops/record_dequant/record_dequant.h"
#include "ops/record_dequant/record_dequant_cuda.h"

namespace kvtier::cuda {
namespace {
using namespace testing;

struct Case {
  std::string spec;
  int n_kv_head;
};

std::vector<uint16_t> random_rows(size_t n_rows, int width, std::mt19937& rng) {
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<uint16_t> x(n_rows * size_t(width));
  for (size_t r = 0; r < n_rows; ++r) {
    const float scale = 0.02f + float(r % 5);
    for (int i = 0; i < width; ++i) x[r * width + i] = f32_to_bf16(scale * g(rng) * (i % 29 == 5 ? 6.f : 1.f));
  }
  return x;
}

DeviceBuffer signs_for(const HiggsRecordLayout& L) {
  std::vector<float> sg(size_t(L.group), 1.f);
  if (L.random_signs) hadamard_signs(L.sign_seed, L.group, sg.data());
  return to_device(sg);
}

class RecordCuda : public ::testing::TestWithParam<Case> {};

TEST_P(RecordCuda, AppendMatchesTheCpuQuantizer) {
  KVT_REQUIRE_GPU();
  const Case c = GetParam();
  const int width = c.n_kv_head * 128;
  ASSERT_EQ(higgs_record_unsupported(c.spec, c.n_kv_head, 128), "");
  const HiggsRecordLayout L = higgs_record_layout(c.spec, width);
  std::mt19937 rng(17);
  const int64_t n_tok = 40, pos0 = 3, cap = 45, stride = L.tok_bytes + 16;
  const auto k = random_rows(size_t(n_tok), width, rng), v = random_rows(size_t(n_tok), width, rng);
  const auto kf = bf16_to_f32_vec(k), vf = bf16_to_f32_vec(v);
  std::vector<uint8_t> ref(size_t(cap * stride), 0x77);
  record_append_ref(c.spec, width, n_tok, pos0, stride, kf.data(), vf.data(), ref.data());
  auto d_k = to_device(k), d_v = to_device(v), d_grid = to_device(higgs_grid(2, 256).points);
  auto d_signs = signs_for(L);
  auto d_dst = to_device(std::vector<uint8_t>(ref.size(), 0x77));
  record_append(L, n_tok, pos0, stride, d_k.data(), d_v.data(), width, d_grid.data<float>(),
                L.random_signs ? d_signs.data<float>() : nullptr, d_dst.data<uint8_t>(), nullptr);
  const auto got = to_host<uint8_t>(d_dst, ref.size());
  int64_t code_diff = 0, other_diff = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (got[i] == ref[i]) continue;
    const int64_t t = int64_t(i) / stride, off = int64_t(i) % stride;
    bool code = false;
    for (int g = 0; g < L.n_group; ++g)
      for (int w = 0; w < 2; ++w)
        code |= off >= L.code_offset(g, w) && off < L.code_offset(g, w) + L.code_bytes;
    code &= t >= pos0 && t < pos0 + n_tok;
    (code ? code_diff : other_diff) += 1;
  }
  const int64_t n_codes = n_tok * 2 * L.meta_offset;
  std::printf("[record_append] %s over %d: %lld of %lld codes differ (ties)\n", c.spec.c_str(), width,
              (long long)code_diff, (long long)n_codes);
  EXPECT_EQ(other_diff, 0) << "scales, padding or bytes outside the new entries differ";
  EXPECT_LE(code_diff, n_codes / 1000);
}

TEST_P(RecordCuda, DequantOfAHeadMatchesTheCpuDequantizer) {
  KVT_REQUIRE_GPU();
  const Case c = GetParam();
  const int H = c.n_kv_head, width = H * 128, k = 9;
  const HiggsRecordLayout L = higgs_record_layout(c.spec, width);
  std::mt19937 rng(23);
  // A slot cache of H rows × k entries (CPU records), slots listed in a shuffled order, some not at all.
  const auto kv = random_rows(size_t(H * k * 2), width, rng);
  const auto kvf = bf16_to_f32_vec(kv);
  // Slot j of row r: token r·k + j's entry as the row's head gathers it.
  std::vector<uint8_t> src(size_t(H * k) * L.entry_bytes), tok(size_t(L.tok_bytes));
  for (int i = 0; i < H * k; ++i) {
    record_append_ref(c.spec, width, 1, 0, L.tok_bytes, kvf.data() + size_t(2 * i) * width,
                      kvf.data() + size_t(2 * i + 1) * width, tok.data());
    const int h = i / k;
    std::memcpy(src.data() + size_t(i) * L.entry_bytes, tok.data() + (L.per_head ? h * L.entry_bytes : 0),
                size_t(L.entry_bytes));
  }
  std::vector<int32_t> idx(size_t(H * k));
  for (int r = 0; r < H; ++r)
    for (int j = 0; j < k; ++j) idx[size_t(r * k + j)] = (j * 4 + r) % k;
  idx[2] = -1;  // slot (2·4 + 0) % 9 = 8 of row 0 stays as it was
  RecordDequantParams p;
  p.n_rows = H;
  p.n_kv_head = H;
  p.k = k;
  p.src_row_stride = k * L.entry_bytes;
  p.dst_row_stride = k * 512 + 64;
  std::vector<uint8_t> ref(size_t(H * p.dst_row_stride), 0xEE);
  record_dequant_ref(c.spec, L, p, src.data(), idx.data(), ref.data());
  auto d_src = to_device(src), d_idx = to_device(idx), d_grid = to_device(higgs_grid(2, 256).points);
  auto d_signs = signs_for(L);
  auto d_dst = to_device(std::vector<uint8_t>(ref.size(), 0xEE));
  record_dequant(L, p, d_src.data<uint8_t>(), d_idx.data<int32_t>(), d_grid.data<float>(),
                 L.random_signs ? d_signs.data<float>() : nullptr, d_dst.data<uint8_t>(), nullptr);
  const auto got = to_host<uint8_t>(d_dst, ref.size());
  int64_t n_val = 0;
  for (int64_t i = 0; i + 1 < int64_t(ref.size()); i += 2) {
    uint16_t a, b;
    std::memcpy(&a, &got[size_t(i)], 2);
    std::memcpy(&b, &ref[size_t(i)], 2);
    if (b == 0xEEEE) {
      ASSERT_EQ(a, b) << "byte " << i << " written outside the listed slots";
      continue;
    }
    ++n_val;
    const float fa = bf16_to_f32(a), fb = bf16_to_f32(b);
    ASSERT_NEAR(fa, fb, 8e-3f * std::abs(fb) + 1e-6f) << c.spec << " byte " << i;  // one bf16 step
  }
  EXPECT_EQ(n_val, int64_t(H * k - 1) * 256);
}

INSTANTIATE_TEST_SUITE_P(Specs, RecordCuda,
                         ::testing::Values(Case{"higgs4", 2}, Case{"higgs4", 8}, Case{"higgs4:g128", 3},
                                           Case{"higgs4:rs", 4}, Case{"higgs4:g256", 4}, Case{"higgs4:g128:rs", 8},
                                           Case{"higgs4", 1}),
                         [](const auto& info) { return "case" + std::to_string(info.index); });

TEST(RecordCuda, UnsupportedSpecsSayWhy) {
  EXPECT_NE(higgs_record_unsupported("higgs2", 8, 128), "");
  EXPECT_NE(higgs_record_unsupported("higgs4", 2, 64), "");
  EXPECT_NE(higgs_record_unsupported("higgs4:g64", 2, 128), "");
  EXPECT_EQ(higgs_record_unsupported("higgs4", 3, 128), "");  // group 128: the largest power of two dividing 384
  // Group 128 is laid out per head: 64 + 64 code bytes, two scales, 144 bytes.
  const HiggsRecordLayout per_head = higgs_record_layout("higgs4:g128", 1024);
  EXPECT_TRUE(per_head.per_head);
  EXPECT_EQ(per_head.entry_bytes, 144);
  EXPECT_EQ(per_head.tok_bytes, 8 * 144);
  const HiggsRecordLayout wide = higgs_record_layout("higgs4", 1024);
  EXPECT_FALSE(wide.per_head);
  EXPECT_EQ(wide.entry_bytes, 1040);
}

}  // namespace
}  // namespace kvtier::cuda
