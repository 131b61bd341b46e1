// The per-ISA inner kernel of CPU decode attention (decode_attn_cpu.cpp
// splits the work and calls it): the query heads of one GQA group over a
// list of token slots of one KV row, K and V read in their stored precision
// (bf16 or FP8-E4M3 widened to f32 in registers, or f32: the CPU's dense cache).
//
// Each ISA's kernel lives in its own translation unit compiled with that
// ISA's target flags (decode_attn_avx2.cpp, decode_attn_avx512.cpp); this
// header holds only plain data so that no inline code is shared between them.
#pragma once
#include <cstdint>

namespace kvtier {
enum class CpuPath;  // core/cpu_features.h
struct DecodeAttnParams;
}  // namespace kvtier

namespace kvtier::attn_kernels {

// Tokens whose keys are widened into the scratch tile at once (one online-
// softmax step): 32 × head_dim f32 stays in L1 with the scores.
constexpr int kTile = 32;

struct RowJob {
  const float* q = nullptr;       // [n_qh, head_dim] f32, the group's query heads
  int n_qh = 0;                   // query heads sharing this KV row (the GQA group)
  int head_dim = 0;               // a multiple of 8 (avx2) or 16 (avx512)
  float scale = 0.f;
  bool fp8 = false;               // elements: E4M3 (1 byte), f32 (4 bytes, f32 set) or bf16 (2 bytes)
  bool f32 = false;
  const uint8_t* k = nullptr;     // slot 0 of the row's keys
  const uint8_t* v = nullptr;     // slot 0 of the row's values
  int64_t tok_stride = 0;         // bytes between slots
  const int32_t* idx = nullptr;   // [n_tok] slots (-1: skip), or null: slots 0..n_tok-1
  int64_t n_tok = 0;
  float* out = nullptr;           // [n_qh, head_dim] normalized output (0 when no slot)
  float* max = nullptr;           // [n_qh] max of the scaled scores (-inf when no slot)
  float* sum = nullptr;           // [n_qh] sum of exp(score - max) (0 when no slot)
  float* scratch = nullptr;       // [scratch_floats(n_qh, head_dim)], 64-byte aligned
};

// f32 scratch one job needs: the widened key tile, the query heads scaled,
// the scores/probabilities of a tile, the accumulators and the running max/sum.
// Internal linkage: each translation unit (and ISA) keeps its own copy.
static inline int64_t scratch_floats(int n_qh, int head_dim) {
  return int64_t(kTile) * head_dim + 2 * int64_t(n_qh) * head_dim + int64_t(n_qh) * kTile + 2 * int64_t(n_qh) + 64;
}

// A kernel runs n_jobs ≤ kMaxRowJobs jobs over the same token range (the KV
// heads of a sequence), tile by tile in turn, so that one core reads whole
// token rows; every job's result is what it computes alone.
constexpr int kMaxRowJobs = 16;
using RowKernel = void (*)(const RowJob* jobs, int n_jobs);

// The kernels of each path; avx512's is only called where cpu_supports(avx512).
// row_scalar: any head_dim, plain loops (the fallback and a readable model).
void row_scalar(const RowJob* jobs, int n_jobs);
void row_avx2(const RowJob* jobs, int n_jobs);
void row_avx512(const RowJob* jobs, int n_jobs);
// The AVX-512 kernel built over SIMDe's portable intrinsics (test builds only:
// it runs on machines without AVX-512).
void row_avx512_emulated(const RowJob* jobs, int n_jobs);
void exp_avx512_emulated(const float* x, int64_t n, float* y);

// The kernel of `path` for head_dim (a narrower one where head_dim does not
// fit the path's vector width; row_scalar where none does).
RowKernel row_kernel_for(CpuPath path, int head_dim);

// decode_attn_cpu with a given row kernel (the tests run each path).
void decode_attn_with(RowKernel kernel, const DecodeAttnParams& p, const float* q, const uint8_t* const* rows,
                      const int32_t* idx, float* part_out, float* part_lse);

// e^x on 8 (16) floats, exact to a few ulp, exactly 0 below -87.3 (so -inf
// gives 0): exposed for the kernel tests. x, y: [n] f32.
void exp_avx2(const float* x, int64_t n, float* y);
void exp_avx512(const float* x, int64_t n, float* y);

}  // namespace kvtier::attn_kernels
