// FP8 (E4M3) products with per-row scales on the GPU (gemm_fp8.h defines
// them): the quantizer of bf16 rows, the scaling of a product of codes
// (Gemm::run_fp8_codes), and the two together. A consumer of the product may
// apply the scales itself instead (cuda::swiglu's scales).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/gemm/gemm_cuda.h"

namespace kvtier::cuda {

// x: [rows, cols] bf16 (row stride ld elements, 0 = cols; cols and ld
// multiples of 8) → q: [rows, cols] E4M3 codes, dense; scale: [rows] f32.
// Bit for bit quantize_rows_fp8_ref of the rows' f32 values.
void quantize_rows_fp8(const void* x, int64_t rows, int64_t cols, int64_t ld, uint8_t* q, float* scale, cudaStream_t s);

// y: [m, n] bf16 (n a multiple of 8), in place: y[i][j] *= row_scale[i] ·
// col_scale[j] (f32 math, one rounding).
void scale_rows_cols(void* y, int64_t m, int64_t n, const float* row_scale, const float* col_scale, cudaStream_t s);

// y[m, n] bf16 = the FP8 product of gemm_fp8_ref: Gemm::run_fp8_codes, then
// scale_rows_cols with x_scale [m] and w_scale [n].
void gemm_fp8(Gemm& gemm, int64_t m, int64_t n, int64_t k, const uint8_t* x_q, const float* x_scale, const uint8_t* w_q,
              const float* w_scale, void* y, cudaStream_t s);

}  // namespace kvtier::cuda
