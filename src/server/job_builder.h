// From a parsed request to a scheduler Job: the KV policy is resolved and
// checked, the prompt tokenized (chat messages through the model's template),
// the server's limits applied (prompt tokens, new tokens, context, host KV
// bytes), and the sampling parameters filled in. Refusals are RequestErrors
// with status 400 that name the field at fault.
#pragma once
#include <cstdint>
#include <string>

#include "kv/kv_store.h"
#include "kvtier/engine.h"
#include "server/api_request.h"
#include "server/scheduler.h"

namespace kvtier::server {

struct ServerLimits {
  int64_t n_ctx = 0;              // the engine's context in tokens (prompt + generated)
  int64_t max_prompt_tokens = 0;  // 0: n_ctx - 1
  int64_t max_new_tokens = 2048;  // ceiling for max_tokens (and the chat default)
  std::string default_kv_policy = "full";
};

// The limits of an engine with the server's options applied.
ServerLimits make_limits(const Engine& engine, int64_t max_prompt_tokens, int64_t max_new_tokens,
                         const std::string& default_kv_policy);

// The completions default when max_tokens is absent (OpenAI's legacy default).
inline constexpr int64_t kDefaultCompletionTokens = 16;

Job build_job(const ApiRequest& request, const Engine& engine, const ServerLimits& limits);

}  // namespace kvtier::server
