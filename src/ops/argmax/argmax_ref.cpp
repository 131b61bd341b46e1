#include "ops/argmax/argmax.h"

namespace kvtier {

int32_t argmax_ref(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return int32_t(best);
}

}  // namespace kvtier
