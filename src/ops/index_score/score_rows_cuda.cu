// score_rows and gqa_rows on the GPU (index_rows.h; the CPU versions in
// index_rows_cpu.cpp are the specification): the index's scores per row
// (sequence, KV head) and ShadowKV's GQA aggregation of them. Like every
// kernel of index_rows_cuda.cu, they read each row's storage and lengths
// from the row tables and the per-sequence StepRanges.
//
// Scoring kernels:
//  * planar higgs2 (head_dim 128): a per-block lookup table
//    lut[c][j][q] = q_rot[4j..4j+3]·grid[c] turns a token's score into 32
//    shared-memory vector reads, each serving up to 4 queries (product
//    quantization's asymmetric distance); a lane
//    owns a token and reads its 32 code bytes with two 16-byte loads; at step s
//    lane l reads group j = s ^ l, so a warp hits 32 different banks.
//    PlanarScorer::rotated_table: rows of 32 + R groups instead (R = the
//    lanes of one shared-memory wavefront: 8, 16, 32 for 4, 2, 1 queries; the
//    last R repeat the first) and lane l reads group s + l mod R: still
//    different banks, but a table address is one byte extract and one
//    multiply-add with the step as the load's constant offset, and the code
//    bytes are rotated once per token by whole words and a funnel shift.
//    PlanarScorer::mma (see higgs2_mma_kernel): the codes
//    decoded to the grid's fp16 points and multiplied by the queries on the
//    tensor cores, the codes streamed through a cp.async ring per warp.
//    PlanarScorer::mma16 (the default; higgs2_mma16_kernel): the same
//    products with the tokens as the product's rows, 16 per product, in
//    fewer instructions.
//    With the U4 grid (QuantSpec::uniform_levels, 4 uniform levels per dim)
//    the planes hold four 2-bit codes per byte and u4_imma_kernel scores
//    them in integers (quant_format.h) on the int8 tensor cores, with no
//    grid lookups.
//  * records whose codes fill whole bytes (higgs4/2/1/0.5, 1bit, int1/2/4/8)
//    and residual landmarks of them: the byte-table kernel of
//    score_lut_cuda.cu, the same idea over any such format;
//  * dense bf16 / fp8 records (ShadowKV's chunk means, exact keys): lanes of a
//    group each own 16 bytes of a record and reduce by shuffles.
//  * any other record format: a thread per record, decoding it with the
//    device quantizer library (quant_dev.cuh), the query in shared memory.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda_backend.h"
#include "ops/index_score/index_rows_cuda.h"
#include "ops/index_score/score_rows_cuda.cuh"
#include "ops/quant/quant_dev.cuh"

namespace kvtier::cuda {
namespace {

// ---- scoring

using namespace score_detail;

constexpr int kScoreThreads = 512;  // one block per SM (the table fills shared memory): many warps hide its latency

// The planar table's layout: groups per code row, and the lanes of one
// shared-memory wavefront (128 bytes of NQ-float entries).
template <int NQ, bool ROT>
struct PlanarTable {
  static constexpr int kWave = 128 / (4 * NQ);
  static constexpr int kRow = ROT ? 32 + kWave : 32;
  static constexpr size_t kBytes = size_t(256) * kRow * NQ * 4;
};

// q: [rows, n_q_total, 128]; scores the queries [q0, q0 + NQ) of each row.
template <int NQ, bool ROT>
__global__ void __launch_bounds__(kScoreThreads, 1) higgs2_rows_kernel(ScoreRowsParams p, int q0,
                                                                       const float* __restrict__ q,
                                                                       const uint8_t* const* __restrict__ codes_rows,
                                                                       const uint8_t* const* __restrict__ scale_rows,
                                                                       const StepRanges* __restrict__ ranges,
                                                                       const float* __restrict__ grid,
                                                                       float* __restrict__ scores) {
  using V = typename LutVec<NQ>::T;
  using T = PlanarTable<NQ, ROT>;
  extern __shared__ float lut_f[];  // [256 codes][T::kRow groups][NQ]
  V* lut = reinterpret_cast<V*>(lut_f);
  const int64_t row = blockIdx.y;
  const Range rg = score_range(p, ranges[row / p.n_kv_head]);
  // gqa_rows' partials over this block's tokens (ScoreRowsParams::gqa_scratch).
  const GqaPartials gp = p.gqa_scratch ? gqa_partials(p.gqa_scratch, int64_t(gridDim.y) * p.n_q)
                                       : GqaPartials{nullptr, nullptr};
  if (int64_t(blockIdx.x) * (kScoreThreads / 32) * 32 >= rg.n) {  // no token for this block
    if (gp.part && threadIdx.x < NQ) put_partial(gp, row * p.n_q + q0 + threadIdx.x, -INFINITY, 0.f);
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
      const int c = e >> 5;
      lut[c * T::kRow + j] = v;
      if (ROT && j < T::kWave) lut[c * T::kRow + 32 + j] = v;
    }
  }
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const uint32_t rot = uint32_t(lane) % T::kWave;  // ROT: this lane's first group
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
    float acc[NQ];
#pragma unroll
    for (int qi = 0; qi < NQ; ++qi) acc[qi] = 0.f;
    if constexpr (ROT) {
      // Rotate the 32 code bytes left by rot: whole words (conditional
      // rotations by 1, 2, 4 words), then rot mod 4 bytes across each word
      // pair. Byte s of the result is code byte (s + rot) mod 32, the group
      // that table column s + rot holds.
#pragma unroll
      for (int bit = 1; bit < T::kWave / 4; bit <<= 1) {
        const bool f = ((rot >> 2) & uint32_t(bit)) != 0;
        uint32_t r[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) r[i] = f ? w[(i + bit) & 7] : w[i];
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = r[i];
      }
      const uint32_t sh = 8 * (rot & 3);
      const uint32_t w0 = w[0];
#pragma unroll
      for (int i = 0; i < 8; ++i) w[i] = __funnelshift_r(w[i], i == 7 ? w0 : w[i + 1], sh);
      const V* col = lut + rot;
#pragma unroll
      for (int s = 0; s < 32; ++s) {
        const uint32_t c = __byte_perm(w[s >> 2], 0, 0x4440u | uint32_t(s & 3));
        const V v = col[c * T::kRow + s];
#pragma unroll
        for (int qi = 0; qi < NQ; ++qi) acc[qi] += lut_get<NQ>(v, qi);
      }
    } else {
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
#pragma unroll
      for (int s = 0; s < 32; ++s) {
        const uint32_t c = (w[s >> 2] >> (8 * (s & 3))) & 255u;
        const uint32_t at = (c << 5) | (uint32_t(s) ^ uint32_t(lane));
        const V v = lut[at];
#pragma unroll
        for (int qi = 0; qi < NQ; ++qi) acc[qi] += lut_get<NQ>(v, qi);
      }
    }
    if (t < rg.n)
#pragma unroll
      for (int qi = 0; qi < NQ; ++qi) {
        const float v = p.scale * scale * acc[qi];
        scores[(row * p.n_q + q0 + qi) * p.out_stride + t] = v;
        if (gp.part) lse_combine(lm[qi], ls[qi], v, 1.f);
      }
  }
  if (gp.part) block_partials<NQ, kScoreThreads>(gp, row * p.n_q + q0, lm, ls);
}

