// The small kernels of the GPU forward: the embedding lookup and the q/k/v
// bias add (Qwen2). Their references are short loops in model_cuda_test.cpp.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvtier::cuda {

// table: [n_vocab, dim] bf16; ids: [n_tok] int32 (device, already checked
// against n_vocab); out: [n_tok, dim] bf16.
void embed_rows(const void* table, const int32_t* ids, int64_t n_tok, int dim, void* out, cudaStream_t s);

// y: [n_rows, dim] bf16, y[r, i] += bias[i] (f32 math); bias: [dim] f32.
void add_bias(void* y, const float* bias, int64_t n_rows, int dim, cudaStream_t s);

}  // namespace kvtier::cuda
