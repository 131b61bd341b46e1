// GrammarVocab, ConstraintFactory and TokenConstraint on top of xgrammar
// (constraint.h): its TokenizerInfo holds the vocabulary's bytes, its
// GrammarCompiler turns a JSON Schema into a CompiledGrammar (token masks
// precomputed where they do not depend on the parser stack), and one
// GrammarMatcher per sequence fills a bitmask of the allowed tokens.
#include <dlpack/dlpack.h>

#include <algorithm>
#include <bit>
#include <mutex>
#include <thread>
#include <xgrammar/xgrammar.h>

#include "grammar/constraint.h"
#include "grammar/json_schema.h"
#include "tokenizer/tokenizer.h"

namespace kvtier {
namespace {

// Longest run of whitespace the JSON grammars allow between tokens: enough
// for indented output, and a bound on a model that would emit blanks forever.
constexpr int k_max_whitespace = 20;
// Compiled grammars kept for reuse (a client usually repeats its schema).
constexpr int64_t k_cache_bytes = int64_t(64) << 20;

class XgrammarConstraint final : public TokenConstraint {
 public:
  XgrammarConstraint(const xgrammar::CompiledGrammar& grammar, int32_t n_vocab,
                     std::shared_ptr<const std::vector<int32_t>> end_tokens)
      : matcher_(grammar), n_vocab_(n_vocab), end_tokens_(std::move(end_tokens)),
        bitmask_(size_t(xgrammar::GetBitmaskSize(n_vocab))) {
    shape_[0] = int64_t(bitmask_.size());
    tensor_.data = bitmask_.data();
    tensor_.device = DLDevice{kDLCPU, 0};
    tensor_.ndim = 1;
    tensor_.dtype = xgrammar::GetBitmaskDLType();
    tensor_.shape = shape_;
    tensor_.strides = nullptr;
    tensor_.byte_offset = 0;
  }

  void allowed(std::vector<uint8_t>& mask) override {
    fill();
    mask.resize(size_t(n_vocab_));
    for (int32_t t = 0; t < n_vocab_; ++t) mask[size_t(t)] = uint8_t((uint32_t(bitmask_[size_t(t >> 5)]) >> (t & 31)) & 1u);
  }

  void accept(int32_t token) override {
    if (token < 0 || token >= n_vocab_ || !matcher_.AcceptToken(token))
      throw GrammarError(fmt::format("token {} does not continue the constrained output", token));
    mask_ready_ = false;
  }

  bool complete() const override { return matcher_.IsCompleted(); }

  bool must_end() override {
    if (!matcher_.IsCompleted()) return false;
    fill();
    int64_t n_allowed = 0;
    for (int32_t word : bitmask_) n_allowed += std::popcount(uint32_t(word));
    int64_t n_end = 0;
    for (int32_t t : *end_tokens_) n_end += (uint32_t(bitmask_[size_t(t >> 5)]) >> (t & 31)) & 1u;
    return n_allowed == n_end;
  }

 private:
  void fill() {
    if (mask_ready_) return;
    matcher_.FillNextTokenBitmask(&tensor_);
    mask_ready_ = true;
  }

  xgrammar::GrammarMatcher matcher_;
  int32_t n_vocab_;
  std::shared_ptr<const std::vector<int32_t>> end_tokens_;
  std::vector<int32_t> bitmask_;  // [ceil(n_vocab / 32)] bit t%32 of word t/32: token t allowed
  int64_t shape_[1] = {0};
  DLTensor tensor_{};
  bool mask_ready_ = false;
};

class XgrammarFactory final : public ConstraintFactory {
 public:
  XgrammarFactory(xgrammar::CompiledGrammar grammar, int32_t n_vocab,
                  std::shared_ptr<const std::vector<int32_t>> end_tokens, std::string description)
      : grammar_(std::move(grammar)), n_vocab_(n_vocab), end_tokens_(std::move(end_tokens)),
        description_(std::move(description)) {}
  std::unique_ptr<TokenConstraint> make() const override {
    return std::make_unique<XgrammarConstraint>(grammar_, n_vocab_, end_tokens_);
  }
  const std::string& describe() const override { return description_; }

 private:
  xgrammar::CompiledGrammar grammar_;
  int32_t n_vocab_;
  std::shared_ptr<const std::vector<int32_t>> end_tokens_;
  std::string description_;
};

using ojson = nlohmann::ordered_json;

// xgrammar 0.2.8 counts string lengths in UTF-8 bytes. maxLength in bytes is
// still sound (a string of at most n bytes has at most n characters), but
// minLength in bytes is not ("éé" is 4 bytes, 2 characters). A string with a
// minLength is therefore generated from printable ASCII without escapes, where
// bytes are characters: the pattern below, which xgrammar matches exactly.
void ascii_min_length(ojson& s) {
  if (!s.is_object()) return;
  auto each = [&](const char* key) {
    if (!s.contains(key)) return;
    ojson& v = s[key];
    if (v.is_array())
      for (auto& x : v) ascii_min_length(x);
    else ascii_min_length(v);
  };
  auto each_value = [&](const char* key) {
    if (!s.contains(key) || !s[key].is_object()) return;
    for (auto& [name, sub] : s[key].items()) ascii_min_length(sub);
  };
  for (const char* k : {"items", "prefixItems", "anyOf", "oneOf", "allOf", "additionalProperties"}) each(k);
  for (const char* k : {"properties", "$defs", "definitions"}) each_value(k);
  const bool is_string = s.contains("type") && (s["type"] == "string" || s["type"] == ojson::array({"string"}));
  if (!is_string || !s.contains("minLength") || s["minLength"].get<int64_t>() == 0) return;
  const int64_t lo = s["minLength"].get<int64_t>();
  const std::string hi = s.contains("maxLength") ? std::to_string(s["maxLength"].get<int64_t>()) : "";
  s.erase("minLength");
  s.erase("maxLength");
  s["pattern"] = fmt::format("^[ !#-\\[\\]-~]{{{},{}}}$", lo, hi);
}

// A string literal of xgrammar's EBNF.
std::string ebnf_literal(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) out += fmt::format("\\x{:02x}", c);
        else out += char(c);
    }
  }
  return out + "\"";
}

