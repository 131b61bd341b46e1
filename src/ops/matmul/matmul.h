// Linear layers: y = x · Wᵀ with W stored in a GGUF type.
//
// Decode (few tokens) runs the quantized dot products directly on the weight
// blocks: activations are quantized to 8 bits per 32-block (Q8_0 for Q4_0 and
// Q8_0 weights, Q8_1 for Q4_1), as llama.cpp does, which both halves memory
// traffic and keeps results close to it. Prefill (many tokens) dequantizes the
// weight to f32 in slices and calls OpenBLAS sgemm.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/ggml_type.h"

namespace kvtier {

class ThreadPool;

// A weight matrix [n_out, n_in] in its storage type, rows contiguous.
struct WeightView {
  GgmlType type = GgmlType::F32;
  const void* data = nullptr;
  int64_t n_out = 0;
  int64_t n_in = 0;
  size_t row_bytes = 0;
  const uint8_t* row(int64_t r) const {
    return static_cast<const uint8_t*>(data) + size_t(r) * row_bytes;
  }
};

// Threads of the sgemm calls (OpenBLAS's own pool; prefill's GEMMs and the
// CPU prefill attention); n <= 0 leaves OpenBLAS's default. blas_threads()
// reads the setting back.
void set_blas_threads(int n_threads);
int blas_threads();

// Types matmul runs natively; others must be converted at load (see model).
bool matmul_supports(GgmlType type);

// The most tokens one call takes on the quantized decode path (more go to
// dequantize + sgemm, whose results differ in the last bits). Below it each
// token's product is independent of the others in the call.
int64_t matmul_decode_max_tokens();

// x: [n_tok, n_in] f32, y: [n_tok, n_out] f32.
void matmul(const WeightView& w, const float* x, int64_t n_tok, float* y, ThreadPool& pool);

// Several matrices applied to the same input (q/k/v, gate/up): in decode the
// activations are quantized once and one parallel pass covers all their rows
// (one fork-join instead of n). Same results as n matmul() calls.
// ws[i]: [n_out_i, n_in] (one n_in for all), ys[i]: [n_tok, n_out_i] f32.
void matmul_group(const WeightView* const* ws, float* const* ys, int n, const float* x, int64_t n_tok,
                  ThreadPool& pool);

// Reference: dequantize each row (dequantize_row) and accumulate in f64 with
// the activations in f32 — the specification the fast paths are tested against.
void matmul_ref(const WeightView& w, const float* x, int64_t n_tok, float* y);

// Reference of the quantized-activation path: x quantized per 32-block to
// Q8_0 (or Q8_1 for Q4_1 weights) exactly as the fast path does, then exact
// integer block dots. The fast decode path must match this to float rounding.
void matmul_q8_ref(const WeightView& w, const float* x, int64_t n_tok, float* y);

}  // namespace kvtier
