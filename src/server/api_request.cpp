#include "server/api_request.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

namespace kvtier::server {

using nlohmann::json;

RequestError::RequestError(int status, std::string message, std::string param, std::string code,
                           std::string type)
    : Error(std::move(message)),
      status_(status),
      param_(std::move(param)),
      code_(std::move(code)),
      type_(std::move(type)) {}

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw RequestError(400, message, param);
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "object";
    case json::value_t::array: return "array";
    case json::value_t::string: return "string";
    case json::value_t::boolean: return "boolean";
    case json::value_t::binary: return "binary";
    case json::value_t::discarded: return "invalid";
    default: return "number";
  }
}

// The field's value, or nullptr when absent or null (OpenAI: null = not given).
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

bool get_bool(const json& v, const std::string& name) {
  if (!v.is_boolean()) bad(name, fmt::format("'{}' must be a boolean, got {}", name, type_name(v)));
  return v.get<bool>();
}

double get_number(const json& v, const std::string& name, double lo, double hi) {
  if (!v.is_number()) bad(name, fmt::format("'{}' must be a number, got {}", name, type_name(v)));
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) {
    bad(name, fmt::format("'{}' must be between {} and {}, got {}", name, lo, hi, v.dump()));
  }
  return x;
}

// An integer (an integral float such as 16.0 is accepted, as JSON has one number type).
int64_t get_int(const json& v, const std::string& name, int64_t lo, int64_t hi) {
  if (!v.is_number()) bad(name, fmt::format("'{}' must be an integer, got {}", name, type_name(v)));
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) {
      bad(name, fmt::format("'{}' must be between {} and {}, got {}", name, lo, hi, u));
    }
    x = int64_t(u);
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) {
      bad(name, fmt::format("'{}' must be an integer, got {}", name, v.dump()));
    }
    if (d < double(lo) || d > double(hi)) {
      bad(name, fmt::format("'{}' must be between {} and {}, got {}", name, lo, hi, v.dump()));
    }
    x = int64_t(d);
  }
  if (x < lo || x > hi) {
    bad(name, fmt::format("'{}' must be between {} and {}, got {}", name, lo, hi, x));
  }
  return x;
}

const std::string& get_string(const json& v, const std::string& name) {
  if (!v.is_string()) bad(name, fmt::format("'{}' must be a string, got {}", name, type_name(v)));
  return v.get_ref<const std::string&>();
}

std::vector<int32_t> get_token_ids(const json& v, const std::string& name) {
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    ids.push_back(int32_t(get_int(v[i], fmt::format("{}[{}]", name, i), 0,
                                  std::numeric_limits<int32_t>::max())));
  }
  return ids;
}

// completions' prompt: a string, a list of one string, a list of token ids, or
// a list of one list of token ids. Several prompts would need n > 1 choices.
void parse_prompt(const json& body, ApiRequest& r) {
  const json* p = field(body, "prompt");
  if (!p) bad("prompt", "'prompt' is required");
  if (p->is_string()) {
    r.prompt_text = p->get<std::string>();
    return;
  }
  if (!p->is_array()) {
    bad("prompt", fmt::format("'prompt' must be a string or an array, got {}", type_name(*p)));
  }
  if (p->empty()) bad("prompt", "'prompt' must not be an empty array");
  const json& first = (*p)[0];
  if (first.is_number()) {
    r.prompt_tokens = get_token_ids(*p, "prompt");
    return;
  }
  if (p->size() != 1) {
    bad("prompt", fmt::format("'prompt' holds {} prompts; this server takes one per request",
                              p->size()));
  }
  if (first.is_string()) {
    r.prompt_text = first.get<std::string>();
  } else if (first.is_array()) {
    if (first.empty()) bad("prompt", "'prompt[0]' must not be an empty array");
    r.prompt_tokens = get_token_ids(first, "prompt[0]");
  } else {
    bad("prompt", fmt::format("'prompt[0]' must be a string or an array of token ids, got {}",
                              type_name(first)));
  }
}

// A message's content: a string, or an array of {"type": "text", "text": ...} parts.
std::string message_content(const json& content, const std::string& name) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    bad(name, fmt::format("'{}' must be a string or an array of text parts, got {}", name,
                          type_name(content)));
  }
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string pname = fmt::format("{}[{}]", name, i);
    if (!part.is_object()) bad(pname, fmt::format("'{}' must be an object", pname));
    const json* type = field(part, "type");
    if (!type) bad(pname + ".type", fmt::format("'{}.type' is required", pname));
    const std::string& t = get_string(*type, pname + ".type");
    if (t != "text") {
      bad(pname + ".type",
          fmt::format("'{}.type' is '{}'; this server takes only text parts", pname, t));
    }
    const json* tv = field(part, "text");
    if (!tv) bad(pname + ".text", fmt::format("'{}.text' is required", pname));
    text += get_string(*tv, pname + ".text");
  }
  return text;
}

