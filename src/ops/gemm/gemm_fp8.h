// FP8 (E4M3) weight products with one scale per row: the prompt's Linear
// layers on the GPU with --prefill-gemm fp8. A row r of a matrix (a token's
// activations, or a weight's output channel) is stored as
//   q[r][c] = e4m3(x[r][c] · (448 / amax_r)),   s_r = amax_r / 448,
// so that x[r][c] ≈ q[r][c] · s_r; an all-zero row has s_r = 1. The product
// y[i][j] = s_x[i] · s_w[j] · Σ_c q_x[i][c] · q_w[j][c], accumulated in f32.
// These are the definitions the CUDA versions (gemm_fp8_cuda.h) are tested
// against.
#pragma once
#include <cstdint>

namespace kvtier {

// x: [rows, cols] f32 (row stride ld, 0 = cols) → q: [rows, cols] E4M3 codes,
// scale: [rows].
void quantize_rows_fp8_ref(const float* x, int64_t rows, int64_t cols, int64_t ld, uint8_t* q, float* scale);

// y[m, n] = (x_q[m, k] · s_x) (w_q[n, k] · s_w)ᵀ in f64, rounded to f32.
void gemm_fp8_ref(int64_t m, int64_t n, int64_t k, const uint8_t* x_q, const float* x_scale, const uint8_t* w_q,
                  const float* w_scale, float* y);

}  // namespace kvtier
