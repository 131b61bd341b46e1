// Tokenizer::from_hf: a Hugging Face tokenizer.json (BPE model, byte-level
// pre-tokenizer) plus the optional tokenizer_config.json.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/status.h"
#include "tokenizer/tokenizer_spec.h"

namespace kvtier {
namespace {

using nlohmann::json;

constexpr int k_max_json_depth = 64;
constexpr int64_t k_max_vocab = int64_t(1) << 24;

// nlohmann's parser is iterative, but deeply nested input still costs
// recursion elsewhere (destruction, our own walk); real files nest < 10 deep.
void check_depth(std::string_view text, const std::string& file) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      KVT_CHECK(++depth <= k_max_json_depth, "{}: JSON nested deeper than {} levels", file, k_max_json_depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

json parse_json(std::string_view text, const std::string& file) {
  check_depth(text, file);
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  KVT_CHECK(!j.is_discarded(), "{}: not valid JSON", file);
  return j;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KVT_CHECK(f.good(), "{}: cannot open file", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  KVT_CHECK(!f.bad(), "{}: read error", path);
  return ss.str();
}

// Typed field access with messages naming the file and the JSON path.
const json* member(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

const std::string& get_string(const json& obj, const char* key, const std::string& where) {
  const json* v = member(obj, key);
  KVT_CHECK(v != nullptr, "{}: missing \"{}\" (expected a string)", where, key);
  KVT_CHECK(v->is_string(), "{}.{}: expected a string, found {}", where, key, v->type_name());
  return v->get_ref<const std::string&>();
}

bool get_bool(const json& obj, const char* key, bool fallback, const std::string& where) {
  const json* v = member(obj, key);
  if (v == nullptr || v->is_null()) return fallback;
  KVT_CHECK(v->is_boolean(), "{}.{}: expected true or false, found {}", where, key, v->type_name());
  return v->get<bool>();
}

void parse_pre_tokenizer(const json& node, const std::string& where, PreTokenizer& pre, bool* byte_level) {
  KVT_CHECK(node.is_object(), "{}: expected an object, found {}", where, node.type_name());
  const std::string& type = get_string(node, "type", where);
  if (type == "Sequence") {
    const json* list = member(node, "pretokenizers");
    KVT_CHECK(list != nullptr && list->is_array(), "{}.pretokenizers: expected an array", where);
    for (size_t i = 0; i < list->size(); ++i) {
      parse_pre_tokenizer((*list)[i], fmt::format("{}.pretokenizers[{}]", where, i), pre, byte_level);
    }
  } else if (type == "Split") {
    const json* pattern = member(node, "pattern");
    KVT_CHECK(pattern != nullptr && pattern->is_object(),
              "{}.pattern: expected an object {{\"Regex\": ...}} or {{\"String\": ...}}", where);
    const std::string behavior = member(node, "behavior") ? get_string(node, "behavior", where) : "Isolated";
    KVT_CHECK(behavior == "Isolated", "{}.behavior: \"{}\" is not supported (expected \"Isolated\")", where,
              behavior);
    KVT_CHECK(!get_bool(node, "invert", false, where), "{}.invert: true is not supported", where);
    if (member(*pattern, "Regex")) {
      pre.add_split(get_string(*pattern, "Regex", where + ".pattern"), false, where);
    } else if (member(*pattern, "String")) {
      const std::string& s = get_string(*pattern, "String", where + ".pattern");
      KVT_CHECK(!s.empty(), "{}.pattern.String: empty", where);
      pre.add_split(s, true, where);
    } else {
      fail("{}.pattern: expected a \"Regex\" or \"String\" key", where);
    }
  } else if (type == "Digits") {
    // Rust's char::is_numeric is the Unicode N category.
    pre.add_split(get_bool(node, "individual_digits", false, where) ? R"(\p{N})" : R"(\p{N}+)", false,
                  where);
  } else if (type == "ByteLevel") {
    KVT_CHECK(!*byte_level, "{}: a second ByteLevel step", where);
    *byte_level = true;
    if (get_bool(node, "add_prefix_space", false, where)) {
      KVT_CHECK(pre.n_steps() == 0, "{}: add_prefix_space after other splits is not supported", where);
      pre.set_add_prefix_space(true);
    }
    if (get_bool(node, "use_regex", true, where)) pre.add_split(k_gpt2_pattern, false, where);
  } else {
    fail("{}.type: pre-tokenizer \"{}\" is not supported (expected Sequence, Split, Digits or ByteLevel)",
         where, type);
  }
}

// A token reference in tokenizer_config.json: "text", {"content": "text"} or null.
std::string token_text(const json& config, const char* key, const std::string& where) {
  const json* v = member(config, key);
  if (v == nullptr || v->is_null()) return {};
  if (v->is_string()) return v->get<std::string>();
  KVT_CHECK(v->is_object(), "{}.{}: expected a string, an object with \"content\" or null", where, key);
  return get_string(*v, "content", where + "." + key);
}

int32_t id_of(const std::vector<std::string>& tokens, const std::string& text) {
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (tokens[id] == text) return int32_t(id);
  }
  return -1;
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_hf(const std::string& tokenizer_json_path,
                                              const std::string& tokenizer_config_json_path) {
  const std::string tok = read_file(tokenizer_json_path);
  const std::string cfg = tokenizer_config_json_path.empty() ? std::string() : read_file(tokenizer_config_json_path);
  // Messages name the real files.
  std::unique_ptr<Tokenizer> t;
  try {
    t = from_hf_text(tok, cfg);
  } catch (const Error& e) {
    throw Error(fmt::format("{} (tokenizer.json: {}, tokenizer_config.json: {})", e.what(), tokenizer_json_path,
                            tokenizer_config_json_path.empty() ? "none" : tokenizer_config_json_path));
  }
  return t;
}

std::unique_ptr<Tokenizer> Tokenizer::from_hf_text(std::string_view tokenizer_json,
                                                   std::string_view tokenizer_config_json) {
  const std::string file = "tokenizer.json";
  const json root = parse_json(tokenizer_json, file);
  KVT_CHECK(root.is_object(), "{}: expected a JSON object at the top level, found {}", file, root.type_name());

  TokenizerSpec spec;
  spec.source = file;
  spec.missing_byte = BpeModel::MissingByte::drop;  // what HF's BPE model does

  // model
  const json* model = member(root, "model");
  KVT_CHECK(model != nullptr && model->is_object(), "{}: missing \"model\" object", file);
  const std::string mwhere = file + ": model";
  if (member(*model, "type")) {
    const std::string& type = get_string(*model, "type", mwhere);
    KVT_CHECK(type == "BPE", "{}.type: \"{}\" is not supported (expected \"BPE\")", mwhere, type);
  }
  const json* dropout = member(*model, "dropout");
  KVT_CHECK(dropout == nullptr || dropout->is_null(), "{}.dropout: BPE dropout is not supported", mwhere);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* v = member(*model, key);
    KVT_CHECK(v == nullptr || v->is_null() || (v->is_string() && v->get_ref<const std::string&>().empty()),
              "{}.{}: not supported by byte-level BPE", mwhere, key);
  }
  KVT_CHECK(!get_bool(*model, "byte_fallback", false, mwhere), "{}.byte_fallback: true is not supported",
            mwhere);
  spec.ignore_merges = get_bool(*model, "ignore_merges", false, mwhere);

  const json* vocab = member(*model, "vocab");
  KVT_CHECK(vocab != nullptr && vocab->is_object(), "{}.vocab: expected an object of token -> id", mwhere);
  std::vector<std::pair<std::string, int64_t>> entries;
  entries.reserve(vocab->size());
  int64_t n = 0;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    KVT_CHECK(it.value().is_number_integer(), "{}.vocab[\"{}\"]: expected an integer id, found {}", mwhere,
              it.key(), it.value().type_name());
    const int64_t id = it.value().get<int64_t>();
    KVT_CHECK(id >= 0 && id < k_max_vocab, "{}.vocab[\"{}\"]: id {} outside [0, {})", mwhere, it.key(), id,
              k_max_vocab);
    entries.emplace_back(it.key(), id);
    n = std::max(n, id + 1);
  }

  struct Added {
    int64_t id;
    std::string content;
    bool special;
    AddedTokenFlags flags;
  };
  std::vector<Added> added;
  if (const json* list = member(root, "added_tokens"); list != nullptr && !list->is_null()) {
    KVT_CHECK(list->is_array(), "{}: added_tokens: expected an array", file);
    for (size_t i = 0; i < list->size(); ++i) {
      const json& a = (*list)[i];
      const std::string where = fmt::format("{}: added_tokens[{}]", file, i);
      KVT_CHECK(a.is_object(), "{}: expected an object", where);
      const json* id = member(a, "id");
      KVT_CHECK(id != nullptr && id->is_number_integer(), "{}.id: expected an integer", where);
      const int64_t v = id->get<int64_t>();
      KVT_CHECK(v >= 0 && v < k_max_vocab, "{}.id: {} outside [0, {})", where, v, k_max_vocab);
      const std::string& content = get_string(a, "content", where);
      KVT_CHECK(!content.empty(), "{}.content: empty", where);
      added.push_back(Added{v, content, get_bool(a, "special", false, where),
                            AddedTokenFlags{get_bool(a, "lstrip", false, where), get_bool(a, "rstrip", false, where)}});
      n = std::max(n, v + 1);
    }
  }
  KVT_CHECK(n > 0, "{}.vocab: empty", mwhere);
  // Dense ids need at most one id per entry; checked before allocating n slots.
  KVT_CHECK(n <= int64_t(entries.size() + added.size()),
            "{}: ids reach {} but there are only {} tokens (ids must be dense in [0, n))", file, n - 1,
            entries.size() + added.size());

  spec.tokens.assign(n, std::string());
  spec.kinds.assign(n, TokenKind::normal);
  spec.flags.assign(n, AddedTokenFlags{});
  std::vector<bool> filled(n, false);
  for (auto& [text, id] : entries) {
    KVT_CHECK(!filled[id], "{}.vocab: id {} is given to both '{}' and '{}'", mwhere, id, spec.tokens[id], text);
    spec.tokens[id] = std::move(text);
    filled[id] = true;
  }
  for (Added& a : added) {
    KVT_CHECK(!filled[a.id] || spec.tokens[a.id] == a.content,
              "{}: added token '{}' has id {}, which the vocabulary gives to '{}'", file, a.content, a.id,
              spec.tokens[a.id]);
    spec.tokens[a.id] = a.content;
    spec.kinds[a.id] = a.special ? TokenKind::control : TokenKind::user_defined;
    spec.flags[a.id] = a.flags;
    filled[a.id] = true;
  }
  for (int64_t id = 0; id < n; ++id) {
    KVT_CHECK(filled[id], "{}: no token has id {} (ids must be dense in [0, {}))", file, id, n);
  }

  const json* merges = member(*model, "merges");
  KVT_CHECK(merges != nullptr && merges->is_array(), "{}.merges: expected an array", mwhere);
  spec.merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const json& m = (*merges)[i];
    if (m.is_string()) {  // "a b" (tokenizers < 0.20)
      const std::string& s = m.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      KVT_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < s.size() && s.find(' ', sp + 1) == std::string::npos,
                "{}.merges[{}] = \"{}\": expected two tokens separated by one space", mwhere, i, s);
      spec.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {  // ["a", "b"]
      spec.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      fail("{}.merges[{}]: expected \"a b\" or [\"a\", \"b\"], found {}", mwhere, i, m.dump().substr(0, 80));
    }
  }

  // normalizer: these families have none, except Qwen2's NFC. NFC is not
  // applied (llama.cpp does not apply it either): text already in NFC — what
  // editors and the web produce — tokenizes identically.
  if (const json* norm = member(root, "normalizer"); norm != nullptr && !norm->is_null()) {
    const std::string& type = get_string(*norm, "type", file + ": normalizer");
    KVT_CHECK(type == "NFC", "{}: normalizer \"{}\" is not supported (expected null or NFC)", file, type);
  }

  const json* pre = member(root, "pre_tokenizer");
  KVT_CHECK(pre != nullptr && !pre->is_null(), "{}: missing pre_tokenizer (a byte-level BPE needs ByteLevel)",
            file);
  bool byte_level = false;
  parse_pre_tokenizer(*pre, file + ": pre_tokenizer", spec.pre, &byte_level);
  KVT_CHECK(byte_level, "{}: pre_tokenizer has no ByteLevel step; only byte-level BPE is supported", file);

  if (const json* dec = member(root, "decoder"); dec != nullptr && !dec->is_null()) {
    const std::string& type = get_string(*dec, "type", file + ": decoder");
    KVT_CHECK(type == "ByteLevel", "{}: decoder \"{}\" is not supported (expected ByteLevel)", file, type);
  }

  // tokenizer_config.json
  json config = json::object();
  const std::string cfile = "tokenizer_config.json";
  if (!tokenizer_config_json.empty()) {
    config = parse_json(tokenizer_config_json, cfile);
    KVT_CHECK(config.is_object(), "{}: expected a JSON object at the top level", cfile);
  }
  const auto resolve = [&](const char* key, std::initializer_list<const char*> defaults) -> int32_t {
    std::string text = token_text(config, key, cfile);
    if (!text.empty()) {
      const int32_t id = id_of(spec.tokens, text);
      KVT_CHECK(id >= 0, "{}: {} '{}' is not in the vocabulary", cfile, key, text);
      return id;
    }
    if (member(config, key) != nullptr) return -1;  // explicitly null
    for (const char* d : defaults) {
      const int32_t id = id_of(spec.tokens, d);
      if (id >= 0 && spec.kinds[id] == TokenKind::control) return id;
    }
    return -1;
  };
  // Family defaults when the config says nothing: Llama 3 then ChatML models.
  spec.bos = resolve("bos_token", {"<|begin_of_text|>"});
  spec.eos = resolve("eos_token", {"<|eot_id|>", "<|end_of_text|>", "<|im_end|>", "<|endoftext|>"});
  spec.pad = resolve("pad_token", {});
  spec.eot = id_of(spec.tokens, "<|eot_id|>");

  // add_bos: the config's flag, else whether the post-processor puts the BOS
  // first (Llama 3's TemplateProcessing does).
  bool add_bos = false;
  if (const json* v = member(config, "add_bos_token"); v != nullptr && !v->is_null()) {
    KVT_CHECK(v->is_boolean(), "{}.add_bos_token: expected true or false", cfile);
    add_bos = v->get<bool>();
  } else if (const json* post = member(root, "post_processor"); post != nullptr && post->is_object() &&
                                                                 spec.bos >= 0) {
    const json* single = member(*post, "single");
    if (single != nullptr && single->is_array() && !single->empty()) {
      const json* st = member((*single)[0], "SpecialToken");
      add_bos = st != nullptr && st->is_object() && member(*st, "id") != nullptr &&
                (*member(*st, "id")) == json(spec.tokens[spec.bos]);
    }
  }
  spec.add_bos = add_bos && spec.bos >= 0;

  if (const json* tpl = member(config, "chat_template"); tpl != nullptr && !tpl->is_null()) {
    if (tpl->is_string()) {
      spec.chat_template = tpl->get<std::string>();
    } else if (tpl->is_array()) {  // [{"name": "default", "template": "..."}, ...]
      for (const json& e : *tpl) {
        if (e.is_object() && member(e, "name") && (*member(e, "name")) == json("default")) {
          spec.chat_template = get_string(e, "template", cfile + ".chat_template");
        }
      }
    } else {
      fail("{}.chat_template: expected a string or a list of named templates", cfile);
    }
  }
  return make_bpe_tokenizer(std::move(spec));
}

}  // namespace kvtier
