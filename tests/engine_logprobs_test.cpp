// Log-probabilities of prompt and generated tokens (SamplingParams::n_logprobs,
// n_prompt_logprobs) against a log-softmax of Engine::logits, the dense
// full-sequence reference.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "engine/logprobs.h"
#include "kvtier/engine.h"

namespace kvtier {
namespace {

const std::string kModel = std::string(KVT_SOURCE_DIR) + "/tests/fixtures/hf_tiny_qwen2";

std::unique_ptr<Engine> tiny_engine(int prefill_chunk) {
  EngineOptions o;
  o.model_path = kModel;
  o.n_threads = 1;
  o.prefill_chunk = prefill_chunk;
  return Engine::load(o);
}

// log_softmax(row)[tok] in double.
double ref_logprob(const float* row, int n, int32_t tok) {
  double m = row[0];
  for (int i = 1; i < n; ++i) m = std::max(m, double(row[i]));
  double s = 0;
  for (int i = 0; i < n; ++i) s += std::exp(double(row[i]) - m);
  return double(row[tok]) - m - std::log(s);
}

TEST(Logprobs, TokenLogprobIsALogSoftmaxWithSortedAlternatives) {
  const float logits[5] = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
  const TokenLogprob r = token_logprob(logits, 5, 4, 3);
  EXPECT_NEAR(r.logprob, ref_logprob(logits, 5, 4), 1e-6);
  ASSERT_EQ(r.top.size(), 3u);
  EXPECT_EQ(r.top[0].first, 1);  // tie with 3: the lower id first
  EXPECT_EQ(r.top[1].first, 3);
  EXPECT_EQ(r.top[2].first, 0);
  EXPECT_EQ(r.top[0].second, r.top[1].second);
  double total = 0;
  for (int i = 0; i < 5; ++i) total += std::exp(token_logprob(logits, 5, i, 0).logprob);
  EXPECT_NEAR(total, 1.0, 1e-6);
}

TEST(Logprobs, PromptLogprobsMatchTheDenseReference) {
  // prefill_chunk 7 spreads the prompt over several chunks (and the 64-row cap).
  auto e = tiny_engine(7);
  const std::vector<int32_t> prompt = {3, 17, 42, 5, 99, 123, 7, 7, 64, 200, 31, 2, 8, 150, 77, 12, 9, 1, 250, 33};
  const int n_vocab = e->config().n_vocab;
  const std::vector<float> ref = e->logits(prompt);  // [n_tok, n_vocab]
  SamplingParams s;
  s.max_new_tokens = 0;
  s.n_prompt_logprobs = 2;
  auto seq = e->start(prompt, s, "full");
  std::string piece;
  ASSERT_TRUE(seq->step(&piece));  // max_new_tokens 0 still runs the prefill
  EXPECT_TRUE(seq->finished());
  const GenerationResult& r = seq->result();
  EXPECT_TRUE(r.tokens.empty());
  ASSERT_EQ(r.prompt_logprobs.size(), prompt.size() - 1);
  for (size_t i = 0; i + 1 < prompt.size(); ++i) {
    const float* row = &ref[i * size_t(n_vocab)];
    const TokenLogprob& lp = r.prompt_logprobs[i];
    EXPECT_EQ(lp.token, prompt[i + 1]);
    EXPECT_NEAR(lp.logprob, ref_logprob(row, n_vocab, prompt[i + 1]), 2e-4) << i;
    ASSERT_EQ(lp.top.size(), 2u);
    EXPECT_GE(lp.top[0].second, lp.top[1].second);
    EXPECT_GE(lp.top[0].second, lp.logprob);
  }
}

TEST(Logprobs, GreedyTokensAreTheirPositionsMostLikely) {
  auto e = tiny_engine(512);
  SamplingParams s;
  s.max_new_tokens = 6;
  s.ignore_eos = true;
  s.n_logprobs = 3;
  s.n_prompt_logprobs = 1;
  const std::vector<int32_t> prompt = {10, 20, 30, 40};
  const GenerationResult r = e->generate(prompt, s, "full");
  ASSERT_EQ(r.tokens.size(), 6u);
  ASSERT_EQ(r.logprobs.size(), 6u);
  EXPECT_EQ(r.prompt_logprobs.size(), 3u);
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    EXPECT_EQ(r.logprobs[i].token, r.tokens[i]);
    ASSERT_EQ(r.logprobs[i].top.size(), 3u);
    EXPECT_EQ(r.logprobs[i].top[0].first, r.tokens[i]);
    EXPECT_EQ(r.logprobs[i].top[0].second, r.logprobs[i].logprob);
  }
  // The generated tokens' log-probabilities equal the dense reference's.
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), r.tokens.begin(), r.tokens.end());
  const std::vector<float> ref = e->logits(all);
  const int n_vocab = e->config().n_vocab;
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    const float* row = &ref[(prompt.size() - 1 + i) * size_t(n_vocab)];
    EXPECT_NEAR(r.logprobs[i].logprob, ref_logprob(row, n_vocab, r.tokens[i]), 2e-4) << i;
  }
  // Off by default.
  SamplingParams plain;
  plain.max_new_tokens = 2;
  const GenerationResult p = e->generate(prompt, plain, "full");
  EXPECT_TRUE(p.logprobs.empty() && p.prompt_logprobs.empty());
}

}  // namespace
}  // namespace kvtier
