// The decode step's scoring and selection on the GPU (index_rows.h; the
// CPU versions in index_rows_cpu.cpp are the specification). Rows are
// (sequence, KV head); every kernel reads its row's storage and lengths from
// the row tables and the per-sequence StepRanges, so one launch serves a
// batch of sequences of any lengths, and nothing depends on host values that
// change per step (a captured CUDA graph replays the step).
//
// Scoring kernels:
//  * planar higgs2 (head_dim 128): a per-block lookup table
//    lut[c][j][q] = q_rot[4j..4j+3]·grid[c] turns a token's score into 32
//    shared-memory vector reads, each serving up to 4 queries (product
//    quantization's asymmetric distance); a lane
//    owns a token and reads its 32 code bytes with two 16-byte loads; at step s
//    lane l reads group j = s ^ l, so a warp hits 32 different banks.
//  * dense bf16 / fp8 records (ShadowKV's chunk means, exact keys): lanes of a
//    group each own 16 bytes of a record and reduce by shuffles.
//  * any other record format: a thread per record, decoding it with the
//    device quantizer library (quant_dev.cuh), the query in shared memory.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cub/block/block_scan.cuh>
#include <cooperative_groups.h>

#include "backend/cuda_backend.h"
#include "ops/index_score/index_rows_cuda.h"
#include "ops/quant/quant_dev.cuh"

namespace kvtier::cuda {
namespace {

namespace cg = cooperative_groups;

// ---- step plan

__global__ void step_plan_kernel(StepPlanParams p, const int64_t* __restrict__ n, const int32_t* __restrict__ budget,
                                 const int32_t* __restrict__ n_outlier, StepRanges* __restrict__ out) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= p.n_seq) return;
  StepRanges r;
  r.n = n[s];
  const int64_t n_indexed = r.n / p.unit * p.unit;
  r.n_chunk = n_indexed / p.chunk;
  const int64_t window = max(int64_t(p.local), r.n - n_indexed);
  r.win_lo = min(r.n, max(int64_t(p.sink), r.n - window));
  r.c_lo = min(int64_t(p.sink / p.chunk), r.n_chunk);
  const int64_t open_end = r.n - p.local;
  r.c_hi = open_end > 0 ? min(r.n_chunk, (open_end + p.chunk - 1) / p.chunk) : 0;
  r.c_hi = max(r.c_hi, r.c_lo);
  const int64_t want = max(1, min(budget[s], p.kmax));
  r.k = min(want, r.c_hi - r.c_lo);
  r.n_res = min(r.n, int64_t(p.sink)) + (r.n - r.win_lo);
  r.n_out = n_outlier ? n_outlier[s] : 0;
  r.pad = 0;
  out[s] = r;
}

// ---- the query

__global__ void index_query_kernel(IndexQueryParams p, const __nv_bfloat16* __restrict__ q, float* __restrict__ out) {
  // one block per (seq, kv head, j); blockDim = head_dim (a power of two)
  extern __shared__ float v[];
  const int d = threadIdx.x, hd = blockDim.x;
  const int group = p.n_head / p.n_kv_head, n_q = p.mean_group ? 1 : group;
  const int j = blockIdx.x % n_q;
  const int g = (blockIdx.x / n_q) % p.n_kv_head;
  const int seq = blockIdx.x / (n_q * p.n_kv_head);
  const __nv_bfloat16* qs = q + (int64_t(seq) * p.n_head + int64_t(g) * group) * hd;
  float acc = 0.f;
  if (p.mean_group) {
    for (int h = 0; h < group; ++h) acc += __bfloat162float(qs[h * hd + d]);
    acc /= float(group);
  } else {
    acc = __bfloat162float(qs[j * hd + d]);
  }
  const int G = p.rotate_group;
  if (G > 0 && p.signs) acc *= p.signs[d % G];
  v[d] = acc;
  if (G > 0) {
    for (int len = 1; len < G; len <<= 1) {  // Sylvester-order butterflies within each group
      __syncthreads();
      const float a = v[d], b = v[d ^ len];
      __syncthreads();
      v[d] = (d & len) ? b - a : a + b;
    }
    __syncthreads();
    acc = v[d] * rsqrtf(float(G));
  }
  out[int64_t(blockIdx.x) * hd + d] = acc;
}

// ---- scoring

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

constexpr int kScoreThreads = 512;  // one block per SM (the table fills shared memory): many warps hide its latency

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

