// CUDA top-k per row (contract in topk.h): radix select on the ordered bit
// pattern (11 + 11 + 10 bits), then one ordered compaction pass.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/topk/topk.h"

namespace kvtier::cuda {

// scores: [n_rows, n] f32 (row stride `row_stride` floats >= n)
// out:    [n_rows, min(k, n)] int32, ascending
void topk(const float* scores, int64_t n_rows, int64_t n, int64_t row_stride, int k, int64_t tok_offset,
          int32_t* out, cudaStream_t s);

}  // namespace kvtier::cuda