// The tensor-core planar scorer: scoresᵀ = Q · Kᵀ by mma.m16n8k16 (f16 in,
// f32 accumulate). A (16 × 16, from registers for the whole row): rows 0–3
// are the up to 4 queries' fp16 high parts, rows 8–11 their low parts (so
// the queries keep 22 bits), the others zero. B (16 × 8): 8 tokens, each
// token's code bytes decoded to the grid's points, which are fp16 values
// (higgs_grid), so the scores equal the table scorers' up to the queries'
// low bits and the order of the f32 sums. The k order is permuted: in step
// kk lane column x = lane % 4 owns group j = 8x + kk, whose 4 dims are its k
// rows 2x, 2x+1, 2x+8, 2x+9 — exactly the B registers of token lane / 4,
// so one 8-byte shared read of the grid point fills them; the lane's code
// bytes of that token are one 8-byte load. The grid sits in shared memory
// 16 times over, copy r at [code][r], so a half-warp's reads hit 16
// different bank pairs.
// Each warp streams its spans of 32 tokens through a ring of kMmaStages
// shared-memory stages by cp.async (codes, and the 16-byte pieces that hold
// the span's scales), kMmaStages − 1 spans ahead of the one it scores: the
// scorer is bound by the bytes in flight, not by its instructions.
constexpr int kMmaThreads = 256;
constexpr int kGridCopies = 16;
constexpr int kMmaTiles = 4;                 // tiles of 8 tokens per span
constexpr int kMmaSpan = 8 * kMmaTiles;      // a warp's tokens per iteration
constexpr int kMmaStages = 4;
constexpr int kStageCodes = kMmaSpan * 32;   // bytes
constexpr int kStageBytes = kStageCodes + 80;  // + the span's 64 scale bytes, 16-byte pieces from below them
constexpr size_t kMmaSmem = size_t(256) * kGridCopies * 8 + size_t(kMmaThreads / 32) * kMmaStages * kStageBytes;

// 16 bytes global → shared, the last 16 − n zero-filled (n = 0: nothing read).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int n) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}

__device__ __forceinline__ uint32_t half2_bits(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x, subnormal results flushed to zero (one MUFU instruction).
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Dims 4(8x + kk) .. 4(8x + kk) + 3 of query qr (zeros when !in), times the
// scores' scale, as fp16 pairs: {high parts of dims 0–1, the low parts they
// leave, high parts of dims 2–3, their low parts} (the queries keep 22 bits).
__device__ __forceinline__ uint4 query_group_parts(const float* qr, bool in, int x, int kk, float scale) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  if (in) v = *reinterpret_cast<const float4*>(qr + 4 * (8 * x + kk));
  v.x *= scale, v.y *= scale, v.z *= scale, v.w *= scale;
  const float4 hi = make_float4(__half2float(__float2half_rn(v.x)), __half2float(__float2half_rn(v.y)),
                                __half2float(__float2half_rn(v.z)), __half2float(__float2half_rn(v.w)));
  return make_uint4(half2_bits(hi.x, hi.y), half2_bits(v.x - hi.x, v.y - hi.y), half2_bits(hi.z, hi.w),
                    half2_bits(v.z - hi.z, v.w - hi.w));
}

// The tensor-core scorers' start (THREADS threads, SPAN tokens a warp at a
// time): the row's range and softmax-partials scratch; false for a block
// with no token (its partials left empty); else the grid's fp16 points in
// shared memory, copy r of code c at g16[c · kGridCopies + r] (the caller
// syncs before reading them).
template <int THREADS, int SPAN>
__device__ __forceinline__ bool mma_scorer_start(const ScoreRowsParams& p, int q0, int nq,
                                                 const StepRanges* __restrict__ ranges, const float* __restrict__ grid,
                                                 uint2* g16, Range& rg, GqaPartials& gp) {
  const int64_t row = blockIdx.y;
  rg = score_range(p, ranges[row / p.n_kv_head]);
  gp = p.gqa_scratch ? gqa_partials(p.gqa_scratch, int64_t(gridDim.y) * p.n_q) : GqaPartials{nullptr, nullptr};
  if (int64_t(blockIdx.x) * (THREADS / 32) * SPAN >= rg.n) {  // no token for this block
    if (gp.part && int(threadIdx.x) < nq) put_partial(gp, row * p.n_q + q0 + threadIdx.x, -INFINITY, 0.f);
    return false;
  }
  for (int e = threadIdx.x; e < 256 * kGridCopies; e += THREADS) {
    const float4 g = __ldg(reinterpret_cast<const float4*>(grid) + e / kGridCopies);
    g16[e] = make_uint2(half2_bits(g.x, g.y), half2_bits(g.z, g.w));
  }
  return true;
}

// One rescale of a lane's running softmax partials (lm, ls) by a span's
// scores (−inf for tokens past the row): their max, then the sum of
// e^(v − max); nothing while every value so far is −inf.
template <int N>
__device__ __forceinline__ void span_partials(float& lm, float& ls, const float (&v)[N]) {
  float mx = lm;
#pragma unroll
  for (int i = 0; i < N; ++i) mx = fmaxf(mx, v[i]);
  if (mx == -INFINITY) return;
  const float l2e = 1.4426950408889634f, off = -mx * l2e;
  float sum = ls * ex2_ftz(fmaf(lm, l2e, off));
#pragma unroll
  for (int i = 0; i < N; ++i) sum += ex2_ftz(fmaf(v[i], l2e, off));
  lm = mx, ls = sum;
}

// A tensor-core scorer block's softmax partials of queries rq0 .. rq0 + nq − 1
// (nq ≤ 4) from its lanes' (lm, ls): the lanes that share a query combine
// theirs by shuffles over the XOR offsets off_lo .. off_hi, then the lane
// with `writes` puts its query q's pair in shared memory and the warps'
// pairs are combined.
template <int THREADS>
__device__ __forceinline__ void mma_block_partials(const GqaPartials& gp, int64_t rq0, int nq, float lm, float ls,
                                                   int off_lo, int off_hi, bool writes, int q) {
  for (int off = off_lo; off <= off_hi; off <<= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, lm, off), s2 = __shfl_xor_sync(0xffffffffu, ls, off);
    lse_combine(lm, ls, m2, s2);
  }
  __shared__ float2 red[THREADS / 32][4];
  if (writes) red[threadIdx.x >> 5][q] = make_float2(lm, ls);
  __syncthreads();
  if (int(threadIdx.x) < nq) {
    float m = -INFINITY, sum = 0.f;
    for (int w = 0; w < THREADS / 32; ++w) lse_combine(m, sum, red[w][threadIdx.x].x, red[w][threadIdx.x].y);
    put_partial(gp, rq0 + threadIdx.x, m, sum);
  }
}

