// Default location of the shared benchmark data for the bench tools.
#pragma once
#include <filesystem>
#include <string>

namespace kvtier::tools {

// ../shared/data beside the repository: first relative to the working
// directory (the repository root), then beside the source tree this binary
// was built from.
inline std::string default_data_root() {
  if (std::filesystem::exists("../shared/data")) return "../shared/data";
  const std::filesystem::path model = KVT_DEFAULT_MODEL_FALLBACK;  // <repo>/models/cache/<file>
  const auto repo = model.parent_path().parent_path().parent_path();
  return (repo / ".." / "shared" / "data").lexically_normal().string();
}

}  // namespace kvtier::tools
