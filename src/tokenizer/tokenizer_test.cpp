// Tokenizer behaviour beyond the goldens: special-token parsing, decoding,
// chat templates, malformed tokenizer.json, speed.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/status.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

namespace kvtier {
namespace {

const std::string k_golden = std::string(KVT_SOURCE_DIR) + "/tests/golden/";

std::string read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const Tokenizer& smollm2() {
  static const auto tok =
      Tokenizer::from_hf(k_golden + "tokenizer_smollm2.json", k_golden + "tokenizer_config_smollm2.json");
  return *tok;
}

TEST(Tokenizer, SpecialTokensParsedOnlyWhenAsked) {
  const Tokenizer& tok = smollm2();
  const auto on = tok.encode("<|im_start|>user\nHi<|im_end|>", false, true);
  ASSERT_GE(on.size(), 3u);
  EXPECT_EQ(on.front(), 1);  // <|im_start|>
  EXPECT_EQ(on.back(), 2);   // <|im_end|>
  const auto off = tok.encode("<|im_start|>user\nHi<|im_end|>", false, false);
  for (int32_t id : off) EXPECT_FALSE(tok.is_special(id)) << id;
  EXPECT_GT(off.size(), on.size());
  EXPECT_EQ(tok.decode(off), tok.decode(on));
}

TEST(Tokenizer, BosAndDecodeOptions) {
  const Tokenizer& tok = smollm2();
  const auto ids = tok.encode("Hi", /*add_bos=*/true, false);
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids[0], tok.bos_id());
  EXPECT_EQ(tok.decode(ids), "<|im_start|>Hi");
  EXPECT_EQ(tok.decode(ids, /*skip_special=*/true), "Hi");
  EXPECT_EQ(tok.token_to_piece(216), " ");
  EXPECT_THROW(tok.token_to_piece(-1), Error);
  EXPECT_THROW(tok.decode({tok.n_vocab()}), Error);
}

TEST(Tokenizer, PiecesAreRawBytesEvenWhenNotUtf8) {
  const Tokenizer& tok = smollm2();
  // A CJK character outside the merges comes out as single-byte tokens whose
  // pieces are partial UTF-8; concatenated they give the character back.
  const std::string text = "\xF0\x9D\x84\x9E";  // U+1D11E, four bytes
  const auto ids = tok.encode(text, false, false);
  std::string joined;
  for (int32_t id : ids) joined += tok.token_to_piece(id);
  EXPECT_EQ(joined, text);
  // A byte without a token (0x04 in SmolLM2) yields nothing, as in both peers.
  EXPECT_EQ(tok.decode(tok.encode("a\x04" "b", false, false)), "ab");
  // Invalid UTF-8 is replaced (U+FFFD per bad byte), as llama.cpp does.
  EXPECT_EQ(tok.decode(tok.encode("a\xFF" "b", false, false)), "a\xEF\xBF\xBD" "b");
}

TEST(Tokenizer, RoundTripsArbitraryText) {
  const Tokenizer& tok = smollm2();
  std::string text;
  for (int i = 0; i < 2000; ++i) {
    uint32_t cp = uint32_t((i * 2654435761u) % 0x2FFFF);
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
    if (cp < 0x20) cp = 'y';  // SmolLM2 has no token for some control bytes (0x04, 0x06...)
    byte_level::append_utf8(text, cp);
    if (i % 7 == 0) text += "  \n\t";
  }
  EXPECT_EQ(tok.decode(tok.encode(text, false, false)), text);
  EXPECT_EQ(tok.decode(tok.encode(text, false, true)), text);
}

// --- chat templates (expected strings written by hand from the template texts)

TEST(ChatTemplate, SmolLM2InsertsItsDefaultSystemMessage) {
  const Tokenizer& tok = smollm2();
  ASSERT_EQ(tok.chat_template(), ChatTemplate::chatml);
  EXPECT_EQ(tok.apply_chat_template({{"user", "Hi"}}, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(tok.apply_chat_template({{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}}, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n");
  // The rendered text tokenizes with its markers as special tokens.
  const auto ids = tok.encode(tok.apply_chat_template({{"user", "Hi"}}, true), false, true);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 3);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 2);
}

std::unique_ptr<Tokenizer> with_template(const std::string& tokenizer_json, const std::string& tpl) {
  const nlohmann::json config = {{"chat_template", tpl}};
  return Tokenizer::from_hf_text(read(k_golden + tokenizer_json), config.dump());
}

// Qwen2.5's template, abridged to its no-tools branches; inside the JSON
// config the newlines in its string literals are the two characters \n.
const char* const k_qwen25_template =
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n"
    "{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{%- for message in messages %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n";

TEST(ChatTemplate, Qwen25DefaultSystemMessage) {
  auto tok = with_template("tokenizer_qwen2style_8k.json", k_qwen25_template);
  ASSERT_EQ(tok->chat_template(), ChatTemplate::chatml);
  EXPECT_EQ(tok->apply_chat_template({{"user", "2+2?"}}, true),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(tok->apply_chat_template({{"system", "S"}, {"user", "U"}}, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n");
}

TEST(ChatTemplate, PlainChatMLHasNoDefaultSystem) {
  auto tok = with_template("tokenizer_qwen2style_8k.json",
                           "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
                           "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt "
                           "%}{{ '<|im_start|>assistant\n' }}{% endif %}");
  EXPECT_EQ(tok->apply_chat_template({{"user", "Hi"}}, true),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

// Llama 3 (3.0) Instruct's template.
const char* const k_llama3_template =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}";

TEST(ChatTemplate, Llama3) {
  auto tok = with_template("tokenizer_llama3style_8k.json", k_llama3_template);
  ASSERT_EQ(tok->chat_template(), ChatTemplate::llama3);
  const std::string text = tok->apply_chat_template({{"system", "Be brief."}, {"user", "  Hi \n"}}, true);
  EXPECT_EQ(text,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  const auto ids = tok->encode(text, false, true);
  EXPECT_EQ(ids.front(), 8000);  // <|begin_of_text|>
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 8004), 2);  // <|eot_id|>
  EXPECT_TRUE(tok->is_eog(8004));
  EXPECT_TRUE(tok->is_eog(8001));  // <|end_of_text|>
  EXPECT_EQ(tok->decode(ids), text);
}

TEST(ChatTemplate, Llama31SystemHeader) {
  auto tok = with_template("tokenizer_llama3style_8k.json",
                           "{{- bos_token }}\n{%- if not date_string is defined %}\n    {%- set date_string = "
                           "\"26 Jul 2024\" %}\n{%- endif %}\n{{- \"<|start_header_id|>system<|end_header_id|>"
                           "\\n\\n\" }}\n{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n{{- \"Today Date: \" "
                           "+ date_string + \"\\n\\n\" }}");
  EXPECT_EQ(tok->apply_chat_template({{"user", "Hi"}}, true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, NoneIsAnError) {
  // A vocabulary without ChatML or Llama 3 markers and no template.
  nlohmann::json j = nlohmann::json::parse(read(k_golden + "tokenizer_qwen2style_8k.json"));
  j["added_tokens"] = nlohmann::json::array();
  auto tok = Tokenizer::from_hf_text(j.dump(), "");
  EXPECT_EQ(tok->chat_template(), ChatTemplate::none);
  EXPECT_THROW(tok->apply_chat_template({{"user", "Hi"}}, true), Error);
}

// --- malformed tokenizer.json

// A small valid tokenizer.json: the 256 byte symbols, two merges.
nlohmann::json tiny() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level::encode(std::string(1, char(b)))] = b;
  vocab["he"] = 256;
  vocab["hel"] = 257;
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"h e", {"he", "l"}}}}},
          {"added_tokens", {{{"id", 258}, {"content", "<|eot|>"}, {"special", true}}}},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"decoder", {{"type", "ByteLevel"}}}};
}

