// OpenAI-style response bodies, stream chunks and server-sent-event framing,
// independent of HTTP. Text from the model may end in an incomplete UTF-8
// sequence (a cut at max_tokens); it is serialized with U+FFFD replacements so
// that a response is always valid JSON.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "kvtier/engine.h"
#include "server/api_request.h"

namespace kvtier::server {

// What every response and chunk of one request repeats.
struct ResponseMeta {
  Endpoint endpoint = Endpoint::completions;
  std::string id;  // "cmpl-…" or "chatcmpl-…"
  int64_t created = 0;  // unix seconds
  std::string model;
};

// json::dump that never throws on invalid UTF-8 (replaces it with U+FFFD).
std::string dump_json(const nlohmann::json& j);

// {"error": {"message", "type", "param", "code"}} as OpenAI sends it.
nlohmann::json error_json(const std::string& message, const std::string& type = "invalid_request_error",
                          const std::string& param = {}, const std::string& code = {});
nlohmann::json error_json(const RequestError& e);

// {"prompt_tokens", "completion_tokens", "total_tokens"}
nlohmann::json usage_json(int64_t n_prompt, int64_t n_completion);

// The kvtier extension object: the policy that ran and its KV footprint
// (GPU tier and host tier, per token and in total) plus timings.
nlohmann::json kvtier_json(const GenerationResult& r);

// OpenAI's finish_reason for an engine finish reason ("stop", "length").
std::string openai_finish_reason(const std::string& engine_reason);

// The whole non-streaming response: text_completion or chat.completion.
// echo_prefix: the prompt's text, put before the answer (completions' echo);
// logprobs: the choice's logprobs object (null when not asked for).
nlohmann::json completion_json(const ResponseMeta& meta, const GenerationResult& r,
                               const std::string& echo_prefix = {},
                               const nlohmann::json& logprobs = nullptr);

// One streaming chunk carrying `text`. Chat: the first chunk of a stream
// (first = true) also carries the role. finish_reason set: the closing chunk.
// usage_null: the chunk has "usage": null (OpenAI does this for every chunk
// but the last when stream_options.include_usage is on).
nlohmann::json stream_chunk_json(const ResponseMeta& meta, const std::string& text, bool first,
                                 const std::optional<std::string>& finish_reason,
                                 bool usage_null, const nlohmann::json& logprobs = nullptr);

// The extra last chunk of a stream with include_usage: no choices, usage and
// the kvtier object.
nlohmann::json usage_chunk_json(const ResponseMeta& meta, const GenerationResult& r);

// Server-sent events framing.
std::string sse_event(const nlohmann::json& data);  // "data: {...}\n\n"
std::string sse_done();                             // "data: [DONE]\n\n"
std::string sse_comment(const std::string& text);   // ": text\n\n" (ignored by clients)

}  // namespace kvtier::server
