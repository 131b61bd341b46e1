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
  bool json = false;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void perf(const PerfArgs& a) {
  KVT_CHECK(!a.n_prompt.empty() && a.n_gen > 1 && a.reps > 0, "perf: need --prompt-tokens, --gen > 1 and --reps > 0");
  for (int n : a.n_prompt) KVT_CHECK(n > 0, "perf: prompt length {} must be positive", n);
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
        engine->stage_times_ms(true);  // this run's stages only
        for (int r = 0; r < a.reps; ++r) {
          std::vector<std::unique_ptr<Sequence>> seqs;
          std::vector<Sequence*> all;
          for (int b = 0; b < batch; ++b) {
            std::vector<int32_t> prompt(static_cast<size_t>(n_prompt));  // [n_prompt], deterministic, one per sequence
            for (int i = 0; i < n_prompt; ++i) prompt[size_t(i)] = lo + int32_t((int64_t(i) * 7919 + b * 104729) % span);
            seqs.push_back(engine->start(std::move(prompt), s, kv));
            all.push_back(seqs.back().get());
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
          double prefill_s = 0;
          mem = KvMemory{};
          st = KvStats{};
          for (const auto& q : seqs) {
            KVT_CHECK(q->finished() && int(q->result().tokens.size()) == a.n_gen, "perf: a sequence stopped early");
            prefill_s += q->result().prefill_seconds;
            mem.gpu_bytes += q->result().kv_memory.gpu_bytes;
            mem.host_bytes += q->result().kv_memory.host_bytes;
            st += q->result().kv_stats;
          }
          pp.push_back(double(n_prompt) * batch / prefill_s);
          tg.push_back(double(batch) * (a.n_gen - 1) / decode_s);
        }
        const int64_t steps = int64_t(a.n_gen - 1);  // decode steps of the last repetition
        const double host_mb_step = steps > 0 ? double(st.bytes_fetched) / double(steps) / 1e6 : 0;
        const double pp_tps = median(pp), tg_tps = median(tg);
        const double ms_step = 1000.0 * batch / tg_tps;
        nlohmann::json stages = nlohmann::json::object();  // ms per decode step, by stage
        std::string stage_line;
        for (const auto& [name, ms] : engine->stage_times_ms()) {
          const double per = ms / double(int64_t(a.reps) * steps);
          stages[name] = per;
          stage_line += fmt::format("{}{} {:.3f}", stage_line.empty() ? "" : " · ", name, per);
        }
        if (a.json) {
          nlohmann::json j{{"engine", "kvtier"},      {"model", a.engine.model_path},
                           {"device", a.engine.device}, {"threads", a.engine.n_threads},
                           {"kv", kv},                {"n_prompt", n_prompt},
                           {"n_gen", a.n_gen},        {"batch", batch},
                           {"prefill_tok_s", pp_tps}, {"decode_tok_s", tg_tps},
                           {"prefill_runs", pp},      {"decode_runs", tg},
                           {"gpu_kv_bytes", mem.gpu_bytes}, {"host_kv_bytes", mem.host_bytes},
                           {"ms_per_token", 1000.0 / tg_tps}, {"ms_per_step", ms_step},
                           {"selected_rows", st.n_selected}, {"fetched_rows", st.n_fetched},
                           {"hit_rate", st.hit_rate()},       {"host_bytes_per_step", host_mb_step * 1e6}};
          if (a.engine.stage_times) j["stage_ms_per_step"] = stages;
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
  cmd->add_flag("--json", a->json, "print one JSON line per run");
  cmd->add_flag("--stages", a->engine.stage_times,
                "time each decode-step stage (index, select, fetch, attend, merge, append, model); "
                "turns CUDA graphs off");
  cmd->callback([a] { perf(*a); });
});

}  // namespace
}  // namespace kvtier::tools
