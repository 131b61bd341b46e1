// What CPU-only code may ask about the CUDA backend. Includable without the
// CUDA toolkit: without KVT_CUDA these come from cuda_stub.cpp.
#pragma once
#include <string>

namespace kvtier {

// Number of usable CUDA devices; 0 when the build has no CUDA, the driver is
// missing or cudaGetDeviceCount fails (never throws).
int cuda_device_count();

// One line naming the device 0 (name, memory, SMs) or why there is none.
std::string cuda_device_summary();

}  // namespace kvtier
