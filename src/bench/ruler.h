// RULER-style synthetic tasks (Hsieh et al., 2024): needle-in-a-haystack
// (single, multi-key, multi-value, multi-query), variable tracking, common-
// and frequent-word extraction, with RULER's prompt templates and its
// string-match metrics.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bench/bench_sample.h"
#include "bench/compose.h"
#include "bench/value_gen.h"

namespace kvtier::bench {

extern const std::vector<std::string> k_ruler_tasks;  // niah_single, niah_multikey, ... cwe, fwe
bool is_ruler_task(const std::string& task);

// essays: haystack texts for the NIAH tasks and the vocabulary of the word
// tasks (the tools pass the NeedleBench essays). The prompt is the user
// message; answer_prefix is where RULER makes the model continue.
// wording: none for RULER's own templates (the benchmark); train draws them
// or one of several paraphrases (the training mix); heldout draws from
// paraphrases training never sees, with NIAH values of another shape and the
// other half of the essays.
BenchSample make_ruler_sample(const std::string& task, const std::vector<std::string>& essays, int64_t target_tokens,
                              uint64_t seed, int64_t index, const CountTokens& count_tokens,
                              std::optional<Split> wording = std::nullopt);

// RULER's postprocessing of a prediction: strip, control characters to '\n', strip.
std::string ruler_postprocess(std::string_view prediction);
// string_match_all: fraction of references contained (case-insensitively).
double ruler_match_all(std::string_view prediction, const std::vector<std::string>& refs);
// string_match_part: 1 if any reference is contained (case-insensitively).
double ruler_match_part(std::string_view prediction, const std::vector<std::string>& refs);

}  // namespace kvtier::bench
