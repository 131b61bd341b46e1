// Parsing and validation of OpenAI-style request bodies (/v1/completions and
// /v1/chat/completions) into a plain struct, independent of HTTP. Every field
// is type-checked; anything the server cannot honour is refused with a
// RequestError that carries the HTTP status, the offending field and a message
// (rendered as OpenAI's {"error": {...}} object by api_response.h).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace kvtier::server {

enum class Endpoint { completions, chat };

// A request the server refuses. status is the HTTP status (400, 413, 429, 503…),
// param the JSON field at fault (empty when none), code OpenAI's error code
// (e.g. "context_length_exceeded"), type OpenAI's error type.
class RequestError : public Error {
 public:
  RequestError(int status, std::string message, std::string param = {}, std::string code = {},
               std::string type = "invalid_request_error");
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  const std::string& type() const { return type_; }

 private:
  int status_;
  std::string param_;
  std::string code_;
  std::string type_;
};

// A parsed, type-checked request. Optional fields stay unset when the body
// omits them or gives null (OpenAI treats null as "not given").
struct ApiRequest {
  Endpoint endpoint = Endpoint::completions;
  std::string model;  // echoed back only; the server serves one model
  // completions: either prompt_text or prompt_tokens is set.
  std::optional<std::string> prompt_text;
  std::optional<std::vector<int32_t>> prompt_tokens;
  // chat
  std::vector<ChatMessage> messages;

  std::optional<int64_t> max_tokens;  // max_tokens or max_completion_tokens
  float temperature = 1.0f;           // OpenAI's default
  float top_p = 1.0f;
  int top_k = 0;  // extension (as in vLLM); 0: off
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool ignore_eos = false;     // extension (as in vLLM)
  std::optional<std::string> kv_policy;  // extension: "kv_policy" or "kvtier": {"kv_policy"}
  // Log-probabilities: -1 off; else the number of most likely alternatives per
  // token (completions: "logprobs": N; chat: "logprobs": true + "top_logprobs": N).
  int logprobs = -1;
  bool echo = false;  // completions: the prompt is repeated before the answer (with logprobs: scored)

  // Structured output (src/grammar). response_format.type: "text",
  // "json_object" or "json_schema"; for the last, json_schema holds the
  // schema (checked against the supported subset) as JSON text.
  std::string response_format = "text";
  std::string json_schema;
  std::string json_schema_name;
  // chat: the checked `tools` array as JSON text ("" for none), and
  // tool_choice: "none", "auto", "required", or the name of one function
  // ({"type": "function", "function": {"name": ...}}). Defaults as OpenAI's:
  // "auto" with tools, "none" without. Whether the model's chat template
  // supports tools is for the job builder to check (Tokenizer::tool_format).
  std::string tools;
  std::string tool_choice = "none";
};

// Most alternatives per token for logprobs / top_logprobs (OpenAI's chat limit).
inline constexpr int kMaxTopLogprobs = 20;

// Most stop strings per request (OpenAI allows 4; a few more do no harm).
inline constexpr int kMaxStopStrings = 16;

// Parses a request body. Throws RequestError (status 400) for malformed JSON,
// a body that is not an object, a field of the wrong type or out of range, a
// schema or tool list outside the supported subset, or a feature the server
// does not implement (n > 1, penalties, logit_bias…).
ApiRequest parse_request(std::string_view body, Endpoint endpoint);

}  // namespace kvtier::server
