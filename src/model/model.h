// A Llama-family decoder (Llama 2/3.x, SmolLM2, Qwen2/2.5, Qwen3, and the
// mixtures of experts Qwen3-MoE and Mixtral) on the CPU: weights viewed in
// place from the memory-mapped file where the matmul runs their type
// natively, converted to f32 otherwise (experts: when used, see ops/moe); a
// straight-line forward.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kv/kv_cache.h"
#include "kv/kv_store.h"
#include "loader/model_source.h"
#include "kvtier/model_config.h"
#include "ops/matmul/matmul.h"
#include "ops/moe/moe.h"
#include "ops/rope/rope.h"

namespace kvtier {

struct LayerWeights {
  std::vector<float> attn_norm;                // [n_embd]
  WeightView wq, wk, wv, wo;                   // [n_head*hd, n_embd] ... [n_embd, n_head*hd]
  std::vector<float> bq, bk, bv;               // [n_head*hd], [n_kv*hd], [n_kv*hd] or empty
  std::vector<float> q_norm, k_norm;           // [head_dim] or empty
  std::vector<float> ffn_norm;                 // [n_embd]
  WeightView w_gate, w_up, w_down;             // [n_ff, n_embd], [n_ff, n_embd], [n_embd, n_ff]
  MoeWeights moe;                              // MoE layers instead of w_gate/w_up/w_down
};

// Layer l's router and experts (a MoE layer of src), viewed in place: slices
// of the stacked GGUF tensors or the per-expert tensors of a Hugging Face
// checkpoint. The router is viewed as stored (callers convert it if needed).
MoeWeights view_experts(const ModelSource& src, int layer);
// The MoE block's sizes and routing rule from a model's config.
MoeConfig moe_config(const ModelConfig& c);

// Per-sequence working memory for up to `capacity` tokens per forward.
struct ForwardScratch {
  int capacity = 0;
  std::vector<float> x, xb, q, k, k_pre, v, att, gate, up;
  std::vector<float> moe_out;  // [capacity, n_embd] (MoE models)
  MoeScratch moe;
  std::vector<int64_t> positions;
};

class Model {
 public:
  explicit Model(ModelSource source);

  const ModelConfig& config() const { return source_.config; }
  const ModelSource& source() const { return source_; }
  KvGeometry kv_geometry() const;

  ForwardScratch make_scratch(int capacity) const;

  // Runs tokens [n_tok] at positions [pos0, pos0 + n_tok) through every layer,
  // appending their keys/values to `kv` (a CPU cache). logits: [n_logits,
  // n_vocab] for the last n_logits tokens (0: none, e.g. for prompt chunks
  // before the last).
  void forward(const int32_t* tokens, int n_tok, int64_t pos0, KvCache& kv, ForwardScratch& s,
               int n_logits, float* logits) const;
  // One decode step of n_seq sequences together: tokens[i] at position
  // pos[i], appended to and attending through kvs[i] (CPU caches; policies
  // may differ). The weight products run over the batch, so each weight is
  // read once for all of them; logits: [n_seq, n_vocab]. Row i equals what
  // forward() gives sequence i alone while the batch takes the quantized
  // decode products (n_seq < matmul_decode_max_tokens()).
  void forward_decode(const int32_t* tokens, const int64_t* pos, KvCache* const* kvs, int n_seq,
                      ForwardScratch& s, float* logits) const;

 private:
  void check_cpu_cache(const KvCache& kv) const;
  // Embeds tokens [n_tok] (positions in s.positions), runs every layer
  // (attend(l) moves layer l's k/v into the cache(s) and fills s.att from
  // s.q) and the head for the last n_logits tokens.
  void run_layers(const int32_t* tokens, int n_tok, ForwardScratch& s, const std::function<void(int)>& attend,
                  int n_logits, float* logits) const;
  WeightView view_matrix(const std::string& name);
  std::vector<float> load_vector(const std::string& name, int64_t expected);
  std::vector<float> maybe_vector(const std::string& name, int64_t expected);

  ModelSource source_;
  std::vector<std::vector<float>> owned_;  // f32 copies of weights in unsupported types
  std::vector<LayerWeights> layers_;
  const TensorRef* tok_embd_ = nullptr;
  WeightView output_;
  std::vector<float> output_norm_;
  std::unique_ptr<Rope> rope_;
  MoeConfig moe_;  // MoE models
};

}  // namespace kvtier
