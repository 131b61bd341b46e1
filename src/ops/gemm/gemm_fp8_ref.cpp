#include <cmath>

#include "ops/gemm/gemm_fp8.h"
#include "ops/quant/quant_scalar.h"

namespace kvtier {

void quantize_rows_fp8_ref(const float* x, int64_t rows, int64_t cols, int64_t ld, uint8_t* q, float* scale) {
  if (ld == 0) ld = cols;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ld;
    float amax = 0.f;
    for (int64_t c = 0; c < cols; ++c) amax = std::fmax(amax, std::fabs(xr[c]));
    // The same two f32 operations as the kernel: one division for the
    // multiplier, one for the scale.
    const float mul = amax > 0.f ? kE4m3Max / amax : 1.f;
    scale[r] = amax > 0.f ? amax / kE4m3Max : 1.f;
    for (int64_t c = 0; c < cols; ++c) q[r * cols + c] = f32_to_e4m3_ref(xr[c] * mul);
  }
}

void gemm_fp8_ref(int64_t m, int64_t n, int64_t k, const uint8_t* x_q, const float* x_scale, const uint8_t* w_q,
                  const float* w_scale, float* y) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t c = 0; c < k; ++c) acc += double(e4m3_to_f32(x_q[i * k + c])) * e4m3_to_f32(w_q[j * k + c]);
      y[i * n + j] = float(acc * x_scale[i] * w_scale[j]);
    }
}

}  // namespace kvtier
