// Tool calls on the Qwen2.5-style and Llama 3.1-style tokenizer fixtures:
// the constraint accepts exactly a call of the allowed tool(s) with valid
// arguments, random walks through its masks give calls that parse back and
// validate, and generated text is read back into OpenAI-style calls.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>

#include "grammar/json_schema.h"
#include "grammar/tool_calls.h"

namespace kvtier {
namespace {

using json = nlohmann::json;

const std::string k_golden = std::string(KVT_SOURCE_DIR) + "/tests/golden/";

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const Tokenizer& fixture(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& t = cache[name];
  if (!t) t = Tokenizer::from_hf_text(read(k_golden + name), "");
  return *t;
}

const char* const k_tools = R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
   "parameters": {"type": "object", "properties": {"city": {"type": "string", "minLength": 1},
   "unit": {"enum": ["c", "f"]}}, "required": ["city"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
   "properties": {"xs": {"type": "array", "items": {"$ref": "#/$defs/N"}, "maxItems": 3}},
   "required": ["xs"], "additionalProperties": false, "$defs": {"N": {"type": "integer"}}}}},
  {"type": "function", "function": {"name": "ping"}}
])";

struct Case {
  const char* tokenizer;
  ToolFormat format;
};
const Case k_cases[] = {{"tokenizer_qwen2style_8k.json", ToolFormat::hermes},
                        {"tokenizer_llama3style_8k.json", ToolFormat::llama31_json}};

bool completes(const ConstraintFactory& f, const Tokenizer& tok, const std::string& text) {
  auto c = f.make();
  std::vector<uint8_t> mask;
  for (int32_t id : tok.encode(text, false, false)) {
    c->allowed(mask);
    if (!mask[size_t(id)]) return false;
    c->accept(id);
  }
  return c->complete();
}

TEST(ToolCalls, ConstraintAcceptsExactlyCallsOfTheAllowedTools) {
  const auto specs = parse_tool_specs(k_tools);
  ASSERT_EQ(specs.size(), 3u);
  for (const Case& cs : k_cases) {
    const Tokenizer& tok = fixture(cs.tokenizer);
    auto vocab = GrammarVocab::build(tok, tok.n_vocab(), {});
    auto any = tool_call_constraint(*vocab, cs.format, specs);
    auto add_only = tool_call_constraint(*vocab, cs.format, specs, "add");
    const std::string weather = format_tool_call(cs.format, "get_weather", R"({"city": "Paris", "unit": "c"})");
    const std::string add = format_tool_call(cs.format, "add", R"({"xs": [1, -2, 3]})");
    const std::string ping = format_tool_call(cs.format, "ping", "{}");
    EXPECT_TRUE(completes(*any, tok, weather)) << weather;
    EXPECT_TRUE(completes(*any, tok, add)) << add;
    EXPECT_TRUE(completes(*any, tok, ping)) << ping;
    EXPECT_FALSE(completes(*add_only, tok, weather)) << "a tool other than the named one";
    EXPECT_TRUE(completes(*add_only, tok, add));
    for (const char* bad_args : {R"({"city": ""})", R"({"unit": "c"})", R"({"city": "P", "x": 1})",
                                 R"({"city": 3})"})
      EXPECT_FALSE(completes(*any, tok, format_tool_call(cs.format, "get_weather", bad_args))) << bad_args;
    EXPECT_FALSE(completes(*any, tok, format_tool_call(cs.format, "add", R"({"xs": [1, 2, 3, 4]})")));
    EXPECT_FALSE(completes(*any, tok, format_tool_call(cs.format, "nope", "{}")));
    EXPECT_FALSE(completes(*any, tok, "Sure! " + weather));
  }
}

