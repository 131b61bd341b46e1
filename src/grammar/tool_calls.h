// Tool calling (OpenAI `tools` / `tool_choice`) for the chat templates that
// support it (ToolFormat in tokenizer.h): the tool list checked, the output
// constrained to a call of one tool with its parameters schema, and calls
// read back from generated text.
//
//   hermes (Qwen2.5):      <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//   llama31_json (Llama 3.1): {"name": "f", "parameters": {...}}
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/constraint.h"
#include "tokenizer/tokenizer.h"

namespace kvtier {

struct ToolSpec {
  std::string name;
  std::string parameters;  // JSON Schema of the arguments (an object schema), as text
};

// Reads OpenAI's `tools` array (JSON text): every entry
// {"type": "function", "function": {"name", "description"?, "parameters"?}},
// names unique, parameters a supported schema (check_json_schema). Throws
// GrammarError naming the entry, e.g. "tools[1].function.name: ...".
std::vector<ToolSpec> parse_tool_specs(std::string_view tools_json);

// The text of one call of `tool` in `format`, for tests and examples.
std::string format_tool_call(ToolFormat format, const std::string& name, const std::string& arguments_json);

// A constraint to exactly one call of one of `tools` (all of them when
// `only` is empty, else the one named so). Throws GrammarError for
// ToolFormat::none or an unknown name.
std::shared_ptr<ConstraintFactory> tool_call_constraint(GrammarVocab& vocab, ToolFormat format,
                                                        const std::vector<ToolSpec>& tools,
                                                        const std::string& only = {});

struct ParsedToolCalls {
  std::string content;          // text outside the calls (trimmed)
  std::vector<ToolCall> calls;  // ids "call_<n>"; arguments as compact JSON text
};

// The tool calls in generated text (tool_choice "auto" as well): hermes
// <tool_call> blocks, or a whole output that is one llama31 call object.
// Text that only looks like a call (bad JSON, unknown shape) stays content.
ParsedToolCalls parse_tool_calls(ToolFormat format, std::string_view text);

}  // namespace kvtier
