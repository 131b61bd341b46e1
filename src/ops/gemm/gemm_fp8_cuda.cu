#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda_backend.h"
#include "ops/gemm/gemm_fp8_cuda.h"

namespace kvtier::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kE4m3Max = 448.0f;

// One block per row, 8 elements (16 bytes) per load: the row's absolute
// maximum, then the row again (from L1/L2) scaled and rounded to E4M3
// (round to nearest even, saturating, as f32_to_e4m3_ref).
__global__ void __launch_bounds__(kThreads)
    quantize_rows_fp8_kernel(const __nv_bfloat16* x, int64_t cols, int64_t ld, uint8_t* q, float* scale) {
  __shared__ float red[kThreads / 32];
  const int64_t row = blockIdx.x;
  const uint4* xr = reinterpret_cast<const uint4*>(x + row * ld);
  const int64_t n_chunks = cols / 8;
  float amax = 0.f;
  for (int64_t i = threadIdx.x; i < n_chunks; i += kThreads) {
    uint4 raw = xr[i];
    const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 v = __bfloat1622float2(b[j]);
      amax = fmaxf(amax, fmaxf(fabsf(v.x), fabsf(v.y)));
    }
  }
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = red[0];
#pragma unroll
  for (int i = 1; i < kThreads / 32; ++i) amax = fmaxf(amax, red[i]);
  const float mul = amax > 0.f ? __fdiv_rn(kE4m3Max, amax) : 1.f;
  if (threadIdx.x == 0) scale[row] = amax > 0.f ? __fdiv_rn(amax, kE4m3Max) : 1.f;
  uint2* qr = reinterpret_cast<uint2*>(q + row * cols);
  for (int64_t i = threadIdx.x; i < n_chunks; i += kThreads) {
    uint4 raw = xr[i];
    const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&raw);
    uint32_t w[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 v = __bfloat1622float2(b[j]);
      const __nv_fp8x2_storage_t p =
          __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(v.x, mul), __fmul_rn(v.y, mul)), __NV_SATFINITE, __NV_E4M3);
      w[j >> 1] |= uint32_t(p) << (16 * (j & 1));
    }
    qr[i] = make_uint2(w[0], w[1]);
  }
}

// 8 elements (16 bytes) per thread, grid-stride.
__global__ void scale_rows_cols_kernel(uint4* y, int64_t n_chunks, int64_t chunks_per_row, const float* row_scale,
                                       const float* col_scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_chunks; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / chunks_per_row, col0 = (i - row * chunks_per_row) * 8;
    const float rs = row_scale[row];
    uint4 raw = y[i];
    __nv_bfloat162* b = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 v = __bfloat1622float2(b[j]);
      b[j] = __float22bfloat162_rn(
          make_float2(v.x * (rs * col_scale[col0 + 2 * j]), v.y * (rs * col_scale[col0 + 2 * j + 1])));
    }
    y[i] = raw;
  }
}

}  // namespace

void scale_rows_cols(void* y, int64_t m, int64_t n, const float* row_scale, const float* col_scale, cudaStream_t s) {
  KVT_CHECK(m >= 0 && n > 0 && n % 8 == 0, "scale_rows_cols: shape {} x {} (columns a positive multiple of 8)", m, n);
  const int64_t n_chunks = m * (n / 8);
  if (n_chunks == 0) return;
  const int64_t blocks = std::min<int64_t>((n_chunks + 255) / 256, 16384);
  scale_rows_cols_kernel<<<unsigned(blocks), 256, 0, s>>>(static_cast<uint4*>(y), n_chunks, n / 8, row_scale,
                                                          col_scale);
  KVT_CUDA_LAUNCH_CHECK("scale_rows_cols_kernel");
}

void gemm_fp8(Gemm& gemm, int64_t m, int64_t n, int64_t k, const uint8_t* x_q, const float* x_scale, const uint8_t* w_q,
              const float* w_scale, void* y, cudaStream_t s) {
  gemm.run_fp8_codes(m, n, k, x_q, w_q, y, s);
  scale_rows_cols(y, m, n, x_scale, w_scale, s);
}

void quantize_rows_fp8(const void* x, int64_t rows, int64_t cols, int64_t ld, uint8_t* q, float* scale,
                       cudaStream_t s) {
  if (ld == 0) ld = cols;
  KVT_CHECK(cols > 0 && cols % 8 == 0 && ld % 8 == 0 && ld >= cols,
            "quantize_rows_fp8: cols {} and ld {} must be positive multiples of 8, ld >= cols", cols, ld);
  KVT_CHECK(rows >= 0 && rows <= (int64_t(1) << 31) - 1, "quantize_rows_fp8: {} rows", rows);
  if (rows == 0) return;
  quantize_rows_fp8_kernel<<<unsigned(rows), kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(x), cols, ld, q,
                                                               scale);
  KVT_CUDA_LAUNCH_CHECK("quantize_rows_fp8_kernel");
}

}  // namespace kvtier::cuda
