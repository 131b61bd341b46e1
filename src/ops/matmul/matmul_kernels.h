// The per-ISA kernels of the quantized decode matmul (matmul_cpu.cpp quantizes
// the activations and splits the rows over threads): rows of Q4_0 / Q4_1 /
// Q8_0 weight blocks against activations quantized per 32-block to 8 bits.
//
// Each ISA's kernel lives in its own translation unit with that ISA's target
// flags (matmul_avx2.cpp, matmul_avx512.cpp); this header holds only plain
// data so that no inline code is shared between them.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kvtier {
class ThreadPool;
struct WeightView;
}  // namespace kvtier

namespace kvtier::matmul_kernels {

enum class QType { q8_0, q4_0, q4_1 };

// Weight bytes a kernel takes at once before moving on to the next tokens.
constexpr int64_t kRowBlockBytes = 32 * 1024;

// A weight matrix [n_out, n_in] of 32-value blocks, rows row_bytes apart.
struct QWeights {
  QType type = QType::q8_0;
  const uint8_t* data = nullptr;
  size_t row_bytes = 0;
  int64_t n_out = 0;
  int64_t n_blk = 0;  // blocks per row: n_in / 32
};

// Activations of n_tok tokens, quantized per 32-block: q = round(x / d),
// d = amax / 127 (rounded through f16, as the weights' block scales).
struct QActs {
  const int8_t* q = nullptr;  // [n_tok, n_blk · 32]
  const float* d = nullptr;   // [n_tok, n_blk]
  const float* s = nullptr;   // [n_tok, n_blk] d · Σq rounded through f16 (Q8_1, for Q4_1's m term)
  // d spread for 8-lane block groups (the AVX-512 kernel's two blocks per
  // vector): d8[t, b · 8 + k] = d[t, b].
  const float* d8 = nullptr;  // [n_tok, n_blk · 8]
  int64_t n_tok = 0;
};

// y[t · n_out + r] = row r · token t, for rows [r0, r1) and every token
// (each dot computed alone: the batch does not change a token's result).
using RowsKernel = void (*)(const QWeights& w, const QActs& x, int64_t r0, int64_t r1, float* y);

void rows_avx2(const QWeights& w, const QActs& x, int64_t r0, int64_t r1, float* y);
void rows_avx512(const QWeights& w, const QActs& x, int64_t r0, int64_t r1, float* y);
// The AVX-512 kernel built over SIMDe's portable intrinsics (test builds only).
void rows_avx512_emulated(const QWeights& w, const QActs& x, int64_t r0, int64_t r1, float* y);

// The quantized decode path of matmul_group() with a given kernel (the tests
// run each path): activations quantized once, the rows of all n matrices
// split over the pool.
void matmul_quantized_with(RowsKernel kernel, const WeightView* const* ws, float* const* ys, int n,
                           const float* x, int64_t n_tok, ThreadPool& pool);

}  // namespace kvtier::matmul_kernels
