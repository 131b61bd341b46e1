// The reference itself (it is the specification the CUDA kernel is tested
// against): the product is A·B per head, RoPE is the model's, -1 entries and
// row padding are left alone, token ids outside A are an error.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/half.h"
#include "core/status.h"
#include "ops/lowrank_k/lowrank_k.h"
#include "ops/rope/rope.h"

namespace kvtier {
namespace {

TEST(LowrankKRef, IsTheRopedProductOfTheFactors) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  LowrankKParams p;
  p.n_seq = 2;
  p.n_kv_head = 3;
  p.head_dim = 16;
  p.rank = 5;
  p.k = 4;
  p.n_ctx = 40000;
  p.a_seq_stride = p.n_ctx * p.rank + 3;
  p.b_seq_stride = int64_t(p.rank) * p.n_kv_head * p.head_dim + 5;
  p.out_row_stride = int64_t(p.k) * p.head_dim + 2;
  const int64_t width = int64_t(p.n_kv_head) * p.head_dim, n_rows = int64_t(p.n_seq) * p.n_kv_head;
  std::vector<uint16_t> a(size_t(p.n_seq * p.a_seq_stride)), b(size_t(p.n_seq * p.b_seq_stride));
  for (auto& x : a) x = f32_to_bf16(u(rng));
  for (auto& x : b) x = f32_to_bf16(u(rng));
  std::vector<int32_t> idx(size_t(n_rows * p.k));
  for (int64_t r = 0; r < n_rows; ++r) {
    const int32_t row_idx[4] = {-1, int32_t(r), 1000 + int32_t(r), 39999};
    std::copy(row_idx, row_idx + 4, idx.begin() + r * p.k);
  }
  ModelConfig cfg;
  cfg.head_dim = p.head_dim;
  cfg.rope_theta = 500000.f;
  const Rope rope(cfg);
  std::vector<float> out(size_t(n_rows * p.out_row_stride), -7.f);
  lowrank_k_ref(p, a.data(), b.data(), idx.data(), rope.inv_freq().data(), out.data());
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t seq = r / p.n_kv_head, g = r % p.n_kv_head;
    for (int i = 0; i < p.k; ++i) {
      const int32_t t = idx[size_t(r * p.k + i)];
      const float* o = out.data() + r * p.out_row_stride + i * p.head_dim;
      if (t < 0) {
        for (int d = 0; d < p.head_dim; ++d) EXPECT_EQ(o[d], -7.f);
        continue;
      }
      std::vector<float> want(size_t(p.head_dim));
      for (int d = 0; d < p.head_dim; ++d) {
        double s = 0;
        for (int j = 0; j < p.rank; ++j)
          s += double(bf16_to_f32(a[size_t(seq * p.a_seq_stride + t * p.rank + j)])) *
               double(bf16_to_f32(b[size_t(seq * p.b_seq_stride + j * width + g * p.head_dim + d)]));
        want[size_t(d)] = float(s);
      }
      const int64_t pos = t;
      rope.apply_ref(want.data(), 1, 1, &pos);
      for (int d = 0; d < p.head_dim; ++d) EXPECT_NEAR(o[d], want[size_t(d)], 1e-5) << "row " << r << " token " << t;
    }
    for (int64_t e = int64_t(p.k) * p.head_dim; e < p.out_row_stride; ++e)
      EXPECT_EQ(out[size_t(r * p.out_row_stride + e)], -7.f);
  }
  idx[1] = int32_t(p.n_ctx);
  EXPECT_THROW(lowrank_k_ref(p, a.data(), b.data(), idx.data(), nullptr, out.data()), Error);
}

}  // namespace
}  // namespace kvtier
