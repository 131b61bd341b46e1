// Scheduler tests on the real default model (skipped when it is absent):
// concurrent greedy outputs equal solo runs, round-robin fairness, FIFO
// admission, cancellation freeing KV memory, queue and budget limits, drain.
#include "server/scheduler.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "server/api_request.h"

namespace kvtier::server {
namespace {

const char* kModel = KVT_SOURCE_DIR "/models/cache/SmolLM2-135M-Instruct.Q4_1.gguf";

class SchedulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(kModel)) return;
    EngineOptions o;
    o.model_path = kModel;
    o.n_threads = 2;
    engine_ = Engine::load(o).release();
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }
  void SetUp() override {
    if (!engine_) GTEST_SKIP() << "default model absent: " << kModel;
  }

  static Job job(const std::string& text, int max_new, bool ignore_eos = false) {
    Job j;
    j.prompt = engine_->tokenize(text, true);
    j.sampling.temperature = 0;
    j.sampling.max_new_tokens = max_new;
    j.sampling.ignore_eos = ignore_eos;
    return j;
  }

  // Polls until pred() or ~20 s pass.
  template <class Pred>
  static bool eventually(Pred pred) {
    for (int i = 0; i < 2000; ++i) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return pred();
  }

  static Engine* engine_;
};
Engine* SchedulerTest::engine_ = nullptr;

TEST_F(SchedulerTest, ConcurrentGreedyOutputsEqualSoloRuns) {
  const std::vector<std::string> prompts = {"The capital of France is", "def fibonacci(n):",
                                            "Once upon a time, there was"};
  std::vector<GenerationResult> solo;
  for (const auto& p : prompts) {
    const Job j = job(p, 8);
    solo.push_back(engine_->generate(j.prompt, j.sampling));
  }
  Scheduler s(*engine_, {3, 8, 0});
  std::vector<std::shared_ptr<Channel>> chs;
  for (const auto& p : prompts) chs.push_back(s.submit(job(p, 8)));
  for (size_t i = 0; i < chs.size(); ++i) {
    // Streamed pieces concatenate to the final text.
    std::string streamed;
    for (;;) {
      auto u = chs[i]->wait(std::chrono::milliseconds(100));
      streamed += u.text;
      if (u.finished) break;
    }
    ASSERT_FALSE(chs[i]->error()) << chs[i]->error()->message;
    const GenerationResult& r = chs[i]->result();
    EXPECT_EQ(r.tokens, solo[i].tokens) << prompts[i];
    EXPECT_EQ(r.text, solo[i].text);
    EXPECT_EQ(streamed, r.text);
    EXPECT_EQ(r.finish_reason, solo[i].finish_reason);
    EXPECT_EQ(r.n_prompt_tokens, int64_t(engine_->tokenize(prompts[i], true).size()));
  }
  const SchedulerStats st = s.stats();
  EXPECT_EQ(st.n_completed, 3u);
  // The worker's time (/health worker_seconds): three starts, the rounds, three finishes.
  EXPECT_GT(st.start_seconds, 0);
  EXPECT_GT(st.step_seconds, st.start_seconds);
  EXPECT_GT(st.finish_seconds, 0);
}

TEST_F(SchedulerTest, ActiveSequencesStepOnceEveryRound) {
  Scheduler s(*engine_, {3, 8, 0});
  std::vector<std::shared_ptr<Channel>> chs;
  for (int i = 0; i < 3; ++i) chs.push_back(s.submit(job("Count: 1, 2, 3,", 10, true)));
  for (auto& c : chs) c->wait_finished();
  std::vector<std::vector<uint64_t>> rounds;
  for (auto& c : chs) {
    ASSERT_FALSE(c->error());
    rounds.push_back(c->step_rounds());
    // Prefill + 9 decode steps produce 10 tokens (ignore_eos).
    ASSERT_EQ(rounds.back().size(), 10u);
    // No active sequence ever skips a round.
    for (size_t k = 1; k < rounds.back().size(); ++k) {
      EXPECT_EQ(rounds.back()[k], rounds.back()[k - 1] + 1);
    }
  }
  // The three overlap: each started before the others finished (admission
  // happens at the next round after submission).
  for (size_t a = 0; a < 3; ++a) {
    for (size_t b = 0; b < 3; ++b) EXPECT_LT(rounds[a].front(), rounds[b].back());
  }
}

