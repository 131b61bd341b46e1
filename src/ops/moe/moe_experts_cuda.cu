// The experts' products of the MoE block on CUDA (moe_cuda.cu runs the rest,
// moe_cuda.h the whole): either a grouped tensor-core GEMM (the mma.sync
// m16n8k16 fragments and XOR-swizzled cp.async tiles of the flash prefill
// kernel, with each 64-row tile belonging to one expert, found by a binary
// search over the experts' tile offsets) or, for a handful of tokens, a GEMV
// over the active experts' weight rows only.
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda_backend.h"
#include "backend/cuda_mma.cuh"
#include "ops/moe/moe_cuda.h"
#include "ops/moe/moe_cuda_detail.cuh"

namespace kvtier::cuda::moe_detail {
namespace {

using namespace mma;
using bf16 = __nv_bfloat16;

constexpr int kBN = 128, kBK = 64, kGemmThreads = 128;  // grouped GEMM tile (rows: kBM)

__global__ void __launch_bounds__(kGemmThreads) grouped_gemm_kernel(ExpertGemmParams p, const bf16* __restrict__ a,
                                                                    const int32_t* __restrict__ a_rows,
                                                                    const bf16* __restrict__ w,
                                                                    const int32_t* __restrict__ offsets,
                                                                    const int32_t* __restrict__ tile_off,
                                                                    bf16* __restrict__ y) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  auto* sa = reinterpret_cast<bf16*>(smem_raw);  // [2][kBM, kBK]
  auto* sb = sa + 2 * kBM * kBK;                 // [2][kBN, kBK]
  __shared__ int s_src[kBM];                     // the A row of each tile row, -1 past the expert's rows
  const int tile = blockIdx.y;
  if (tile >= tile_off[p.n_expert]) return;
  // The expert owning this tile: the last e with tile_off[e] <= tile (it has
  // tile_off[e + 1] > tile, so it is never an expert without rows).
  int lo = 0, hi = p.n_expert - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (tile_off[mid] <= tile) lo = mid;
    else hi = mid - 1;
  }
  const int e = lo;
  const int row0 = offsets[e] + (tile - tile_off[e]) * kBM;
  const int n_rows = min(kBM, offsets[e + 1] - row0);
  const int n0 = blockIdx.x * kBN;
  const bf16* we = w + int64_t(e) * p.n * p.k;  // [n, k]
  if (threadIdx.x < kBM) {
    const int r = threadIdx.x;
    s_src[r] = r < n_rows ? (a_rows ? a_rows[row0 + r] : row0 + r) : -1;
  }
  __syncthreads();

  auto load = [&](int stage, int k0) {
    bf16* da = sa + stage * kBM * kBK;
    bf16* db = sb + stage * kBN * kBK;
    for (int i = threadIdx.x; i < kBM * (kBK / 8); i += kGemmThreads) {
      const int r = i >> 3, c = i & 7, kk = k0 + c * 8;
      const bool ok = s_src[r] >= 0 && kk < p.k;
      cp_async16(da + swz<kBK>(r, c * 8), a + (ok ? int64_t(s_src[r]) * p.lda + kk : 0), ok);
    }
    for (int i = threadIdx.x; i < kBN * (kBK / 8); i += kGemmThreads) {
      const int r = i >> 3, c = i & 7, kk = k0 + c * 8;
      const bool ok = n0 + r < p.n && kk < p.k;
      cp_async16(db + swz<kBK>(r, c * 8), we + (ok ? int64_t(n0 + r) * p.k + kk : 0), ok);
    }
  };

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wm = warp >> 1, wn = warp & 1;  // this warp: rows [32 wm, +32), columns [64 wn, +64)
  float acc[2][8][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int n = 0; n < 8; ++n) acc[i][n][0] = acc[i][n][1] = acc[i][n][2] = acc[i][n][3] = 0.f;

