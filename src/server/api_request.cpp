#include "server/api_request.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

#include "grammar/constraint.h"
#include "grammar/json_schema.h"
#include "grammar/tool_calls.h"

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

// {"id", "type": "function", "function": {"name", "arguments": "<JSON object>"}}
ToolCall parse_tool_call(const json& c, const std::string& name) {
  if (!c.is_object()) bad(name, fmt::format("'{}' must be an object", name));
  const json* f = field(c, "function");
  if (!f || !f->is_object()) bad(name + ".function", fmt::format("'{}.function' must be an object", name));
  ToolCall call;
  if (const json* id = field(c, "id")) call.id = get_string(*id, name + ".id");
  const json* fn = field(*f, "name");
  if (!fn) bad(name + ".function.name", fmt::format("'{}.function.name' is required", name));
  call.name = get_string(*fn, name + ".function.name");
  call.arguments = "{}";
  if (const json* a = field(*f, "arguments")) {
    call.arguments = get_string(*a, name + ".function.arguments");
    if (!json::accept(call.arguments) || !json::parse(call.arguments).is_object()) {
      bad(name + ".function.arguments",
          fmt::format("'{}.function.arguments' must be a JSON object, as text", name));
    }
  }
  return call;
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
    if (rs != "system" && rs != "user" && rs != "assistant" && rs != "tool") {
      bad(name + ".role", fmt::format("'{}.role' is '{}'; expected system, developer, user, "
                                      "assistant or tool",
                                      name, rs));
    }
    const json* content = field(msg, "content");
    ChatMessage out;
    if (content) {
      out.content = message_content(*content, name + ".content");
    } else if (rs != "assistant") {
      bad(name + ".content", fmt::format("'{}.content' is required", name));
    }
    if (const json* tc = field(msg, "tool_calls"); tc && !(tc->is_array() && tc->empty())) {
      if (rs != "assistant" || !tc->is_array()) {
        bad(name + ".tool_calls", fmt::format("'{}.tool_calls' must be an array on an assistant message", name));
      }
      for (size_t k = 0; k < tc->size(); ++k) out.tool_calls.push_back(parse_tool_call((*tc)[k], fmt::format("{}.tool_calls[{}]", name, k)));
    }
    if (rs == "tool") {
      const json* id = field(msg, "tool_call_id");
      if (!id) bad(name + ".tool_call_id", fmt::format("'{}.tool_call_id' is required on a tool message", name));
      out.tool_call_id = get_string(*id, name + ".tool_call_id");
    }
    out.role = std::move(rs);
    r.messages.push_back(std::move(out));
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
  if (const json* v = field(body, "functions"); v && !(v->is_array() && v->empty())) {
    bad("functions", "'functions' (the legacy API) is not supported by this server: use 'tools'");
  }
  if (endpoint == Endpoint::completions) {
    for (const char* name : {"tools", "tool_choice"}) {
      if (field(body, name)) bad(name, fmt::format("'{}' is only for /v1/chat/completions", name));
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

// response_format: {"type": "text" | "json_object"} or {"type": "json_schema",
// "json_schema": {"name", "schema", "strict"?, "description"?}}.
void parse_response_format(const json& body, ApiRequest& r) {
  const json* v = field(body, "response_format");
  if (!v) return;
  if (!v->is_object()) {
    bad("response_format", fmt::format("'response_format' must be an object, got {}", type_name(*v)));
  }
  const json* t = field(*v, "type");
  if (!t) bad("response_format.type", "'response_format.type' is required");
  const std::string& type = get_string(*t, "response_format.type");
  if (type != "text" && type != "json_object" && type != "json_schema") {
    bad("response_format.type",
        fmt::format("'response_format.type' is '{}'; expected text, json_object or json_schema", type));
  }
  r.response_format = type;
  if (type != "json_schema") return;
  const json* js = field(*v, "json_schema");
  if (!js || !js->is_object()) {
    bad("response_format.json_schema", "'response_format.json_schema' must be an object with a 'schema'");
  }
  if (const json* n = field(*js, "name")) r.json_schema_name = get_string(*n, "response_format.json_schema.name");
  if (const json* s = field(*js, "strict")) get_bool(*s, "response_format.json_schema.strict");
  const json* schema = field(*js, "schema");
  if (!schema) bad("response_format.json_schema.schema", "'response_format.json_schema.schema' is required");
  try {
    check_json_schema(*schema, "response_format.json_schema.schema");
  } catch (const GrammarError& e) {
    bad("response_format.json_schema.schema", e.what());
  }
  r.json_schema = schema->dump();
}

// tools and tool_choice (chat).
void parse_tools(const json& body, ApiRequest& r) {
  const json* tools = field(body, "tools");
  if (tools && tools->is_array() && tools->empty()) tools = nullptr;
  std::vector<ToolSpec> specs;
  if (tools) {
    try {
      specs = parse_tool_specs(tools->dump());
    } catch (const GrammarError& e) {
      bad("tools", e.what());
    }
    r.tools = tools->dump();
    r.tool_choice = "auto";
  }
  const json* tc = field(body, "tool_choice");
  if (!tc) return;
  std::string choice;
  if (tc->is_string()) {
    choice = tc->get<std::string>();
    if (choice != "none" && choice != "auto" && choice != "required") {
      bad("tool_choice", fmt::format("'tool_choice' is '{}'; expected none, auto, required or "
                                     "{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                                     choice));
    }
  } else if (tc->is_object()) {
    const json* f = field(*tc, "function");
    const json* n = f && f->is_object() ? field(*f, "name") : nullptr;
    if (!n) bad("tool_choice.function.name", "'tool_choice.function.name' is required");
    choice = get_string(*n, "tool_choice.function.name");
    bool known = false;
    for (const ToolSpec& s : specs) known = known || s.name == choice;
    if (!known) bad("tool_choice.function.name", fmt::format("no tool named '{}' in 'tools'", choice));
  } else {
    bad("tool_choice", fmt::format("'tool_choice' must be a string or an object, got {}", type_name(*tc)));
  }
  if (!tools && choice != "none") bad("tool_choice", fmt::format("'tool_choice' is '{}' but there are no 'tools'", choice));
  if (choice != "none" && choice != "auto" && r.response_format != "text") {
    bad("tool_choice", "a forced tool call and a response_format other than text cannot both constrain the output");
  }
  r.tool_choice = choice;
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
  parse_response_format(j, r);
  if (endpoint == Endpoint::chat) parse_tools(j, r);
  if (r.response_format == "json_schema" || !r.tools.empty()) {
    // Keep the client's key order: properties are generated in schema order,
    // and chat templates print the tools as given.
    const auto ordered = nlohmann::ordered_json::parse(body.begin(), body.end());
    if (r.response_format == "json_schema") r.json_schema = ordered["response_format"]["json_schema"]["schema"].dump();
    if (!r.tools.empty()) r.tools = ordered["tools"].dump();
  }

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