void parse_messages(const json& body, ApiRequest& r) {
  const json* m = field(body, "messages");
  if (!m) bad("messages", "'messages' is required");
  if (!m->is_array()) {
    bad("messages", fmt::format("'messages' must be an array, got {}", type_name(*m)));
  }
  if (m->empty()) bad("messages", "'messages' must hold at least one message");
  for (size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    const std::string name = fmt::format("messages[{}]", i);
    if (!msg.is_object()) {
      bad(name, fmt::format("'{}' must be an object, got {}", name, type_name(msg)));
    }
    const json* role = field(msg, "role");
    if (!role) bad(name + ".role", fmt::format("'{}.role' is required", name));
    std::string rs = get_string(*role, name + ".role");
    if (rs == "developer") rs = "system";  // OpenAI's newer name for the system role
    if (rs != "system" && rs != "user" && rs != "assistant") {
      bad(name + ".role", fmt::format("'{}.role' is '{}'; expected system, developer, user or "
                                      "assistant",
                                      name, rs));
    }
    const json* content = field(msg, "content");
    std::string text;
    if (content) {
      text = message_content(*content, name + ".content");
    } else if (rs != "assistant") {
      bad(name + ".content", fmt::format("'{}.content' is required", name));
    }
    if (const json* tc = field(msg, "tool_calls"); tc && !(tc->is_array() && tc->empty())) {
      bad(name + ".tool_calls", "tool calls are not supported by this server");
    }
    r.messages.push_back({std::move(rs), std::move(text)});
  }
}

void parse_stop(const json& body, ApiRequest& r) {
  const json* s = field(body, "stop");
  if (!s) return;
  if (s->is_string()) {
    if (!s->get_ref<const std::string&>().empty()) r.stop.push_back(s->get<std::string>());
    return;
  }
  if (!s->is_array()) {
    bad("stop", fmt::format("'stop' must be a string or an array of strings, got {}",
                            type_name(*s)));
  }
  if (s->size() > size_t(kMaxStopStrings)) {
    bad("stop", fmt::format("'stop' holds {} strings; at most {} are allowed", s->size(),
                            kMaxStopStrings));
  }
  for (size_t i = 0; i < s->size(); ++i) {
    const std::string& v = get_string((*s)[i], fmt::format("stop[{}]", i));
    if (v.empty()) bad(fmt::format("stop[{}]", i), "stop strings must not be empty");
    r.stop.push_back(v);
  }
}

// Fields of the OpenAI API this server does not implement: refused unless they
// hold their default, so that a client never gets silently different behaviour.
void refuse_unsupported(const json& body, Endpoint endpoint) {
  if (const json* v = field(body, "n"); v && get_int(*v, "n", 1, 1 << 20) != 1) {
    bad("n", "'n' must be 1: this server returns one choice per request");
  }
  if (const json* v = field(body, "best_of"); v && get_int(*v, "best_of", 1, 1 << 20) != 1) {
    bad("best_of", "'best_of' must be 1: this server returns one choice per request");
  }
  if (const json* v = field(body, "suffix"); v && !(v->is_string() && v->get_ref<const std::string&>().empty())) {
    bad("suffix", "'suffix' is not supported by this server");
  }
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    if (const json* v = field(body, name); v && get_number(*v, name, -2.0, 2.0) != 0.0) {
      bad(name, fmt::format("'{}' is not supported by this server (only 0)", name));
    }
  }
  if (const json* v = field(body, "logit_bias")) {
    if (!v->is_object()) {
      bad("logit_bias", fmt::format("'logit_bias' must be an object, got {}", type_name(*v)));
    }
    if (!v->empty()) bad("logit_bias", "'logit_bias' is not supported by this server");
  }
  for (const char* name : {"tools", "functions"}) {
    if (const json* v = field(body, name); v && !(v->is_array() && v->empty())) {
      bad(name, fmt::format("'{}' is not supported by this server", name));
    }
  }
  if (const json* v = field(body, "response_format")) {
    if (!v->is_object()) {
      bad("response_format",
          fmt::format("'response_format' must be an object, got {}", type_name(*v)));
    }
    const json* t = field(*v, "type");
    if (t && get_string(*t, "response_format.type") != "text") {
      bad("response_format.type", "only response_format {\"type\": \"text\"} is supported");
    }
  }
  if (const json* v = field(body, "user")) get_string(*v, "user");
}

