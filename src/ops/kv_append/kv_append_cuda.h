// CUDA writers of the offload tiers (contracts in kv_append.h; pointers are
// device pointers, or mapped pinned host pointers for entry_append's dst).
#pragma once
#include <cuda_runtime_api.h>

#include "ops/kv_append/kv_append.h"

namespace kvtier::cuda {

// k: [n_tok, n_kv_head, 128] bf16, token t at k + t·k_tok_stride elements;
// grid: [256, 4] f32 EDEN4-256; signs: [128] f32 ±1 or null (no random signs).
void index_append(const IndexAppendParams& p, const void* k_bf16, int64_t k_tok_stride, const float* grid,
                  const float* signs, uint8_t* index, cudaStream_t s);

// k, v: [n_tok, n_kv_head, head_dim] bf16, token stride kv_tok_stride elements.
void entry_append(const EntryAppendParams& p, const void* k_bf16, const void* v_bf16, int64_t kv_tok_stride,
                  uint8_t* dst, cudaStream_t s);

// k, v: [n_tok, width] bf16, token stride kv_tok_stride elements; grid:
// [256, 2] f32 EDEN2-256; signs: [group] f32 ±1 or null. One block per
// (token, K or V); the Hadamard runs in shared memory.
void record_append(const HiggsRecordLayout& L, int64_t n_tok, int64_t pos0, int64_t tok_stride, const void* k_bf16,
                   const void* v_bf16, int64_t kv_tok_stride, const float* grid, const float* signs, uint8_t* dst,
                   cudaStream_t s);

}  // namespace kvtier::cuda
