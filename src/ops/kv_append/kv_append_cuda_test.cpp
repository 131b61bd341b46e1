// The GPU writers of the offload tiers against the CPU store's quantizer:
// higgs2 landmark records (codes may differ only at rounding ties of the
// nearest-point search), FP8 / bf16 host entries (bit-exact), and the chain
// index_append → index_query → index_score against q·dequantize(record) on
// the CPU, which is what the CPU key index ranks by.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backend/cuda_test_util.h"
#include "ops/index_score/index_score_cuda.h"
#include "ops/kv_append/kv_append.h"
#include "ops/kv_append/kv_append_cuda.h"
#include "ops/quant/hadamard.h"
#include "ops/quant/higgs_grid.h"
#include "ops/quant/quant_format.h"

namespace kvtier::cuda {
namespace {
using namespace testing;

// Keys with a spread of norms (as real keys: a few large channels).
std::vector<uint16_t> random_keys(size_t n_vec, int dim, std::mt19937& rng) {
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<uint16_t> k(n_vec * size_t(dim));
  for (size_t v = 0; v < n_vec; ++v) {
    const float scale = 0.05f + 3.f * float(v % 7) / 7.f;
    for (int d = 0; d < dim; ++d) k[v * dim + d] = f32_to_bf16(g(rng) * scale * (d % 17 == 3 ? 8.f : 1.f));
  }
  return k;
}

struct IndexLayout {
  int64_t cap, row_stride, scale_offset;
};
IndexLayout layout(int64_t cap) { return {cap, (cap * 34 + 15) / 16 * 16, 32 * cap}; }

std::vector<float> signs_of(const QuantSpec& s) {
  std::vector<float> sg(128, 1.f);
  if (s.random_signs) hadamard_signs(s.sign_seed, 128, sg.data());
  return sg;
}

class IndexAppendCuda : public ::testing::TestWithParam<std::string> {};

TEST_P(IndexAppendCuda, RecordsMatchTheCpuQuantizer) {
  KVT_REQUIRE_GPU();
  const std::string spec = GetParam();
  const QuantSpec qs = parse_quant_spec(spec);
  ASSERT_TRUE(index_append_supports(spec, 128));
  std::mt19937 rng(7);
  const int H = 3;
  const int64_t n_tok = 700, pos0 = 5;
  const IndexLayout L = layout(pos0 + n_tok + 11);
  const auto k = random_keys(size_t(n_tok * H), 128, rng);
  const auto kf = bf16_to_f32_vec(k);
  std::vector<uint8_t> ref(size_t(H * L.row_stride), 0xA5);
  IndexAppendParams p;
  p.n_kv_head = H;
  p.n_tok = n_tok;
  p.pos0 = pos0;
  p.row_stride = L.row_stride;
  p.scale_offset = L.scale_offset;
  index_append_ref(spec, p, kf.data(), ref.data());

  const HiggsGrid& grid = higgs_grid(4, 256);
  auto d_k = to_device(k);
  auto d_grid = to_device(grid.points);
  auto d_signs = to_device(signs_of(qs));
  auto d_index = to_device(std::vector<uint8_t>(size_t(H * L.row_stride), 0xA5));
  index_append(p, d_k.data(), H * 128, d_grid.data<float>(), qs.random_signs ? d_signs.data<float>() : nullptr,
               d_index.data<uint8_t>(), nullptr);
  const auto got = to_host<uint8_t>(d_index, ref.size());
  int64_t code_diff = 0, scale_diff = 0, other_diff = 0;
  for (int h = 0; h < H; ++h)
    for (int64_t b = 0; b < L.row_stride; ++b) {
      const size_t i = size_t(h * L.row_stride + b);
      if (got[i] == ref[i]) continue;
      const bool code = b >= 32 * pos0 && b < 32 * (pos0 + n_tok);
      const bool scale = b >= L.scale_offset + 2 * pos0 && b < L.scale_offset + 2 * (pos0 + n_tok);
      (code ? code_diff : scale ? scale_diff : other_diff) += 1;
    }
  std::printf("[index_append] %s: %lld of %lld codes differ (ties)\n", spec.c_str(), (long long)code_diff,
              (long long)(n_tok * H * 32));
  EXPECT_EQ(other_diff, 0) << "bytes outside the new records were written";
  EXPECT_EQ(scale_diff, 0);
  EXPECT_LE(code_diff, n_tok * H * 32 / 1000);
}

INSTANTIATE_TEST_SUITE_P(Specs, IndexAppendCuda, ::testing::Values("higgs2:g128", "higgs2", "higgs2:g128:rs"));

TEST(IndexAppendCuda, ScoresRankLikeTheCpuLandmarks) {
  KVT_REQUIRE_GPU();
  // One KV head of a GQA group of 4: the mean query against the landmarks.
  std::mt19937 rng(11);
  const int H = 2, group = 4;
  const int64_t n_tok = 2000;
  const std::string spec = "higgs2:g128";
  const QuantSpec qs = parse_quant_spec(spec);
  const IndexLayout L = layout(n_tok);
  const auto k = random_keys(size_t(n_tok * H), 128, rng);
  const auto kf = bf16_to_f32_vec(k);
  const auto q = random_bf16(size_t(H * group * 128), rng);
  const auto qf = bf16_to_f32_vec(q);
  // CPU: mean over the group of q_h · dequant(record).
  std::vector<uint8_t> rec(34);
  std::vector<float> deq(128), want(size_t(H * n_tok));
  for (int64_t t = 0; t < n_tok; ++t)
    for (int h = 0; h < H; ++h) {
      quantize(qs, kf.data() + (t * H + h) * 128, 1, 128, rec.data());
      dequantize(qs, rec.data(), 1, 128, deq.data());
      double acc = 0;
      for (int j = 0; j < group; ++j)
        for (int d = 0; d < 128; ++d) acc += double(qf[size_t((h * group + j) * 128 + d)]) * deq[size_t(d)];
      want[size_t(h * n_tok + t)] = float(acc / group);
    }
  IndexAppendParams p;
  p.n_kv_head = H;
  p.n_tok = n_tok;
  p.row_stride = L.row_stride;
  p.scale_offset = L.scale_offset;
  auto d_k = to_device(k);
  auto d_grid = to_device(higgs_grid(4, 256).points);
  DeviceBuffer d_index(size_t(H * L.row_stride)), d_qidx(size_t(H * 128 * 4)), d_scores(size_t(H * n_tok * 4));
  auto d_q = to_device(q);
  index_append(p, d_k.data(), H * 128, d_grid.data<float>(), nullptr, d_index.data<uint8_t>(), nullptr);
  index_query(d_q.data(), 1, H * group, H, 128, true, true, nullptr, d_qidx.data<float>(), nullptr);
  IndexScoreParams sp;
  sp.n_kv_head = H;
  sp.n_tok = n_tok;
  sp.row_stride = L.row_stride;
  sp.scale_offset = L.scale_offset;
  index_score(IndexElt::higgs2, sp, d_qidx.data<float>(), d_index.data<uint8_t>(), d_grid.data<float>(),
              d_scores.data<float>(), nullptr);
  const auto got = to_host<float>(d_scores, want.size());
  double scale = 0;
  for (float w : want) scale = std::max(scale, double(std::abs(w)));
  int64_t n_off = 0;  // tokens whose score is off: a code that differs at a tie
  double max_err = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = std::abs(double(got[i]) - want[i]);
    if (e > 1e-4 * scale) ++n_off;
    else max_err = std::max(max_err, e);
  }
  std::printf("[index_append] GPU-built index vs CPU landmarks: %lld of %zu scores off, else max |d| %.2e of %.2e\n",
              (long long)n_off, want.size(), max_err, scale);
  EXPECT_LE(n_off, int64_t(want.size()) / 1000);
}

class EntryAppendCuda : public ::testing::TestWithParam<KvElt> {};

TEST_P(EntryAppendCuda, EntriesMatchTheCpuQuantizerExactly) {
  KVT_REQUIRE_GPU();
  const KvElt elt = GetParam();
  std::mt19937 rng(3);
  const int H = 2, D = 128;
  const int64_t n_tok = 37, pos0 = 3, cap = 50;
  // Includes values past FP8's ±448 (saturate) and tiny ones (subnormals).
  auto k = random_bf16(size_t(n_tok * H * D), rng, -600.f, 600.f);
  auto v = random_bf16(size_t(n_tok * H * D), rng, -0.02f, 0.02f);
  const auto kf = bf16_to_f32_vec(k), vf = bf16_to_f32_vec(v);
  EntryAppendParams p;
  p.n_kv_head = H;
  p.head_dim = D;
  p.n_tok = n_tok;
  p.pos0 = pos0;
  p.elt = elt;
  p.row_stride = kv_entry_bytes(elt, D) + 16;  // a gap between heads stays untouched
  p.tok_stride = H * p.row_stride;
  std::vector<uint8_t> ref(size_t(cap * p.tok_stride), 0x5A);
  entry_append_ref(p, kf.data(), vf.data(), ref.data());
  cuda::PinnedBuffer host(ref.size());  // written through the mapped pointer, as the host tier is
  std::memset(host.host(), 0x5A, ref.size());
  auto d_k = to_device(k), d_v = to_device(v);
  entry_append(p, d_k.data(), d_v.data(), H * D, host.device_ptr<uint8_t>(), nullptr);
  KVT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(std::memcmp(host.host(), ref.data(), ref.size()), 0);
}

INSTANTIATE_TEST_SUITE_P(Elts, EntryAppendCuda, ::testing::Values(KvElt::fp8, KvElt::bf16));

}  // namespace
}  // namespace kvtier::cuda
