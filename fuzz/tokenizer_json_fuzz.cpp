// libFuzzer target: the tokenizer.json + tokenizer_config.json parser
// (Tokenizer::from_hf_text) on arbitrary bytes. The input is the
// tokenizer.json text, optionally followed by a NUL byte and the config text.
// Any input must either load or throw kvtier::Error; a loaded tokenizer must
// then encode, decode and render chats without crashing and with every id in
// range. Seeds: fuzz/seeds/tokenizer_json (scripts/gen_tokenizer_fuzz_seeds.py).
// Run: build-fuzz/tokenizer_json_fuzz -runs=1000000 <corpus dir> fuzz/seeds/tokenizer_json
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string_view tokenizer_json = in.substr(0, nul);
  const std::string_view config = nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
  std::unique_ptr<kvtier::Tokenizer> tok;
  try {
    tok = kvtier::Tokenizer::from_hf_text(tokenizer_json, config);
  } catch (const kvtier::Error&) {
    return 0;
  }
  // Text mixing the families' special tokens, digits, spaces, CJK and, from
  // the input itself, bytes the fuzzer controls (possibly invalid UTF-8).
  std::string sample = "Hello <|im_start|>user\n 1234  \t\xE4\xBD\xA0\xE5\xA5\xBD<|eot_id|> I'm ";
  sample += std::string(tokenizer_json.substr(0, 200));
  for (bool special : {false, true}) {
    std::vector<int32_t> ids;
    try {
      ids = tok->encode(sample, /*add_bos=*/false, special);
    } catch (const kvtier::Error&) {  // e.g. a pathological user regex hitting PCRE2's match limit
      continue;
    }
    for (int32_t id : ids) {
      if (id < 0 || id >= tok->n_vocab()) __builtin_trap();
      (void)tok->token_to_piece(id);
    }
    (void)tok->decode(ids, /*skip_special=*/true);
  }
  try {
    (void)tok->apply_chat_template({{"system", "s"}, {"user", "u"}}, true);
  } catch (const kvtier::Error&) {  // no chat template family
  }
  return 0;
}
