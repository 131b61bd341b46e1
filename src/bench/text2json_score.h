// The Text2JSON metric of "KV Cache Offloading for Context-Intensive Tasks"
// (SPEC.md, Benchmarks), reproduced rule by rule from the authors' evaluator.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier::bench {

struct Text2JsonScore {
  bool excluded = false;   // the gold has a repeated name: left out of the mean
  double score = 0;        // sum of entry scores / union, in [0, 1]
  double matched = 0;      // sum of entry scores
  int64_t n_gold = 0;
  int64_t union_size = 0;  // n_gold + predicted entries that match no remaining gold name
  std::string note;        // why the sample scored 0 before entry matching, if it did
};

// Scores one prediction against the gold answer string (a JSON list of objects
// with exactly three string fields, one of them "name").
//   * exactly one '[' and one ']' in the prediction, '[' first; the text between
//     them (brackets included) must parse as a JSON list — else 0;
//   * a predicted entry without a string "name", or whose name (after ’ -> ')
//     is not among the remaining gold names: union += 1;
//   * otherwise 1 - 0.5 per gold field missing or null - 0.25 per field whose
//     value differs (’ -> ' on both sides; integers as their decimal string),
//     and that gold name is used up, so a repeated name is a false positive.
// Where the authors' Python would raise (an entry that is not an object, a
// field value that is neither string, integer nor null) the entry counts as
// unmatched / the value as differing. JSON extensions Python accepts (NaN,
// Infinity) are rejected like any invalid JSON.
// Throws kvtier::Error when the gold itself is malformed.
Text2JsonScore score_text2json(std::string_view prediction, std::string_view gold_answer);

// 100 x mean over the samples that are not excluded (0 when none remain).
double text2json_benchmark_score(const std::vector<Text2JsonScore>& scores);

}  // namespace kvtier::bench
