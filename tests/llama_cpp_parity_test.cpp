// The default model (SmolLM2-135M-Instruct Q4_1) against llama.cpp
// (golden: scripts/gen_llama_cpp_golden.py, llama-cpp-python 0.3.36, 8
// prompts × 40 greedy tokens, with llama.cpp's top-2 logit gap at each step).
//
// This Q4_1 model is numerically touchy: llama.cpp against itself with an
// f16 vs an f32 KV cache differs by 0.25 mean absolute logit (up to ~1.9) on
// case 0's 76 positions; kvtier (f32 store) against llama.cpp (f16 cache)
// differs by 0.21 mean — the same noise level (measured with
// llama-cpp-python 0.3.36, logits_all). Exact 32-token equality is therefore
// only meaningful where llama.cpp's own choice is not a near-tie. Hence: every
// token must equal llama.cpp's, teacher-forced on llama.cpp's prefix, except
// where llama.cpp's top-2 gap is under kNearTie; and free-running greedy must
// agree until the first such near-tie.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "kvtier/engine.h"

namespace kvtier {
namespace {

const std::string kModel = std::string(KVT_SOURCE_DIR) + "/models/cache/SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr double kNearTie = 0.5;  // logits, well under the 1.9 self-disagreement above

class LlamaCppParity : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kModel)) GTEST_SKIP() << "default model absent: run scripts/fetch_default_model.sh";
    std::ifstream in(std::string(KVT_SOURCE_DIR) + "/tests/golden/llama_cpp_greedy_smollm2.json");
    ASSERT_TRUE(in.good());
    golden_ = nlohmann::json::parse(in);
    EngineOptions opt;
    opt.model_path = kModel;
    engine_ = Engine::load(opt);
  }
  nlohmann::json golden_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(LlamaCppParity, PromptTokenizationMatches) {
  for (const auto& c : golden_["cases"])
    EXPECT_EQ(engine_->tokenizer().encode(c["prompt"].get<std::string>(), false, true),
              c["prompt_ids"].get<std::vector<int32_t>>());
}

TEST_F(LlamaCppParity, TeacherForcedTokensMatchExceptNearTies) {
  const int n_vocab = engine_->config().n_vocab;
  int n_steps = 0, n_equal = 0, n_near_tie_flips = 0;
  for (const auto& c : golden_["cases"]) {
    auto tokens = c["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = c["generated_ids"].get<std::vector<int32_t>>();
    const auto gap = c["top2_logit_gap"].get<std::vector<double>>();
    const size_t n_prompt = tokens.size();
    tokens.insert(tokens.end(), want.begin(), want.end() - 1);
    const auto logits = engine_->logits(tokens, "full,kv=f32");
    for (size_t t = 0; t < want.size(); ++t) {
      const float* row = &logits[(n_prompt - 1 + t) * size_t(n_vocab)];
      const int32_t got = int32_t(std::max_element(row, row + n_vocab) - row);
      ++n_steps;
      if (got == want[t]) {
        ++n_equal;
      } else {
        ++n_near_tie_flips;
        EXPECT_LT(gap[t], kNearTie) << "step " << t << " of: " << c["prompt"] << " — kvtier chose "
                                    << got << ", llama.cpp " << want[t] << " with a top-2 gap of "
                                    << gap[t];
      }
    }
  }
  std::printf("teacher-forced: %d/%d tokens equal to llama.cpp; %d flips, all at near-ties (< %.2f)\n",
              n_equal, n_steps, n_near_tie_flips, kNearTie);
  EXPECT_GE(n_steps, 5 * 32);
}

TEST_F(LlamaCppParity, FreeRunningGreedyAgreesUntilANearTie) {
  int n_long = 0;
  for (const auto& c : golden_["cases"]) {
    const auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = c["generated_ids"].get<std::vector<int32_t>>();
    const auto gap = c["top2_logit_gap"].get<std::vector<double>>();
    SamplingParams s;
    s.max_new_tokens = int(want.size());
    s.ignore_eos = true;
    const auto got = engine_->generate(prompt, s, "full,kv=f32").tokens;
    size_t n_same = 0;
    while (n_same < got.size() && n_same < want.size() && got[n_same] == want[n_same]) ++n_same;
    if (n_same >= 32) ++n_long;
    if (n_same < want.size())
      EXPECT_LT(gap[n_same], kNearTie) << "diverges at " << n_same << " where llama.cpp's gap is "
                                       << gap[n_same] << ": " << c["prompt"];
    std::printf("free-running: %zu/%zu tokens equal before the first difference\n", n_same, want.size());
  }
  RecordProperty("cases_with_32_equal_tokens", n_long);
}

}  // namespace
}  // namespace kvtier
