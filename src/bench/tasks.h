// The benchmark tasks behind one interface: building samples (generated or
// loaded from ../shared/data) and scoring a prediction against a sample's gold.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bench/bench_sample.h"
#include "bench/compose.h"
#include "bench/value_gen.h"

namespace kvtier::bench {

// Tasks:
//   text2json       the official file (--text2json-file), ctx ignored
//   text2json-gen   generated Text2JSON-style samples of ctx tokens
//   multineedle     NeedleBench v2 multi-retrieval of ctx tokens
//   multineedle-gen MultiNeedle-style with generated needles (needle_gen.h)
//   longproc-0.5k, longproc-2k   LongProc HTML->TSV (ctx ignored)
//   niah_single, niah_multikey, niah_multivalue, niah_multiquery, vt, cwe, fwe   RULER-style
// The generated tasks (text2json-gen, multineedle-gen, RULER-style) take a
// split suffix: ":train" (the training distribution; text2json-gen and
// multineedle-gen without a suffix are the same) or ":heldout" (domains,
// wordings, value shapes and essays that training never sees). RULER-style
// tasks without a suffix keep RULER's own templates.
std::vector<std::string> task_names();

struct TaskName {
  std::string base;            // without the split suffix
  std::optional<Split> split;  // none: no suffix
};
// Splits off a ":train" / ":heldout" suffix; throws for a suffix on a task
// that has no splits, or an unknown one.
TaskName parse_task_name(const std::string& task);

// The scorer a task uses: text2json, multineedle, longproc or ruler.
std::string score_family(const std::string& task);

struct TaskSource {
  std::string data_root;       // ../shared/data
  std::string text2json_file;  // official JSONL, for task "text2json"
  CountTokens count_tokens;    // the model's tokenizer
};

// Samples 0..n-1 of a task at a target prompt length (tokens of the user message).
std::vector<BenchSample> make_samples(const std::string& task, int64_t ctx_tokens, int64_t n, uint64_t seed,
                                      const TaskSource& source);

// The official Text2JSON JSONL ({"problem", "answer"} per line); ids are
// "text2json-<line>" unless a record has "id". Errors name file and line.
std::vector<BenchSample> load_text2json_file(const std::string& path);

struct SampleScore {
  double score = 0;        // in [0, 1]
  bool excluded = false;   // left out of the task's mean (Text2JSON gold with repeated names)
  nlohmann::json details;  // per-metric values (precision/recall for LongProc...)
};

// Scores one prediction against the gold of a sample of `family`'s format.
SampleScore score_prediction(const std::string& family, std::string_view prediction, const nlohmann::json& gold);

// 100 x mean score over non-excluded samples; also the means of LongProc's
// precision, recall and extraction rate when present.
nlohmann::json aggregate_scores(const std::string& family, const std::vector<SampleScore>& scores);

// Gold in the internal format from a record that carries it inline:
// text2json "answer" (string); multineedle "keywords" (list) or NeedleBench's
// "answer" ("kw1*kw2*...#0*10*..."); longproc "gt" (or "reference_output");
// ruler "outputs" (list) and optional "metric" ("all" or "part").
// Throws naming `where` and the missing field.
nlohmann::json gold_from_record(const std::string& family, const nlohmann::json& record, const std::string& where);

}  // namespace kvtier::bench
