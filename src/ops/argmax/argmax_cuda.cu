// One block per row: each thread keeps the first largest of its strided
// slice, then warps and the block combine pairs (larger value, else lower
// index). NaNs are skipped as candidates, which is argmax_ref's result
// unless the row starts with NaN (then 0, checked apart).
#include <cstdint>

#include "backend/cuda_backend.h"
#include "ops/argmax/argmax_cuda.h"

namespace kvtier::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kUnroll = 8;

struct Best {
  float v;
  int32_t i;
};

__device__ __forceinline__ void take(Best& b, float v, int32_t i) {
  if (v > b.v || (v == b.v && i < b.i)) b = {v, i};
}

__global__ void __launch_bounds__(kThreads)
    argmax_rows_kernel(const float* __restrict__ x, int32_t n, int32_t* __restrict__ out) {
  const float* row = x + int64_t(blockIdx.x) * n;
  Best b{-INFINITY, INT32_MAX};
  for (int32_t i0 = threadIdx.x; i0 < n; i0 += kThreads * kUnroll) {
    float v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t i = i0 + u * kThreads;
      v[u] = i < n ? row[i] : -INFINITY;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (i0 + u * kThreads < n) take(b, v[u], i0 + u * kThreads);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, b.v, off);
    const int32_t i = __shfl_xor_sync(0xffffffffu, b.i, off);
    take(b, v, i);
  }
  __shared__ Best warp_best[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_best[warp] = b;
  __syncthreads();
  if (warp == 0) {
    b = warp_best[lane];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float v = __shfl_xor_sync(0xffffffffu, b.v, off);
      const int32_t i = __shfl_xor_sync(0xffffffffu, b.i, off);
      take(b, v, i);
    }
    if (lane == 0) out[blockIdx.x] = isnan(row[0]) ? 0 : b.i;
  }
}

}  // namespace

void argmax_rows(const float* x, int64_t n_rows, int64_t n, int32_t* out, cudaStream_t s) {
  KVT_CHECK(n >= 1 && n < (int64_t(1) << 31) && n_rows >= 0 && n_rows < (int64_t(1) << 31),
            "argmax_rows: {} rows of {}", n_rows, n);
  if (n_rows == 0) return;
  argmax_rows_kernel<<<unsigned(n_rows), kThreads, 0, s>>>(x, int32_t(n), out);
  KVT_CUDA_LAUNCH_CHECK("argmax_rows_kernel");
}

}  // namespace kvtier::cuda
