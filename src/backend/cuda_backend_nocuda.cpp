// The CUDA backend's CPU-only face (STYLE rule 14): a build without nvcc links
// this instead of cuda_backend.cu.
#include "backend/cuda_device.h"

namespace kvtier {

int cuda_device_count() { return 0; }

std::string cuda_device_summary() { return "kvtier was built without CUDA (KVT_CUDA=OFF)"; }

}  // namespace kvtier
