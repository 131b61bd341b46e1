// CUDA decode attention and LSE merge (contracts in decode_attn.h).
#pragma once
#include <cuda_runtime_api.h>

#include "ops/decode_attn/decode_attn.h"

namespace kvtier::cuda {

// Whether the kernel has an instance for head_dim (64, 128) and the GQA
// group n_head / n_kv_head (1, 2, 3, 4, 8).
bool decode_attn_supports(int head_dim, int group);

// Splits that fill the GPU for n_rows (seq, kv head) rows of n_tok tokens,
// each split at least min_tokens long.
int decode_attn_splits(int64_t n_rows, int64_t n_tok, int64_t min_tokens = 256);

// q: [n_seq, n_head, head_dim] bf16. Writes parts [part0, part0 + n_split).
void decode_attn(const DecodeAttnParams& p, const void* q_bf16, const uint8_t* k, const uint8_t* v,
                 const int32_t* idx, float* part_out, float* part_lse, cudaStream_t s);

// out: [n_qh, head_dim] bf16 (out_bf16) and/or f32 (out_f32), lse: [n_qh] or null.
void attn_merge(int n_part, int64_t n_qh, int head_dim, const float* part_out, const float* part_lse,
                void* out_bf16, float* out_f32, float* lse, cudaStream_t s);

}  // namespace kvtier::cuda
