// Engine::stage_times_ms (`kvtier perf --stages`): a prompt's stages and its
// decode steps' are charged, for a dense and a tiered policy, including the
// start of decode ("prefill_finish": the tiered cache frees its prompt
// buffers and sets up its decode caches there).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "kvtier/engine.h"

namespace kvtier {
namespace {

TEST(EngineStages, PromptAndDecodeStagesAreCharged) {
  EngineOptions o;
  o.model_path = std::string(KVT_SOURCE_DIR) + "/tests/fixtures/hf_tiny_qwen2";
  o.n_threads = 1;
  o.max_context = 256;
  o.stage_times = true;
  auto e = Engine::load(o);
  SamplingParams sp;
  sp.max_new_tokens = 4;
  sp.ignore_eos = true;
  std::vector<int32_t> prompt(96);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(3 + i % 50);
  for (const std::string policy : {"full", "yakv,budget=16"}) {
    e->stage_times_ms(true);
    auto seq = e->start(prompt, sp, policy);
    while (seq->step(nullptr)) {
    }
    ASSERT_TRUE(seq->finished()) << policy;
    std::map<std::string, double> ms;
    for (const auto& [name, t] : e->stage_times_ms(true)) ms[name] = t;
    for (const char* want : {"prefill_model", "prefill_attend", "prefill_finish", "model"}) {
      ASSERT_TRUE(ms.count(want)) << policy << ": no stage " << want;
      EXPECT_GE(ms[want], 0.0) << policy << ": " << want;
    }
    if (policy != "full")
      for (const char* want : {"index", "select", "attend"}) EXPECT_TRUE(ms.count(want)) << policy << ": " << want;
  }
}

}  // namespace
}  // namespace kvtier
