#include "grammar/tool_calls.h"

#include <cctype>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "grammar/json_schema.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/py_json.h"

namespace kvtier {
namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view k_hermes_open = "<tool_call>";
constexpr std::string_view k_hermes_close = "</tool_call>";

// The key of a call's arguments in each format.
const char* arguments_key(ToolFormat format) { return format == ToolFormat::hermes ? "arguments" : "parameters"; }

// Rewrites every local "$ref" of a tool's parameters schema so that it still
// names the same node once the schema lives at #/$defs/<slot>.
void rebase_refs(ojson& node, const std::string& slot) {
  if (node.is_object()) {
    for (auto& [key, value] : node.items()) {
      if (key == "$ref" && value.is_string()) {
        const std::string ref = value.get<std::string>();
        if (!ref.empty() && ref[0] == '#') value = "#/$defs/" + slot + ref.substr(1);
      } else {
        rebase_refs(value, slot);
      }
    }
  } else if (node.is_array()) {
    for (auto& item : node) rebase_refs(item, slot);
  }
}

// {"name": <const>, <arguments key>: <the tool's parameters>} for one tool.
ojson call_schema(ToolFormat format, const ToolSpec& tool, const std::string& slot) {
  ojson props = ojson::object();
  props["name"] = {{"const", tool.name}};
  props[arguments_key(format)] = {{"$ref", "#/$defs/" + slot}};
  return {{"type", "object"},
          {"properties", props},
          {"required", {"name", arguments_key(format)}},
          {"additionalProperties", false}};
}

std::optional<ToolCall> call_from_json(const ojson& j, size_t index) {
  if (!j.is_object() || !j.contains("name") || !j.at("name").is_string()) return std::nullopt;
  const ojson* args = nullptr;
  for (const char* key : {"arguments", "parameters"})
    if (j.contains(key)) args = &j.at(key);
  ojson parsed;
  if (!args) {
    parsed = ojson::object();
  } else if (args->is_string()) {  // some models write the arguments as a JSON string, as the API does
    try {
      parsed = ojson::parse(args->get<std::string>());
    } catch (const ojson::parse_error&) {
      return std::nullopt;
    }
  } else {
    parsed = *args;
  }
  if (!parsed.is_object()) return std::nullopt;
  return ToolCall{fmt::format("call_{}", index), j.at("name").get<std::string>(), parsed.dump()};
}

std::optional<ojson> parse_object(std::string_view text) {
  try {
    ojson j = ojson::parse(text);
    if (j.is_object()) return j;
  } catch (const ojson::parse_error&) {
  }
  return std::nullopt;
}

}  // namespace

std::vector<ToolSpec> parse_tool_specs(std::string_view tools_json) {
  ojson tools;
  try {
    tools = ojson::parse(tools_json);
  } catch (const ojson::parse_error& e) {
    throw GrammarError(fmt::format("tools: not valid JSON ({})", e.what()));
  }
  if (!tools.is_array() || tools.empty()) throw GrammarError("tools: expected a non-empty array of tools");
  std::vector<ToolSpec> specs;
  std::set<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = fmt::format("tools[{}]", i);
    const ojson& t = tools[i];
    if (!t.is_object()) throw GrammarError(at + ": expected an object");
    if (!t.contains("type") || t.at("type") != "function")
      throw GrammarError(at + ".type: expected \"function\" (the only tool type)");
    if (!t.contains("function") || !t.at("function").is_object())
      throw GrammarError(at + ".function: expected an object with name, description and parameters");
    const ojson& f = t.at("function");
    if (!f.contains("name") || !f.at("name").is_string() || f.at("name").get<std::string>().empty())
      throw GrammarError(at + ".function.name: expected a non-empty string");
    const std::string name = f.at("name").get<std::string>();
    for (unsigned char c : name)
      if (!(std::isalnum(c) || c == '_' || c == '-' || c == '.'))
        throw GrammarError(fmt::format("{}.function.name: '{}' has characters other than a-z, A-Z, 0-9, _, - and .",
                                       at, name));
    if (!names.insert(name).second) throw GrammarError(fmt::format("{}.function.name: '{}' is listed twice", at, name));
    ojson params = f.contains("parameters") && !f.at("parameters").is_null()
                       ? f.at("parameters")
                       : ojson{{"type", "object"}, {"properties", ojson::object()}};
    if (!params.is_object() || !params.contains("type") || params.at("type") != "object")
      throw GrammarError(at + ".function.parameters: expected an object schema ({\"type\": \"object\", ...})");
    check_json_schema(nlohmann::json::parse(params.dump()), at + ".function.parameters");
    specs.push_back({name, params.dump()});
  }
  return specs;
}