// Scores queries [q0, q0 + nq) of each row, nq ≤ 4.
__global__ void __launch_bounds__(kMmaThreads, 2) higgs2_mma_kernel(ScoreRowsParams p, int q0, int nq,
                                                                   const float* __restrict__ q,
                                                                   const uint8_t* const* __restrict__ codes_rows,
                                                                   const uint8_t* const* __restrict__ scale_rows,
                                                                   const StepRanges* __restrict__ ranges,
                                                                   const float* __restrict__ grid,
                                                                   float* __restrict__ scores) {
  extern __shared__ __align__(16) uint8_t mma_smem[];
  uint2* g16 = reinterpret_cast<uint2*>(mma_smem);  // [code][copy]: the point's 4 dims as two half2
  constexpr int kSpan = kMmaSpan;
  const int64_t row = blockIdx.y;
  Range rg;
  GqaPartials gp;
  if (!mma_scorer_start<kMmaThreads, kSpan>(p, q0, nq, ranges, grid, g16, rg, gp)) return;
  const int lane = threadIdx.x & 31, gr = lane >> 2, xc = lane & 3;
  const bool has_q = gr < nq;  // this lane's A rows gr (high) and gr + 8 (low) hold query gr
  uint32_t a[8][4];
  {
    const float* qr = q + ((row * p.n_q) + q0 + (has_q ? gr : 0)) * 128;
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {  // the scores' scale folded in
      const uint4 h = query_group_parts(qr, has_q, xc, kk, p.scale);
      a[kk][0] = h.x;  // row gr, k 2x, 2x+1
      a[kk][1] = h.y;  // row gr + 8
      a[kk][2] = h.z;  // row gr, k 2x+8, 2x+9
      a[kk][3] = h.w;  // row gr + 8
    }
  }
  __syncthreads();
  // Token offsets are 32-bit (a row holds < 2^30 tokens, launch_planar_mma).
  const int n = int(rg.n);
  const uint8_t* codes = codes_rows[row] + rg.c0 * 32;
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(scale_rows[row]) + rg.c0;
  float* out = scores + (row * p.n_q + q0 + (has_q ? gr : 0)) * p.out_stride + 2 * xc;
  // This lane's grid copy as a shared-memory address: a point is one
  // byte extract, one multiply-add and one load.
  const uint32_t gcopy = uint32_t(__cvta_generic_to_shared(g16)) + uint32_t(lane & (kGridCopies - 1)) * 8u;
  const int warp = int(threadIdx.x >> 5);
  const uint32_t ring = uint32_t(__cvta_generic_to_shared(mma_smem)) + 256u * kGridCopies * 8u +
                        uint32_t(warp * kMmaStages * kStageBytes);
  const int warp_id = int(blockIdx.x) * (kMmaThreads / 32) + warp;
  const int step = int(gridDim.x) * (kMmaThreads / 32) * kSpan;
  // Span w → stage st: lane l copies token w + l's 32 code bytes; lanes 0–4
  // the 16-byte pieces from the one holding token w's scale (zero-filled
  // past the row's end).
  const uintptr_t scales_end = reinterpret_cast<uintptr_t>(scales + n);
  auto issue = [&](int w, int st) {
    const uint32_t dst = ring + uint32_t(st * kStageBytes);
    const int t = w + lane;
    const uint8_t* src = t < n ? codes + int64_t(t) * 32 : codes;
    const int nb = t < n ? 16 : 0;
    cp_async16(dst + lane * 32, src, nb);
    cp_async16(dst + lane * 32 + 16, src + 16, nb);
    if (lane < 5) {
      const uintptr_t piece = (reinterpret_cast<uintptr_t>(scales + w) & ~uintptr_t(15)) + 16 * lane;
      const int left = piece < scales_end ? int(scales_end - piece < 16 ? scales_end - piece : 16) : 0;
      cp_async16(dst + kStageCodes + lane * 16, reinterpret_cast<const void*>(left > 0 ? piece : reinterpret_cast<uintptr_t>(scales)),
                 left);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  float lm = -INFINITY, ls = 0.f;  // softmax partials of query gr over this lane's tokens
  const int w_first = warp_id * kSpan;
#pragma unroll
  for (int s = 0; s < kMmaStages - 1; ++s) issue(w_first + s * step, s);  // spans past the row copy nothing
  int st = 0;
  for (int w0 = w_first; w0 < n; w0 += step) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kMmaStages - 2) : "memory");
    __syncwarp();
    const uint32_t base = ring + uint32_t(st * kStageBytes);
    const uint32_t sbase = base + kStageCodes + uint32_t(reinterpret_cast<uintptr_t>(scales + w0) & 15);
    float v[2 * kMmaTiles];  // this lane's scores: tokens w0 + 8u + 2xc (+1)
#pragma unroll
    for (int u = 0; u < kMmaTiles; ++u) {
      uint32_t cx, cy;  // code bytes 8xc .. 8xc + 7 of token w0 + 8u + gr
      asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(cx), "=r"(cy) : "r"(base + (8 * u + gr) * 32 + 8 * xc));
      uint32_t sc;  // the bf16 scales of tokens w0 + 8u + 2xc, + 1 (2-byte aligned: two loads)
      {
        unsigned short s0, s1;
        asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(s0) : "r"(sbase + 2 * (8 * u + 2 * xc)));
        asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(s1) : "r"(sbase + 2 * (8 * u + 2 * xc) + 2));
        sc = uint32_t(s0) | (uint32_t(s1) << 16);
      }
      float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        const uint32_t cw = kk < 4 ? cx : cy;
        const uint32_t at = gcopy + __byte_perm(cw, 0, 0x4440u | uint32_t(kk & 3)) * (kGridCopies * 8u);
        uint32_t gx, gy;
        asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(gx), "=r"(gy) : "r"(at));
        mma_16816(d, a[kk], gx, gy);
      }
      // d[0], d[1]: the high parts' sums for the two tokens; d[2], d[3] the low parts'.
      v[2 * u] = __uint_as_float(sc << 16) * (d[0] + d[2]);
      v[2 * u + 1] = __uint_as_float(sc & 0xffff0000u) * (d[1] + d[3]);
    }
    __syncwarp();  // every lane has read stage st before it is refilled
    issue(w0 + (kMmaStages - 1) * step, st == 0 ? kMmaStages - 1 : st - 1);
    st = st == kMmaStages - 1 ? 0 : st + 1;
    if (!has_q) continue;
    const bool full = w0 + kSpan <= n;
    float* op = out + w0;
#pragma unroll
    for (int i = 0; i < 2 * kMmaTiles; ++i) {
      const int t = 8 * (i >> 1) + (i & 1);  // token w0 + 2xc + t
      if (full || w0 + 2 * xc + t < n) op[t] = v[i];
      else v[i] = -INFINITY;
    }
    if (gp.part) span_partials(lm, ls, v);  // one rescale per span
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");  // nothing in flight at exit
  if (!gp.part) return;
  // Lanes 4g .. 4g + 3 hold query g's partials.
  mma_block_partials<kMmaThreads>(gp, row * p.n_q + q0, nq, lm, ls, 1, 2, xc == 0 && gr < 4, gr);
}

// PlanarScorer::mma16, the roles of higgs2_mma_kernel turned: A (16 × 16)
// holds 16 tokens' grid points, B (16 × 8) the queries, column 2i query i's
// high part and 2i + 1 its low part. Lane (gr, x) then ends with query x's
// two partial sums of tokens gr and gr + 8: a product serves 16 tokens
// instead of 8 with the same shared-memory reads. The k order is
// higgs2_mma_kernel's: in step kk lane x owns group 8x + kk, its A
// registers are the points of that group in tokens gr and gr + 8.
// Per span this kernel also spends fewer instructions: spans of 64 tokens,
// double-buffered (the next span's cp.async issued before the current one
// is scored), the scales read straight into registers one span ahead, every
// address a per-lane base plus a constant; ≤ 80 registers and 64 KB of
// shared memory, three blocks per SM. Both kernels are bound by the SM's
// L1/shared-memory pipe (ncu, H100, batch 9 at 128K: 88–89 % of its
// throughput; each token reads 256 bytes of grid points from shared memory
// against 34 bytes of codes and scale from HBM); this one takes 0.89× the
// time (bench/results/gpu/batch/README.md, run12).
// TopkKeep pass 1 (gqa_score_topk_rows), a span's epilogue: lane (gr, x)
// holds NQL queries' scores v[e][i] of token w0 + 8i + gr (CONSEC: of token
// w0 + 8gr + i; −inf past the row), the lanes of the same gr the token's
// other queries. A candidate
// (c_lo ≤ chunk < c_hi) that some query scores ≥ its θ (th, +inf for no
// query) is appended to the block's region of the row's kept list: its
// chunk id and every query's score, at slots a shared-memory counter
// (*s_kept) hands out a span at a time.
struct KeepRegion {
  int32_t* ids;    // the block's region: ids[i], scores kept[q · kTopkKeepSlots + i]
  float* kept;
  uint32_t cap;    // its slots
};
__device__ __forceinline__ KeepRegion keep_region(const TopkKeep& k, int64_t row, int n_q) {
  const uint32_t cap = uint32_t(kTopkKeepSlots) / gridDim.x;
  const int64_t at = int64_t(blockIdx.x) * cap;
  return {k.ids + row * kTopkKeepSlots + at, k.kept + row * n_q * kTopkKeepSlots + at, cap};
}
template <int NQL, bool CONSEC>
__device__ __forceinline__ void keep_span(const TopkKeep& k, int64_t row, int n_q, uint32_t* s_kept, int64_t c0,
                                          int w0, const StepRanges* sr, const float (&v)[NQL][8],
                                          const int (&qi)[NQL], const float (&th)[NQL], int lane) {
  const int gr = lane >> 2;
  const int64_t c_lo = sr->c_lo, c_hi = sr->c_hi;  // read here, not held in registers across the spans
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t c = c0 + w0 + (CONSEC ? 8 * gr + i : 8 * i + gr);
    bool reach = false;
#pragma unroll
    for (int e = 0; e < NQL; ++e) reach |= v[e][i] >= th[e];
    if (reach && c >= c_lo && c < c_hi) m |= 1u << i;
  }
  m |= __shfl_xor_sync(0xffffffffu, m, 1);  // any query of the token
  m |= __shfl_xor_sync(0xffffffffu, m, 2);
  const uint32_t cnt = (lane & 3) == 0 ? uint32_t(__popc(m)) : 0u;
  uint32_t incl = cnt;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const uint32_t u = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += u;
  }
  const uint32_t total = __shfl_sync(0xffffffffu, incl, 31);
  if (total == 0) return;
  uint32_t base = lane == 0 ? atomicAdd(s_kept, total) : 0u;
  base = __shfl_sync(0xffffffffu, base, 0) + __shfl_sync(0xffffffffu, incl - cnt, lane & ~3);
  const KeepRegion kr = keep_region(k, row, n_q);  // here, not held in registers across the spans
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    if (!(m >> i & 1u)) continue;
    const uint32_t slot = base + uint32_t(__popc(m & ((1u << i) - 1u)));
    if (slot >= kr.cap) continue;
    if ((lane & 3) == 0) kr.ids[slot] = int32_t(c0 + w0 + (CONSEC ? 8 * gr + i : 8 * i + gr));
