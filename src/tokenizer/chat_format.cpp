#include "tokenizer/chat_format.h"

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/py_json.h"

namespace kvtier {
namespace {

// Undoes the escapes of a Jinja string literal (\n, \t, \', \", \\).
std::string unescape_jinja(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      const char n = s[++i];
      switch (n) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        default: out += n; break;
      }
    } else {
      out += s[i];
    }
  }
  return out;
}

// Finds a literal system turn in a ChatML template: "<|im_start|>system" + a
// newline (real, or the two characters \n inside a Jinja string) + text with
// no quotes or expression syntax + "<|im_end|>". A turn built from
// messages[0]['content'] never qualifies, since it leaves the string literal.
std::string find_default_system(std::string_view t) {
  constexpr std::string_view open = "<|im_start|>system";
  constexpr std::string_view close = "<|im_end|>";
  size_t pos = 0;
  while ((pos = t.find(open, pos)) != std::string_view::npos) {
    size_t body = pos + open.size();
    pos = body;
    if (t.substr(body, 1) == "\n") {
      body += 1;
    } else if (t.substr(body, 2) == "\\n") {
      body += 2;
    } else {
      continue;
    }
    const size_t end = t.find(close, body);
    if (end == std::string_view::npos) break;
    const std::string_view text = t.substr(body, end - body);
    if (text.find_first_of("'\"{}+") != std::string_view::npos) continue;
    return unescape_jinja(text);
  }
  return {};
}

// Llama 3.1's template sets `date_string = "26 Jul 2024"` unless the caller
// passes one; take the literal from the template when it has one.
std::string find_date_string(std::string_view t, const std::string& fallback) {
  const size_t at = t.find("date_string = \"");
  if (at == std::string_view::npos) return fallback;
  const size_t begin = at + 15;
  const size_t end = t.find('"', begin);
  if (end == std::string_view::npos || end - begin > 40) return fallback;
  return std::string(t.substr(begin, end - begin));
}

using ojson = nlohmann::ordered_json;

// The OpenAI `tools` array, parsed keeping its key order (templates dump it).
std::vector<ojson> parse_tools(std::string_view tools_json) {
  std::vector<ojson> tools;
  if (tools_json.empty()) return tools;
  ojson j;
  try {
    j = ojson::parse(tools_json);
  } catch (const ojson::parse_error& e) {
    fail("chat template: tools is not valid JSON ({})", e.what());
  }
  KVT_CHECK(j.is_array(), "chat template: tools must be an array");
  for (auto& t : j) tools.push_back(std::move(t));
  return tools;
}

// A call's arguments as the templates render them (`arguments | tojson`):
// the JSON object itself, not the string that carries it in the API.
std::string dump_arguments(const ToolCall& call) {
  ojson args;
  try {
    args = ojson::parse(call.arguments.empty() ? std::string("{}") : call.arguments);
  } catch (const ojson::parse_error&) {
    fail("chat template: the arguments of tool call '{}' are not valid JSON: {}", call.name, call.arguments);
  }
  return py_json_dumps(args);
}