class XgrammarVocab final : public GrammarVocab {
 public:
  XgrammarVocab(const Tokenizer& tokenizer, int32_t n_vocab, const std::vector<int32_t>& end_tokens)
      : n_vocab_(n_vocab), info_(make_info(tokenizer, n_vocab, end_tokens)),
        compiler_(info_, int(std::clamp(std::thread::hardware_concurrency(), 1u, 8u)), true, k_cache_bytes) {
    std::vector<int32_t> ends(info_.GetStopTokenIds().begin(), info_.GetStopTokenIds().end());
    end_tokens_ = std::make_shared<const std::vector<int32_t>>(std::move(ends));
  }

  int32_t n_vocab() const override { return n_vocab_; }
  const std::vector<int32_t>& end_tokens() const override { return *end_tokens_; }

  std::shared_ptr<ConstraintFactory> json_object() override {
    return compile("json_object", [&] {
      return compiler_.CompileJSONSchema(R"({"type": "object"})", true, std::nullopt, std::nullopt,
                                         /*strict_mode=*/false, k_max_whitespace);
    });
  }

  std::shared_ptr<ConstraintFactory> json_schema(std::string_view schema_json, const std::string& name) override {
    const std::string schema = checked_schema(schema_json);
    return compile(name.empty() ? "json_schema" : fmt::format("json_schema '{}'", name), [&] {
      return compiler_.CompileJSONSchema(schema, true, std::nullopt, std::nullopt, /*strict_mode=*/true,
                                         k_max_whitespace);
    });
  }

  std::shared_ptr<ConstraintFactory> wrapped_json_schema(std::string_view schema_json, const std::string& prefix,
                                                         const std::string& suffix,
                                                         const std::string& description) override {
    const std::string schema = checked_schema(schema_json);
    return compile(description, [&] {
      // Tool calls are rendered with Python's json.dumps separators, which is
      // how chat templates show them to the model: ", " and ": ", no newlines.
      std::vector<xgrammar::Grammar> parts;
      if (!prefix.empty()) parts.push_back(xgrammar::Grammar::FromEBNF("root ::= " + ebnf_literal(prefix)));
      parts.push_back(xgrammar::Grammar::FromJSONSchema(schema, /*any_whitespace=*/false, std::nullopt,
                                                        std::make_pair(std::string(", "), std::string(": ")),
                                                        /*strict_mode=*/true));
      if (!suffix.empty()) parts.push_back(xgrammar::Grammar::FromEBNF("root ::= " + ebnf_literal(suffix)));
      return compiler_.CompileGrammar(xgrammar::Grammar::Concat(parts));
    });
  }

 private:
  static xgrammar::TokenizerInfo make_info(const Tokenizer& tokenizer, int32_t n_vocab,
                                           const std::vector<int32_t>& end_tokens) {
    const int32_t n_tok = tokenizer.n_vocab();
    KVT_CHECK(n_vocab >= n_tok, "grammar: the model's vocabulary ({}) is smaller than the tokenizer's ({})", n_vocab,
              n_tok);
    // Control tokens get no bytes (never allowed); end tokens are the stop tokens.
    std::vector<std::string> pieces(static_cast<size_t>(n_tok));
    std::vector<int32_t> stops;
    for (int32_t id = 0; id < n_tok; ++id) {
      const bool is_end = tokenizer.is_eog(id) ||
                          std::find(end_tokens.begin(), end_tokens.end(), id) != end_tokens.end();
      if (is_end) stops.push_back(id);
      else if (!tokenizer.is_special(id)) pieces[size_t(id)] = tokenizer.token_to_piece(id);
    }
    KVT_CHECK(!stops.empty(), "grammar: the tokenizer has no end-of-generation token");
    return xgrammar::TokenizerInfo(pieces, xgrammar::VocabType::RAW, n_vocab, stops);
  }

  static std::string checked_schema(std::string_view schema_json) {
    nlohmann::json schema;
    try {
      schema = nlohmann::json::parse(schema_json);
    } catch (const nlohmann::json::parse_error& e) {
      throw GrammarError(fmt::format("schema: not valid JSON ({})", e.what()));
    }
    check_json_schema(schema);
    ojson ordered = ojson::parse(schema_json);  // property order is the order of generation
    ascii_min_length(ordered);
    return ordered.dump();
  }

  template <class Compile>
  std::shared_ptr<ConstraintFactory> compile(const std::string& description, Compile&& fn) {
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      return std::make_shared<XgrammarFactory>(fn(), n_vocab_, end_tokens_, description);
    } catch (const GrammarError&) {
      throw;
    } catch (const std::exception& e) {
      throw GrammarError(fmt::format("{}: cannot be compiled: {}", description, e.what()));
    }
  }

  int32_t n_vocab_;
  xgrammar::TokenizerInfo info_;
  xgrammar::GrammarCompiler compiler_;
  std::shared_ptr<const std::vector<int32_t>> end_tokens_;
  std::mutex mutex_;
};

}  // namespace

std::shared_ptr<GrammarVocab> GrammarVocab::build(const Tokenizer& tokenizer, int32_t n_vocab,
                                                  const std::vector<int32_t>& end_tokens) {
  return std::make_shared<XgrammarVocab>(tokenizer, n_vocab, end_tokens);
}

}  // namespace kvtier