#pragma unroll
    for (int e = 0; e < NQL; ++e)
      if (qi[e] >= 0) kr.kept[int64_t(qi[e]) * kTopkKeepSlots + slot] = v[e][i];
  }
}
// A keeping block's count, after its last span (every thread calls it).
__device__ __forceinline__ void keep_finish(const TopkKeep& k, int64_t row, const uint32_t* s_kept) {
  __syncthreads();
  if (threadIdx.x == 0) k.count[row * kTopkKeepMaxBlocks + blockIdx.x] = *s_kept;
}
// Before any early exit of a keeping block: the row's block count, and a
// block without tokens counts none.
__device__ __forceinline__ void keep_start(const TopkKeep& k, int64_t row, bool has_tokens, uint32_t* s_kept) {
  if (threadIdx.x == 0) {
    *s_kept = 0;
    if (blockIdx.x == 0) k.nblk[row] = int32_t(gridDim.x);
    if (!has_tokens) k.count[row * kTopkKeepMaxBlocks + blockIdx.x] = 0;
  }
}

constexpr int k16Threads = 256;
constexpr int k16Span = 64;                             // a warp's tokens per iteration
constexpr int k16StageBytes = (k16Span + k16Span / 8) * 32;  // codes: 8 tokens, then 32 bytes of padding
constexpr int k16CopyStep = (16 + 2) * 32;  // a warp's cp.async round: 16 tokens and their 2 paddings
constexpr size_t k16Smem = size_t(256) * kGridCopies * 8 + size_t(k16Threads / 32) * 2 * k16StageBytes;

