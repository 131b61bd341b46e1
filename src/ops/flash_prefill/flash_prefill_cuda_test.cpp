#include <gtest/gtest.h>

#include <random>

#include "backend/cuda_test_util.h"
#include "ops/attention/attention.h"
#include "ops/flash_prefill/flash_prefill_cuda.h"

namespace kvtier::cuda {
namespace {
using namespace testing;

void check(int n_head, int n_kv_head, int64_t n_q, int64_t n_kv, int hd = 128) {
  std::mt19937 rng(uint32_t(n_q * 7 + n_kv + hd));
  auto q = random_bf16(size_t(n_q * n_head * hd), rng, -2.f, 2.f);
  auto k = random_bf16(size_t(n_kv * n_kv_head * hd), rng, -2.f, 2.f);
  auto v = random_bf16(size_t(n_kv * n_kv_head * hd), rng);
  AttentionParams ap{n_head, n_kv_head, hd, 1.f / std::sqrt(float(hd))};
  std::vector<float> ref(q.size());
  auto qf = bf16_to_f32_vec(q), kf = bf16_to_f32_vec(k), vf = bf16_to_f32_vec(v);
  attention_causal_ref(ap, qf.data(), int(n_q), kf.data(), vf.data(), n_kv, ref.data());
  auto dq = to_device(q), dk = to_device(k), dv = to_device(v);
  DeviceBuffer dout(q.size() * 2);
  poison(dout);
  FlashPrefillParams p;
  p.n_head = n_head;
  p.n_kv_head = n_kv_head;
  p.head_dim = hd;
  p.scale = ap.scale;
  p.n_q = n_q;
  p.n_kv = n_kv;
  p.q_tok_stride = n_head * hd;
  p.kv_tok_stride = n_kv_head * hd;
  flash_prefill(p, dq.data(), dk.data(), dv.data(), dout.data(), nullptr);
  auto got = bf16_to_f32_vec(to_host<uint16_t>(dout, q.size()));
  EXPECT_LT(rel_l2(got.data(), ref.data(), ref.size()), 1e-2) << n_q << " " << n_kv << " hd " << hd;
}

TEST(FlashPrefillCuda, MatchesCausalReferenceOnGrid) {
  KVT_REQUIRE_GPU();
  check(4, 2, 1, 1);
  check(4, 1, 64, 64);
  check(8, 2, 100, 100);
  check(8, 8, 130, 300);  // a chunk after a cached prefix
  check(32, 8, 257, 257);
  check(6, 3, 33, 1000);
}

TEST(FlashPrefillCuda, HeadDim64MatchesCausalReference) {
  KVT_REQUIRE_GPU();
  check(4, 2, 1, 1, 64);
  check(9, 3, 64, 64, 64);  // SmolLM2-135M's heads
  check(8, 2, 100, 100, 64);
  check(9, 3, 130, 300, 64);
  check(8, 8, 257, 257, 64);
}

}  // namespace
}  // namespace kvtier::cuda
