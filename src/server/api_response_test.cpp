#include "server/api_response.h"

#include <gtest/gtest.h>

namespace kvtier::server {
namespace {

using nlohmann::json;

GenerationResult sample_result() {
  GenerationResult r;
  r.tokens = {11, 12, 13};
  r.text = "abc";
  r.finish_reason = "length";
  r.n_prompt_tokens = 5;
  r.kv_policy = "yakv,budget=0.03125";
  r.kv_memory.gpu_bytes_per_token = 96;
  r.kv_memory.host_bytes_per_token = 1280;
  r.kv_memory.gpu_bytes = 768;
  r.kv_memory.host_bytes = 10240;
  r.prefill_seconds = 0.25;
  r.decode_seconds = 0.5;
  return r;
}

TEST(ApiResponse, SseFraming) {
  EXPECT_EQ(sse_event(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
  EXPECT_EQ(sse_comment("keep-alive"), ": keep-alive\n\n");
  // A line break would end the comment and start a field.
  EXPECT_EQ(sse_comment("a\nb\rc"), ": a b c\n\n");
  // Model text with line breaks stays inside one data line (JSON escapes them).
  const std::string ev = sse_event(json{{"text", "x\n\ny"}});
  EXPECT_EQ(ev.find('\n'), ev.size() - 2);
}

TEST(ApiResponse, InvalidUtf8IsReplacedNotThrown) {
  const std::string bad = std::string("ok") + char(0xE2) + char(0x82);  // cut "€"
  std::string out;
  ASSERT_NO_THROW(out = dump_json(json{{"t", bad}}));
  EXPECT_EQ(json::parse(out)["t"], "ok\xEF\xBF\xBD");
}

TEST(ApiResponse, CompletionAndChatBodies) {
  const GenerationResult r = sample_result();
  json c = completion_json({Endpoint::completions, "cmpl-1", 100, "m"}, r);
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], "abc");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(c["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(c["usage"]["completion_tokens"], 3);
  EXPECT_EQ(c["usage"]["total_tokens"], 8);
  EXPECT_EQ(c["kvtier"]["kv_policy"], "yakv,budget=0.03125");
  EXPECT_EQ(c["kvtier"]["gpu_bytes"], 768);
  EXPECT_EQ(c["kvtier"]["host_bytes_per_token"], 1280.0);

  json ch = completion_json({Endpoint::chat, "chatcmpl-1", 100, "m"}, r);
  EXPECT_EQ(ch["object"], "chat.completion");
  EXPECT_EQ(ch["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(ch["choices"][0]["message"]["content"], "abc");
  EXPECT_EQ(ch["id"], "chatcmpl-1");
}

TEST(ApiResponse, StreamChunks) {
  const ResponseMeta chat{Endpoint::chat, "chatcmpl-2", 7, "m"};
  json first = stream_chunk_json(chat, "He", true, std::nullopt, false);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "He");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(first.contains("usage"));
  json next = stream_chunk_json(chat, "llo", false, std::nullopt, true);
  EXPECT_FALSE(next["choices"][0]["delta"].contains("role"));
  EXPECT_TRUE(next["usage"].is_null());
  json last = stream_chunk_json(chat, "", false, "stop", false);
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");

  const ResponseMeta text{Endpoint::completions, "cmpl-2", 7, "m"};
  json t = stream_chunk_json(text, "tok", false, std::nullopt, false);
  EXPECT_EQ(t["object"], "text_completion");
  EXPECT_EQ(t["choices"][0]["text"], "tok");

  json u = usage_chunk_json(chat, sample_result());
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["total_tokens"], 8);
  EXPECT_EQ(u["kvtier"]["host_bytes"], 10240);
}

TEST(ApiResponse, ErrorBodies) {
  json e = error_json(RequestError(400, "'n' must be 1", "n"));
  EXPECT_EQ(e["error"]["message"], "'n' must be 1");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["param"], "n");
  EXPECT_TRUE(e["error"]["code"].is_null());
  json q = error_json("busy", "server_error", "", "queue_full");
  EXPECT_TRUE(q["error"]["param"].is_null());
  EXPECT_EQ(q["error"]["code"], "queue_full");
  EXPECT_EQ(openai_finish_reason("stop"), "stop");
  EXPECT_EQ(openai_finish_reason("length"), "length");
}

}  // namespace
}  // namespace kvtier::server
