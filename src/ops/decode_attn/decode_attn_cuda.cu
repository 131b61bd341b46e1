// Split-K decode attention on mma.sync tensor cores. One block of 4 warps per
// (row, split); the warps take interleaved 16-token tiles of the split and
// each keeps its own online softmax. The GQA group's G query heads are the
// rows of the A operand (rows G..15 zero), so S = Q·Kᵀ of a 16-token tile is
// 2 × D/16 mma and every K/V byte is read once for the whole group. P is
// split into bf16 hi + lo parts for P·V (two mma each), which keeps the
// result at f32 accuracy. Tiles go global → shared with per-warp cp.async,
// double-buffered, rows XOR-swizzled for ldmatrix; FP8 tiles are widened to
// bf16 in shared memory first. Slots come from idx when given (-1 = skip).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda_backend.h"
#include "backend/cuda_mma.cuh"
#include "ops/decode_attn/decode_attn_cuda.h"
#include "ops/decode_attn/decode_attn_tile.cuh"

namespace kvtier::cuda {
namespace {

using namespace mma;

constexpr int kWarps = 4, kThreads = kWarps * 32, kTile = 16;
constexpr int kBlocksPerSm = 2;  // head_dim 128: ~210 registers per thread, 64 KB of shared memory per block
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }

// Slots of the row of sequence `seq`.
__device__ __forceinline__ int64_t row_tokens(const DecodeAttnParams& p, int seq) {
  return p.n_tok ? p.n_tok[int64_t(seq) * p.n_tok_stride] : p.n_tok_fixed;
}

template <KvElt E, int G, int D>
__global__ void __launch_bounds__(kThreads, 2) decode_attn_kernel(DecodeAttnParams p, const __nv_bfloat16* __restrict__ q,
                                                               const uint8_t* const* __restrict__ rows,
                                                               const int32_t* __restrict__ idx,
                                                               float* __restrict__ part_out,
                                                               float* __restrict__ part_lse) {
  constexpr bool kFp8 = E == KvElt::fp8;
  constexpr int kTileBytes = kTile * D * 2;  // one of K or V as bf16
  constexpr int kRawRow = kFp8 ? D : 2 * D;  // bytes of a K (or V) row in memory
  constexpr int kRawChunks = kRawRow / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tig = lane & 3;
  // Per warp 4 tile-sizes: bf16 = 2 stages × (K, V); FP8 = 2 raw stages × (K, V) at half size + one widened (K, V).
  unsigned char* ws = smem + warp * 4 * kTileBytes;
  const int64_t r = blockIdx.y;  // row = seq * n_kv_head + kv head
  const int seq = int(r / p.n_kv_head), kvh = int(r % p.n_kv_head);
  const float qscale = p.scale * kLog2e;  // scores in log2 units

  // Q as A fragments straight from global: row g < G is head kvh·G + g.
  uint32_t qf[D / 16][4];
  {
    const __nv_bfloat16* qh = q + (int64_t(seq) * p.n_head + kvh * G + (g < G ? g : 0)) * D;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      qf[kk][0] = g < G ? *reinterpret_cast<const uint32_t*>(qh + kk * 16 + tig * 2) : 0u;
      qf[kk][2] = g < G ? *reinterpret_cast<const uint32_t*>(qh + kk * 16 + 8 + tig * 2) : 0u;
      qf[kk][1] = qf[kk][3] = 0u;
    }
  }
  const int64_t n_row = row_tokens(p, seq);
  const int64_t chunk = (n_row + p.n_split - 1) / p.n_split;
  const int64_t j0 = int64_t(blockIdx.x) * chunk, j1 = min(n_row, j0 + chunk);
  const int n_tiles = j1 > j0 ? int((j1 - j0 + kTile - 1) / kTile) : 0;
  const uint8_t* kr = rows[r];
  const uint8_t* vr = rows[r] + p.v_offset;
  const int32_t* ir = idx ? idx + r * p.idx_stride : nullptr;

