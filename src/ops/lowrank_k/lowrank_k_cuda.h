// CUDA low-rank key reconstruction (contract in lowrank_k.h): one block per
// 64 selected tokens of a row; the [64, rank] × [rank, head_dim] product runs
// on the tensor cores (WMMA bf16, f32 accumulation), RoPE is applied in f32
// to the accumulators, and the keys are written once in bf16.
#pragma once
#include <cuda_runtime_api.h>

#include "ops/lowrank_k/lowrank_k.h"

namespace kvtier::cuda {

// Whether the kernel has an instance for head_dim (64, 128).
bool lowrank_k_supports(int head_dim);

// a, b, out: bf16 device pointers; idx, inv_freq (or null): device pointers.
// Any rank >= 1 (padded with zeros to the MMA depth in shared memory); rows of
// A and B are read with 16-byte loads when rank, the strides and the pointers
// allow it, element by element otherwise.
void lowrank_k(const LowrankKParams& p, const void* a, const void* b, const int32_t* idx, const float* inv_freq,
               void* out, cudaStream_t s);

}  // namespace kvtier::cuda
