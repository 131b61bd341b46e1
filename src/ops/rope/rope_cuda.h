// RoPE on bf16 q/k rows in place (f32 math), with the frequency table of
// Rope::inv_freq() (ops/rope/rope.h) so that every scaling scheme is shared.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvtier::cuda {

// x:         [n_tok, tok_stride] bf16; heads [0, n_heads) at + h*head_dim
// positions: [n_tok] int64 (device)
// inv_freq:  [head_dim/2] f32 (device)
// interleaved: rotate pairs (2i, 2i+1); else (i, i + head_dim/2)
void rope(void* x, int64_t n_tok, int64_t tok_stride, int n_heads, int head_dim, const int64_t* positions,
          const float* inv_freq, bool interleaved, cudaStream_t s);

}  // namespace kvtier::cuda