// Qwen2.5's template (ChatML with <tools> in the system turn).
std::string render_hermes(const ChatFormat& f, const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                          const std::vector<ojson>& tools) {
  std::string out;
  const bool first_is_system = !messages.empty() && messages[0].role == "system";
  if (!tools.empty()) {
    out += "<|im_start|>system\n";
    out += first_is_system ? messages[0].content : f.default_system;
    out += "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
           "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
    for (const ojson& t : tools) out += "\n" + py_json_dumps(t);
    out += "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
           "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
           "<args-json-object>}\n</tool_call><|im_end|>\n";
  } else if (first_is_system) {
    out += "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n";
  } else if (!f.default_system.empty()) {
    out += "<|im_start|>system\n" + f.default_system + "<|im_end|>\n";
  }
  for (size_t i = first_is_system ? 1 : 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    } else if (m.role == "assistant" && !m.tool_calls.empty()) {
      out += "<|im_start|>assistant";
      if (!m.content.empty()) out += "\n" + m.content;
      for (const ToolCall& c : m.tool_calls)
        out += "\n<tool_call>\n{\"name\": \"" + c.name + "\", \"arguments\": " + dump_arguments(c) + "}\n</tool_call>";
      out += "<|im_end|>\n";
    } else {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    }
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

// Llama 3.1's template with tools_in_user_message (its default): the
// functions open the first user turn; a call is {"name", "parameters"}.
std::string render_llama31_tools(const ChatFormat& f, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt, const std::vector<ojson>& tools) {
  std::string out = f.bos_text;
  size_t first = 0;
  std::string system;
  if (!messages.empty() && messages[0].role == "system") {
    system = byte_level::trim_unicode_space(messages[0].content);
    first = 1;
  }
  out += "<|start_header_id|>system<|end_header_id|>\n\n";
  if (!tools.empty()) out += "Environment: ipython\n";
  out += "Cutting Knowledge Date: December 2023\nToday Date: " + f.date_string + "\n\n";
  out += system + "<|eot_id|>";
  if (!tools.empty()) {
    KVT_CHECK(first < messages.size(),
              "chat template: tools go into the first user message, and there is no user message");
    out += "<|start_header_id|>user<|end_header_id|>\n\n";
    out += "Given the following functions, please respond with a JSON for a function call with its proper "
           "arguments that best answers the given prompt.\n\n";
    out += "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its "
           "value}.Do not use variables.\n\n";
    for (const ojson& t : tools) out += py_json_dumps(t, 4) + "\n\n";
    out += byte_level::trim_unicode_space(messages[first].content) + "<|eot_id|>";
    ++first;
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool" || m.role == "ipython") {
      // The template dumps the content with tojson (a string is iterable in
      // Jinja), so a plain string arrives quoted.
      out += "<|start_header_id|>ipython<|end_header_id|>\n\n" + py_json_dumps(m.content) + "<|eot_id|>";
    } else if (!m.tool_calls.empty()) {
      KVT_CHECK(m.tool_calls.size() == 1, "chat template: this model supports one tool call per turn, got {}",
                m.tool_calls.size());
      const ToolCall& c = m.tool_calls[0];
      out += "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"" + c.name + "\", \"parameters\": " +
             dump_arguments(c) + "}<|eot_id|>";
    } else {
      out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + byte_level::trim_unicode_space(m.content) +
             "<|eot_id|>";
    }
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

}  // namespace

ChatFormat detect_chat_format(std::string_view t, bool has_im_start, bool has_header) {
  ChatFormat f;
  if (t.find("<|im_start|>") != std::string_view::npos) {
    f.family = ChatTemplate::chatml;
    f.default_system = find_default_system(t);
    if (t.find("<tool_call>") != std::string_view::npos) f.tools = ToolFormat::hermes;
  } else if (t.find("<|start_header_id|>") != std::string_view::npos) {
    f.family = ChatTemplate::llama3;
    f.llama31_system_header = t.find("Cutting Knowledge Date") != std::string_view::npos;
    f.date_string = find_date_string(t, f.date_string);
    if (f.llama31_system_header && t.find("Environment: ipython") != std::string_view::npos)
      f.tools = ToolFormat::llama31_json;
  } else if (t.empty() && has_header) {  // the rarer marker decides when a vocabulary has both
    f.family = ChatTemplate::llama3;
  } else if (t.empty() && has_im_start) {
    f.family = ChatTemplate::chatml;
  }
  return f;
}

std::string render_chat(const ChatFormat& f, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt, std::string_view tools_json) {
  KVT_CHECK(f.family != ChatTemplate::none,
            "chat template: this tokenizer has no supported chat template (ChatML or Llama 3)");
  const std::vector<ojson> tools = parse_tools(tools_json);
  if (f.tools == ToolFormat::hermes) return render_hermes(f, messages, add_generation_prompt, tools);
  if (f.tools == ToolFormat::llama31_json) return render_llama31_tools(f, messages, add_generation_prompt, tools);
  bool calls = false;
  for (const ChatMessage& m : messages) calls = calls || !m.tool_calls.empty();
  KVT_CHECK(tools.empty() && !calls,
            "chat template: this model's template has no tool support (tools work with Qwen2.5-style and "
            "Llama 3.1-style templates)");
  std::string out;
  if (f.family == ChatTemplate::chatml) {
    if (!f.default_system.empty() && (messages.empty() || messages[0].role != "system")) {
      out += "<|im_start|>system\n" + f.default_system + "<|im_end|>\n";
    }
    for (const ChatMessage& m : messages) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    }
    if (add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
  }
  // Llama 3: contents are trimmed by the template (`| trim`).
  out += f.bos_text;
  size_t first = 0;
  if (f.llama31_system_header) {
    std::string system;
    if (!messages.empty() && messages[0].role == "system") {
      system = byte_level::trim_unicode_space(messages[0].content);
      first = 1;
    }
    out += "<|start_header_id|>system<|end_header_id|>\n\n";
    out += "Cutting Knowledge Date: December 2023\nToday Date: " + f.date_string + "\n\n";
    out += system + "<|eot_id|>";
  }
  for (size_t i = first; i < messages.size(); ++i) {
    out += "<|start_header_id|>" + messages[i].role + "<|end_header_id|>\n\n" +
           byte_level::trim_unicode_space(messages[i].content) + "<|eot_id|>";
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

}  // namespace kvtier