// q: [rows, n_q_total, 128]; scores the queries [q0, q0 + NQ) of each row.
template <int NQ>
__global__ void __launch_bounds__(kScoreThreads, 1) higgs2_rows_kernel(ScoreRowsParams p, int q0,
                                                                       const float* __restrict__ q,
                                                                       const uint8_t* const* __restrict__ codes_rows,
                                                                       const uint8_t* const* __restrict__ scale_rows,
                                                                       const StepRanges* __restrict__ ranges,
                                                                       const float* __restrict__ grid,
                                                                       float* __restrict__ scores) {
  using V = typename LutVec<NQ>::T;
  extern __shared__ float lut_f[];  // [256 codes][32 groups][NQ]
  __shared__ float2 red[kScoreThreads / 32][NQ];
  V* lut = reinterpret_cast<V*>(lut_f);
  const int64_t row = blockIdx.y;
  const Range rg = score_range(p, ranges[row / p.n_kv_head]);
  // gqa_rows' partials over this block's tokens (ScoreRowsParams::gqa_scratch).
  const GqaPartials gp = p.gqa_scratch ? gqa_partials(p.gqa_scratch, int64_t(gridDim.y) * p.n_q)
                                       : GqaPartials{nullptr, nullptr};
  auto put_partial = [&](int qi, float m, float s) {
    const int64_t rq = row * p.n_q + q0 + qi;
    gp.part[rq * kMaxSlices + blockIdx.x] = make_float2(m, s);
    if (blockIdx.x == 0) gp.count[rq] = int32_t(gridDim.x);
  };
  if (int64_t(blockIdx.x) * (kScoreThreads / 32) * 32 >= rg.n) {  // no token for this block
    if (gp.part && threadIdx.x < NQ) put_partial(int(threadIdx.x), -INFINITY, 0.f);
    return;
  }
  {
    const int j = threadIdx.x & 31;  // fixed per thread: the stride is a multiple of 32
    float4 qv[NQ];
#pragma unroll
    for (int qi = 0; qi < NQ; ++qi)
      qv[qi] = *reinterpret_cast<const float4*>(q + ((row * p.n_q) + q0 + qi) * 128 + 4 * j);
    for (int e = threadIdx.x; e < 8192; e += kScoreThreads) {
      const float4 g = __ldg(reinterpret_cast<const float4*>(grid) + (e >> 5));
      V v;
#pragma unroll
      for (int qi = 0; qi < NQ; ++qi)
        reinterpret_cast<float*>(&v)[qi] = qv[qi].x * g.x + qv[qi].y * g.y + qv[qi].z * g.z + qv[qi].w * g.w;
      lut[e] = v;
    }
  }
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const uint8_t* codes = codes_rows[row] + rg.c0 * 32;
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(scale_rows[row]) + rg.c0;
  const uint32_t wsel = uint32_t(lane) >> 2, x = uint32_t(lane) & 3;
  const uint32_t bsel = x | ((1 ^ x) << 4) | ((2 ^ x) << 8) | ((3 ^ x) << 12);
  const int64_t warp_id = int64_t(blockIdx.x) * (kScoreThreads / 32) + (threadIdx.x >> 5);
  const int64_t n_warps = int64_t(gridDim.x) * (kScoreThreads / 32);
  auto load = [&](int64_t t, uint4& a, uint4& b, float& scale) {
    a = b = make_uint4(0, 0, 0, 0);
    scale = 0.f;
    if (t < rg.n) {
      a = __ldg(reinterpret_cast<const uint4*>(codes + t * 32));
      b = __ldg(reinterpret_cast<const uint4*>(codes + t * 32) + 1);
      scale = __bfloat162float(__ushort_as_bfloat16(__ldg(scales + t)));
    }
  };
  uint4 na, nb;
  float nscale;
  float lm[NQ], ls[NQ];  // this lane's softmax partials
#pragma unroll
  for (int qi = 0; qi < NQ; ++qi) lm[qi] = -INFINITY, ls[qi] = 0.f;
  const int64_t step = n_warps * 32;
  load(warp_id * 32 + lane, na, nb, nscale);
  for (int64_t t0 = warp_id * 32; t0 < rg.n; t0 += step) {
    const uint4 a = na, b = nb;
    const float scale = nscale;
    load(t0 + step + lane, na, nb, nscale);
    const int64_t t = t0 + lane;
    uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    // w[i] ← w[i ^ wsel] (conditional swaps per bit), then byte k ← byte k ^ x:
    // byte s of the result is code byte s ^ lane.
#pragma unroll
    for (int bit = 1; bit < 8; bit <<= 1) {
      const bool f = (wsel & uint32_t(bit)) != 0;
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (!(i & bit)) {
          const uint32_t lo = w[i], hi = w[i | bit];
          w[i] = f ? hi : lo;
          w[i | bit] = f ? lo : hi;
        }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = __byte_perm(w[i], 0, bsel);
    float acc[NQ];
#pragma unroll
    for (int qi = 0; qi < NQ; ++qi) acc[qi] = 0.f;
#pragma unroll
    for (int s = 0; s < 32; ++s) {
      const uint32_t c = (w[s >> 2] >> (8 * (s & 3))) & 255u;
      const uint32_t at = (c << 5) | (uint32_t(s) ^ uint32_t(lane));
      const V v = lut[at];
#pragma unroll
      for (int qi = 0; qi < NQ; ++qi) acc[qi] += lut_get<NQ>(v, qi);
    }
    if (t < rg.n)
#pragma unroll
      for (int qi = 0; qi < NQ; ++qi) {
        const float v = p.scale * scale * acc[qi];
        scores[(row * p.n_q + q0 + qi) * p.out_stride + t] = v;
        if (gp.part) lse_combine(lm[qi], ls[qi], v, 1.f);
      }
  }
  if (!gp.part) return;
  const int warp = threadIdx.x >> 5;
#pragma unroll
  for (int qi = 0; qi < NQ; ++qi) {
    warp_lse(lm[qi], ls[qi]);
    if (lane == 0) red[warp][qi] = make_float2(lm[qi], ls[qi]);
  }
  __syncthreads();
  if (threadIdx.x < NQ) {
    float m = -INFINITY, sum = 0.f;
    for (int w = 0; w < kScoreThreads / 32; ++w) lse_combine(m, sum, red[w][threadIdx.x].x, red[w][threadIdx.x].y);
    put_partial(int(threadIdx.x), m, sum);
  }
}

__device__ __forceinline__ void unpack16(const uint4& raw, float* v, bool fp8) {
  if (fp8) {
    const uint8_t* b = reinterpret_cast<const uint8_t*>(&raw);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      __nv_fp8_e4m3 f;
      f.__x = b[i];
      v[i] = float(f);
    }
  } else {
    const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 f = __bfloat1622float2(b[i]);
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  }
}

