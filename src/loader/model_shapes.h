// Named shapes of the models the paper and the benchmarks use (from their
// Hugging Face configs): a `shape:NAME` model path opens a source with the
// configuration alone and no weights, for speed and memory runs on random
// weights made on the GPU (`kvtier perf -m shape:llama3.1-8b --device cuda`)
// and for `kvtier memory --shape`.
#pragma once
#include <string>
#include <vector>

#include "kvtier/model_config.h"

namespace kvtier {

inline constexpr const char* kShapePrefix = "shape:";

// Throws kvtier::Error naming the known shapes for an unknown name.
ModelConfig model_shape(const std::string& name);
std::vector<std::string> model_shape_names();

}  // namespace kvtier
