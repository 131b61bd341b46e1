// SwiGLU on the fused gate|up GEMM output: h = silu(gate) * up (f32 math).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvtier::cuda {

// gate_up: [n_rows, 2*n_ff] bf16 (gate first, then up); h: [n_rows, n_ff] bf16.
// With scales, gate_up is the unscaled product of FP8 codes
// (Gemm::run_fp8_codes) and element (r, c) is first multiplied by
// row_scale[r] · col_scale[c] (row_scale: [n_rows], col_scale: [2*n_ff] f32):
// the FP8 product's scales applied where it is read (ops/gemm/gemm_fp8.h).
void swiglu(const void* gate_up, int64_t n_rows, int n_ff, void* h, cudaStream_t s,
            const float* row_scale = nullptr, const float* col_scale = nullptr);

}  // namespace kvtier::cuda
