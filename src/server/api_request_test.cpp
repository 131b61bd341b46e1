#include "server/api_request.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

namespace kvtier::server {
namespace {

// The RequestError a body provokes (fails the test when it parses).
RequestError error_of(const std::string& body, Endpoint ep = Endpoint::completions) {
  try {
    parse_request(body, ep);
  } catch (const RequestError& e) {
    return e;
  }
  ADD_FAILURE() << "parsed without error: " << body;
  return RequestError(0, "");
}

TEST(ApiRequest, CompletionWithEveryField) {
  const ApiRequest r = parse_request(
      R"({"model": "m", "prompt": "Hello", "max_tokens": 12, "temperature": 0.5,
          "top_p": 0.9, "top_k": 40, "seed": 7, "stop": ["\n", "END"], "stream": true,
          "stream_options": {"include_usage": true}, "n": 1, "kv_policy": "yakv,budget=64",
          "user": "u", "presence_penalty": 0, "logprobs": null, "echo": false})",
      Endpoint::completions);
  EXPECT_EQ(r.model, "m");
  ASSERT_TRUE(r.prompt_text);
  EXPECT_EQ(*r.prompt_text, "Hello");
  EXPECT_EQ(r.max_tokens.value_or(-1), 12);
  EXPECT_FLOAT_EQ(r.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.top_p, 0.9f);
  EXPECT_EQ(r.top_k, 40);
  EXPECT_EQ(r.seed.value_or(0), 7u);
  ASSERT_EQ(r.stop.size(), 2u);
  EXPECT_EQ(r.stop[1], "END");
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.kv_policy.value_or(""), "yakv,budget=64");
}

TEST(ApiRequest, DefaultsAndNulls) {
  const ApiRequest r = parse_request(
      R"({"prompt": "x", "max_tokens": null, "stop": null, "seed": null, "temperature": null})",
      Endpoint::completions);
  EXPECT_FALSE(r.max_tokens);
  EXPECT_FALSE(r.seed);
  EXPECT_TRUE(r.stop.empty());
  EXPECT_FLOAT_EQ(r.temperature, 1.0f);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.kv_policy);
}

TEST(ApiRequest, PromptForms) {
  EXPECT_EQ(*parse_request(R"({"prompt": ["one"]})", Endpoint::completions).prompt_text, "one");
  const auto ids = parse_request(R"({"prompt": [1, 2, 3]})", Endpoint::completions).prompt_tokens;
  ASSERT_TRUE(ids);
  EXPECT_EQ(*ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(parse_request(R"({"prompt": [[5, 6]]})", Endpoint::completions).prompt_tokens->size(),
            2u);
  EXPECT_EQ(error_of(R"({"prompt": ["a", "b"]})").param(), "prompt");
  EXPECT_EQ(error_of(R"({"prompt": []})").param(), "prompt");
  EXPECT_EQ(error_of(R"({"prompt": [1, -2]})").param(), "prompt[1]");
  EXPECT_EQ(error_of(R"({"prompt": [1, "a"]})").param(), "prompt[1]");
  EXPECT_EQ(error_of(R"({"prompt": 5})").param(), "prompt");
  EXPECT_EQ(error_of(R"({"max_tokens": 5})").param(), "prompt");
}

TEST(ApiRequest, ChatMessages) {
  const ApiRequest r = parse_request(
      R"({"messages": [{"role": "developer", "content": "be brief"},
                       {"role": "user", "content": [{"type": "text", "text": "hi "},
                                                    {"type": "text", "text": "there"}]},
                       {"role": "assistant", "content": null}],
          "max_completion_tokens": 9, "kvtier": {"kv_policy": "full"}})",
      Endpoint::chat);
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "hi there");
  EXPECT_EQ(r.messages[2].content, "");
  EXPECT_EQ(r.max_tokens.value_or(0), 9);
  EXPECT_EQ(r.kv_policy.value_or(""), "full");

  EXPECT_EQ(error_of(R"({"messages": []})", Endpoint::chat).param(), "messages");
  EXPECT_EQ(error_of(R"({"messages": "hi"})", Endpoint::chat).param(), "messages");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user"}]})", Endpoint::chat).param(),
            "messages[0].content");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "function", "content": "x"}]})", Endpoint::chat).param(),
            "messages[0].role");
  EXPECT_EQ(error_of(R"({"messages": [{"role": 3, "content": "x"}]})", Endpoint::chat).param(),
            "messages[0].role");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
                     Endpoint::chat)
                .param(),
            "messages[0].content[0].type");
  EXPECT_EQ(error_of(R"({"messages": [7]})", Endpoint::chat).param(), "messages[0]");
}

