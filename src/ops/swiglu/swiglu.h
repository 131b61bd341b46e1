// SwiGLU gate: h = silu(gate) * up, elementwise.
#pragma once
#include <cstdint>

namespace kvtier {

// gate, up, h: [n] f32 (h may alias gate)
void swiglu(const float* gate, const float* up, int64_t n, float* h);
void swiglu_ref(const float* gate, const float* up, int64_t n, float* h);

}  // namespace kvtier
