// RMSNorm: y = x / sqrt(mean(x²) + eps) * weight, row by row.
#pragma once
#include <cstdint>

namespace kvtier {

// x, y: [n_rows, dim] f32 (may alias); weight: [dim] f32
void rmsnorm(const float* x, const float* weight, int64_t n_rows, int dim, float eps, float* y);
void rmsnorm_ref(const float* x, const float* weight, int64_t n_rows, int dim, float eps, float* y);

}  // namespace kvtier
