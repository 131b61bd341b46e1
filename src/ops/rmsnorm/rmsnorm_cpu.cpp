#include <cmath>

#include "ops/rmsnorm/rmsnorm.h"

namespace kvtier {

void rmsnorm(const float* x, const float* weight, int64_t n_rows, int dim, float eps, float* y) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    float ss = 0;
    for (int i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / float(dim) + eps);
    for (int i = 0; i < dim; ++i) yr[i] = xr[i] * inv * weight[i];
  }
}

}  // namespace kvtier
