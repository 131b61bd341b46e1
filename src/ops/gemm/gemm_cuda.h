// bf16 GEMM through cuBLASLt: y = x · Wᵀ (the Linear layers), f32
// accumulation, bf16 out; and its FP8 form with one scale per row of x and of
// W (ops/gemm/gemm_fp8.h). The algorithm for each shape is chosen once by
// cuBLASLt's heuristic and cached (plan once, run many).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

namespace kvtier::cuda {

class Gemm {
 public:
  Gemm();
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // x: [m, k] bf16 (row stride ldx elements, 0 = k); w: [n, k] bf16;
  // y: [m, n] bf16 (row stride ldy, 0 = n). beta = 1 accumulates into y.
  void run(int64_t m, int64_t n, int64_t k, const void* x, const void* w, void* y, cudaStream_t s,
           float beta = 0.f, int64_t ldx = 0, int64_t ldy = 0);
  // The same product with f32 output (logits, where bf16 rounding of the
  // output would cost 3 significant digits): y: [m, n] f32, dense rows.
  void run_f32(int64_t m, int64_t n, int64_t k, const void* x, const void* w, float* y, cudaStream_t s);
  // y[m, n] bf16 = (x_q · x_scale)(w_q · w_scale)ᵀ: x_q [m, k] and w_q [n, k]
  // E4M3 codes (k a multiple of 16), x_scale [m] and w_scale [n] f32 on the
  // device (gemm_fp8_ref is the definition). Needs FP8 tensor cores
  // (compute capability 8.9 or later); else a kvtier::Error.
  void run_fp8(int64_t m, int64_t n, int64_t k, const uint8_t* x_q, const float* x_scale, const uint8_t* w_q,
               const float* w_scale, void* y, cudaStream_t s);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::cuda
