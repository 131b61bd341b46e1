#include "ops/gemm/gemm_fp8_cuda.h"

#include <gtest/gtest.h>

#include <random>

#include "backend/cuda_test_util.h"
#include "ops/gemm/gemm_cuda.h"
#include "ops/gemm/gemm_fp8.h"

namespace kvtier::cuda {
namespace {
using namespace testing;

// The GPU quantizer is the reference bit for bit: codes and scales, strided
// rows, a zero row and an outlier row included.
TEST(GemmFp8Cuda, QuantizeRowsMatchesReferenceExactly) {
  KVT_REQUIRE_GPU();
  std::mt19937 rng(21);
  for (auto [rows, cols, ld] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 8, 8}, {5, 4096, 4096}, {3, 14336, 14336}, {7, 600, 640}, {2, 20000, 20000}}) {
    auto x = random_bf16(size_t(rows * ld), rng, -4.f, 4.f);
    for (int64_t c = 0; c < ld; ++c) x[size_t(c)] = 0;  // row 0: all zero
    if (rows > 2) x[size_t(2 * ld + 3)] = f32_to_bf16(-3e4f);
    const auto xf = bf16_to_f32_vec(x);
    std::vector<uint8_t> q_ref(size_t(rows * cols));
    std::vector<float> s_ref(static_cast<size_t>(rows));
    quantize_rows_fp8_ref(xf.data(), rows, cols, ld, q_ref.data(), s_ref.data());
    auto dx = to_device(x);
    DeviceBuffer dq(size_t(rows * cols)), ds(size_t(rows) * 4);
    poison(dq);
    poison(ds);
    quantize_rows_fp8(dx.data(), rows, cols, ld, dq.data<uint8_t>(), ds.data<float>(), nullptr);
    EXPECT_EQ(to_host<uint8_t>(dq, q_ref.size()), q_ref) << rows << "x" << cols << " ld " << ld;
    EXPECT_EQ(to_host<float>(ds, s_ref.size()), s_ref) << rows << "x" << cols << " ld " << ld;
  }
  DeviceBuffer d(64);
  EXPECT_THROW(quantize_rows_fp8(d.data(), 1, 12, 0, d.data<uint8_t>(), d.data<float>(), nullptr), Error);
}

// The FP8 product with per-row scales (cuBLASLt's product of the codes, then
// the scales) against the reference over the same codes (only f32
// accumulation order and two bf16 roundings differ), and against the exact
// bf16 product (FP8 rounding).
TEST(GemmFp8Cuda, ProductMatchesReference) {
  KVT_REQUIRE_GPU();
  std::mt19937 rng(22);
  Gemm gemm;
  for (auto [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 256, 128}, {3, 1000, 576}, {64, 512, 4096}, {129, 96, 64}, {300, 1024, 1024}}) {
    auto x = random_bf16(size_t(m * k), rng, -2.f, 2.f), w = random_bf16(size_t(n * k), rng, -0.1f, 0.1f);
    const auto xf = bf16_to_f32_vec(x), wf = bf16_to_f32_vec(w);
    std::vector<uint8_t> xq(x.size()), wq(w.size());
    std::vector<float> xs(static_cast<size_t>(m)), ws(static_cast<size_t>(n)), ref(static_cast<size_t>(m * n)),
        exact(static_cast<size_t>(m * n));
    quantize_rows_fp8_ref(xf.data(), m, k, 0, xq.data(), xs.data());
    quantize_rows_fp8_ref(wf.data(), n, k, 0, wq.data(), ws.data());
    gemm_fp8_ref(m, n, k, xq.data(), xs.data(), wq.data(), ws.data(), ref.data());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t c = 0; c < k; ++c) acc += double(xf[size_t(i * k + c)]) * wf[size_t(j * k + c)];
        exact[size_t(i * n + j)] = float(acc);
      }
    auto dxq = to_device(xq), dwq = to_device(wq), dxs = to_device(xs), dws = to_device(ws);
    DeviceBuffer dy(size_t(m * n) * 2);
    poison(dy);
    gemm_fp8(gemm, m, n, k, dxq.data<uint8_t>(), dxs.data<float>(), dwq.data<uint8_t>(), dws.data<float>(), dy.data(),
             nullptr);
    auto y = bf16_to_f32_vec(to_host<uint16_t>(dy, size_t(m * n)));
    EXPECT_LT(rel_l2(y.data(), ref.data(), y.size()), 5e-3) << m << "x" << n << "x" << k;
    const double err = rel_l2(y.data(), exact.data(), y.size());
    EXPECT_LT(err, 6e-2) << m << "x" << n << "x" << k;
    EXPECT_GT(err, 1e-3) << "the FP8 rounding must show: " << m << "x" << n << "x" << k;
  }
}

}  // namespace
}  // namespace kvtier::cuda
