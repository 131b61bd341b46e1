// MultiNeedle (NeedleBench v2 multi-retrieval, English): Paul Graham essays as
// the haystack, 11 needles at depths 0, 10, ..., 100 %, all asked at once;
// score = fraction of the needles' keywords present in the answer.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "bench/bench_sample.h"
#include "bench/compose.h"

namespace kvtier::bench {

struct Needle {
  std::string needle;
  std::string retrieval_question;
  std::string arg1;
  std::string arg2;  // the keyword looked for in the answer
  std::string language;
};

struct NeedleBenchData {
  std::vector<std::string> essays;  // PaulGrahamEssays.jsonl "text", file order
  std::vector<Needle> needles;      // needles.jsonl, file order, all languages
};

// Reads <dir>/PaulGrahamEssays.jsonl and <dir>/needles.jsonl; malformed lines
// are reported with file and line.
NeedleBenchData load_needlebench(const std::string& dir);

// The first n needles of `language` whose arg1, arg2 and (arg1, arg2) were not
// seen before, in file order (NeedleBench's get_unique_entries).
std::vector<Needle> unique_needles(const std::vector<Needle>& all, const std::string& language, size_t n);

// The question block: each question up to its '?', joined by '、', then
// "Please answer in the format of '<formats joined by '、'>'" as NeedleBench
// builds it. Throws for a retrieval_question without '?' or a quoted format.
std::string multineedle_question(const std::vector<Needle>& needles);

// Sample `index`: needles shuffled and essays shuffled with the sample's seed,
// haystack of whole sentences filling the prompt to `target_tokens`.
BenchSample make_multineedle_sample(const NeedleBenchData& data, int64_t target_tokens, uint64_t seed,
                                    int64_t index, const CountTokens& count_tokens);

// Fraction of keywords contained (exact substring) in the prediction.
double score_multineedle(std::string_view prediction, const std::vector<std::string>& keywords);

}  // namespace kvtier::bench
