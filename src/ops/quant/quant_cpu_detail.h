// Internal helpers shared by the fast CPU quantizer files.
#pragma once
#include <array>
#include <cstdint>

#include "ops/quant/quant_format.h"

namespace kvtier {

// The 256 E4M3 values by code (NaN at 0x7f / 0xff).
const float* e4m3_table();
// One record → f32 with the fast paths. in: one record, out: [dim] f32.
void dequantize_one_cpu(const QuantSpec& spec, const uint8_t* in, int dim, float* out);
// Σ a[i]·b[i] over n, AVX2 with f32 accumulation.
float dot_f32(const float* a, const float* b, int n);

}  // namespace kvtier
