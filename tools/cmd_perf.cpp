// kvtier perf: prefill and decode speed on a synthetic prompt (like
// llama-bench): median over repetitions, printed as a table or JSON.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>

#include "command.h"
#include "options.h"

namespace kvtier::tools {
namespace {

struct PerfArgs {
  EngineOptions engine;
  std::string kv = "full";
  int n_prompt = 512;
  int n_gen = 128;
  int reps = 3;
  bool json = false;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void perf(const PerfArgs& a) {
  KVT_CHECK(a.n_prompt > 0 && a.n_gen > 1 && a.reps > 0,
            "perf: need --prompt-tokens > 0, --gen > 1 and --reps > 0");
  auto engine = Engine::load(a.engine);
  // A deterministic prompt of exactly n_prompt tokens: ids cycled over the
  // vocabulary's middle (ordinary word pieces), as llama-bench uses random ids.
  const int n_vocab = engine->config().n_vocab;
  std::vector<int32_t> prompt(size_t(a.n_prompt));
  for (int i = 0; i < a.n_prompt; ++i) prompt[size_t(i)] = 1000 + (i * 7919) % std::max(1, n_vocab - 2000);
  SamplingParams s;
  s.max_new_tokens = a.n_gen;
  s.ignore_eos = true;
  std::vector<double> pp, tg;
  for (int r = 0; r < a.reps; ++r) {
    auto res = engine->generate(prompt, s, a.kv);
    pp.push_back(double(a.n_prompt) / res.prefill_seconds);
    // n_gen tokens: the first from the prefill logits, n_gen - 1 decode forwards.
    tg.push_back(double(res.tokens.size() - 1) / res.decode_seconds);
  }
  const double pp_tps = median(pp), tg_tps = median(tg);
  if (a.json) {
    nlohmann::json j{{"engine", "kvtier"},       {"model", a.engine.model_path},
                     {"threads", a.engine.n_threads}, {"kv", a.kv},
                     {"n_prompt", a.n_prompt},   {"n_gen", a.n_gen},
                     {"prefill_tok_s", pp_tps},  {"decode_tok_s", tg_tps},
                     {"prefill_runs", pp},       {"decode_runs", tg}};
    fmt::print("{}\n", j.dump());
    return;
  }
  fmt::print("| model | kv | prompt | gen | prefill tok/s | decode tok/s |\n|---|---|---|---|---|---|\n");
  fmt::print("| {} | {} | {} | {} | {:.1f} | {:.1f} |\n", engine->model_name(), a.kv, a.n_prompt,
             a.n_gen, pp_tps, tg_tps);
}

Registration reg(60, [](CLI::App& app) {
  auto a = std::make_shared<PerfArgs>();
  auto* cmd = app.add_subcommand("perf", "prefill and decode tokens/s on a synthetic prompt");
  add_engine_options(*cmd, a->engine);
  add_kv_option(*cmd, a->kv);
  cmd->add_option("-p,--prompt-tokens", a->n_prompt, "prompt length in tokens")->capture_default_str();
  cmd->add_option("-g,--gen", a->n_gen, "tokens to generate")->capture_default_str();
  cmd->add_option("-r,--reps", a->reps, "repetitions (median reported)")->capture_default_str();
  cmd->add_flag("--json", a->json, "print one JSON line");
  cmd->callback([a] { perf(*a); });
});

}  // namespace
}  // namespace kvtier::tools
