// The rotation of one pair of a head's dimensions, shared by the kernels
// that apply RoPE (rope_cuda.cu, qkv_split_cuda.cu), so that they write the
// same bf16 values.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace kvtier::cuda {

// (x0, x1) at position pos rotated by the angle pos · inv_freq.
__device__ __forceinline__ void rope_pair(float x0, float x1, int64_t pos, float inv_freq, __nv_bfloat16* y0,
                                          __nv_bfloat16* y1) {
  // sincos of the product in f32 loses digits at 128K positions; the angle
  // is formed in f64 and reduced before the f32 sincos.
  const double a = double(pos) * double(inv_freq);
  const float ar = float(a - 6.283185307179586 * floor(a / 6.283185307179586));
  float sn, cs;
  sincosf(ar, &sn, &cs);
  *y0 = __float2bfloat16(x0 * cs - x1 * sn);
  *y1 = __float2bfloat16(x0 * sn + x1 * cs);
}

}  // namespace kvtier::cuda
