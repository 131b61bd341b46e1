#include <gtest/gtest.h>

#include <random>

#include "backend/cuda_test_util.h"
#include "ops/rope/qkv_split_cuda.h"
#include "ops/rope/rope.h"
#include "ops/rope/rope_cuda.h"

namespace kvtier::cuda {
namespace {
using namespace testing;

// qkv_split against its specification: the stacked product's sections
// copied out, then rope() on q and k (the same bf16, bit for bit), and
// against the CPU's Rope on the sections (f32); without positions, plain
// copies and k untouched. Both pairings, Llama-3 scaling, a GQA layout.
TEST(QkvSplitCuda, CopiesTheSectionsAndRotatesLikeRope) {
  KVT_REQUIRE_GPU();
  std::mt19937 rng(8);
  const int hd = 128, n_head = 6, n_kv = 2, q_dim = n_head * hd, kv_dim = n_kv * hd, width = q_dim + 2 * kv_dim;
  const int64_t n_tok = 5;
  const std::vector<int64_t> pos = {0, 3, 4096, 65537, 131071};
  for (bool inter : {false, true}) {
    ModelConfig cfg;
    cfg.head_dim = hd;
    cfg.rope_theta = 500000.f;
    cfg.rope_interleaved = inter;
    cfg.rope_scaling = RopeScaling::llama3;
    cfg.rope_factor = 8.f;
    const Rope rope_cpu(cfg);
    auto qkv = random_bf16(size_t(n_tok) * width, rng);
    auto section = [&](int at, int n) {
      std::vector<uint16_t> s(size_t(n_tok) * n);
      for (int64_t t = 0; t < n_tok; ++t) std::copy_n(qkv.begin() + t * width + at, n, s.begin() + t * n);
      return s;
    };
    const auto q0 = section(0, q_dim), k0 = section(q_dim, kv_dim), v0 = section(q_dim + kv_dim, kv_dim);
    auto d_qkv = to_device(qkv), d_pos = to_device(pos), d_freq = to_device(rope_cpu.inv_freq());
    // The specification on the GPU: the sections, then rope().
    auto e_q = to_device(q0), e_k = to_device(k0);
    rope(e_q.data(), n_tok, q_dim, n_head, hd, d_pos.data<int64_t>(), d_freq.data<float>(), inter, nullptr);
    rope(e_k.data(), n_tok, kv_dim, n_kv, hd, d_pos.data<int64_t>(), d_freq.data<float>(), inter, nullptr);
    for (bool with_rope : {true, false}) {
      DeviceBuffer q(q0.size() * 2), kp(k0.size() * 2), v(v0.size() * 2), k(k0.size() * 2);
      for (DeviceBuffer* b : {&q, &kp, &v, &k}) poison(*b);
      qkv_split(d_qkv.data(), n_tok, q_dim, kv_dim, hd, q.data(), kp.data(), v.data(), k.data(),
                with_rope ? d_pos.data<int64_t>() : nullptr, d_freq.data<float>(), inter, nullptr);
      const auto gq = to_host<uint16_t>(q, q0.size()), gkp = to_host<uint16_t>(kp, k0.size());
      const auto gv = to_host<uint16_t>(v, v0.size()), gk = to_host<uint16_t>(k, k0.size());
      EXPECT_EQ(gkp, k0);
      EXPECT_EQ(gv, v0);
      if (!with_rope) {
        EXPECT_EQ(gq, q0);
        EXPECT_EQ(gk, std::vector<uint16_t>(k0.size(), 0xffff)) << "k untouched";
        continue;
      }
      EXPECT_EQ(gq, to_host<uint16_t>(e_q, q0.size())) << "interleaved " << inter;
      EXPECT_EQ(gk, to_host<uint16_t>(e_k, k0.size())) << "interleaved " << inter;
      // And the CPU's rotation of the same values, in f32.
      std::vector<float> rq = bf16_to_f32_vec(q0), rk = bf16_to_f32_vec(k0);
      rope_cpu.apply_ref(rq.data(), n_tok, n_head, pos.data());
      rope_cpu.apply_ref(rk.data(), n_tok, n_kv, pos.data());
      const auto fq = bf16_to_f32_vec(gq), fk = bf16_to_f32_vec(gk);
      EXPECT_LT(rel_l2(fq.data(), rq.data(), fq.size()), 5e-3);
      EXPECT_LT(rel_l2(fk.data(), rk.data(), fk.size()), 5e-3);
    }
  }
}

}  // namespace
}  // namespace kvtier::cuda
