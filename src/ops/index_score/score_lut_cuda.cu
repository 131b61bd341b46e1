// The byte-table scorer of score_rows on the GPU (index_rows.h: LutShape):
// records whose codes fill whole bytes (higgs4/2/1/0.5, 1bit, int1/2/4/8)
// scored by one shared-memory read per code byte instead of decoding them.
//
// A block builds, for its queries (NQ of the row's n_q), the table
//   lut[b][p] = Σ over the codes of byte value b at code-byte position p of
//               q_rot · (grid point)          (HIGGS, q rotated per group)
//               q · code                      (uniform, 1bit)
// then scores a long stretch of the row: each warp copies its 32 records to
// shared memory (4-byte coalesced loads from any byte offset), and each lane
// sums its record's table entries, starting at a position of its own so the
// lanes of a quarter warp read different banks. Per group the sum is scaled
// by the record's bf16 σ (HIGGS) or step, plus min · Σq_group (uniform,
// 1bit): the CPU's dequantized value min + code·step, rearranged.
// Residual landmarks run it twice: the meta records once each into
// ScoreRowsParams::meta_scratch (LutPass::div = m), then the residuals with
// those scores added (LutPass::add).
#include <cuda_runtime.h>

#include "backend/cuda_backend.h"
#include "ops/index_score/score_rows_cuda.cuh"
#include "ops/quant/quant_dev_format.cuh"

