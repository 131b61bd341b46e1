#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <thread>

#include "backend/cuda_test_util.h"
#include "ops/attention/attention.h"
#include "ops/flash_prefill/flash_prefill_cuda.h"

namespace kvtier::cuda {
namespace {
using namespace testing;

constexpr uint16_t kPoison = 0xffff;  // what poison() leaves in a bf16

struct Case {
  int n_head, n_kv_head;
  int64_t n_q, n_kv;
  int hd = 128;
  float q_range = 2.f;  // |q| bound: larger makes the softmax sharper
  bool fused = false;   // q, k, v interleaved in one [n, (n_head + 2 n_kv_head) hd] buffer, as the model has them
};

// attention_causal_ref over row blocks on all cores: rows [i0, i1) are the
// last rows of a problem with n_kv - n_q + i1 keys.
void causal_ref_parallel(const AttentionParams& ap, const float* q, int64_t n_q, const float* k, const float* v,
                         int64_t n_kv, float* out) {
  const int n_threads = int(std::max(1u, std::min(32u, std::thread::hardware_concurrency())));
  const int64_t rows = (n_q + n_threads - 1) / n_threads;
  const int64_t w = int64_t(ap.n_head) * ap.head_dim;
  std::vector<std::thread> pool;
  for (int64_t i0 = 0; i0 < n_q; i0 += rows) {
    const int64_t i1 = std::min(n_q, i0 + rows);
    pool.emplace_back([=] {
      attention_causal_ref(ap, q + i0 * w, int(i1 - i0), k, v, n_kv - n_q + i1, out + i0 * w);
    });
  }
  for (auto& t : pool) t.join();
}

std::string describe(const Case& c, FlashPrefillKernel kernel) {
  return fmt::format("{} heads {}/{} n_q {} n_kv {} hd {} q±{}{}", flash_prefill_kernel_name(kernel), c.n_head,
                     c.n_kv_head, c.n_q, c.n_kv, c.hd, c.q_range, c.fused ? " fused" : "");
}

// Runs `kernel` on random bf16 inputs and compares with attention_causal_ref
// (f64) on the same rounded values: rel-L2 within bf16 tolerance, every
// output finite, and the guard bands (columns past the heads in a padded
// output row, two rows past n_q) still poisoned. Runs twice: the outputs must
// be bit-identical (a race shows as a difference).
void check(FlashPrefillKernel kernel, const Case& c) {
  const int hd = c.hd;
  const int64_t q_width = int64_t(c.n_head) * hd, kv_width = int64_t(c.n_kv_head) * hd;
  std::mt19937 rng(uint32_t(c.n_q * 7 + c.n_kv * 13 + hd + c.n_head));
  auto q = random_bf16(size_t(c.n_q * q_width), rng, -c.q_range, c.q_range);  // [n_q, n_head, hd]
  auto k = random_bf16(size_t(c.n_kv * kv_width), rng, -2.f, 2.f);            // [n_kv, n_kv_head, hd]
  auto v = random_bf16(size_t(c.n_kv * kv_width), rng);                       // [n_kv, n_kv_head, hd]
  AttentionParams ap{c.n_head, c.n_kv_head, hd, 1.f / std::sqrt(float(hd))};
  std::vector<float> ref(q.size());
  {
    auto qf = bf16_to_f32_vec(q), kf = bf16_to_f32_vec(k), vf = bf16_to_f32_vec(v);
    causal_ref_parallel(ap, qf.data(), c.n_q, kf.data(), vf.data(), c.n_kv, ref.data());
  }

  FlashPrefillParams p;
  p.n_head = c.n_head;
  p.n_kv_head = c.n_kv_head;
  p.head_dim = hd;
  p.scale = ap.scale;
  p.n_q = c.n_q;
  p.n_kv = c.n_kv;
  p.kernel = kernel;
  p.out_tok_stride = q_width + 64;  // guard band after each row's heads
  const int64_t out_rows = c.n_q + 2;
  std::vector<uint16_t> dev_in;  // what goes to the device: separate q | k | v, or one fused buffer
  int64_t q_off = 0, k_off = 0, v_off = 0;
  if (c.fused) {
    EXPECT_EQ(c.n_q, c.n_kv) << "a fused buffer holds q, k and v of the same tokens";
    const int64_t w = q_width + 2 * kv_width;  // [n, w]: q | k | v per token
    dev_in.assign(size_t(c.n_kv * w), 0);
    for (int64_t t = 0; t < c.n_kv; ++t) {
      std::copy_n(&q[size_t(t * q_width)], q_width, &dev_in[size_t(t * w)]);
      std::copy_n(&k[size_t(t * kv_width)], kv_width, &dev_in[size_t(t * w + q_width)]);
      std::copy_n(&v[size_t(t * kv_width)], kv_width, &dev_in[size_t(t * w + q_width + kv_width)]);
    }
    p.q_tok_stride = p.kv_tok_stride = w;
    k_off = q_width;
    v_off = q_width + kv_width;
  } else {
    // q rows padded by 8 elements (a stride that is not the width), k and v dense.
    const int64_t qs = q_width + 8;
    dev_in.assign(size_t(c.n_q * qs + 2 * c.n_kv * kv_width), 0);
    for (int64_t t = 0; t < c.n_q; ++t) std::copy_n(&q[size_t(t * q_width)], q_width, &dev_in[size_t(t * qs)]);
    k_off = c.n_q * qs;
    v_off = k_off + c.n_kv * kv_width;
    std::copy(k.begin(), k.end(), dev_in.begin() + k_off);
    std::copy(v.begin(), v.end(), dev_in.begin() + v_off);
    p.q_tok_stride = qs;
    p.kv_tok_stride = kv_width;
  }
  auto din = to_device(dev_in);
  const auto* base = din.data<uint16_t>();
  const size_t n_out = size_t(out_rows * p.out_tok_stride);
  std::vector<uint16_t> got[2];
  for (auto& g : got) {
    DeviceBuffer dout(n_out * 2);
    poison(dout);
    flash_prefill(p, base + q_off, base + k_off, base + v_off, dout.data(), nullptr);
    KVT_CUDA_CHECK(cudaGetLastError());
    g = to_host<uint16_t>(dout, n_out);
  }
  const std::string what = describe(c, kernel);
  EXPECT_TRUE(got[0] == got[1]) << what << ": two runs differ";

  std::vector<float> out(q.size());
  int64_t guard_written = 0;
  for (int64_t r = 0; r < out_rows; ++r)
    for (int64_t i = 0; i < p.out_tok_stride; ++i) {
      const uint16_t x = got[0][size_t(r * p.out_tok_stride + i)];
      if (r < c.n_q && i < q_width)
        out[size_t(r * q_width + i)] = bf16_to_f32(x);
      else if (x != kPoison)
        ++guard_written;
    }
  EXPECT_EQ(guard_written, 0) << what << ": wrote outside the output";
  const double err = rel_l2(out.data(), ref.data(), ref.size());  // infinite when any value is not finite
  EXPECT_LT(err, 1e-2) << what;
}

// Lengths around the tile sizes (64 and 128), a chunk after a longer prefix
// (n_q < n_kv), GQA groups 1, 4 and 8.
std::vector<Case> grid() {
  return {
      {4, 1, 1, 1},       {4, 4, 2, 2},       {8, 2, 64, 64},     {8, 1, 127, 127},     {4, 1, 128, 128},
      {8, 8, 129, 129},   {32, 8, 257, 257},  {8, 1, 300, 300},   {4, 1, 1000, 1000},   {4, 4, 1, 1000},
      {8, 2, 33, 1000},   {4, 1, 128, 256},   {8, 8, 130, 300},   {8, 1, 129, 700},     {4, 4, 200, 777},
      {8, 1, 64, 129},    {4, 1, 127, 1025},  {6, 3, 33, 1000},   {8, 8, 100, 100, 128, 8.f},  // sharp softmax
      {8, 1, 200, 1000, 128, 8.f},            {32, 8, 300, 300, 128, 2.f, true},                // the model's layout
      {8, 1, 1536, 1536}, {8, 1, 300, 3000},
  };
}

void run_grid(FlashPrefillKernel kernel) {
  for (const Case& c : grid()) check(kernel, c);
}

bool hopper_available() { return flash_prefill_kernel_available(FlashPrefillKernel::wgmma, 128); }

TEST(FlashPrefillCuda, MmaSyncMatchesCausalReference) {
  KVT_REQUIRE_GPU();
  run_grid(FlashPrefillKernel::mma_sync);
}

TEST(FlashPrefillCuda, MmaSyncHeadDim64MatchesCausalReference) {
  KVT_REQUIRE_GPU();
  for (const Case& c : std::vector<Case>{{4, 2, 1, 1, 64},
                                         {9, 3, 64, 64, 64},  // SmolLM2-135M's heads
                                         {8, 2, 100, 100, 64},
                                         {9, 3, 130, 300, 64},
                                         {8, 8, 257, 257, 64},
                                         {9, 3, 300, 300, 64, 2.f, true}})
    check(FlashPrefillKernel::mma_sync, c);
}

TEST(FlashPrefillCuda, WgmmaMatchesCausalReference) {
  KVT_REQUIRE_GPU();
  if (!hopper_available()) GTEST_SKIP() << "the Hopper kernel needs a compute capability 9.0 GPU and an sm_90a build";
  run_grid(FlashPrefillKernel::wgmma);
}

TEST(FlashPrefillCuda, WgmmaSerialMatchesCausalReference) {
  KVT_REQUIRE_GPU();
  if (!hopper_available()) GTEST_SKIP() << "the Hopper kernel needs a compute capability 9.0 GPU and an sm_90a build";
  run_grid(FlashPrefillKernel::wgmma_serial);
}

// automatic picks the Hopper kernel exactly where it can run; a request the
// device or the shape cannot serve is refused with a message.
TEST(FlashPrefillCuda, DispatchAndRefusals) {
  KVT_REQUIRE_GPU();
  const bool hopper = hopper_available();
  EXPECT_EQ(flash_prefill_resolve(FlashPrefillKernel::automatic, 128),
            hopper ? FlashPrefillKernel::wgmma : FlashPrefillKernel::mma_sync);
  EXPECT_EQ(flash_prefill_resolve(FlashPrefillKernel::automatic, 64), FlashPrefillKernel::mma_sync);
  EXPECT_FALSE(flash_prefill_kernel_available(FlashPrefillKernel::wgmma, 64));
  DeviceBuffer buf(size_t(64) * 4 * 64 * 2);
  FlashPrefillParams p;
  p.n_head = p.n_kv_head = 1;
  p.head_dim = 64;
  p.scale = 0.125f;
  p.n_q = p.n_kv = 16;
  p.q_tok_stride = p.kv_tok_stride = 64;
  p.kernel = FlashPrefillKernel::wgmma;
  EXPECT_THROW(flash_prefill(p, buf.data(), buf.data(), buf.data(), buf.data(), nullptr), std::runtime_error);
  p.kernel = FlashPrefillKernel::automatic;
  p.n_q = 17;  // more queries than keys
  EXPECT_THROW(flash_prefill(p, buf.data(), buf.data(), buf.data(), buf.data(), nullptr), std::runtime_error);
}

}  // namespace
}  // namespace kvtier::cuda