// LANES lanes per record, 16 bytes each; EPL elements per lane (8 bf16 / 16 fp8).
template <bool FP8, int D>
__global__ void __launch_bounds__(256) dense_rows_kernel(ScoreRowsParams p, const float* __restrict__ q,
                                                         const uint8_t* const* __restrict__ rows,
                                                         const StepRanges* __restrict__ ranges,
                                                         float* __restrict__ scores) {
  constexpr int EPL = FP8 ? 16 : 8;
  constexpr int LANES = D / EPL;
  constexpr int RPW = 32 / LANES;  // records per warp per step
  constexpr int UNROLL = 4;
  constexpr int MAXQ = 8;
  const int64_t row = blockIdx.y;
  const Range rg = score_range(p, ranges[row / p.n_kv_head]);
  const int lane = threadIdx.x & 31, sub = lane % LANES, grp = lane / LANES;
  const int64_t rec = FP8 ? D : 2 * D;
  const uint8_t* base = rows[row] + rg.c0 * rec;
  const int64_t warp_global = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t n_warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int q0 = 0; q0 < p.n_q; q0 += MAXQ) {
    const int nq = min(MAXQ, p.n_q - q0);
    float qv[MAXQ][EPL];
#pragma unroll
    for (int qi = 0; qi < MAXQ; ++qi)
#pragma unroll
      for (int i = 0; i < EPL; ++i) qv[qi][i] = qi < nq ? q[(row * p.n_q + q0 + qi) * D + sub * EPL + i] : 0.f;
    for (int64_t t_base = warp_global * RPW * UNROLL; t_base < rg.n; t_base += n_warps * RPW * UNROLL) {
      uint4 raw[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int64_t t = t_base + u * RPW + grp;
        raw[u] = t < rg.n ? __ldg(reinterpret_cast<const uint4*>(base + t * rec) + sub) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        float v[EPL];
        unpack16(raw[u], v, FP8);
        const int64_t t = t_base + u * RPW + grp;
#pragma unroll
        for (int qi = 0; qi < MAXQ; ++qi) {
          if (qi >= nq) break;
          float s = 0.f;
#pragma unroll
          for (int i = 0; i < EPL; ++i) s += qv[qi][i] * v[i];
#pragma unroll
          for (int off = LANES / 2; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
          if (sub == 0 && t < rg.n) scores[(row * p.n_q + q0 + qi) * p.out_stride + t] = p.scale * s;
        }
      }
    }
  }
}

// Any record format: a thread per (row, chunk); the row's queries in shared
// memory, rotated once per block for each format that needs it (HIGGS).
__global__ void __launch_bounds__(128) records_rows_kernel(ScoreRowsParams p, DevFormat f, DevFormat meta,
                                                           const float* __restrict__ q,
                                                           const uint8_t* const* __restrict__ plane0,
                                                           const uint8_t* const* __restrict__ plane1,
                                                           const StepRanges* __restrict__ ranges,
                                                           float* __restrict__ scores) {
  extern __shared__ float qs[];  // [2][n_q, head_dim]: for f, for meta
  float* qm = qs + p.n_q * p.head_dim;
  const int64_t row = blockIdx.y;
  const Range rg = score_range(p, ranges[row / p.n_kv_head]);
  const bool residual = p.layout == IndexRecLayout::residual;
  if (rg.n <= 0 || int64_t(blockIdx.x) * blockDim.x >= rg.n) return;  // uniform per block
  for (int j = threadIdx.x; j < p.n_q; j += blockDim.x) {
    const float* qj = q + (row * p.n_q + j) * p.head_dim;
    dev_rotate_query(f, qj, qs + j * p.head_dim);
    if (residual) dev_rotate_query(meta, qj, qm + j * p.head_dim);
  }
  __syncthreads();
  if (p.seq_scales) f.tensor_scale = p.seq_scales[row / p.n_kv_head];
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rg.n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = rg.c0 + i;
    const uint8_t* rec = plane0[row] + c * f.bytes;
    for (int j = 0; j < p.n_q; ++j) {
      float s = dev_score_rotated(f, qs + j * p.head_dim, rec);
      if (residual) s += dev_score_rotated(meta, qm + j * p.head_dim, plane1[row] + (c / p.m) * meta.bytes);
      scores[(row * p.n_q + j) * p.out_stride + i] = p.scale * s;
    }
  }
}

// ---- GQA aggregation (softmax per query over all chunks, max over the group)

constexpr int kGqaSlices = 32;  // gqa_partial_kernel's blocks per (row, query)
constexpr int kGqaThreads = 256;

__global__ void gqa_partial_kernel(GqaRowsParams p, const float* __restrict__ raw, const StepRanges* __restrict__ ranges,
                                   GqaPartials gp) {
  const int64_t rq = blockIdx.y;  // row · n_q + j
  const int64_t n_tok = ranges[(rq / p.n_q) / p.n_kv_head].n_chunk;
  const float* x = raw + rq * p.in_stride;
  const int64_t per = (n_tok + kGqaSlices - 1) / kGqaSlices;
  const int64_t t0 = int64_t(blockIdx.x) * per, t1 = min(n_tok, t0 + per);
  float m = -INFINITY, sum = 0.f;
  constexpr int U = 4;  // loads in flight per thread
  for (int64_t t = t0 + threadIdx.x; t < t1; t += U * blockDim.x) {
    float v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = t + u * blockDim.x < t1 ? x[t + u * blockDim.x] : -INFINITY;
#pragma unroll
    for (int u = 0; u < U; ++u) lse_combine(m, sum, v[u], 1.f);
  }
  warp_lse(m, sum);
  __shared__ float2 warp[kGqaThreads / 32];
  if ((threadIdx.x & 31) == 0) warp[threadIdx.x / 32] = make_float2(m, sum);
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kGqaThreads / 32; ++w) lse_combine(m, sum, warp[w].x, warp[w].y);
    gp.part[rq * kMaxSlices + blockIdx.x] = make_float2(m, sum);
    if (blockIdx.x == 0) gp.count[rq] = kGqaSlices;
  }
}

