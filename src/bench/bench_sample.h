// One benchmark item as the runner sees it, whatever the task.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace kvtier::bench {

struct BenchSample {
  std::string task;           // text2json, multineedle, longproc, niah_single, ...
  std::string id;             // unique within the task
  std::string prompt;         // the user message (instructions included)
  std::string answer_prefix;  // text the assistant turn starts with (RULER), may be empty
  // Task-specific gold: text2json {"answer": str}; multineedle {"keywords": [..]};
  // longproc {"gt": str}; ruler {"outputs": [..], "metric": "all"|"part"}.
  nlohmann::json gold;
  int64_t n_tokens = 0;  // prompt length in the generating tokenizer (0: unknown)
  // An answer that scores 100 (what follows answer_prefix): the targets that
  // train the project's long-context model (train/), and a check of the
  // scorers. Empty when the task has none (none is missing today).
  std::string reference;
};

}  // namespace kvtier::bench
