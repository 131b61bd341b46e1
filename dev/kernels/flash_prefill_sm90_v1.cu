// Kernel-lab copy: v1 of the Hopper flash-prefill kernel, the version first sent to the GPU
// (live code: src/ops/flash_prefill/flash_prefill_sm90.cu; notes: dev/kernels/NOTES.md).
// Flash attention for Hopper (sm_90a), FlashAttention-3 style: head_dim 128,
// bf16 in and out, f32 accumulation, causal, GQA. One block of three
// warpgroups per (128-query tile, head):
//  - warpgroup 0 is the producer: after setmaxnreg.dec one thread issues TMA
//    loads (cp.async.bulk.tensor, 128-byte swizzle) of the Q tile once and of
//    the K and V tiles (128 keys) into a 2-stage ring; each load completes on
//    an mbarrier ("full"), and the consumers free K and V of a stage through
//    two others ("empty", one arrival per consumer thread): K as soon as S is
//    computed, V after P·V, so that the next K tile loads a whole iteration
//    before it is needed;
//  - warpgroups 1 and 2 are consumers with 240 registers each (setmaxnreg.inc),
//    64 query rows apiece: S = Q·Kᵀ by wgmma with both operands in shared
//    memory (K-major), the online softmax in registers, and O += P·V by wgmma
//    with P from registers (the accumulator layout of S re-packed as the A
//    fragment) and V in shared memory read MN-major (transposed descriptor).
// With `overlap`, S of tile j is issued before P·V of tile j-1, and the
// softmax of tile j runs while the tensor cores do that P·V (FlashAttention-3,
// Shah et al. 2024, "intra-warpgroup overlapping").
// Shared-memory tiles: a [128 rows, 128 cols] bf16 tile is two TMA boxes of
// [128 rows][64 cols] (128 bytes a row, 16-byte chunk c of row r stored at
// chunk c ^ (r % 8)), each 1024-byte aligned: the layout the wgmma 128B-swizzle
// descriptors describe (K-major: 8-row groups 1024 B apart, a k16 step is +32 B
// inside the 128-byte row, +16 KB to the second box; MN-major for V: a k16 step
// is 16 rows = +2 KB, the second 64-column block +16 KB).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cudaTypedefs.h>

#include "backend/cuda_backend.h"
#include "backend/cuda_sm90.cuh"
#include "ops/flash_prefill/flash_prefill_sm90.h"

namespace kvtier::cuda {
namespace {

using namespace sm90;

constexpr int kD = 128;                    // head_dim
constexpr int kBM = 128;                   // query rows per block, 64 per consumer warpgroup
constexpr int kBN = 128;                   // keys per K/V tile
constexpr int kStages = 2;                 // K/V tiles in flight
constexpr int kThreads = 3 * 128;          // producer + 2 consumer warpgroups
constexpr int kConsumerThreads = 2 * 128;  // arrivals that free a stage
constexpr int kBoxBytes = 128 * 64 * 2;    // one TMA box: [128 rows][64 cols] bf16
constexpr int kTileBytes = 2 * kBoxBytes;  // [128, 128]: cols 0-63 in box 0, 64-127 in box 1
constexpr int kQOff = 0;
constexpr int kKOff = kQOff + kTileBytes;
constexpr int kVOff = kKOff + kStages * kTileBytes;
constexpr int kBarOff = kVOff + kStages * kTileBytes;
constexpr int kNumBars = 1 + 4 * kStages;  // q_full, k_full[], v_full[], k_empty[], v_empty[]
constexpr int kSmemBytes = kBarOff + kNumBars * 8 + 1024;  // + slack to align the base to 1024
constexpr int kProducerRegs = 24, kConsumerRegs = 240;    // 128·24 + 256·240 ≤ 65536
constexpr float kLog2e = 1.4426950408889634f;

static_assert(kD == 128 && kBM == 128 && kBN == 128, "the descriptors and fragments below assume 128");
static_assert(kBarOff % 1024 == 0 && kTileBytes % 1024 == 0, "tiles must stay 1024-byte aligned");

struct Bars {
  uint32_t base;  // shared address of the first barrier
  __device__ uint32_t q_full() const { return base; }
  __device__ uint32_t k_full(int s) const { return base + 8 * (1 + s); }
  __device__ uint32_t v_full(int s) const { return base + 8 * (1 + kStages + s); }
  __device__ uint32_t k_empty(int s) const { return base + 8 * (1 + 2 * kStages + s); }
  __device__ uint32_t v_empty(int s) const { return base + 8 * (1 + 3 * kStages + s); }
};

#if KVT_SM90A_DEVICE

// S[64 rows, 128 keys] = Q[64, 128] · K[128 keys, 128]ᵀ: 8 k16 steps. Step kk
// reads columns 16kk..16kk+15: box kk/4, +32 bytes per step inside the row.
__device__ __forceinline__ void gemm_qk(float (&s)[64], uint64_t desc_q, uint64_t desc_k) {
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint64_t off = uint64_t(((kk >> 2) * kBoxBytes + (kk & 3) * 32) >> 4);
    wgmma_m64n128k16_ss(s, desc_q + off, desc_k + off, kk > 0 ? 1 : 0);
  }
}

// O[64, 128] += P[64, 128 keys] · V[128 keys, 128]: step kk takes keys
// 16kk..16kk+15, i.e. rows 16kk.. of both V boxes (+2 KB per step).
__device__ __forceinline__ void gemm_pv(float (&o)[64], const uint32_t (&pa)[8][4], uint64_t desc_v) {
#pragma unroll
  for (int kk = 0; kk < kBN / 16; ++kk) wgmma_m64n128k16_rs_bt(o, pa[kk], desc_v + uint64_t((kk * 16 * 128) >> 4), 1);
}

__device__ __forceinline__ void fence_p(uint32_t (&pa)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) reg_fence(pa[kk]);
}