std::string format_tool_call(ToolFormat format, const std::string& name, const std::string& arguments_json) {
  const std::string args = py_json_dumps(ojson::parse(arguments_json));
  const std::string call = "{\"name\": \"" + name + "\", \"" + arguments_key(format) + "\": " + args + "}";
  if (format == ToolFormat::hermes) return std::string(k_hermes_open) + "\n" + call + "\n" + std::string(k_hermes_close);
  return call;
}

std::shared_ptr<ConstraintFactory> tool_call_constraint(GrammarVocab& vocab, ToolFormat format,
                                                        const std::vector<ToolSpec>& tools, const std::string& only) {
  if (format == ToolFormat::none)
    throw GrammarError("tools: this model's chat template has no tool support (tools work with Qwen2.5-style and "
                       "Llama 3.1-style templates)");
  ojson defs = ojson::object();
  ojson alternatives = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    if (!only.empty() && tools[i].name != only) continue;
    const std::string slot = fmt::format("tool_{}", i);
    ojson params = ojson::parse(tools[i].parameters);
    rebase_refs(params, slot);
    defs[slot] = std::move(params);
    alternatives.push_back(call_schema(format, tools[i], slot));
  }
  if (alternatives.empty()) throw GrammarError(fmt::format("tool_choice: no tool named '{}' in tools", only));
  ojson schema = alternatives.size() == 1 ? alternatives[0] : ojson{{"anyOf", alternatives}};
  schema["$defs"] = defs;
  const std::string what = only.empty() ? "tool call" : fmt::format("tool call '{}'", only);
  if (format == ToolFormat::hermes)
    return vocab.wrapped_json_schema(schema.dump(), std::string(k_hermes_open) + "\n", "\n" + std::string(k_hermes_close),
                                     what);
  return vocab.wrapped_json_schema(schema.dump(), "", "", what);
}

ParsedToolCalls parse_tool_calls(ToolFormat format, std::string_view text) {
  ParsedToolCalls out;
  if (format == ToolFormat::hermes) {
    std::string content;
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t open = text.find(k_hermes_open, pos);
      if (open == std::string_view::npos) break;
      const size_t body = open + k_hermes_open.size();
      const size_t close = text.find(k_hermes_close, body);
      if (close == std::string_view::npos) break;
      const auto j = parse_object(text.substr(body, close - body));
      const auto call = j ? call_from_json(*j, out.calls.size()) : std::nullopt;
      content += text.substr(pos, open - pos);
      if (call) out.calls.push_back(*call);
      else content += text.substr(open, close + k_hermes_close.size() - open);
      pos = close + k_hermes_close.size();
    }
    content += text.substr(std::min(pos, text.size()));
    out.content = byte_level::trim_unicode_space(content);
  } else if (format == ToolFormat::llama31_json) {
    const std::string trimmed = byte_level::trim_unicode_space(text);
    const auto j = parse_object(trimmed);
    const auto call = j ? call_from_json(*j, 0) : std::nullopt;
    if (call) out.calls.push_back(*call);
    else out.content = trimmed;
  } else {
    out.content = std::string(text);
  }
  return out;
}

}  // namespace kvtier
