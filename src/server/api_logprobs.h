// OpenAI's logprobs objects from the engine's TokenLogprob entries:
// chat's {"content": [{token, logprob, bytes, top_logprobs}]} and
// completions' {tokens, token_logprobs, top_logprobs, text_offset}.
// Token strings are the tokenizer's pieces (possibly partial UTF-8,
// serialized with U+FFFD by dump_json); `bytes` carries the exact bytes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvtier/engine.h"

namespace kvtier::server {

nlohmann::json chat_logprobs_json(const std::vector<TokenLogprob>& lps, const Tokenizer& tok);

// Completions' object. Echo: prompt_first is the prompt's first token (no
// logprob: null) and prompt the scored rest; `offset` is where the first
// token's text starts in the choice's text (text_offset counts bytes).
struct CompletionLogprobs {
  nlohmann::json tokens = nlohmann::json::array();
  nlohmann::json token_logprobs = nlohmann::json::array();
  nlohmann::json top_logprobs = nlohmann::json::array();
  nlohmann::json text_offset = nlohmann::json::array();
  int64_t offset = 0;

  void add_unscored(int32_t token, const Tokenizer& tok);
  void add(const TokenLogprob& lp, const Tokenizer& tok);
  nlohmann::json to_json() const;
};

}  // namespace kvtier::server