__global__ void gqa_max_kernel(GqaRowsParams p, const float* __restrict__ raw, const StepRanges* __restrict__ ranges,
                               GqaPartials gp, float* __restrict__ out) {
  const int64_t row = blockIdx.y;
  const StepRanges r = ranges[row / p.n_kv_head];
  __shared__ float lse[64];
  // Each query's log-sum-exp from its partials, a warp per query.
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int j = warp; j < p.n_q; j += kGqaThreads / 32) {
    const int64_t rq = row * p.n_q + j;
    const int n = gp.count[rq];
    float m = -INFINITY, sum = 0.f;
    for (int i = lane; i < n; i += 32) {
      const float2 v = gp.part[rq * kMaxSlices + i];
      lse_combine(m, sum, v.x, v.y);
    }
    warp_lse(m, sum);
    if (lane == 0) lse[j] = m + __logf(sum);
  }
  __syncthreads();
  const int64_t n_sel = r.c_hi - r.c_lo;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n_sel; i += int64_t(gridDim.x) * blockDim.x) {
    float best = -INFINITY;
    for (int j = 0; j < p.n_q; ++j) best = fmaxf(best, raw[(row * p.n_q + j) * p.in_stride + r.c_lo + i] - lse[j]);
    out[row * p.out_stride + i] = best;
  }
}

// ---- mask, expand, resident list

__global__ void mask_rows_kernel(int64_t n_rows, int n_kv_head, int64_t stride, int n_forced,
                                 const int32_t* __restrict__ forced, const StepRanges* __restrict__ ranges,
                                 float* __restrict__ scores) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_rows * n_forced) return;
  const int64_t r = i / n_forced;
  const StepRanges sr = ranges[r / n_kv_head];
  const int64_t c = forced[i];
  if (c >= sr.c_lo && c < sr.c_hi) scores[r * stride + (c - sr.c_lo)] = -INFINITY;
}

__device__ __forceinline__ bool is_forced(const int32_t* f, int n, int32_t c) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (f[mid] < c) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && f[lo] == c;
}

constexpr int kExpandThreads = 256;

// One block per row: kept tokens counted per chunk, scanned, written
// right-aligned (−1 first), ascending.
__global__ void __launch_bounds__(kExpandThreads) expand_rows_kernel(ExpandRowsParams p,
                                                                      const int32_t* __restrict__ chunks,
                                                                      const int32_t* __restrict__ forced,
                                                                      const StepRanges* __restrict__ ranges,
                                                                      int32_t* __restrict__ tokens) {
  using Scan = cub::BlockScan<int, kExpandThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ int s_total;
  const int64_t r = blockIdx.x;
  const StepRanges sr = ranges[r / p.n_kv_head];
  const int64_t width = int64_t(p.kmax) * p.chunk;
  const int32_t* cr = chunks + r * p.kmax;
  const int32_t* fr = forced ? forced + r * p.n_forced : nullptr;
  int32_t* out = tokens + r * width;
  auto keep = [&](int32_t c, int t) -> bool {
    if (c < 0 || (fr && is_forced(fr, p.n_forced, c))) return false;
    const int64_t tok = int64_t(c) * p.chunk + t;
    return tok >= p.sink && tok < sr.win_lo;
  };
  // Pass 1: the total kept.
  int mine = 0;
  for (int i = threadIdx.x; i < p.kmax; i += kExpandThreads)
    for (int t = 0; t < p.chunk; ++t) mine += keep(cr[i], t);
  int ignore = 0, total = 0;
  Scan(tmp).ExclusiveSum(mine, ignore, total);
  if (threadIdx.x == 0) s_total = total;
  __syncthreads();
  total = s_total;
  for (int64_t i = threadIdx.x; i < width - total; i += kExpandThreads) out[i] = -1;
  // Pass 2: chunk by chunk in order, a block-wide scan of the kept counts.
  int base = int(width - total);
  for (int i0 = 0; i0 < p.kmax; i0 += kExpandThreads) {
    const int i = i0 + threadIdx.x;
    const int32_t c = i < p.kmax ? cr[i] : -1;
    int cnt = 0;
    for (int t = 0; t < p.chunk; ++t) cnt += keep(c, t);
    int before = 0, sum = 0;
    __syncthreads();
    Scan(tmp).ExclusiveSum(cnt, before, sum);
    int at = base + before;
    for (int t = 0; t < p.chunk; ++t)
      if (keep(c, t)) out[at++] = int32_t(int64_t(c) * p.chunk + t);
    base += sum;
  }
}

