// Public: hyper-parameters of a Llama-family decoder, filled by the loader from GGUF
// metadata or a Hugging Face config.json. Mixture-of-experts models (Qwen3-MoE,
// Mixtral) replace the SwiGLU feed-forward block of some or all layers by a
// router and n_expert SwiGLU experts, of which each token uses n_expert_used.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace kvtier {

enum class RopeScaling { none, llama3, linear };

struct ModelConfig {
  std::string arch;  // "llama", "qwen2", "qwen3", "qwen3moe" (SmolLM2 and Mixtral are "llama")
  std::string name;  // human-readable, from metadata
  int n_layer = 0;
  int n_embd = 0;
  int n_head = 0;
  int n_kv_head = 0;
  int head_dim = 0;
  int n_ff = 0;  // feed-forward width of the dense layers
  int n_vocab = 0;
  int n_ctx_train = 0;
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  // GGUF "llama" files store q/k rows permuted so that RoPE rotates adjacent
  // pairs (2i, 2i+1); Hugging Face checkpoints and GGUF qwen2/qwen3 rotate
  // (i, i + head_dim/2) ("neox" style).
  bool rope_interleaved = false;
  RopeScaling rope_scaling = RopeScaling::none;
  float rope_factor = 1.0f;            // llama3 / linear
  float rope_low_freq_factor = 1.0f;   // llama3
  float rope_high_freq_factor = 4.0f;  // llama3
  int rope_original_ctx = 8192;        // llama3
  bool tied_embeddings = false;  // no output.weight: reuse token_embd.weight
  bool qkv_bias = false;         // qwen2
  bool qk_norm = false;          // qwen3: RMSNorm over each head of q and k

  // Mixture of experts (n_expert 0: a dense model).
  int n_expert = 0;         // experts per MoE layer
  int n_expert_used = 0;    // experts each token is routed to (top-k)
  int n_ff_expert = 0;      // feed-forward width of one expert
  // Routing weights: softmax over all experts, top-k kept; renormalized to sum
  // 1 over the k when set (Mixtral always, Qwen3-MoE's norm_topk_prob), then
  // multiplied by expert_weights_scale.
  bool expert_norm_topk = true;
  float expert_weights_scale = 1.0f;
  // Which layers are MoE (Qwen3-MoE's decoder_sparse_step and mlp_only_layers):
  // layer l is when (l + 1) % moe_sparse_step == 0 and l is not listed.
  int moe_sparse_step = 1;
  std::vector<int> moe_dense_layers;

  bool is_moe() const { return n_expert > 0; }
  // Parameters of the weights (embeddings, head unless tied, every layer).
  int64_t n_weights() const {
    const int64_t d = n_embd, q = int64_t(n_head) * head_dim, kv = int64_t(n_kv_head) * head_dim;
    int64_t n = int64_t(n_vocab) * d * (tied_embeddings ? 1 : 2) + d;  // embeddings, head, output norm
    for (int l = 0; l < n_layer; ++l) {
      n += d * (q + 2 * kv) + q * d + 2 * d;                                   // q, k, v, o, two norms
      if (qkv_bias) n += q + 2 * kv;
      if (qk_norm) n += 2 * head_dim;
      if (is_moe_layer(l)) n += int64_t(n_expert) * d + int64_t(n_expert) * 3 * d * n_ff_expert;  // router, experts
      else n += 3 * d * int64_t(n_ff);
    }
    return n;
  }
  bool is_moe_layer(int l) const {
    return n_expert > 0 && (l + 1) % moe_sparse_step == 0 &&
           std::find(moe_dense_layers.begin(), moe_dense_layers.end(), l) == moe_dense_layers.end();
  }
};

}  // namespace kvtier
