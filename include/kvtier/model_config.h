// Public: hyper-parameters of a Llama-family decoder, filled by the loader from GGUF
// metadata or a Hugging Face config.json.
#pragma once
#include <cstdint>
#include <string>

namespace kvtier {

enum class RopeScaling { none, llama3, linear };

struct ModelConfig {
  std::string arch;  // "llama", "qwen2", "qwen3" (SmolLM2 is "llama")
  std::string name;  // human-readable, from metadata
  int n_layer = 0;
  int n_embd = 0;
  int n_head = 0;
  int n_kv_head = 0;
  int head_dim = 0;
  int n_ff = 0;
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
};

}  // namespace kvtier