__global__ void resident_list_kernel(ResidentListParams p, const int32_t* __restrict__ forced,
                                     const StepRanges* __restrict__ ranges, int32_t* __restrict__ slots) {
  // One block per row; thread 0 lists the outliers (at most a few hundred), the rest in parallel.
  const int64_t r = blockIdx.x;
  const StepRanges sr = ranges[r / p.n_kv_head];
  const int64_t n_sink = min(sr.n, int64_t(p.sink)), n_win = sr.n - sr.win_lo;
  int32_t* o = slots + r * p.n_slots;
  for (int64_t j = threadIdx.x; j < p.n_slots; j += blockDim.x) {
    int32_t v = -1;
    if (j < n_sink) v = int32_t(j);
    else if (j < n_sink + n_win) v = int32_t(p.sink + (sr.win_lo + (j - n_sink)) % p.ring);
    o[j] = v;
  }
  __syncthreads();
  if (threadIdx.x == 0 && forced) {
    int64_t j = n_sink + n_win;
    const int n_out = int(sr.n_out / p.chunk);
    for (int i = 0; i < n_out; ++i) {
      const int64_t ch = forced[r * p.n_forced + (p.n_forced - n_out) + i];
      for (int t = 0; t < p.chunk; ++t) {
        const int64_t tok = ch * p.chunk + t;
        if (tok >= p.sink && tok < sr.win_lo) o[j++] = int32_t(p.sink + p.ring + int64_t(i) * p.chunk + t);
      }
    }
  }
}

// ---- top-k (one cluster of 8 blocks per row)
// Block b of a cluster owns a contiguous chunk of the row. Pass p (p = 0, 1,
// 2) builds each block's shared histogram of the next 11/11/10 key bits
// (elements whose higher bits match the prefix found so far); after a cluster
// barrier every block reads all 8 histograms through distributed shared
// memory and picks, identically, the bin that holds the k-th largest. The
// compaction walks the chunk in index order: key > T is taken, key == T for
// the first (k − count(> T)) occurrences of the row.

constexpr int kCluster = 8;
constexpr int kTopThreads = 1024;
constexpr int kWarps = kTopThreads / 32;
constexpr int kPerLane = 16;
constexpr int kWarpSpan = 32 * kPerLane;
constexpr int kTile = kTopThreads * kPerLane;
constexpr int kHistWords = 2048 + 2048 + 1024;

__device__ __forceinline__ uint32_t order_key(float x) {
  uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ uint32_t warp_inclusive_sum(uint32_t v, int lane) {
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const uint32_t u = __shfl_up_sync(0xffffffffu, v, off);
    if (lane >= off) v += u;
  }
  return v;
}

__device__ __forceinline__ void load_tile(const float* __restrict__ src, int len, int warp, int lane,
                                          uint32_t (&keys)[kPerLane]) {
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int off = warp * kWarpSpan + i * 32 + lane;
    keys[i] = off < len ? order_key(src[off]) : 0u;
  }
}

__device__ void select_bin(const cg::cluster_group& cluster, uint32_t* hist, uint32_t* group, int n_bins, int shift,
                           uint32_t prefix, uint32_t remaining, int lane, uint32_t* s_prefix,
                           uint32_t* s_remaining) {
  uint32_t c = 0;
#pragma unroll
  for (int r = 0; r < kCluster; ++r) c += cluster.map_shared_rank(group, r)[31 - lane];
  uint32_t incl = warp_inclusive_sum(c, lane);
  uint32_t excl = incl - c;
  const int g_lane = __ffs(__ballot_sync(0xffffffffu, excl < remaining && incl >= remaining)) - 1;
  remaining -= __shfl_sync(0xffffffffu, excl, g_lane);
  const int per_group = n_bins / 32, per_lane = per_group / 32;
  const int top = (31 - g_lane) * per_group + per_group - 1;
  const int b0 = top - lane * per_lane, b1 = b0 - 1;
  uint32_t c0 = 0, c1 = 0;
#pragma unroll
  for (int r = 0; r < kCluster; ++r) {
    const uint32_t* h = cluster.map_shared_rank(hist, r);
    c0 += h[b0];
    if (per_lane == 2) c1 += h[b1];
  }
  incl = warp_inclusive_sum(c0 + c1, lane);
  excl = incl - c0 - c1;
  if (excl < remaining && incl >= remaining) {
    const bool first = excl + c0 >= remaining;
    *s_prefix = prefix | (uint32_t(first ? b0 : b1) << shift);
    *s_remaining = remaining - excl - (first ? 0u : c0);
  }
}