// BY_ID (ScoreRowsParams::cand): the launch scores only the rows that
// rescore their candidates (ranges.fresh == 0), chunk i of such a row being
// the record of token cand[row][i], read where it lies; the launch without
// BY_ID then skips those rows. The ids of a span are loaded a span ahead of
// its copy, so that their latency hides behind a span's products.
// KEEP: the instantiation that takes TopkKeep's passes (gqa_score_topk_rows);
// without it the keep path compiles away.
template <bool BY_ID, bool KEEP>
__global__ void __launch_bounds__(k16Threads, 3) higgs2_mma16_kernel(ScoreRowsParams p, int q0, int nq,
                                                                     const float* __restrict__ q,
                                                                     const uint8_t* const* __restrict__ codes_rows,
                                                                     const uint8_t* const* __restrict__ scale_rows,
                                                                     const StepRanges* __restrict__ ranges,
                                                                     const float* __restrict__ grid,
                                                                     float* __restrict__ scores) {
  constexpr int kT = k16Span / 16;  // products per span
  extern __shared__ __align__(16) uint8_t mma_smem[];
  uint2* g16 = reinterpret_cast<uint2*>(mma_smem);  // [code][copy]: the point's 4 dims as two half2
  const int64_t row = blockIdx.y;
  if (p.cand && BY_ID == bool(ranges[row / p.n_kv_head].fresh)) return;  // the other launch's row
  const int kmode = KEEP ? p.keep.mode[row] : 0;
  if (KEEP && p.keep.pass == 2 && kmode != 4) return;  // the rerun: only the rows the fused top-k gave up on
  const bool keeping = KEEP && !BY_ID && p.keep.pass == 1 && kmode == 1;
  __shared__ uint32_t s_kept;
  if (keeping)
    keep_start(p.keep, row, int64_t(blockIdx.x) * (k16Threads / 32) * k16Span <
                                score_range(p, ranges[row / p.n_kv_head]).n, &s_kept);
  Range rg;
  GqaPartials gp;
  if (!mma_scorer_start<k16Threads, k16Span>(p, q0, nq, ranges, grid, g16, rg, gp)) return;
  const int lane = threadIdx.x & 31, gr = lane >> 2, xc = lane & 3;
  const bool has_q = xc < nq;  // this lane's outputs are query xc's
  const int k_qi[1] = {has_q ? q0 + xc : -1};
  const float k_th[1] = {keeping && has_q ? p.keep.theta[row * p.n_q + q0 + xc] : INFINITY};
  uint32_t b[8][2];            // B: query gr / 2's high (even gr) or low part, dims 4(8xc + kk) ..
  {
    const int bq = gr >> 1;
    const bool in = bq < nq;
    const float* qr = q + ((row * p.n_q) + q0 + (in ? bq : 0)) * 128;
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {  // the scores' scale folded in
      const uint4 h = query_group_parts(qr, in, xc, kk, p.scale);
      const bool lo = gr & 1;
      b[kk][0] = lo ? h.y : h.x;  // k 2x, 2x+1
      b[kk][1] = lo ? h.w : h.z;  // k 2x+8, 2x+9
    }
  }
  __syncthreads();
  // Token offsets are 32-bit (a row holds < 2^30 tokens, launch_planar_mma).
  const int n = int(rg.n);
  const uint8_t* codes = codes_rows[row] + rg.c0 * 32;
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(scale_rows[row]) + rg.c0;
  const int32_t* ids = BY_ID ? p.cand[row] + rg.c0 : nullptr;  // BY_ID: chunk i is token ids[i]
  // This lane's scores: tokens 8gr .. 8gr + 7 of a span; 16-byte stores
  // where the rows' stride keeps them aligned.
  float* out = scores + (row * p.n_q + q0 + (has_q ? xc : 0)) * p.out_stride + 8 * gr;
  const bool vec_out = (p.out_stride & 3) == 0 && (reinterpret_cast<uintptr_t>(scores) & 15) == 0;
  const uint32_t gcopy = uint32_t(__cvta_generic_to_shared(g16)) + uint32_t(lane & (kGridCopies - 1)) * 8u;
  const int warp = int(threadIdx.x >> 5);
  const uint32_t ring = uint32_t(__cvta_generic_to_shared(mma_smem)) + 256u * kGridCopies * 8u +
                        uint32_t(warp * 2 * k16StageBytes);
  const int step = int(gridDim.x) * (k16Threads / 32) * k16Span;
  // BY_ID: the token ids of span w's chunks w + 16i + lane / 2 (those whose
  // pieces this lane copies), 0 past the row's end.
  auto load_ids = [&](int w, int32_t (&id)[kT]) {
#pragma unroll
    for (int i = 0; i < kT; ++i) {
      const int t = w + 16 * i + (lane >> 1);
      id[i] = t < n ? __ldg(ids + t) : 0;
    }
  };
  // Span w → stage st: lane l copies 16-byte pieces l, l + 32, l + 64, l + 96
  // (chunk w + piece / 2, i.e. span token 16i + l / 2, at its padded place),
  // zero-filled past the row's end.
  const uint32_t copy_lane = uint32_t(((lane >> 1) + (lane >> 4)) * 32 + (lane & 1) * 16);
  auto issue = [&](int w, uint32_t st, const int32_t (&id)[kT]) {
    const uint32_t dst = ring + st * k16StageBytes + copy_lane;
    if (BY_ID) {
#pragma unroll
      for (int i = 0; i < kT; ++i) {
        const bool in = w + 16 * i + (lane >> 1) < n;
        cp_async16(dst + i * k16CopyStep, codes + int64_t(id[i]) * 32 + (lane & 1) * 16, in ? 16 : 0);
      }
    } else {
      const uint8_t* src = codes + int64_t(w) * 32 + lane * 16;
      if (w + k16Span <= n) {
#pragma unroll
        for (int i = 0; i < kT; ++i) cp_async16(dst + i * k16CopyStep, src + i * 512, 16);
      } else {
#pragma unroll
        for (int i = 0; i < kT; ++i) {
          const bool in = w + 16 * i + (lane >> 1) < n;
          cp_async16(dst + i * k16CopyStep, in ? src + i * 512 : codes, in ? 16 : 0);
        }
      }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  // Span w's bf16 scales of product u's tokens: w + 8gr + 2u (low half of
  // sc[u]) and w + 8gr + 2u + 1 (high half); 0 past the row's end. BY_ID:
  // of tokens ids[w + 8gr + 2u], ids[w + 8gr + 2u + 1].
  auto load_scales = [&](int w, uint32_t (&sc)[kT]) {
    const int t0 = w + 8 * gr;
    if (BY_ID) {
#pragma unroll
      for (int u = 0; u < kT; ++u) {
        const int t = t0 + 2 * u;
        const int32_t lo = t < n ? __ldg(ids + t) : -1, hi = t + 1 < n ? __ldg(ids + t + 1) : -1;
        sc[u] = (lo >= 0 ? uint32_t(__ldg(scales + lo)) : 0u) | (hi >= 0 ? uint32_t(__ldg(scales + hi)) << 16 : 0u);
      }
      return;
    }
    const uint16_t* s = scales + t0;
    if (w + k16Span <= n) {
#pragma unroll
      for (int u = 0; u < kT; ++u) sc[u] = uint32_t(__ldg(s + 2 * u)) | (uint32_t(__ldg(s + 2 * u + 1)) << 16);
    } else {
#pragma unroll
      for (int u = 0; u < kT; ++u) {
        const int t = t0 + 2 * u;
        sc[u] = (t < n ? uint32_t(__ldg(s + 2 * u)) : 0u) | (t + 1 < n ? uint32_t(__ldg(s + 2 * u + 1)) << 16 : 0u);
      }
    }
  };
  float lm = -INFINITY, ls = 0.f;  // softmax partials of query xc over this lane's tokens
  int w0 = (int(blockIdx.x) * (k16Threads / 32) + warp) * k16Span;
  uint32_t sc_next[kT];
  int32_t id_cur[kT] = {}, id_next[kT] = {};  // BY_ID: the ids of the span issued next, and of the one after
  if (BY_ID) {
    load_ids(w0, id_cur);
    load_ids(w0 + step, id_next);
  }
  issue(w0, 0, id_cur);
  load_scales(w0, sc_next);
  // Code bytes 8xc .. 8xc + 7 of span token 8gr (+ 2u, + 1), at its padded place.
  const uint32_t code_lane = uint32_t(9 * gr * 32 + 8 * xc);
  for (uint32_t st = 0; w0 < n; w0 += step, st ^= 1u) {
    uint32_t sc[kT];
#pragma unroll
    for (int u = 0; u < kT; ++u) sc[u] = sc_next[u];
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncwarp();  // the span has landed for every lane; the other stage is read
    if (w0 + step < n) {
      if (BY_ID) {
#pragma unroll
        for (int i = 0; i < kT; ++i) id_cur[i] = id_next[i];
        load_ids(w0 + 2 * step, id_next);
      }
      issue(w0 + step, st ^ 1u, id_cur);
      load_scales(w0 + step, sc_next);
    }
    const uint32_t base = ring + st * k16StageBytes + code_lane;
    float v[2 * kT];  // query xc's scores of tokens w0 + 8gr + i
#pragma unroll
    for (int u = 0; u < kT; ++u) {
      uint32_t cx0, cy0, cx1, cy1;  // code bytes 8xc .. 8xc + 7 of tokens w0 + 8gr + 2u, + 1
      asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(cx0), "=r"(cy0) : "r"(base + 64 * u));
      asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(cx1), "=r"(cy1) : "r"(base + 64 * u + 32));
      float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        const uint32_t sel = 0x4440u | uint32_t(kk & 3);
        const uint32_t at0 = gcopy + __byte_perm(kk < 4 ? cx0 : cy0, 0, sel) * (kGridCopies * 8u);
        const uint32_t at1 = gcopy + __byte_perm(kk < 4 ? cx1 : cy1, 0, sel) * (kGridCopies * 8u);
        uint32_t a[4];  // row gr's k 2x, 2x+1; row gr + 8's; row gr's k 2x+8, 2x+9; row gr + 8's
        asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(a[0]), "=r"(a[2]) : "r"(at0));
        asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(a[1]), "=r"(a[3]) : "r"(at1));
        mma_16816(d, a, b[kk][0], b[kk][1]);
      }
      // d[0] + d[1]: query xc's score of row gr (high + low part); d[2] + d[3] of row gr + 8.
      v[2 * u] = __uint_as_float(sc[u] << 16) * (d[0] + d[1]);
      v[2 * u + 1] = __uint_as_float(sc[u] & 0xffff0000u) * (d[2] + d[3]);
    }
    const bool full = w0 + k16Span <= n;
    if (!full) {
#pragma unroll
      for (int i = 0; i < 2 * kT; ++i)
        if (w0 + 8 * gr + i >= n) v[i] = -INFINITY;
    }
    if (keeping) {  // every lane: the kept list instead of the scores
      float kv[1][2 * kT];
#pragma unroll
      for (int i = 0; i < 2 * kT; ++i) kv[0][i] = v[i];
      keep_span<1, true>(p.keep, row, p.n_q, &s_kept, rg.c0, w0, ranges + row / p.n_kv_head, kv, k_qi, k_th, lane);
      if (has_q && gp.part) span_partials(lm, ls, v);
      continue;
    }
    if (!has_q) continue;
    float* op = out + w0;
    if (full && vec_out) {
      reinterpret_cast<float4*>(op)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(op)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
#pragma unroll
      for (int i = 0; i < 2 * kT; ++i)
        if (w0 + 8 * gr + i < n) op[i] = v[i];
    }
    if (gp.part) span_partials(lm, ls, v);  // one rescale per span
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");  // nothing in flight at exit
  if (keeping) keep_finish(p.keep, row, &s_kept);
  if (!gp.part) return;
  // Lanes x, x + 4, .., x + 28 hold query x's partials.
  mma_block_partials<k16Threads>(gp, row * p.n_q + q0, nq, lm, ls, 4, 16, gr == 0, xc);
}

// The planar index with the U4 grid (QuantSpec::uniform_levels): the
// integer scores of quant_format.h on the tensor cores, mma.m16n8k32 with
// u8 × s8 → s32. A (16 × 32): 16 tokens' codes, one byte each; B (32 × 8):
// up to 8 queries' int8 values (qdev::uniform_query). A token's code word w
// holds dims 16w .. 16w + 15, dim 16w + 4k + j in bits 2j of byte k, so
// (w >> 2j) & 0x03030303 is the codes of dims 16w + 4k + j (k = 0 .. 3) as
// four bytes. Lane (gr, x) loads words 2x and 2x + 1 of tokens gr and gr + 8;
// in product m its A registers are those words shifted by 2m: column 4x + k
// is dim 32x + 4k + m, column 16 + 4x + k dim 32x + 16 + 4k + m, and its B
// registers (rows 4x + k, 16 + 4x + k of query gr) are query gr's values of
// the same dims, all from the lane's own 32 dims 32x .. 32x + 31. Four
// products give Σ q8·c of 16 tokens and 8 queries: lane (gr, x) ends with
// queries 2x, 2x + 1 of tokens gr and gr + 8. No grid lookups: per token the
// codes are 32 bytes and the work ~2 integer operations per 4 dims. Spans,
// the cp.async double buffer and the scales as higgs2_mma16_kernel.
constexpr int kU4Threads = 256;
constexpr int kU4Span = 64;                   // a warp's tokens per iteration
constexpr int kU4StageBytes = kU4Span * 32;   // codes
constexpr int kU4MaxQ = 8;                    // queries per launch
constexpr size_t kU4Smem = size_t(kU4Threads / 32) * 2 * kU4StageBytes;

