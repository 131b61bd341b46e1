// Command-line options of the op benchmarks (kvt_flash_prefill_bench,
// kvt_score_bench): `--name value` pairs and comma-separated lists.
#pragma once
#include <sstream>
#include <string>
#include <vector>

#include "core/status.h"

namespace kvtier {

inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) v.push_back(item);
  return v;
}

// Calls on(name, value) for each `--name value` pair of argv in order; a
// name without a value is an error.
template <class F>
void for_each_option(int argc, char** argv, F&& on) {
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    KVT_CHECK(i + 1 < argc, "{} needs a value", name);
    on(name, std::string(argv[++i]));
  }
}

}  // namespace kvtier
