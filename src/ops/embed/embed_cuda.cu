#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda_backend.h"
#include "ops/embed/embed_cuda.h"

namespace kvtier::cuda {
namespace {

__global__ void embed_rows_kernel(const __nv_bfloat16* __restrict__ table, const int32_t* __restrict__ ids,
                                  int dim, __nv_bfloat16* __restrict__ out) {
  const int64_t t = blockIdx.x;
  const __nv_bfloat16* row = table + int64_t(ids[t]) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) out[t * dim + i] = row[i];
}

__global__ void add_bias_kernel(__nv_bfloat16* y, const float* __restrict__ bias, int64_t n, int dim) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x)
    y[e] = __float2bfloat16(__bfloat162float(y[e]) + bias[e % dim]);
}

}  // namespace

void embed_rows(const void* table, const int32_t* ids, int64_t n_tok, int dim, void* out, cudaStream_t s) {
  if (n_tok == 0) return;
  embed_rows_kernel<<<unsigned(n_tok), 256, 0, s>>>(static_cast<const __nv_bfloat16*>(table), ids, dim,
                                                   static_cast<__nv_bfloat16*>(out));
  KVT_CUDA_LAUNCH_CHECK("embed_rows_kernel");
}

void add_bias(void* y, const float* bias, int64_t n_rows, int dim, cudaStream_t s) {
  const int64_t n = n_rows * dim;
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65536);
  add_bias_kernel<<<unsigned(blocks), 256, 0, s>>>(static_cast<__nv_bfloat16*>(y), bias, n, dim);
  KVT_CUDA_LAUNCH_CHECK("add_bias_kernel");
}

}  // namespace kvtier::cuda
