#include "bench/tasks.h"

#include "bench/bench_text.h"
#include "bench/jsonl.h"
#include "bench/longproc.h"
#include "bench/longproc_score.h"
#include "bench/needle_gen.h"
#include "bench/needlebench.h"
#include "bench/ruler.h"
#include "bench/text2json_gen.h"
#include "bench/text2json_score.h"
#include "core/status.h"

namespace kvtier::bench {

using nlohmann::json;

std::vector<std::string> task_names() {
  std::vector<std::string> t = {"text2json",     "text2json-gen", "multineedle", "multineedle-gen",
                                "longproc-0.5k", "longproc-2k"};
  t.insert(t.end(), k_ruler_tasks.begin(), k_ruler_tasks.end());
  return t;
}

TaskName parse_task_name(const std::string& task) {
  TaskName t{task, std::nullopt};
  const size_t colon = task.rfind(':');
  if (colon == std::string::npos) return t;
  t.base = task.substr(0, colon);
  t.split = parse_split(task.substr(colon + 1));
  KVT_CHECK(t.base == "text2json-gen" || t.base == "multineedle-gen" || is_ruler_task(t.base),
            "task '{}': only the generated tasks (text2json-gen, multineedle-gen, RULER-style) take a split suffix",
            task);
  return t;
}

std::string score_family(const std::string& full_task) {
  const std::string task = parse_task_name(full_task).base;
  if (task == "text2json" || task == "text2json-gen") return "text2json";
  if (task == "multineedle" || task == "multineedle-gen") return "multineedle";
  if (task == "longproc" || task.rfind("longproc-", 0) == 0) return "longproc";
  if (task == "ruler" || is_ruler_task(task)) return "ruler";
  fail("unknown task '{}' (expected one of: {})", task, join(task_names(), ", "));
}

std::vector<BenchSample> load_text2json_file(const std::string& path) {
  std::vector<BenchSample> out;
  for (const auto& rec : read_jsonl(path)) {
    const std::string where = path + ":" + std::to_string(rec.line);
    BenchSample s;
    s.task = "text2json";
    s.id = rec.value.contains("id") ? rec.value["id"].dump() : "text2json-" + std::to_string(rec.line);
    if (rec.value.contains("id") && rec.value["id"].is_string()) s.id = rec.value["id"].get<std::string>();
    s.prompt = get_string_field(rec.value, "problem", where);
    const std::string answer = get_string_field(rec.value, "answer", where);
    json parsed;
    try {
      parsed = json::parse(answer);
    } catch (const json::parse_error& e) {
      fail("{}: field 'answer' is not a JSON string of a list ({})", where, e.what());
    }
    KVT_CHECK(parsed.is_array(), "{}: field 'answer' must hold a JSON list, got {}", where, parsed.type_name());
    s.gold = {{"answer", answer}};
    s.reference = answer;
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<BenchSample> make_samples(const std::string& full_task, int64_t ctx_tokens, int64_t n, uint64_t seed,
                                      const TaskSource& src) {
  KVT_CHECK(n > 0, "number of samples must be positive, got {}", n);
  const std::string family = score_family(full_task);
  const auto [task, split] = parse_task_name(full_task);
  std::vector<BenchSample> out;
  if (task == "text2json") {
    KVT_CHECK(!src.text2json_file.empty(), "task text2json needs the official file (--text2json-file); "
              "use text2json-gen for generated samples");
    out = load_text2json_file(src.text2json_file);
    if (static_cast<int64_t>(out.size()) > n) out.resize(static_cast<size_t>(n));
    return out;
  }
  if (family == "longproc") {
    const std::string group = task == "longproc" ? "0.5k" : task.substr(9);
    const std::string dir = src.data_root + "/longproc_html_to_tsv";
    const auto tasks = load_longproc_tasks(dir, group);
    const std::string yaml_path = dir + "/prompts.yaml";
    const std::string tmpl = yaml_block_scalar(read_text_file(yaml_path), "USER_PROMPT", yaml_path);
    for (int64_t i = 0; i < n && i < static_cast<int64_t>(tasks.size()); ++i)
      out.push_back(make_longproc_sample(dir, tmpl, tasks[static_cast<size_t>(i)]));
    return out;
  }
  KVT_CHECK(src.count_tokens, "task {} needs a tokenizer to reach its target length", task);
  KVT_CHECK(ctx_tokens > 0, "task {} needs a positive context length, got {}", task, ctx_tokens);
  const NeedleBenchData nb = load_needlebench(src.data_root + "/needlebench");
  for (int64_t i = 0; i < n; ++i) {
    if (task == "text2json-gen") {
      Text2JsonGenOptions o;
      o.target_tokens = ctx_tokens;
      o.seed = seed;
      o.index = i;
      o.split = split.value_or(Split::train);
      out.push_back(make_text2json_sample(o, nb.essays, src.count_tokens));
    } else if (task == "multineedle") {
      out.push_back(make_multineedle_sample(nb, ctx_tokens, seed, i, src.count_tokens));
    } else if (task == "multineedle-gen") {
      out.push_back(make_generated_needle_sample(nb.essays, ctx_tokens, seed, i, split.value_or(Split::train),
                                                 src.count_tokens));
    } else {
      out.push_back(make_ruler_sample(task, nb.essays, ctx_tokens, seed, i, src.count_tokens, split));
    }
  }
  return out;
}

namespace {

std::vector<std::string> string_list(const json& j, const char* what) {
  KVT_CHECK(j.is_array(), "gold '{}' must be a list of strings, got {}", what, j.type_name());
  std::vector<std::string> out;
  for (const auto& e : j) {
    KVT_CHECK(e.is_string(), "gold '{}' must be a list of strings, found {}", what, e.dump());
    out.push_back(e.get<std::string>());
  }
  return out;
}

}  // namespace

SampleScore score_prediction(const std::string& family, std::string_view prediction, const json& gold) {
  SampleScore s;
  if (family == "text2json") {
    KVT_CHECK(gold.contains("answer") && gold["answer"].is_string(), "text2json gold needs a string 'answer'");
    const Text2JsonScore t = score_text2json(prediction, gold["answer"].get<std::string>());
    s.score = t.score;
    s.excluded = t.excluded;
    s.details = {{"matched", t.matched}, {"n_gold", t.n_gold}, {"union", t.union_size}};
    if (!t.note.empty()) s.details["note"] = t.note;
  } else if (family == "multineedle") {
    KVT_CHECK(gold.contains("keywords"), "multineedle gold needs 'keywords'");
    const auto keywords = string_list(gold["keywords"], "keywords");
    s.score = score_multineedle(prediction, keywords);
    json found = json::array();
    for (const auto& k : keywords) found.push_back(contains(prediction, k));
    s.details = {{"found", found}};
  } else if (family == "longproc") {
    KVT_CHECK(gold.contains("gt") && gold["gt"].is_string(), "longproc gold needs a string 'gt'");
    const TsvScore t = score_html_to_tsv(prediction, gold["gt"].get<std::string>());
    s.score = t.f1;
    s.details = {{"precision", t.precision}, {"recall", t.recall}, {"f1", t.f1},
                 {"extraction_rate", t.extracted ? 1.0 : 0.0}};
    if (!t.error.empty()) s.details["error"] = t.error;
  } else if (family == "ruler") {
    KVT_CHECK(gold.contains("outputs"), "ruler gold needs 'outputs'");
    const auto refs = string_list(gold["outputs"], "outputs");
    const std::string metric = gold.value("metric", std::string("all"));
    KVT_CHECK(metric == "all" || metric == "part", "ruler gold 'metric' must be 'all' or 'part', got '{}'", metric);
    s.score = metric == "all" ? ruler_match_all(prediction, refs) : ruler_match_part(prediction, refs);
  } else {
    fail("unknown scorer '{}' (text2json, multineedle, longproc, ruler)", family);
  }
  return s;
}

json aggregate_scores(const std::string& family, const std::vector<SampleScore>& scores) {
  double sum = 0, p = 0, r = 0, x = 0;
  int64_t n = 0, n_excluded = 0;
  for (const auto& s : scores) {
    if (s.excluded) {
      ++n_excluded;
      continue;
    }
    ++n;
    sum += s.score;
    if (family == "longproc") {
      p += s.details.value("precision", 0.0);
      r += s.details.value("recall", 0.0);
      x += s.details.value("extraction_rate", 0.0);
    }
  }
  auto mean = [&](double v) { return n ? 100.0 * v / static_cast<double>(n) : 0.0; };
  json out = {{"score", mean(sum)}, {"n_scored", n}, {"n_excluded", n_excluded}};
  if (family == "longproc") {
    out["f1"] = mean(sum);
    out["precision"] = mean(p);
    out["recall"] = mean(r);
    out["extraction_rate"] = mean(x);
  }
  return out;
}

json gold_from_record(const std::string& family, const json& rec, const std::string& where) {
  if (family == "text2json") return {{"answer", get_string_field(rec, "answer", where)}};
  if (family == "longproc") {
    if (rec.contains("reference_output")) return {{"gt", get_string_field(rec, "reference_output", where)}};
    return {{"gt", get_string_field(rec, "gt", where)}};
  }
  if (family == "multineedle") {
    if (rec.contains("keywords")) {
      KVT_CHECK(rec["keywords"].is_array(), "{}: 'keywords' must be a list of strings", where);
      return {{"keywords", rec["keywords"]}};
    }
    // NeedleBench's gold string: keywords joined by '*', then '#', then the depths.
    const std::string answer = get_string_field(rec, "answer", where);
    const size_t hash = answer.rfind('#');
    KVT_CHECK(hash != std::string::npos, "{}: 'answer' must look like 'kw1*kw2#0*10', got '{}'", where, answer);
    return {{"keywords", split_on(answer.substr(0, hash), "*")}};
  }
  if (family == "ruler") {
    KVT_CHECK(rec.contains("outputs") && rec["outputs"].is_array(), "{}: missing list field 'outputs'", where);
    json g = {{"outputs", rec["outputs"]}};
    if (rec.contains("metric")) g["metric"] = rec["metric"];
    return g;
  }
  fail("unknown scorer '{}'", family);
}

}  // namespace kvtier::bench
