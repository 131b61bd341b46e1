// kvtier analyze: how close each KV policy's selection comes to the oracle.
//
// One prefill with the analysis store (kv/analysis.h): the sequence is driven
// by exact dense attention while every policy gets the same K/V, builds its
// own index and, at every decode step, layer and query head, makes its own
// selection and sparse attention output; these are compared with the oracle
// (exact top-k with the policy's budgets) and with dense attention. Replaying
// all policies against one dense sequence keeps their inputs identical.
// Then, unless --no-greedy, each policy decodes on its own (its attention
// output feeds the model) and its greedy tokens are compared with full attention's.
// The same pass measures the dense attention's entropy and top-3 % mass per
// layer (--attention-only: that alone, no policy).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>

#include "bench/jsonl.h"
#include "bench_paths.h"
#include "command.h"
#include "kv/analysis.h"
#include "kv/policy.h"
#include "options.h"

namespace kvtier::tools {
namespace {

struct AnalyzeArgs {
  EngineOptions engine;
  std::vector<std::string> kv = {"shadowkv", "yakv", "yakv,lm=residual,meta=higgs4,res=1bit,m=8",
                                 "oracle"};
  std::string text_file;
  std::string haystack_file;
  int64_t haystack_tokens = 0;
  std::string question = "What are the main ideas of the essays above?";
  bool raw = false;
  int steps = 32;
  std::string json_out;
  bool no_greedy = false;
  bool attention_only = false;
};

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KVT_CHECK(in.good(), "cannot read {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Paul Graham essays (JSONL, one {"title", "text"} per line) concatenated
// until n_tokens, cut at exactly n_tokens tokens of the model's tokenizer.
std::string haystack(const Engine& engine, const std::string& path, int64_t n_tokens) {
  std::istringstream in(bench::read_text_file(path));  // plain or .xz (data/)
  std::string text, line;
  int64_t line_no = 0;
  std::vector<int32_t> ids;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      fail("{}:{}: not JSON ({})", path, line_no, e.what());
    }
    KVT_CHECK(j.contains("text") && j["text"].is_string(), "{}:{}: expected a string field 'text'",
              path, line_no);
    text += j["text"].get<std::string>();
    ids = engine.tokenize(text, false);
    if (int64_t(ids.size()) >= n_tokens) break;
  }
  KVT_CHECK(int64_t(ids.size()) >= n_tokens, "{} holds only {} tokens, {} asked", path,
            ids.size(), n_tokens);
  ids.resize(size_t(n_tokens));
  return engine.tokenizer().decode(ids);
}

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Dense attention's entropy and top-3 % mass over the decode queries, by
// layer (means over query heads and queries) and in total; printed and returned as JSON.
nlohmann::json attention_report(const AnalysisKv& an, const KvGeometry& g, int64_t n_prompt) {
  auto to_json = [](const AttentionStats& s) {
    return nlohmann::json{{"entropy", s.mean_entropy()},
                          {"norm_entropy", s.mean_norm_entropy()},
                          {"top_mass", s.mean_top_mass()}};
  };
  const auto& by_head = an.attention();
  fmt::print("\ndense attention at decode (means over heads and queries; top {:g} % = {} of {} tokens)\n",
             100 * k_top_mass_fraction, int64_t(std::ceil(k_top_mass_fraction * double(n_prompt))), n_prompt);
  fmt::print("{:>5} {:>9} {:>10} {:>10}\n", "layer", "entropy", "entropy/ln", "top-3% mass");
  nlohmann::json layers = nlohmann::json::array();
  for (int l = 0; l < g.n_layer; ++l) {
    const AttentionStats s = sum_attention(&by_head[size_t(l) * g.n_head], g.n_head);
    fmt::print("{:>5} {:>9.3f} {:>10.3f} {:>10.3f}\n", l, s.mean_entropy(), s.mean_norm_entropy(), s.mean_top_mass());
    nlohmann::json lj = to_json(s);
    nlohmann::json heads = nlohmann::json::array();
    for (int h = 0; h < g.n_head; ++h) heads.push_back(to_json(by_head[size_t(l) * g.n_head + h]));
    lj["heads"] = heads;
    layers.push_back(lj);
  }
  const AttentionStats t = sum_attention(by_head.data(), int(by_head.size()));
  fmt::print("{:>5} {:>9.3f} {:>10.3f} {:>10.3f}\n", "all", t.mean_entropy(), t.mean_norm_entropy(), t.mean_top_mass());
  nlohmann::json out = to_json(t);
  out["top_fraction"] = k_top_mass_fraction;
  out["layers"] = layers;
  return out;
}

void run_analyze(AnalyzeArgs& a) {
  KVT_CHECK(a.text_file.empty() != (a.haystack_tokens == 0),
            "give --text FILE or --haystack N_TOKENS (one of them)");
  KVT_CHECK(a.steps >= 2, "--steps {} must be ≥ 2 (the first token comes from the prefill)",
            a.steps);
  if (a.attention_only) {
    a.kv.clear();
    a.no_greedy = true;
  }
  KVT_CHECK(!a.kv.empty() || a.attention_only, "give at least one --kv policy");
  for (const std::string& p : a.kv) parse_policy(p);  // errors before the model loads
  auto engine = load_engine(a.engine);
  const std::string body = a.text_file.empty()
                               ? haystack(*engine, a.haystack_file, a.haystack_tokens)
                               : read_all(a.text_file);
  std::string text = body;
  if (!a.raw && engine->tokenizer().chat_template() != ChatTemplate::none)
    text = engine->chat_prompt({{"user", body + "\n\n" + a.question}});
  const std::vector<int32_t> prompt = engine->tokenize(text, true);
  const ModelConfig& cfg = engine->config();
  const KvGeometry g{cfg.n_layer, cfg.n_head, cfg.n_kv_head, cfg.head_dim};
  fmt::print(stderr, "[analyze] {}: prompt {} tokens, {} decode steps, {} policies\n",
             engine->model_name(), prompt.size(), a.steps, a.kv.size());

  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = a.steps;
  greedy.ignore_eos = true;

  std::string spec(kAnalysisPrefix);
  for (size_t i = 0; i < a.kv.size(); ++i) spec += (i ? "|" : "") + a.kv[i];
  auto t0 = std::chrono::steady_clock::now();
  auto seq = engine->start(prompt, greedy, spec);
  seq->run([](const std::string&) { return true; });
  const std::vector<int32_t> full_tokens = seq->result().tokens;
  auto* an = dynamic_cast<AnalysisKv*>(&seq->cache());
  KVT_CHECK(an != nullptr, "analyze: the engine did not build the analysis store");
  fmt::print(stderr, "[analyze] analysis pass {:.1f} s ({} decode queries per layer)\n",
             seconds(t0), an->n_decode_queries());

  // Greedy agreement: each policy decodes with its own attention.
  std::vector<double> match(a.kv.size(), -1), prefix(a.kv.size(), -1);
  if (!a.no_greedy) {
    for (size_t i = 0; i < a.kv.size(); ++i) {
      t0 = std::chrono::steady_clock::now();
      GenerationResult r = engine->generate(prompt, greedy, a.kv[i]);
      size_t same = 0, pre = 0;
      bool diverged = false;
      for (size_t j = 0; j < full_tokens.size(); ++j) {
        const bool eq = j < r.tokens.size() && r.tokens[j] == full_tokens[j];
        same += eq;
        if (!eq) diverged = true;
        if (!diverged) ++pre;
      }
      match[i] = double(same) / double(full_tokens.size());
      prefix[i] = double(pre);
      fmt::print(stderr, "[analyze] greedy {}: {}/{} tokens equal to full, common prefix {} ({:.1f} s)\n",
                 a.kv[i], same, full_tokens.size(), pre, seconds(t0));
    }
  }

  nlohmann::json out;
  out["model"] = engine->model_name();
  out["n_prompt"] = prompt.size();
  out["steps"] = a.steps;
  out["n_decode_queries"] = an->n_decode_queries();
  out["geometry"] = {{"n_layer", g.n_layer}, {"n_head", g.n_head}, {"n_kv_head", g.n_kv_head},
                     {"head_dim", g.head_dim}};
  out["full_text"] = seq->result().text;
  if (!a.kv.empty())
    fmt::print("\n{:<46} {:>10} {:>10} {:>8} {:>8} {:>9} {:>8} {:>7} {:>8} {:>7}\n", "policy", "GPU B/tok",
               "host B/tok", "budget", "tok rec", "mass rec", "out err", "reuse", "distinct", "greedy");
  for (size_t i = 0; i < a.kv.size(); ++i) {
    const PolicyAnalysis& pa = an->results()[i];
    const KvFootprint f = plan_footprint(an->policy_plan(i), int64_t(prompt.size()));
    const double reuse = an->policy_stats(i).hit_rate(), distinct = an->distinct_rate(i);
    const HeadMetrics t = pa.total();
    fmt::print("{:<46} {:>10.1f} {:>10.1f} {:>8} {:>8.4f} {:>9.4f} {:>8.4f} {:>7.3f} {:>8.3f} {:>7}\n", a.kv[i],
               f.gpu_bytes_per_token, f.host_bytes_per_token, an->budget_tokens(i), t.mean_token_recall(),
               t.mean_mass_recall(), t.mean_rel_error(), reuse, distinct,
               match[i] < 0 ? "-" : fmt::format("{:.3f}", match[i]));
    nlohmann::json pj;
    pj["policy"] = pa.policy;
    pj["resolved"] = pa.resolved;
    pj["gpu_bytes_per_token"] = f.gpu_bytes_per_token;
    pj["host_bytes_per_token"] = f.host_bytes_per_token;
    pj["gpu_bytes"] = f.gpu_bytes;
    pj["budget_tokens"] = an->budget_tokens(i);
    pj["token_recall"] = t.mean_token_recall();
    pj["mass_recall"] = t.mean_mass_recall();
    pj["rel_error"] = t.mean_rel_error();
    // Share of host (kv head, token) rows the previous decode query of the
    // layer also fetched: the hit rate of the GPU path's reuse buffer.
    pj["reuse_rate"] = reuse;
    // Distinct tokens per (kv head, token) host row: the share a per-token fetch would read.
    pj["distinct_rate"] = distinct;
    if (match[i] >= 0) {
      pj["greedy_match"] = match[i];
      pj["greedy_common_prefix"] = prefix[i];
    }
    nlohmann::json layers = nlohmann::json::array();
    for (int l = 0; l < g.n_layer; ++l) {
      HeadMetrics lm = pa.layer(l, g.n_head);
      nlohmann::json heads = nlohmann::json::array();
      for (int h = 0; h < g.n_head; ++h) {
        const HeadMetrics& m = pa.by_head[size_t(l) * g.n_head + h];
        heads.push_back({{"token_recall", m.mean_token_recall()},
                         {"mass_recall", m.mean_mass_recall()},
                         {"rel_error", m.mean_rel_error()}});
      }
      layers.push_back({{"token_recall", lm.mean_token_recall()},
                        {"mass_recall", lm.mean_mass_recall()},
                        {"rel_error", lm.mean_rel_error()},
                        {"heads", heads}});
    }
    pj["layers"] = layers;
    out["policies"].push_back(pj);
  }
  if (!a.kv.empty()) {
    fmt::print("\nmass recall by layer\n{:>5}", "layer");
    for (size_t i = 0; i < a.kv.size(); ++i) fmt::print(" {:>10}", fmt::format("P{}", i + 1));
    fmt::print("\n");
    for (int l = 0; l < g.n_layer; ++l) {
      fmt::print("{:>5}", l);
      for (size_t i = 0; i < a.kv.size(); ++i)
        fmt::print(" {:>10.4f}", an->results()[i].layer(l, g.n_head).mean_mass_recall());
      fmt::print("\n");
    }
    for (size_t i = 0; i < a.kv.size(); ++i) fmt::print("P{} = {}\n", i + 1, an->results()[i].resolved);
  }
  out["attention"] = attention_report(*an, g, int64_t(prompt.size()));
  if (!a.json_out.empty()) {
    std::ofstream js(a.json_out);
    KVT_CHECK(js.good(), "cannot write {}", a.json_out);
    js << out.dump(1) << "\n";
    fmt::print(stderr, "[analyze] wrote {} (plot: python3 scripts/plot_analysis.py {} out.png)\n",
               a.json_out, a.json_out);
  }
}

Registration reg(50, [](CLI::App& app) {
  auto a = std::make_shared<AnalyzeArgs>();
  auto* cmd = app.add_subcommand(
      "analyze", "compare KV policies' selections with the oracle over a text (recall, error)");
  add_engine_options(*cmd, a->engine);
  add_kv_list_option(*cmd, a->kv);
  cmd->add_option("--text", a->text_file, "text file to analyze");
  cmd->add_option("--haystack", a->haystack_tokens,
                  "analyze this many tokens of Paul Graham essays (see --haystack-file)")
      ->check(CLI::Range(int64_t(16), int64_t(1) << 30));
  a->haystack_file = default_data_root() + "/needlebench/PaulGrahamEssays.jsonl";
  cmd->add_option("--haystack-file", a->haystack_file, "essays, JSONL with a 'text' field")
      ->capture_default_str();
  cmd->add_option("--question", a->question, "question asked after the text (chat models)")
      ->capture_default_str();
  cmd->add_flag("--raw", a->raw, "no chat template and no question: the text alone");
  cmd->add_option("-s,--steps", a->steps, "greedy decode steps")->capture_default_str();
  cmd->add_option("--json", a->json_out, "write per-policy, per-layer, per-head metrics here");
  cmd->add_flag("--no-greedy", a->no_greedy, "skip each policy's own greedy decode");
  cmd->add_flag("--attention-only", a->attention_only,
                "only the dense attention's statistics (entropy, top-3 % mass): no policy, no greedy decode");
  cmd->callback([a] { run_analyze(*a); });
});

}  // namespace
}  // namespace kvtier::tools
