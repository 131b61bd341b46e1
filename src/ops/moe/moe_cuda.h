// The MoE block (ops/moe/moe.h) on CUDA, bf16 weights and activations, f32
// math inside each kernel, no host synchronization (a decode step can be
// captured in a CUDA graph):
//
//   router      logits = x · Wrᵀ                 cuBLASLt, f32 out   [n_tok, n_expert]
//   moe_route   top-k ids and weights per token  one warp per token  [n_tok, k]
//   plan        rows per expert, their offsets, the active experts, and every
//               (token, slot) pair's row in expert order           one block
//   experts     gate|up = x[rows] · W_guᵀ → SwiGLU → · W_downᵀ, per expert
//               over its rows: a tensor-core grouped GEMM (tiles of 64 rows
//               of one expert, found on the device), or for ≤ kGemvMaxTokens
//               tokens (decode) a GEMV that runs one warp per weight row of
//               the *active* experts only — decode reads k experts' weights
//   combine     y[t] = Σ_j w[t, j] · out[row(t, j)]  (f32 sum, bf16 out)
//
// From kMoeCublasMinTokens tokens per call (long prefill chunks) the plan is
// made on the host instead (one synchronization) and each active expert's
// rows, gathered, go through one cuBLASLt GEMM: faster there than the
// grouped kernel (kvt_moe_bench, bench/results/moe/), never inside a CUDA
// graph capture.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda_backend.h"
#include "ops/gemm/gemm_cuda.h"
#include "ops/moe/moe.h"

namespace kvtier::cuda {

// Up to this many tokens per call, the experts run as GEMVs (an expert gets
// at most one row per token).
constexpr int kMoeGemvMaxTokens = 8;
// From this many tokens per call, the experts run as cuBLASLt GEMMs (automatic).
constexpr int kMoeCublasMinTokens = 8192;

// How the experts' products run.
enum class MoeExperts {
  automatic,  // GEMV, grouped GEMM or cuBLASLt by the token count (above)
  device,     // kvtier's kernels (GEMV or grouped GEMM) at any count
  cublas,     // host plan + one cuBLASLt GEMM per active expert at any count
};

// One layer's weights on the device.
struct MoeDeviceWeights {
  const void* router = nullptr;   // [n_expert, n_embd] bf16
  const void* gate_up = nullptr;  // [n_expert, 2 * n_ff, n_embd] bf16: expert e's gate rows, then its up rows
  const void* down = nullptr;     // [n_expert, n_embd, n_ff] bf16
};

// Routing of f32 logits [n_tok, n_expert] (device) into ids [n_tok, k] int32
// and weights [n_tok, k] f32, as moe_route (moe.h) but with the softmax in
// f32. n_expert ≤ 1024, k ≤ 32.
void moe_route(const float* logits, int n_tok, const MoeConfig& c, int32_t* ids, float* weights, cudaStream_t s);

// Working memory for up to `capacity` tokens per call, allocated once.
class MoeRunner {
 public:
  MoeRunner(const MoeConfig& c, int capacity);
  // x: [n_tok, n_embd] bf16 → y: [n_tok, n_embd] bf16 (must not alias x).
  void run(const MoeDeviceWeights& w, const void* x, int n_tok, void* y, Gemm& gemm, cudaStream_t s,
           MoeExperts experts = MoeExperts::automatic);
  // The routing of the last run (device): ids [n_tok, k] int32, weights [n_tok, k] f32.
  const int32_t* ids() const { return ids_.data<int32_t>(); }
  const float* weights() const { return weights_.data<float>(); }
  size_t scratch_bytes() const;

 private:
  // The cuBLASLt path's plan and products, after the routing.
  void run_cublas(const MoeDeviceWeights& w, const void* x, int n_tok, Gemm& gemm, cudaStream_t s);

  MoeConfig c_;
  int cap_;
  DeviceBuffer logits_;     // [cap, n_expert] f32
  DeviceBuffer ids_;        // [cap, k] int32
  DeviceBuffer weights_;    // [cap, k] f32
  DeviceBuffer offsets_;    // [n_expert + 1] int32: expert e's rows are [offsets[e], offsets[e + 1])
  DeviceBuffer tile_off_;   // [n_expert + 1] int32: first 64-row tile of each expert (grouped GEMM)
  DeviceBuffer active_;     // [n_expert + 1] int32: the experts with rows, then their count at [n_expert]
  DeviceBuffer row_token_;  // [cap * k] int32: the token of each row (rows in expert order)
  DeviceBuffer row_of_;     // [cap, k] int32: the row of each (token, slot)
  DeviceBuffer gu_;         // [cap * k, 2 * n_ff] bf16
  DeviceBuffer h_;          // [cap * k, n_ff] bf16
  DeviceBuffer out_;        // [cap * k, n_embd] bf16 (the cuBLASLt path gathers its input rows here first)
  PinnedBuffer h_ids_;      // cuBLASLt path: [cap * k] int32 routing, then [2 cap k] row_token | row_of
};

}  // namespace kvtier::cuda
