// Engine::step_batch: sequences that step together (one CPU forward pass for
// all past their prompt) produce exactly what each produces alone — tokens
// and log-probabilities — with different prompts, lengths and policies in one
// batch, sequences joining and leaving mid-batch, more sequences than one
// forward pass takes, and a sampled sequence beside greedy ones; and
// `kvtier bench --batch` records what it records one sample at a time.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "bench/bench_runner.h"
#include "kvtier/engine.h"

namespace kvtier {
namespace {

const std::string k_root = KVT_SOURCE_DIR;

struct Request {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  std::string policy;
  int start_round = 0;  // the batch round at which it joins
};

// A prompt of about n_words words, different for each i.
std::string prompt_text(int i, int n_words) {
  static const char* words[] = {"river", "ledger", "amber", "falcon", "quartz", "meadow", "signal", "copper",
                                "lantern", "harbor", "violet", "summit", "cedar", "orbit", "velvet", "anchor"};
  std::string s = "Entry " + std::to_string(i) + ":";
  for (int w = 0; w < n_words; ++w) s += std::string(" ") + words[(i * 7 + w * (i + 3)) % 16];
  return s + ". Next";
}

std::vector<Request> requests(const Engine& e, int n, const std::vector<std::string>& policies) {
  std::vector<Request> out;
  for (int i = 0; i < n; ++i) {
    Request r;
    r.prompt = e.tokenize(prompt_text(i, 20 + 37 * (i % 5)));
    r.sampling.max_new_tokens = 6 + 3 * (i % 4);  // leave at different rounds
    r.sampling.ignore_eos = true;
    r.sampling.n_logprobs = 2;
    if (i == 3) {  // sampled: the same seed draws the same tokens from the same logits
      r.sampling.temperature = 0.8f;
      r.sampling.seed = 99;
    }
    r.policy = policies[size_t(i) % policies.size()];
    r.start_round = (i * 2) % 7;  // join at different rounds
    out.push_back(std::move(r));
  }
  return out;
}

void expect_batch_equals_solo(Engine& e, const std::vector<Request>& reqs) {
  std::vector<GenerationResult> solo;
  for (const Request& r : reqs) solo.push_back(e.generate(r.prompt, r.sampling, r.policy));

  std::vector<std::unique_ptr<Sequence>> seqs(reqs.size());
  std::vector<std::string> text(reqs.size());
  int round = 0;
  size_t max_together = 0;
  for (;; ++round) {
    std::vector<Sequence*> batch;
    std::vector<size_t> which;
    size_t decoding = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (!seqs[i] && reqs[i].start_round == round) seqs[i] = e.start(reqs[i].prompt, reqs[i].sampling, reqs[i].policy);
      if (!seqs[i] || seqs[i]->finished()) continue;
      decoding += seqs[i]->result().tokens.empty() ? 0 : 1;
      batch.push_back(seqs[i].get());
      which.push_back(i);
    }
    max_together = std::max(max_together, decoding);
    bool pending = false;
    for (size_t i = 0; i < reqs.size(); ++i) pending = pending || !seqs[i] || !seqs[i]->finished();
    if (!pending) break;
    ASSERT_LT(round, 1000);
    const auto results = e.step_batch(batch);
    ASSERT_EQ(results.size(), batch.size());
    for (size_t j = 0; j < batch.size(); ++j) {
      ASSERT_FALSE(results[j].error) << "sequence " << which[j];
      EXPECT_TRUE(results[j].stepped);
      text[which[j]] += results[j].piece;
    }
  }
  EXPECT_GE(max_together, size_t(4)) << "the schedule never had a real batch";
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE("sequence " + std::to_string(i) + " (" + reqs[i].policy + ")");
    const GenerationResult& b = seqs[i]->result();
    EXPECT_EQ(b.tokens, solo[i].tokens);
    EXPECT_EQ(b.finish_reason, solo[i].finish_reason);
    EXPECT_EQ(b.text, solo[i].text);
    EXPECT_EQ(text[i], solo[i].text);  // the streamed pieces add up to the text
    ASSERT_EQ(b.logprobs.size(), solo[i].logprobs.size());
    for (size_t t = 0; t < b.logprobs.size(); ++t) {
      EXPECT_EQ(b.logprobs[t].logprob, solo[i].logprobs[t].logprob) << "token " << t;  // bit for bit
      EXPECT_EQ(b.logprobs[t].top, solo[i].logprobs[t].top) << "token " << t;
    }
  }
}