__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kTopThreads)
    topk_rows_kernel(int n_kv_head, int64_t stride, int kmax, const float* __restrict__ scores,
                     const StepRanges* __restrict__ ranges, int32_t* __restrict__ out) {
  const cg::cluster_group cluster = cg::this_cluster();
  __shared__ uint32_t hist[kHistWords];
  __shared__ uint32_t group[3][32];
  __shared__ uint32_t s_warp[kWarps];
  __shared__ uint32_t s_counts[2];
  __shared__ uint32_t s_base[2];
  __shared__ uint32_t s_prefix, s_remaining;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int rank = int(cluster.block_rank());
  const int64_t row = blockIdx.x / kCluster;
  const StepRanges sr = ranges[row / n_kv_head];
  const int64_t n = sr.c_hi - sr.c_lo;
  const int k = int(min(min(sr.k, int64_t(kmax)), n));
  int32_t* orow = out + row * kmax;
  // Every block of the cluster takes the same branch (the same row's values).
  if (k <= 0 || n <= k) {  // nothing, or everything, is selected
    if (rank == 0)
      for (int i = tid; i < kmax; i += kTopThreads) orow[i] = i < kmax - k ? -1 : int32_t(sr.c_lo + (i - (kmax - k)));
    return;
  }
  if (rank == 0)
    for (int i = tid; i < kmax - k; i += kTopThreads) orow[i] = -1;
  int32_t* osel = orow + (kmax - k);
  const int64_t chunk = ((n + kCluster - 1) / kCluster + 31) & ~int64_t(31);
  const int64_t begin = min(n, rank * chunk), len = min(n, begin + chunk) - begin;
  const float* src = scores + row * stride + begin;
  const int n_tiles = int((len + kTile - 1) / kTile);
  auto tile_len = [&](int t) { return int(min(int64_t(kTile), len - int64_t(t) * kTile)); };
  for (int b = tid; b < kHistWords; b += kTopThreads) hist[b] = 0;
  uint32_t keys[kPerLane];
  if (n_tiles <= 1) load_tile(src, int(len), warp, lane, keys);
  __syncthreads();
  uint32_t prefix = 0, prefix_mask = 0, remaining = uint32_t(k);
  constexpr int kShift[3] = {21, 10, 0}, kBits[3] = {11, 11, 10}, kHistAt[3] = {0, 2048, 4096};
#pragma unroll
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = kShift[pass], n_bins = 1 << kBits[pass];
    uint32_t* h = hist + kHistAt[pass];
    for (int t = 0; t < n_tiles; ++t) {
      if (n_tiles > 1) load_tile(src + int64_t(t) * kTile, tile_len(t), warp, lane, keys);
      const int tl = tile_len(t);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const bool ok = warp * kWarpSpan + i * 32 + lane < tl;
        if (ok && (keys[i] & prefix_mask) == prefix) atomicAdd(&h[(keys[i] >> shift) & (n_bins - 1)], 1u);
      }
    }
    __syncthreads();
    {
      const int per_group = n_bins / 32;
      uint32_t v = 0;
      for (int b = lane; b < per_group; b += 32) v += h[warp * per_group + b];
      v = __reduce_add_sync(0xffffffffu, v);
      if (lane == 0) group[pass][warp] = v;
    }
    cluster.sync();
    if (warp == 0)
      select_bin(cluster, h, group[pass], n_bins, shift, prefix, remaining, lane, &s_prefix, &s_remaining);
    __syncthreads();
    prefix = s_prefix;
    remaining = s_remaining;
    prefix_mask |= uint32_t(n_bins - 1) << shift;
  }
  const uint32_t thr = prefix, need_eq = remaining;
  {
    const uint32_t sel0 = thr >> 21, sel1 = (thr >> 10) & 2047u, sel2 = thr & 1023u;
    uint32_t g = 0;
    for (uint32_t b = tid; b < 2048; b += kTopThreads) g += (b > sel0 ? hist[b] : 0u) + (b > sel1 ? hist[2048 + b] : 0u);
    for (uint32_t b = tid; b < 1024; b += kTopThreads) g += b > sel2 ? hist[4096 + b] : 0u;
    g = __reduce_add_sync(0xffffffffu, g);
    if (lane == 0) s_warp[warp] = g;
    __syncthreads();
    if (warp == 0) {
      g = __reduce_add_sync(0xffffffffu, s_warp[lane]);
      if (lane == 0) {
        s_counts[0] = g;
        s_counts[1] = hist[4096 + sel2];
      }
    }
  }
  cluster.sync();
  if (warp == 0) {
    uint32_t g = 0, e = 0;
    if (lane < rank) {
      const uint32_t* c = cluster.map_shared_rank(s_counts, lane);
      g = c[0];
      e = c[1];
    }
    g = __reduce_add_sync(0xffffffffu, g);
    e = __reduce_add_sync(0xffffffffu, e);
    if (lane == 0) {
      s_base[0] = g;
      s_base[1] = e;
    }
  }
  cluster.sync();
  uint32_t run_gt = s_base[0], run_eq = s_base[1];
  if (s_counts[0] == 0 && (s_counts[1] == 0 || run_eq >= need_eq)) return;
  const uint32_t lt = (1u << lane) - 1u;
  for (int t = 0; t < n_tiles; ++t) {
    if (n_tiles > 1) load_tile(src + int64_t(t) * kTile, tile_len(t), warp, lane, keys);
    const int tl = tile_len(t);
    uint32_t w_gt = 0, w_eq = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const bool ok = warp * kWarpSpan + i * 32 + lane < tl;
      w_gt += __popc(__ballot_sync(0xffffffffu, ok && keys[i] > thr));
      w_eq += __popc(__ballot_sync(0xffffffffu, ok && keys[i] == thr));
    }
    if (lane == 0) s_warp[warp] = (w_gt << 16) | w_eq;
    __syncthreads();
    const uint32_t v = s_warp[lane];
    const uint32_t incl = warp_inclusive_sum(v, lane);
    const uint32_t before = __shfl_sync(0xffffffffu, incl - v, warp), total = __shfl_sync(0xffffffffu, incl, 31);
    uint32_t my_gt = run_gt + (before >> 16), my_eq = run_eq + (before & 0xffffu);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int off = warp * kWarpSpan + i * 32 + lane;
      const bool ok = off < tl, gt = ok && keys[i] > thr, eq = ok && keys[i] == thr;
      const uint32_t m_gt = __ballot_sync(0xffffffffu, gt), m_eq = __ballot_sync(0xffffffffu, eq);
      const uint32_t g = my_gt + __popc(m_gt & lt), e = my_eq + __popc(m_eq & lt);
      if (gt || (eq && e < need_eq)) osel[g + min(e, need_eq)] = int32_t(sr.c_lo + begin + int64_t(t) * kTile + off);
      my_gt += __popc(m_gt);
      my_eq += __popc(m_eq);
    }
    run_gt += total >> 16;
    run_eq += total & 0xffffu;
    __syncthreads();
  }
}