__device__ __forceinline__ void mma_u8s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Scores queries [q0, q0 + nq) of each row, nq ≤ 8; grid: the U4 levels
// (level 2 is the half step h).
template <bool KEEP>  // as higgs2_mma16_kernel's
__global__ void __launch_bounds__(kU4Threads, 4) u4_imma_kernel(ScoreRowsParams p, int q0, int nq,
                                                                const float* __restrict__ q,
                                                                const uint8_t* const* __restrict__ codes_rows,
                                                                const uint8_t* const* __restrict__ scale_rows,
                                                                const StepRanges* __restrict__ ranges,
                                                                const float* __restrict__ grid,
                                                                float* __restrict__ scores) {
  constexpr int kT = kU4Span / 16;  // tiles per span
  extern __shared__ __align__(16) uint8_t u4_smem[];
  const int64_t row = blockIdx.y;
  const int kmode = KEEP ? p.keep.mode[row] : 0;
  if (KEEP && p.keep.pass == 2 && kmode != 4) return;  // the rerun: only the rows the fused top-k gave up on
  const bool keeping = KEEP && p.keep.pass == 1 && kmode == 1;
  const StepRanges& srow = ranges[row / p.n_kv_head];
  const Range rg = score_range(p, srow);
  __shared__ uint32_t s_kept;
  if (keeping) {
    keep_start(p.keep, row, int64_t(blockIdx.x) * (kU4Threads / 32) * kU4Span < rg.n, &s_kept);
    __syncthreads();
  }
  const GqaPartials gp =
      p.gqa_scratch ? gqa_partials(p.gqa_scratch, int64_t(gridDim.y) * p.n_q) : GqaPartials{nullptr, nullptr};
  if (int64_t(blockIdx.x) * (kU4Threads / 32) * kU4Span >= rg.n) {  // no token for this block
    if (gp.part && int(threadIdx.x) < nq) put_partial(gp, row * p.n_q + q0 + threadIdx.x, -INFINITY, 0.f);
    return;
  }
  const int lane = threadIdx.x & 31, gr = lane >> 2, xc = lane & 3;
  // B: query gr's int8 values of dims 32xc .. 32xc + 31 (this lane's), as
  // quant_format.h defines them: the four lanes of a query share its amax.
  uint32_t b[4][2];
  float factor;
  int32_t sum = 0;
  {
    const bool in = gr < nq;
    float qv[32];
    const float4* qr = reinterpret_cast<const float4*>(q + ((row * p.n_q) + q0 + (in ? gr : 0)) * 128 + 32 * xc);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float4 v = in ? qr[i] : make_float4(0.f, 0.f, 0.f, 0.f);
      qv[4 * i] = v.x, qv[4 * i + 1] = v.y, qv[4 * i + 2] = v.z, qv[4 * i + 3] = v.w;
    }
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(qv[i]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    const qdev::UniformQuery u = qdev::uniform_query(amax, __ldg(grid + 2));
    factor = u.factor;
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        uint32_t w = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int32_t v = qdev::uniform_q8(qv[16 * half + 4 * k + m], u);
          sum += v;
          w |= (uint32_t(v) & 0xffu) << (8 * k);
        }
        b[m][half] = w;
      }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  }
  // This lane's outputs: queries 2xc and 2xc + 1 (their factor and sum from lanes 4·query).
  float fac[2];
  int32_t qsum[2];
  bool has_q[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    fac[e] = __shfl_sync(0xffffffffu, factor, 4 * (2 * xc + e));
    qsum[e] = __shfl_sync(0xffffffffu, sum, 4 * (2 * xc + e));
    has_q[e] = 2 * xc + e < nq;
  }
  int k_qi[2];
  float k_th[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    k_qi[e] = has_q[e] ? q0 + 2 * xc + e : -1;
    k_th[e] = keeping && has_q[e] ? p.keep.theta[row * p.n_q + q0 + 2 * xc + e] : INFINITY;
  }
  // Token offsets are 32-bit (a row holds < 2^30 tokens, launch_planar_mma).
  const int n = int(rg.n);
  const uint8_t* codes = codes_rows[row] + rg.c0 * 32;
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(scale_rows[row]) + rg.c0;
  float* out0 = scores + (row * p.n_q + q0 + (has_q[0] ? 2 * xc : 0)) * p.out_stride + gr;
  float* out1 = scores + (row * p.n_q + q0 + (has_q[1] ? 2 * xc + 1 : 0)) * p.out_stride + gr;
  const int warp = int(threadIdx.x >> 5);
  const uint32_t ring = uint32_t(__cvta_generic_to_shared(u4_smem)) + uint32_t(warp * 2 * kU4StageBytes);
  const int step = int(gridDim.x) * (kU4Threads / 32) * kU4Span;
  // Span w → stage st: lane l copies 16-byte pieces l, l + 32, l + 64, l + 96
  // (chunk w + piece / 2), zero-filled past the row's end.
  auto issue = [&](int w, uint32_t st) {
    const uint32_t dst = ring + st * kU4StageBytes + uint32_t(lane) * 16u;
    const uint8_t* src = codes + int64_t(w) * 32 + lane * 16;
    if (w + kU4Span <= n) {
#pragma unroll
      for (int i = 0; i < kT; ++i) cp_async16(dst + i * 512, src + i * 512, 16);
    } else {
#pragma unroll
      for (int i = 0; i < kT; ++i) {
        const bool in = w + 16 * i + (lane >> 1) < n;
        cp_async16(dst + i * 512, in ? src + i * 512 : codes, in ? 16 : 0);
      }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  // Span w's bf16 scales of this lane's chunks w + 16u + gr (low half of
  // sc[u]) and w + 16u + 8 + gr (high half); 0 past the row's end.
  auto load_scales = [&](int w, uint32_t (&sc)[kT]) {
    const uint16_t* sp = scales + w + gr;
#pragma unroll
    for (int u = 0; u < kT; ++u) {
      const int t = w + 16 * u + gr;
      sc[u] = (t < n ? uint32_t(__ldg(sp + 16 * u)) : 0u) | (t + 8 < n ? uint32_t(__ldg(sp + 16 * u + 8)) << 16 : 0u);
    }
  };
  float lm[2] = {-INFINITY, -INFINITY}, ls[2] = {0.f, 0.f};  // softmax partials of queries 2xc, 2xc + 1
  int w0 = (int(blockIdx.x) * (kU4Threads / 32) + warp) * kU4Span;
  uint32_t sc_next[kT];
  issue(w0, 0);
  load_scales(w0, sc_next);
  const uint32_t code_lane = uint32_t(gr * 32 + 8 * xc);
  const float out_scale = p.scale;
  for (uint32_t st = 0; w0 < n; w0 += step, st ^= 1u) {
    uint32_t sc[kT];
#pragma unroll
    for (int u = 0; u < kT; ++u) sc[u] = sc_next[u];
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncwarp();  // the span has landed for every lane; the other stage is read
    if (w0 + step < n) {
      issue(w0 + step, st ^ 1u);
      load_scales(w0 + step, sc_next);
    }
    const uint32_t base = ring + st * kU4StageBytes + code_lane;
    float v[2][2 * kT];  // queries 2xc, 2xc + 1: scores of tokens w0 + 8i + gr
#pragma unroll
    for (int u = 0; u < kT; ++u) {
      uint32_t cx0, cy0, cx1, cy1;  // code words 2xc, 2xc + 1 of tokens w0 + 16u + gr, + 8
      asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(cx0), "=r"(cy0) : "r"(base + 512 * u));
      asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(cx1), "=r"(cy1) : "r"(base + 512 * u + 256));
      int d[4] = {0, 0, 0, 0};
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const uint32_t a[4] = {(cx0 >> (2 * m)) & 0x03030303u, (cx1 >> (2 * m)) & 0x03030303u,
                               (cy0 >> (2 * m)) & 0x03030303u, (cy1 >> (2 * m)) & 0x03030303u};
        mma_u8s8(d, a, b[m][0], b[m][1]);
      }
      // d[0], d[1]: queries 2xc, 2xc + 1 of token gr; d[2], d[3] of token gr + 8.
      const float s_lo = __uint_as_float(sc[u] << 16), s_hi = __uint_as_float(sc[u] & 0xffff0000u);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const qdev::UniformQuery uq{0.f, fac[e]};
        v[e][2 * u] = __fmul_rn(qdev::uniform_group_score(s_lo, uq, d[e], qsum[e], 4), out_scale);
        v[e][2 * u + 1] = __fmul_rn(qdev::uniform_group_score(s_hi, uq, d[2 + e], qsum[e], 4), out_scale);
      }
    }
    const bool full = w0 + kU4Span <= n;
    if (keeping) {  // every lane: the kept list instead of the scores
#pragma unroll
      for (int e = 0; e < 2; ++e)
#pragma unroll
        for (int i = 0; i < 2 * kT; ++i)
          if (!full && w0 + 8 * i + gr >= n) v[e][i] = -INFINITY;
      keep_span<2, false>(p.keep, row, p.n_q, &s_kept, rg.c0, w0, ranges + row / p.n_kv_head, v, k_qi, k_th, lane);
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (has_q[e] && gp.part) span_partials(lm[e], ls[e], v[e]);
      continue;
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if (!has_q[e]) continue;
      float* op = (e ? out1 : out0) + w0;
#pragma unroll
      for (int i = 0; i < 2 * kT; ++i) {
        if (full || w0 + 8 * i + gr < n) op[8 * i] = v[e][i];
        else v[e][i] = -INFINITY;
      }
      if (gp.part) span_partials(lm[e], ls[e], v[e]);  // one rescale per span
    }
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");  // nothing in flight at exit
  if (keeping) keep_finish(p.keep, row, &s_kept);
  if (!gp.part) return;
  // Lanes xc, xc + 4, .., xc + 28 hold queries 2xc, 2xc + 1's partials.
  __shared__ float2 red[kU4Threads / 32][kU4MaxQ];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    for (int off = 4; off <= 16; off <<= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, lm[e], off), s2 = __shfl_xor_sync(0xffffffffu, ls[e], off);
      lse_combine(lm[e], ls[e], m2, s2);
    }
    if (gr == 0) red[warp][2 * xc + e] = make_float2(lm[e], ls[e]);
  }
  __syncthreads();
  if (int(threadIdx.x) < nq) {
    float m = -INFINITY, total = 0.f;
    for (int w = 0; w < kU4Threads / 32; ++w) lse_combine(m, total, red[w][threadIdx.x].x, red[w][threadIdx.x].y);
    put_partial(gp, row * p.n_q + q0 + threadIdx.x, m, total);
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
constexpr int kGqaPer = 4;      // gqa_max_kernel's candidates per thread

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
    const float v = query_lse(gp, row * p.n_q + j, lane);
    if (lane == 0) lse[j] = v;
  }
  __syncthreads();
  // kGqaPer candidates per thread, a block's stretch coalesced per load; the
  // loads of four queries in flight at once (a thread reading one candidate's
  // queries in turn was bound by their latency: 16.7 µs at 128K, 8 rows).
  const int64_t n_sel = r.c_hi - r.c_lo;
  const float* x = raw + row * p.n_q * p.in_stride + r.c_lo;
  for (int64_t i0 = int64_t(blockIdx.x) * (kGqaThreads * kGqaPer) + threadIdx.x; i0 < n_sel;
       i0 += int64_t(gridDim.x) * (kGqaThreads * kGqaPer)) {
    float best[kGqaPer];
#pragma unroll
    for (int u = 0; u < kGqaPer; ++u) best[u] = -INFINITY;
#pragma unroll 4
    for (int j = 0; j < p.n_q; ++j) {
      const float* xj = x + j * p.in_stride;
#pragma unroll
      for (int u = 0; u < kGqaPer; ++u) {
        const int64_t i = i0 + u * kGqaThreads;
        if (i < n_sel) best[u] = fmaxf(best[u], xj[i] - lse[j]);
      }
    }
#pragma unroll
    for (int u = 0; u < kGqaPer; ++u)
      if (i0 + u * kGqaThreads < n_sel) out[row * p.out_stride + i0 + u * kGqaThreads] = best[u];
  }
}

