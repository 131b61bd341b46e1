#include <cuda_bf16.h>

#include "backend/cuda_backend.h"
#include "ops/rope/rope_cuda.cuh"
#include "ops/rope/rope_cuda.h"

namespace kvtier::cuda {
namespace {

__global__ void rope_kernel(__nv_bfloat16* x, int64_t n_pairs, int64_t tok_stride, int n_heads, int head_dim,
                            const int64_t* positions, const float* inv_freq, bool interleaved) {
  const int half = head_dim / 2;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n_pairs; e += int64_t(gridDim.x) * blockDim.x) {
    const int i = int(e % half);
    const int64_t th = e / half;
    const int h = int(th % n_heads);
    const int64_t t = th / n_heads;
    __nv_bfloat16* v = x + t * tok_stride + int64_t(h) * head_dim;
    const int i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
    rope_pair(__bfloat162float(v[i0]), __bfloat162float(v[i1]), positions[t], inv_freq[i], v + i0, v + i1);
  }
}

}  // namespace

void rope(void* x, int64_t n_tok, int64_t tok_stride, int n_heads, int head_dim, const int64_t* positions,
          const float* inv_freq, bool interleaved, cudaStream_t s) {
  KVT_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope (CUDA): head_dim {} must be even", head_dim);
  const int64_t n_pairs = n_tok * n_heads * (head_dim / 2);
  if (n_pairs == 0) return;
  const int64_t blocks = std::min<int64_t>((n_pairs + 255) / 256, 65536);
  rope_kernel<<<unsigned(blocks), 256, 0, s>>>(static_cast<__nv_bfloat16*>(x), n_pairs, tok_stride, n_heads,
                                               head_dim, positions, inv_freq, interleaved);
  KVT_CUDA_LAUNCH_CHECK("rope_kernel");
}

}  // namespace kvtier::cuda
