// What the GGUF and tokenizer.json loaders both produce; bpe_tokenizer.cpp
// turns it into a Tokenizer. Internal to src/tokenizer.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/bpe_model.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace kvtier {

enum class TokenKind : uint8_t {
  normal,        // a BPE token: text is in byte-level spelling
  control,       // special (GGUF control/unknown, HF added with special=true): raw text
  user_defined,  // HF added token with special=false: raw text, always matched in input
  unused,
};

struct AddedTokenFlags {
  bool lstrip = false;  // absorbs whitespace on its left when matched
  bool rstrip = false;  // absorbs whitespace on its right
};

struct TokenizerSpec {
  std::string source;  // file name, for messages
  std::vector<std::string> tokens;
  std::vector<TokenKind> kinds;
  std::vector<AddedTokenFlags> flags;  // empty or one per token
  std::vector<std::pair<std::string, std::string>> merges;
  bool ignore_merges = false;
  BpeModel::MissingByte missing_byte = BpeModel::MissingByte::barrier;
  PreTokenizer pre;
  int32_t bos = -1;
  int32_t eos = -1;
  int32_t eot = -1;
  int32_t eom = -1;
  int32_t pad = -1;
  bool add_bos = false;
  std::string chat_template;
};

std::unique_ptr<Tokenizer> make_bpe_tokenizer(TokenizerSpec spec);

// Tokenizer::from_gguf with tokenizer.ggml.pre replaced by `pre_override`
// when it is not empty (tests run other families' pre-tokenizers over the
// default model's vocabulary this way).
std::unique_ptr<Tokenizer> tokenizer_from_gguf(const GgufFile& gguf, std::string_view pre_override);

}  // namespace kvtier
