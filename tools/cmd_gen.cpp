// kvtier gen: writes benchmark samples as JSONL — Text2JSON-style samples in
// the official {"problem", "answer"} format, MultiNeedle and RULER-style
// samples with their gold — at a target length in the model's tokens. With
// --ids each record also carries the token ids a model is trained on: the
// prompt exactly as `kvtier bench` feeds it (chat template, answer prefix)
// and the reference answer closed by the end-of-turn token.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "bench/jsonl.h"
#include "bench/tasks.h"
#include "bench/text2json_gen.h"
#include "bench/training_ids.h"
#include "bench/needlebench.h"
#include "bench_paths.h"
#include "command.h"
#include "core/status.h"
#include "loader/model_source.h"
#include "options.h"
#include "tokenizer/tokenizer.h"

namespace kvtier::tools {
namespace {

struct GenArgs {
  std::string task = "text2json";
  std::string model = default_model_path();
  std::string data = default_data_root();
  std::string output;
  std::string domain;
  std::string split;
  int64_t tokens = 4096;
  int64_t n = 10;
  uint64_t seed = 1;
  bool ids = false;
};

// The tokenizer of a GGUF file, of a model directory, or of a directory that
// holds only tokenizer.json (+ tokenizer_config.json): a model being trained.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path) && !fs::exists(fs::path(path) / "config.json")) {
    const fs::path json = fs::path(path) / "tokenizer.json", config = fs::path(path) / "tokenizer_config.json";
    KVT_CHECK(fs::exists(json), "gen: '{}' has neither config.json nor tokenizer.json", path);
    return Tokenizer::from_hf(json.string(), fs::exists(config) ? config.string() : "");
  }
  const ModelSource src = open_model_source(path);
  return src.gguf ? Tokenizer::from_gguf(*src.gguf) : Tokenizer::from_hf(src.tokenizer_json, src.tokenizer_config_json);
}

void gen(const GenArgs& a) {
  std::string task = a.task == "text2json" ? "text2json-gen" : a.task;
  if (task == "multineedle" && !a.split.empty()) task = "multineedle-gen";  // the official needles have no split
  if (!a.split.empty()) task += ":" + a.split;
  const std::string base = bench::parse_task_name(task).base;  // checks the split
  KVT_CHECK(a.domain.empty() || base == "text2json-gen", "gen: --domain applies to --task text2json only");
  KVT_CHECK(!a.output.empty(), "gen: need an output file (-o)");
  std::unique_ptr<Tokenizer> tok = load_tokenizer(a.model);
  bench::CountTokens count = [&](const std::string& s) { return static_cast<int64_t>(tok->encode(s, false, false).size()); };
  std::vector<bench::BenchSample> samples;
  if (base == "text2json-gen" && !a.domain.empty()) {
    const auto nb = bench::load_needlebench(a.data + "/needlebench");
    for (int64_t i = 0; i < a.n; ++i) {
      bench::Text2JsonGenOptions o;
      o.target_tokens = a.tokens;
      o.seed = a.seed;
      o.index = i;
      o.domain = a.domain;
      o.split = bench::parse_split(a.split.empty() ? "train" : a.split);
      samples.push_back(bench::make_text2json_sample(o, nb.essays, count));
    }
  } else {
    bench::TaskSource ts{a.data, "", count};
    samples = bench::make_samples(task, a.tokens, a.n, a.seed, ts);
  }
  std::ofstream out(a.output);
  KVT_CHECK(out.good(), "gen: cannot open '{}' for writing", a.output);
  for (const auto& s : samples) {
    nlohmann::ordered_json rec;
    if (s.task == "text2json") {  // the official format, plus id and length
      rec["problem"] = s.prompt;
      rec["answer"] = s.gold["answer"];
    } else {
      rec["task"] = s.task;
      rec["prompt"] = s.prompt;
      rec["answer_prefix"] = s.answer_prefix;
      for (const auto& [k, v] : s.gold.items()) rec[k] = v;
    }
    rec["id"] = s.id;
    rec["n_tokens"] = s.n_tokens;
    rec["reference"] = s.reference;
    if (a.ids) {
      const bench::TrainingIds t = bench::training_ids(*tok, s);
      rec["prompt_ids"] = t.prompt;
      rec["answer_ids"] = t.answer;
    }
    out << rec.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  }
  KVT_CHECK(out.good(), "gen: writing '{}' failed", a.output);
  fmt::print(stderr, "gen: wrote {} {} samples to {}\n", samples.size(), task, a.output);
}

Registration reg(72, [](CLI::App& app) {
  auto a = std::make_shared<GenArgs>();
  auto* cmd = app.add_subcommand("gen", "generate benchmark samples (Text2JSON-style, MultiNeedle, RULER) as JSONL");
  cmd->add_option("--task", a->task,
                  "text2json | multineedle | multineedle-gen | niah_single | niah_multikey | niah_multivalue | niah_multiquery | vt "
                  "| cwe | fwe | longproc-0.5k | longproc-2k")
      ->capture_default_str();
  cmd->add_option("--tokens", a->tokens, "target prompt length in the model's tokens")->capture_default_str();
  cmd->add_option("--n", a->n, "number of samples")->capture_default_str();
  cmd->add_option("--seed", a->seed, "generation seed")->capture_default_str();
  cmd->add_option("--domain", a->domain,
                  "text2json: a domain (official: products, medical, organizations, movies; training: books, "
                  "restaurants, ships, software, athletes, grants; held out: hotels, aircraft, universities, albums, "
                  "patents), 'all' (every domain of the split, by index), or 'generated' (a domain made up per sample: "
                  "kind, fields and keys; train split); default: the split's own by index");
  cmd->add_option("--split", a->split,
                  "train | heldout: the generators' training distribution (varied wording, styles and values; "
                  "multineedle becomes generated needles) or what training never sees (other domains, wording, "
                  "value shapes, essays); default: each task's benchmark form")
      ->check(CLI::IsMember({"train", "heldout"}));
  cmd->add_option("-m,--model", a->model,
                  "model whose tokenizer measures the length (GGUF, model directory, or a directory with tokenizer.json)")
      ->capture_default_str();
  cmd->add_flag("--ids", a->ids, "also write prompt_ids (chat-formatted, as bench feeds it) and answer_ids (reference + end of turn)");
  cmd->add_option("--data", a->data, "benchmark data folder (the repository's data/)")->capture_default_str();
  cmd->add_option("-o,--output", a->output, "output JSONL")->required();
  cmd->callback([a] { gen(*a); });
});

}  // namespace
}  // namespace kvtier::tools
