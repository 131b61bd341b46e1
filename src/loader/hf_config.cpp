#include "loader/hf_config.h"

#include <charconv>
#include <optional>

#include "core/status.h"

namespace kvtier {

namespace {

const nlohmann::json* field(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

int64_t get_int(const nlohmann::json& j, const std::string& file, const char* key,
                std::optional<int64_t> fallback) {
  const nlohmann::json* v = field(j, key);
  if (!v) {
    if (fallback) return *fallback;
    fail("{}: missing \"{}\" (expected an integer)", file, key);
  }
  if (!v->is_number_integer())
    fail("{}: \"{}\" is {} {}, expected an integer", file, key, v->type_name(), v->dump());
  return v->get<int64_t>();
}

// A positive int32 (layer counts, widths): rejects 0, negatives and absurd sizes.
int get_dim(const nlohmann::json& j, const std::string& file, const char* key,
            std::optional<int64_t> fallback = std::nullopt) {
  int64_t v = get_int(j, file, key, fallback);
  if (v <= 0 || v > (int64_t(1) << 30))
    fail("{}: \"{}\" is {}, expected a positive integer below 2^30", file, key, v);
  return int(v);
}

double get_num(const nlohmann::json& j, const std::string& file, const char* key,
               std::optional<double> fallback) {
  const nlohmann::json* v = field(j, key);
  if (!v) {
    if (fallback) return *fallback;
    fail("{}: missing \"{}\" (expected a number)", file, key);
  }
  if (!v->is_number()) fail("{}: \"{}\" is {}, expected a number", file, key, v->type_name());
  return v->get<double>();
}

bool get_bool(const nlohmann::json& j, const std::string& file, const char* key, bool fallback) {
  const nlohmann::json* v = field(j, key);
  if (!v) return fallback;
  if (!v->is_boolean()) fail("{}: \"{}\" is {}, expected true or false", file, key, v->type_name());
  return v->get<bool>();
}

// `key` is "rope_scaling" (transformers 4) or "rope_parameters" (transformers
// 5, which also moves rope_theta there).
void parse_rope_scaling(const nlohmann::json& j, const std::string& file, const char* key,
                        ModelConfig* c) {
  const nlohmann::json* rs = field(j, key);
  if (!rs) return;
  if (!rs->is_object())
    fail("{}: \"{}\" is {}, expected an object or null", file, key, rs->type_name());
  std::string where = file + ": " + key;
  if (field(*rs, "rope_theta")) c->rope_theta = float(get_num(*rs, where, "rope_theta", std::nullopt));
  const nlohmann::json* t = field(*rs, "rope_type");
  if (!t) t = field(*rs, "type");
  if (!t || !t->is_string()) fail("{}: \"{}\" has no string \"rope_type\"/\"type\"", file, key);
  std::string type = t->get<std::string>();
  if (type == "default") return;
  if (type == "llama3") {
    c->rope_scaling = RopeScaling::llama3;
    c->rope_factor = float(get_num(*rs, where, "factor", std::nullopt));
    c->rope_low_freq_factor = float(get_num(*rs, where, "low_freq_factor", 1.0));
    c->rope_high_freq_factor = float(get_num(*rs, where, "high_freq_factor", 4.0));
    c->rope_original_ctx = get_dim(*rs, where, "original_max_position_embeddings", 8192);
    KVT_CHECK(c->rope_high_freq_factor > c->rope_low_freq_factor,
              "{}: high_freq_factor {} must exceed low_freq_factor {}", where,
              c->rope_high_freq_factor, c->rope_low_freq_factor);
  } else if (type == "linear") {
    c->rope_scaling = RopeScaling::linear;
    c->rope_factor = float(get_num(*rs, where, "factor", std::nullopt));
  } else {
    fail("{}: rope scaling type \"{}\" is not supported (expected llama3, linear or default)", file,
         type);
  }
  KVT_CHECK(c->rope_factor > 0, "{}: factor is {}, expected > 0", where, c->rope_factor);
}

struct NamePair {
  const char* hf;         // after "model.layers.N."
  const char* canonical;  // after "blk.N."
};
constexpr NamePair kLayerNames[] = {
    {"self_attn.q_proj", "attn_q"},       {"self_attn.k_proj", "attn_k"},
    {"self_attn.v_proj", "attn_v"},       {"self_attn.o_proj", "attn_output"},
    {"self_attn.q_norm", "attn_q_norm"},  {"self_attn.k_norm", "attn_k_norm"},
    {"mlp.gate_proj", "ffn_gate"},        {"mlp.up_proj", "ffn_up"},
    {"mlp.down_proj", "ffn_down"},        {"input_layernorm", "attn_norm"},
    {"post_attention_layernorm", "ffn_norm"},
};
// Mixture-of-experts layers: the router, and expert E's three matrices as
// "blk.N.ffn_{gate,up,down}.E.weight" (llama.cpp's names for unstacked experts).
constexpr NamePair kRouterNames[] = {
    {"mlp.gate", "ffn_gate_inp"},              // qwen3_moe
    {"block_sparse_moe.gate", "ffn_gate_inp"},  // mixtral
};
struct ExpertNames {
  const char* prefix;  // after "model.layers.N.", before the expert index
  const char* gate;    // after "E."
  const char* up;
  const char* down;
};
constexpr ExpertNames kQwenExperts{"mlp.experts.", "gate_proj", "up_proj", "down_proj"};
constexpr ExpertNames kMixtralExperts{"block_sparse_moe.experts.", "w1", "w3", "w2"};
constexpr const char* kExpertCanonical[] = {"ffn_gate", "ffn_up", "ffn_down"};

constexpr NamePair kTopNames[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};

// Splits "<prefix>N.<rest>" into N and rest; false when it does not match.
bool split_layer(std::string_view name, std::string_view prefix, int* layer, std::string_view* rest) {
  if (name.substr(0, prefix.size()) != prefix) return false;
  name.remove_prefix(prefix.size());
  auto dot = name.find('.');
  if (dot == std::string_view::npos || dot == 0) return false;
  auto [p, ec] = std::from_chars(name.data(), name.data() + dot, *layer);
  if (ec != std::errc() || p != name.data() + dot || *layer < 0) return false;
  *rest = name.substr(dot + 1);
  return true;
}

// Maps "<stem>.weight|bias" through the layer table in the given direction.
std::string map_layer(int layer, std::string_view rest, bool to_canonical) {
  for (const auto& p : kLayerNames) {
    std::string_view from = to_canonical ? p.hf : p.canonical;
    std::string_view to = to_canonical ? p.canonical : p.hf;
    for (std::string_view suffix : {".weight", ".bias"})
      if (rest.size() == from.size() + suffix.size() && rest.substr(0, from.size()) == from &&
          rest.substr(from.size()) == suffix)
        return fmt::format("{}{}.{}{}", to_canonical ? "blk." : "model.layers.", layer, to, suffix);
  }
  return {};
}

// "<prefix>E.<matrix>.weight" → "blk.N.ffn_<gate|up|down>.E.weight"; empty when no match.
std::string map_expert_to_canonical(int layer, std::string_view rest) {
  for (const ExpertNames* en : {&kQwenExperts, &kMixtralExperts}) {
    std::string_view prefix = en->prefix;
    if (rest.substr(0, prefix.size()) != prefix) continue;
    int expert = 0;
    std::string_view tail;
    if (!split_layer(rest, prefix, &expert, &tail)) return {};
    const char* mats[] = {en->gate, en->up, en->down};
    for (int m = 0; m < 3; ++m)
      if (tail == std::string(mats[m]) + ".weight")
        return fmt::format("blk.{}.{}.{}.weight", layer, kExpertCanonical[m], expert);
    return {};
  }
  for (const auto& p : kRouterNames)
    if (rest == std::string(p.hf) + ".weight") return fmt::format("blk.{}.{}.weight", layer, p.canonical);
  return {};
}

// The inverse, in the naming of `model_type` (mixtral or the qwen3_moe default).
std::string map_expert_to_hf(int layer, std::string_view rest, std::string_view model_type) {
  const bool mixtral = model_type == "mixtral";
  if (rest == "ffn_gate_inp.weight")
    return fmt::format("model.layers.{}.{}.weight", layer, kRouterNames[mixtral ? 1 : 0].hf);
  const ExpertNames& en = mixtral ? kMixtralExperts : kQwenExperts;
  const char* mats[] = {en.gate, en.up, en.down};
  for (int m = 0; m < 3; ++m) {
    int expert = 0;
    std::string_view tail;
    if (split_layer(rest, std::string(kExpertCanonical[m]) + ".", &expert, &tail) && tail == "weight")
      return fmt::format("model.layers.{}.{}{}.{}.weight", layer, en.prefix, expert, mats[m]);
  }
  return {};
}

// Mixture-of-experts keys of qwen3_moe and mixtral.
void parse_moe(const nlohmann::json& j, const std::string& file, const std::string& model_type,
               ModelConfig* c) {
  // transformers 5 writes Qwen3-MoE's num_experts under its alias num_local_experts.
  const char* n_key = model_type == "mixtral" || !field(j, "num_experts") ? "num_local_experts" : "num_experts";
  c->n_expert = get_dim(j, file, n_key);
  c->n_expert_used = get_dim(j, file, "num_experts_per_tok");
  KVT_CHECK(c->n_expert_used <= c->n_expert, "{}: \"num_experts_per_tok\" is {}, more than the {} experts",
            file, c->n_expert_used, c->n_expert);
  if (model_type == "mixtral") {
    c->n_ff_expert = c->n_ff;
    c->expert_norm_topk = true;  // MixtralTopKRouter always renormalizes
    return;
  }
  c->n_ff_expert = get_dim(j, file, "moe_intermediate_size");
  c->expert_norm_topk = get_bool(j, file, "norm_topk_prob", false);
  c->moe_sparse_step = get_dim(j, file, "decoder_sparse_step", 1);
  if (const nlohmann::json* dl = field(j, "mlp_only_layers")) {
    KVT_CHECK(dl->is_array(), "{}: \"mlp_only_layers\" is {}, expected a list of layer indices", file,
              dl->type_name());
    for (const auto& v : *dl) {
      KVT_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < c->n_layer,
                "{}: \"mlp_only_layers\" entry {} is not a layer index in [0, {})", file, v.dump(), c->n_layer);
      c->moe_dense_layers.push_back(v.get<int>());
    }
  }
}

}  // namespace

ModelConfig parse_hf_config(const nlohmann::json& j, const std::string& file) {
  KVT_CHECK(j.is_object(), "{}: expected a JSON object, found {}", file, j.type_name());
  ModelConfig c;
  const nlohmann::json* mt = field(j, "model_type");
  KVT_CHECK(mt && mt->is_string(), "{}: missing string \"model_type\"", file);
  std::string model_type = mt->get<std::string>();
  if (model_type == "llama" || model_type == "qwen2" || model_type == "qwen3") {
    c.arch = model_type;
  } else if (model_type == "mistral" || model_type == "mixtral") {
    // Mistral without a sliding window is a Llama; Mixtral is one with experts.
    const nlohmann::json* sw = field(j, "sliding_window");
    KVT_CHECK(!sw, "{}: {} with sliding_window {} is not supported (expected null)", file, model_type,
              sw ? sw->dump() : "");
    c.arch = "llama";
  } else if (model_type == "qwen3_moe") {
    KVT_CHECK(!get_bool(j, file, "use_sliding_window", false),
              "{}: qwen3_moe with use_sliding_window true is not supported (expected false)", file);
    c.arch = "qwen3moe";
  } else {
    fail("{}: model_type \"{}\" is not supported (expected llama, mistral, mixtral, qwen2, qwen3 or "
         "qwen3_moe)", file, model_type);
  }
  const nlohmann::json* nm = field(j, "_name_or_path");
  c.name = nm && nm->is_string() ? nm->get<std::string>() : model_type;
  c.n_layer = get_dim(j, file, "num_hidden_layers");
  c.n_embd = get_dim(j, file, "hidden_size");
  c.n_head = get_dim(j, file, "num_attention_heads");
  c.n_kv_head = get_dim(j, file, "num_key_value_heads", c.n_head);
  c.head_dim = get_dim(j, file, "head_dim", c.n_embd / c.n_head);
  c.n_ff = get_dim(j, file, "intermediate_size");
  c.n_vocab = get_dim(j, file, "vocab_size");
  c.n_ctx_train = field(j, "max_position_embeddings") ? get_dim(j, file, "max_position_embeddings") : 0;
  c.rms_eps = float(get_num(j, file, "rms_norm_eps", std::nullopt));
  c.rope_theta = float(get_num(j, file, "rope_theta", 10000.0));
  c.rope_interleaved = false;  // HF checkpoints rotate (i, i + head_dim/2)
  parse_rope_scaling(j, file, "rope_scaling", &c);
  parse_rope_scaling(j, file, "rope_parameters", &c);
  c.tied_embeddings = get_bool(j, file, "tie_word_embeddings", false);
  c.qkv_bias = c.arch == "qwen2" || get_bool(j, file, "attention_bias", false);
  c.qk_norm = c.arch == "qwen3" || c.arch == "qwen3moe";
  if (model_type == "mixtral" || model_type == "qwen3_moe") parse_moe(j, file, model_type, &c);
  const nlohmann::json* act = field(j, "hidden_act");
  KVT_CHECK(!act || (act->is_string() && act->get<std::string>() == "silu"),
            "{}: hidden_act {} is not supported (expected \"silu\")", file, act ? act->dump() : "");
  return c;
}

std::vector<int> parse_eos_token_ids(const nlohmann::json& j, const std::string& file) {
  const nlohmann::json* e = j.is_object() ? field(j, "eos_token_id") : nullptr;
  if (!e) return {};
  auto one = [&](const nlohmann::json& v) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 0x7fffffff)
      fail("{}: \"eos_token_id\" entry {} is not a token id", file, v.dump());
    return int(v.get<int64_t>());
  };
  std::vector<int> ids;
  if (e->is_array()) {
    for (auto& v : *e) ids.push_back(one(v));
  } else {
    ids.push_back(one(*e));
  }
  return ids;
}

std::string hf_to_canonical_name(std::string_view hf) {
  for (const auto& p : kTopNames)
    if (hf == p.hf) return p.canonical;
  int layer = 0;
  std::string_view rest;
  if (!split_layer(hf, "model.layers.", &layer, &rest)) return {};
  std::string name = map_layer(layer, rest, true);
  return name.empty() ? map_expert_to_canonical(layer, rest) : name;
}

std::string canonical_to_hf_name(std::string_view canonical, std::string_view model_type) {
  for (const auto& p : kTopNames)
    if (canonical == p.canonical) return p.hf;
  int layer = 0;
  std::string_view rest;
  if (!split_layer(canonical, "blk.", &layer, &rest)) return {};
  std::string name = map_layer(layer, rest, false);
  return name.empty() ? map_expert_to_hf(layer, rest, model_type) : name;
}

}  // namespace kvtier