namespace kvtier::cuda {
namespace {

using namespace score_detail;

__device__ __forceinline__ float bf16_at(const uint8_t* b) {
  return __uint_as_float((uint32_t(b[0]) | (uint32_t(b[1]) << 8)) << 16);
}

template <int NQ>
__global__ void __launch_bounds__(kLutThreads) lut_rows_kernel(ScoreRowsParams p, DevFormat f, LutShape sh, LutPass lp,
                                                               int q0, const float* __restrict__ q,
                                                               const uint8_t* const* __restrict__ rows,
                                                               const StepRanges* __restrict__ ranges) {
  using V = typename LutVec<NQ>::T;
  extern __shared__ float4 smem4[];
  float* sm = reinterpret_cast<float*>(smem4);
  const LutSmem L = lut_smem(sh, NQ);
  V* lut = reinterpret_cast<V*>(sm + L.lut);  // [256 byte values][n_pos]
  float* qs = sm + L.qs;                      // [NQ][dim]
  float* qsum = sm + L.qsum;                  // [NQ][n_group]
  float* grid = sm + L.grid;
  const int64_t row = blockIdx.y;
  const Range rg = score_range(p, ranges[row / p.n_kv_head]);
  int64_t r0 = rg.c0, cnt = rg.n;  // the records this row scores
  if (lp.div > 1 && cnt > 0) {
    r0 = rg.c0 / lp.div;
    cnt = (rg.c0 + rg.n - 1) / lp.div - r0 + 1;
  }
  const GqaPartials gp = lp.gqa_scratch ? gqa_partials(lp.gqa_scratch, int64_t(gridDim.y) * p.n_q)
                                        : GqaPartials{nullptr, nullptr};
  constexpr int kWarps = kLutThreads / 32;
  if (int64_t(blockIdx.x) * kWarps * 32 >= cnt) {  // no record for this block
    if (gp.part && threadIdx.x < NQ) put_partial(gp, row * p.n_q + q0 + threadIdx.x, -INFINITY, 0.f);
    return;
  }
  const bool higgs = f.kind == qdev::kHiggs;
  const int tid = threadIdx.x, n_pos = sh.n_pos, D = f.dim;
  for (int i = tid; i < sh.grid_floats; i += kLutThreads) grid[i] = f.grid[i];
  // The queries; HIGGS rotates them per group as the CPU does (signs, then
  // butterflies of span 1, 2, 4, … (a + b, a − b), then × 1/√G), each span a
  // pass of the whole block: the same operations as quant_dev's fwht, in
  // parallel (one thread per query took ~100 µs per layer).
  for (int e = tid; e < NQ * D; e += kLutThreads) {
    const int qi = e / D, i = e - qi * D;
    const float v = q[(row * p.n_q + q0 + qi) * D + i];
    qs[e] = higgs && f.signs ? __fmul_rn(f.signs[i % f.group], v) : v;
  }
  __syncthreads();
  if (higgs) {
    for (int h = 1; h < f.group; h *= 2) {
      for (int e = tid; e < NQ * D / 2; e += kLutThreads) {
        const int j = (e / h) * 2 * h + e % h;  // spans never cross a group: G is a multiple of 2h
        const float a = qs[j], b = qs[j + h];
        qs[j] = __fadd_rn(a, b);
        qs[j + h] = __fsub_rn(a, b);
      }
      __syncthreads();
    }
    for (int e = tid; e < NQ * D; e += kLutThreads) qs[e] = __fmul_rn(qs[e], f.hadamard_scale);
  }
  __syncthreads();
  if (!higgs)
    for (int e = tid; e < NQ * f.n_group; e += kLutThreads) {
      const float* qg = qs + (e / f.n_group) * D + (e % f.n_group) * f.group;
      float s = 0.f;
      for (int i = 0; i < f.group; ++i) s += qg[i];
      qsum[e] = s;
    }
  const int bits = f.code_bits, per_byte = 8 / bits, cb = int(f.code_bytes);
  const uint32_t mask = (1u << bits) - 1u;
  for (int e = tid; e < 256 * n_pos; e += kLutThreads) {
    const int b = e / n_pos, pos = e - b * n_pos, g = pos / cb, k0 = (pos - g * cb) * per_byte;
    float acc[NQ];
#pragma unroll
    for (int qi = 0; qi < NQ; ++qi) acc[qi] = 0.f;
    for (int j = 0; j < per_byte; ++j) {
      const uint32_t code = (uint32_t(b) >> (j * bits)) & mask;
      if (higgs) {
        const int d = f.grid_dim, at = g * f.group + (k0 + j) * d;
        const float* pt = grid + min(int(code), f.grid_size - 1) * d;
        for (int i = 0; i < d; ++i)
#pragma unroll
          for (int qi = 0; qi < NQ; ++qi) acc[qi] = fmaf(qs[qi * D + at + i], pt[i], acc[qi]);
      } else {
        const int at = g * f.group + k0 + j;
#pragma unroll
        for (int qi = 0; qi < NQ; ++qi) acc[qi] = fmaf(float(code), qs[qi * D + at], acc[qi]);
      }
    }
    V v;
#pragma unroll
    for (int qi = 0; qi < NQ; ++qi) reinterpret_cast<float*>(&v)[qi] = acc[qi];
    lut[e] = v;
  }
  __syncthreads();

  const int warp = tid >> 5, lane = tid & 31;
  uint32_t* stage = reinterpret_cast<uint32_t*>(sm + L.stage) + warp * L.stage_words;
  const uint8_t* base = rows[row];
  const int64_t rec_bytes = f.bytes;
  float lm[NQ], ls[NQ];  // this lane's softmax partials
#pragma unroll
  for (int qi = 0; qi < NQ; ++qi) lm[qi] = -INFINITY, ls[qi] = 0.f;
  const int64_t step = int64_t(gridDim.x) * kWarps * 32;
  for (int64_t t0 = (int64_t(blockIdx.x) * kWarps + warp) * 32; t0 < cnt; t0 += step) {
    const int nrec = cnt - t0 < 32 ? int(cnt - t0) : 32;
    const auto a = reinterpret_cast<uintptr_t>(base + (r0 + t0) * rec_bytes);
    const uintptr_t a0 = a & ~uintptr_t(3);
    const int off = int(a - a0), nw = int((off + nrec * rec_bytes + 3) >> 2);
    __syncwarp();
    for (int i = lane; i < nw; i += 32) stage[i] = __ldg(reinterpret_cast<const uint32_t*>(a0) + i);
    __syncwarp();
    if (lane >= nrec) continue;
    const uint8_t* rec = reinterpret_cast<const uint8_t*>(stage) + off + lane * rec_bytes;
    const uint8_t* meta = rec + f.meta_offset;
    float tot[NQ];
#pragma unroll
    for (int qi = 0; qi < NQ; ++qi) tot[qi] = 0.f;
    for (int g = 0; g < f.n_group; ++g) {
      float acc[NQ];
#pragma unroll
      for (int qi = 0; qi < NQ; ++qi) acc[qi] = 0.f;
      int k = lane % cb;
#pragma unroll 16  // independent table reads in flight (a rolled loop waited on each)
      for (int s = 0; s < cb; ++s) {
        const int pos = g * cb + k;
        const V v = lut[int(rec[pos]) * n_pos + pos];
#pragma unroll
        for (int qi = 0; qi < NQ; ++qi) acc[qi] += lut_get<NQ>(v, qi);
        k = k + 1 == cb ? 0 : k + 1;
      }
      if (higgs) {
        const float sigma = bf16_at(meta + 2 * g);
#pragma unroll
        for (int qi = 0; qi < NQ; ++qi) tot[qi] = fmaf(sigma, acc[qi], tot[qi]);
      } else {
        const float minv = bf16_at(meta + 4 * g), stepv = bf16_at(meta + 4 * g + 2);
#pragma unroll
        for (int qi = 0; qi < NQ; ++qi) tot[qi] += minv * qsum[qi * f.n_group + g] + stepv * acc[qi];
      }
    }
    const int64_t i = t0 + lane;
#pragma unroll
    for (int qi = 0; qi < NQ; ++qi) {
      const int64_t rq = row * p.n_q + q0 + qi;
      float v = tot[qi];
      if (lp.add) v += lp.add[rq * lp.add_stride + (rg.c0 + i) / lp.add_div - rg.c0 / lp.add_div];
      v *= lp.scale;
      lp.out[rq * lp.out_stride + i] = v;
      if (gp.part) lse_combine(lm[qi], ls[qi], v, 1.f);
    }
  }
  if (gp.part) block_partials<NQ, kLutThreads>(gp, row * p.n_q + q0, lm, ls);
}

template <int NQ>
void launch(const Exec& x, const ScoreRowsParams& p, const DevFormat& f, const LutShape& sh, const LutPass& lp, int q0,
            const float* q, const uint8_t* const* rows, const StepRanges* ranges) {
  const int64_t n_rows = int64_t(p.n_seq) * p.n_kv_head;
  const size_t smem = size_t(lut_smem(sh, NQ).floats) * 4;
  static const bool once = [] {  // lut_queries_per_pass keeps every table within this
    KVT_CUDA_CHECK(cudaFuncSetAttribute(lut_rows_kernel<NQ>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(kLutMaxSmem)));
    return true;
  }();
  (void)once;
  // As the planar kernel: each block builds its table once.
  const int64_t per_sm = std::max<int64_t>(1, std::min<int64_t>(kLutMaxSmem / int64_t(smem),
                                                                 2048 / kLutThreads));
  int64_t bx = p.blocks_per_row > 0 ? p.blocks_per_row
                                    : table_blocks_per_row(n_rows, int64_t(device_info().n_sm) * per_sm, 64);
  if (lp.gqa_scratch) bx = std::min<int64_t>(bx, kMaxSlices);
  lut_rows_kernel<NQ><<<dim3(unsigned(bx), unsigned(n_rows)), kLutThreads, smem, static_cast<cudaStream_t>(x.stream)>>>(
      p, f, sh, lp, q0, q, rows, ranges);
  KVT_CUDA_LAUNCH_CHECK("lut_rows_kernel");
}

}  // namespace

void score_rows_lut(const Exec& x, const ScoreRowsParams& p, const QuantSpec& spec, const DevFormat& f,
                    const float* q, const uint8_t* const* rows, const StepRanges* ranges, const LutPass& lp) {
  const LutShape sh = lut_shape(spec, f.dim);
  const int max_nq = lut_queries_per_pass(spec, f.dim);
  KVT_CHECK(sh.n_pos > 0 && max_nq > 0 && f.dim == p.head_dim, "score_rows: {} does not suit the byte-table scorer",
            to_string(spec));
  KVT_CHECK(!lp.gqa_scratch || (p.n_q > 1 && reinterpret_cast<uintptr_t>(lp.gqa_scratch) % 8 == 0),
            "score_rows: softmax partials are for n_q > 1, in 8-byte aligned scratch");
  for (int q0 = 0; q0 < p.n_q;) {
    const int left = p.n_q - q0;
    const int nq = left >= 4 && max_nq >= 4 ? 4 : left >= 2 && max_nq >= 2 ? 2 : 1;
    if (nq == 4) launch<4>(x, p, f, sh, lp, q0, q, rows, ranges);
    else if (nq == 2) launch<2>(x, p, f, sh, lp, q0, q, rows, ranges);
    else launch<1>(x, p, f, sh, lp, q0, q, rows, ranges);
    q0 += nq;
  }
}

}  // namespace kvtier::cuda
