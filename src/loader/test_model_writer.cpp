#include "loader/test_model_writer.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>

#include "core/status.h"
#include "loader/hf_config.h"
#include "ops/dequant/dequant.h"

namespace kvtier {

namespace fs = std::filesystem;

namespace {

template <class T>
void put(std::vector<uint8_t>& out, T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.insert(out.end(), b, b + sizeof(T));
}

void put_string(std::vector<uint8_t>& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

template <class T>
GgufMetaValue scalar(GgufValueType t, T v) {
  GgufMetaValue m;
  m.type = t;
  put(m.payload, v);
  return m;
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  KVT_CHECK(out, "{}: cannot create", path);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  KVT_CHECK(out.good(), "{}: write failed", path);
}

void write_text(const fs::path& path, const std::string& text) {
  write_file(path.string(), std::vector<uint8_t>(text.begin(), text.end()));
}

const char* safetensors_dtype(GgmlType t, const std::string& name) {
  switch (t) {
    case GgmlType::F32: return "F32";
    case GgmlType::F16: return "F16";
    case GgmlType::BF16: return "BF16";
    default: fail("write_safetensors: tensor '{}' has type {}, expected F32, F16 or BF16", name,
                  ggml_type_name(t));
  }
}

}  // namespace

GgufMetaValue GgufMetaValue::u8(uint8_t v) { return scalar(GgufValueType::UINT8, v); }
GgufMetaValue GgufMetaValue::i32(int32_t v) { return scalar(GgufValueType::INT32, v); }
GgufMetaValue GgufMetaValue::u32(uint32_t v) { return scalar(GgufValueType::UINT32, v); }
GgufMetaValue GgufMetaValue::u64(uint64_t v) { return scalar(GgufValueType::UINT64, v); }
GgufMetaValue GgufMetaValue::i64(int64_t v) { return scalar(GgufValueType::INT64, v); }
GgufMetaValue GgufMetaValue::f32(float v) { return scalar(GgufValueType::FLOAT32, v); }
GgufMetaValue GgufMetaValue::f64(double v) { return scalar(GgufValueType::FLOAT64, v); }
GgufMetaValue GgufMetaValue::boolean(bool v) { return scalar(GgufValueType::BOOL, uint8_t(v)); }

GgufMetaValue GgufMetaValue::str(std::string_view v) {
  GgufMetaValue m;
  m.type = GgufValueType::STRING;
  put_string(m.payload, v);
  return m;
}

GgufMetaValue GgufMetaValue::str_array(const std::vector<std::string>& v) {
  std::vector<GgufMetaValue> items;
  for (const auto& s : v) items.push_back(str(s));
  return array(GgufValueType::STRING, items);
}

GgufMetaValue GgufMetaValue::i32_array(const std::vector<int32_t>& v) {
  std::vector<GgufMetaValue> items;
  for (int32_t x : v) items.push_back(i32(x));
  return array(GgufValueType::INT32, items);
}

GgufMetaValue GgufMetaValue::f32_array(const std::vector<float>& v) {
  std::vector<GgufMetaValue> items;
  for (float x : v) items.push_back(f32(x));
  return array(GgufValueType::FLOAT32, items);
}

GgufMetaValue GgufMetaValue::array(GgufValueType elem_type, const std::vector<GgufMetaValue>& items) {
  GgufMetaValue m;
  m.type = GgufValueType::ARRAY;
  put<uint32_t>(m.payload, uint32_t(elem_type));
  put<uint64_t>(m.payload, items.size());
  for (const auto& it : items) {
    KVT_CHECK(it.type == elem_type, "GgufMetaValue::array: item of type {} in an array of {}",
              gguf_value_type_name(it.type), gguf_value_type_name(elem_type));
    // array elements are encoded without their own type id; nested arrays keep
    // their element type + count header, which is part of their payload
    m.payload.insert(m.payload.end(), it.payload.begin(), it.payload.end());
  }
  return m;
}

WriterTensor make_tensor(std::string name, GgmlType type, std::vector<int64_t> shape,
                         const std::vector<float>& values) {
  WriterTensor t{std::move(name), type, std::move(shape), {}};
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  KVT_CHECK(int64_t(values.size()) == n, "make_tensor '{}': {} values for {} elements", t.name,
            values.size(), n);
  int64_t row = t.shape.empty() ? 1 : t.shape.back();
  int64_t n_rows = row > 0 ? n / row : 0;
  size_t row_bytes = ggml_row_bytes(type, row);
  t.data.resize(row_bytes * size_t(n_rows));
  for (int64_t r = 0; r < n_rows; ++r)
    quantize_row(type, values.data() + r * row, t.data.data() + size_t(r) * row_bytes, row);
  return t;
}

std::vector<uint8_t> encode_gguf(const GgufMetadata& metadata, const std::vector<WriterTensor>& tensors,
                                 const GgufWriteOptions& o) {
  std::vector<uint8_t> out;
  GgufMetadata kv = metadata;
  if (o.alignment != kGgufDefaultAlignment)
    kv.emplace_back("general.alignment", GgufMetaValue::u32(uint32_t(o.alignment)));
  put<uint32_t>(out, kGgufMagic);
  put<uint32_t>(out, o.version);
  put<uint64_t>(out, tensors.size());
  put<uint64_t>(out, kv.size());
  for (const auto& [key, v] : kv) {
    put_string(out, key);
    put<uint32_t>(out, uint32_t(v.type));
    out.insert(out.end(), v.payload.begin(), v.payload.end());
  }
  auto align = [&](uint64_t x) { return (x + o.alignment - 1) / o.alignment * o.alignment; };
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    put_string(out, t.name);
    put<uint32_t>(out, uint32_t(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) put<uint64_t>(out, uint64_t(*it));
    put<uint32_t>(out, uint32_t(t.type));
    put<uint64_t>(out, offset);
    offset = align(offset + t.data.size());
  }
  out.resize(align(out.size()), 0);
  for (const auto& t : tensors) {
    out.insert(out.end(), t.data.begin(), t.data.end());
    out.resize(align(out.size()), 0);
  }
  return out;
}

void write_gguf(const std::string& path, const GgufMetadata& metadata,
                const std::vector<WriterTensor>& tensors, const GgufWriteOptions& options) {
  write_file(path, encode_gguf(metadata, tensors, options));
}

std::vector<uint8_t> encode_safetensors(const std::vector<WriterTensor>& tensors,
                                        const nlohmann::json& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.is_null()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", safetensors_dtype(t.type, t.name)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');  // keeps the data buffer 8-byte aligned
  std::vector<uint8_t> out;
  put<uint64_t>(out, text.size());
  out.insert(out.end(), text.begin(), text.end());
  for (const auto& t : tensors) out.insert(out.end(), t.data.begin(), t.data.end());
  return out;
}

void write_safetensors(const std::string& path, const std::vector<WriterTensor>& tensors) {
  write_file(path, encode_safetensors(tensors));
}

void write_hf_dir(const std::string& dir, const nlohmann::json& config,
                  const std::vector<WriterTensor>& tensors, const HfDirOptions& o) {
  fs::path root(dir);
  fs::create_directories(root);
  write_text(root / "config.json", config.dump(2));
  if (!o.generation_config.is_null()) write_text(root / "generation_config.json", o.generation_config.dump(2));
  if (!o.tokenizer_json.empty()) write_text(root / "tokenizer.json", o.tokenizer_json);
  if (!o.tokenizer_config_json.empty()) write_text(root / "tokenizer_config.json", o.tokenizer_config_json);
  if (o.n_shards <= 1) {
    write_safetensors((root / "model.safetensors").string(), tensors);
    return;
  }
  nlohmann::json weight_map = nlohmann::json::object();
  size_t total = 0;
  size_t per_shard = (tensors.size() + size_t(o.n_shards) - 1) / size_t(o.n_shards);
  for (int s = 0; s < o.n_shards; ++s) {
    std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, o.n_shards);
    std::vector<WriterTensor> part;
    for (size_t i = size_t(s) * per_shard; i < std::min(tensors.size(), size_t(s + 1) * per_shard); ++i) {
      part.push_back(tensors[i]);
      weight_map[tensors[i].name] = name;
      total += tensors[i].data.size();
    }
    write_safetensors((root / name).string(), part);
  }
  nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_text(root / "model.safetensors.index.json", index.dump(2));
}

// ---- tiny random models --------------------------------------------------------

namespace {

struct FloatTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
  bool is_matrix;  // stored as the weight type; vectors stay F32
};

std::vector<FloatTensor> tiny_float_weights(const ModelConfig& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<FloatTensor> out;
  auto matrix = [&](std::string name, int64_t rows, int64_t cols, float scale) {
    std::vector<float> v(size_t(rows * cols));
    for (auto& x : v) x = g(rng) * scale;
    out.push_back({std::move(name), {rows, cols}, std::move(v), true});
  };
  auto vec = [&](std::string name, int64_t n, float mean, float scale) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = mean + g(rng) * scale;
    out.push_back({std::move(name), {n}, std::move(v), false});
  };
  const int64_t d = c.n_embd, q = int64_t(c.n_head) * c.head_dim, kv = int64_t(c.n_kv_head) * c.head_dim;
  matrix("token_embd.weight", c.n_vocab, d, 1.0f);
  for (int l = 0; l < c.n_layer; ++l) {
    auto n = [l](const char* s) { return fmt::format("blk.{}.{}", l, s); };
    vec(n("attn_norm.weight"), d, 1.0f, 0.1f);
    matrix(n("attn_q.weight"), q, d, 1.0f / std::sqrt(float(d)));
    matrix(n("attn_k.weight"), kv, d, 1.0f / std::sqrt(float(d)));
    matrix(n("attn_v.weight"), kv, d, 1.0f / std::sqrt(float(d)));
    matrix(n("attn_output.weight"), d, q, 1.0f / std::sqrt(float(q)));
    if (c.qkv_bias) {
      vec(n("attn_q.bias"), q, 0.0f, 0.1f);
      vec(n("attn_k.bias"), kv, 0.0f, 0.1f);
      vec(n("attn_v.bias"), kv, 0.0f, 0.1f);
    }
    if (c.qk_norm) {
      vec(n("attn_q_norm.weight"), c.head_dim, 1.0f, 0.1f);
      vec(n("attn_k_norm.weight"), c.head_dim, 1.0f, 0.1f);
    }
    vec(n("ffn_norm.weight"), d, 1.0f, 0.1f);
    if (c.is_moe_layer(l)) {
      // The router stays F32 (llama.cpp never quantizes it); logits ~ N(0, 1).
      matrix(n("ffn_gate_inp.weight"), c.n_expert, d, 1.0f / std::sqrt(float(d)));
      out.back().is_matrix = false;
      const int64_t f = c.n_ff_expert;
      for (int e = 0; e < c.n_expert; ++e) {
        matrix(fmt::format("blk.{}.ffn_gate.{}.weight", l, e), f, d, 1.0f / std::sqrt(float(d)));
        matrix(fmt::format("blk.{}.ffn_up.{}.weight", l, e), f, d, 1.0f / std::sqrt(float(d)));
        matrix(fmt::format("blk.{}.ffn_down.{}.weight", l, e), d, f, 1.0f / std::sqrt(float(f)));
      }
      continue;
    }
    matrix(n("ffn_gate.weight"), c.n_ff, d, 1.0f / std::sqrt(float(d)));
    matrix(n("ffn_up.weight"), c.n_ff, d, 1.0f / std::sqrt(float(d)));
    matrix(n("ffn_down.weight"), d, c.n_ff, 1.0f / std::sqrt(float(c.n_ff)));
  }
  vec("output_norm.weight", d, 1.0f, 0.1f);
  if (!c.tied_embeddings) matrix("output.weight", c.n_vocab, d, 1.0f / std::sqrt(float(d)));
  return out;
}

