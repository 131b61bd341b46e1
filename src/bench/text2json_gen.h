// Generator of Text2JSON-style samples in the official format ({"problem",
// "answer"}): instructions and a long text in which 3-20 target entities of
// one domain are described with two asked fields each, among distractors:
// entities of the domain described only by fields that were not asked or by
// one of the two, near-duplicate names, near-duplicate values attributed to
// nothing named, and entities of other domains. Names and values come from
// open-ended generators (value_gen.h), the instructions and the passages
// from varied wordings and styles (text2json_style.h). The held-out split
// has its own domains, wordings, styles, value shapes and filler essays.
// Fully determined by (split, seed, index, target length, domain).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_sample.h"
#include "bench/compose.h"
#include "bench/value_gen.h"

namespace kvtier::bench {

struct Text2JsonGenOptions {
  int64_t target_tokens = 4096;  // of the problem text, in count_tokens' tokenizer
  uint64_t seed = 1;
  int64_t index = 0;  // sample number within the seed
  Split split = Split::train;
  // "": by index over the four official domains (train split) or the
  // held-out domains; "all": by index over every domain of the split;
  // "generated": a domain made up for the sample (train split only); or a
  // domain id of either split (the split still sets wording and values).
  std::string domain;
  int n_targets = 0;  // 0: drawn from [3, cap(target length)]
};

// Domain ids of a split (official ones first in the train split).
std::vector<std::string> text2json_domain_ids(Split s);

// filler_texts: long texts cut into sentences between the entity passages
// (the tools pass the NeedleBench essays: the train split uses those of even
// index, the held-out split those of odd index); must not be empty.
// The sample's gold is {"answer": <JSON list as a string>}; the official
// record is {"problem": prompt, "answer": gold.answer}.
BenchSample make_text2json_sample(const Text2JsonGenOptions& options, const std::vector<std::string>& filler_texts,
                                  const CountTokens& count_tokens);

// Most targets a prompt of this length gets (3 at 1K tokens, 20 from 4K).
int text2json_max_targets(int64_t target_tokens);

}  // namespace kvtier::bench
