// bf16 GEMM through cuBLASLt: y = x · Wᵀ (the Linear layers), f32
// accumulation, bf16 out; and the E4M3 product of FP8 codes that the
// per-row-scaled FP8 GEMM builds on (ops/gemm/gemm_fp8_cuda.h). The algorithm
// for each shape is cuBLASLt's heuristic's first, chosen once and cached
// (plan once, run many). Timing its other candidates picks nothing better
// at a decode step's shapes: on an H100, the fastest of 8 is within 1–3 %
// of the first in isolation (kvt_gemm_bench), and choosing by such timings
// inside the engine doubled the model stage (bench/results/gpu/batch, run9).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace kvtier::cuda {

// Throws a kvtier::Error naming `who` unless the current device has FP8
// tensor cores (compute capability 8.9 or later).
void require_fp8_tensor_cores(const char* who);

class Gemm {
 public:
  enum class Kind { bf16, bf16_to_f32, fp8 };  // run, run_f32, run_fp8_codes

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
  // y[m, n] bf16 = x_q · w_qᵀ over the E4M3 codes' values, unscaled: x_q
  // [m, k] and w_q [n, k] (k a multiple of 16). Sums of up to k products of
  // ±448 stay far inside bf16's range, and scaling after the product keeps
  // bf16's relative precision, so the per-row scales can be applied by the
  // op that reads y (gemm_fp8_cuda.h). Needs FP8 tensor cores (compute
  // capability 8.9 or later); else a kvtier::Error. (cuBLASLt's own per-row
  // "outer vector" scaling is refused on Hopper.)
  void run_fp8_codes(int64_t m, int64_t n, int64_t k, const uint8_t* x_q, const uint8_t* w_q, void* y,
                     cudaStream_t s);

  // cuBLASLt's candidate algorithms for a product of `kind` with dense rows,
  // in the heuristic's order (run() uses the first): how many there are, a
  // product by candidate i (tests check each), and each one's milliseconds
  // per product on scratch input with the weights w (kvt_gemm_bench).
  int candidates(int64_t m, int64_t n, int64_t k, Kind kind);
  void run_candidate(int i, int64_t m, int64_t n, int64_t k, Kind kind, const void* x, const void* w, void* y,
                     cudaStream_t s);
  std::vector<double> time_candidates(int64_t m, int64_t n, int64_t k, Kind kind, const void* w, int reps);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::cuda
