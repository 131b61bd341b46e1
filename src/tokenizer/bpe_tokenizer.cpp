// The Tokenizer implementation shared by both loaders: special-token
// partitioning, pre-tokenization, BPE, decoding, chat templates.
#include <algorithm>
#include <unordered_set>

#include "core/status.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer_spec.h"

namespace kvtier {
namespace {

// Texts that end a generation wherever the vocabulary marks them special
// (the list llama.cpp uses for these families).
constexpr const char* k_eog_texts[] = {"<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>",
                                       "<|eom_id|>", "<|end|>"};

bool is_ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(TokenizerSpec spec)
      : spec_(std::move(spec)), bpe_(spec_.tokens, spec_.merges, spec_.ignore_merges, spec_.missing_byte, spec_.source) {
    const int32_t n = int32_t(spec_.tokens.size());
    KVT_CHECK(spec_.kinds.size() == spec_.tokens.size(), "{}: {} token kinds for {} tokens", spec_.source,
              spec_.kinds.size(), spec_.tokens.size());
    if (spec_.flags.empty()) spec_.flags.resize(spec_.tokens.size());
    pieces_.resize(n);
    for (int32_t id = 0; id < n; ++id) {
      const TokenKind kind = spec_.kinds[id];
      pieces_[id] = (kind == TokenKind::control || kind == TokenKind::user_defined)
                        ? spec_.tokens[id]
                        : byte_level::decode(spec_.tokens[id]);
      if ((kind == TokenKind::control || kind == TokenKind::user_defined) && !spec_.tokens[id].empty()) {
        matchable_.push_back(id);
      }
    }
    // Longest text first, so "<|im_start|>" wins over any token it contains;
    // llama.cpp partitions the text the same way.
    std::stable_sort(matchable_.begin(), matchable_.end(), [&](int32_t a, int32_t b) {
      return spec_.tokens[a].size() > spec_.tokens[b].size();
    });
    for (int32_t id : {spec_.eos, spec_.eot, spec_.eom}) {
      if (id >= 0) eog_.insert(id);
    }
    for (const char* text : k_eog_texts) {
      const int32_t id = find_special(text);
      if (id >= 0) eog_.insert(id);
    }
    format_ = detect_chat_format(spec_.chat_template, find_special("<|im_start|>") >= 0,
                                 find_special("<|start_header_id|>") >= 0);
    if (format_.family == ChatTemplate::llama3 && spec_.bos >= 0) format_.bos_text = spec_.tokens[spec_.bos];
  }

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 2);
    if (add_bos) {
      KVT_CHECK(spec_.bos >= 0, "{}: add_bos requested but the tokenizer has no BOS token", spec_.source);
      out.push_back(spec_.bos);
    }
    const std::string clean = byte_level::is_valid_utf8(text) ? std::string() : byte_level::sanitize_utf8(text);
    const std::string_view input = clean.empty() ? text : std::string_view(clean);
    std::vector<Fragment> fragments;
    partition(input, parse_special, fragments);
    std::vector<std::string_view> pieces;
    std::string prefixed;
    for (const Fragment& f : fragments) {
      if (f.token >= 0) {
        out.push_back(f.token);
        continue;
      }
      std::string_view body = input.substr(f.begin, f.end - f.begin);
      if (spec_.pre.add_prefix_space() && body.front() != ' ') {
        prefixed = " ";
        prefixed += body;
        body = prefixed;
      }
      spec_.pre.split(body, pieces);
      for (std::string_view piece : pieces) bpe_.encode_piece(piece, out);
    }
    return out;
  }

  std::string token_to_piece(int32_t id) const override {
    check_id(id);
    return pieces_[id];
  }

  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::string out;
    for (int32_t id : ids) {
      check_id(id);
      if (skip_special && spec_.kinds[id] == TokenKind::control) continue;
      out += pieces_[id];
    }
    return out;
  }

  int32_t n_vocab() const override { return int32_t(spec_.tokens.size()); }
  int32_t bos_id() const override { return spec_.bos; }
  int32_t eos_id() const override { return spec_.eos; }
  bool is_eog(int32_t id) const override { return eog_.count(id) > 0; }
  bool is_special(int32_t id) const override {
    return id >= 0 && id < n_vocab() && spec_.kinds[id] == TokenKind::control;
  }
  bool add_bos_default() const override { return spec_.add_bos; }
  ChatTemplate chat_template() const override { return format_.family; }
  ToolFormat tool_format() const override { return format_.tools; }
  using Tokenizer::apply_chat_template;
  std::string apply_chat_template(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                  std::string_view tools_json) const override {
    return render_chat(format_, messages, add_generation_prompt, tools_json);
  }

 private:
  // A stretch of input: plain text [begin, end) or a matched special token.
  struct Fragment {
    size_t begin = 0;
    size_t end = 0;
    int32_t token = -1;
  };

  void check_id(int32_t id) const {
    KVT_CHECK(id >= 0 && id < n_vocab(), "{}: token id {} out of range [0, {})", spec_.source, id, n_vocab());
  }

  int32_t find_special(std::string_view text) const {
    for (int32_t id : matchable_) {
      if (spec_.kinds[id] == TokenKind::control && spec_.tokens[id] == text) return id;
    }
    return -1;
  }

  // Cuts the text at every occurrence of a special token, longest tokens
  // first. Control tokens are matched only with parse_special; user-defined
  // ones always (HF and llama.cpp agree on this).
  void partition(std::string_view text, bool parse_special, std::vector<Fragment>& out) const {
    out.clear();
    if (text.empty()) return;
    out.push_back(Fragment{0, text.size(), -1});
    std::vector<Fragment> next;
    for (int32_t id : matchable_) {
      if (!parse_special && spec_.kinds[id] == TokenKind::control) continue;
      const std::string& tok = spec_.tokens[id];
      const AddedTokenFlags flags = spec_.flags[id];
      bool changed = false;
      next.clear();
      for (const Fragment& f : out) {
        if (f.token >= 0) {
          next.push_back(f);
          continue;
        }
        const std::string_view region = text.substr(0, f.end);
        size_t start = f.begin;
        size_t match;
        while ((match = region.find(tok, start)) != std::string_view::npos) {
          changed = true;
          size_t left_end = match;
          if (flags.lstrip) {
            while (left_end > start && is_ascii_space(text[left_end - 1])) --left_end;
          }
          if (left_end > start) next.push_back(Fragment{start, left_end, -1});
          next.push_back(Fragment{match, match + tok.size(), id});
          start = match + tok.size();
          if (flags.rstrip) {
            while (start < f.end && is_ascii_space(text[start])) ++start;
          }
        }
        if (start < f.end) next.push_back(Fragment{start, f.end, -1});
      }
      if (changed) out.swap(next);
    }
  }

  TokenizerSpec spec_;
  BpeModel bpe_;
  std::vector<std::string> pieces_;  // raw bytes per id
  std::vector<int32_t> matchable_;   // control + user-defined ids, longest text first
  std::unordered_set<int32_t> eog_;
  ChatFormat format_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(TokenizerSpec spec) {
  const int32_t n = int32_t(spec.tokens.size());
  KVT_CHECK(n > 0, "{}: the vocabulary is empty", spec.source);
  const auto check = [&](int32_t id, const char* what) {
    KVT_CHECK(id >= -1 && id < n, "{}: {} token id {} out of range [0, {})", spec.source, what, id, n);
  };
  check(spec.bos, "BOS");
  check(spec.eos, "EOS");
  check(spec.eot, "EOT");
  check(spec.eom, "EOM");
  check(spec.pad, "padding");
  return std::make_unique<BpeTokenizer>(std::move(spec));
}

}  // namespace kvtier
