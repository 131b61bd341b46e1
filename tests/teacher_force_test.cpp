// Engine::teacher_force on the project's long-context model: under full
// attention it reproduces one dense forward pass over prompt + answer; under a
// sparse policy it reproduces the policy's own greedy generation (the answer
// is fed through the decode path, so the sparse selection applies); and the
// bench records its fidelity fields.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "bench/bench_runner.h"
#include "bench/tasks.h"
#include "bench/training_ids.h"
#include "kvtier/engine.h"

namespace kvtier {
namespace {

const std::string k_root = KVT_SOURCE_DIR;
const std::string k_model = k_root + "/models/kvtier-longctx-19m";
const std::string k_data = k_root + "/data";  // the benchmarks' data, in the repository

class TeacherForce : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    EngineOptions o;
    o.model_path = k_model;
    o.prefill_chunk = 256;
    engine_ = Engine::load(o).release();
    const Tokenizer& tok = engine_->tokenizer();
    bench::TaskSource source{k_data, "", [&](const std::string& s) { return int64_t(tok.encode(s, false, false).size()); }};
    // A prompt long enough that yakv's budget (1/32) leaves most tokens out.
    sample_ = new bench::BenchSample(bench::make_samples("text2json-gen", 2048, 1, 4, source).at(0));
  }
  static void TearDownTestSuite() {
    delete engine_;
    delete sample_;
    engine_ = nullptr;
    sample_ = nullptr;
  }
  static Engine* engine_;
  static bench::BenchSample* sample_;
};
Engine* TeacherForce::engine_ = nullptr;
bench::BenchSample* TeacherForce::sample_ = nullptr;

float max_abs_diff(const float* a, const float* b, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

TEST_F(TeacherForce, FullEqualsOneDenseForward) {
  const bench::TrainingIds ids = bench::training_ids(engine_->tokenizer(), *sample_);
  std::vector<int32_t> answer(ids.answer.begin(), ids.answer.begin() + 24);
  const size_t nv = size_t(engine_->config().n_vocab);
  const std::vector<float> tf = engine_->teacher_forced_logits(ids.prompt, answer, "full,kv=f32");
  ASSERT_EQ(tf.size(), answer.size() * nv);
  std::vector<int32_t> all = ids.prompt;
  all.insert(all.end(), answer.begin(), answer.end());
  const std::vector<float> dense = engine_->logits(all, "full,kv=f32");  // [n_tok, n_vocab]
  for (size_t i = 0; i < answer.size(); ++i) {
    const float* want = &dense[(ids.prompt.size() - 1 + i) * nv];
    EXPECT_LT(max_abs_diff(&tf[i * nv], want, nv), 2e-3f) << "answer position " << i;
  }
}

TEST_F(TeacherForce, SparsePolicyReproducesItsGreedyGeneration) {
  const bench::TrainingIds ids = bench::training_ids(engine_->tokenizer(), *sample_);
  SamplingParams greedy;
  greedy.max_new_tokens = 40;
  greedy.ignore_eos = true;
  const std::string policy = "yakv,kv=f32";
  const GenerationResult g = engine_->generate(ids.prompt, greedy, policy);
  ASSERT_EQ(g.tokens.size(), 40u);
  const size_t nv = size_t(engine_->config().n_vocab);
  const std::vector<float> tf = engine_->teacher_forced_logits(ids.prompt, g.tokens, policy);
  const std::vector<float> full = engine_->teacher_forced_logits(ids.prompt, g.tokens, "full,kv=f32");
  float diff_after_prefill = 0;
  for (size_t i = 0; i < g.tokens.size(); ++i) {
    const float* row = &tf[i * nv];
    EXPECT_EQ(std::max_element(row, row + nv) - row, g.tokens[i]) << "position " << i;
    if (i == 0) {
      EXPECT_LT(max_abs_diff(row, &full[0], nv), 1e-4f) << "the first token comes from the dense prefill";
    } else {
      diff_after_prefill = std::max(diff_after_prefill, max_abs_diff(row, &full[i * nv], nv));
    }
  }
  EXPECT_GT(diff_after_prefill, 1e-2f) << "the sparse selection did not change any decode step";
}

TEST_F(TeacherForce, BadInputIsRefused) {
  const std::vector<int32_t> prompt = engine_->tokenize("hello", true);
  const int32_t nv = engine_->config().n_vocab;
  EXPECT_THROW(engine_->teacher_forced_logits(prompt, {}, "full"), Error);
  EXPECT_THROW(engine_->teacher_forced_logits(prompt, {nv}, "full"), Error);
  EXPECT_THROW(engine_->teacher_forced_logits(prompt, {1}, "nonsense"), Error);
  std::vector<int32_t> too_long(size_t(engine_->config().n_ctx_train), 5);
  EXPECT_THROW(engine_->teacher_forced_logits(prompt, too_long, "full"), LimitError);
}

TEST_F(TeacherForce, BenchRecordsFidelity) {
  const auto out = (std::filesystem::temp_directory_path() / "kvt_bench_fidelity.jsonl").string();
  std::filesystem::remove(out);
  bench::BenchConfig c;
  c.tasks = {"niah_single"};
  c.policies = {"full", "yakv"};
  c.ctx = {1024};
  c.n_samples = 2;
  c.sampling.max_new_tokens = 8;
  c.output = out;
  c.data_root = k_data;
  c.progress = false;
  const auto records = bench::run_bench(*engine_, c);
  ASSERT_EQ(records.size(), 4u);
  for (const auto& r : records) {
    ASSERT_TRUE(r.contains("kl_full")) << r.dump();
    EXPECT_TRUE(r.contains("score"));
    EXPECT_GT(r["n_answer_tokens"].get<int64_t>(), 1);
    EXPECT_GE(r["kl_full"].get<double>(), 0.0);
    EXPECT_GT(r["answer_nll"].get<double>(), 0.0);
    if (r["policy"] == "full") {
      EXPECT_EQ(r["kl_full"].get<double>(), 0.0);
      EXPECT_EQ(r["top1_agree_full"].get<double>(), 1.0);
    }
  }
  // Fidelity only: no generation, no score; the records already there are kept.
  c.generate = false;
  c.policies.push_back("shadowkv");
  const auto more = bench::run_bench(*engine_, c);
  ASSERT_EQ(more.size(), 6u);
  for (size_t i = 4; i < 6; ++i) {
    EXPECT_EQ(more[i]["policy"], "shadowkv");
    EXPECT_FALSE(more[i].contains("score"));
    EXPECT_TRUE(more[i].contains("kl_full"));
    EXPECT_GT(more[i]["gpu_bytes_per_token"].get<double>(), 0.0);
  }
  std::filesystem::remove(out);
}

}  // namespace
}  // namespace kvtier
