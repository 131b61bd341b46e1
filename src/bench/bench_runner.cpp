#include "bench/bench_runner.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "bench/bench_text.h"
#include "bench/fidelity.h"
#include "bench/training_ids.h"
#include "bench/jsonl.h"
#include "core/status.h"

namespace kvtier::bench {

using nlohmann::json;

std::string record_key(const json& r) {
  return fmt::format("{}\x1f{}\x1f{}\x1f{}", r.value("task", ""), r.value("id", ""), r.value("policy", ""),
                     r.value("ctx", int64_t{0}));
}

std::vector<json> read_bench_records(const std::string& path) {
  std::vector<json> out;
  if (!std::filesystem::exists(path)) return out;
  std::string text = read_text_file(path);
  // An interrupted run may leave a partial last line: drop it (it is redone).
  if (!text.empty() && text.back() != '\n') {
    const size_t nl = text.rfind('\n');
    text.resize(nl == std::string::npos ? 0 : nl + 1);
    fmt::print(stderr, "bench: ignoring the incomplete last line of {}\n", path);
  }
  for (auto& rec : parse_jsonl(text, path)) {
    for (const char* f : {"task", "id", "policy"})
      KVT_CHECK(rec.value.contains(f) && rec.value[f].is_string(), "{}:{}: bench record without string '{}'", path,
                rec.line, f);
    KVT_CHECK(rec.value.contains("ctx") && rec.value["ctx"].is_number_integer(),
              "{}:{}: bench record without integer 'ctx'", path, rec.line);
    out.push_back(std::move(rec.value));
  }
  return out;
}

void drop_partial_last_line(const std::string& path) {
  if (!std::filesystem::exists(path)) return;
  const std::string text = read_text_file(path);
  if (text.empty() || text.back() == '\n') return;
  const size_t nl = text.rfind('\n');
  const size_t keep = nl == std::string::npos ? 0 : nl + 1;
  std::filesystem::resize_file(path, keep);
  fmt::print(stderr, "bench: removed the incomplete last line of {} ({} bytes)\n", path, text.size() - keep);
}

namespace {

class ProgressBar {
 public:
  ProgressBar(int64_t total, bool enabled) : total_(total), enabled_(enabled), start_(clock::now()) {}
  void update(int64_t done, const std::string& label) {
    if (!enabled_ || total_ <= 0) return;
    const double frac = static_cast<double>(done) / static_cast<double>(total_);
    const int width = 30;
    const int filled = static_cast<int>(frac * width);
    const double elapsed = std::chrono::duration<double>(clock::now() - start_).count();
    const double eta = done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(total_ - done) : 0;
    fmt::print(stderr, "\r[{}{}] {}/{} {:.0f}s eta {:.0f}s {:<40.40}", std::string(size_t(filled), '#'),
               std::string(size_t(width - filled), '.'), done, total_, elapsed, eta, label);
    if (done == total_) fmt::print(stderr, "\n");
  }

