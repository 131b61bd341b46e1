// CUDA record_dequant (contract in record_dequant.h): one warp per listed
// slot, lane l rebuilding values 4l..4l+3 of the head's K and V.
#pragma once
#include <cuda_runtime_api.h>

#include "ops/record_dequant/record_dequant.h"

namespace kvtier::cuda {

// grid: [256, 2] f32 EDEN2-256; signs: [group] f32 ±1 or null.
void record_dequant(const HiggsRecordLayout& L, const RecordDequantParams& p, const uint8_t* src, const int32_t* idx,
                    const float* grid, const float* signs, uint8_t* dst, cudaStream_t s);

}  // namespace kvtier::cuda