cudaStream_t st(const Exec& x) { return static_cast<cudaStream_t>(x.stream); }

// A planar scorer's blocks per row: p.blocks_per_row if set, else as few as
// keep the SMs (per_sm blocks each) busy, at most max_per_row; at most one
// per softmax-partials slot.
unsigned planar_blocks_per_row(const ScoreRowsParams& p, int64_t n_rows, int64_t per_sm, int max_per_row) {
  unsigned bx = unsigned(p.blocks_per_row > 0
                             ? p.blocks_per_row
                             : table_blocks_per_row(n_rows, int64_t(device_info().n_sm) * per_sm, max_per_row));
  if (p.gqa_scratch) {
    KVT_CHECK(p.n_q > 1 && reinterpret_cast<uintptr_t>(p.gqa_scratch) % 8 == 0,
              "score_rows: softmax partials are for n_q > 1, in 8-byte aligned scratch");
    bx = std::min<unsigned>(bx, kMaxSlices);
  }
  return bx;
}

// One launch of the planar scorer over queries [q0, q0 + NQ) of every row.
template <int NQ, bool ROT>
void launch_planar(const Exec& x, const ScoreRowsParams& p, int q0, const float* q, const uint8_t* const* plane0,
                   const uint8_t* const* plane1, const StepRanges* ranges, float* scores) {
  const int64_t n_rows = int64_t(p.n_seq) * p.n_kv_head;
  constexpr size_t smem = PlanarTable<NQ, ROT>::kBytes;
  static const bool once = [] {
    KVT_CUDA_CHECK(cudaFuncSetAttribute(higgs2_rows_kernel<NQ, ROT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(smem)));
    return true;
  }();
  (void)once;
  // Each block builds its table once, then scores a long stretch of tokens:
  // as few blocks as keep every SM busy. Four blocks per SM for every eighth
  // of a row (4,256 blocks at 128K and 8 rows) spent more time building
  // tables than scoring; one block more than the SMs hold runs alone in a
  // wave of its own.
  const int64_t per_sm =
      std::max<int64_t>(1, std::min<int64_t>(int64_t(227 * 1024) / int64_t(smem), 2048 / kScoreThreads));
  const unsigned bx = planar_blocks_per_row(p, n_rows, per_sm, 64);
  higgs2_rows_kernel<NQ, ROT><<<dim3(bx, unsigned(n_rows)), kScoreThreads, smem, st(x)>>>(
      p, q0, q, plane0, plane1, ranges, p.fmt.grid, scores);
  KVT_CUDA_LAUNCH_CHECK("higgs2_rows_kernel");
}

// A tensor-core scorer (higgs2_mma_kernel, higgs2_mma16_kernel: THREADS
// threads and SMEM bytes of shared memory a block) over queries
// [q0, q0 + nq) of every row, nq ≤ 4.
template <auto KERNEL, int THREADS, size_t SMEM>
void launch_planar_mma(const Exec& x, const ScoreRowsParams& p, int q0, int nq, const float* q,
                       const uint8_t* const* plane0, const uint8_t* const* plane1, const StepRanges* ranges,
                       float* scores, const char* name) {
  const int64_t n_rows = int64_t(p.n_seq) * p.n_kv_head;
  KVT_CHECK(p.out_stride < (int64_t(1) << 30), "score_rows: rows of {} tokens exceed the planar scorer's int32 offsets",
            p.out_stride);
  static const int per_sm = [] {
    int n = 0;
    KVT_CUDA_CHECK(cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, int(SMEM)));
    KVT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, KERNEL, THREADS, SMEM));
    return std::max(1, n);
  }();
  const unsigned bx = planar_blocks_per_row(p, n_rows, per_sm, kTopkKeepMaxBlocks);
  KERNEL<<<dim3(bx, unsigned(n_rows)), THREADS, SMEM, st(x)>>>(p, q0, nq, q, plane0, plane1, ranges, p.fmt.grid,
                                                              scores);
  check(cudaGetLastError(), name, __FILE__, __LINE__);  // KVT_CUDA_LAUNCH_CHECK with the name a pointer
}