TEST_F(SchedulerTest, OneSlotServesInArrivalOrder) {
  Scheduler s(*engine_, {1, 8, 0});
  auto a = s.submit(job("Alpha", 6, true));
  auto b = s.submit(job("Beta", 6, true));
  b->wait_finished();
  a->wait_finished();
  const auto ra = a->step_rounds();
  const auto rb = b->step_rounds();
  ASSERT_EQ(ra.size(), 6u);
  ASSERT_EQ(rb.size(), 6u);
  EXPECT_GT(rb.front(), ra.back());
}

TEST_F(SchedulerTest, CancelFreesTheSequenceAndItsKv) {
  Scheduler s(*engine_, {2, 8, 0});
  auto ch = s.submit(job("Write a very long story about a dragon.", 400, true));
  ASSERT_TRUE(eventually([&] { return ch->step_rounds().size() >= 3; }));
  SchedulerStats mid = s.stats();
  EXPECT_EQ(mid.n_active, 1);
  EXPECT_GT(mid.kv_gpu_bytes + mid.kv_host_bytes, 0);
  s.cancel(*ch);
  ch->wait_finished();
  EXPECT_FALSE(ch->error());
  EXPECT_EQ(ch->result().finish_reason, "cancelled");
  EXPECT_LT(ch->result().tokens.size(), 400u);
  ASSERT_TRUE(eventually([&] { return s.stats().n_active == 0; }));
  const SchedulerStats after = s.stats();
  EXPECT_EQ(after.kv_gpu_bytes, 0);
  EXPECT_EQ(after.kv_host_bytes, 0);
  EXPECT_EQ(after.n_cancelled, 1u);
  // A request cancelled while queued never runs.
  Scheduler one(*engine_, {1, 8, 0});
  auto busy = one.submit(job("Long text:", 60, true));
  auto queued = one.submit(job("Never run", 5));
  one.cancel(*queued);
  queued->wait_finished();
  EXPECT_EQ(queued->result().finish_reason, "cancelled");
  EXPECT_TRUE(queued->step_rounds().empty());
  one.cancel(*busy);
}

TEST_F(SchedulerTest, FullQueueIsRefusedWith503) {
  Scheduler s(*engine_, {1, 1, 0});
  auto a = s.submit(job("First", 200, true));
  ASSERT_TRUE(eventually([&] { return s.stats().n_active == 1; }));
  auto b = s.submit(job("Second", 4));
  try {
    s.submit(job("Third", 4));
    FAIL() << "a third request fitted a queue of one";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status(), 503);
    EXPECT_EQ(e.code(), "queue_full");
  }
  EXPECT_EQ(s.stats().n_rejected, 1u);
  s.cancel(*a);
  b->wait_finished();
  EXPECT_FALSE(b->error());
  EXPECT_EQ(b->result().finish_reason.empty(), false);
}

TEST_F(SchedulerTest, HostBudgetLimitsWhatRunsAtOnce) {
  // Each job reserves 600 of a 1000-byte budget, so they run one at a time.
  Scheduler s(*engine_, {4, 8, 1000});
  std::vector<std::shared_ptr<Channel>> chs;
  for (int i = 0; i < 3; ++i) {
    Job j = job("Budget test", 5, true);
    j.host_kv_bytes = 600;
    chs.push_back(s.submit(std::move(j)));
  }
  for (auto& c : chs) c->wait_finished();
  for (size_t i = 1; i < chs.size(); ++i) {
    EXPECT_GT(chs[i]->step_rounds().front(), chs[i - 1]->step_rounds().back());
  }
  EXPECT_EQ(s.stats().host_kv_reserved_bytes, 0);
  Job big = job("Too big", 5);
  big.host_kv_bytes = 1001;
  try {
    s.submit(std::move(big));
    FAIL() << "a job over the whole budget was queued";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status(), 400);
  }
}

