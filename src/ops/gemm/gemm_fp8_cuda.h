// FP8 (E4M3) rows on the GPU: the quantizer of gemm_fp8.h for bf16 rows. The
// product itself is Gemm::run_fp8 (gemm_cuda.h, cuBLASLt).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvtier::cuda {

// x: [rows, cols] bf16 (row stride ld elements, 0 = cols; cols and ld
// multiples of 8) → q: [rows, cols] E4M3 codes, dense; scale: [rows] f32.
// Bit for bit quantize_rows_fp8_ref of the rows' f32 values.
void quantize_rows_fp8(const void* x, int64_t rows, int64_t cols, int64_t ld, uint8_t* q, float* scale, cudaStream_t s);

}  // namespace kvtier::cuda