// Online softmax of one S tile held in the accumulator layout: this thread
// has rows g and g+8 of its warp's 16 (r = e >> 1) and, per n8 block j, keys
// 8j + 2t and 8j + 2t + 1. Masks keys past lim[r] (the last key row r may see,
// relative to the tile), turns S into P = 2^(S·sl2 − m·sl2) in place, updates
// the running max m (raw score units) and this thread's partial row sums l,
// and returns in corr the factor for O (and l) of the earlier tiles.
template <bool kMask>
__device__ __forceinline__ void online_softmax(float (&s)[64], float (&m)[2], float (&l)[2], float (&corr)[2],
                                               const int (&lim)[2], int t, float sl2) {
  if constexpr (kMask) {
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (8 * j + 2 * t + (e & 1) > lim[e >> 1]) s[4 * j + e] = -INFINITY;
  }
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[4 * j + e]);
  float ms[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // a row is spread over the 4 threads of a quad
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float m_use = mx[r] == -INFINITY ? 0.f : mx[r];  // a row with nothing visible yet
    corr[r] = ex2((m[r] - m_use) * sl2);                     // m = -inf → 0
    m[r] = mx[r];
    ms[r] = m_use * sl2;
  }
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float pe = ex2(fmaf(s[4 * j + e], sl2, -ms[e >> 1]));
      s[4 * j + e] = pe;
      sum[e >> 1] += pe;
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = l[r] * corr[r] + sum[r];
}

__device__ __forceinline__ void rescale_o(float (&o)[64], const float (&corr)[2]) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    o[4 * j + 0] *= corr[0];
    o[4 * j + 1] *= corr[0];
    o[4 * j + 2] *= corr[1];
    o[4 * j + 3] *= corr[1];
  }
}