TEST(ToolCalls, RandomWalksGiveCallsThatParseAndValidate) {
  const auto specs = parse_tool_specs(k_tools);
  std::map<std::string, json> schema_of;
  for (const ToolSpec& s : specs) schema_of[s.name] = json::parse(s.parameters);
  std::mt19937_64 rng(3);
  for (const Case& cs : k_cases) {
    const Tokenizer& tok = fixture(cs.tokenizer);
    auto vocab = GrammarVocab::build(tok, tok.n_vocab(), {});
    auto f = tool_call_constraint(*vocab, cs.format, specs);
    std::set<std::string> names_seen;
    int n_finished = 0;
    for (int walk = 0; walk < 24; ++walk) {
      auto c = f->make();
      std::vector<uint8_t> mask;
      std::string out;
      for (int step = 0; step < 400 && !c->must_end(); ++step) {
        c->allowed(mask);
        std::vector<int32_t> all, preferred;
        for (int32_t id = 0; id < int32_t(mask.size()); ++id) {
          if (!mask[size_t(id)] || tok.is_eog(id)) continue;
          all.push_back(id);
          if (tok.token_to_piece(id).find_first_of("\"}],") != std::string::npos) preferred.push_back(id);
        }
        ASSERT_FALSE(all.empty()) << out;
        const auto& from = (!preferred.empty() && rng() % 3 != 0) ? preferred : all;
        const int32_t id = from[rng() % from.size()];
        c->accept(id);
        out += tok.token_to_piece(id);
      }
      if (!c->must_end()) continue;
      ++n_finished;
      const ParsedToolCalls parsed = parse_tool_calls(cs.format, out);
      ASSERT_EQ(parsed.calls.size(), 1u) << out;
      EXPECT_EQ(parsed.content, "") << out;
      const ToolCall& call = parsed.calls[0];
      ASSERT_TRUE(schema_of.count(call.name)) << out;
      names_seen.insert(call.name);
      EXPECT_EQ(validate_json(schema_of[call.name], json::parse(call.arguments)), "") << out;
    }
    EXPECT_GE(n_finished, 12);
    EXPECT_GE(names_seen.size(), 2u) << "the walks should reach more than one tool";
  }
}

TEST(ToolCalls, ParsesCallsOutOfText) {
  auto h = parse_tool_calls(ToolFormat::hermes,
                            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                            "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"ping\", \"arguments\": \"{}\"}\n"
                            "</tool_call>");
  EXPECT_EQ(h.content, "Let me check.");
  ASSERT_EQ(h.calls.size(), 2u);
  EXPECT_EQ(h.calls[0].name, "get_weather");
  EXPECT_EQ(h.calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(h.calls[0].id, "call_0");
  EXPECT_EQ(h.calls[1].name, "ping");
  EXPECT_EQ(h.calls[1].arguments, "{}");
  EXPECT_EQ(h.calls[1].id, "call_1");
  // Broken calls stay text.
  auto bad = parse_tool_calls(ToolFormat::hermes, "<tool_call>\n{\"name\": 3}\n</tool_call> and <tool_call>{");
  EXPECT_TRUE(bad.calls.empty());
  EXPECT_EQ(bad.content, "<tool_call>\n{\"name\": 3}\n</tool_call> and <tool_call>{");
  auto l = parse_tool_calls(ToolFormat::llama31_json, " {\"name\": \"add\", \"parameters\": {\"xs\": [1]}}\n");
  ASSERT_EQ(l.calls.size(), 1u);
  EXPECT_EQ(l.calls[0].arguments, R"({"xs":[1]})");
  EXPECT_EQ(l.content, "");
  auto plain = parse_tool_calls(ToolFormat::llama31_json, "It is sunny.");
  EXPECT_TRUE(plain.calls.empty());
  EXPECT_EQ(plain.content, "It is sunny.");
}

TEST(ToolCalls, BadToolListsAndChoicesGiveClearErrors) {
  auto message = [](const std::string& tools) -> std::string {
    try {
      parse_tool_specs(tools);
    } catch (const GrammarError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message("[]").find("tools: expected a non-empty array"), std::string::npos);
  EXPECT_NE(message(R"([{"type": "retrieval"}])").find("tools[0].type: expected \"function\""), std::string::npos);
  EXPECT_NE(message(R"([{"type": "function", "function": {"name": "a b"}}])").find("tools[0].function.name"),
            std::string::npos);
  EXPECT_NE(message(R"([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function":
      {"name": "f"}}])").find("tools[1].function.name: 'f' is listed twice"), std::string::npos);
  EXPECT_NE(message(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
      "properties": {"n": {"type": "integer", "multipleOf": 2}}}}}])")
                .find("tools[0].function.parameters.properties.n: keyword 'multipleOf'"),
            std::string::npos);
  const auto specs = parse_tool_specs(k_tools);
  const Tokenizer& tok = fixture("tokenizer_qwen2style_8k.json");
  auto vocab = GrammarVocab::build(tok, tok.n_vocab(), {});
  EXPECT_THROW(tool_call_constraint(*vocab, ToolFormat::hermes, specs, "missing"), GrammarError);
  EXPECT_THROW(tool_call_constraint(*vocab, ToolFormat::none, specs), GrammarError);
}

}  // namespace
}  // namespace kvtier
