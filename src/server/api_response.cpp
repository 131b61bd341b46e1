#include "server/api_response.h"

namespace kvtier::server {

using nlohmann::json;

std::string dump_json(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json error_json(const std::string& message, const std::string& type, const std::string& param,
                const std::string& code) {
  json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return json{{"error", e}};
}

json error_json(const RequestError& e) { return error_json(e.what(), e.type(), e.param(), e.code()); }

json usage_json(int64_t n_prompt, int64_t n_completion) {
  return json{{"prompt_tokens", n_prompt},
              {"completion_tokens", n_completion},
              {"total_tokens", n_prompt + n_completion}};
}

json kvtier_json(const GenerationResult& r) {
  const KvMemory& m = r.kv_memory;
  return json{{"kv_policy", r.kv_policy},
              {"gpu_bytes_per_token", m.gpu_bytes_per_token},
              {"host_bytes_per_token", m.host_bytes_per_token},
              {"gpu_bytes", m.gpu_bytes},
              {"host_bytes", m.host_bytes},
              {"prefill_seconds", r.prefill_seconds},
              {"decode_seconds", r.decode_seconds}};
}

std::string openai_finish_reason(const std::string& engine_reason) {
  // The engine says "stop" for EOS and stop strings, "length" for max tokens;
  // anything else (never sent for a completed request) maps to "stop".
  return engine_reason == "length" ? "length" : "stop";
}

json completion_json(const ResponseMeta& meta, const GenerationResult& r, const std::string& echo_prefix,
                     const json& logprobs) {
  const int64_t n_completion = int64_t(r.tokens.size());
  json choice = {{"index", 0}, {"finish_reason", openai_finish_reason(r.finish_reason)},
                 {"logprobs", logprobs}};
  json out = {{"id", meta.id}, {"created", meta.created}, {"model", meta.model}};
  if (meta.endpoint == Endpoint::chat) {
    choice["message"] = {{"role", "assistant"}, {"content", r.text}};
    out["object"] = "chat.completion";
  } else {
    choice["text"] = echo_prefix + r.text;
    out["object"] = "text_completion";
  }
  out["choices"] = json::array({choice});
  out["usage"] = usage_json(r.n_prompt_tokens, n_completion);
  out["kvtier"] = kvtier_json(r);
  return out;
}

json stream_chunk_json(const ResponseMeta& meta, const std::string& text, bool first,
                       const std::optional<std::string>& finish_reason, bool usage_null, const json& logprobs) {
  json choice = {{"index", 0}, {"logprobs", logprobs}};
  choice["finish_reason"] = finish_reason ? json(*finish_reason) : json(nullptr);
  json out = {{"id", meta.id}, {"created", meta.created}, {"model", meta.model}};
  if (meta.endpoint == Endpoint::chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || first) delta["content"] = text;
    choice["delta"] = delta;
    out["object"] = "chat.completion.chunk";
  } else {
    choice["text"] = text;
    out["object"] = "text_completion";
  }
  out["choices"] = json::array({choice});
  if (usage_null) out["usage"] = nullptr;
  return out;
}

json usage_chunk_json(const ResponseMeta& meta, const GenerationResult& r) {
  json out = {{"id", meta.id},
              {"created", meta.created},
              {"model", meta.model},
              {"object", meta.endpoint == Endpoint::chat ? "chat.completion.chunk"
                                                         : "text_completion"},
              {"choices", json::array()}};
  out["usage"] = usage_json(r.n_prompt_tokens, int64_t(r.tokens.size()));
  out["kvtier"] = kvtier_json(r);
  return out;
}

std::string sse_event(const json& data) { return "data: " + dump_json(data) + "\n\n"; }

std::string sse_done() { return "data: [DONE]\n\n"; }

std::string sse_comment(const std::string& text) {
  // A comment line must not contain a line break, or the rest would be parsed as fields.
  std::string line;
  for (char c : text) line += (c == '\n' || c == '\r') ? ' ' : c;
  return ": " + line + "\n\n";
}

}  // namespace kvtier::server
