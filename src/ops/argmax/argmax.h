// The greedy pick over a row of logits: the first index of the largest
// value, as a scan that moves only to a strictly larger value finds it. A
// NaN never wins; a row whose first value is NaN yields 0.
#pragma once
#include <cstdint>

namespace kvtier {

// x: [n] f32, n >= 1.
int32_t argmax_ref(const float* x, int64_t n);

}  // namespace kvtier
