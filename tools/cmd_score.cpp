// kvtier score: scores a JSONL of predictions against gold with the
// benchmarks' published metrics, without loading any model, so that outputs of
// other systems can be scored the same way.
#include <fmt/format.h>

#include <map>

#include "bench/jsonl.h"
#include "bench/tasks.h"
#include "command.h"
#include "core/status.h"

namespace kvtier::tools {
namespace {

struct ScoreArgs {
  std::string task;
  std::string pred;
  std::string gold;
  std::string missing = "error";
  bool json = false;
};

std::string record_id(const nlohmann::json& r, const std::string& family, int64_t line) {
  if (r.contains("id")) return r["id"].is_string() ? r["id"].get<std::string>() : r["id"].dump();
  // The official Text2JSON file has no ids: records are named by line.
  return family + "-" + std::to_string(line);
}

void score(const ScoreArgs& a) {
  using bench::json;
  const std::string family = bench::score_family(a.task);
  std::map<std::string, json> gold_by_id;
  if (!a.gold.empty()) {
    for (const auto& rec : bench::read_jsonl(a.gold)) {
      const std::string id = record_id(rec.value, family, rec.line);
      const std::string where = a.gold + ":" + std::to_string(rec.line);
      KVT_CHECK(!gold_by_id.count(id), "{}: repeated id '{}'", where, id);
      gold_by_id[id] = bench::gold_from_record(family, rec.value, where);
    }
  }
  std::vector<bench::SampleScore> scores;
  json samples = json::array();
  // A repeated prediction id would be scored twice (and which one counts is
  // ambiguous): refused, naming both lines.
  std::map<std::string, int64_t> pred_line;
  for (const auto& rec : bench::read_jsonl(a.pred)) {
    const std::string where = a.pred + ":" + std::to_string(rec.line);
    const std::string prediction = bench::get_string_field(rec.value, "prediction", where);
    const std::string id = record_id(rec.value, family, rec.line);
    const auto [seen, fresh] = pred_line.emplace(id, rec.line);
    KVT_CHECK(fresh, "{}: id '{}' repeats the prediction of line {} (one prediction per id)", where, id,
              seen->second);
    json gold;
    if (a.gold.empty()) {
      gold = bench::gold_from_record(family, rec.value, where);
    } else {
      auto it = gold_by_id.find(id);
      KVT_CHECK(it != gold_by_id.end(), "{}: id '{}' is not in {}", where, id, a.gold);
      gold = it->second;
    }
    bench::SampleScore s = bench::score_prediction(family, prediction, gold);
    samples.push_back({{"id", id}, {"score", 100.0 * s.score}, {"excluded", s.excluded}, {"details", s.details}});
    scores.push_back(std::move(s));
  }
  // Gold samples without a prediction: an error by default (a partial file
  // would otherwise score as if it were complete); --missing zero counts each
  // as a wrong answer, so that the score is over the whole gold set.
  std::vector<std::string> missing;
  for (const auto& [id, gold] : gold_by_id)
    if (!pred_line.count(id)) missing.push_back(id);
  if (!missing.empty()) {
    std::string some;
    for (size_t i = 0; i < missing.size() && i < 5; ++i) some += (i ? ", " : "") + missing[i];
    if (missing.size() > 5) some += ", ...";
    KVT_CHECK(a.missing == "zero",
              "{} of {} gold samples in {} have no prediction in {} ({}); score them as 0 with --missing zero",
              missing.size(), gold_by_id.size(), a.gold, a.pred, some);
    for (const auto& id : missing) {
      bench::SampleScore s = bench::score_prediction(family, "", gold_by_id[id]);
      s.score = 0;
      samples.push_back({{"id", id}, {"score", 0.0}, {"excluded", s.excluded}, {"missing", true},
                         {"details", s.details}});
      scores.push_back(std::move(s));
    }
  }
  json summary = bench::aggregate_scores(family, scores);
  summary["n_missing"] = int64_t(missing.size());
  if (a.json) {
    fmt::print("{}\n", json{{"task", a.task}, {"metric", family}, {"summary", summary}, {"samples", samples}}.dump());
    return;
  }
  for (const auto& s : samples)
    fmt::print("{}\t{:.2f}{}\n", s["id"].get<std::string>(), s["score"].get<double>(),
               s["excluded"].get<bool>() ? "\t(excluded)" : "");
  fmt::print("{}: {:.2f} over {} samples ({} excluded, {} without a prediction scored 0)\n", a.task,
             summary["score"].get<double>(), summary["n_scored"].get<int64_t>(),
             summary["n_excluded"].get<int64_t>(), missing.size());
  if (family == "longproc")
    fmt::print("precision {:.2f} recall {:.2f} f1 {:.2f} extraction rate {:.2f}\n", summary["precision"].get<double>(),
               summary["recall"].get<double>(), summary["f1"].get<double>(),
               summary["extraction_rate"].get<double>());
}

Registration reg(71, [](CLI::App& app) {
  auto a = std::make_shared<ScoreArgs>();
  auto* cmd = app.add_subcommand("score", "score a JSONL of predictions (id, prediction) against gold");
  cmd->add_option("--task", a->task, "text2json | multineedle | longproc | ruler (or a task name)")->required();
  cmd->add_option("--pred", a->pred, "predictions JSONL: id, prediction, and gold fields unless --gold")
      ->required();
  cmd->add_option("--gold", a->gold,
                  "gold JSONL by id (text2json: answer; multineedle: keywords or answer; longproc: gt; "
                  "ruler: outputs)");
  cmd->add_option("--missing", a->missing,
                  "gold samples without a prediction (with --gold): error (exit 1) or zero (each scores 0)")
      ->check(CLI::IsMember({"error", "zero"}))
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "print the summary and per-sample scores as JSON");
  cmd->callback([a] { score(*a); });
});

}  // namespace
}  // namespace kvtier::tools