void expect_error(const std::string& json_text, const std::string& needle, const std::string& config = "") {
  try {
    Tokenizer::from_hf_text(json_text, config);
    ADD_FAILURE() << "no error; wanted one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}

void expect_error(const std::function<void(nlohmann::json&)>& edit, const std::string& needle) {
  nlohmann::json j = tiny();
  edit(j);
  expect_error(j.dump(), needle);
}

TEST(TokenizerJson, TinyIsValid) {
  auto tok = Tokenizer::from_hf_text(tiny().dump(), "");
  EXPECT_EQ(tok->encode("hello<|eot|>", false, true), (std::vector<int32_t>{257, 'l', 'o', 258}));
  EXPECT_EQ(tok->eos_id(), -1);
  EXPECT_TRUE(tok->is_special(258));
}

TEST(TokenizerJson, MalformedInputsGiveClearErrors) {
  expect_error("", "not valid JSON");
  expect_error("{\"model\": ", "not valid JSON");
  expect_error("[]", "top level");
  expect_error("{}", "missing \"model\"");
  expect_error(std::string(100, '[') + std::string(100, ']'), "nested deeper");
  expect_error([](auto& j) { j.erase("model"); }, "missing \"model\"");
  expect_error([](auto& j) { j["model"]["type"] = "Unigram"; }, "\"Unigram\" is not supported");
  expect_error([](auto& j) { j["model"]["type"] = 3; }, "model.type: expected a string");
  expect_error([](auto& j) { j["model"]["vocab"] = nlohmann::json::array(); }, "model.vocab: expected an object");
  expect_error([](auto& j) { j["model"]["vocab"]["he"] = "x"; }, "vocab[\"he\"]: expected an integer id");
  expect_error([](auto& j) { j["model"]["vocab"]["he"] = -5; }, "id -5 outside");
  expect_error([](auto& j) { j["model"]["vocab"]["zz"] = 1000; }, "ids reach 1000 but there are only 260 tokens");
  expect_error(
      [](auto& j) {
        j["model"]["vocab"]["<|eot|>"] = 258;  // the added token, also in the vocabulary
        j["model"]["vocab"]["zz"] = 260;
      },
      "no token has id 259");
  expect_error([](auto& j) { j["model"]["vocab"]["dup"] = 256; }, "id 256 is given to both");
  expect_error([](auto& j) { j["model"].erase("merges"); }, "model.merges: expected an array");
  expect_error([](auto& j) { j["model"]["merges"] = {"hel"}; }, "merges[0] = \"hel\"");
  expect_error([](auto& j) { j["model"]["merges"] = {"h e l"}; }, "merges[0] = \"h e l\"");
  expect_error([](auto& j) { j["model"]["merges"] = {{1, 2}}; }, "merges[0]: expected");
  expect_error([](auto& j) { j["model"]["merges"] = {"q xyz"}; }, "missing from the vocabulary ('xyz')");
  expect_error([](auto& j) { j["model"]["dropout"] = 0.1; }, "dropout");
  expect_error([](auto& j) { j["model"]["vocab"].erase("a"); }, "ids reach 258 but there are only 258 tokens");
  expect_error([](auto& j) { j["added_tokens"][0]["id"] = "x"; }, "added_tokens[0].id: expected an integer");
  expect_error([](auto& j) { j["added_tokens"][0]["id"] = 5; }, "added token '<|eot|>' has id 5");
  expect_error([](auto& j) { j["added_tokens"][0].erase("content"); }, "added_tokens[0]: missing \"content\"");
  expect_error([](auto& j) { j["added_tokens"][0]["special"] = "yes"; }, "special: expected true or false");
  expect_error([](auto& j) { j.erase("pre_tokenizer"); }, "missing pre_tokenizer");
  expect_error([](auto& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }, "\"Whitespace\" is not supported");
  expect_error([](auto& j) { j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", nlohmann::json::array()}}; },
               "no ByteLevel");
  expect_error(
      [](auto& j) {
        j["pre_tokenizer"] = {{"type", "Sequence"},
                              {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", "(ab"}}}},
                                                 {{"type", "ByteLevel"}}}}};
      },
      "invalid regex '(ab'");
  expect_error(
      [](auto& j) {
        j["pre_tokenizer"] = {{"type", "Sequence"},
                              {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Removed"}},
                                                 {{"type", "ByteLevel"}}}}};
      },
      "\"Removed\" is not supported");
  expect_error([](auto& j) { j["normalizer"] = {{"type", "Lowercase"}}; }, "normalizer \"Lowercase\"");
  expect_error([](auto& j) { j["decoder"] = {{"type", "WordPiece"}}; }, "decoder \"WordPiece\"");
  expect_error(tiny().dump(), "bos_token '<nope>' is not in the vocabulary", R"({"bos_token": "<nope>"})");
  expect_error(tiny().dump(), "add_bos_token: expected true or false", R"({"add_bos_token": 1})");
  expect_error(tiny().dump(), "tokenizer_config.json: not valid JSON", "{");
}

TEST(TokenizerJson, MissingFileIsAnError) {
  EXPECT_THROW(Tokenizer::from_hf("/nonexistent/tokenizer.json", ""), Error);
}

// --- speed

TEST(TokenizerSpeed, Encodes64KTokensWellUnderASecond) {
  // A fresh tokenizer (cold piece cache) on ~64K tokens of mixed text.
  auto tok = Tokenizer::from_hf(k_golden + "tokenizer_smollm2.json", "");
  const nlohmann::json cases = nlohmann::json::parse(read(k_golden + "tokenizer_hf_smollm2.json")).at("cases");
  std::string text;
  int round = 0;
  while (text.size() < 300000) {
    for (const auto& c : cases) {
      const std::string t = c.at("text").get<std::string>();
      if (t.find('\x04') != std::string::npos) continue;  // a byte with no token: not lossless
      text += t + " " + std::to_string(round * 7919) + "\n";
    }
    ++round;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok->encode(text, false, true);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("encoded %zu bytes -> %zu tokens in %.3f s (%.0f tokens/s)\n", text.size(), ids.size(), s,
              double(ids.size()) / s);
  EXPECT_GE(ids.size(), 64000u);
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__)
  EXPECT_LT(s, 1.0);
#endif
  EXPECT_TRUE(tok->decode(ids) == text);
}

TEST(TokenizerSpeed, Encodes64KTokensOfUniqueWords) {
  // Random letter strings: almost every piece misses the cache, so this
  // times the BPE merging itself.
  auto tok = Tokenizer::from_hf(k_golden + "tokenizer_smollm2.json", "");
  std::string text;
  uint64_t state = 12345;
  while (text.size() < 200000) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const int len = 3 + int((state >> 60) % 9);
    text += ' ';
    for (int i = 0; i < len; ++i) text += char('a' + (state >> (5 * i + 3)) % 26);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok->encode(text, false, false);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("encoded %zu bytes of random words -> %zu tokens in %.3f s (%.0f tokens/s)\n", text.size(),
              ids.size(), s, double(ids.size()) / s);
  EXPECT_GE(ids.size(), 64000u);
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__)
  EXPECT_LT(s, 1.0);
#endif
  EXPECT_TRUE(tok->decode(ids) == text);
}

}  // namespace
}  // namespace kvtier