// completions: "logprobs": N (0..20) and "echo"; chat: "logprobs": bool and
// "top_logprobs": N (0..20, needs logprobs true).
void parse_logprobs(const json& body, ApiRequest& r) {
  const json* lp = field(body, "logprobs");
  const json* top = field(body, "top_logprobs");
  if (r.endpoint == Endpoint::completions) {
    if (top) bad("top_logprobs", "'top_logprobs' belongs to chat completions; here 'logprobs' is the count");
    if (lp) r.logprobs = int(get_int(*lp, "logprobs", 0, kMaxTopLogprobs));
    if (const json* v = field(body, "echo")) r.echo = get_bool(*v, "echo");
    return;
  }
  if (const json* v = field(body, "echo"); v && get_bool(*v, "echo"))
    bad("echo", "'echo' belongs to /v1/completions");
  const bool on = lp && get_bool(*lp, "logprobs");
  if (top) {
    const int n = int(get_int(*top, "top_logprobs", 0, kMaxTopLogprobs));
    if (!on) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r.logprobs = n;
  } else if (on) {
    r.logprobs = 0;
  }
}

}  // namespace

ApiRequest parse_request(std::string_view body, Endpoint endpoint) {
  json j;
  try {
    j = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {
    throw RequestError(400, fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) {
    throw RequestError(400, fmt::format("the request body must be a JSON object, got {}",
                                        type_name(j)));
  }
  ApiRequest r;
  r.endpoint = endpoint;
  if (const json* v = field(j, "model")) r.model = get_string(*v, "model");
  if (endpoint == Endpoint::completions) {
    parse_prompt(j, r);
  } else {
    parse_messages(j, r);
  }
  refuse_unsupported(j, endpoint);
  parse_logprobs(j, r);

  const json* mt = field(j, "max_tokens");
  const char* mt_name = "max_tokens";
  if (endpoint == Endpoint::chat) {
    if (const json* v = field(j, "max_completion_tokens")) {
      mt = v;
      mt_name = "max_completion_tokens";
    }
  }
  // max_tokens 0 only with echo: the prompt alone is returned (and scored).
  if (mt) r.max_tokens = get_int(*mt, mt_name, r.echo ? 0 : 1, std::numeric_limits<int32_t>::max());
  if (const json* v = field(j, "temperature")) r.temperature = float(get_number(*v, "temperature", 0, 2));
  if (const json* v = field(j, "top_p")) {
    r.top_p = float(get_number(*v, "top_p", 0, 1));
    if (r.top_p <= 0) bad("top_p", "'top_p' must be greater than 0");
  }
  if (const json* v = field(j, "top_k")) {
    // vLLM's convention: -1 also means off.
    const int64_t k = get_int(*v, "top_k", -1, std::numeric_limits<int32_t>::max());
    r.top_k = k < 0 ? 0 : int(k);
  }
  if (const json* v = field(j, "seed")) {
    // Any 64-bit integer; negative seeds wrap (the sampler only needs the bits).
    r.seed = uint64_t(get_int(*v, "seed", std::numeric_limits<int64_t>::min(),
                              std::numeric_limits<int64_t>::max()));
  }
  parse_stop(j, r);
  if (const json* v = field(j, "stream")) r.stream = get_bool(*v, "stream");
  if (const json* v = field(j, "stream_options")) {
    if (!v->is_object()) {
      bad("stream_options",
          fmt::format("'stream_options' must be an object, got {}", type_name(*v)));
    }
    if (!r.stream) bad("stream_options", "'stream_options' is only allowed with stream: true");
    if (const json* u = field(*v, "include_usage")) {
      r.include_usage = get_bool(*u, "stream_options.include_usage");
    }
  }
  if (const json* v = field(j, "ignore_eos")) r.ignore_eos = get_bool(*v, "ignore_eos");

  // The KV policy extension: a top-level "kv_policy" (convenient with curl and
  // the openai client's extra_body) or a namespaced "kvtier": {"kv_policy": ...}.
  if (const json* v = field(j, "kv_policy")) r.kv_policy = get_string(*v, "kv_policy");
  if (const json* ext = field(j, "kvtier")) {
    if (!ext->is_object()) {
      bad("kvtier", fmt::format("'kvtier' must be an object, got {}", type_name(*ext)));
    }
    if (const json* v = field(*ext, "kv_policy")) {
      const std::string& p = get_string(*v, "kvtier.kv_policy");
      if (r.kv_policy && *r.kv_policy != p) {
        bad("kvtier.kv_policy", "'kv_policy' and 'kvtier.kv_policy' disagree");
      }
      r.kv_policy = p;
    }
  }
  if (r.kv_policy && r.kv_policy->empty()) bad("kv_policy", "'kv_policy' must not be empty");
  return r;
}

}  // namespace kvtier::server
