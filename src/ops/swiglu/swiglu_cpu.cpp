#include <cmath>

#include "ops/swiglu/swiglu.h"

namespace kvtier {

void swiglu(const float* gate, const float* up, int64_t n, float* h) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    h[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

}  // namespace kvtier
