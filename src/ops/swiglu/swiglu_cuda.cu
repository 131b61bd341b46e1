#include <cuda_bf16.h>

#include "backend/cuda_backend.h"
#include "ops/swiglu/swiglu_cuda.h"

namespace kvtier::cuda {
namespace {

__global__ void swiglu_kernel(const __nv_bfloat162* gu, int64_t n_rows, int half_ff, __nv_bfloat162* h,
                              const float* row_scale, const float2* col_scale) {
  const int64_t n = n_rows * half_ff;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / half_ff;
    const int c = int(e % half_ff);
    float2 g = __bfloat1622float2(gu[r * 2 * half_ff + c]);
    float2 u = __bfloat1622float2(gu[r * 2 * half_ff + half_ff + c]);
    if (row_scale) {
      const float rs = row_scale[r];
      const float2 gs = col_scale[c], us = col_scale[half_ff + c];
      g = make_float2(g.x * (rs * gs.x), g.y * (rs * gs.y));
      u = make_float2(u.x * (rs * us.x), u.y * (rs * us.y));
    }
    const float a = g.x / (1.f + __expf(-g.x)) * u.x, b = g.y / (1.f + __expf(-g.y)) * u.y;
    h[e] = __float22bfloat162_rn(make_float2(a, b));
  }
}

}  // namespace

void swiglu(const void* gate_up, int64_t n_rows, int n_ff, void* h, cudaStream_t s, const float* row_scale,
            const float* col_scale) {
  KVT_CHECK(n_ff % 2 == 0, "swiglu (CUDA): n_ff {} must be even", n_ff);
  KVT_CHECK(!row_scale == !col_scale, "swiglu (CUDA): row and column scales come together");
  const int64_t n = n_rows * (n_ff / 2);
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65536);
  swiglu_kernel<<<unsigned(blocks), 256, 0, s>>>(static_cast<const __nv_bfloat162*>(gate_up), n_rows, n_ff / 2,
                                                 static_cast<__nv_bfloat162*>(h), row_scale,
                                                 reinterpret_cast<const float2*>(col_scale));
  KVT_CUDA_LAUNCH_CHECK("swiglu_kernel");
}

}  // namespace kvtier::cuda
