// The project's trained long-context model (models/kvtier-longctx-19m, made
// by train/): kvtier loads the exported Hugging Face directory, builds the
// same prompt ids the model was trained on, and its greedy output equals the
// training framework's (tests/golden/longctx_greedy.json, written by
// train/compare.py --golden with PyTorch).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bench/tasks.h"
#include "bench/training_ids.h"
#include "kvtier/engine.h"

namespace kvtier {
namespace {

const std::string k_root = KVT_SOURCE_DIR;
const std::string k_model = k_root + "/models/kvtier-longctx-19m";
const std::string k_data = k_root + "/data";

nlohmann::json golden() {
  std::ifstream f(k_root + "/tests/golden/longctx_greedy.json");
  return nlohmann::json::parse(f);
}

std::unique_ptr<Engine> load_engine() {
  EngineOptions o;
  o.model_path = k_model;
  return Engine::load(o);
}

bench::BenchSample sample(const Engine& engine, const std::string& task, int64_t length, uint64_t seed) {
  const Tokenizer& tok = engine.tokenizer();
  bench::TaskSource source{k_data, "", [&](const std::string& s) { return int64_t(tok.encode(s, false, false).size()); }};
  return bench::make_samples(task == "text2json" ? "text2json-gen" : task, length, 1, seed, source).at(0);
}

TEST(LongCtxModel, TrainingIdsAreTheBenchPrompt) {
  auto engine = load_engine();
  for (const char* task : {"text2json", "multineedle", "niah_single", "cwe"}) {
    const bench::BenchSample s = sample(*engine, task, 900, 3);
    const bench::TrainingIds ids = bench::training_ids(engine->tokenizer(), s);
    // What bench_runner.cpp feeds the model.
    EXPECT_EQ(ids.prompt, engine->tokenize(engine->chat_prompt({{"user", s.prompt}}) + s.answer_prefix, true)) << task;
    ASSERT_GE(ids.answer.size(), 2u);
    EXPECT_TRUE(engine->tokenizer().is_eog(ids.answer.back())) << task;
    EXPECT_EQ(engine->tokenizer().decode(std::vector<int32_t>(ids.answer.begin(), ids.answer.end() - 1)), s.reference) << task;
  }
}

TEST(LongCtxModel, GreedyEqualsTheTrainingFramework) {
  const nlohmann::json g = golden();
  auto engine = load_engine();
  ASSERT_FALSE(g["samples"].empty());
  for (const auto& want : g["samples"]) {
    const std::string task = want["task"];
    const bench::BenchSample s = sample(*engine, task, g["length"].get<int64_t>(), g["seed"].get<uint64_t>());
    const bench::TrainingIds ids = bench::training_ids(engine->tokenizer(), s);
    ASSERT_EQ(int64_t(ids.prompt.size()), want["prompt_tokens"].get<int64_t>()) << task;
    SamplingParams greedy;
    greedy.temperature = 0;
    greedy.max_new_tokens = g["max_new"].get<int>();
    const GenerationResult r = engine->generate(ids.prompt, greedy, "full");
    EXPECT_EQ(r.tokens, want["torch_ids"].get<std::vector<int32_t>>()) << task << ": " << r.text;
    EXPECT_EQ(r.finish_reason == "stop", want["torch_stopped"].get<bool>()) << task;
  }
}

}  // namespace
}  // namespace kvtier
