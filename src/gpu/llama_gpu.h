// A Llama-shaped decoder with random bf16 weights built directly on the GPU,
// and its straight-line prefill and decode step for the `full` and `yakv`
// KV policies (STYLE: the decode step reads like the algorithm — score the
// key index, pick top-k, gather from host while attending to what is resident,
// attend to the gathered part, merge by log-sum-exp). Used by gpu-bench.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda_backend.h"
#include "ops/gemm/gemm_cuda.h"

namespace kvtier::gpu {

struct LlamaShape {
  int n_layer = 32, n_embd = 4096, n_head = 32, n_kv_head = 8, head_dim = 128, n_ff = 14336, n_vocab = 128256;
  float rope_theta = 500000.f;
};

struct LayerWeights {
  cuda::DeviceBuffer attn_norm, wqkv, wo, ffn_norm, w_gate_up, w_down;  // bf16
};

class LlamaGpu {
 public:
  explicit LlamaGpu(const LlamaShape& s, uint64_t seed);
  const LlamaShape& shape() const { return s_; }
  size_t weight_bytes() const { return weight_bytes_; }
  const LayerWeights& layer(int i) const { return layers_[size_t(i)]; }
  const void* embedding() const { return tok_embd_.data(); }
  const void* output_norm() const { return out_norm_.data(); }
  const void* lm_head() const { return lm_head_.data(); }
  const float* inv_freq() const { return inv_freq_.data<float>(); }
  cuda::Gemm& gemm() { return gemm_; }

 private:
  LlamaShape s_;
  std::vector<LayerWeights> layers_;
  cuda::DeviceBuffer tok_embd_, out_norm_, lm_head_, inv_freq_;
  size_t weight_bytes_ = 0;
  cuda::Gemm gemm_;
};

// Per-stage time of one decode step (ms), summed over layers.
struct StageTimes {
  double score = 0, select = 0, gather = 0, attention = 0, rest = 0;
};

enum class Policy { full, yakv };
// "full", "yakv" (reuse on) or "yakv-noreuse" (every selected token fetched).
Policy parse_policy(const std::string& name);

struct DecodeConfig {
  Policy policy = Policy::full;
  int n_seq = 1;
  int64_t n_ctx = 0;        // tokens already in the cache
  int n_sink = 4;           // yakv: always-resident prefix
  int n_window = 64;        // yakv: local window
  double budget = 0.03125;  // yakv: top-k share of the prompt
  bool reuse = true;        // yakv: reuse tokens gathered in the previous step
};

// The KV state of one policy for n_seq sequences of n_ctx tokens, random
// contents, and the decode step over it.
class DecodeState {
 public:
  DecodeState(LlamaGpu& model, const DecodeConfig& cfg, uint64_t seed);
  ~DecodeState();
  // One step for all sequences; with `timing`, per-stage events are recorded
  // and stage_times() filled after the step's completion.
  void step(cudaStream_t s, bool timing);
  StageTimes stage_times() const;
  size_t gpu_bytes() const { return gpu_bytes_; }
  size_t host_bytes() const { return host_bytes_; }
  // Bytes read over PCIe by the last step (misses × entry bytes); syncs.
  uint64_t last_step_pcie_bytes();
  int top_k() const { return k_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  size_t gpu_bytes_ = 0, host_bytes_ = 0;
  int k_ = 0;
};

// Prefill of n_tok tokens for one sequence (full attention); returns ms.
double time_prefill(LlamaGpu& model, int64_t n_tok, cudaStream_t s);

}  // namespace kvtier::gpu