WriterTensor encode(const FloatTensor& t, GgmlType weight_type) {
  return make_tensor(t.name, t.is_matrix ? weight_type : GgmlType::F32, t.shape, t.values);
}

// Llama-3 RoPE frequency divisors as llama.cpp's converter stores them in
// rope_freqs.weight (from the "llama3" rope_scaling of config.json).
std::vector<float> llama3_rope_factors(const ModelConfig& c) {
  const double pi = 3.14159265358979323846;
  double low_wavelen = c.rope_original_ctx / c.rope_low_freq_factor;
  double high_wavelen = c.rope_original_ctx / c.rope_high_freq_factor;
  std::vector<float> f;
  for (int i = 0; i < c.head_dim / 2; ++i) {
    double freq = std::pow(double(c.rope_theta), -2.0 * i / c.head_dim);
    double wavelen = 2 * pi / freq;
    if (wavelen < high_wavelen) {
      f.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      f.push_back(c.rope_factor);
    } else {
      double smooth = (c.rope_original_ctx / wavelen - c.rope_low_freq_factor) /
                      (c.rope_high_freq_factor - c.rope_low_freq_factor);
      f.push_back(float(1.0 / ((1 - smooth) / c.rope_factor + smooth)));
    }
  }
  return f;
}

// GGUF stores a layer's experts stacked: blk.N.ffn_gate.E.weight for every E
// → blk.N.ffn_gate_exps.weight [n_expert, rows, cols] (likewise up, down),
// placed where expert 0's matrix was.
std::vector<FloatTensor> stack_experts(std::vector<FloatTensor> in, int n_expert) {
  static const std::regex per_expert(R"(blk\.(\d+)\.(ffn_(?:gate|up|down))\.(\d+)\.weight)");
  std::vector<FloatTensor> out;
  std::map<std::string, size_t> stack_at;  // stacked name → index in out
  for (auto& t : in) {
    std::smatch m;
    if (!std::regex_match(t.name, m, per_expert)) {
      out.push_back(std::move(t));
      continue;
    }
    const std::string name = fmt::format("blk.{}.{}_exps.weight", m[1].str(), m[2].str());
    auto it = stack_at.find(name);
    if (it == stack_at.end()) {
      it = stack_at.emplace(name, out.size()).first;
      out.push_back({name, {n_expert, t.shape[0], t.shape[1]}, {}, true});
    }
    KVT_CHECK(std::stoi(m[3].str()) * t.values.size() == out[it->second].values.size(),
              "stack_experts: {} out of order", t.name);
    auto& v = out[it->second].values;
    v.insert(v.end(), t.values.begin(), t.values.end());
  }
  return out;
}

