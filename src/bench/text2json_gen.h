// Generator of Text2JSON-style samples in the official format ({"problem",
// "answer"}): the instructions and a long text in which 3-20 target entities of
// one domain (product specifications, medical professionals, organizations,
// movies) are described with two asked fields each, among distractors: other
// entities of the domain described only by fields that were not asked,
// near-duplicate names, near-duplicate values attributed to nothing named, and
// entities of other domains. Fully determined by (seed, index, target length).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_sample.h"
#include "bench/compose.h"

namespace kvtier::bench {

struct Text2JsonGenOptions {
  int64_t target_tokens = 4096;  // of the problem text, in count_tokens' tokenizer
  uint64_t seed = 1;
  int64_t index = 0;          // sample number within the seed
  std::string domain;         // "" (by index), "products", "medical", "organizations", "movies"
  int n_targets = 0;          // 0: drawn from [3, cap(target length)]
};

extern const std::vector<std::string> k_text2json_domains;

// filler_texts: long texts cut into sentences between the entity passages
// (the tools pass the NeedleBench essays); must not be empty.
// The sample's gold is {"answer": <JSON list as a string>}; the official
// record is {"problem": prompt, "answer": gold.answer}.
BenchSample make_text2json_sample(const Text2JsonGenOptions& options, const std::vector<std::string>& filler_texts,
                                  const CountTokens& count_tokens);

// Most targets a prompt of this length gets (3 at 1K tokens, 20 from 4K).
int text2json_max_targets(int64_t target_tokens);

}  // namespace kvtier::bench