  // Issues the copies of tile `t` into stage `st`; returns its valid-token mask.
  auto issue = [&](int t, int st) -> uint32_t {
    const int64_t jt = j0 + int64_t(t) * kTile;
    int64_t my_slot = -1;
    if (lane < kTile && jt + lane < j1) my_slot = ir ? ir[jt + lane] : jt + lane;
    const uint32_t valid = __ballot_sync(0xffffffffu, my_slot >= 0);
    unsigned char* kd = ws + st * (kFp8 ? kTileBytes : 2 * kTileBytes);
    unsigned char* vd = kd + (kFp8 ? kTileBytes / 2 : kTileBytes);
#pragma unroll
    for (int c = lane; c < kTile * kRawChunks; c += 32) {
      const int tok = c / kRawChunks, cc = c % kRawChunks;
      const int64_t slot = __shfl_sync(0xffffffffu, my_slot, tok);
      const bool ok = slot >= 0;
      const int64_t off = (ok ? slot : 0) * p.tok_stride + cc * 16;
      // bf16 rows land swizzled (ldmatrix reads them); FP8 rows land plain (widened later).
      const int at = kFp8 ? tok * kRawRow + cc * 16 : 2 * swz<D>(tok, cc * 8);
      cp_async16(kd + at, kr + off, ok);
      cp_async16(vd + at, vr + off, ok);
    }
    return valid;
  };

  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_row[2] = {-INFINITY, -INFINITY}, l_row[2] = {0.f, 0.f};

  uint32_t valid_next = warp < n_tiles ? issue(warp, 0) : 0u;
  cp_async_commit();
  for (int t = warp, i = 0; t < n_tiles; t += kWarps, ++i) {
    const uint32_t valid = valid_next;
    if (t + kWarps < n_tiles) valid_next = issue(t + kWarps, (i + 1) & 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncwarp();
    const __nv_bfloat16* ck;
    const __nv_bfloat16* cv;
    if constexpr (kFp8) {
      const unsigned char* kd = ws + (i & 1) * kTileBytes;
      const unsigned char* vd = kd + kTileBytes / 2;
      auto* wk = reinterpret_cast<__nv_bfloat16*>(ws + 2 * kTileBytes);
      auto* wv = wk + kTile * D;
#pragma unroll
      for (int c = lane; c < kTile * kRawChunks; c += 32) {
        const int tok = c / kRawChunks, cc = c % kRawChunks;
#pragma unroll
        for (int kv = 0; kv < 2; ++kv) {
          const uint4 raw = *reinterpret_cast<const uint4*>((kv ? vd : kd) + tok * kRawRow + cc * 16);
          const __nv_fp8x2_e4m3* f = reinterpret_cast<const __nv_fp8x2_e4m3*>(&raw);
          uint32_t w[8];
#pragma unroll
          for (int e = 0; e < 8; ++e) w[e] = bf16x2_bits(__float22bfloat162_rn(float2(f[e])));
          __nv_bfloat16* dst = kv ? wv : wk;
          *reinterpret_cast<uint4*>(dst + swz<D>(tok, cc * 16)) = make_uint4(w[0], w[1], w[2], w[3]);
          *reinterpret_cast<uint4*>(dst + swz<D>(tok, cc * 16 + 8)) = make_uint4(w[4], w[5], w[6], w[7]);
        }
      }
      __syncwarp();
      ck = wk;
      cv = wv;
    } else {
      ck = reinterpret_cast<const __nv_bfloat16*>(ws + (i & 1) * 2 * kTileBytes);
      cv = ck + kTile * D;
    }
    // S = Q Kᵀ for the 16 tokens (two n8 tiles).
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t b[4];
      ldmatrix_x4(b, ck + swz<D>((lane & 7) + ((lane >> 4) & 1) * 8, kk * 16 + ((lane >> 3) & 1) * 8));
      mma16816(s[0], qf[kk], b[0], b[1]);
      mma16816(s[1], qf[kk], b[2], b[3]);
    }
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = n * 8 + tig * 2 + (e & 1);
        s[n][e] = (valid >> key) & 1u ? s[n][e] * qscale : -INFINITY;
      }
    decode_tile::online_softmax<D>(s, m_row, l_row, o);
    decode_tile::pv<D>(o, s, cv, lane);
    __syncwarp();  // this stage is refilled by the next issue
  }
  cp_async_wait<0>();
  // Merge the 4 warps through shared memory (the tiles').
  __syncthreads();
  const int64_t n_qh = int64_t(p.n_seq) * p.n_head;
  const int64_t part = p.part0 + blockIdx.x;
  decode_tile::merge_warps<G, D, kWarps>(reinterpret_cast<float*>(smem), m_row, l_row, o,
                                         [&](int gg, int d, float v, float lse) {
                                           const int64_t qh = int64_t(seq) * p.n_head + kvh * G + gg;
                                           part_out[(part * n_qh + qh) * D + d] = v;
                                           if (d == 0) part_lse[part * n_qh + qh] = lse;
                                         });
}

