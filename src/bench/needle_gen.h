// MultiNeedle-style samples with generated needles, for training and for a
// held-out check: each needle is a made-up fact ("The ruler of the Dravenford
// star system is Kelmora Distane.") whose answer can only be copied from the
// haystack, never recalled from NeedleBench's fixed pool. The train split
// varies the number of needles (5-11), their depths and the wording of the
// instructions and questions (NeedleBench's own wording among them); the
// held-out split has its own fact templates, value shapes, wording and essays.
// Scored like MultiNeedle: the share of answer keywords present.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_sample.h"
#include "bench/compose.h"
#include "bench/value_gen.h"

namespace kvtier::bench {

BenchSample make_generated_needle_sample(const std::vector<std::string>& essays, int64_t target_tokens, uint64_t seed,
                                         int64_t index, Split split, const CountTokens& count_tokens);

}  // namespace kvtier::bench
