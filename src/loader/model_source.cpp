#include "loader/model_source.h"

#include "loader/model_shapes.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/status.h"
#include "loader/hf_config.h"
#include "loader/safetensors.h"

namespace kvtier {

namespace fs = std::filesystem;

int64_t TensorRef::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const TensorRef* ModelSource::find(const std::string& name) const {
  auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

const TensorRef& ModelSource::tensor(const std::string& name) const {
  const TensorRef* t = find(name);
  KVT_CHECK(t, "{}: missing tensor '{}'", path, name);
  return *t;
}

namespace {

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// ---- GGUF ---------------------------------------------------------------------

int gguf_dim(const GgufFile& g, const std::string& key, std::optional<int64_t> fallback = {}) {
  auto v = g.get_int(key);
  if (!v && fallback) v = fallback;
  KVT_CHECK(v, "{}: missing metadata key '{}' (expected a positive integer)", g.path(), key);
  KVT_CHECK(*v > 0 && *v < (int64_t(1) << 30), "{}: metadata key '{}' is {}, expected a positive "
            "integer below 2^30", g.path(), key, *v);
  return int(*v);
}

// Experts of qwen3moe (always) and of llama (Mixtral: when expert_count > 0),
// with llama.cpp's semantics: every layer is MoE, the routing weights are the
// softmax over all experts, top-k, renormalized, times expert_weights_scale
// when that is set to neither 0 nor 1.
void gguf_moe_config(const GgufFile& g, const std::string& p, ModelConfig* c) {
  const std::string& file = g.path();
  const int64_t n_expert = g.get_int(p + "expert_count").value_or(0);
  if (c->arch == "qwen3moe")
    KVT_CHECK(n_expert > 0, "{}: qwen3moe needs '{}expert_count' > 0", file, p);
  if (n_expert == 0) return;
  c->n_expert = gguf_dim(g, p + "expert_count");
  c->n_expert_used = gguf_dim(g, p + "expert_used_count");
  KVT_CHECK(c->n_expert_used <= c->n_expert, "{}: '{}expert_used_count' is {}, more than the {} experts", file, p,
            c->n_expert_used, c->n_expert);
  for (const char* key : {"expert_shared_count", "expert_shared_feed_forward_length"})
    if (auto v = g.get_int(p + key))
      KVT_CHECK(*v == 0, "{}: '{}{}' is {}: shared experts are not supported", file, p, key, *v);
  // llama.cpp's qwen3moe falls back to n_ff / n_expert_used without the key.
  c->n_ff_expert = c->arch == "qwen3moe"
                       ? gguf_dim(g, p + "expert_feed_forward_length", c->n_ff / c->n_expert_used)
                       : c->n_ff;
  c->expert_norm_topk = true;
  if (auto v = g.get_float(p + "expert_weights_scale"); v && *v != 0.0)
    c->expert_weights_scale = float(*v);
}

ModelConfig gguf_config(const GgufFile& g) {
  const std::string& file = g.path();
  ModelConfig c;
  auto arch = g.get_string("general.architecture");
  KVT_CHECK(arch, "{}: missing metadata key 'general.architecture'", file);
  if (*arch != "llama" && *arch != "qwen2" && *arch != "qwen3" && *arch != "qwen3moe")
    fail("{}: architecture '{}' is not supported (expected llama, qwen2, qwen3 or qwen3moe)", file, *arch);
  c.arch = *arch;
  const std::string p = c.arch + ".";
  c.name = g.get_string("general.name").value_or(fs::path(file).stem().string());
  c.n_layer = gguf_dim(g, p + "block_count");
  c.n_embd = gguf_dim(g, p + "embedding_length");
  c.n_ff = gguf_dim(g, p + "feed_forward_length");
  c.n_head = gguf_dim(g, p + "attention.head_count");
  c.n_kv_head = gguf_dim(g, p + "attention.head_count_kv", c.n_head);
  c.head_dim = gguf_dim(g, p + "attention.key_length", c.n_embd / std::max(c.n_head, 1));
  if (auto v = g.get_int(p + "attention.value_length"))
    KVT_CHECK(*v == c.head_dim, "{}: '{}attention.value_length' is {}, expected it to equal the "
              "key length {}", file, p, *v, c.head_dim);
  if (auto v = g.get_int(p + "rope.dimension_count"))
    KVT_CHECK(*v == c.head_dim, "{}: '{}rope.dimension_count' is {}, expected the head dimension {} "
              "(partial rotary embeddings are not supported)", file, p, *v, c.head_dim);
  c.n_ctx_train = int(std::clamp<int64_t>(g.get_int(p + "context_length").value_or(0), 0, 1 << 30));
  auto eps = g.get_float(p + "attention.layer_norm_rms_epsilon");
  KVT_CHECK(eps, "{}: missing metadata key '{}attention.layer_norm_rms_epsilon'", file, p);
  c.rms_eps = float(*eps);
  c.rope_theta = float(g.get_float(p + "rope.freq_base").value_or(10000.0));
  // GGUF "llama" q/k rows are permuted by the converter so RoPE rotates adjacent
  // pairs; qwen2/qwen3 keep the Hugging Face (neox) layout.
  c.rope_interleaved = c.arch == "llama";
  std::string scaling = g.get_string(p + "rope.scaling.type").value_or("none");
  if (scaling == "linear") {
    c.rope_scaling = RopeScaling::linear;
    c.rope_factor = float(g.get_float(p + "rope.scaling.factor").value_or(1.0));
  } else if (scaling != "none") {
    fail("{}: '{}rope.scaling.type' is '{}', expected none or linear (Llama-3 scaling comes as the "
         "rope_freqs.weight tensor)", file, p, scaling);
  } else if (auto f = g.get_float(p + "rope.scale_linear")) {  // older converters
    c.rope_scaling = RopeScaling::linear;
    c.rope_factor = float(*f);
  }
  if (auto v = g.get_int(p + "rope.scaling.original_context_length"))
    c.rope_original_ctx = int(std::clamp<int64_t>(*v, 1, 1 << 30));
  KVT_CHECK(c.rope_factor > 0, "{}: rope scaling factor is {}, expected > 0", file, c.rope_factor);
  gguf_moe_config(g, p, &c);
  return c;
}

void load_gguf(const std::string& path, ModelSource* src) {
  src->gguf = GgufFile::open(path);
  const GgufFile& g = *src->gguf;
  src->config = gguf_config(g);
  for (const auto& t : g.tensors()) {
    TensorRef r;
    r.type = t.type;
    r.shape.assign(t.ne.rbegin(), t.ne.rend());  // GGUF ne is innermost first
    r.data = t.data;
    r.n_bytes = t.n_bytes;
    r.source = path + ":" + t.name;
    src->tensors.emplace(t.name, std::move(r));
  }
  const TensorRef* embd = src->find("token_embd.weight");
  KVT_CHECK(embd && embd->shape.size() == 2, "{}: missing 2-D tensor 'token_embd.weight'", path);
  KVT_CHECK(embd->shape[0] > 0 && embd->shape[0] < (int64_t(1) << 30),
            "{}: token_embd.weight has {} rows, expected a vocabulary size", path, embd->shape[0]);
  src->config.n_vocab = int(embd->shape[0]);
  src->config.tied_embeddings = !src->find("output.weight");
  src->config.qkv_bias = src->find("blk.0.attn_q.bias") != nullptr;
  src->config.qk_norm = src->find("blk.0.attn_q_norm.weight") != nullptr;
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
    auto id = g.get_int(key);
    if (id && *id >= 0 && *id < src->config.n_vocab &&
        std::find(src->eos_token_ids.begin(), src->eos_token_ids.end(), int(*id)) ==
            src->eos_token_ids.end())
      src->eos_token_ids.push_back(int(*id));
  }
}

// ---- Hugging Face directory ---------------------------------------------------

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  KVT_CHECK(in, "{}: cannot open", p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  KVT_CHECK(!j.is_discarded(), "{}: not valid JSON", p.string());
  return j;
}

std::string existing(const fs::path& p) { return fs::is_regular_file(p) ? p.string() : ""; }

void load_hf_dir(const std::string& dir, ModelSource* src) {
  fs::path root(dir);
  fs::path config_path = root / "config.json";
  KVT_CHECK(fs::is_regular_file(config_path),
            "{}: not a GGUF file or a Hugging Face directory (no config.json)", dir);
  nlohmann::json config = read_json(config_path);
  src->config = parse_hf_config(config, config_path.string());
  src->tokenizer_json = existing(root / "tokenizer.json");
  src->tokenizer_config_json = existing(root / "tokenizer_config.json");
  src->generation_config_json = existing(root / "generation_config.json");
  if (!src->generation_config_json.empty())
    src->eos_token_ids =
        parse_eos_token_ids(read_json(src->generation_config_json), src->generation_config_json);
  if (src->eos_token_ids.empty()) src->eos_token_ids = parse_eos_token_ids(config, config_path.string());

  // Shards: listed by the index's weight_map, or the single model.safetensors.
  std::vector<std::string> shard_names;
  nlohmann::json weight_map;
  fs::path index_path = root / "model.safetensors.index.json";
  if (fs::is_regular_file(index_path)) {
    nlohmann::json index = read_json(index_path);
    auto wm = index.is_object() ? index.find("weight_map") : index.end();
    KVT_CHECK(wm != index.end() && wm->is_object(), "{}: missing object \"weight_map\"",
              index_path.string());
    weight_map = *wm;
    std::set<std::string> names;
    for (auto& [tensor, file] : weight_map.items()) {
      KVT_CHECK(file.is_string(), "{}: weight_map entry for '{}' is {}, expected a file name",
                index_path.string(), tensor, file.type_name());
      std::string f = file.get<std::string>();
      KVT_CHECK(f.find('/') == std::string::npos && f != ".." && !f.empty(),
                "{}: weight_map entry for '{}' is \"{}\", expected a file in the same directory",
                index_path.string(), tensor, f);
      names.insert(f);
    }
    shard_names.assign(names.begin(), names.end());
  } else {
    KVT_CHECK(fs::is_regular_file(root / "model.safetensors"),
              "{}: no model.safetensors or model.safetensors.index.json", dir);
    shard_names = {"model.safetensors"};
  }

  std::unordered_map<std::string, std::string> origin;  // canonical name → shard, for duplicates
  for (const auto& shard : shard_names) {
    auto st = SafetensorsFile::open((root / shard).string());
    src->files.push_back(st->mapping());
    for (const auto& t : st->tensors()) {
      if (!weight_map.is_null()) {
        auto it = weight_map.find(t.name);
        if (it == weight_map.end() || *it != shard) continue;  // the index decides where it lives
      }
      std::string name = hf_to_canonical_name(t.name);
      bool canonical = !name.empty();
      if (!canonical) name = t.name;
      if (canonical && !t.type)
        fail("{}: tensor '{}' has dtype {}, expected F32, F16 or BF16", st->path(), t.name, t.dtype);
      auto [it, inserted] = origin.emplace(name, st->path());
      KVT_CHECK(inserted, "{}: tensor '{}' also appears in {}", st->path(), t.name, it->second);
      if (!t.type) continue;  // e.g. integer buffers we never compute with
      TensorRef r;
      r.type = *t.type;
      r.shape = t.shape;
      r.data = t.data;
      r.n_bytes = t.n_bytes;
      r.source = st->path() + ":" + t.name;
      src->tensors.emplace(name, std::move(r));
    }
  }
  if (!weight_map.is_null())
    for (auto& [tensor, file] : weight_map.items()) {
      std::string name = hf_to_canonical_name(tensor);
      KVT_CHECK(origin.count(name.empty() ? tensor : name),
                "{}: weight_map lists '{}' in {}, but that file has no such tensor",
                index_path.string(), tensor, file.get<std::string>());
    }
  // A tied checkpoint may still carry a copy of the embeddings as lm_head.
  // (when not tied and lm_head is missing, validation reports it)
  if (src->config.tied_embeddings) src->tensors.erase("output.weight");
}

// ---- validation ----------------------------------------------------------------

void check_config(const ModelSource& src) {
  const ModelConfig& c = src.config;
  const std::string& f = src.path;
  KVT_CHECK(c.n_head % c.n_kv_head == 0,
            "{}: {} attention heads is not a multiple of {} KV heads", f, c.n_head, c.n_kv_head);
  KVT_CHECK(c.head_dim % 2 == 0, "{}: head dimension {} must be even for RoPE", f, c.head_dim);
  KVT_CHECK(c.rms_eps > 0 && c.rms_eps < 1, "{}: RMSNorm epsilon {} is not in (0, 1)", f, c.rms_eps);
  KVT_CHECK(c.rope_theta > 0, "{}: RoPE base {} must be positive", f, c.rope_theta);
}

void expect_tensor(const ModelSource& src, const std::string& name,
                   const std::vector<int64_t>& shape, bool float_only) {
  const TensorRef* t = src.find(name);
  KVT_CHECK(t, "{}: missing tensor '{}' (expected shape {}) required by the {} architecture",
            src.path, name, shape_str(shape), src.config.arch);
  KVT_CHECK(t->shape == shape, "{}: tensor '{}' has shape {}, expected {}", t->source, name,
            shape_str(t->shape), shape_str(shape));
  GgmlTypeTraits tr{};
  KVT_CHECK(ggml_type_traits(uint32_t(t->type), &tr), "{}: tensor '{}' has an unknown type",
            t->source, name);
  KVT_CHECK(shape.back() % tr.block_size == 0,
            "{}: tensor '{}' rows of {} values are not a multiple of the {} block size {}",
            t->source, name, shape.back(), tr.name, tr.block_size);
  if (float_only)
    KVT_CHECK(t->type == GgmlType::F32 || t->type == GgmlType::F16 || t->type == GgmlType::BF16,
              "{}: tensor '{}' has type {}, expected F32, F16 or BF16", t->source, name, tr.name);
}

// A MoE layer: the router and the experts, stacked ([n_expert, rows, cols]
// per matrix, as GGUF stores them) or one tensor per expert (Hugging Face).
void expect_experts(const ModelSource& src, int l) {
  const ModelConfig& c = src.config;
  const int64_t d = c.n_embd, f = c.n_ff_expert, n = c.n_expert;
  KVT_CHECK(c.n_expert_used >= 1 && c.n_expert_used <= c.n_expert && f > 0,
            "{}: {} experts, {} used per token, expert width {}: expected 1 <= used <= experts and a width > 0",
            src.path, c.n_expert, c.n_expert_used, f);
  auto name = [l](const std::string& s) { return fmt::format("blk.{}.{}", l, s); };
  expect_tensor(src, name("ffn_gate_inp.weight"), {n, d}, false);
  if (src.find(name("ffn_gate_exps.weight")) || src.find(name("ffn_down_exps.weight"))) {
    expect_tensor(src, name("ffn_gate_exps.weight"), {n, f, d}, false);
    expect_tensor(src, name("ffn_up_exps.weight"), {n, f, d}, false);
    expect_tensor(src, name("ffn_down_exps.weight"), {n, d, f}, false);
    return;
  }
  KVT_CHECK(src.find(name("ffn_gate.0.weight")),
            "{}: missing tensor '{}' (expected shape [{}, {}, {}]) or the per-expert '{}', required by the {} "
            "experts of layer {}", src.path, name("ffn_gate_exps.weight"), n, f, d, name("ffn_gate.0.weight"), n, l);
  for (int64_t e = 0; e < n; ++e) {
    expect_tensor(src, name(fmt::format("ffn_gate.{}.weight", e)), {f, d}, false);
    expect_tensor(src, name(fmt::format("ffn_up.{}.weight", e)), {f, d}, false);
    expect_tensor(src, name(fmt::format("ffn_down.{}.weight", e)), {d, f}, false);
  }
}

void validate(const ModelSource& src) {
  check_config(src);
  const ModelConfig& c = src.config;
  const int64_t d = c.n_embd, q_dim = int64_t(c.n_head) * c.head_dim,
                kv_dim = int64_t(c.n_kv_head) * c.head_dim;
  expect_tensor(src, "token_embd.weight", {c.n_vocab, d}, false);
  expect_tensor(src, "output_norm.weight", {d}, true);
  if (!c.tied_embeddings) expect_tensor(src, "output.weight", {c.n_vocab, d}, false);
  if (src.find("rope_freqs.weight")) expect_tensor(src, "rope_freqs.weight", {c.head_dim / 2}, true);
  for (int l = 0; l < c.n_layer; ++l) {
    auto n = [l](const char* s) { return fmt::format("blk.{}.{}", l, s); };
    expect_tensor(src, n("attn_norm.weight"), {d}, true);
    expect_tensor(src, n("attn_q.weight"), {q_dim, d}, false);
    expect_tensor(src, n("attn_k.weight"), {kv_dim, d}, false);
    expect_tensor(src, n("attn_v.weight"), {kv_dim, d}, false);
    expect_tensor(src, n("attn_output.weight"), {d, q_dim}, false);
    expect_tensor(src, n("ffn_norm.weight"), {d}, true);
    if (c.is_moe_layer(l)) {
      expect_experts(src, l);
    } else {
      expect_tensor(src, n("ffn_gate.weight"), {c.n_ff, d}, false);
      expect_tensor(src, n("ffn_up.weight"), {c.n_ff, d}, false);
      expect_tensor(src, n("ffn_down.weight"), {d, c.n_ff}, false);
    }
    if (c.qkv_bias) {
      expect_tensor(src, n("attn_q.bias"), {q_dim}, true);
      expect_tensor(src, n("attn_k.bias"), {kv_dim}, true);
      expect_tensor(src, n("attn_v.bias"), {kv_dim}, true);
    }
    if (c.qk_norm) {
      expect_tensor(src, n("attn_q_norm.weight"), {c.head_dim}, true);
      expect_tensor(src, n("attn_k_norm.weight"), {c.head_dim}, true);
    }
  }
}

}  // namespace

ModelSource open_model_source(const std::string& path) {
  ModelSource src;
  src.path = path;
  if (path.rfind(kShapePrefix, 0) == 0) {
    src.config = model_shape(path.substr(std::string(kShapePrefix).size()));
    src.shape_only = true;
    return src;
  }
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    load_hf_dir(path, &src);
  } else {
    KVT_CHECK(fs::exists(path, ec), "{}: no such file or directory", path);
    load_gguf(path, &src);
  }
  validate(src);
  return src;
}

}  // namespace kvtier
