// Tools in the chat templates that have them (Qwen2.5, Llama 3.1) on the
// tokenizer fixtures, and the Python-compatible JSON they dump. Expected
// strings written by hand from the template texts.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/status.h"
#include "tokenizer/py_json.h"
#include "tokenizer/tokenizer.h"

namespace kvtier {
namespace {

const std::string k_golden = std::string(KVT_SOURCE_DIR) + "/tests/golden/";

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::unique_ptr<Tokenizer> with_template(const std::string& tokenizer_json, const std::string& tpl) {
  const nlohmann::json config = {{"chat_template", tpl}};
  return Tokenizer::from_hf_text(read(k_golden + tokenizer_json), config.dump());
}

// The parts of Qwen2.5-Instruct's template that the detection reads.
const char* const k_qwen25 =
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] }}{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.' }}{%- endif %}{{- \"\\n\\n# Tools\\n\\n...<tool_call>...\" }}{%- else %}"
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
    "'<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a "
    "helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- endif %}";

// The parts of Llama 3.1-Instruct's template that the detection reads.
const char* const k_llama31 =
    "{%- if not date_string is defined %}{%- set date_string = \"26 Jul 2024\" %}{%- endif %}"
    "{%- if not tools_in_user_message is defined %}{%- set tools_in_user_message = true %}{%- endif %}"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}{%- if builtin_tools is defined or tools is not "
    "none %}{{- \"Environment: ipython\\n\" }}{%- endif %}{{- \"Cutting Knowledge Date: December 2023\\n\" }}";

const char* const k_weather_tools = R"([{"type": "function", "function": {"name": "get_weather",
    "description": "Weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"},
    "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}}])";

TEST(PyJson, MatchesPythonJsonDumps) {
  // Expected: python3 -c 'import json; print(json.dumps(x, ensure_ascii=False[, indent=4]))'
  const auto v = nlohmann::ordered_json::parse(R"({"b": [1, 2.5, true, null], "a": {"é": "x\"y\n\u0001"}, "e": {}, "f": []})");
  EXPECT_EQ(py_json_dumps(v), R"({"b": [1, 2.5, true, null], "a": {"é": "x\"y\n\u0001"}, "e": {}, "f": []})");
  EXPECT_EQ(py_json_dumps(v, 4),
            "{\n    \"b\": [\n        1,\n        2.5,\n        true,\n        null\n    ],\n    \"a\": {\n"
            "        \"é\": \"x\\\"y\\n\\u0001\"\n    },\n    \"e\": {},\n    \"f\": []\n}");
}

TEST(ChatTools, Qwen25RendersToolsAndCalls) {
  auto tok = with_template("tokenizer_qwen2style_8k.json", k_qwen25);
  ASSERT_EQ(tok->tool_format(), ToolFormat::hermes);
  const std::string tool_line =
      R"({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": )"
      R"({"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}})";
  const std::string system =
      "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\n"
      "You may call one or more functions to assist with the user query.\n\n"
      "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" +
      tool_line +
      "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
      "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
      "<args-json-object>}\n</tool_call><|im_end|>\n";
  EXPECT_EQ(tok->apply_chat_template({{"user", "Weather in Paris?"}}, true, k_weather_tools),
            system + "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n");
  // A past call and two tool results (grouped in one user turn).
  std::vector<ChatMessage> turns = {{"user", "Weather in Paris?"}};
  turns.push_back({"assistant", "", {{"call_0", "get_weather", R"({"city":"Paris"})"}}, ""});
  turns.push_back({"tool", "18 C", {}, "call_0"});
  turns.push_back({"tool", "sunny", {}, "call_0"});
  EXPECT_EQ(tok->apply_chat_template(turns, true, k_weather_tools),
            system +
                "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
                "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"
                "<|im_start|>user\n<tool_response>\n18 C\n</tool_response>\n<tool_response>\nsunny\n"
                "</tool_response><|im_end|>\n<|im_start|>assistant\n");
  // A system message replaces the default one, tools or not.
  EXPECT_EQ(tok->apply_chat_template({{"system", "S"}, {"user", "U"}}, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n");
}

TEST(ChatTools, Llama31PutsToolsInTheFirstUserTurn) {
  auto tok = with_template("tokenizer_llama3style_8k.json", k_llama31);
  ASSERT_EQ(tok->tool_format(), ToolFormat::llama31_json);
  const std::string tools_block =
      "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n"
      "        \"description\": \"Weather in a city\",\n        \"parameters\": {\n            \"type\": \"object\",\n"
      "            \"properties\": {\n                \"city\": {\n                    \"type\": \"string\"\n"
      "                },\n                \"unit\": {\n                    \"enum\": [\n"
      "                        \"c\",\n                        \"f\"\n                    ]\n                }\n"
      "            },\n            \"required\": [\n                \"city\"\n            ]\n        }\n    }\n}\n\n";
  std::vector<ChatMessage> turns = {{"system", " Be brief. "}, {"user", " Weather in Paris? "}};
  EXPECT_EQ(tok->apply_chat_template(turns, true, k_weather_tools),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON "
            "for a function call with its proper arguments that best answers the given prompt.\n\n"
            "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its "
            "value}.Do not use variables.\n\n" +
                tools_block +
                "Weather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  turns.push_back({"assistant", "", {{"c", "get_weather", R"({"city": "Paris"})"}}, ""});
  turns.push_back({"tool", "18 C", {}, "c"});
  const std::string text = tok->apply_chat_template(turns, true, k_weather_tools);
  EXPECT_NE(text.find("<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", "
                      "\"parameters\": {\"city\": \"Paris\"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>"
                      "\n\n\"18 C\"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
            std::string::npos)
      << text;
  // Without tools the template is the plain Llama 3.1 one.
  EXPECT_EQ(tok->apply_chat_template({{"user", "Hi"}}, true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_THROW(tok->apply_chat_template({{"system", "only"}}, true, k_weather_tools), Error);
}

TEST(ChatTools, TemplatesWithoutToolsRefuseThem) {
  auto smol = Tokenizer::from_hf(k_golden + "tokenizer_smollm2.json", k_golden + "tokenizer_config_smollm2.json");
  EXPECT_EQ(smol->tool_format(), ToolFormat::none);
  try {
    smol->apply_chat_template({{"user", "Hi"}}, true, k_weather_tools);
    FAIL() << "tools accepted by a template without tool support";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tool support"), std::string::npos) << e.what();
  }
  std::vector<ChatMessage> turns = {{"user", "Hi"}, {"assistant", "", {{"c", "f", "{}"}}, ""}};
  EXPECT_THROW(smol->apply_chat_template(turns, true), Error);
  // Bad tools JSON is an error on a template that has tools.
  auto qwen = with_template("tokenizer_qwen2style_8k.json", k_qwen25);
  EXPECT_THROW(qwen->apply_chat_template({{"user", "Hi"}}, true, "[{"), Error);
  EXPECT_THROW(qwen->apply_chat_template({{"user", "Hi"}}, true, "{}"), Error);
}

}  // namespace
}  // namespace kvtier