template <bool ROT>
void score_planar(const Exec& x, const ScoreRowsParams& p, const float* q, const uint8_t* const* plane0,
                  const uint8_t* const* plane1, const StepRanges* ranges, float* scores) {
  // Query subsets of 4, 2, 1 (the table takes 32 KB of shared memory per query, 40 KB rotated).
  for (int q0 = 0; q0 < p.n_q;) {
    const int nq = p.n_q - q0 >= 4 ? 4 : p.n_q - q0 >= 2 ? 2 : 1;
    if (nq == 4) launch_planar<4, ROT>(x, p, q0, q, plane0, plane1, ranges, scores);
    else if (nq == 2) launch_planar<2, ROT>(x, p, q0, q, plane0, plane1, ranges, scores);
    else launch_planar<1, ROT>(x, p, q0, q, plane0, plane1, ranges, scores);
    q0 += nq;
  }
}

}  // namespace

void score_rows(const Exec& x, const ScoreRowsParams& p, const float* q, const uint8_t* const* plane0,
                const uint8_t* const* plane1, const StepRanges* ranges, float* scores) {
  const int64_t n_rows = int64_t(p.n_seq) * p.n_kv_head;
  if (n_rows == 0) return;
  KVT_CHECK(n_rows < 65536, "score_rows: {} rows exceed the grid", n_rows);
  const int n_sm = device_info().n_sm;
  const int64_t max_bx = std::max<int64_t>(1, 8 * int64_t(n_sm) / n_rows + 1);
  KVT_CHECK(!p.cand || score_rows_reads_candidates(x, p),
            "score_rows: only the mma16 planar scorer reads candidates by id (else gather_candidates)");
  if (p.layout == IndexRecLayout::planar_higgs2 && p.fmt.spec.uniform_levels) {  // U4: the int8 scorer
    KVT_CHECK(p.head_dim == 128 && p.fmt.grid && p.fmt.spec.grid_size == 4,
              "score_rows: the planar U<n> index is U4 at head_dim 128");
    for (int q0 = 0; q0 < p.n_q; q0 += kU4MaxQ) {
      if (p.keep.pass)
        launch_planar_mma<u4_imma_kernel<true>, kU4Threads, kU4Smem>(
            x, p, q0, std::min(kU4MaxQ, p.n_q - q0), q, plane0, plane1, ranges, scores, "launch of u4_imma_kernel");
      else
        launch_planar_mma<u4_imma_kernel<false>, kU4Threads, kU4Smem>(
            x, p, q0, std::min(kU4MaxQ, p.n_q - q0), q, plane0, plane1, ranges, scores, "launch of u4_imma_kernel");
    }
    return;
  }
  if (p.layout == IndexRecLayout::planar_higgs2) {
    KVT_CHECK(p.head_dim == 128 && p.fmt.grid, "score_rows: the planar index is 2-bit HIGGS at head_dim 128");
    switch (planar_scorer_resolved(p.planar_scorer)) {
      case PlanarScorer::xor_table: score_planar<false>(x, p, q, plane0, plane1, ranges, scores); break;
      case PlanarScorer::mma:
        for (int q0 = 0; q0 < p.n_q; q0 += 4)
          launch_planar_mma<higgs2_mma_kernel, kMmaThreads, kMmaSmem>(x, p, q0, std::min(4, p.n_q - q0), q, plane0,
                                                                       plane1, ranges, scores, "launch of higgs2_mma_kernel");
        break;
      case PlanarScorer::mma16:
        for (int q0 = 0; q0 < p.n_q; q0 += 4) {
          if (p.keep.pass)
            launch_planar_mma<higgs2_mma16_kernel<false, true>, k16Threads, k16Smem>(
                x, p, q0, std::min(4, p.n_q - q0), q, plane0, plane1, ranges, scores, "launch of higgs2_mma16_kernel");
          else
            launch_planar_mma<higgs2_mma16_kernel<false, false>, k16Threads, k16Smem>(
                x, p, q0, std::min(4, p.n_q - q0), q, plane0, plane1, ranges, scores, "launch of higgs2_mma16_kernel");
          if (p.cand)  // the rows that rescore candidates, by id
            launch_planar_mma<higgs2_mma16_kernel<true, false>, k16Threads, k16Smem>(
                x, p, q0, std::min(4, p.n_q - q0), q, plane0, plane1, ranges, scores,
                "launch of higgs2_mma16_kernel (by id)");
        }
        break;
      default: score_planar<true>(x, p, q, plane0, plane1, ranges, scores);
    }
    return;
  }
  const QuantKind kind = p.fmt.spec.kind;
  const bool dense = p.layout == IndexRecLayout::records && (kind == QuantKind::bf16 || kind == QuantKind::fp8);
  if (!dense && score_rows_by_table(p)) {  // the byte-table scorer
    LutPass lp;
    lp.out = scores;
    lp.out_stride = p.out_stride;
    lp.scale = p.scale;
    lp.gqa_scratch = p.n_q > 1 ? p.gqa_scratch : nullptr;
    if (p.layout == IndexRecLayout::residual) {  // the meta records once each, then the residuals plus them
      LutPass mp;
      mp.div = p.m;
      mp.out = p.meta_scratch;
      mp.out_stride = residual_meta_stride(p.out_stride, p.m);
      score_rows_lut(x, p, p.meta.spec, make_dev_format(p.meta), q, plane1, ranges, mp);
      lp.add = p.meta_scratch;
      lp.add_div = p.m;
      lp.add_stride = mp.out_stride;
    }
    score_rows_lut(x, p, p.fmt.spec, make_dev_format(p.fmt), q, plane0, ranges, lp);
    return;
  }
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

namespace score_detail {

void gqa_partials_rows(const Exec& x, const GqaRowsParams& p, const float* raw, const StepRanges* ranges) {
  const int64_t n_rq = int64_t(p.n_seq) * p.n_kv_head * p.n_q;
  gqa_partial_kernel<<<dim3(kGqaSlices, unsigned(n_rq)), kGqaThreads, 0, st(x)>>>(p, raw, ranges,
                                                                                gqa_partials(p.scratch, n_rq));
  KVT_CUDA_LAUNCH_CHECK("gqa_partial_kernel");
}

}  // namespace score_detail

void gqa_rows(const Exec& x, const GqaRowsParams& p, const float* raw, const StepRanges* ranges, float* out) {
  const int64_t n_rows = int64_t(p.n_seq) * p.n_kv_head;
  KVT_CHECK(p.n_q >= 1 && p.n_q <= 64 && n_rows * p.n_q < 65536, "gqa_rows: {} rows of {} queries", n_rows, p.n_q);
  if (n_rows == 0) return;
  KVT_CHECK(p.scratch && reinterpret_cast<uintptr_t>(p.scratch) % 8 == 0, "gqa_rows: needs 8-byte aligned scratch");
  const GqaPartials gp = gqa_partials(p.scratch, n_rows * p.n_q);
  if (!p.partials_ready) score_detail::gqa_partials_rows(x, p, raw, ranges);
  // About one candidate group per thread at 128K and 8 rows (131,072 = 128 blocks · 256 threads · 4).
  const int64_t bx = std::max<int64_t>(1, 1024 / n_rows);
  gqa_max_kernel<<<dim3(unsigned(bx), unsigned(n_rows)), kGqaThreads, 0, st(x)>>>(p, raw, ranges, gp, out);
  KVT_CUDA_LAUNCH_CHECK("gqa_max_kernel");
}

}  // namespace kvtier::cuda