TEST(ApiRequest, WrongTypesNameTheField) {
  EXPECT_EQ(error_of(R"({"prompt": "x", "max_tokens": "12"})").param(), "max_tokens");
  EXPECT_EQ(error_of(R"({"prompt": "x", "max_tokens": 1.5})").param(), "max_tokens");
  EXPECT_EQ(error_of(R"({"prompt": "x", "max_tokens": 0})").param(), "max_tokens");
  EXPECT_EQ(error_of(R"({"prompt": "x", "max_tokens": 1e30})").param(), "max_tokens");
  EXPECT_EQ(error_of(R"({"prompt": "x", "max_tokens": 99999999999999999999999})").param(),
            "max_tokens");
  EXPECT_EQ(error_of(R"({"prompt": "x", "temperature": "hot"})").param(), "temperature");
  EXPECT_EQ(error_of(R"({"prompt": "x", "temperature": 3})").param(), "temperature");
  EXPECT_EQ(error_of(R"({"prompt": "x", "top_p": 0})").param(), "top_p");
  EXPECT_EQ(error_of(R"({"prompt": "x", "stream": "yes"})").param(), "stream");
  EXPECT_EQ(error_of(R"({"prompt": "x", "stop": 5})").param(), "stop");
  EXPECT_EQ(error_of(R"({"prompt": "x", "stop": ["a", 5]})").param(), "stop[1]");
  EXPECT_EQ(error_of(R"({"prompt": "x", "stop": [""]})").param(), "stop[0]");
  EXPECT_EQ(error_of(R"({"prompt": "x", "seed": "s"})").param(), "seed");
  EXPECT_EQ(error_of(R"({"prompt": "x", "model": 1})").param(), "model");
  EXPECT_EQ(error_of(R"({"prompt": "x", "kv_policy": 1})").param(), "kv_policy");
  EXPECT_EQ(error_of(R"({"prompt": "x", "kv_policy": ""})").param(), "kv_policy");
  EXPECT_EQ(error_of(R"({"prompt": "x", "kvtier": "full"})").param(), "kvtier");
  EXPECT_EQ(error_of(R"({"prompt": "x", "kv_policy": "full", "kvtier": {"kv_policy": "yakv"}})")
                .param(),
            "kvtier.kv_policy");
  EXPECT_EQ(error_of(R"({"prompt": "x", "stream_options": {"include_usage": true}})").param(),
            "stream_options");
  const RequestError e = error_of(R"({"prompt": "x", "max_tokens": "12"})");
  EXPECT_EQ(e.status(), 400);
  EXPECT_EQ(e.type(), "invalid_request_error");
  EXPECT_NE(std::string(e.what()).find("integer"), std::string::npos) << e.what();
}

TEST(ApiRequest, UnsupportedFeaturesAreRefused) {
  EXPECT_EQ(error_of(R"({"prompt": "x", "n": 2})").param(), "n");
  EXPECT_EQ(error_of(R"({"prompt": "x", "best_of": 3})").param(), "best_of");
  EXPECT_EQ(error_of(R"({"prompt": "x", "frequency_penalty": 0.5})").param(), "frequency_penalty");
  EXPECT_EQ(error_of(R"({"prompt": "x", "logit_bias": {"5": 1}})").param(), "logit_bias");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{}]})",
                     Endpoint::chat)
                .param(),
            "tools");
  // Defaults are accepted.
  EXPECT_NO_THROW(parse_request(R"({"prompt": "x", "n": 1, "best_of": 1, "logprobs": 0,
                                    "logit_bias": {}, "frequency_penalty": 0})",
                                Endpoint::completions));
}

TEST(ApiRequest, ResponseFormats) {
  const char* msgs = R"("messages": [{"role": "user", "content": "x"}])";
  auto chat = [&](const std::string& rest) { return std::string("{") + msgs + ", " + rest + "}"; };
  EXPECT_EQ(parse_request(chat(R"("response_format": {"type": "text"})"), Endpoint::chat).response_format, "text");
  EXPECT_EQ(parse_request(chat(R"("response_format": {"type": "json_object"})"), Endpoint::chat).response_format,
            "json_object");
  const ApiRequest r = parse_request(
      chat(R"("response_format": {"type": "json_schema", "json_schema": {"name": "p", "strict": true,
           "schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}})"),
      Endpoint::chat);
  EXPECT_EQ(r.response_format, "json_schema");
  EXPECT_EQ(r.json_schema_name, "p");
  EXPECT_EQ(nlohmann::json::parse(r.json_schema)["required"][0], "a");
  // The schema keeps the client's key order (the order properties are generated in).
  const ApiRequest o = parse_request(
      chat(R"("response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object",
           "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "string"}}}}})"),
      Endpoint::chat);
  EXPECT_LT(o.json_schema.find("zeta"), o.json_schema.find("alpha")) << o.json_schema;
  EXPECT_LT(o.json_schema.find("type"), o.json_schema.find("properties")) << o.json_schema;
  // Completions take response_format too.
  EXPECT_EQ(parse_request(R"({"prompt": "x", "response_format": {"type": "json_object"}})", Endpoint::completions)
                .response_format,
            "json_object");
  const RequestError bad_kw = error_of(
      chat(R"("response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object",
           "properties": {"n": {"type": "number", "multipleOf": 2}}}}})"),
      Endpoint::chat);
  EXPECT_EQ(bad_kw.param(), "response_format.json_schema.schema");
  EXPECT_NE(std::string(bad_kw.what()).find("response_format.json_schema.schema.properties.n: keyword 'multipleOf'"),
            std::string::npos)
      << bad_kw.what();
  EXPECT_EQ(error_of(chat(R"("response_format": {"type": "xml"})"), Endpoint::chat).param(), "response_format.type");
  EXPECT_EQ(error_of(chat(R"("response_format": {"type": "json_schema"})"), Endpoint::chat).param(),
            "response_format.json_schema");
  EXPECT_EQ(error_of(chat(R"("response_format": {"type": "json_schema", "json_schema": {"name": "x"}})"),
                     Endpoint::chat)
                .param(),
            "response_format.json_schema.schema");
}

