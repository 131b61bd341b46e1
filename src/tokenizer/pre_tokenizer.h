// Pre-tokenizer: cuts text into the pieces BPE runs on, as a sequence of regex
// splits (HF's Split with behavior "Isolated": matches and the gaps between
// them both become pieces). Patterns are compiled with PCRE2 in UTF + UCP mode
// so \p{L}, \p{N} follow Unicode; \s and \S are rewritten to the Unicode
// White_Space set, which is what llama.cpp and HF tokenizers (Oniguruma) use —
// PCRE2 10.42's own \s would miss U+0085.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier {

// One compiled PCRE2 pattern. Thread-safe for matching.
class RegexPattern {
 public:
  // `where` names the source of the pattern in error messages.
  RegexPattern(std::string_view pattern, bool literal, std::string_view where);
  ~RegexPattern();
  RegexPattern(const RegexPattern&) = delete;
  RegexPattern& operator=(const RegexPattern&) = delete;

  // Appends to `out` the pieces of `text` (valid UTF-8): every match and every
  // non-empty gap between matches, in order. Empty matches split nothing.
  void split(std::string_view text, std::vector<std::string_view>& out) const;
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::string where_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

// The GPT-2 regex as HF's ByteLevel pre-tokenizer applies it (use_regex=true).
extern const char* const k_gpt2_pattern;
// llama.cpp's spellings of the Llama 3 and Qwen2 patterns (case-insensitive
// contractions written as [sS] classes).
extern const char* const k_llama3_pattern;
extern const char* const k_qwen2_pattern;

class PreTokenizer {
 public:
  // The pre-tokenizer llama.cpp uses for a GGUF `tokenizer.ggml.pre` value.
  // Throws kvtier::Error naming the value when it is not supported.
  // *ignore_merges and *add_bos receive that family's defaults.
  static PreTokenizer for_gguf_pre(std::string_view pre, std::string_view file, bool* ignore_merges,
                                   bool* add_bos);

  void add_split(std::string_view pattern, bool literal, std::string_view where);
  // HF ByteLevel's add_prefix_space: a space is prepended to a text fragment
  // that does not start with one.
  void set_add_prefix_space(bool on) { add_prefix_space_ = on; }
  bool add_prefix_space() const { return add_prefix_space_; }
  size_t n_steps() const { return steps_.size(); }

  // Splits `text` (valid UTF-8) into pieces; each piece views `text`.
  void split(std::string_view text, std::vector<std::string_view>& pieces) const;

 private:
  std::vector<std::shared_ptr<const RegexPattern>> steps_;
  bool add_prefix_space_ = false;
};

}  // namespace kvtier