// P (f32, accumulator layout) → bf16 A fragments: k16 step kk covers n8
// blocks 2kk (keys 16kk + 2t, +1) and 2kk+1 (keys 16kk + 8 + 2t, +1).
__device__ __forceinline__ void p_to_bf16(uint32_t (&pa)[8][4], const float (&s)[64]) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    pa[kk][0] = pack_bf16x2(s[8 * kk + 0], s[8 * kk + 1]);
    pa[kk][1] = pack_bf16x2(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = pack_bf16x2(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = pack_bf16x2(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

struct ConsumerCtx {
  uint64_t desc_q;           // this warpgroup's 64 Q rows
  uint32_t k_base, v_base;   // shared address of stage 0 of K and V
  int64_t row_pos;           // position of this thread's row g (row g+8 is + 8)
  int64_t wg_pos;            // position of the warpgroup's first row
  int64_t n_kv;
  int t;
  float sl2;

  __device__ uint64_t desc_k(int st) const { return smem_desc_sw128(k_base + st * kTileBytes, 16, 1024); }
  __device__ uint64_t desc_v(int st) const { return smem_desc_sw128(v_base + st * kTileBytes, kBoxBytes, 1024); }
  // Masking is needed when some key of the tile lies after some row's
  // position or past the end of the keys.
  __device__ bool needs_mask(int64_t kv0) const { return kv0 + kBN - 1 > wg_pos || kv0 + kBN > n_kv; }
  __device__ void softmax(float (&s)[64], float (&m)[2], float (&l)[2], float (&corr)[2], int64_t kv0) const {
    if (needs_mask(kv0)) {
      int lim[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t last = min(row_pos + 8 * r, n_kv - 1) - kv0;  // -1 (clamped): the row sees none of the tile
        lim[r] = int(max(last, int64_t(-1)));
      }
      online_softmax<true>(s, m, l, corr, lim, t, sl2);
    } else {
      const int lim[2] = {kBN, kBN};
      online_softmax<false>(s, m, l, corr, lim, t, sl2);
    }
  }
};

// The consumer warpgroups' main loop; returns O (unnormalized) and the
// thread's partial row sums l.
template <bool kOverlap>
__device__ __forceinline__ void consume(const ConsumerCtx& c, const Bars& bars, int n_tiles, float (&o)[64],
                                        float (&l)[2]) {
  float s[64];
  uint32_t pa[8][4];
  float m[2] = {-INFINITY, -INFINITY}, corr[2];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = s[i] = 0.f;
  l[0] = l[1] = 0.f;
  mbar_wait(bars.q_full(), 0);

  if constexpr (!kOverlap) {
    for (int j = 0; j < n_tiles; ++j) {
      const int st = j % kStages;
      const uint32_t ph = uint32_t(j / kStages) & 1u;
      const int64_t kv0 = int64_t(j) * kBN;
      mbar_wait(bars.k_full(st), ph);
      reg_fence(s);
      wgmma_fence();
      gemm_qk(s, c.desc_q, c.desc_k(st));
      wgmma_commit();
      wgmma_wait<0>();
      reg_fence(s);
      mbar_arrive(bars.k_empty(st));
      c.softmax(s, m, l, corr, kv0);
      rescale_o(o, corr);
      p_to_bf16(pa, s);
      mbar_wait(bars.v_full(st), ph);
      reg_fence(o);
      fence_p(pa);
      wgmma_fence();
      gemm_pv(o, pa, c.desc_v(st));
      wgmma_commit();
      wgmma_wait<0>();
      reg_fence(o);
      fence_p(pa);
      mbar_arrive(bars.v_empty(st));
    }
  } else {
    // Tile 0: S and its softmax (O is still zero).
    mbar_wait(bars.k_full(0), 0);
    reg_fence(s);
    wgmma_fence();
    gemm_qk(s, c.desc_q, c.desc_k(0));
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(s);
    mbar_arrive(bars.k_empty(0));
    c.softmax(s, m, l, corr, 0);
    p_to_bf16(pa, s);
    for (int j = 1; j < n_tiles; ++j) {
      const int st = j % kStages, sp = (j - 1) % kStages;
      mbar_wait(bars.k_full(st), uint32_t(j / kStages) & 1u);
      mbar_wait(bars.v_full(sp), uint32_t((j - 1) / kStages) & 1u);
      reg_fence(s);
      reg_fence(o);
      fence_p(pa);
      wgmma_fence();
      gemm_qk(s, c.desc_q, c.desc_k(st));  // S_j ...
      wgmma_commit();
      gemm_pv(o, pa, c.desc_v(sp));  // ... then O += P_{j-1} V_{j-1}
      wgmma_commit();
      wgmma_wait<1>();  // S_j done; P·V still running
      reg_fence(s);
      mbar_arrive(bars.k_empty(st));
      c.softmax(s, m, l, corr, int64_t(j) * kBN);
      wgmma_wait<0>();
      reg_fence(o);
      fence_p(pa);
      mbar_arrive(bars.v_empty(sp));
      rescale_o(o, corr);
      p_to_bf16(pa, s);
    }
    const int sl = (n_tiles - 1) % kStages;
    mbar_wait(bars.v_full(sl), uint32_t((n_tiles - 1) / kStages) & 1u);
    reg_fence(o);
    fence_p(pa);
    wgmma_fence();
    gemm_pv(o, pa, c.desc_v(sl));
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(o);
    fence_p(pa);
    mbar_arrive(bars.v_empty(sl));
  }
}

// A consumer warpgroup: attention of its 64 query rows, then O / l out.
template <bool kOverlap>
__device__ __forceinline__ void consumer_warpgroup(const FlashPrefillParams& p, uint32_t base, unsigned char* smem,
                                                   const Bars& bars, int h, int64_t q0, int64_t pos0, int n_tiles,
                                                   __nv_bfloat16* __restrict__ out) {
  const int cw = int(threadIdx.x / 128) - 1;  // consumer warpgroup: query rows [64cw, 64cw + 64) of the tile
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  ConsumerCtx c;
  c.desc_q = smem_desc_sw128(base + kQOff + cw * 64 * 128, 16, 1024);
  c.k_base = base + kKOff;
  c.v_base = base + kVOff;
  c.wg_pos = pos0 + cw * 64;
  c.row_pos = c.wg_pos + warp * 16 + g;
  c.n_kv = p.n_kv;
  c.t = t;
  c.sl2 = p.scale * kLog2e;

  float o[64], l[2];
  consume<kOverlap>(c, bars, n_tiles, o, l);

  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float x = l[r];
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    inv[r] = x > 0.f ? 1.f / x : 0.f;
  }
  // O / l as bf16 into this warpgroup's own Q rows (no longer read), laid out
  // like the TMA boxes (columns 0-63 in box 0, 64-127 in box 1, 16-byte chunk
  // c of row r at chunk c ^ (r % 8): the quad's 4-byte writes of 8 rows hit 32
  // different banks), then out with 16-byte coalesced stores.
  fence_proxy_async_shared();       // the wgmma (async-proxy) reads of Q before these stores
  named_barrier_sync(1 + cw, 128);  // every warp's wgmma reads of Q are done
  unsigned char* so = smem + kQOff + cw * 64 * 128;
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp * 16 + g + 8 * r;  // row % 8 == g
      unsigned char* dst = so + (j >> 3) * kBoxBytes + row * 128 + (((j & 7) ^ g) << 4) + 4 * t;
      *reinterpret_cast<uint32_t*>(dst) = pack_bf16x2(o[4 * j + 2 * r] * inv[r], o[4 * j + 2 * r + 1] * inv[r]);
    }
  named_barrier_sync(1 + cw, 128);
  const int64_t out_stride = p.out_tok_stride ? p.out_tok_stride : p.q_tok_stride;
#pragma unroll
  for (int i = tid; i < 64 * 16; i += 128) {
    const int row = i >> 4, cc = i & 15;
    const int64_t tok = q0 + cw * 64 + row;
    if (tok >= p.n_q) continue;
    const uint4 v =
        *reinterpret_cast<const uint4*>(so + (cc >> 3) * kBoxBytes + row * 128 + (((cc & 7) ^ (row & 7)) << 4));
    *reinterpret_cast<uint4*>(out + tok * out_stride + int64_t(h) * kD + cc * 8) = v;
  }
}

#endif  // KVT_SM90A_DEVICE

template <bool kOverlap>
__global__ void __launch_bounds__(kThreads, 1)
    flash_prefill_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                              const __grid_constant__ CUtensorMap tm_v, const FlashPrefillParams p,
                              __nv_bfloat16* __restrict__ out) {
#if KVT_SM90A_DEVICE
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw);  // generic pointer to the aligned base
  const Bars bars{base + kBarOff};

  const int wg = threadIdx.x / 128;
  const int h = blockIdx.x, kvh = h / (p.n_head / p.n_kv_head);
  const int64_t n_qt = (p.n_q + kBM - 1) / kBM;
  const int64_t q0 = (n_qt - 1 - blockIdx.y) * kBM;  // heavy (late) tiles first
  const int64_t pos0 = p.n_kv - p.n_q + q0;          // position of query q0
  const int64_t kv_end = min(p.n_kv, pos0 + kBM);
  const int n_tiles = int((kv_end + kBN - 1) / kBN);

  if (threadIdx.x == 0) {
    mbar_init(bars.q_full(), 1);
    for (int st = 0; st < kStages; ++st) {
      mbar_init(bars.k_full(st), 1);
      mbar_init(bars.v_full(st), 1);
      mbar_init(bars.k_empty(st), kConsumerThreads);
      mbar_init(bars.v_empty(st), kConsumerThreads);
    }
    fence_mbar_init();
  }
  __syncthreads();

  if (wg == 0) {
    setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) {
      tma_prefetch_map(&tm_q);
      tma_prefetch_map(&tm_k);
      tma_prefetch_map(&tm_v);
      mbar_arrive_expect_tx(bars.q_full(), kTileBytes);
      tma_load_2d(base + kQOff, &tm_q, bars.q_full(), h * kD, int(q0));
      tma_load_2d(base + kQOff + kBoxBytes, &tm_q, bars.q_full(), h * kD + 64, int(q0));
      for (int j = 0; j < n_tiles; ++j) {
        const int st = j % kStages;
        // Fill f = j / kStages of a stage waits for the release of fill f - 1.
        const uint32_t free_parity = (uint32_t(j / kStages) & 1u) ^ 1u;
        const int kv0 = j * kBN;
        const uint32_t kdst = base + kKOff + st * kTileBytes, vdst = base + kVOff + st * kTileBytes;
        if (j >= kStages) mbar_wait_or_trap(bars.k_empty(st), free_parity);
        mbar_arrive_expect_tx(bars.k_full(st), kTileBytes);
        tma_load_2d(kdst, &tm_k, bars.k_full(st), kvh * kD, kv0);
        tma_load_2d(kdst + kBoxBytes, &tm_k, bars.k_full(st), kvh * kD + 64, kv0);
        if (j >= kStages) mbar_wait_or_trap(bars.v_empty(st), free_parity);
        mbar_arrive_expect_tx(bars.v_full(st), kTileBytes);
        tma_load_2d(vdst, &tm_v, bars.v_full(st), kvh * kD, kv0);
        tma_load_2d(vdst + kBoxBytes, &tm_v, bars.v_full(st), kvh * kD + 64, kv0);
      }
    }
  } else {
    setmaxnreg_inc<kConsumerRegs>();
    consumer_warpgroup<kOverlap>(p, base, smem, bars, h, q0, pos0, n_tiles, out);
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // built without sm_90a; the host never launches this (flash_prefill_sm90_built)
#endif
}

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult res{};
    KVT_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &res));
    KVT_CHECK(res == cudaDriverEntryPointSuccess && f != nullptr,
              "flash_prefill: the driver has no cuTensorMapEncodeTiled (query result {})", int(res));
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// TMA map of a [rows, width] bf16 matrix whose rows lie `stride` elements
// apart, read in [128 rows][64 cols] boxes with the 128-byte swizzle; rows
// past `rows` arrive as zeros.
CUtensorMap tile_map(const void* data, int64_t width, int64_t rows, int64_t stride, const char* what) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {cuuint64_t(width), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(stride) * 2};
  const cuuint32_t box[2] = {64, 128};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(data), dims,
                                          strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                          CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  KVT_CHECK(r == CUDA_SUCCESS, "flash_prefill: cuTensorMapEncodeTiled failed ({}) for {}: [{}, {}], row stride {}",
            int(r), what, rows, width, stride);
  return m;
}

