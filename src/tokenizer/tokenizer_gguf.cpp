// Tokenizer::from_gguf: the tokenizer.ggml.* metadata of a GGUF file.
#include "core/status.h"
#include "loader/gguf.h"
#include "tokenizer/tokenizer_spec.h"

namespace kvtier {
namespace {

// GGUF token types (llama.cpp's llama_token_type).
enum GgufTokenType : int64_t { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

int32_t optional_id(const GgufFile& g, const char* key, int64_t n_vocab) {
  const std::optional<int64_t> v = g.get_int(key);
  if (!v) return -1;
  // Some converters write -1 (or UINT32_MAX) for "none".
  if (*v == -1 || *v == int64_t(UINT32_MAX)) return -1;
  KVT_CHECK(*v >= 0 && *v < n_vocab, "{}: {} = {} is outside the vocabulary [0, {})", g.path(), key, *v,
            n_vocab);
  return int32_t(*v);
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& g) { return tokenizer_from_gguf(g, {}); }

std::unique_ptr<Tokenizer> tokenizer_from_gguf(const GgufFile& g, std::string_view pre_override) {
  const std::string& file = g.path();
  const std::optional<std::string> model = g.get_string("tokenizer.ggml.model");
  KVT_CHECK(model.has_value(), "{}: missing tokenizer.ggml.model; expected \"gpt2\" (byte-level BPE)", file);
  KVT_CHECK(*model == "gpt2",
            "{}: tokenizer.ggml.model is \"{}\"; only \"gpt2\" (byte-level BPE: Llama 3, Qwen2, SmolLM2) is "
            "supported",
            file, *model);
  const std::optional<std::string> pre =
      pre_override.empty() ? g.get_string("tokenizer.ggml.pre") : std::string(pre_override);
  KVT_CHECK(pre.has_value(), "{}: missing tokenizer.ggml.pre (the pre-tokenizer name, e.g. \"smollm\")", file);

  TokenizerSpec spec;
  spec.source = file;
  bool default_add_bos = false;
  spec.pre = PreTokenizer::for_gguf_pre(*pre, file, &spec.ignore_merges, &default_add_bos);

  spec.tokens = g.get_string_array("tokenizer.ggml.tokens");
  const int64_t n = int64_t(spec.tokens.size());
  KVT_CHECK(n > 0, "{}: tokenizer.ggml.tokens is missing or empty", file);
  KVT_CHECK(n < (int64_t(1) << 31), "{}: tokenizer.ggml.tokens has {} entries", file, n);

  const std::vector<int64_t> types = g.get_int_array("tokenizer.ggml.token_type");
  KVT_CHECK(types.empty() || int64_t(types.size()) == n,
            "{}: tokenizer.ggml.token_type has {} entries, tokenizer.ggml.tokens has {}", file, types.size(), n);
  spec.kinds.assign(n, TokenKind::normal);
  for (int64_t i = 0; i < int64_t(types.size()); ++i) {
    switch (types[i]) {
      case normal:
      case byte: spec.kinds[i] = TokenKind::normal; break;
      case unknown:
      case control: spec.kinds[i] = TokenKind::control; break;
      case user_defined: spec.kinds[i] = TokenKind::user_defined; break;
      case unused: spec.kinds[i] = TokenKind::unused; break;
      default:
        fail("{}: tokenizer.ggml.token_type[{}] = {} (token '{}'); expected 1..6", file, i, types[i],
             spec.tokens[i]);
    }
  }

  const std::vector<std::string> merges = g.get_string_array("tokenizer.ggml.merges");
  KVT_CHECK(!merges.empty(), "{}: tokenizer.ggml.merges is missing or empty", file);
  spec.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& m = merges[i];
    // The separator is the first space after the first character: byte-level
    // symbols never contain a raw space, so "a b" is unambiguous.
    const size_t sp = m.find(' ', 1);
    KVT_CHECK(sp != std::string::npos && sp + 1 < m.size() && m.find(' ', sp + 1) == std::string::npos,
              "{}: tokenizer.ggml.merges[{}] = '{}'; expected two tokens separated by one space", file, i, m);
    spec.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
  }

  spec.bos = optional_id(g, "tokenizer.ggml.bos_token_id", n);
  spec.eos = optional_id(g, "tokenizer.ggml.eos_token_id", n);
  spec.eot = optional_id(g, "tokenizer.ggml.eot_token_id", n);
  spec.eom = optional_id(g, "tokenizer.ggml.eom_token_id", n);
  spec.pad = optional_id(g, "tokenizer.ggml.padding_token_id", n);
  spec.add_bos = g.get_bool("tokenizer.ggml.add_bos_token").value_or(default_add_bos);
  KVT_CHECK(!spec.add_bos || spec.bos >= 0,
            "{}: tokenizer.ggml.add_bos_token is true but tokenizer.ggml.bos_token_id is missing", file);
  spec.chat_template = g.get_string("tokenizer.chat_template").value_or("");
  return make_bpe_tokenizer(std::move(spec));
}

}  // namespace kvtier
