#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pre_tokenizer.h"

#include <pcre2.h>

#include "core/status.h"

namespace kvtier {

// Pattern texts are the regexes these families publish in their tokenizer.json
// files; llama.cpp (src/llama-vocab.cpp) uses the same ones per `pre` value.
const char* const k_gpt2_pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const k_llama3_pattern =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const k_qwen2_pattern =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

// Unicode White_Space, written as class content.
constexpr std::string_view k_space_class =
    R"(\x{09}-\x{0D}\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// Rewrites \s and \S (outside and inside classes) to the White_Space set.
// \S inside a class has no class-content spelling; it is left to PCRE2.
std::string rewrite_spaces(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      if (n == 's') {
        if (in_class) {
          out += k_space_class;
        } else {
          out += '[';
          out += k_space_class;
          out += ']';
        }
        ++i;
        continue;
      }
      if (n == 'S' && !in_class) {
        out += "[^";
        out += k_space_class;
        out += ']';
        ++i;
        continue;
      }
      if (n == 'Q') {  // \Q...\E quotes everything up to \E
        const size_t end = p.find("\\E", i + 2);
        const size_t stop = end == std::string_view::npos ? p.size() : end + 2;
        out.append(p.substr(i, stop - i));
        i = stop - 1;
        continue;
      }
      out += c;
      out += n;
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX [:alpha:]
      const size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

// PCRE2's JIT needs a stack for backtracking; the default 32 KiB is too small
// for long whitespace runs, so each thread keeps its own larger one.
struct MatchState {
  pcre2_match_context* ctx = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchState() {
    ctx = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    if (ctx && stack) pcre2_jit_stack_assign(ctx, nullptr, stack);
    // Bounds the work of a pathological user-supplied pattern (a tokenizer.json
    // is input too): the match fails with an error instead of hanging.
    if (ctx) pcre2_set_match_limit(ctx, 50'000'000);
  }
  ~MatchState() {
    if (stack) pcre2_jit_stack_free(stack);
    if (ctx) pcre2_match_context_free(ctx);
  }
};

MatchState& match_state() {
  thread_local MatchState s;
  return s;
}

}  // namespace

RegexPattern::RegexPattern(std::string_view pattern, bool literal, std::string_view where)
    : source_(pattern), where_(where) {
  const std::string rewritten = literal ? std::string(pattern) : rewrite_spaces(pattern);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                                   options, &err, &err_off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("{}: invalid regex '{}': {} (at offset {} of the compiled form)", where_, source_,
         reinterpret_cast<const char*>(msg), size_t(err_off));
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

RegexPattern::~RegexPattern() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void RegexPattern::split(std::string_view text, std::vector<std::string_view>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  MatchState& state = match_state();
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  KVT_CHECK(md != nullptr, "{}: out of memory creating PCRE2 match data", where_);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;   // where the next search starts
  size_t emit = 0;  // start of the text not yet emitted
  while (pos <= text.size()) {
    // The caller guarantees valid UTF-8, so PCRE2 need not check it per call.
    int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, state.ctx)
                  : pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, state.ctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // fall back to the interpreter (heap frames)
      rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md,
                       state.ctx);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail("{}: regex '{}' failed on a {}-byte text: {}", where_, source_, text.size(),
           reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t start = ov[0];
    const size_t end = ov[1];
    if (end == start) {
      // An empty match cuts nothing; step over one whole code point.
      if (start >= text.size()) break;
      size_t next = start + 1;
      while (next < text.size() && (uint8_t(text[next]) & 0xC0) == 0x80) ++next;
      pos = next;
      continue;
    }
    if (start > emit) out.push_back(text.substr(emit, start - emit));
    out.push_back(text.substr(start, end - start));
    emit = end;
    pos = end;
  }
  pcre2_match_data_free(md);
  if (emit < text.size()) out.push_back(text.substr(emit));
}

PreTokenizer PreTokenizer::for_gguf_pre(std::string_view pre, std::string_view file,
                                        bool* ignore_merges, bool* add_bos) {
  PreTokenizer p;
  *ignore_merges = false;
  *add_bos = false;
  const std::string where = fmt::format("{}: tokenizer.ggml.pre '{}'", file, pre);
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "codeshell") {
    // StarCoder-derived vocabularies: every digit alone, then GPT-2's regex.
    p.add_split(R"(\p{N})", false, where);
    p.add_split(k_gpt2_pattern, false, where);
  } else if (pre == "gpt2" || pre == "gpt-2") {
    p.add_split(k_gpt2_pattern, false, where);
  } else if (pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe") {
    p.add_split(k_llama3_pattern, false, where);
    // Llama 3's tokenizer.json sets ignore_merges: a piece that is itself a
    // vocabulary entry is taken whole.
    *ignore_merges = true;
    *add_bos = true;
  } else if (pre == "qwen2" || pre == "deepseek-r1-qwen") {
    p.add_split(k_qwen2_pattern, false, where);
  } else {
    fail("{}: unsupported pre-tokenizer '{}' (tokenizer.ggml.pre); supported: smollm, starcoder, "
         "gpt2, gpt-2, llama3, llama-v3, llama-bpe, qwen2, deepseek-r1-qwen",
         file, pre);
  }
  return p;
}

void PreTokenizer::add_split(std::string_view pattern, bool literal, std::string_view where) {
  steps_.push_back(std::make_shared<const RegexPattern>(pattern, literal, where));
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  pieces.clear();
  if (text.empty()) return;
  pieces.push_back(text);
  std::vector<std::string_view> next;
  for (const auto& step : steps_) {
    next.clear();
    for (std::string_view piece : pieces) step->split(piece, next);
    pieces.swap(next);
  }
}

}  // namespace kvtier
