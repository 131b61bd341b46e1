// What the GPU model's files share (CUDA builds only): the model with its
// uploaded layers and a sequence's activations. model_weights_cuda.cpp
// uploads the weights (CudaModel's constructor), model_cuda.cpp runs the
// forward pass (CudaSequence).
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda_backend.h"
#include "backend/cuda_device.h"
#include "kv/decode_groups.h"
#include "model/model.h"
#include "model/model_cuda.h"
#include "ops/gemm/gemm_cuda.h"
#include "ops/moe/moe_cuda.h"

namespace kvtier::model_cuda_detail {

using cuda::DeviceBuffer;
using cuda::PinnedBuffer;

// A weight matrix [n_out, n_in] as E4M3 codes with one f32 scale per output
// channel (ops/gemm/gemm_fp8.h): the prompt's products with --prefill-gemm fp8.
struct Fp8Matrix {
  DeviceBuffer q;      // [n_out, n_in] E4M3
  DeviceBuffer scale;  // [n_out] f32
};

struct GpuLayer {
  DeviceBuffer attn_norm, ffn_norm;  // [n_embd] bf16
  DeviceBuffer wqkv;  // [q_dim + 2 kv_dim, n_embd] bf16: wq's rows, then wk's, then wv's (one product for all three)
  DeviceBuffer wo;    // [n_embd, q_dim] bf16
  DeviceBuffer bq, bk, bv;           // [q_dim], [kv_dim], [kv_dim] f32 or empty (Qwen2)
  DeviceBuffer q_norm, k_norm;       // [head_dim] bf16 or empty (Qwen3)
  DeviceBuffer w_gate_up;            // [2 * n_ff, n_embd] bf16: gate rows, then up rows
  DeviceBuffer w_down;               // [n_embd, n_ff] bf16
  // FP8 copies of the dense matrices (PrefillGemm::fp8 only; MoE layers have
  // wq8..wo8 alone).
  Fp8Matrix wq8, wk8, wv8, wo8, w_gate_up8, w_down8;
  // MoE layers instead of w_gate_up / w_down (ops/moe/moe_cuda.h):
  DeviceBuffer moe_router;   // [n_expert, n_embd] bf16
  DeviceBuffer moe_gate_up;  // [n_expert, 2 * n_ff_expert, n_embd] bf16: expert e's gate rows, then its up rows
  DeviceBuffer moe_down;     // [n_expert, n_embd, n_ff_expert] bf16
  cuda::MoeDeviceWeights moe() const { return {moe_router.data(), moe_gate_up.data(), moe_down.data()}; }
};

class CudaSequence;

// The activations of one forward pass. Every forward runs on the model's one
// stream, one at a time (CudaModel::forward_mu_), so all sequences share one
// set, grown to the largest forward asked for: a sequence costs the GPU its
// KV alone, not a prefill chunk's 1.2 GB of activations (Llama-3.1-8B at
// 8192 tokens). `generation` changes when the buffers move, so that a
// captured graph that reads them is captured again.
struct Activations {
  int cap = 0;         // rows (tokens) of every [cap, ...] buffer
  int logit_rows = 0;  // rows of logits / h_logits
  uint64_t generation = 0;
  DeviceBuffer ids;    // [cap] int32
  DeviceBuffer pos;    // [cap] int64
  DeviceBuffer x;      // [cap, n_embd] bf16, residual stream
  DeviceBuffer xb;     // [cap, n_embd] bf16, normed input of a block
  DeviceBuffer delta;  // [cap, n_embd] bf16, a block's output before the residual add
  DeviceBuffer q;      // [cap, n_head, head_dim] bf16
  DeviceBuffer k_pre;  // [cap, n_kv_head, head_dim] bf16, keys before RoPE
  DeviceBuffer k;      // [cap, n_kv_head, head_dim] bf16
  DeviceBuffer v;      // [cap, n_kv_head, head_dim] bf16
  DeviceBuffer qkv;    // [cap, q_dim + 2 kv_dim] bf16: the product with wqkv, before qkv_split
  DeviceBuffer att;    // [cap, n_head, head_dim] bf16
  DeviceBuffer gu;     // [cap, 2 * n_ff] bf16 (empty when every layer is MoE)
  DeviceBuffer h;      // [cap, n_ff] bf16 (empty when every layer is MoE)
  DeviceBuffer logits; // [logit_rows, n_vocab] f32
  DeviceBuffer argmax; // [logit_rows] int32: each row's greedy token
  // PrefillGemm::fp8: a product's input rows as E4M3 and their scales.
  DeviceBuffer x8;        // [cap, max(n_embd, q_dim, n_ff)] E4M3
  DeviceBuffer x8_scale;  // [cap] f32
  std::unique_ptr<cuda::MoeRunner> moe;  // MoE models: the expert block's working memory
  PinnedBuffer h_ids, h_pos;  // staging of the step's inputs
  PinnedBuffer h_logits;      // [logit_rows, n_vocab] f32: the logits' host copy (rows copied after the forward)
  PinnedBuffer h_argmax;      // [logit_rows] int32: argmax's host copy (a graph's copy target)
};

class CudaModel final : public GpuModel {
 public:
  CudaModel(const Model& model, bool graphs, PrefillGemm prefill_gemm);
  ~CudaModel() override;
  std::unique_ptr<GpuSequence> start(int capacity) override;
  void forward_decode(const int32_t* tokens, const int64_t* pos, KvCache* const* kvs, int n_seq,
                      float* logits, int32_t* greedy, const uint8_t* want_logits) override;
  const Device& device() const override { return dev_; }
  Device& device() override { return dev_; }
  size_t weight_bytes() const override { return weight_bytes_; }
  std::string describe() const override {
    return fmt::format("cuda ({}), weights {:.1f} MiB bf16{}", cuda_device_summary(),
                       double(weight_bytes_ - fp8_bytes_) / (1 << 20),
                       fp8_bytes_ ? fmt::format(" + {:.1f} MiB FP8 for prompts", double(fp8_bytes_) / (1 << 20))
                                  : std::string());
  }

