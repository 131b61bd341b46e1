#include <cmath>

#include "ops/swiglu/swiglu.h"

namespace kvtier {

void swiglu_ref(const float* gate, const float* up, int64_t n, float* h) {
  for (int64_t i = 0; i < n; ++i) {
    double g = gate[i];
    h[i] = float(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

}  // namespace kvtier
