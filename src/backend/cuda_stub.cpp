// The CUDA backend's CPU-only face (STYLE rule 14): the build without nvcc
// links these instead of the .cu files and every entry point says why it
// cannot run.
#include "backend/cuda_device.h"
#include "core/status.h"
#include "gpu/gpu_bench.h"
#include "gpu/gpu_model.h"

namespace kvtier {

int cuda_device_count() { return 0; }

std::string cuda_device_summary() { return "kvtier was built without CUDA (KVT_CUDA=OFF)"; }

std::unique_ptr<GpuModel> make_gpu_model(const Model&) {
  fail("--device cuda: kvtier was built without CUDA (configure with -DKVT_CUDA=ON and nvcc)");
}

namespace gpu {
void run_gpu_bench(const GpuBenchOptions&) {
  fail("gpu-bench: kvtier was built without CUDA (configure with -DKVT_CUDA=ON and nvcc)");
}
}  // namespace gpu

}  // namespace kvtier
