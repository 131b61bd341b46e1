// svd_gemm.h and copy_rows on the GPU against the CPU versions: the Gram
// matrix accumulated over two chunks, the projection, the row copies.
#include <gtest/gtest.h>

#include <random>

#include "backend/cuda_test_util.h"
#include "ops/gather/copy_rows.h"
#include "ops/gemm/svd_gemm.h"

namespace kvtier {
namespace {
using namespace cuda::testing;

TEST(SvdGemmCuda, GramAndProjectionMatchCpu) {
  KVT_REQUIRE_GPU();
  Device cpu(DeviceKind::cpu), gpu(DeviceKind::cuda);
  std::mt19937 rng(8);
  const int W = 256, rank = 40;
  const int64_t n1 = 300, n2 = 517;
  auto kb = random_bf16(size_t(n1 + n2) * W, rng, -2.f, 2.f);
  const auto kf = bf16_to_f32_vec(kb);
  std::vector<float> g_cpu(size_t(W) * W, 0.f);
  gram_accumulate(cpu.exec(), kf.data(), n1, W, W, g_cpu.data());
  gram_accumulate(cpu.exec(), kf.data() + n1 * W, n2, W, W, g_cpu.data());
  auto d_k = to_device(kb);
  cuda::DeviceBuffer d_g(g_cpu.size() * 4);
  KVT_CUDA_CHECK(cudaMemset(d_g.data(), 0, d_g.bytes()));
  gram_accumulate(gpu.exec(), d_k.data(), n1, W, W, d_g.data<float>());
  gram_accumulate(gpu.exec(), d_k.data<uint16_t>() + n1 * W, n2, W, W, d_g.data<float>());
  sync(gpu.exec());
  const auto g_gpu = to_host<float>(d_g, g_cpu.size());
  EXPECT_LT(rel_l2(g_gpu.data(), g_cpu.data(), g_cpu.size()), 1e-5);
  auto basis = random_bf16(size_t(rank) * W, rng);
  std::vector<uint16_t> p_cpu(size_t(n1 + n2) * rank);
  project_rows(cpu.exec(), kf.data(), n1 + n2, W, W, basis.data(), rank, p_cpu.data());
  auto d_b = to_device(basis);
  cuda::DeviceBuffer d_p(p_cpu.size() * 2);
  project_rows(gpu.exec(), d_k.data(), n1 + n2, W, W, d_b.data<uint16_t>(), rank, d_p.data<uint16_t>());
  sync(gpu.exec());
  const auto pg = bf16_to_f32_vec(to_host<uint16_t>(d_p, p_cpu.size())), pc = bf16_to_f32_vec(p_cpu);
  EXPECT_LT(rel_l2(pg.data(), pc.data(), pc.size()), 8e-3);  // bf16 outputs
}

TEST(SvdGemmCuda, CopyRowsCopiesExactly) {
  KVT_REQUIRE_GPU();
  Device gpu(DeviceKind::cuda);
  std::mt19937 rng(2);
  auto src = random_bf16(4096, rng);
  auto d_src = to_device(src);
  cuda::DeviceBuffer d_dst(8192 * 2);
  poison(d_dst);
  std::vector<const uint8_t*> s;
  std::vector<uint8_t*> d;
  for (int i = 0; i < 20; ++i) {
    s.push_back(d_src.data<uint8_t>() + (i * 37 % 60) * 64);
    d.push_back(d_dst.data<uint8_t>() + i * 128);
  }
  auto ds = to_device(s), dd = to_device(d);
  copy_rows(gpu.exec(), 20, 64, ds.data<const uint8_t* const>(), dd.data<uint8_t* const>());
  sync(gpu.exec());
  const auto got = to_host<uint8_t>(d_dst, 8192 * 2);
  const auto* sb = reinterpret_cast<const uint8_t*>(src.data());
  for (int i = 0; i < 20; ++i)
    for (int b = 0; b < 64; ++b) ASSERT_EQ(got[size_t(i * 128 + b)], sb[(i * 37 % 60) * 64 + b]);
  EXPECT_EQ(got[64], 0xff);  // between rows: untouched
}

}  // namespace
}  // namespace kvtier