 private:
  friend class CudaSequence;
  Device dev_{DeviceKind::cuda};
  const Model& model_;
  const ModelConfig& c_;
  std::vector<GpuLayer> layers_;
  DeviceBuffer tok_embd_;   // [n_vocab, n_embd] bf16
  DeviceBuffer output_;     // [n_vocab, n_embd] bf16, empty when tied to tok_embd_
  DeviceBuffer out_norm_;   // [n_embd] bf16
  DeviceBuffer inv_freq_;   // [head_dim / 2] f32
  size_t weight_bytes_ = 0;  // FP8 copies included
  size_t fp8_bytes_ = 0;     // of which the FP8 copies
  cuda::Gemm gemm_;
  const bool graphs_;
  const bool prefill_fp8_;
  void make_fp8_copies();
  std::mutex forward_mu_;  // one forward at a time: they share act_ and the stream
  Activations act_;
  std::unique_ptr<CudaSequence> batch_;  // forward_decode's graph and arrangement, for up to batch_cap_
  int batch_cap_ = 0;
  void random_weights();
  // act_ with room for `rows` tokens and `logit_rows` rows of logits (grown,
  // never shrunk; callers hold forward_mu_).
  Activations& activations(int rows, int logit_rows);
};

class CudaSequence final : public GpuSequence {
 public:
  CudaSequence(CudaModel& m, int capacity);
  ~CudaSequence() override;
  void forward(const int32_t* tokens, int n_tok, int64_t pos0, KvCache& kv, int n_logits, float* logits) override;
  // CudaModel::forward_decode: token i of the forward is sequence i's step.
  void forward_decode(const int32_t* tokens, const int64_t* pos, KvCache* const* kvs, int n_seq, float* logits,
                      int32_t* greedy, const uint8_t* want_logits);

 private:
  // What the forward pass needs of a cache whose next token sits at `pos`.
  void check_cache(const KvCache& kv, int64_t pos) const;
  // The forward pass's device work, staged inputs to staged logits. n_kv 1:
  // every token goes to kvs[0]; n_kv = n_tok: token i goes to kvs[i].
  void run(Activations& a, int n_tok, KvCache* const* kvs, int n_kv, int n_logits);
  void capture_and_launch(Activations& a, int n_tok, KvCache* const* kvs, int n_kv, int n_logits);

  CudaModel& m_;
  const ModelConfig& c_;
  const int cap_;  // most tokens per forward
  const int64_t q_dim_, kv_dim_;
  cudaStream_t s_;
  cudaGraphExec_t graph_ = nullptr;
  uint64_t graph_key_ = 0, warm_key_ = 0;
  uint64_t act_generation_ = 0;  // the activations' generation the keys were taken with
  // The model's activations for a forward of n_tok tokens and n_logits rows
  // of logits; forgets the captured graph when they moved.
  Activations& activations(int n_tok, int n_logits);
  DecodeGroups groups_;  // forward_decode's arrangement of the batch (rows of one tiered policy together)
};

}  // namespace kvtier::model_cuda_detail