// The general case (head_dim 256, GQA groups the tensor-core kernel has no
// instance for): one warp per query head, lanes over the head's dimensions,
// online softmax over the split's slots.
template <KvElt E, int D>
__global__ void __launch_bounds__(128) decode_attn_generic_kernel(DecodeAttnParams p,
                                                                  const __nv_bfloat16* __restrict__ q,
                                                                  const uint8_t* const* __restrict__ rows,
                                                                  const int32_t* __restrict__ idx,
                                                                  float* __restrict__ part_out,
                                                                  float* __restrict__ part_lse) {
  constexpr int PL = D / 32;  // values per lane
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int group = p.n_head / p.n_kv_head;
  const int g = blockIdx.z * 4 + warp;
  if (g >= group) return;
  const int64_t r = blockIdx.y;
  const int seq = int(r / p.n_kv_head), kvh = int(r % p.n_kv_head);
  const int64_t qh = int64_t(seq) * p.n_head + int64_t(kvh) * group + g;
  float qv[PL], acc[PL];
#pragma unroll
  for (int i = 0; i < PL; ++i) {
    qv[i] = __bfloat162float(q[qh * D + lane * PL + i]) * p.scale;
    acc[i] = 0.f;
  }
  const int64_t n_row = row_tokens(p, seq);
  const int64_t chunk = (n_row + p.n_split - 1) / p.n_split;
  const int64_t j0 = int64_t(blockIdx.x) * chunk, j1 = min(n_row, j0 + chunk);
  const uint8_t* kr = rows[r];
  const uint8_t* vr = rows[r] + p.v_offset;
  const int32_t* ir = idx ? idx + r * p.idx_stride : nullptr;
  float m = -INFINITY, l = 0.f;
  for (int64_t j = j0; j < j1; ++j) {
    const int64_t slot = ir ? ir[j] : j;
    if (slot < 0) continue;
    float kf[PL], vf[PL];
    const uint8_t* kp = kr + slot * p.tok_stride;
    const uint8_t* vp = vr + slot * p.tok_stride;
#pragma unroll
    for (int i = 0; i < PL; ++i) {
      const int d = lane * PL + i;
      if constexpr (E == KvElt::fp8) {
        __nv_fp8_e4m3 a, b;
        a.__x = kp[d];
        b.__x = vp[d];
        kf[i] = float(a);
        vf[i] = float(b);
      } else {
        kf[i] = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(kp)[d]);
        vf[i] = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(vp)[d]);
      }
    }
    float sc = 0.f;
#pragma unroll
    for (int i = 0; i < PL; ++i) sc += qv[i] * kf[i];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sc += __shfl_xor_sync(0xffffffffu, sc, off);
    const float m_new = fmaxf(m, sc);
    const float corr = __expf(m - m_new), e = __expf(sc - m_new);
    l = l * corr + e;
#pragma unroll
    for (int i = 0; i < PL; ++i) acc[i] = acc[i] * corr + e * vf[i];
    m = m_new;
  }
  const int64_t n_qh = int64_t(p.n_seq) * p.n_head;
  const int64_t part = p.part0 + blockIdx.x;
#pragma unroll
  for (int i = 0; i < PL; ++i) part_out[(part * n_qh + qh) * D + lane * PL + i] = l > 0.f ? acc[i] / l : 0.f;
  if (lane == 0) part_lse[part * n_qh + qh] = l > 0.f ? m + __logf(l) : -INFINITY;
}

// One block per (sequence, head), a thread per dimension. Each part's weight
// e^(lse_j − M) is computed once, in parallel, into shared memory; the sums
// then run over j in order, as before, but with part_out's loads independent
// of each other (kMergeBatch in flight per thread, in registers): a thread
// walking the parts one load at a time took ~9 µs for 34 parts (ncu), and
// the same loads in an unrolled loop were still issued one at a time.
constexpr int kMergeParts = 128;  // weights staged per round
constexpr int kMergeBatch = 16;   // part_out loads in flight per thread

