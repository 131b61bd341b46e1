// Dequantization of GGUF tensor rows to f32. dequant_ref.cpp is the
// specification (one readable loop per format); dequant_cpu.cpp dispatches to
// it (the hot quantized products live in ops/matmul).
#pragma once
#include <cstdint>

#include "core/ggml_type.h"

namespace kvtier {

// dst[0..n) = values of one row of type `type` starting at `src`. n must be a
// multiple of the type's block size. Throws kvtier::Error for unsupported types.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

// Reference quantizers for the formats the tests and the tiny-model writer
// need to produce (Q4_0, Q4_1, Q8_0, Q8_1; f16/bf16/f32 trivially). Throws for others.
void quantize_row(GgmlType type, const float* src, void* dst, int64_t n);

// The readable reference versions (dequant_ref.cpp): the specification the fast
// paths are tested against. Same contracts as above.
void dequantize_row_ref(GgmlType type, const void* src, float* dst, int64_t n);
void quantize_row_ref(GgmlType type, const float* src, void* dst, int64_t n);

// Whether dequantize_row supports `type` (all types of ggml_type.h except Q8_K).
bool dequant_supported(GgmlType type);

}  // namespace kvtier