// model_type of config.json for an arch (Mixtral is a llama with experts).
std::string hf_model_type(const ModelConfig& c) {
  if (c.arch == "qwen3moe") return "qwen3_moe";
  if (c.arch == "llama" && c.is_moe()) return "mixtral";
  return c.arch;
}

}  // namespace

std::vector<WriterTensor> make_tiny_weights(const ModelConfig& c, GgmlType weight_type, uint32_t seed) {
  std::vector<WriterTensor> out;
  for (const auto& t : tiny_float_weights(c, seed)) out.push_back(encode(t, weight_type));
  return out;
}

std::vector<float> permute_for_gguf_llama(const std::vector<float>& rows, int n_heads, int head_dim,
                                          int64_t row_len) {
  KVT_CHECK(int64_t(rows.size()) == int64_t(n_heads) * head_dim * row_len && head_dim % 2 == 0,
            "permute_for_gguf_llama: {} values for {} heads × {} × {}", rows.size(), n_heads,
            head_dim, row_len);
  std::vector<float> out(rows.size());
  const int half = head_dim / 2;
  for (int h = 0; h < n_heads; ++h)
    for (int i = 0; i < half; ++i)
      for (int c = 0; c < 2; ++c) {
        int64_t dst = int64_t(h) * head_dim + 2 * i + c;
        int64_t src = int64_t(h) * head_dim + c * half + i;
        std::copy_n(rows.begin() + src * row_len, row_len, out.begin() + dst * row_len);
      }
  return out;
}

