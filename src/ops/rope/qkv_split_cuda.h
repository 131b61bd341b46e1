// The attention block's q, k and v come from one product with the stacked
// weights (wq's rows, then wk's, then wv's: one GEMM instead of three small
// ones); this takes its output apart, with RoPE on the way where nothing
// else (biases, q/k norms) comes between the product and the rotation.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvtier::cuda {

// qkv: [n_tok, q_dim + 2 kv_dim] bf16 → q [n_tok, q_dim], k_pre [n_tok,
// kv_dim] (keys before RoPE), v [n_tok, kv_dim], all bf16. With positions
// ([n_tok] int64) and inv_freq ([head_dim/2] f32) also RoPE as rope() does
// it (the same bf16 values): q rotated, and k [n_tok, kv_dim] = k_pre
// rotated; without (positions null), q and k_pre as computed and k untouched.
void qkv_split(const void* qkv, int64_t n_tok, int q_dim, int kv_dim, int head_dim, void* q, void* k_pre, void* v,
               void* k, const int64_t* positions, const float* inv_freq, bool interleaved, cudaStream_t s);

}  // namespace kvtier::cuda
