// The Hopper flash-prefill kernel (flash_prefill_sm90.cu), reached through
// the dispatch in flash_prefill_cuda.cu; not a public entry point.
#pragma once
#include <cuda_runtime_api.h>

#include "ops/flash_prefill/flash_prefill_cuda.h"

namespace kvtier::cuda {

// True when this build holds the kernel's sm_90a code (KVT_CUDA_SM90A, set by
// CMake when CMAKE_CUDA_ARCHITECTURES names 90a).
bool flash_prefill_sm90_built();

// head_dim 128 only; p is already validated. overlap: the softmax of tile j
// runs while the tensor cores do P·V of tile j-1 (FlashAttention-3's
// intra-warpgroup overlap); false: the two GEMMs and the softmax in sequence.
void flash_prefill_sm90(const FlashPrefillParams& p, const void* q, const void* k, const void* v, void* out,
                        bool overlap, cudaStream_t s);

}  // namespace kvtier::cuda
