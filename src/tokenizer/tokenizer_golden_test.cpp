// Token ids equal to the peers' on the tricky strings of
// scripts/tokenizer_cases.py: llama.cpp on the default GGUF, HF tokenizers on
// the tokenizer.json fixtures. Goldens: tests/golden/tokenizer_*.json, written
// by scripts/gen_tokenizer_golden.py.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/status.h"
#include "loader/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_spec.h"

namespace kvtier {
namespace {

const std::string k_golden = std::string(KVT_SOURCE_DIR) + "/tests/golden/";
const std::string k_model = std::string(KVT_SOURCE_DIR) + "/models/cache/SmolLM2-135M-Instruct.Q4_1.gguf";

nlohmann::json load_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << "missing golden " << path;
  return nlohmann::json::parse(f);
}

std::string ids_str(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s + "]";
}

// Checks every case of a golden file; returns the number of cases checked.
size_t check_golden(const Tokenizer& tok, const nlohmann::json& golden) {
  size_t n = 0;
  for (const auto& c : golden.at("cases")) {
    const std::string text = c.at("text").get<std::string>();
    const auto want = c.at("ids").get<std::vector<int32_t>>();
    const auto want_plain = c.at("ids_no_special").get<std::vector<int32_t>>();
    const auto got = tok.encode(text, /*add_bos=*/false, /*parse_special=*/true);
    const auto got_plain = tok.encode(text, false, false);
    EXPECT_EQ(got, want) << "special on, text " << nlohmann::json(text).dump() << "\n got  " << ids_str(got)
                         << "\n want " << ids_str(want);
    EXPECT_EQ(got_plain, want_plain) << "special off, text " << nlohmann::json(text).dump() << "\n got  "
                                     << ids_str(got_plain) << "\n want " << ids_str(want_plain);
    // Lossless: the pieces concatenate back to the input either way — except
    // for bytes the vocabulary has no token for, which the peers drop too.
    const bool has_tokenless_byte = text.find_first_of(std::string("\x04\x06\x1d", 3)) != std::string::npos;
    if (!has_tokenless_byte) {
      EXPECT_EQ(tok.decode(got), text);
      EXPECT_EQ(tok.decode(got_plain), text);
    }
    ++n;
  }
  return n;
}

std::unique_ptr<Tokenizer> load_hf(const std::string& name, const std::string& config = "") {
  return Tokenizer::from_hf(k_golden + name, config.empty() ? "" : k_golden + config);
}

TEST(TokenizerGolden, HfSmolLM2FullVocab) {
  auto tok = load_hf("tokenizer_smollm2.json", "tokenizer_config_smollm2.json");
  EXPECT_GE(check_golden(*tok, load_json(k_golden + "tokenizer_hf_smollm2.json")), 50u);
}

TEST(TokenizerGolden, HfLlama3StylePreTokenizer) {
  auto tok = load_hf("tokenizer_llama3style_8k.json");
  EXPECT_GE(check_golden(*tok, load_json(k_golden + "tokenizer_hf_llama3style.json")), 50u);
  // Its post-processor puts <|begin_of_text|> first: that is the BOS default.
  EXPECT_TRUE(tok->add_bos_default());
  EXPECT_EQ(tok->bos_id(), 8000);
  EXPECT_EQ(tok->chat_template(), ChatTemplate::llama3);
}

TEST(TokenizerGolden, HfQwen2StylePreTokenizer) {
  auto tok = load_hf("tokenizer_qwen2style_8k.json");
  EXPECT_GE(check_golden(*tok, load_json(k_golden + "tokenizer_hf_qwen2style.json")), 50u);
  EXPECT_FALSE(tok->add_bos_default());
  EXPECT_EQ(tok->chat_template(), ChatTemplate::chatml);
}

TEST(TokenizerGolden, LlamaCppSmolLM2Gguf) {
  if (!std::filesystem::exists(k_model)) GTEST_SKIP() << "default model absent: " << k_model;
  auto gguf = GgufFile::open(k_model);
  auto tok = Tokenizer::from_gguf(*gguf);
  EXPECT_GE(check_golden(*tok, load_json(k_golden + "tokenizer_smollm2_llamacpp.json")), 50u);
  EXPECT_EQ(tok->n_vocab(), 49152);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_FALSE(tok->add_bos_default());
  EXPECT_TRUE(tok->is_eog(2));  // <|im_end|>
  EXPECT_TRUE(tok->is_eog(0));  // <|endoftext|>
  EXPECT_FALSE(tok->is_eog(1));
  EXPECT_TRUE(tok->is_special(1));
  EXPECT_FALSE(tok->is_special(100));
  EXPECT_EQ(tok->chat_template(), ChatTemplate::chatml);
}

// Other families' pre-tokenizers (llama.cpp's regexes, Llama 3's
// ignore_merges) over the same vocabulary, against llama.cpp run on a copy of
// the GGUF with tokenizer.ggml.pre replaced.
TEST(TokenizerGolden, LlamaCppOtherPreTokenizers) {
  if (!std::filesystem::exists(k_model)) GTEST_SKIP() << "default model absent: " << k_model;
  auto gguf = GgufFile::open(k_model);
  for (const char* pre : {"gpt-2", "llama-bpe", "qwen2"}) {
    SCOPED_TRACE(pre);
    auto tok = tokenizer_from_gguf(*gguf, pre);
    EXPECT_GE(check_golden(*tok, load_json(k_golden + "tokenizer_pre_" + pre + "_llamacpp.json")), 50u);
  }
  EXPECT_THROW(tokenizer_from_gguf(*gguf, "mystery-pre"), Error);
}

// The chat prompts of the greedy golden were rendered by Jinja from the
// GGUF's own template and tokenized by llama.cpp.
TEST(TokenizerGolden, ChatPromptsMatchJinjaAndLlamaCpp) {
  if (!std::filesystem::exists(k_model)) GTEST_SKIP() << "default model absent: " << k_model;
  auto gguf = GgufFile::open(k_model);
  auto tok = Tokenizer::from_gguf(*gguf);
  const auto golden = load_json(k_golden + "llama_cpp_greedy_smollm2.json");
  size_t n_chat = 0;
  for (const auto& c : golden.at("cases")) {
    const std::string prompt = c.at("prompt").get<std::string>();
    EXPECT_EQ(tok->encode(prompt, tok->add_bos_default(), true), c.at("prompt_ids").get<std::vector<int32_t>>())
        << prompt;
    if (!c.contains("messages")) continue;
    std::vector<ChatMessage> messages;
    for (const auto& m : c.at("messages")) messages.push_back({m.at("role"), m.at("content")});
    EXPECT_EQ(tok->apply_chat_template(messages, true), prompt);
    ++n_chat;
  }
  EXPECT_GE(n_chat, 3u);
}

// The GGUF and the tokenizer.json built from it are the same tokenizer.
TEST(TokenizerGolden, GgufAndHfAgree) {
  if (!std::filesystem::exists(k_model)) GTEST_SKIP() << "default model absent: " << k_model;
  auto gguf = GgufFile::open(k_model);
  auto a = Tokenizer::from_gguf(*gguf);
  auto b = load_hf("tokenizer_smollm2.json", "tokenizer_config_smollm2.json");
  EXPECT_EQ(a->n_vocab(), b->n_vocab());
  EXPECT_EQ(a->bos_id(), b->bos_id());
  EXPECT_EQ(a->eos_id(), b->eos_id());
  const std::vector<ChatMessage> chat = {{"user", "Name three primes."}};
  EXPECT_EQ(a->apply_chat_template(chat, true), b->apply_chat_template(chat, true));
  for (int32_t id = 0; id < a->n_vocab(); id += 97) EXPECT_EQ(a->token_to_piece(id), b->token_to_piece(id));
}

}  // namespace
}  // namespace kvtier