TEST(ApiRequest, ToolsAndToolChoice) {
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])";
  auto chat = [&](const std::string& rest) {
    return R"({"messages": [{"role": "user", "content": "x"}], )" + tools + (rest.empty() ? "" : ", " + rest) + "}";
  };
  EXPECT_EQ(parse_request(chat(""), Endpoint::chat).tool_choice, "auto");
  const std::string t = parse_request(chat(""), Endpoint::chat).tools;
  EXPECT_LT(t.find("\"type\""), t.find("\"function\"")) << "tools keep the client's key order: " << t;
  EXPECT_EQ(parse_request(chat(R"("tool_choice": "required")"), Endpoint::chat).tool_choice, "required");
  EXPECT_EQ(parse_request(chat(R"("tool_choice": {"type": "function", "function": {"name": "get_weather"}})"),
                          Endpoint::chat)
                .tool_choice,
            "get_weather");
  EXPECT_EQ(error_of(chat(R"("tool_choice": {"type": "function", "function": {"name": "nope"}})"), Endpoint::chat)
                .param(),
            "tool_choice.function.name");
  EXPECT_EQ(error_of(chat(R"("tool_choice": "sometimes")"), Endpoint::chat).param(), "tool_choice");
  EXPECT_EQ(error_of(chat(R"("tool_choice": "required", "response_format": {"type": "json_object"})"),
                     Endpoint::chat)
                .param(),
            "tool_choice");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})", Endpoint::chat)
                .param(),
            "tool_choice");
  EXPECT_EQ(error_of(R"({"prompt": "x", "tools": [{"type": "function", "function": {"name": "f"}}]})").param(),
            "tools");
  // A conversation with a call and its result.
  const ApiRequest r = parse_request(
      R"({"messages": [{"role": "user", "content": "Weather?"},
          {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
           "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
          {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}], )" + tools + "}",
      Endpoint::chat);
  ASSERT_EQ(r.messages.size(), 3u);
  ASSERT_EQ(r.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.messages[1].tool_calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(r.messages[2].role, "tool");
  EXPECT_EQ(r.messages[2].tool_call_id, "call_1");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "tool", "content": "x"}]})", Endpoint::chat).param(),
            "messages[0].tool_call_id");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "function",
                "function": {"name": "f", "arguments": "not json"}}]}]})",
                     Endpoint::chat)
                .param(),
            "messages[0].tool_calls[0].function.arguments");
}

TEST(ApiRequest, MalformedBodies) {
  for (const char* body : {"", "{", "[]", "null", "42", "\"s\"", "{\"prompt\": \"x\",}",
                           "{\"prompt\": \"\xff\xfe\"}", "{\"prompt\": \"x\"} trailing"}) {
    const RequestError e = error_of(body);
    EXPECT_EQ(e.status(), 400) << body;
    EXPECT_FALSE(std::string(e.what()).empty());
  }
  // Deep nesting parses (nlohmann's parser keeps its own stack) and is refused.
  std::string deep(100000, '[');
  deep = "{\"prompt\": " + deep + std::string(100000, ']') + "}";
  EXPECT_EQ(error_of(deep).status(), 400);
}

TEST(ApiRequest, LogprobsAndEcho) {
  const ApiRequest c = parse_request(R"({"prompt": "x", "logprobs": 3, "echo": true, "max_tokens": 0})",
                                     Endpoint::completions);
  EXPECT_EQ(c.logprobs, 3);
  EXPECT_TRUE(c.echo);
  EXPECT_EQ(*c.max_tokens, 0);
  // max_tokens 0 needs echo; the count is bounded; chat uses top_logprobs.
  EXPECT_EQ(error_of(R"({"prompt": "x", "max_tokens": 0})").param(), "max_tokens");
  EXPECT_EQ(error_of(R"({"prompt": "x", "logprobs": 21})").param(), "logprobs");
  EXPECT_EQ(error_of(R"({"prompt": "x", "top_logprobs": 2})").param(), "top_logprobs");
  const char* chat = R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 5})";
  EXPECT_EQ(parse_request(chat, Endpoint::chat).logprobs, 5);
  EXPECT_EQ(parse_request(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true})", Endpoint::chat)
                .logprobs,
            0);
  EXPECT_EQ(parse_request(R"({"messages": [{"role": "user", "content": "x"}]})", Endpoint::chat).logprobs, -1);
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", Endpoint::chat)
                .param(),
            "top_logprobs");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "echo": true})", Endpoint::chat).param(),
            "echo");
}

}  // namespace
}  // namespace kvtier::server
