// A Llama-shaped decoder with random bf16 weights built directly on the GPU,
// and its straight-line prefill and decode step for the `full`, `shadowkv`
// and `yakv` KV policies (STYLE: the decode step reads like the algorithm —
// score the key index, pick top-k, gather from host while attending to what
// is resident, attend to the gathered part, merge by log-sum-exp). Used by
// gpu-bench.
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

// full: every token's bf16 K/V resident, dense attention.
// yakv: 2-bit HIGGS per-token landmarks on the GPU, FP8 K|V on the host.
// shadowkv: rank-r SVD of the pre-RoPE keys and bf16 chunk-8 landmarks on the
//   GPU, bf16 values on the host; keys of the selected chunks rebuilt on the GPU.
enum class Policy { full, yakv, shadowkv };
// "full", "yakv" (reuse on), "yakv-noreuse" (every selected token fetched) or "shadowkv".
Policy parse_policy(const std::string& name);

// The knobs of the GPU decode step; decode_preset() sets the SPEC numbers of
// a policy (the field defaults are yakv's).
struct DecodeConfig {
  Policy policy = Policy::full;
  int n_seq = 1;
  int64_t n_ctx = 0;        // tokens already in the cache
  int n_sink = 4;           // always-resident prefix (yakv 4; shadowkv 0, as ShadowKV)
  int n_window = 64;        // exact local window (yakv 64, shadowkv 32)
  double budget = 0.03125;  // selected share of the prompt (yakv 3.125 %, shadowkv 2048 of 128K)
  bool reuse = true;        // yakv: a slot cache keeps tokens selected again (only misses cross PCIe)
  int rank = 160;           // shadowkv: rank of the pre-RoPE key SVD
  int chunk = 8;            // shadowkv: tokens per landmark (and per selected chunk)
  int n_outlier = 48;       // shadowkv: chunks kept exact on the GPU (K and V)
};
// The preset of a policy name accepted by parse_policy (n_seq, n_ctx left to set).
DecodeConfig decode_preset(const std::string& name);

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
  // Bytes read over PCIe by the last step (misses × entry bytes: yakv's
  // FP8 K|V or shadowkv's bf16 V, both 2·head_dim); syncs.
  uint64_t last_step_pcie_bytes();
  // Tokens selected per (sequence, KV head) each step (shadowkv: chunks × chunk).
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
