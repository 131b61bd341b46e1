// What moe_cuda.cu (routing, plan, combine, the runner) and
// moe_experts_cuda.cu (the experts' products) share. Included by .cu files only.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvtier::cuda::moe_detail {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kBM = 64;  // grouped GEMM tile rows: the plan's tile offsets count these

// Y[row] = A[token(row)] · W_eᵀ for the rows [offsets[e], offsets[e + 1]) of
// every expert e. W: [n_expert, n, k] bf16; A rows of k values, row stride lda;
// token(row) = a_rows[row], or row itself when a_rows is null.
struct ExpertGemmParams {
  int n = 0, k = 0;
  int64_t lda = 0, ldy = 0;
  int n_expert = 0;
};

// Y rows [0, n_pairs) in expert order (moe_experts_cuda.cu).
void expert_products(const ExpertGemmParams& p, int n_tok, int n_pairs, const void* a, const int32_t* a_rows,
                     const void* w, const int32_t* offsets, const int32_t* tile_off, const int32_t* active, void* y,
                     cudaStream_t s);

}  // namespace kvtier::cuda::moe_detail
