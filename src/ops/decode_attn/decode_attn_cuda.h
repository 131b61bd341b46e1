// CUDA decode attention and LSE merge (contracts in decode_attn.h; pointers
// are device pointers, q and out bf16).
#pragma once
#include <cstdint>

#include "ops/decode_attn/decode_attn.h"

namespace kvtier::cuda {

void decode_attn(const Exec& x, const DecodeAttnParams& p, const void* q_bf16, const uint8_t* const* rows,
                 const int32_t* idx, float* part_out, float* part_lse);
int decode_attn_splits(int64_t n_rows, int64_t n_tok, int64_t min_tokens);
// out: bf16 [n_qh, head_dim], or f32 when out_f32.
void attn_merge(const Exec& x, int n_part, int64_t n_qh, int head_dim, const float* part_out, const float* part_lse,
                void* out, bool out_f32, float* lse);

}  // namespace kvtier::cuda
