// Internal: the HIGGS halves of quantize/dequantize/score (reference in
// higgs_ref.cpp, fast in higgs_cpu.cpp). Callers go through quant_format.h.
#pragma once
#include <cstdint>

#include "ops/quant/quant_format.h"

namespace kvtier {

void higgs_quantize_ref(const QuantSpec& spec, const float* x, int64_t n_vec, int dim, uint8_t* out);
void higgs_dequantize_ref(const QuantSpec& spec, const uint8_t* in, int64_t n_vec, int dim, float* out);

void higgs_quantize_cpu(const QuantSpec& spec, const float* x, int64_t n_vec, int dim, uint8_t* out);
void higgs_dequantize_cpu(const QuantSpec& spec, const uint8_t* in, int64_t n_vec, int dim, float* out);
void higgs_score_cpu(const QuantSpec& spec, const ScoreParams& params);

}  // namespace kvtier
