// The two products of ShadowKV's key SVD (SPEC "Why"), on either device:
// the Gram matrix of a layer's pre-RoPE prompt keys, accumulated chunk by
// chunk, and their projection onto the top right singular vectors.
#pragma once
#include <cstdint>

#include "backend/device.h"

namespace kvtier {

// G [W, W] f32 += Kᵀ·K, K: [n, W] rows ld elements apart (CPU f32, CUDA bf16).
void gram_accumulate(const Exec& x, const void* k, int64_t n, int W, int64_t ld, float* G);
// out [n, rank] bf16 = K · basisᵀ, K as above, basis [rank, W] bf16.
void project_rows(const Exec& x, const void* k, int64_t n, int W, int64_t ld, const uint16_t* basis, int rank,
                  uint16_t* out);

}  // namespace kvtier
