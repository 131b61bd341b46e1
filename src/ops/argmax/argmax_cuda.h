// argmax_ref (ops/argmax/argmax.h) per row on the GPU: the decode step's
// greedy token without copying the logits to the host.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvtier::cuda {

// x: [n_rows, n] f32 (device); out: [n_rows] int32 (device). n in [1, 2^31).
void argmax_rows(const float* x, int64_t n_rows, int64_t n, int32_t* out, cudaStream_t s);

}  // namespace kvtier::cuda
