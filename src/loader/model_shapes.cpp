#include "loader/model_shapes.h"

#include <map>

#include "core/status.h"

namespace kvtier {
namespace {

// The fields every shape sets: a name, its widths, head_dim 128.
ModelConfig shape(const char* arch, const char* name, int n_layer, int n_embd, int n_head, int n_kv_head, int n_ff) {
  ModelConfig c;
  c.arch = arch;
  c.name = name;
  c.n_layer = n_layer;
  c.n_embd = n_embd;
  c.n_head = n_head;
  c.n_kv_head = n_kv_head;
  c.head_dim = 128;
  c.n_ff = n_ff;
  return c;
}

ModelConfig llama(const char* name, int n_layer, int n_embd, int n_head, int n_kv_head, int n_ff) {
  ModelConfig c = shape("llama", name, n_layer, n_embd, n_head, n_kv_head, n_ff);
  c.n_vocab = 128256;
  c.n_ctx_train = 131072;
  c.rms_eps = 1e-5f;
  c.rope_theta = 500000.0f;
  c.rope_scaling = RopeScaling::llama3;
  c.rope_factor = 8.0f;
  c.rope_low_freq_factor = 1.0f;
  c.rope_high_freq_factor = 4.0f;
  c.rope_original_ctx = 8192;
  return c;
}

ModelConfig qwen3(const char* name, int n_layer, int n_embd, int n_head, int n_kv_head, int n_ff) {
  ModelConfig c = shape("qwen3", name, n_layer, n_embd, n_head, n_kv_head, n_ff);
  c.n_vocab = 151936;
  c.n_ctx_train = 40960;
  c.rms_eps = 1e-6f;
  c.rope_theta = 1000000.0f;
  c.qk_norm = true;
  return c;
}

const std::map<std::string, ModelConfig>& table() {
  static const std::map<std::string, ModelConfig> m = [] {
    std::map<std::string, ModelConfig> t;
    t["llama3.1-8b"] = llama("Llama-3.1-8B (shape)", 32, 4096, 32, 8, 14336);
    t["llama3.2-3b"] = llama("Llama-3.2-3B (shape)", 28, 3072, 24, 8, 8192);
    t["llama3.2-3b"].tied_embeddings = true;
    t["llama3.1-70b"] = llama("Llama-3.1-70B (shape)", 80, 8192, 64, 8, 28672);
    t["qwen3-4b"] = qwen3("Qwen3-4B (shape)", 36, 2560, 32, 8, 9728);
    t["qwen3-4b"].tied_embeddings = true;
    // Qwen3-30B-A3B: every layer a mixture of 128 experts of width 768, 8 per
    // token, renormalized (norm_topk_prob); n_ff is its unused dense width.
    ModelConfig moe = qwen3("Qwen3-30B-A3B (shape)", 48, 2048, 32, 4, 6144);
    moe.arch = "qwen3moe";
    moe.n_expert = 128;
    moe.n_expert_used = 8;
    moe.n_ff_expert = 768;
    moe.expert_norm_topk = true;
    t["qwen3-30b-a3b"] = moe;
    ModelConfig s = shape("llama", "SmolLM2-135M (shape)", 30, 576, 9, 3, 1536);
    s.head_dim = 64;
    s.n_vocab = 49152;
    s.n_ctx_train = 8192;
    s.rope_theta = 100000.0f;
    s.tied_embeddings = true;
    t["smollm2-135m"] = s;
    return t;
  }();
  return m;
}

}  // namespace

ModelConfig model_shape(const std::string& name) {
  auto it = table().find(name);
  if (it == table().end()) {
    std::string names;
    for (const auto& [k, v] : table()) names += (names.empty() ? "" : ", ") + k;
    fail("unknown model shape '{}' (known: {})", name, names);
  }
  return it->second;
}

std::vector<std::string> model_shape_names() {
  std::vector<std::string> v;
  for (const auto& [k, c] : table()) v.push_back(k);
  return v;
}

}  // namespace kvtier
