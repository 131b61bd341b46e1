// SwiGLU on the fused gate|up GEMM output: h = silu(gate) * up (f32 math).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvtier::cuda {

// gate_up: [n_rows, 2*n_ff] bf16 (gate first, then up); h: [n_rows, n_ff] bf16
void swiglu(const void* gate_up, int64_t n_rows, int n_ff, void* h, cudaStream_t s);

}  // namespace kvtier::cuda
