#include <cuda_bf16.h>

#include "backend/cuda_backend.h"
#include "ops/rmsnorm/rmsnorm_cuda.h"

namespace kvtier::cuda {
namespace {

// One block per row; each thread keeps its 8-element chunks in registers
// between the sum of squares and the scaling (dim <= 8 * 256 * kMaxChunks).
constexpr int kThreads = 256, kMaxChunks = 4;

__global__ void __launch_bounds__(kThreads) add_rmsnorm_kernel(__nv_bfloat16* x, const __nv_bfloat16* delta,
                                                               const __nv_bfloat16* w, int dim, float eps,
                                                               __nv_bfloat16* y) {
  __shared__ float red[kThreads / 32];
  const int64_t row = blockIdx.x;
  uint4* xr = reinterpret_cast<uint4*>(x + row * dim);
  const uint4* dr = delta ? reinterpret_cast<const uint4*>(delta + row * dim) : nullptr;
  const int n_chunks = dim / 8;
  float vals[kMaxChunks][8];
  float ss = 0.f;
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int i = threadIdx.x + c * kThreads;
    if (i >= n_chunks) break;
    uint4 raw = xr[i];
    __nv_bfloat162* b = reinterpret_cast<__nv_bfloat162*>(&raw);
    if (dr) {
      uint4 draw = dr[i];
      const __nv_bfloat162* db = reinterpret_cast<const __nv_bfloat162*>(&draw);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 a = __bfloat1622float2(b[j]), d = __bfloat1622float2(db[j]);
        b[j] = __float22bfloat162_rn(make_float2(a.x + d.x, a.y + d.y));
      }
      xr[i] = raw;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 a = __bfloat1622float2(b[j]);
      vals[c][2 * j] = a.x;
      vals[c][2 * j + 1] = a.y;
      ss += a.x * a.x + a.y * a.y;
    }
  }
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  float tot = 0.f;
#pragma unroll
  for (int i = 0; i < kThreads / 32; ++i) tot += red[i];
  const float inv = rsqrtf(tot / float(dim) + eps);
  const uint4* wr = reinterpret_cast<const uint4*>(w);
  uint4* yr = reinterpret_cast<uint4*>(y + row * dim);
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int i = threadIdx.x + c * kThreads;
    if (i >= n_chunks) break;
    uint4 wraw = wr[i], out;
    const __nv_bfloat162* wb = reinterpret_cast<const __nv_bfloat162*>(&wraw);
    __nv_bfloat162* ob = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 ww = __bfloat1622float2(wb[j]);
      ob[j] = __float22bfloat162_rn(make_float2(vals[c][2 * j] * inv * ww.x, vals[c][2 * j + 1] * inv * ww.y));
    }
    yr[i] = out;
  }
}

}  // namespace

void add_rmsnorm(void* x, const void* delta, const void* weight, int64_t n_rows, int dim, float eps, void* y,
                 cudaStream_t s) {
  KVT_CHECK(dim % 8 == 0 && dim <= 8 * kThreads * kMaxChunks, "add_rmsnorm (CUDA): dim {} must be a multiple of 8 and <= {}",
            dim, 8 * kThreads * kMaxChunks);
  if (n_rows == 0) return;
  add_rmsnorm_kernel<<<unsigned(n_rows), kThreads, 0, s>>>(
      static_cast<__nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(delta),
      static_cast<const __nv_bfloat16*>(weight), dim, eps, static_cast<__nv_bfloat16*>(y));
  KVT_CUDA_LAUNCH_CHECK("add_rmsnorm_kernel");
}

}  // namespace kvtier::cuda