cudaStream_t st(const Exec& x) { return static_cast<cudaStream_t>(x.stream); }

}  // namespace

void step_plan_rows(const Exec& x, const StepPlanParams& p, const int64_t* n, const int32_t* budget_chunks,
                    const int32_t* n_outlier, StepRanges* out) {
  if (p.n_seq <= 0) return;
  step_plan_kernel<<<unsigned((p.n_seq + 127) / 128), 128, 0, st(x)>>>(p, n, budget_chunks, n_outlier, out);
  KVT_CUDA_LAUNCH_CHECK("step_plan_kernel");
}

void index_query_rows(const Exec& x, const IndexQueryParams& p, const void* q_bf16, float* out) {
  KVT_CHECK(p.n_kv_head > 0 && p.n_head % p.n_kv_head == 0, "index_query: n_head {} not a multiple of n_kv_head {}",
            p.n_head, p.n_kv_head);
  KVT_CHECK(p.head_dim >= 2 && p.head_dim <= 1024 && (p.head_dim & (p.head_dim - 1)) == 0,
            "index_query: head_dim {} must be a power of two <= 1024", p.head_dim);
  KVT_CHECK(p.rotate_group == 0 || p.head_dim % p.rotate_group == 0, "index_query: rotation group {}", p.rotate_group);
  const int n_q = p.mean_group ? 1 : p.n_head / p.n_kv_head;
  index_query_kernel<<<unsigned(p.n_seq * p.n_kv_head * n_q), unsigned(p.head_dim), p.head_dim * sizeof(float),
                       st(x)>>>(p, static_cast<const __nv_bfloat16*>(q_bf16), out);
  KVT_CUDA_LAUNCH_CHECK("index_query_kernel");
}

