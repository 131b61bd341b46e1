#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda_backend.h"
#include "ops/rope/qkv_split_cuda.h"
#include "ops/rope/rope_cuda.cuh"

namespace kvtier::cuda {
namespace {

// One thread per pair of a row: q's rotation pairs, then k's, then pairs of
// v's elements.
__global__ void qkv_split_kernel(const __nv_bfloat16* __restrict__ qkv, int64_t n_items, int q_dim, int kv_dim,
                                 int head_dim, __nv_bfloat16* __restrict__ q, __nv_bfloat16* __restrict__ k_pre,
                                 __nv_bfloat16* __restrict__ v, __nv_bfloat16* __restrict__ k,
                                 const int64_t* __restrict__ positions, const float* __restrict__ inv_freq,
                                 bool interleaved) {
  const int width = q_dim + 2 * kv_dim, per_tok = width / 2, half = head_dim / 2;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n_items; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e / per_tok;
    int j = int(e % per_tok);
    const __nv_bfloat16* row = qkv + t * width;
    if (j >= (q_dim + kv_dim) / 2) {  // v: elements 2j', 2j' + 1
      j -= (q_dim + kv_dim) / 2;
      reinterpret_cast<__nv_bfloat162*>(v + t * kv_dim)[j] =
          reinterpret_cast<const __nv_bfloat162*>(row + q_dim + kv_dim)[j];
      continue;
    }
    const bool is_q = j < q_dim / 2;
    if (!is_q) j -= q_dim / 2;
    const int h = j / half, i = j % half;
    const int i0 = h * head_dim + (interleaved ? 2 * i : i), i1 = h * head_dim + (interleaved ? 2 * i + 1 : i + half);
    const __nv_bfloat16* src = row + (is_q ? 0 : q_dim);
    const __nv_bfloat16 x0 = src[i0], x1 = src[i1];
    __nv_bfloat16* dst = is_q ? q + t * q_dim : k + t * kv_dim;
    if (!is_q) {
      k_pre[t * kv_dim + i0] = x0;
      k_pre[t * kv_dim + i1] = x1;
    }
    if (positions)
      rope_pair(__bfloat162float(x0), __bfloat162float(x1), positions[t], inv_freq[i], dst + i0, dst + i1);
    else if (is_q)
      dst[i0] = x0, dst[i1] = x1;
  }
}

}  // namespace

void qkv_split(const void* qkv, int64_t n_tok, int q_dim, int kv_dim, int head_dim, void* q, void* k_pre, void* v,
               void* k, const int64_t* positions, const float* inv_freq, bool interleaved, cudaStream_t s) {
  KVT_CHECK(head_dim > 0 && head_dim % 2 == 0 && q_dim % head_dim == 0 && kv_dim % head_dim == 0,
            "qkv_split: q_dim {} and kv_dim {} must be multiples of an even head_dim {}", q_dim, kv_dim, head_dim);
  KVT_CHECK(!positions || (inv_freq && k), "qkv_split: RoPE needs the frequencies and k");
  const int64_t n_items = n_tok * ((q_dim + 2 * int64_t(kv_dim)) / 2);
  if (n_items == 0) return;
  const int64_t blocks = std::min<int64_t>((n_items + 255) / 256, 65536);
  qkv_split_kernel<<<unsigned(blocks), 256, 0, s>>>(static_cast<const __nv_bfloat16*>(qkv), n_items, q_dim, kv_dim,
                                                    head_dim, static_cast<__nv_bfloat16*>(q),
                                                    static_cast<__nv_bfloat16*>(k_pre), static_cast<__nv_bfloat16*>(v),
                                                    static_cast<__nv_bfloat16*>(k), positions, inv_freq, interleaved);
  KVT_CUDA_LAUNCH_CHECK("qkv_split_kernel");
}

}  // namespace kvtier::cuda