GgufMetadata gguf_metadata_for(const ModelConfig& c) {
  const std::string p = c.arch + ".";
  GgufMetadata m = {
      {"general.architecture", GgufMetaValue::str(c.arch)},
      {"general.name", GgufMetaValue::str(c.name.empty() ? "tiny-" + c.arch : c.name)},
      {p + "block_count", GgufMetaValue::u32(uint32_t(c.n_layer))},
      {p + "context_length", GgufMetaValue::u32(uint32_t(c.n_ctx_train))},
      {p + "embedding_length", GgufMetaValue::u32(uint32_t(c.n_embd))},
      {p + "feed_forward_length", GgufMetaValue::u32(uint32_t(c.n_ff))},
      {p + "attention.head_count", GgufMetaValue::u32(uint32_t(c.n_head))},
      {p + "attention.head_count_kv", GgufMetaValue::u32(uint32_t(c.n_kv_head))},
      {p + "attention.key_length", GgufMetaValue::u32(uint32_t(c.head_dim))},
      {p + "attention.value_length", GgufMetaValue::u32(uint32_t(c.head_dim))},
      {p + "rope.dimension_count", GgufMetaValue::u32(uint32_t(c.head_dim))},
      {p + "rope.freq_base", GgufMetaValue::f32(c.rope_theta)},
      {p + "attention.layer_norm_rms_epsilon", GgufMetaValue::f32(c.rms_eps)},
  };
  if (c.rope_scaling == RopeScaling::linear) {
    m.emplace_back(p + "rope.scaling.type", GgufMetaValue::str("linear"));
    m.emplace_back(p + "rope.scaling.factor", GgufMetaValue::f32(c.rope_factor));
  }
  if (c.is_moe()) {
    // llama.cpp's MoE archs renormalize the top-k and make every layer MoE.
    KVT_CHECK(c.expert_norm_topk && c.moe_sparse_step == 1 && c.moe_dense_layers.empty(),
              "gguf_metadata_for: GGUF MoE models renormalize the top-k weights and have no dense layers");
    m.emplace_back(p + "expert_count", GgufMetaValue::u32(uint32_t(c.n_expert)));
    m.emplace_back(p + "expert_used_count", GgufMetaValue::u32(uint32_t(c.n_expert_used)));
    if (c.arch == "qwen3moe")
      m.emplace_back(p + "expert_feed_forward_length", GgufMetaValue::u32(uint32_t(c.n_ff_expert)));
    else
      KVT_CHECK(c.n_ff == c.n_ff_expert, "gguf_metadata_for: llama experts are n_ff wide ({} != {})", c.n_ff,
                c.n_ff_expert);
  }
  return m;
}

