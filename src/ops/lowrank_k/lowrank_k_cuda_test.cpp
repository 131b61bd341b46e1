#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "backend/cuda_test_util.h"
#include "ops/lowrank_k/lowrank_k.h"
#include "ops/lowrank_k/lowrank_k_cuda.h"
#include "ops/rope/rope.h"

namespace kvtier::cuda {
namespace {
using namespace testing;

constexpr uint16_t kGuard = 0x7fa5;  // a bf16 NaN: no written key takes it

// Ascending distinct token ids per row (selections are sorted), with a few -1
// holes when asked.
std::vector<int32_t> selection(int64_t n_rows, int64_t n_ctx, int k, bool holes, std::mt19937& rng) {
  std::vector<int32_t> idx(size_t(n_rows * k)), all(static_cast<size_t>(n_ctx));
  std::iota(all.begin(), all.end(), 0);
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int i = 0; i < k; ++i) std::swap(all[size_t(i)], all[size_t(i) + rng() % size_t(n_ctx - i)]);
    std::vector<int32_t> pick(all.begin(), all.begin() + k);
    if (holes)
      for (int i = 0; i < k; i += 7) pick[size_t(i)] = -1;
    std::sort(pick.begin(), pick.end());
    std::copy(pick.begin(), pick.end(), idx.begin() + r * k);
  }
  return idx;
}

struct Inputs {
  LowrankKParams p;
  std::vector<uint16_t> a, b;  // bf16 bits
  std::vector<int32_t> idx;
};

Inputs make_inputs(int n_seq, int n_kv_head, int head_dim, int rank, int64_t n_ctx, int k, bool holes,
                   std::mt19937& rng) {
  Inputs in;
  LowrankKParams& p = in.p;
  p.n_seq = n_seq;
  p.n_kv_head = n_kv_head;
  p.head_dim = head_dim;
  p.rank = rank;
  p.k = k;
  p.n_ctx = n_ctx;
  // Padding between sequences and rows, so that wrong strides show.
  p.a_seq_stride = n_ctx * rank + 8;
  p.b_seq_stride = int64_t(rank) * n_kv_head * head_dim + 16;
  p.out_row_stride = int64_t(k) * head_dim + 8;
  in.a = random_bf16(size_t(n_seq * p.a_seq_stride), rng);
  // ±√(3/rank): keys of unit variance, as U·S·Vᵀ of real keys roughly are.
  const float bs = std::sqrt(3.f / float(rank));
  in.b = random_bf16(size_t(n_seq * p.b_seq_stride), rng, -bs, bs);
  in.idx = selection(int64_t(n_seq) * n_kv_head, n_ctx, k, holes, rng);
  return in;
}

// Runs the kernel into a guard-filled buffer; returns all of it.
std::vector<uint16_t> run_gpu(const Inputs& in, const float* d_inv_freq) {
  const size_t n_out = size_t(int64_t(in.p.n_seq) * in.p.n_kv_head * in.p.out_row_stride);
  auto d_a = to_device(in.a), d_b = to_device(in.b), d_idx = to_device(in.idx);
  auto d_out = to_device(std::vector<uint16_t>(n_out, kGuard));
  lowrank_k(in.p, d_a.data(), d_b.data(), d_idx.data<int32_t>(), d_inv_freq, d_out.data(), nullptr);
  return to_host<uint16_t>(d_out, n_out);
}

struct Case {
  int n_seq, n_kv_head, head_dim, rank;
  int64_t n_ctx;
  int k;
  bool rope, interleaved, holes;
};

class LowrankKCuda : public ::testing::TestWithParam<Case> {};

