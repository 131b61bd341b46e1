// What score_rows_cuda.cu and score_lut_cuda.cu share: gqa_rows' softmax
// partials, which a scoring kernel may leave as it writes the scores, the
// span of chunks a row scores, and the lookup tables' vector entries.
#pragma once
#include <cuda_runtime.h>

#include "ops/index_score/index_rows.h"
#include "ops/quant/quant_dev_format.cuh"

namespace kvtier::cuda::score_detail {

// Softmax partials of gqa_rows (its scratch): per (row, query) up to
// kMaxSlices (max, sum of e^(s − max)) pairs, then their counts.
constexpr int kMaxSlices = 256;
struct GqaPartials {
  float2* part;    // [rows · n_q, kMaxSlices]
  int32_t* count;  // [rows · n_q]
};
__host__ __device__ inline GqaPartials gqa_partials(void* scratch, int64_t n_rq) {
  auto* part = static_cast<float2*>(scratch);
  return {part, reinterpret_cast<int32_t*>(part + n_rq * kMaxSlices)};
}

__device__ __forceinline__ void lse_combine(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;
  s = s * __expf(m - mx) + s2 * __expf(m2 - mx);
  m = mx;
}

__device__ __forceinline__ void warp_lse(float& m, float& s) {
  for (int off = 16; off > 0; off >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, off), s2 = __shfl_xor_sync(0xffffffffu, s, off);
    lse_combine(m, s, m2, s2);
  }
}

// The log-sum-exp of (row, query) rq from its partials, on every lane of
// the calling warp (gqa_rows and the fused top-k compute it alike, so their
// aggregates are the same floats).
__device__ __forceinline__ float query_lse(const GqaPartials& gp, int64_t rq, int lane) {
  const int n = gp.count[rq];
  float m = -INFINITY, sum = 0.f;
  for (int i = lane; i < n; i += 32) {
    const float2 v = gp.part[rq * kMaxSlices + i];
    lse_combine(m, sum, v.x, v.y);
  }
  warp_lse(m, sum);
  return m + __logf(sum);
}

// This block's pair for (row, query) rq (slot blockIdx.x of gridDim.x).
__device__ __forceinline__ void put_partial(const GqaPartials& gp, int64_t rq, float m, float s) {
  gp.part[rq * kMaxSlices + blockIdx.x] = make_float2(m, s);
  if (blockIdx.x == 0) gp.count[rq] = int32_t(gridDim.x);
}

// Every thread's running (max, Σ) of queries rq0 .. rq0 + NQ − 1 → the
// block's pairs (all THREADS threads call it).
template <int NQ, int THREADS>
__device__ void block_partials(const GqaPartials& gp, int64_t rq0, float (&lm)[NQ], float (&ls)[NQ]) {
  __shared__ float2 red[THREADS / 32][NQ];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int qi = 0; qi < NQ; ++qi) {
    warp_lse(lm[qi], ls[qi]);
    if (lane == 0) red[warp][qi] = make_float2(lm[qi], ls[qi]);
  }
  __syncthreads();
  if (threadIdx.x < NQ) {
    float m = -INFINITY, sum = 0.f;
    for (int w = 0; w < THREADS / 32; ++w) lse_combine(m, sum, red[w][threadIdx.x].x, red[w][threadIdx.x].y);
    put_partial(gp, rq0 + threadIdx.x, m, sum);
  }
}

// gqa_rows' first pass: every (row, query)'s softmax partials over its
// candidates, into p.scratch (for a scorer that did not leave them).
void gqa_partials_rows(const Exec& x, const GqaRowsParams& p, const float* raw, const StepRanges* ranges);

struct Range {
  int64_t c0, n;  // first chunk scored, chunks scored
};
__device__ __forceinline__ Range score_range(const ScoreRowsParams& p, const StepRanges& r) {
  return p.candidates_only ? Range{r.c_lo, r.c_hi - r.c_lo} : Range{0, r.n_chunk};
}

// The table entry of (code c, group j): its NQ queries' dot products, one
// vector load per token and group.
template <int NQ> struct LutVec;
template <> struct LutVec<1> { using T = float; };
template <> struct LutVec<2> { using T = float2; };
template <> struct LutVec<4> { using T = float4; };
template <int NQ>
__device__ __forceinline__ float lut_get(const typename LutVec<NQ>::T& v, int qi) {
  if constexpr (NQ == 1) return v;
  else return reinterpret_cast<const float*>(&v)[qi];
}

}  // namespace kvtier::cuda::score_detail

namespace kvtier::cuda {

// One launch set of the byte-table scorer (score_lut_cuda.cu) over the rows'
// records of format f (lut_shape(f's spec) must qualify).
struct LutPass {
  int div = 1;                  // > 1: score the meta records c0/div .. (c0 + n − 1)/div of chunks [c0, c0 + n)
  const float* add = nullptr;   // [rows, n_q, add_stride]: added to chunk c0 + i at (c0 + i)/add_div − c0/add_div
  int add_div = 1;
  int64_t add_stride = 0;
  float* out = nullptr;         // [rows, n_q, out_stride], record i of the span at i
  int64_t out_stride = 0;
  float scale = 1.f;            // multiplies (score + add)
  void* gqa_scratch = nullptr;  // leave gqa_rows' softmax partials (n_q > 1)
};
void score_rows_lut(const Exec& x, const ScoreRowsParams& p, const QuantSpec& spec, const DevFormat& f,
                    const float* q, const uint8_t* const* rows, const StepRanges* ranges, const LutPass& lp);

}  // namespace kvtier::cuda
