// CUDA index scoring (contracts in index_score.h; pointers are device pointers).
#pragma once
#include <cuda_runtime_api.h>

#include "ops/index_score/index_score.h"

namespace kvtier::cuda {

void index_score(IndexElt elt, const IndexScoreParams& p, const float* q, const uint8_t* index,
                 const float* grid, float* scores, cudaStream_t s);

// q: [n_seq, n_head, head_dim] bf16 (the layer's RoPE'd query);
// out: [n_seq, n_kv_head, n_q, head_dim] f32. signs: [head_dim] f32 or null.
void index_query(const void* q_bf16, int n_seq, int n_head, int n_kv_head, int head_dim,
                 bool mean_group, bool rotate, const float* signs, float* out, cudaStream_t s);

// index_gqa_softmax_max_ref on the GPU: a reduction pass (per row and query,
// partial max and sum of exponentials over slices of the tokens) and an
// elementwise pass that combines them into lse_j and writes the selected
// tokens' max_j (scale·raw_j − lse_j). scratch: index_gqa_scratch_bytes(...)
// of device memory. No host synchronization.
int64_t index_gqa_scratch_bytes(int64_t n_rows, int n_q);
void index_gqa_softmax_max(const float* raw, int64_t n_rows, int n_q, int64_t n_tok, float scale, int64_t sel_offset,
                           int64_t n_sel, void* scratch, float* out, cudaStream_t s);

}  // namespace kvtier::cuda
