// The steps the tensor-core decode-attention kernels share
// (decode_attn_cuda.cu over slots, record_attn_cuda.cu over store records):
// a warp's online softmax over one 16-token tile (its GQA group's queries
// are the rows g < G of the mma A operand), P·V with P split into bf16
// hi + lo, and the merge of a block's warps. Include from .cu files only.
#pragma once
#include <cuda_bf16.h>

#include "backend/cuda_mma.cuh"

namespace kvtier::cuda::decode_tile {

// s: the tile's scores in log2 units (−inf for masked tokens), as the C
// fragments of two n8 tiles: lane (g, tig) holds rows g (e < 2) and g + 8 of
// keys n·8 + tig·2 + (e & 1). Updates the rows' running max and sum, rescales
// o, and leaves each key's probability e^(s − max) in s.
template <int D>
__device__ __forceinline__ void online_softmax(float (&s)[2][4], float (&m_row)[2], float (&l_row)[2],
                                               float (&o)[D / 8][4]) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
  float corr[2], m_use[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    mx[rr] = fmaxf(mx[rr], __shfl_xor_sync(0xffffffffu, mx[rr], 1));
    mx[rr] = fmaxf(mx[rr], __shfl_xor_sync(0xffffffffu, mx[rr], 2));
    const float m_new = fmaxf(m_row[rr], mx[rr]);
    m_use[rr] = m_new == -INFINITY ? 0.f : m_new;
    corr[rr] = exp2f(m_row[rr] - m_use[rr]);
    m_row[rr] = m_new;
    l_row[rr] *= corr[rr];
  }
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float pe = exp2f(s[n][e] - m_use[e >> 1]);
      s[n][e] = pe;
      l_row[e >> 1] += pe;
    }
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    o[n][0] *= corr[0];
    o[n][1] *= corr[0];
    o[n][2] *= corr[1];
    o[n][3] *= corr[1];
  }
}

// The tile's probabilities as the A fragments of P·V, split into bf16 hi + lo
// (together they keep the product at f32 accuracy).
__device__ __forceinline__ void p_fragments(const float (&s)[2][4], uint32_t (&hi)[4], uint32_t (&lo)[4]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float x0 = s[e >> 1][(e & 1) * 2], x1 = s[e >> 1][(e & 1) * 2 + 1];
    const __nv_bfloat162 h2 = __floats2bfloat162_rn(x0, x1);
    const float2 hf = __bfloat1622float2(h2);
    hi[e] = *reinterpret_cast<const uint32_t*>(&h2);
    lo[e] = mma::pack_bf16(x0 - hf.x, x1 - hf.y);
  }
}

// O += P·V for the tile: P (the probabilities above) as p_fragments; V a
// [16][D] bf16 tile in shared memory, rows swizzled (mma::swz), read
// transposed.
template <int D>
__device__ __forceinline__ void pv(float (&o)[D / 8][4], const float (&s)[2][4], const __nv_bfloat16* v, int lane) {
  uint32_t hi[4], lo[4];
  p_fragments(s, hi, lo);
#pragma unroll
  for (int dp = 0; dp < D / 16; ++dp) {
    uint32_t b[4];
    mma::ldmatrix_x4_trans(b, v + mma::swz<D>((lane & 7) + ((lane >> 3) & 1) * 8, dp * 16 + (lane >> 4) * 8));
    mma::mma16816(o[2 * dp], hi, b[0], b[1]);
    mma::mma16816(o[2 * dp + 1], hi, b[2], b[3]);
    mma::mma16816(o[2 * dp], lo, b[0], b[1]);
    mma::mma16816(o[2 * dp + 1], lo, b[2], b[3]);
  }
}

// Merges the block's kWarps online softmaxes of rows 0..G−1 through shared
// memory (smem: (2 + D)·kWarps·G floats; the caller syncs the block before,
// as the call reuses its tiles) and calls emit(gg, d, value, lse) for every
// element of the G × D output, spread over the block's threads: value the
// normalized output (0 for an empty row), lse its log-sum-exp in natural
// units (−inf for an empty row).
template <int G, int D, int kWarps, class Emit>
__device__ __forceinline__ void merge_warps(float* smem, const float (&m_row)[2], const float (&l_row)[2],
                                            const float (&o)[D / 8][4], Emit emit) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  float* sm_m = smem;               // [kWarps][G]
  float* sm_l = sm_m + kWarps * G;  // [kWarps][G]
  float* sm_o = sm_l + kWarps * G;  // [kWarps][G][D]
  {
    float l = l_row[0];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (g < G) {
      if (tig == 0) {
        sm_m[warp * G + g] = m_row[0];
        sm_l[warp * G + g] = l;
      }
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        sm_o[(warp * G + g) * D + n * 8 + tig * 2] = o[n][0];
        sm_o[(warp * G + g) * D + n * 8 + tig * 2 + 1] = o[n][1];
      }
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < G * D; e += kWarps * 32) {
    const int gg = e / D, d = e % D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm_m[w * G + gg]);
    float Lsum = 0.f, acc = 0.f;
    if (M > -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float wt = exp2f(sm_m[w * G + gg] - M);
        Lsum += sm_l[w * G + gg] * wt;
        acc += sm_o[(w * G + gg) * D + d] * wt;
      }
    }
    emit(gg, d, Lsum > 0.f ? acc / Lsum : 0.f, Lsum > 0.f ? (M + log2f(Lsum)) * 0.6931471805599453f : -INFINITY);
  }
}

}  // namespace kvtier::cuda::decode_tile