// The GPU budget holds a sequence's prompt charge until its prompt has run,
// then its decode charge: a second long prompt waits for the first's prefill,
// not for its whole generation.
TEST_F(SchedulerTest, GpuBudgetHoldsThePromptChargeUntilThePromptIsDone) {
  SchedulerOptions o{4, 8, 0, 1000};
  Scheduler s(*engine_, o);
  std::vector<std::shared_ptr<Channel>> chs;
  for (int i = 0; i < 2; ++i) {
    Job j = job("GPU budget test", 8, true);
    j.gpu_kv_prefill_bytes = 700;
    j.gpu_kv_bytes = 200;
    chs.push_back(s.submit(std::move(j)));
  }
  for (auto& c : chs) c->wait_finished();
  const auto a = chs[0]->step_rounds(), b = chs[1]->step_rounds();
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  EXPECT_GT(b.front(), a.front());  // 700 + 700 > 1000: waited for A's prompt
  EXPECT_LT(b.front(), a.back());   // 200 + 700 ≤ 1000: ran beside A's decode
  EXPECT_EQ(s.stats().gpu_kv_reserved_bytes, 0);
  // Cancellation gives back both pools.
  Job endless = job("Endless:", 100000, true);
  endless.gpu_kv_prefill_bytes = 900;
  endless.gpu_kv_bytes = 300;
  endless.host_kv_bytes = 50;
  auto running = s.submit(std::move(endless));
  ASSERT_TRUE(eventually([&] { return running->step_rounds().size() >= 2; }));
  EXPECT_EQ(s.stats().gpu_kv_reserved_bytes, 300);  // past its prompt: the decode charge
  EXPECT_EQ(s.stats().host_kv_reserved_bytes, 50);
  s.cancel(*running);
  running->wait_finished();
  ASSERT_TRUE(eventually([&] { return s.stats().n_active == 0; }));
  EXPECT_EQ(s.stats().gpu_kv_reserved_bytes, 0);
  EXPECT_EQ(s.stats().host_kv_reserved_bytes, 0);
  // A request whose larger phase exceeds the whole budget can never run: 400.
  Job big = job("Too big", 5);
  big.gpu_kv_prefill_bytes = 10;
  big.gpu_kv_bytes = 1001;
  try {
    s.submit(std::move(big));
    FAIL() << "a job over the whole GPU budget was queued";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.code(), "kv_budget_exceeded");
  }
}

TEST_F(SchedulerTest, EngineRefusalsBecomeRequestErrors) {
  Scheduler s(*engine_, {2, 8, 0});
  Job bad = job("x", 4);
  bad.kv_policy = "no-such-policy";
  auto ch = s.submit(std::move(bad));
  ch->wait_finished();
  ASSERT_TRUE(ch->error());
  EXPECT_EQ(ch->error()->status, 400);
  EXPECT_EQ(s.stats().n_failed, 1u);
  EXPECT_EQ(s.stats().n_active, 0);
}

TEST_F(SchedulerTest, DrainCancelsWhatOutlivesTheGrace) {
  Scheduler s(*engine_, {1, 8, 0});
  auto running = s.submit(job("Endless:", 100000, true));
  auto queued = s.submit(job("Waiting", 4));
  ASSERT_TRUE(eventually([&] { return !running->step_rounds().empty(); }));
  s.drain(std::chrono::milliseconds(50));
  ASSERT_TRUE(running->finished());
  ASSERT_TRUE(running->error());
  EXPECT_EQ(running->error()->status, 503);
  ASSERT_TRUE(queued->error());
  EXPECT_EQ(queued->error()->status, 503);
  try {
    s.submit(job("Late", 4));
    FAIL() << "accepted a request after drain";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status(), 503);
  }
}

// An engine that runs one 32-token prompt chunk per step, as `kvtier serve` does.
std::unique_ptr<Engine> chunked_engine() {
  EngineOptions o;
  o.model_path = kModel;
  o.n_threads = 2;
  o.prefill_chunk = 32;
  o.prefill_chunk_per_step = true;
  return Engine::load(o);
}

// Waits for a request and checks that it answered what it answers alone.
void expect_as_alone(Channel& c, const GenerationResult& solo) {
  c.wait_finished();
  ASSERT_FALSE(c.error());
  EXPECT_EQ(c.result().tokens, solo.tokens);
}

