// kvtier perf: prefill and decode speed on a synthetic prompt (like
// llama-bench): median over repetitions, printed as a table or JSON. With a
// batch list, B sequences (each its own prompt) decode together through
// Engine::step_batch, and decode tok/s counts the tokens of all of them.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>

#include "command.h"
#include "kv/policy.h"
#include "options.h"

namespace kvtier::tools {
namespace {

struct PerfArgs {
  EngineOptions engine;
  std::vector<std::string> kv{"full"};
  std::vector<int> n_prompt{512};
  std::vector<int> batch{1};
  int n_gen = 128;
  int reps = 3;
  int64_t random_kv = 0;  // prompt tokens whose K/V are random (Sequence::fill_prompt_kv_random)
  bool json = false;
};

// Prompts longer than this show prefill progress (tok/s, ETA) on stderr.
constexpr int kProgressTokens = 32768;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void perf(const PerfArgs& a) {
  KVT_CHECK(!a.n_prompt.empty() && a.n_gen > 1 && a.reps > 0, "perf: need --prompt-tokens, --gen > 1 and --reps > 0");
  for (int n : a.n_prompt)
    KVT_CHECK(n > 0 && a.random_kv < n, "perf: prompt length {} must be positive and longer than --random-kv {}", n,
              a.random_kv);
  for (int b : a.batch) KVT_CHECK(b > 0 && b <= 4096, "perf: batch {} must be in [1, 4096]", b);
  for (const std::string& kv : a.kv) parse_policy(kv);  // every policy checked before any timing
  // One engine (weights loaded once) for every policy and prompt length.
  auto engine = load_engine(a.engine);
  const int n_vocab = engine->config().n_vocab;
  // Ids cycled over the vocabulary's middle (ordinary word pieces, as
  // llama-bench uses random ids), inside the vocabulary of any size.
  const int lo = std::min(1000, n_vocab / 4), span = std::max(1, n_vocab - 2 * lo);
  if (!a.json)
    fmt::print("| model | kv | prompt | gen | batch | prefill tok/s | decode tok/s | ms/step | GPU KV MiB | "
               "host KV MiB | hit % | host MB/step |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int n_prompt : a.n_prompt)
    for (const std::string& kv : a.kv)
      for (int batch : a.batch) {
        SamplingParams s;
        s.max_new_tokens = a.n_gen;
        s.ignore_eos = true;
        std::vector<double> pp, tg;
        KvMemory mem;
        KvStats st;
        int64_t gpu_peak = 0, prefill_peak = 0;
        bool streamed = false;
        engine->stage_times_ms(true);  // this run's stages only
        for (int r = 0; r < a.reps; ++r) {
          std::vector<std::unique_ptr<Sequence>> seqs;
          std::vector<Sequence*> all;
          for (int b = 0; b < batch; ++b) {
            std::vector<int32_t> prompt(static_cast<size_t>(n_prompt));  // [n_prompt], deterministic, one per sequence
            for (int i = 0; i < n_prompt; ++i) prompt[size_t(i)] = lo + int32_t((int64_t(i) * 7919 + b * 104729) % span);
            seqs.push_back(engine->start(std::move(prompt), s, kv));
            all.push_back(seqs.back().get());
            if (a.random_kv > 0) seqs.back()->fill_prompt_kv_random(a.random_kv, uint64_t(b) + 1);
            // GPU memory in use, sampled after every prompt chunk (the prefill's
            // buffers are alive then) and after decoding; progress on long prompts.
            auto progress = n_prompt > kProgressTokens ? prefill_progress() : nullptr;
            Engine* e = engine.get();
            seqs.back()->set_prefill_progress([progress, e, &gpu_peak, &prefill_peak](int64_t done, int64_t total) {
              prefill_peak = std::max(prefill_peak, e->gpu_memory_in_use());
              gpu_peak = std::max(gpu_peak, prefill_peak);
              if (progress) progress(done, total);
            });
          }
          // The first steps run each prompt (and take the first token); the
          // n_gen - 1 steps after them are the batch's decode forwards.
          for (Sequence* q : all)
            while (!q->prompt_done())
              for (const auto& res : engine->step_batch({q}))
                if (res.error) std::rethrow_exception(res.error);
          const auto t0 = std::chrono::steady_clock::now();
          for (int step = 1; step < a.n_gen; ++step)
            for (const auto& res : engine->step_batch(all))
              if (res.error) std::rethrow_exception(res.error);
          const double decode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          gpu_peak = std::max(gpu_peak, engine->gpu_memory_in_use());
          double prefill_s = 0;
          mem = KvMemory{};
          st = KvStats{};
          for (const auto& q : seqs) {
            KVT_CHECK(q->finished() && int(q->result().tokens.size()) == a.n_gen, "perf: a sequence stopped early");
            prefill_s += q->result().prefill_seconds;
            mem.gpu_bytes += q->result().kv_memory.gpu_bytes;
            mem.host_bytes += q->result().kv_memory.host_bytes;
            streamed = streamed || q->result().kv_memory.prefill_streamed;
            st += q->result().kv_stats;
          }
          pp.push_back(double(n_prompt - a.random_kv) * batch / prefill_s);
          tg.push_back(double(batch) * (a.n_gen - 1) / decode_s);
        }
        const int64_t steps = int64_t(a.n_gen - 1);  // decode steps of the last repetition
        const double host_mb_step = steps > 0 ? double(st.bytes_fetched) / double(steps) / 1e6 : 0;
        const double pp_tps = median(pp), tg_tps = median(tg);
        const double ms_step = 1000.0 * batch / tg_tps;
        // ms per decode step by stage, and ms per prompt by prefill stage ("prefill_*").
        nlohmann::json stages = nlohmann::json::object(), prefill_stages = nlohmann::json::object();
        std::string stage_line, prefill_line;
        for (const auto& [name, ms] : engine->stage_times_ms()) {
          const bool prefill = name.rfind("prefill_", 0) == 0;
          const double per = ms / double(int64_t(a.reps) * (prefill ? batch : steps));
          (prefill ? prefill_stages : stages)[name] = per;
          std::string& line = prefill ? prefill_line : stage_line;
          line += fmt::format("{}{} {:.3f}", line.empty() ? "" : " · ", name, per);
        }
        if (a.json) {
          nlohmann::json j{{"engine", "kvtier"},      {"model", a.engine.model_path},
                           {"device", a.engine.device}, {"threads", a.engine.n_threads},
                           {"prefill_gemm", a.engine.prefill_gemm},
                           {"kv", kv},                {"n_prompt", n_prompt},
                           {"n_gen", a.n_gen},        {"batch", batch},
                           {"prefill_tok_s", pp_tps}, {"decode_tok_s", tg_tps},
                           {"prefill_runs", pp},      {"decode_runs", tg},
                           {"gpu_kv_bytes", mem.gpu_bytes}, {"host_kv_bytes", mem.host_bytes},
                           {"ms_per_token", 1000.0 / tg_tps}, {"ms_per_step", ms_step},
                           {"selected_rows", st.n_selected}, {"fetched_rows", st.n_fetched},
                           {"hit_rate", st.hit_rate()},       {"host_bytes_per_step", host_mb_step * 1e6}};
          if (a.engine.stage_times) {
            j["stage_ms_per_step"] = stages;
            j["prefill_stage_ms_per_prompt"] = prefill_stages;
          }
          if (a.engine.device == "cuda") {
            j["gpu_mem_peak_bytes"] = gpu_peak;  // sampled after every prompt chunk and after decoding
            j["gpu_mem_prefill_peak_bytes"] = prefill_peak;
          }
          j["prefill_streamed"] = streamed;
          if (a.random_kv > 0) j["random_kv_tokens"] = a.random_kv;  // prefill_tok_s counts the rest
          if (a.engine.host_kv_budget_bytes > 0) j["host_kv_budget_bytes"] = a.engine.host_kv_budget_bytes;
          if (engine->gpu_kv_budget_bytes() > 0) j["gpu_kv_budget_bytes"] = engine->gpu_kv_budget_bytes();
          fmt::print("{}\n", j.dump());
        } else {
          fmt::print("| {} | {} | {} | {} | {} | {:.1f} | {:.1f} | {:.2f} | {:.1f} | {:.1f} | {} | {} |\n",
                     engine->model_name(), kv, n_prompt, a.n_gen, batch, pp_tps, tg_tps, ms_step,
                     double(mem.gpu_bytes) / (1 << 20), double(mem.host_bytes) / (1 << 20),
                     st.n_selected ? fmt::format("{:.1f}", 100.0 * st.hit_rate()) : std::string("-"),
                     st.n_selected ? fmt::format("{:.2f}", host_mb_step) : std::string("-"));
          if (!stage_line.empty()) fmt::print("|  | stages, ms/step: {} |\n", stage_line);
          if (!prefill_line.empty()) fmt::print("|  | prefill stages, ms/prompt: {} |\n", prefill_line);
          if (a.random_kv > 0)
            fmt::print("|  | the first {} prompt tokens' K/V are random (no forward pass); prefill tok/s counts the "
                       "other {} |\n", a.random_kv, n_prompt - a.random_kv);
          if (a.engine.device == "cuda")
            fmt::print("|  | GPU memory in use at its sampled peak: {:.2f} GiB (prefill {:.2f} GiB) |\n",
                       double(gpu_peak) / (1 << 30), double(prefill_peak) / (1 << 30));
          if (streamed) fmt::print("|  | the prompt's attention streamed each layer's K/V from the host tier |\n");
        }
        std::fflush(stdout);
      }
}

Registration reg(60, [](CLI::App& app) {
  auto a = std::make_shared<PerfArgs>();
  auto* cmd = app.add_subcommand("perf", "prefill and decode tokens/s on a synthetic prompt");
  add_engine_options(*cmd, a->engine);
  add_kv_list_option(*cmd, a->kv);
  cmd->add_option("-p,--prompt-tokens", a->n_prompt, "prompt lengths in tokens (comma-separated)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("-b,--batch", a->batch,
                  "sequences decoding together (comma-separated list; each its own prompt; decode tok/s "
                  "counts all of them)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("-g,--gen", a->n_gen, "tokens to generate")->capture_default_str();
  cmd->add_option("-r,--reps", a->reps, "repetitions (median reported)")->capture_default_str();
  cmd->add_option("--random-kv", a->random_kv,
                  "benchmarks of decode at contexts whose prefill does not fit a run: the first N prompt tokens' K/V "
                  "are random values written straight into the cache (no forward pass); prefill tok/s counts the rest")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", a->json, "print one JSON line per run");
  cmd->add_flag("--stages", a->engine.stage_times,
                "time each decode-step stage (index, select, fetch, attend, merge, append, model); "
                "turns CUDA graphs off");
  cmd->callback([a] { perf(*a); });
});

}  // namespace
}  // namespace kvtier::tools