void score_rows(const Exec& x, const ScoreRowsParams& p, const float* q, const uint8_t* const* plane0,
                const uint8_t* const* plane1, const StepRanges* ranges, float* scores) {
  const int64_t n_rows = int64_t(p.n_seq) * p.n_kv_head;
  if (n_rows == 0) return;
  KVT_CHECK(n_rows < 65536, "score_rows: {} rows exceed the grid", n_rows);
  const int n_sm = device_info().n_sm;
  const int64_t max_bx = std::max<int64_t>(1, 8 * int64_t(n_sm) / n_rows + 1);
  if (p.layout == IndexRecLayout::planar_higgs2) {
    KVT_CHECK(p.head_dim == 128 && p.fmt.grid, "score_rows: the planar index is 2-bit HIGGS at head_dim 128");
    // Query subsets of 4, 2, 1 (the table takes 32 KB of shared memory per query).
    for (int q0 = 0; q0 < p.n_q;) {
      const int nq = p.n_q - q0 >= 4 ? 4 : p.n_q - q0 >= 2 ? 2 : 1;
      const size_t smem = size_t(nq) * 256 * 32 * 4;
      // One wave: each block builds its table once (32K entries per query),
      // then scores a long stretch of tokens. Four blocks per SM for every
      // eighth of a row (4,256 blocks at 128K and 8 rows) spent more time
      // building tables than scoring.
      const int64_t per_sm =
          std::max<int64_t>(1, std::min<int64_t>(int64_t(227 * 1024) / int64_t(smem), 2048 / kScoreThreads));
      // Rounded down: one block more than the SMs hold would run alone in a
      // second wave and double the kernel's time (at 8 rows and one 128 KB
      // table per SM, 17 blocks a row made 136 blocks for 132 SMs).
      unsigned bx = unsigned(std::max<int64_t>(1, int64_t(n_sm) * per_sm / n_rows));
      if (p.gqa_scratch) {
        KVT_CHECK(p.n_q > 1 && reinterpret_cast<uintptr_t>(p.gqa_scratch) % 8 == 0,
                  "score_rows: softmax partials are for n_q > 1, in 8-byte aligned scratch");
        bx = std::min<unsigned>(bx, kMaxSlices);
      }
      const dim3 grid(bx, unsigned(n_rows));
      if (nq == 4) {
        static const bool once = [smem] {
          KVT_CUDA_CHECK(cudaFuncSetAttribute(higgs2_rows_kernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
          return true;
        }();
        (void)once;
        higgs2_rows_kernel<4><<<grid, kScoreThreads, smem, st(x)>>>(p, q0, q, plane0, plane1, ranges, p.fmt.grid, scores);
      } else if (nq == 2) {
        static const bool once = [smem] {
          KVT_CUDA_CHECK(cudaFuncSetAttribute(higgs2_rows_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
          return true;
        }();
        (void)once;
        higgs2_rows_kernel<2><<<grid, kScoreThreads, smem, st(x)>>>(p, q0, q, plane0, plane1, ranges, p.fmt.grid, scores);
      } else {
        static const bool once = [smem] {
          KVT_CUDA_CHECK(cudaFuncSetAttribute(higgs2_rows_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
          return true;
        }();
        (void)once;
        higgs2_rows_kernel<1><<<grid, kScoreThreads, smem, st(x)>>>(p, q0, q, plane0, plane1, ranges, p.fmt.grid, scores);
      }
      KVT_CUDA_LAUNCH_CHECK("higgs2_rows_kernel");
      q0 += nq;
    }
    return;
  }
  const QuantKind kind = p.fmt.spec.kind;
  const bool dense = p.layout == IndexRecLayout::records && (kind == QuantKind::bf16 || kind == QuantKind::fp8);
  if (dense) {
    const dim3 grid{unsigned(max_bx), unsigned(n_rows)};
    const bool fp8 = kind == QuantKind::fp8;
    switch (p.head_dim * 2 + (fp8 ? 1 : 0)) {
      case 128: dense_rows_kernel<false, 64><<<grid, 256, 0, st(x)>>>(p, q, plane0, ranges, scores); break;
      case 129: dense_rows_kernel<true, 64><<<grid, 256, 0, st(x)>>>(p, q, plane0, ranges, scores); break;
      case 256: dense_rows_kernel<false, 128><<<grid, 256, 0, st(x)>>>(p, q, plane0, ranges, scores); break;
      case 257: dense_rows_kernel<true, 128><<<grid, 256, 0, st(x)>>>(p, q, plane0, ranges, scores); break;
      case 512: dense_rows_kernel<false, 256><<<grid, 256, 0, st(x)>>>(p, q, plane0, ranges, scores); break;
      case 513: dense_rows_kernel<true, 256><<<grid, 256, 0, st(x)>>>(p, q, plane0, ranges, scores); break;
      default: fail("score_rows: head_dim {} unsupported", p.head_dim);
    }
    KVT_CUDA_LAUNCH_CHECK("dense_rows_kernel");
    return;
  }
  const DevFormat f = make_dev_format(p.fmt);
  const DevFormat meta = p.layout == IndexRecLayout::residual ? make_dev_format(p.meta) : DevFormat{};
  const size_t smem = 2 * size_t(p.n_q) * p.head_dim * 4;
  records_rows_kernel<<<dim3(unsigned(max_bx * 2), unsigned(n_rows)), 128, smem, st(x)>>>(p, f, meta, q, plane0,
                                                                                          plane1, ranges, scores);
  KVT_CUDA_LAUNCH_CHECK("records_rows_kernel");
}

void gqa_rows(const Exec& x, const GqaRowsParams& p, const float* raw, const StepRanges* ranges, float* out) {
  const int64_t n_rows = int64_t(p.n_seq) * p.n_kv_head;
  KVT_CHECK(p.n_q >= 1 && p.n_q <= 64 && n_rows * p.n_q < 65536, "gqa_rows: {} rows of {} queries", n_rows, p.n_q);
  if (n_rows == 0) return;
  KVT_CHECK(p.scratch && reinterpret_cast<uintptr_t>(p.scratch) % 8 == 0, "gqa_rows: needs 8-byte aligned scratch");
  const GqaPartials gp = gqa_partials(p.scratch, n_rows * p.n_q);
  if (!p.partials_ready) {
    gqa_partial_kernel<<<dim3(kGqaSlices, unsigned(n_rows * p.n_q)), kGqaThreads, 0, st(x)>>>(p, raw, ranges, gp);
    KVT_CUDA_LAUNCH_CHECK("gqa_partial_kernel");
  }
  const int64_t bx = std::max<int64_t>(1, 1024 / n_rows);
  gqa_max_kernel<<<dim3(unsigned(bx), unsigned(n_rows)), kGqaThreads, 0, st(x)>>>(p, raw, ranges, gp, out);
  KVT_CUDA_LAUNCH_CHECK("gqa_max_kernel");
}

void mask_rows(const Exec& x, int64_t n_rows, int n_kv_head, int64_t stride, int n_forced, const int32_t* forced,
               const StepRanges* ranges, float* scores) {
  const int64_t n = n_rows * n_forced;
  if (n == 0) return;
  mask_rows_kernel<<<unsigned((n + 255) / 256), 256, 0, st(x)>>>(n_rows, n_kv_head, stride, n_forced, forced, ranges,
                                                                 scores);
  KVT_CUDA_LAUNCH_CHECK("mask_rows_kernel");
}

void topk_rows(const Exec& x, int64_t n_rows, int n_kv_head, int64_t stride, int kmax, const float* scores,
               const StepRanges* ranges, int32_t* out) {
  KVT_CHECK(kmax > 0 && stride > 0 && stride < (int64_t(1) << 31), "topk_rows: kmax {} stride {}", kmax, stride);
  if (n_rows == 0) return;
  KVT_CHECK(n_rows < (int64_t(1) << 31) / kCluster, "topk_rows: {} rows exceed the grid", n_rows);
  topk_rows_kernel<<<unsigned(n_rows * kCluster), kTopThreads, 0, st(x)>>>(n_kv_head, stride, kmax, scores, ranges, out);
  KVT_CUDA_LAUNCH_CHECK("topk_rows_kernel");
}

void expand_rows(const Exec& x, const ExpandRowsParams& p, const int32_t* chunks, const int32_t* forced,
                 const StepRanges* ranges, int32_t* tokens) {
  if (p.n_rows == 0) return;
  expand_rows_kernel<<<unsigned(p.n_rows), kExpandThreads, 0, st(x)>>>(p, chunks, forced, ranges, tokens);
  KVT_CUDA_LAUNCH_CHECK("expand_rows_kernel");
}

void resident_list(const Exec& x, const ResidentListParams& p, const int32_t* forced, const StepRanges* ranges,
                   int32_t* slots) {
  if (p.n_rows == 0 || p.n_slots == 0) return;
  resident_list_kernel<<<unsigned(p.n_rows), 128, 0, st(x)>>>(p, forced, ranges, slots);
  KVT_CUDA_LAUNCH_CHECK("resident_list_kernel");
}

}  // namespace kvtier::cuda
