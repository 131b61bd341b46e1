#include "tiny_moe_models.h"

#include <fstream>
#include <iterator>

#include "core/status.h"
#include "loader/test_model_writer.h"
#include "tokenizer/byte_level.h"

namespace kvtier::testing {
namespace {

// 256 byte symbols, one merge ("Ġ t" → "Ġt") and an end-of-turn control token.
GgufMetadata tiny_vocab() {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    byte_level::append_utf8(s, byte_level::byte_to_codepoint(uint8_t(b)));
    tokens.push_back(s);
  }
  tokens.push_back(byte_level::encode(" ") + "t");
  tokens.push_back("<|end|>");
  std::vector<int32_t> types(tokens.size(), 1);
  types.back() = 3;  // control
  return {{"tokenizer.ggml.model", GgufMetaValue::str("gpt2")},
          {"tokenizer.ggml.pre", GgufMetaValue::str("qwen2")},
          {"tokenizer.ggml.tokens", GgufMetaValue::str_array(tokens)},
          {"tokenizer.ggml.token_type", GgufMetaValue::i32_array(types)},
          {"tokenizer.ggml.merges", GgufMetaValue::str_array({byte_level::encode(" ") + " t"})},
          {"tokenizer.ggml.eos_token_id", GgufMetaValue::u32(uint32_t(tokens.size() - 1))}};
}

constexpr int kVocab = 258;

ModelConfig base(const std::string& arch) {
  ModelConfig c;
  c.arch = arch;
  c.name = "tiny-" + arch;
  c.n_layer = 2;
  c.n_embd = 128;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.head_dim = 32;
  c.n_vocab = kVocab;
  c.n_ctx_train = 2048;
  c.rms_eps = 1e-6f;
  c.rope_theta = 1000000.0f;
  return c;
}

}  // namespace

std::vector<std::string> tiny_moe_model_names() { return {"qwen3moe-f32", "qwen3moe-q8_0", "mixtral-q4_0"}; }

void write_tiny_moe_gguf(const std::string& name, const std::string& path) {
  if (name == "qwen3moe-f32" || name == "qwen3moe-q8_0") {
    // Qwen3-MoE: q/k norms, 8 experts, top-2 renormalized.
    ModelConfig c = base("qwen3moe");
    c.qk_norm = true;
    c.n_expert = 8;
    c.n_expert_used = 2;
    c.n_ff_expert = 64;
    c.n_ff = 192;
    write_tiny_gguf(path, c, name == "qwen3moe-f32" ? GgmlType::F32 : GgmlType::Q8_0, 31, tiny_vocab());
  } else if (name == "mixtral-q4_0") {
    // Mixtral: a llama (q/k rows permuted) with 4 experts of n_ff, top-2.
    ModelConfig c = base("llama");
    c.n_expert = 4;
    c.n_expert_used = 2;
    c.n_ff = c.n_ff_expert = 96;
    write_tiny_gguf(path, c, GgmlType::Q4_0, 32, tiny_vocab());
  } else {
    fail("write_tiny_moe_gguf: unknown model '{}'", name);
  }
}

uint64_t file_fnv1a(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KVT_CHECK(in, "{}: cannot open", path);
  uint64_t h = 1469598103934665603ull;
  for (std::istreambuf_iterator<char> it(in), end; it != end; ++it) {
    h ^= uint8_t(*it);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace kvtier::testing