 private:
  using clock = std::chrono::steady_clock;
  int64_t total_;
  bool enabled_;
  clock::time_point start_;
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void put_memory(json& rec, const KvMemory& m) {
  rec["gpu_bytes"] = m.gpu_bytes;
  rec["host_bytes"] = m.host_bytes;
  rec["gpu_bytes_per_token"] = m.gpu_bytes_per_token;
  rec["host_bytes_per_token"] = m.host_bytes_per_token;
}

void put_fidelity(json& rec, const FidelityStats& f, double seconds) {
  rec["n_answer_tokens"] = f.n_tokens;
  rec["answer_nll"] = f.answer_nll;
  rec["answer_token_acc"] = f.answer_token_acc;
  rec["top1_agree_full"] = f.top1_agree_full;
  rec["kl_full"] = f.kl_full;
  rec["fidelity_s"] = seconds;
}

// The preset full attention runs as: the reference of the fidelity metrics.
constexpr const char* k_reference_policy = "full";

// One sample's prompt and, for fidelity, its reference answer's ids and full
// attention's pass over them (built when a policy first needs it).
struct SampleWork {
  std::vector<int32_t> prompt;
  std::vector<int32_t> answer;  // reference + end of turn; empty: no reference
  std::unique_ptr<FidelityReference> full;
  std::string full_error;  // the reference pass did not fit the context
  double full_seconds = 0;
};

void build_reference(Engine& engine, SampleWork& w) {
  if (w.full || !w.full_error.empty()) return;
  auto t0 = Clock::now();
  auto ref = std::make_unique<FidelityReference>(w.answer, engine.config().n_vocab);
  try {
    engine.teacher_force(w.prompt, w.answer, k_reference_policy,
                         [&](int64_t, const float* logits) { ref->add(logits); });
    w.full = std::move(ref);
  } catch (const LimitError& e) {
    w.full_error = e.what();
  }
  w.full_seconds = seconds_since(t0);
}

// The fidelity fields of one policy's record (fidelity_error when the answer
// does not fit the context).
void run_fidelity(Engine& engine, SampleWork& w, const std::string& policy, json& rec) {
  build_reference(engine, w);
  if (!w.full) {
    rec["fidelity_error"] = w.full_error;
    return;
  }
  if (policy == k_reference_policy) {
    put_fidelity(rec, w.full->stats(), w.full_seconds);
    return;
  }
  auto t0 = Clock::now();
  FidelityAccumulator acc(*w.full);
  try {
    const KvMemory m =
        engine.teacher_force(w.prompt, w.answer, policy, [&](int64_t i, const float* logits) { acc.add(i, logits); });
    put_fidelity(rec, acc.stats(), seconds_since(t0));
    if (!rec.contains("gpu_bytes")) put_memory(rec, m);
  } catch (const LimitError& e) {
    rec["fidelity_error"] = e.what();
  }
}

// One (sample, policy) pair to run; gen or error is filled by its generation.
struct Item {
  int64_t sample = 0;
  std::string policy;
  json probe;  // the record's key fields
  std::optional<GenerationResult> gen;
  std::string error;  // a LimitError's message (the sample does not fit)
};

// Greedy generation of items [w0, w1) together: their sequences decode in
// one Engine::step_batch per step (one forward pass on the CPU), each with
// the tokens it gets alone. A sample too long for the context records its
// error; any other failure stops the run.
template <class WorkOf>
void generate_together(Engine& engine, const SamplingParams& sampling, std::vector<Item>& items, size_t w0,
                       size_t w1, WorkOf& work_of) {
  std::vector<std::unique_ptr<Sequence>> seqs(w1 - w0);
  for (size_t k = w0; k < w1; ++k) {
    try {
      seqs[k - w0] = engine.start(work_of(items[k].sample).prompt, sampling, items[k].policy);
    } catch (const LimitError& e) {
      items[k].error = e.what();
    }
  }
  for (;;) {
    std::vector<Sequence*> running;
    std::vector<size_t> which;
    for (size_t j = 0; j < seqs.size(); ++j)
      if (seqs[j] && !seqs[j]->finished()) {
        running.push_back(seqs[j].get());
        which.push_back(j);
      }
    if (running.empty()) break;
    const auto results = engine.step_batch(running);
    for (size_t r = 0; r < results.size(); ++r) {
      if (!results[r].error) continue;
      try {
        std::rethrow_exception(results[r].error);
      } catch (const LimitError& e) {
        items[w0 + which[r]].error = e.what();
        seqs[which[r]].reset();
      }
    }
  }
  for (size_t j = 0; j < seqs.size(); ++j)
    if (seqs[j]) items[w0 + j].gen = seqs[j]->result();
}

}  // namespace

std::vector<json> run_bench(Engine& engine, const BenchConfig& c) {
  KVT_CHECK(!c.tasks.empty() && !c.policies.empty(), "bench: need at least one --task and one --kv");
  KVT_CHECK(!c.output.empty(), "bench: need an output file (-o)");
  KVT_CHECK(c.generate || c.fidelity, "bench: nothing to measure (neither generation nor fidelity)");
  KVT_CHECK(c.batch >= 1, "bench: --batch must be ≥ 1, got {}", c.batch);
  std::vector<json> records = read_bench_records(c.output);
  std::set<std::string> done;
  for (const auto& r : records) done.insert(record_key(r));

  TaskSource src;
  src.data_root = c.data_root;
  src.text2json_file = c.text2json_file;
  const Tokenizer& tok = engine.tokenizer();
  src.count_tokens = [&tok](const std::string& s) { return static_cast<int64_t>(tok.encode(s, false, false).size()); };

  // Tasks whose length is fixed by their data run once, at ctx 0.
  auto ctx_list = [&](const std::string& task) {
    const std::string fam = score_family(task);
    if (task == "text2json" || fam == "longproc") return std::vector<int64_t>{0};
    KVT_CHECK(!c.ctx.empty(), "bench: task {} needs context lengths (--ctx)", task);
    return c.ctx;
  };
  // The prompt length of a cell: ctx, unless that leaves the answer no room.
  const int64_t template_tokens =
      static_cast<int64_t>(engine.tokenize(engine.chat_prompt({{"user", ""}}), true).size()) + 16;
  auto prompt_target = [&](int64_t ctx) {
    const int64_t room = engine.max_context() - int64_t(c.sampling.max_new_tokens) - template_tokens;
    KVT_CHECK(ctx == 0 || room > 0,
              "bench: {} new tokens leave no room for a prompt in the model's context of {} tokens",
              c.sampling.max_new_tokens, engine.max_context());
    return ctx > room ? room : ctx;
  };
  int64_t total = 0;
  for (const auto& task : c.tasks) total += static_cast<int64_t>(ctx_list(task).size()) * c.n_samples *
                                           static_cast<int64_t>(c.policies.size());
  ProgressBar bar(total, c.progress);
  int64_t n_done = 0;

  // An interrupted run may have left half a line: cut it off, so that the
  // next record starts on a line of its own (appending onto the fragment
  // would corrupt both).
  drop_partial_last_line(c.output);
  std::ofstream out(c.output, std::ios::app);
  KVT_CHECK(out.good(), "bench: cannot open '{}' for appending", c.output);
  for (const auto& task : c.tasks) {
    const std::string family = score_family(task);
    for (int64_t ctx : ctx_list(task)) {
      const int64_t target = ctx == 0 ? 0 : prompt_target(ctx);
      if (target != ctx)
        fmt::print(stderr, "bench: {} at {}: prompts of {} tokens, so that {} new tokens fit the context of {}\n",
                   task, ctx, target, c.sampling.max_new_tokens, engine.max_context());
      // The (sample, policy) pairs still to run, sample by sample. Samples
      // are built only when one of them still has work to do.
      std::vector<BenchSample> samples;
      bool built = false;
      std::vector<Item> items;
      for (int64_t i = 0; i < c.n_samples; ++i) {
        for (const auto& policy : c.policies) {
          if (!built) {
            samples = make_samples(task, ctx == 0 ? 0 : target, c.n_samples, c.seed, src);
            built = true;
          }
          if (i >= static_cast<int64_t>(samples.size())) {
            ++n_done;
            continue;
          }
          const BenchSample& s = samples[static_cast<size_t>(i)];
          json probe = {{"task", task}, {"id", s.id}, {"policy", policy}, {"ctx", ctx}};
          if (done.count(record_key(probe))) {
            ++n_done;
            continue;
          }
          items.push_back(Item{i, policy, std::move(probe), {}, {}});
        }
      }
      // Each sample's prompt (and fidelity reference) lives while one of its
      // items is still to run.
      std::map<int64_t, SampleWork> works;
      std::map<int64_t, int> remaining;
      for (const Item& it : items) ++remaining[it.sample];
      auto work_of = [&](int64_t i) -> SampleWork& {
        SampleWork& w = works[i];
        if (w.prompt.empty()) {
          const BenchSample& s = samples[static_cast<size_t>(i)];
          w.prompt = engine.tokenize(engine.chat_prompt({{"user", s.prompt}}) + s.answer_prefix, true);
          if (!s.reference.empty()) w.answer = training_ids(tok, s).answer;
        }
        return w;
      };
      const size_t wave = static_cast<size_t>(std::max(1, c.batch));
      for (size_t w0 = 0; w0 < items.size(); w0 += wave) {
        const size_t w1 = std::min(items.size(), w0 + wave);
        bar.update(n_done, fmt::format("{} {} #{} {}{}", task, ctx, items[w0].sample, items[w0].policy,
                                       w1 - w0 > 1 ? fmt::format(" (+{} together)", w1 - w0 - 1) : ""));
        if (c.generate) generate_together(engine, c.sampling, items, w0, w1, work_of);
        for (size_t k = w0; k < w1; ++k) {
          Item& it = items[k];
          const BenchSample& s = samples[static_cast<size_t>(it.sample)];
          SampleWork& work = work_of(it.sample);
          json rec = std::move(it.probe);
          rec["model"] = engine.model_name();
          rec["context_tokens"] = static_cast<int64_t>(work.prompt.size());
          if (target != ctx) rec["prompt_target"] = target;
          try {
            if (!it.error.empty()) throw LimitError(it.error);
            if (it.gen) {
              const GenerationResult& g = *it.gen;
              const SampleScore sc = score_prediction(family, g.text, s.gold);
              rec["prediction"] = g.text;
              rec["score"] = 100.0 * sc.score;
              rec["excluded"] = sc.excluded;
              rec["details"] = sc.details;
              put_memory(rec, g.kv_memory);
              rec["prefill_s"] = g.prefill_seconds;
              rec["decode_s"] = g.decode_seconds;
              rec["n_new_tokens"] = static_cast<int64_t>(g.tokens.size());
              rec["finish_reason"] = g.finish_reason;
              rec["kv_policy"] = g.kv_policy;
            }
            if (c.fidelity && !work.answer.empty()) {
              run_fidelity(engine, work, it.policy, rec);
              // Without generation a sample that does not fit has nothing left to count.
              if (!c.generate && rec.contains("fidelity_error")) rec["excluded"] = true;
            }
          } catch (const LimitError& e) {
            // Too long for this model's context: recorded, scored 0, kept out of the means.
            rec["error"] = e.what();
            rec["score"] = 0.0;
            rec["excluded"] = true;
          }
          out << dump_line(rec) << '\n';
          out.flush();
          KVT_CHECK(out.good(), "bench: writing '{}' failed", c.output);
          done.insert(record_key(rec));
          records.push_back(std::move(rec));
          it.gen.reset();
          if (--remaining[it.sample] == 0) works.erase(it.sample);
          ++n_done;
        }
      }
    }
  }
  bar.update(total, "done");
  return records;
}

}  // namespace kvtier::bench