TEST_P(LowrankKCuda, MatchesReference) {
  KVT_REQUIRE_GPU();
  const Case c = GetParam();
  std::mt19937 rng(11 + c.rank + c.k);
  Inputs in = make_inputs(c.n_seq, c.n_kv_head, c.head_dim, c.rank, c.n_ctx, c.k, c.holes, rng);
  in.p.interleaved = c.interleaved;
  std::vector<float> inv(size_t(c.head_dim / 2));
  for (int i = 0; i < c.head_dim / 2; ++i) inv[size_t(i)] = float(std::pow(500000.0, -2.0 * i / c.head_dim));
  auto d_inv = to_device(inv);
  const auto got = run_gpu(in, c.rope ? d_inv.data<float>() : nullptr);
  std::vector<float> ref(got.size(), 0.f);
  lowrank_k_ref(in.p, in.a.data(), in.b.data(), in.idx.data(), c.rope ? inv.data() : nullptr, ref.data());

  // Written entries: close to the reference (one bf16 rounding of an f32
  // result); every other element (holes, row padding) still holds the guard.
  std::vector<float> g, rf;
  const int64_t n_rows = int64_t(c.n_seq) * c.n_kv_head;
  for (int64_t r = 0; r < n_rows; ++r)
    for (int64_t e = 0; e < in.p.out_row_stride; ++e) {
      const size_t o = size_t(r * in.p.out_row_stride + e);
      const int64_t i = e / c.head_dim;
      if (i < c.k && in.idx[size_t(r * c.k + i)] >= 0) {
        g.push_back(bf16_to_f32(got[o]));
        rf.push_back(ref[o]);
      } else {
        ASSERT_EQ(got[o], kGuard) << "row " << r << " element " << e << " written";
      }
    }
  ASSERT_FALSE(g.empty());
  double rms = 0;
  for (float x : rf) rms += double(x) * x;
  rms = std::sqrt(rms / double(rf.size()));
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_LE(std::abs(double(g[i]) - rf[i]), std::abs(rf[i]) / 256.0 + 1e-4 * rms)
        << "element " << i << ": got " << g[i] << ", reference " << rf[i];
  EXPECT_LT(rel_l2(g.data(), rf.data(), g.size()), 3e-3);
}

INSTANTIATE_TEST_SUITE_P(
    Grid, LowrankKCuda,
    ::testing::Values(Case{1, 8, 128, 160, 4096, 2048, true, false, false},    // ShadowKV on Llama-3.1-8B
                      Case{2, 4, 128, 150, 1000, 100, true, false, true},      // rank % 8 != 0: element loads
                      Case{3, 2, 64, 24, 300, 65, true, true, true},           // head_dim 64, rank < one slab
                      Case{1, 8, 128, 1024, 2000, 130, false, false, false},   // full rank, no RoPE
                      Case{2, 8, 128, 8, 500, 7, true, false, false},          // one partial tile
                      Case{2, 3, 128, 37, 3000, 256, true, true, false},       // odd rank, 3 KV heads
                      Case{1, 2, 128, 160, 140000, 200, true, false, true}));  // positions past 128K

// The fused RoPE is the model's: rotating the un-rotated keys with ops/rope's
// Llama-3.1-scaled table on the CPU gives the same keys, and position 0 is
// the identity.
TEST(LowrankKCudaRope, MatchesTheModelsRope) {
  KVT_REQUIRE_GPU();
  std::mt19937 rng(21);
  ModelConfig cfg;
  cfg.head_dim = 128;
  cfg.rope_theta = 500000.f;
  cfg.rope_scaling = RopeScaling::llama3;
  cfg.rope_factor = 8.f;
  const Rope rope_cpu(cfg);
  const int n_kv_head = 2, rank = 48;
  Inputs in = make_inputs(1, n_kv_head, 128, rank, 200001, 8, false, rng);
  const std::vector<int32_t> pos = {0, 1, 17, 4095, 65537, 131071, 131072, 200000};
  for (int h = 0; h < n_kv_head; ++h) std::copy(pos.begin(), pos.end(), in.idx.begin() + h * 8);
  auto d_inv = to_device(rope_cpu.inv_freq());
  const auto roped = run_gpu(in, d_inv.data<float>());
  const auto pre = run_gpu(in, nullptr);
  // [k tokens, n_kv_head, 128] f32 for Rope::apply_ref
  std::vector<float> want(size_t(8 * n_kv_head * 128)), got(want.size());
  std::vector<int64_t> pos64(pos.begin(), pos.end());
  for (int h = 0; h < n_kv_head; ++h)
    for (int i = 0; i < 8; ++i)
      for (int d = 0; d < 128; ++d) {
        const size_t o = size_t(h * in.p.out_row_stride + i * 128 + d);
        want[size_t((i * n_kv_head + h) * 128 + d)] = bf16_to_f32(pre[o]);
        got[size_t((i * n_kv_head + h) * 128 + d)] = bf16_to_f32(roped[o]);
        if (i == 0) {
          ASSERT_EQ(roped[o], pre[o]) << "position 0 must not rotate (head " << h << ", dim " << d << ")";
        }
      }
  rope_cpu.apply_ref(want.data(), 8, n_kv_head, pos64.data());
  EXPECT_LT(rel_l2(got.data(), want.data(), got.size()), 5e-3);
}

}  // namespace
}  // namespace kvtier::cuda
