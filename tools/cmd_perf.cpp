// kvtier perf: prefill and decode speed on a synthetic prompt (like
// llama-bench): median over repetitions, printed as a table or JSON.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "command.h"
#include "kv/policy.h"
#include "options.h"

namespace kvtier::tools {
namespace {

struct PerfArgs {
  EngineOptions engine;
  std::vector<std::string> kv{"full"};
  std::vector<int> n_prompt{512};
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
  for (const std::string& kv : a.kv) parse_policy(kv);  // every policy checked before any timing
  // One engine (weights loaded once) for every policy and prompt length.
  auto engine = load_engine(a.engine);
  const int n_vocab = engine->config().n_vocab;
  // Ids cycled over the vocabulary's middle (ordinary word pieces, as
  // llama-bench uses random ids), inside the vocabulary of any size.
  const int lo = std::min(1000, n_vocab / 4), span = std::max(1, n_vocab - 2 * lo);
  if (!a.json)
    fmt::print("| model | kv | prompt | gen | prefill tok/s | decode tok/s | GPU KV MiB | host KV MiB |\n"
               "|---|---|---|---|---|---|---|---|\n");
  for (int n_prompt : a.n_prompt)
    for (const std::string& kv : a.kv) {
      std::vector<int32_t> prompt(static_cast<size_t>(n_prompt));  // [n_prompt], deterministic
      for (int i = 0; i < n_prompt; ++i) prompt[size_t(i)] = lo + int32_t((int64_t(i) * 7919) % span);
      SamplingParams s;
      s.max_new_tokens = a.n_gen;
      s.ignore_eos = true;
      std::vector<double> pp, tg;
      KvMemory mem;
      for (int r = 0; r < a.reps; ++r) {
        auto res = engine->generate(prompt, s, kv);
        pp.push_back(double(n_prompt) / res.prefill_seconds);
        // n_gen tokens: the first from the prefill logits, n_gen - 1 decode forwards.
        tg.push_back(double(res.tokens.size() - 1) / res.decode_seconds);
        mem = res.kv_memory;
      }
      const double pp_tps = median(pp), tg_tps = median(tg);
      if (a.json) {
        nlohmann::json j{{"engine", "kvtier"},      {"model", a.engine.model_path},
                         {"device", a.engine.device}, {"threads", a.engine.n_threads},
                         {"kv", kv},                {"n_prompt", n_prompt},
                         {"n_gen", a.n_gen},        {"prefill_tok_s", pp_tps},
                         {"decode_tok_s", tg_tps},  {"prefill_runs", pp},
                         {"decode_runs", tg},       {"gpu_kv_bytes", mem.gpu_bytes},
                         {"host_kv_bytes", mem.host_bytes}};
        fmt::print("{}\n", j.dump());
      } else {
        fmt::print("| {} | {} | {} | {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} |\n", engine->model_name(), kv, n_prompt,
                   a.n_gen, pp_tps, tg_tps, double(mem.gpu_bytes) / (1 << 20), double(mem.host_bytes) / (1 << 20));
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
  cmd->add_option("-g,--gen", a->n_gen, "tokens to generate")->capture_default_str();
  cmd->add_option("-r,--reps", a->reps, "repetitions (median reported)")->capture_default_str();
  cmd->add_flag("--json", a->json, "print one JSON line per run");
  cmd->callback([a] { perf(*a); });
});

}  // namespace
}  // namespace kvtier::tools