__global__ void attn_merge_kernel(int n_part, int64_t n_qh, int head_dim, const float* __restrict__ part_out,
                                  const float* __restrict__ part_lse, __nv_bfloat16* out_bf16, float* out_f32,
                                  float* lse) {
  const int64_t i = blockIdx.x;
  const int d = threadIdx.x;
  __shared__ float s_w[kMergeParts];
  __shared__ float s_max[32];
  float M = -INFINITY;
  for (int j = d; j < n_part; j += blockDim.x) M = fmaxf(M, part_lse[j * n_qh + i]);
  for (int off = 16; off > 0; off >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
  if ((d & 31) == 0) s_max[d >> 5] = M;
  __syncthreads();
  M = -INFINITY;
  for (int w = 0; w < int(blockDim.x >> 5); ++w) M = fmaxf(M, s_max[w]);
  float sum = 0.f, o = 0.f;
  if (M > -INFINITY) {  // the same M in every thread
    const int64_t step = n_qh * head_dim;
    for (int j0 = 0; j0 < n_part; j0 += kMergeParts) {
      const int n = min(kMergeParts, n_part - j0);
      __syncthreads();  // the previous round's weights are read
      for (int j = d; j < n; j += blockDim.x) s_w[j] = __expf(part_lse[(j0 + j) * n_qh + i] - M);
      __syncthreads();
      const float* po = part_out + (int64_t(j0) * n_qh + i) * head_dim + min(d, head_dim - 1);
      int j = 0;
      for (; j + kMergeBatch <= n; j += kMergeBatch) {  // kMergeBatch loads issued before their use
        float v[kMergeBatch];
#pragma unroll
        for (int u = 0; u < kMergeBatch; ++u) v[u] = po[(j + u) * step];
#pragma unroll
        for (int u = 0; u < kMergeBatch; ++u) {
          sum += s_w[j + u];
          o += s_w[j + u] * v[u];
        }
      }
      for (; j < n; ++j) {
        sum += s_w[j];
        o += s_w[j] * po[j * step];
      }
    }
  }
  const float res = sum > 0.f ? o / sum : 0.f;
  if (d < head_dim) {
    if (out_bf16) out_bf16[i * head_dim + d] = __float2bfloat16(res);
    if (out_f32) out_f32[i * head_dim + d] = res;
  }
  if (lse && d == 0) lse[i] = sum > 0.f ? M + __logf(sum) : -INFINITY;
}

template <KvElt E, int G, int D>
void launch(const DecodeAttnParams& p, const void* q, const uint8_t* const* rows, const int32_t* idx,
            float* po, float* pl, cudaStream_t s) {
  const dim3 grid{unsigned(p.n_split), unsigned(p.n_seq * p.n_kv_head)};
  const int smem = kWarps * 4 * kTile * D * 2;
  static const bool configured = [smem] {  // once per instance: the decode step launches it every layer
    KVT_CUDA_CHECK(cudaFuncSetAttribute(decode_attn_kernel<E, G, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)configured;
  decode_attn_kernel<E, G, D><<<grid, kThreads, smem, s>>>(p, static_cast<const __nv_bfloat16*>(q), rows, idx, po, pl);
  KVT_CUDA_LAUNCH_CHECK("decode_attn_kernel");
}

template <KvElt E, int D>
void launch_generic(const DecodeAttnParams& p, const void* q, const uint8_t* const* rows, const int32_t* idx,
                    float* po, float* pl, cudaStream_t s) {
  const int group = p.n_head / p.n_kv_head;
  const dim3 grid{unsigned(p.n_split), unsigned(p.n_seq * p.n_kv_head), unsigned((group + 3) / 4)};
  decode_attn_generic_kernel<E, D><<<grid, 128, 0, s>>>(p, static_cast<const __nv_bfloat16*>(q), rows, idx, po, pl);
  KVT_CUDA_LAUNCH_CHECK("decode_attn_generic_kernel");
}

template <KvElt E, int D>
void dispatch_group(const DecodeAttnParams& p, const void* q, const uint8_t* const* rows, const int32_t* idx,
                    float* po, float* pl, cudaStream_t s) {
  switch (p.n_head / p.n_kv_head) {
    case 1: return launch<E, 1, D>(p, q, rows, idx, po, pl, s);
    case 2: return launch<E, 2, D>(p, q, rows, idx, po, pl, s);
    case 3: return launch<E, 3, D>(p, q, rows, idx, po, pl, s);
    case 4: return launch<E, 4, D>(p, q, rows, idx, po, pl, s);
    case 5: return launch<E, 5, D>(p, q, rows, idx, po, pl, s);
    case 6: return launch<E, 6, D>(p, q, rows, idx, po, pl, s);
    case 7: return launch<E, 7, D>(p, q, rows, idx, po, pl, s);
    case 8: return launch<E, 8, D>(p, q, rows, idx, po, pl, s);
    default: return launch_generic<E, D>(p, q, rows, idx, po, pl, s);
  }
}

}  // namespace

int decode_attn_splits(int64_t n_rows, int64_t n_tok, int64_t min_tokens) {
  // One wave of blocks (kBlocksPerSm per SM): 8 warps per SM, each with a
  // 16-token tile in flight while it computes the previous one.
  const int64_t want = (int64_t(device_info().n_sm) * kBlocksPerSm + n_rows - 1) / std::max<int64_t>(1, n_rows);
  const int64_t cap = std::max<int64_t>(1, n_tok / std::max<int64_t>(1, min_tokens));
  return int(std::max<int64_t>(1, std::min(want, cap)));
}

void decode_attn(const Exec& x, const DecodeAttnParams& p, const void* q_bf16, const uint8_t* const* rows,
                 const int32_t* idx, float* part_out, float* part_lse) {
  KVT_CHECK(p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256,
            "decode_attn (CUDA): head_dim {} unsupported (64, 128 or 256)", p.head_dim);
  KVT_CHECK(p.n_kv_head > 0 && p.n_head % p.n_kv_head == 0, "decode_attn: n_head {} vs n_kv_head {}", p.n_head,
            p.n_kv_head);
  KVT_CHECK(p.n_split >= 1, "decode_attn: n_split {} < 1", p.n_split);
  KVT_CHECK(p.elt != KvElt::f32, "decode_attn (CUDA): f32 slots are the CPU's (the GPU reads bf16 or fp8)");
  KVT_CHECK(p.tok_stride % 16 == 0 && p.v_offset % 16 == 0,
            "decode_attn: K/V slots must be 16-byte aligned (tok_stride {}, v_offset {})", p.tok_stride, p.v_offset);
  if (p.n_seq == 0) return;
  const cudaStream_t s = static_cast<cudaStream_t>(x.stream);
  // The one dispatch switch from (element type, head_dim) to the kernel; the
  // GQA group is the next switch (dispatch_group).
  const bool bf16 = p.elt == KvElt::bf16;
  if (p.head_dim == 256) {
    if (bf16) launch_generic<KvElt::bf16, 256>(p, q_bf16, rows, idx, part_out, part_lse, s);
    else launch_generic<KvElt::fp8, 256>(p, q_bf16, rows, idx, part_out, part_lse, s);
  } else if (p.head_dim == 64) {
    if (bf16) dispatch_group<KvElt::bf16, 64>(p, q_bf16, rows, idx, part_out, part_lse, s);
    else dispatch_group<KvElt::fp8, 64>(p, q_bf16, rows, idx, part_out, part_lse, s);
  } else {
    if (bf16) dispatch_group<KvElt::bf16, 128>(p, q_bf16, rows, idx, part_out, part_lse, s);
    else dispatch_group<KvElt::fp8, 128>(p, q_bf16, rows, idx, part_out, part_lse, s);
  }
}

void attn_merge(const Exec& x, int n_part, int64_t n_qh, int head_dim, const float* part_out, const float* part_lse,
                void* out, bool out_f32, float* lse) {
  KVT_CHECK(head_dim > 0 && head_dim <= 1024, "attn_merge: head_dim {} out of range", head_dim);
  if (n_qh == 0) return;
  attn_merge_kernel<<<unsigned(n_qh), unsigned((head_dim + 31) / 32 * 32), 0, static_cast<cudaStream_t>(x.stream)>>>(
      n_part, n_qh, head_dim, part_out, part_lse, out_f32 ? nullptr : static_cast<__nv_bfloat16*>(out),
      out_f32 ? static_cast<float*>(out) : nullptr, lse);
  KVT_CUDA_LAUNCH_CHECK("attn_merge_kernel");
}

}  // namespace kvtier::cuda
