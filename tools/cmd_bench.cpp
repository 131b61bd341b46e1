// kvtier bench: accuracy sweeps — tasks x KV policies x context lengths x
// samples with greedy decoding and teacher-forced fidelity to full attention;
// per-sample JSONL (resumable), a summary table with 95 % intervals and an
// optional SVG plot of score and fidelity against GPU KV bytes per token.
#include <fmt/format.h>

#include <fstream>

#include "bench/bench_plot.h"
#include "bench/bench_report.h"
#include "bench/bench_runner.h"
#include "bench/bench_text.h"
#include "bench_paths.h"
#include "command.h"
#include "core/status.h"
#include "options.h"

namespace kvtier::tools {
namespace {

struct BenchArgs {
  EngineOptions engine;
  SamplingParams sampling;
  std::string kv = "full";
  CLI::Option* kv_option = nullptr;
  std::vector<std::string> tasks;
  std::vector<std::string> ctx;
  int64_t n = 5;
  std::string data = default_data_root();
  std::string text2json_file;
  std::string output;
  std::string plot;
  std::string summary;
  std::string fidelity = "on";
  bool no_progress = false;
  bool report_only = false;
  int batch = 1;
};

// "4096", "4k" (= 4096) or "8K".
int64_t parse_length(const std::string& s) {
  KVT_CHECK(!s.empty(), "bench: empty context length");
  int64_t mult = 1;
  std::string digits = s;
  if (s.back() == 'k' || s.back() == 'K') {
    mult = 1024;
    digits.pop_back();
  }
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(digits, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  KVT_CHECK(used == digits.size() && v > 0, "bench: context length '{}' is not a positive integer (or Nk)", s);
  return v * mult;
}

void bench_cmd(BenchArgs& a) {
  bench::BenchConfig c;
  for (const auto& t : a.tasks)
    for (auto& part : bench::split_on(t, ",")) c.tasks.push_back(part);
  for (const auto& t : c.tasks) bench::score_family(t);  // fail early on an unknown task
  for (const auto& x : a.ctx)
    for (auto& part : bench::split_on(x, ",")) c.ctx.push_back(parse_length(part));
  // --kv is repeatable: its values come joined by '\n' (policies contain commas).
  c.policies = bench::split_on(a.kv, "\n");
  c.n_samples = a.n;
  c.seed = a.sampling.seed;
  c.sampling = a.sampling;
  c.output = a.output;
  c.data_root = a.data;
  c.text2json_file = a.text2json_file;
  c.progress = !a.no_progress;
  c.batch = a.batch;
  c.generate = a.fidelity != "only";
  c.fidelity = a.fidelity != "off";
  std::vector<nlohmann::json> records;
  if (a.report_only) {
    records = bench::read_bench_records(c.output);
  } else {
    auto engine = load_engine(a.engine);
    records = bench::run_bench(*engine, c);
  }
  const auto rows = bench::summarize(records);
  const std::string table = bench::summary_markdown(rows);
  fmt::print("{}", table);
  if (!a.summary.empty()) {
    std::ofstream(a.summary) << table;
  }
  if (!a.plot.empty()) {
    std::ofstream f(a.plot);
    KVT_CHECK(f.good(), "bench: cannot write the plot to '{}'", a.plot);
    f << bench::score_vs_memory_svg(rows);
    fmt::print(stderr, "bench: plot written to {}\n", a.plot);
  }
}

Registration reg(70, [](CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  auto* cmd = app.add_subcommand("bench", "accuracy sweep: tasks x KV policies x context lengths x samples");
  add_engine_options(*cmd, a->engine);
  // The engine's --ctx (maximum context) gives way to the list of prompt
  // lengths; the model's own context is the limit here.
  cmd->remove_option(cmd->get_option("--ctx"));
  add_sampling_options(*cmd, a->sampling);
  add_kv_option(*cmd, a->kv);
  cmd->get_option("--kv")->multi_option_policy(CLI::MultiOptionPolicy::Join)->delimiter('\n')->description(
      "KV policy, repeatable: full | shadowkv | yakv | oracle, with overrides (e.g. 'yakv,budget=0.05')");
  cmd->add_option("--task", a->tasks,
                  "task(s), repeatable or comma-separated: text2json-gen, multineedle, text2json (official file), "
                  "longproc-0.5k, longproc-2k, niah_single, niah_multikey, niah_multivalue, niah_multiquery, vt, cwe, fwe")
      ->required();
  cmd->add_option("-c,--ctx", a->ctx, "prompt lengths in tokens, comma-separated (e.g. 2048,4k,8k)");
  cmd->add_option("--n,--samples", a->n, "samples per task and length")->capture_default_str();
  cmd->add_option("--data", a->data, "benchmark data folder (the repository's data/)")->capture_default_str();
  cmd->add_option("--text2json-file", a->text2json_file, "the official Text2JSON JSONL, for task text2json");
  cmd->add_option("-o,--output", a->output, "per-sample JSONL (resumed when it exists)")->required();
  cmd->add_option("--plot", a->plot, "write an SVG plot of score vs GPU KV bytes per token");
  cmd->add_option("--summary", a->summary, "also write the summary table (Markdown) to this file");
  cmd->add_option("--fidelity", a->fidelity,
                  "teacher-forced fidelity to full attention (answer NLL, top-1 agreement, KL): on | off | only "
                  "(only: no generation, no task score)")
      ->check(CLI::IsMember({"on", "off", "only"}))
      ->capture_default_str();
  cmd->add_option("-b,--batch", a->batch,
                  "generations that decode together, one forward pass per step on the CPU (each gets the "
                  "tokens it gets alone)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_flag("--no-progress", a->no_progress, "no progress bar on stderr");
  cmd->add_flag("--report-only", a->report_only, "run nothing: summarize (and plot) the records already in -o");
  cmd->callback([a] { bench_cmd(*a); });
});

}  // namespace
}  // namespace kvtier::tools