nlohmann::json hf_config_for(const ModelConfig& c) {
  nlohmann::json j = {
      {"model_type", hf_model_type(c)},
      {"_name_or_path", c.name.empty() ? "tiny-" + c.arch : c.name},
      {"num_hidden_layers", c.n_layer},
      {"hidden_size", c.n_embd},
      {"num_attention_heads", c.n_head},
      {"num_key_value_heads", c.n_kv_head},
      {"head_dim", c.head_dim},
      {"intermediate_size", c.n_ff},
      {"vocab_size", c.n_vocab},
      {"max_position_embeddings", c.n_ctx_train},
      {"rms_norm_eps", c.rms_eps},
      {"rope_theta", c.rope_theta},
      {"tie_word_embeddings", c.tied_embeddings},
      {"attention_bias", c.qkv_bias},
      {"hidden_act", "silu"},
      {"rope_scaling", nullptr},
  };
  if (c.rope_scaling == RopeScaling::llama3)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope_factor},
                         {"low_freq_factor", c.rope_low_freq_factor},
                         {"high_freq_factor", c.rope_high_freq_factor},
                         {"original_max_position_embeddings", c.rope_original_ctx}};
  if (c.rope_scaling == RopeScaling::linear)
    j["rope_scaling"] = {{"type", "linear"}, {"factor", c.rope_factor}};
  if (hf_model_type(c) == "mixtral") {
    KVT_CHECK(c.n_ff == c.n_ff_expert && c.expert_norm_topk && c.moe_sparse_step == 1 && c.moe_dense_layers.empty(),
              "hf_config_for: mixtral experts are intermediate_size wide, renormalized, in every layer");
    j["num_local_experts"] = c.n_expert;
    j["num_experts_per_tok"] = c.n_expert_used;
    j["sliding_window"] = nullptr;
  } else if (c.arch == "qwen3moe") {
    j["num_experts"] = c.n_expert;
    j["num_experts_per_tok"] = c.n_expert_used;
    j["moe_intermediate_size"] = c.n_ff_expert;
    j["norm_topk_prob"] = c.expert_norm_topk;
    j["decoder_sparse_step"] = c.moe_sparse_step;
    j["mlp_only_layers"] = c.moe_dense_layers;
    j["use_sliding_window"] = false;
  }
  return j;
}

void write_tiny_gguf(const std::string& path, const ModelConfig& c, GgmlType weight_type, uint32_t seed,
                     const GgufMetadata& extra) {
  auto weights = stack_experts(tiny_float_weights(c, seed), c.n_expert);
  std::vector<WriterTensor> tensors;
  for (auto& t : weights) {
    bool is_q = t.name.find(".attn_q.") != std::string::npos;
    bool is_k = t.name.find(".attn_k.") != std::string::npos;
    if (c.arch == "llama" && (is_q || is_k)) {
      int64_t row_len = t.shape.size() == 2 ? t.shape[1] : 1;
      t.values = permute_for_gguf_llama(t.values, is_q ? c.n_head : c.n_kv_head, c.head_dim, row_len);
    }
    tensors.push_back(encode(t, weight_type));
  }
  if (c.rope_scaling == RopeScaling::llama3)
    tensors.push_back(make_tensor("rope_freqs.weight", GgmlType::F32, {c.head_dim / 2},
                                  llama3_rope_factors(c)));
  GgufMetadata meta = gguf_metadata_for(c);
  meta.insert(meta.end(), extra.begin(), extra.end());
  write_gguf(path, meta, tensors);
}

void write_tiny_hf_dir(const std::string& dir, const ModelConfig& c, GgmlType weight_type, uint32_t seed,
                       const HfDirOptions& options) {
  std::vector<WriterTensor> tensors;
  for (auto& t : make_tiny_weights(c, weight_type, seed)) {
    t.name = canonical_to_hf_name(t.name, hf_model_type(c));
    tensors.push_back(std::move(t));
  }
  write_hf_dir(dir, hf_config_for(c), tensors, options);
}

}  // namespace kvtier
