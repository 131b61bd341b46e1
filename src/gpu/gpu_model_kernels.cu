#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda_backend.h"
#include "gpu/gpu_model_kernels.h"

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

__global__ void resident_append_kernel(const __nv_bfloat16* k, const __nv_bfloat16* v, int64_t kv_tok_stride,
                                       int n_kv_head, int head_dim, int64_t pos0, int n_tok, int sink, int local,
                                       __nv_bfloat16* res) {
  const int t = blockIdx.x / n_kv_head, h = blockIdx.x % n_kv_head;
  const int64_t tok = pos0 + t, end = pos0 + n_tok;
  int64_t slot = -1;
  if (tok < sink) slot = tok;
  else if (tok >= end - local) slot = sink + (tok - sink) % local;
  if (slot < 0) return;
  __nv_bfloat16* o = res + (int64_t(h) * (sink + local) + slot) * 2 * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    o[d] = k[t * kv_tok_stride + int64_t(h) * head_dim + d];
    o[head_dim + d] = v[t * kv_tok_stride + int64_t(h) * head_dim + d];
  }
}

}  // namespace

void resident_append(const void* k, const void* v, int64_t kv_tok_stride, int n_kv_head, int head_dim, int64_t pos0,
                     int n_tok, int sink, int local, void* res, cudaStream_t s) {
  if (n_tok <= 0 || n_kv_head <= 0) return;
  resident_append_kernel<<<unsigned(n_tok * n_kv_head), 128, 0, s>>>(
      static_cast<const __nv_bfloat16*>(k), static_cast<const __nv_bfloat16*>(v), kv_tok_stride, n_kv_head, head_dim,
      pos0, n_tok, sink, local, static_cast<__nv_bfloat16*>(res));
  KVT_CUDA_LAUNCH_CHECK("resident_append_kernel");
}

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
