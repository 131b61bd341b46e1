#include "bench/text2json_score.h"

#include <map>
#include <nlohmann/json.hpp>

#include "bench/bench_text.h"
#include "core/status.h"

namespace kvtier::bench {

using nlohmann::json;

namespace {

std::string fix_apostrophe(std::string_view s) { return replace_all(s, "\xE2\x80\x99", "'"); }

constexpr double k_missing_penalty = 0.5;  // two fields besides the name
constexpr double k_wrong_penalty = 0.25;   // half of the missing-field penalty

// The predicted value as the evaluator compares it: strings as they are,
// integers (not booleans) as decimal strings; nullopt for other types.
bool comparable_value(const json& v, std::string* out) {
  if (v.is_string()) {
    *out = v.get<std::string>();
    return true;
  }
  if (v.is_number_integer()) {  // covers unsigned too; booleans are not numbers here
    *out = v.dump();
    return true;
  }
  return false;
}

}  // namespace

Text2JsonScore score_text2json(std::string_view prediction, std::string_view gold_answer) {
  Text2JsonScore r;
  json gold;
  try {
    gold = json::parse(gold_answer);
  } catch (const json::parse_error& e) {
    fail("text2json gold answer is not valid JSON: {}", e.what());
  }
  KVT_CHECK(gold.is_array(), "text2json gold answer must be a JSON list, got {}", gold.type_name());
  KVT_CHECK(!gold.empty(), "text2json gold answer is an empty list");
  // name -> the two other fields
  std::map<std::string, std::map<std::string, std::string>> remaining;
  for (size_t i = 0; i < gold.size(); ++i) {
    const json& e = gold[i];
    KVT_CHECK(e.is_object() && e.size() == 3 && e.contains("name"),
              "text2json gold entry {} must be an object with 'name' and two other fields, got {}", i,
              e.dump());
    std::map<std::string, std::string> fields;
    std::string name;
    for (const auto& [key, value] : e.items()) {
      KVT_CHECK(value.is_string(), "text2json gold entry {} field '{}' must be a string, got {}", i, key,
                value.dump());
      if (key == "name") {
        name = fix_apostrophe(value.get<std::string>());
      } else {
        fields[key] = fix_apostrophe(value.get<std::string>());
      }
    }
    if (remaining.count(name)) {
      r.excluded = true;
      r.note = "gold has a repeated name: excluded";
      return r;
    }
    remaining[name] = std::move(fields);
  }
  r.n_gold = static_cast<int64_t>(remaining.size());
  r.union_size = r.n_gold;

  const size_t open = prediction.find('[');
  const size_t close = prediction.find(']');
  if (count_substr(prediction, "[") != 1 || count_substr(prediction, "]") != 1 || open > close) {
    r.note = "prediction needs exactly one '[' and one ']', '[' first";
    return r;
  }
  json pred;
  try {
    pred = json::parse(prediction.substr(open, close - open + 1));
  } catch (const json::parse_error&) {
    r.note = "the bracketed text is not valid JSON";
    return r;
  }
  if (!pred.is_array()) {  // cannot happen with brackets outermost, kept as the rule
    r.note = "the bracketed text is not a JSON list";
    return r;
  }
  for (const json& entry : pred) {
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string()) {
      ++r.union_size;
      continue;
    }
    const std::string name = fix_apostrophe(entry["name"].get<std::string>());
    auto it = remaining.find(name);
    if (it == remaining.end()) {
      ++r.union_size;
      continue;
    }
    double entry_score = 1.0;
    for (const auto& [key, gold_value] : it->second) {
      auto f = entry.find(key);
      if (f == entry.end() || f->is_null()) {
        entry_score -= k_missing_penalty;
        continue;
      }
      std::string value;
      if (!comparable_value(*f, &value) || fix_apostrophe(value) != gold_value) entry_score -= k_wrong_penalty;
    }
    r.matched += entry_score;
    remaining.erase(it);
  }
  r.score = r.matched / static_cast<double>(r.union_size);
  return r;
}

double text2json_benchmark_score(const std::vector<Text2JsonScore>& scores) {
  double sum = 0;
  int64_t n = 0;
  for (const auto& s : scores) {
    if (s.excluded) continue;
    sum += s.score;
    ++n;
  }
  return n ? 100.0 * sum / static_cast<double>(n) : 0.0;
}

}  // namespace kvtier::bench
