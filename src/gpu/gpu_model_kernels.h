// The small kernels the GPU model needs beyond src/ops: the embedding
// lookup, the q/k/v bias add (Qwen2) and the resident-slot write of the GPU
// tiered KV. Their references are short loops in gpu_model_cuda_test.cpp.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvtier::cuda {

// table: [n_vocab, dim] bf16; ids: [n_tok] int32 (device, already checked
// against n_vocab); out: [n_tok, dim] bf16.
void embed_rows(const void* table, const int32_t* ids, int64_t n_tok, int dim, void* out, cudaStream_t s);

// y: [n_rows, dim] bf16, y[r, i] += bias[i] (f32 math); bias: [dim] f32.
void add_bias(void* y, const float* bias, int64_t n_rows, int dim, cudaStream_t s);

// Tokens [pos0, pos0 + n_tok) of a sequence whose last token is
// pos0 + n_tok − 1 into the resident slots [sinks | window ring] of each KV
// head: token t < sink at slot t; each of the last `local` tokens at slot
// sink + (t − sink) % local (so a ring still filling is a prefix); other
// tokens are not written. k, v: [n_tok, n_kv_head, head_dim] bf16, token
// stride kv_tok_stride elements; res: [n_kv_head, sink + local, 2 (K, V),
// head_dim] bf16.
void resident_append(const void* k, const void* v, int64_t kv_tok_stride, int n_kv_head, int head_dim, int64_t pos0,
                     int n_tok, int sink, int local, void* res, cudaStream_t s);

}  // namespace kvtier::cuda