template <bool kOverlap>
void launch(const FlashPrefillParams& p, const void* q, const void* k, const void* v, void* out, cudaStream_t s) {
  static const bool configured = [] {
    KVT_CUDA_CHECK(cudaFuncSetAttribute(flash_prefill_sm90_kernel<kOverlap>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    return true;
  }();
  (void)configured;
  const CUtensorMap tq = tile_map(q, int64_t(p.n_head) * kD, p.n_q, p.q_tok_stride, "q");
  const CUtensorMap tk = tile_map(k, int64_t(p.n_kv_head) * kD, p.n_kv, p.kv_tok_stride, "k");
  const CUtensorMap tv = tile_map(v, int64_t(p.n_kv_head) * kD, p.n_kv, p.kv_tok_stride, "v");
  const int64_t n_qt = (p.n_q + kBM - 1) / kBM;
  KVT_CHECK(n_qt <= 65535, "flash_prefill: {} query tokens exceed the grid limit", p.n_q);
  const dim3 grid(unsigned(p.n_head), unsigned(n_qt));
  flash_prefill_sm90_kernel<kOverlap>
      <<<grid, kThreads, kSmemBytes, s>>>(tq, tk, tv, p, static_cast<__nv_bfloat16*>(out));
  KVT_CUDA_LAUNCH_CHECK("flash_prefill_sm90_kernel");
}

}  // namespace

bool flash_prefill_sm90_built() {
#if defined(KVT_CUDA_SM90A)
  return true;
#else
  return false;
#endif
}

void flash_prefill_sm90(const FlashPrefillParams& p, const void* q, const void* k, const void* v, void* out,
                        bool overlap, cudaStream_t s) {
  KVT_CHECK(p.head_dim == kD, "flash_prefill (sm90): head_dim {} unsupported (128)", p.head_dim);
  KVT_CHECK(p.n_kv < (int64_t(1) << 31), "flash_prefill (sm90): {} keys exceed the TMA coordinate range", p.n_kv);
  if (overlap)
    launch<true>(p, q, k, v, out, s);
  else
    launch<false>(p, q, k, v, out, s);
}

}  // namespace kvtier::cuda
