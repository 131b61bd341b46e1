// Opens a model from a GGUF file or a Hugging Face directory and presents its
// weights under canonical (GGUF-style) names with outermost-first shapes, plus
// the configuration and where its tokenizer lives.
//
// Canonical names: token_embd.weight, output_norm.weight, output.weight,
// blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, attn_q_norm,
// attn_k_norm, ffn_norm, ffn_gate, ffn_up, ffn_down}.weight and
// blk.N.attn_{q,k,v}.bias. Mixture-of-experts layers: blk.N.ffn_gate_inp.weight
// (the router, [n_expert, n_embd]) and the experts either stacked,
// blk.N.ffn_{gate,up,down}_exps.weight ([n_expert, n_ff_expert, n_embd] and
// [n_expert, n_embd, n_ff_expert], GGUF), or one tensor per expert E,
// blk.N.ffn_{gate,up,down}.E.weight (Hugging Face checkpoints).
#pragma once
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/ggml_type.h"
#include "loader/gguf.h"
#include "loader/mapped_file.h"
#include "kvtier/model_config.h"

namespace kvtier {

struct TensorRef {
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> shape;  // outermost first: a linear layer is [n_out, n_in]
  const uint8_t* data = nullptr;
  size_t n_bytes = 0;
  std::string source;  // "<file>:<tensor name in file>", for messages
  int64_t n_elements() const;
};

struct ModelSource {
  std::string path;
  ModelConfig config;
  std::unordered_map<std::string, TensorRef> tensors;
  std::vector<std::shared_ptr<MappedFile>> files;  // keep the mappings alive
  std::unique_ptr<GgufFile> gguf;                  // set when loaded from GGUF
  // Set when loaded from a Hugging Face directory (empty strings when absent).
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  std::string generation_config_json;
  std::vector<int> eos_token_ids;  // from generation_config.json / config.json when present
  bool shape_only = false;         // "shape:NAME": a configuration without weights (loader/model_shapes.h)

  // Throws kvtier::Error naming the tensor when missing.
  const TensorRef& tensor(const std::string& name) const;
  const TensorRef* find(const std::string& name) const;
};

// `path` is a .gguf file, a directory with config.json and *.safetensors, or
// "shape:NAME" (a named configuration without weights: loader/model_shapes.h).
// Validates that every tensor the architecture needs is present with the
// expected shape; throws kvtier::Error otherwise.
ModelSource open_model_source(const std::string& path);

}  // namespace kvtier
