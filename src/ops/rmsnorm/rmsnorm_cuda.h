// Fused residual add + RMSNorm on bf16 rows (f32 math), as the decoder uses
// it between blocks: x += delta (when delta is given), y = rmsnorm(x) * w.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvtier::cuda {

// x:      [n_rows, dim] bf16, updated in place when delta is not null
// delta:  [n_rows, dim] bf16 or null
// weight: [dim] bf16
// y:      [n_rows, dim] bf16
void add_rmsnorm(void* x, const void* delta, const void* weight, int64_t n_rows, int dim, float eps, void* y,
                 cudaStream_t s);

}  // namespace kvtier::cuda
