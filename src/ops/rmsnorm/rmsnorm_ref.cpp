#include <cmath>

#include "ops/rmsnorm/rmsnorm.h"

namespace kvtier {

void rmsnorm_ref(const float* x, const float* weight, int64_t n_rows, int dim, float eps, float* y) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
    const double inv = 1.0 / std::sqrt(ss / dim + eps);
    for (int i = 0; i < dim; ++i) y[r * dim + i] = float(xr[i] * inv * weight[i]);
  }
}

}  // namespace kvtier
