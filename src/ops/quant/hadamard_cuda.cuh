// The orthonormal-up-to-scale Walsh–Hadamard transform of 128 values held by
// one warp, lane l owning values 4l..4l+3: index bits 0-1 inside the lane,
// bits 2-6 across lanes by shuffles (Sylvester order, as hadamard.h). The
// result is H_128 · x unnormalized (multiply by 1/√128 for hadamard.h's).
// Device code only (included by .cu files).
#pragma once

namespace kvtier::cuda {

__device__ __forceinline__ void warp_hadamard128(float x[4], int lane) {
  const float a = x[0] + x[1], b = x[0] - x[1], c = x[2] + x[3], d = x[2] - x[3];
  x[0] = a + c;
  x[1] = b + d;
  x[2] = a - c;
  x[3] = b - d;
#pragma unroll
  for (int m = 1; m < 32; m <<= 1)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float o = __shfl_xor_sync(0xffffffffu, x[i], m);
      x[i] = (lane & m) ? o - x[i] : x[i] + o;
    }
}

}  // namespace kvtier::cuda
