// Structured generation end to end with the default model (SmolLM2-135M
// Q4_1): greedy and sampled decoding under json_object and JSON Schema
// constraints give text that parses and validates, stop by themselves once
// the value is complete, and the unconstrained answer to the same prompt is
// not JSON (so the constraint is what made it so).
#include <gtest/gtest.h>

#include <filesystem>

#include "grammar/constraint.h"
#include "grammar/json_schema.h"
#include "kvtier/engine.h"

namespace kvtier {
namespace {

using json = nlohmann::json;

const std::string k_model = std::string(KVT_SOURCE_DIR) + "/models/cache/SmolLM2-135M-Instruct.Q4_1.gguf";

class StructuredOutput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(k_model)) return;
    EngineOptions opt;
    opt.model_path = k_model;
    opt.n_threads = 2;
    engine_ = Engine::load(opt).release();
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }
  void SetUp() override {
    if (!engine_) GTEST_SKIP() << "default model absent: run scripts/fetch_default_model.sh";
  }
  static std::vector<int32_t> chat(const std::string& user) {
    return engine_->tokenize(engine_->chat_prompt({{"user", user}}), true);
  }
  static Engine* engine_;
};
Engine* StructuredOutput::engine_ = nullptr;

const char* const k_person = R"({"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 30},
    "age": {"type": "integer", "minimum": 0, "maximum": 130},
    "city": {"type": "string", "maxLength": 30},
    "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 1, "maxItems": 3}},
    "required": ["name", "age", "city", "hobbies"], "additionalProperties": false})";

TEST_F(StructuredOutput, GreedySchemaOutputParsesAndValidates) {
  const std::string prompt = "Invent a person: give a name, an age, a city and hobbies.";
  SamplingParams sp;
  sp.max_new_tokens = 160;
  const GenerationResult free_run = engine_->generate(chat(prompt), sp);
  EXPECT_FALSE(json::accept(free_run.text)) << "the unconstrained answer is already JSON: " << free_run.text;

  sp.constraint = engine_->grammar_vocab()->json_schema(k_person);
  const GenerationResult r = engine_->generate(chat(prompt), sp);
  EXPECT_EQ(r.finish_reason, "stop") << r.text;
  ASSERT_TRUE(json::accept(r.text)) << r.text;
  EXPECT_EQ(validate_json(json::parse(k_person), json::parse(r.text)), "") << r.text;
}

TEST_F(StructuredOutput, JsonObjectModeGreedyAndSampled) {
  const std::string prompt = "Describe a cat as a JSON object with its name and colour.";
  SamplingParams sp;
  sp.max_new_tokens = 120;
  sp.constraint = engine_->grammar_vocab()->json_object();
  int stopped = 0;
  for (uint64_t seed : {0, 1, 2}) {
    sp.temperature = seed == 0 ? 0.0f : 0.9f;
    sp.seed = seed;
    const GenerationResult r = engine_->generate(chat(prompt), sp);
    // Every token was one the constraint allowed (replayed on a fresh one).
    auto replay = sp.constraint->make();
    std::vector<uint8_t> mask;
    for (int32_t t : r.tokens) {
      replay->allowed(mask);
      ASSERT_TRUE(mask[size_t(t)]) << "seed " << seed << ": token " << t << " was not allowed: " << r.text;
      replay->accept(t);
    }
    // An object may run past max_tokens (json_object allows a key to repeat,
    // and a greedy 135M model can loop on one: which run does depends on the
    // float path of the CPU); one that stopped is complete and parses.
    ASSERT_FALSE(r.tokens.empty());
    EXPECT_EQ(replay->complete(), r.finish_reason == "stop") << "seed " << seed << ": " << r.text;
    if (r.finish_reason != "stop") continue;
    ++stopped;
    ASSERT_TRUE(json::accept(r.text)) << r.text;
    EXPECT_TRUE(json::parse(r.text).is_object()) << r.text;
  }
  EXPECT_GE(stopped, 1) << "no run finished its object within " << sp.max_new_tokens << " tokens";
}

TEST_F(StructuredOutput, EnumSchemaStopsRightAfterTheValue) {
  // One of three strings: once it is written nothing but the end can follow,
  // so the sequence stops without waiting for an end-of-turn token.
  SamplingParams sp;
  sp.max_new_tokens = 40;
  sp.constraint = engine_->grammar_vocab()->json_schema(R"({"enum": ["positive", "negative", "neutral"]})");
  const GenerationResult r = engine_->generate(chat("Sentiment of: I love this film!"), sp);
  EXPECT_EQ(r.finish_reason, "stop");
  EXPECT_TRUE(r.text == "\"positive\"" || r.text == "\"negative\"" || r.text == "\"neutral\"") << r.text;
}

TEST_F(StructuredOutput, StreamedPiecesAddUpToTheValue) {
  SamplingParams sp;
  sp.max_new_tokens = 160;
  sp.constraint = engine_->grammar_vocab()->json_schema(k_person);
  std::string streamed;
  auto seq = engine_->start(chat("Invent a person."), sp);
  const GenerationResult& r = seq->run([&](const std::string& piece) {
    streamed += piece;
    return true;
  });
  EXPECT_EQ(streamed, r.text);
  EXPECT_EQ(validate_json(json::parse(k_person), json::parse(r.text)), "") << r.text;
}

}  // namespace
}  // namespace kvtier
