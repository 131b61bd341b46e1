// A bench cell at the model's context limit leaves the answer its room: its
// prompts are sized to max_context − max_new_tokens − the chat template's
// tokens, its records say so in "prompt_target", and no prompt is refused
// for want of room; a cell well inside the context keeps its length.
#include <gtest/gtest.h>

#include <filesystem>

#include "bench/bench_runner.h"
#include "kvtier/engine.h"

namespace kvtier {
namespace {

const std::string k_root = KVT_SOURCE_DIR;

TEST(BenchContextRoom, ACellAtTheLimitLeavesTheAnswerRoom) {
  EngineOptions o;
  o.model_path = k_root + "/models/kvtier-longctx-19m";
  o.n_threads = 2;
  o.max_context = 1024;
  auto e = Engine::load(o);
  ASSERT_EQ(e->max_context(), 1024);
  const auto out = (std::filesystem::temp_directory_path() / "kvt_bench_room.jsonl").string();
  std::filesystem::remove(out);
  bench::BenchConfig c;
  c.tasks = {"niah_single"};
  c.policies = {"full"};
  c.ctx = {1024, 512};
  c.n_samples = 2;
  c.sampling.max_new_tokens = 64;
  c.output = out;
  c.data_root = k_root + "/data";
  c.progress = false;
  c.fidelity = false;
  const auto records = bench::run_bench(*e, c);
  std::filesystem::remove(out);
  ASSERT_EQ(records.size(), 4u);
  for (const auto& r : records) {
    ASSERT_FALSE(r.contains("error")) << r.dump();
    const int64_t n_prompt = r["context_tokens"].get<int64_t>();
    if (r["ctx"] == 1024) {
      ASSERT_TRUE(r.contains("prompt_target")) << r.dump();
      EXPECT_LE(r["prompt_target"].get<int64_t>(), 1024 - 64);
      EXPECT_LE(n_prompt + 64, 1024) << r.dump();
      EXPECT_GT(n_prompt, 1024 - 64 - 160) << r.dump();  // the prompt still fills most of the room
    } else {
      EXPECT_FALSE(r.contains("prompt_target")) << r.dump();
      EXPECT_GT(n_prompt, 512 - 160) << r.dump();
      EXPECT_LE(n_prompt, 512 + 64) << r.dump();
    }
  }
}

}  // namespace
}  // namespace kvtier