TEST(EngineBatch, LongContextModelMixedPoliciesEqualSolo) {
  EngineOptions o;
  o.model_path = k_root + "/models/kvtier-longctx-19m";
  o.n_threads = 2;
  auto e = Engine::load(o);
  // 17 sequences: more than one forward pass takes (15), so the batch splits.
  expect_batch_equals_solo(*e, requests(*e, 17, {"full", "yakv", "shadowkv", "yakv,kv=fp8", "yakv,reselect=2",
                                                          "yakv,reselect=2,rescore=2"}));
}

TEST(EngineBatch, DefaultModelQuantizedWeightsEqualSolo) {
  const std::string model = k_root + "/models/cache/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "no default model (scripts/fetch_default_model.sh)";
  EngineOptions o;
  o.model_path = model;
  o.n_threads = 2;
  auto e = Engine::load(o);
  expect_batch_equals_solo(*e, requests(*e, 8, {"full", "yakv"}));
}

TEST(EngineBatch, ErrorsStayWithTheirSequence) {
  EngineOptions o;
  o.model_path = k_root + "/models/kvtier-longctx-19m";
  o.n_threads = 1;
  auto e = Engine::load(o);
  auto other = Engine::load(o);
  SamplingParams sp;
  sp.max_new_tokens = 2;
  auto a = e->start(e->tokenize("one two"), sp, "full");
  auto stranger = other->start(other->tokenize("three"), sp, "full");
  EXPECT_THROW(e->step_batch({a.get(), stranger.get()}), Error);
  // A finished or cancelled sequence reports "not stepped", as step() does.
  auto b = e->start(e->tokenize("four five"), sp, "full");
  b->cancel();
  const auto r = e->step_batch({a.get(), b.get()});
  EXPECT_TRUE(r[0].stepped);
  EXPECT_FALSE(r[1].stepped);
  EXPECT_FALSE(r[0].error);
  EXPECT_FALSE(r[1].error);
}

TEST(EngineBatch, BenchBatchRecordsWhatOneAtATimeRecords) {
  EngineOptions o;
  o.model_path = k_root + "/models/kvtier-longctx-19m";
  o.n_threads = 2;
  auto e = Engine::load(o);
  auto run = [&](int batch) {
    const auto out = (std::filesystem::temp_directory_path() / ("kvt_bench_batch" + std::to_string(batch) + ".jsonl"))
                         .string();
    std::filesystem::remove(out);
    bench::BenchConfig c;
    c.tasks = {"niah_single"};
    c.policies = {"full", "yakv"};
    c.ctx = {512};
    c.n_samples = 3;
    c.sampling.max_new_tokens = 12;
    c.output = out;
    c.data_root = k_root + "/data";
    c.progress = false;
    c.fidelity = false;
    c.batch = batch;
    std::map<std::string, nlohmann::json> by_key;
    for (auto& r : bench::run_bench(*e, c)) by_key[bench::record_key(r)] = r;
    std::filesystem::remove(out);
    return by_key;
  };
  const auto one = run(1), four = run(4);
  ASSERT_EQ(one.size(), 6u);
  ASSERT_EQ(four.size(), one.size());
  for (const auto& [key, r] : one) {
    ASSERT_TRUE(four.count(key)) << r.dump();
    const auto& b = four.at(key);
    EXPECT_EQ(b["prediction"], r["prediction"]) << r.dump();
    EXPECT_EQ(b["n_new_tokens"], r["n_new_tokens"]);
    EXPECT_EQ(b["score"], r["score"]);
    EXPECT_EQ(b["host_bytes"], r["host_bytes"]);
  }
  bench::BenchConfig bad;
  bad.tasks = {"niah_single"};
  bad.policies = {"full"};
  bad.output = "/tmp/unused.jsonl";
  bad.batch = 0;
  EXPECT_THROW(bench::run_bench(*e, bad), Error);
}

}  // namespace
}  // namespace kvtier
