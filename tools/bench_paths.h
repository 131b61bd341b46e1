// Default location of the benchmark data for the bench tools: the
// repository's data/ (data/README.md: sources, licences, xz storage).
#pragma once
#include <filesystem>
#include <string>

namespace kvtier::tools {

// data/ of the source tree this binary was built from, else ./data (a
// binary moved elsewhere and run from a checkout's root).
inline std::string default_data_root() {
  if (std::filesystem::exists(KVT_DATA_DIR)) return KVT_DATA_DIR;
  return "data";
}

}  // namespace kvtier::tools
