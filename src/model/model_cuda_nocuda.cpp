// make_gpu_model in a build without CUDA: says why it cannot run.
#include "core/status.h"
#include "model/model_cuda.h"

namespace kvtier {

std::unique_ptr<GpuModel> make_gpu_model(const Model&, bool, PrefillGemm) {
  fail("--device cuda: kvtier was built without CUDA (configure with -DKVT_CUDA=ON and nvcc)");
}

}  // namespace kvtier