// With a prompt chunk per step (as `kvtier serve` runs), a long prompt that
// arrives is prefilled over several rounds while the sequence already
// streaming keeps its one token per round; both answers equal solo runs.
TEST_F(SchedulerTest, LongPromptIsPrefilledBetweenTheStreamsSteps) {
  auto e = chunked_engine();
  std::string long_text = "Inventory:";
  for (int i = 0; i < 60; ++i) long_text += " item " + std::to_string(i) + ",";
  Job streaming = job("Count: 1, 2, 3,", 40, true), long_prompt = job(long_text, 4, true);
  long_prompt.prompt = e->tokenize(long_text, true);
  const int64_t n_chunks = (int64_t(long_prompt.prompt.size()) + 31) / 32;
  ASSERT_GE(n_chunks, 6);
  const GenerationResult solo_a = e->generate(streaming.prompt, streaming.sampling);
  const GenerationResult solo_b = e->generate(long_prompt.prompt, long_prompt.sampling);

  Scheduler s(*e, {2, 8, 0});
  auto a = s.submit(streaming);
  ASSERT_TRUE(eventually([&] { return a->step_rounds().size() >= 2; }));
  const uint64_t submitted = s.stats().n_rounds;
  auto b = s.submit(long_prompt);
  ASSERT_NO_FATAL_FAILURE(expect_as_alone(*a, solo_a));
  ASSERT_NO_FATAL_FAILURE(expect_as_alone(*b, solo_b));
  const auto ra = a->step_rounds(), rb = b->step_rounds();
  ASSERT_EQ(rb.size(), 4u);  // no report for the rounds that only ran a prompt chunk
  // B's first token came n_chunks rounds after its admission (≥ submitted).
  EXPECT_GE(rb.front(), submitted + uint64_t(n_chunks) - 1);
  // A stepped in every one of those rounds.
  for (size_t k = 1; k < ra.size(); ++k) EXPECT_EQ(ra[k], ra[k - 1] + 1);
  EXPECT_LE(ra.front(), submitted);
  EXPECT_GE(ra.back(), rb.front());
}

// Under a prefill budget of one chunk, a round runs one prompt chunk in all:
// the earlier prompt runs to its end first, the later one waits, the stream
// that is already decoding steps every round, and the answers are the solo ones.
TEST_F(SchedulerTest, PrefillBudgetRunsTheEarliestPromptFirst) {
  auto e = chunked_engine();
  auto long_job = [&](const std::string& what, int n_items, int max_new) {
    std::string text = what + ":";
    for (int i = 0; i < n_items; ++i) text += " " + what + " " + std::to_string(i) + ",";
    Job j = job(text, max_new, true);
    j.prompt = e->tokenize(text, true);
    return j;
  };
  Job a_job = long_job("Inventory", 30, 20), b_job = long_job("Shelf", 24, 4);
  const int64_t na = (int64_t(a_job.prompt.size()) + 31) / 32, nb = (int64_t(b_job.prompt.size()) + 31) / 32;
  ASSERT_GE(na, 3);
  ASSERT_GE(nb, 3);
  ASSERT_GE(20, nb + 2);  // A still decodes while B's prompt runs
  const GenerationResult solo_a = e->generate(a_job.prompt, a_job.sampling);
  const GenerationResult solo_b = e->generate(b_job.prompt, b_job.sampling);

  SchedulerOptions so{2, 8, 0};
  so.prefill_tokens_per_round = 32;
  Scheduler s(*e, so);
  // The worker is idle: A is admitted in the first round after this count.
  const uint64_t first = s.stats().n_rounds;
  auto a = s.submit(a_job);
  auto b = s.submit(b_job);
  ASSERT_NO_FATAL_FAILURE(expect_as_alone(*a, solo_a));
  ASSERT_NO_FATAL_FAILURE(expect_as_alone(*b, solo_b));
  const auto ra = a->step_rounds(), rb = b->step_rounds();
  // A's chunks ran in rounds first .. first + na - 1, its first token with the last.
  EXPECT_EQ(ra.front(), first + uint64_t(na) - 1);
  // B's chunks ran one per round after A's: none beside A's.
  EXPECT_EQ(rb.front(), first + uint64_t(na + nb) - 1);
  for (size_t k = 1; k < ra.size(); ++k) EXPECT_EQ(ra[k], ra[k - 1] + 1);
}

}  // namespace
}  // namespace kvtier::server