  const int n_k = (p.k + kBK - 1) / kBK;
  load(0, 0);
  cp_async_commit();
  for (int j = 0; j < n_k; ++j) {
    if (j + 1 < n_k) {
      load((j + 1) & 1, (j + 1) * kBK);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* ca = sa + (j & 1) * kBM * kBK;
    const bf16* cb = sb + (j & 1) * kBN * kBK;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t af[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i)
        ldmatrix_x4(af[i], ca + swz<kBK>(wm * 32 + i * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t b[4];
        const int col = wn * 64 + np * 16 + (lane & 7) + ((lane >> 4) & 1) * 8;
        ldmatrix_x4(b, cb + swz<kBK>(col, kk * 16 + ((lane >> 3) & 1) * 8));
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          mma16816(acc[i][2 * np], af[i], b[0], b[1]);
          mma16816(acc[i][2 * np + 1], af[i], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // this buffer is refilled by the next iteration's load
  }
  const int g = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm * 32 + i * 16 + g + 8 * h;
      if (r >= n_rows) continue;
      bf16* yrow = y + int64_t(row0 + r) * p.ldy;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int col = n0 + wn * 64 + nt * 8 + tig * 2;
        if (col < p.n)
          *reinterpret_cast<__nv_bfloat162*>(yrow + col) =
              __floats2bfloat162_rn(acc[i][nt][2 * h], acc[i][nt][2 * h + 1]);
      }
    }
}

constexpr int kGemvWarps = 8;

__device__ __forceinline__ void bf16x8_to_f32(const uint4& v, float (&f)[8]) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(u[i] << 16);
    f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}

// The same products for experts with at most kRows rows: one warp per weight
// row n of an active expert (blockIdx.y indexes the active list), so only the
// weights of experts that some token chose are read.
template <int kRows>
__global__ void __launch_bounds__(kGemvWarps * 32) expert_gemv_kernel(ExpertGemmParams p, const bf16* __restrict__ a,
                                                                      const int32_t* __restrict__ a_rows,
                                                                      const bf16* __restrict__ w,
                                                                      const int32_t* __restrict__ offsets,
                                                                      const int32_t* __restrict__ active,
                                                                      bf16* __restrict__ y) {
  if (int(blockIdx.y) >= active[p.n_expert]) return;
  const int e = active[blockIdx.y];
  const int lane = threadIdx.x & 31;
  const int n = blockIdx.x * kGemvWarps + (threadIdx.x >> 5);
  if (n >= p.n) return;
  const int row0 = offsets[e], n_rows = min(kRows, offsets[e + 1] - row0);
  const bf16* wr = w + (int64_t(e) * p.n + n) * p.k;  // [k]
  int64_t a_off[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    a_off[r] = r < n_rows ? int64_t(a_rows ? a_rows[row0 + r] : row0 + r) * p.lda : 0;
  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = 0.f;
#pragma unroll 4
  for (int c = lane * 8; c < p.k; c += 32 * 8) {
    float wf[8];
    bf16x8_to_f32(__ldg(reinterpret_cast<const uint4*>(wr + c)), wf);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r >= n_rows) break;
      float xf[8];
      bf16x8_to_f32(*reinterpret_cast<const uint4*>(a + a_off[r] + c), xf);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[r] = fmaf(wf[i], xf[i], acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(kFull, acc[r], o);
  if (lane == 0)
    for (int r = 0; r < n_rows; ++r) y[int64_t(row0 + r) * p.ldy + n] = __float2bfloat16(acc[r]);
}

}  // namespace

// Y rows [0, n_pairs) in expert order from A, through the GEMV (few tokens) or the grouped GEMM.
void expert_products(const ExpertGemmParams& p, int n_tok, int n_pairs, const void* a, const int32_t* a_rows,
                     const void* w, const int32_t* offsets, const int32_t* tile_off, const int32_t* active, void* y,
                     cudaStream_t s) {
  const auto* A = static_cast<const bf16*>(a);
  const auto* W = static_cast<const bf16*>(w);
  auto* Y = static_cast<bf16*>(y);
  if (n_tok <= kMoeGemvMaxTokens) {
    // An expert has at most one row per token; at most n_pairs experts are active.
    const dim3 grid(unsigned((p.n + kGemvWarps - 1) / kGemvWarps), unsigned(std::min(p.n_expert, n_pairs)));
    if (n_tok == 1) {
      expert_gemv_kernel<1><<<grid, kGemvWarps * 32, 0, s>>>(p, A, a_rows, W, offsets, active, Y);
    } else {
      expert_gemv_kernel<kMoeGemvMaxTokens><<<grid, kGemvWarps * 32, 0, s>>>(p, A, a_rows, W, offsets, active, Y);
    }
    KVT_CUDA_LAUNCH_CHECK("expert_gemv_kernel");
    return;
  }
  constexpr int smem = 2 * (kBM + kBN) * kBK * 2;
  static const bool configured = [] {
    KVT_CUDA_CHECK(cudaFuncSetAttribute(grouped_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)configured;
  // Σ_e ceil(rows_e / kBM) ≤ n_pairs / kBM + (experts with rows); surplus blocks exit at once.
  const int max_tiles = (n_pairs + kBM - 1) / kBM + std::min(p.n_expert, n_pairs);
  const dim3 grid(unsigned((p.n + kBN - 1) / kBN), unsigned(max_tiles));
  grouped_gemm_kernel<<<grid, kGemmThreads, smem, s>>>(p, A, a_rows, W, offsets, tile_off, Y);
  KVT_CUDA_LAUNCH_CHECK("grouped_gemm_kernel");
}

}  // namespace kvtier::cuda::moe_detail
