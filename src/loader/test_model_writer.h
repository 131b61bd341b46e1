// Writers for GGUF files, safetensors files and Hugging Face directories, used
// by the loader tests, the fuzz seed corpora and anyone who needs a tiny model
// (random weights with real shapes) on disk. Not used on the inference path.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/ggml_type.h"
#include "loader/gguf.h"
#include "kvtier/model_config.h"

namespace kvtier {

// One GGUF metadata value, already encoded (without its type id).
struct GgufMetaValue {
  GgufValueType type = GgufValueType::UINT8;
  std::vector<uint8_t> payload;

  static GgufMetaValue u8(uint8_t v);
  static GgufMetaValue i32(int32_t v);
  static GgufMetaValue u32(uint32_t v);
  static GgufMetaValue u64(uint64_t v);
  static GgufMetaValue i64(int64_t v);
  static GgufMetaValue f32(float v);
  static GgufMetaValue f64(double v);
  static GgufMetaValue boolean(bool v);
  static GgufMetaValue str(std::string_view v);
  static GgufMetaValue str_array(const std::vector<std::string>& v);
  static GgufMetaValue i32_array(const std::vector<int32_t>& v);
  static GgufMetaValue f32_array(const std::vector<float>& v);
  // An array of arrays (all items must have the same type; nesting is allowed).
  static GgufMetaValue array(GgufValueType elem_type, const std::vector<GgufMetaValue>& items);
};
using GgufMetadata = std::vector<std::pair<std::string, GgufMetaValue>>;

struct WriterTensor {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> shape;  // outermost first, like TensorRef
  std::vector<uint8_t> data;   // encoded rows of `type`
};

// Encodes `values` (row-major, outermost first) as `type`, row by row.
WriterTensor make_tensor(std::string name, GgmlType type, std::vector<int64_t> shape,
                         const std::vector<float>& values);

struct GgufWriteOptions {
  uint32_t version = 3;
  size_t alignment = kGgufDefaultAlignment;  // written as general.alignment when not 32
};
std::vector<uint8_t> encode_gguf(const GgufMetadata& metadata, const std::vector<WriterTensor>& tensors,
                                 const GgufWriteOptions& options = {});
void write_gguf(const std::string& path, const GgufMetadata& metadata,
                const std::vector<WriterTensor>& tensors, const GgufWriteOptions& options = {});

// Tensors must be F32, F16 or BF16. The header is padded to a multiple of 8.
std::vector<uint8_t> encode_safetensors(const std::vector<WriterTensor>& tensors,
                                        const nlohmann::json& metadata = nullptr);
void write_safetensors(const std::string& path, const std::vector<WriterTensor>& tensors);

struct HfDirOptions {
  int n_shards = 1;  // > 1: model-0000k-of-0000n.safetensors + model.safetensors.index.json
  nlohmann::json generation_config;  // written when not null
  std::string tokenizer_json;        // written when not empty
  std::string tokenizer_config_json;
};
// Writes config.json and the weights; tensors carry Hugging Face names.
void write_hf_dir(const std::string& dir, const nlohmann::json& config,
                  const std::vector<WriterTensor>& tensors, const HfDirOptions& options = {});

// ---- tiny random models --------------------------------------------------------

// Random weights for `c` under canonical names, in the Hugging Face layout
// (q/k rows not permuted, one tensor per expert), deterministic in `seed`.
// Linear weights and the embeddings are stored as `weight_type`; norms,
// biases and MoE routers as F32.
std::vector<WriterTensor> make_tiny_weights(const ModelConfig& c, GgmlType weight_type, uint32_t seed);
// GGUF metadata describing `c` (architecture keys only; add tokenizer keys as needed).
GgufMetadata gguf_metadata_for(const ModelConfig& c);
// config.json describing `c`.
nlohmann::json hf_config_for(const ModelConfig& c);
// Permutes the rows of an HF q or k weight/bias ([n_heads * head_dim, ...] f32) into the
// GGUF llama layout, where RoPE pairs are adjacent: GGUF row h*hd + 2i + c is HF
// row h*hd + c*hd/2 + i (what llama.cpp's converter does).
std::vector<float> permute_for_gguf_llama(const std::vector<float>& rows, int n_heads, int head_dim,
                                          int64_t row_len);
// Writes `c` with random weights as a GGUF file (q/k permuted when arch is llama,
// experts stacked) or as a Hugging Face directory (weight_type must then be
// F32, F16 or BF16; MoE: qwen3_moe, or mixtral for a llama with experts).
void write_tiny_gguf(const std::string& path, const ModelConfig& c, GgmlType weight_type, uint32_t seed,
                     const GgufMetadata& extra = {});
void write_tiny_hf_dir(const std::string& dir, const ModelConfig& c, GgmlType weight_type, uint32_t seed,
                       const HfDirOptions& options = {});

}  // namespace kvtier
