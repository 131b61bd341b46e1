// Split-K decode attention. One block of 128 threads per (row, split), cut
// into lane groups of D/8 lanes (half-warps for head_dim 128, quarter-warps
// for 64); the lanes of a group share one token (8 dims each, one 16-byte
// bf16 or 8-byte fp8 load for K and one for V) and keep the online softmax of
// all G query heads of the KV head, so every K/V byte is read once for the group.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda_backend.h"
#include "ops/decode_attn/decode_attn_cuda.h"

namespace kvtier::cuda {
namespace {

constexpr int kThreads = 128;
constexpr float kLog2e = 1.4426950408889634f;

template <KvElt E>
struct EltLoad;
template <>
struct EltLoad<KvElt::bf16> {
  using Raw = uint4;
  static __device__ __forceinline__ Raw load(const uint8_t* row, int sub) {
    return __ldg(reinterpret_cast<const uint4*>(row) + sub);
  }
  static __device__ __forceinline__ void unpack(const Raw& raw, float* v) {
    const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(b[i]);
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  }
};
template <>
struct EltLoad<KvElt::fp8> {
  using Raw = uint2;
  static __device__ __forceinline__ Raw load(const uint8_t* row, int sub) {
    return __ldg(reinterpret_cast<const uint2*>(row) + sub);
  }
  static __device__ __forceinline__ void unpack(const Raw& raw, float* v) {
    const __nv_fp8x2_e4m3* b = reinterpret_cast<const __nv_fp8x2_e4m3*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = float2(b[i]);
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  }
};

template <KvElt E, int G, int D>
__global__ void __launch_bounds__(kThreads) decode_attn_kernel(DecodeAttnParams p, const __nv_bfloat16* __restrict__ q,
                                                               const uint8_t* __restrict__ k,
                                                               const uint8_t* __restrict__ v,
                                                               const int32_t* __restrict__ idx,
                                                               float* __restrict__ part_out,
                                                               float* __restrict__ part_lse) {
  using L = EltLoad<E>;
  constexpr int kLanes = D / 8, kTokGroups = kThreads / kLanes;  // lanes per token, tokens in flight
  __shared__ float sm_m[kTokGroups][G], sm_l[kTokGroups][G];
  __shared__ float sm_acc[kTokGroups][G][D];
  const int64_t r = blockIdx.y;  // row = seq * n_kv_head + kv head
  const int split = blockIdx.x;
  const int seq = int(r / p.n_kv_head), kvh = int(r % p.n_kv_head);
  const int hw = threadIdx.x / kLanes, sub = threadIdx.x % kLanes;
  const float qscale = p.scale * kLog2e;  // scores in log2 units

  float qv[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const __nv_bfloat16* qh = q + (int64_t(seq) * p.n_head + kvh * G + g) * D + sub * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) qv[g][i] = __bfloat162float(qh[i]) * qscale;
  }
  float m[G], l[G], acc[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;
  }
  const int64_t chunk = (p.n_tok + p.n_split - 1) / p.n_split;
  const int64_t j0 = split * chunk, j1 = min(p.n_tok, j0 + chunk);
  const uint8_t* kr = k + r * p.row_stride;
  const uint8_t* vr = v + r * p.row_stride;
  const int32_t* ir = idx ? idx + r * p.idx_stride : nullptr;

  constexpr int U = 2;
  for (int64_t jb0 = j0; jb0 < j1; jb0 += kTokGroups * U) {  // uniform trip count
    const int64_t jb = jb0 + hw;
    typename L::Raw kraw[U], vraw[U];
    bool ok[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t j = jb + u * kTokGroups;
      int64_t slot = j < j1 ? (ir ? ir[j] : j) : -1;
      ok[u] = slot >= 0;
      if (ok[u]) {
        kraw[u] = L::load(kr + slot * p.tok_stride, sub);
        vraw[u] = L::load(vr + slot * p.tok_stride, sub);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      // All lane groups of a warp must reach the shuffles: a missing token
      // computes on zeros and is masked out of the update.
      float kf[8], vf[8];
      if (!ok[u]) {
        kraw[u] = {};
        vraw[u] = {};
      }
      L::unpack(kraw[u], kf);
      L::unpack(vraw[u], vf);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) s += qv[g][i] * kf[i];
#pragma unroll
        for (int off = kLanes / 2; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off, kLanes);
        if (!ok[u]) continue;
        const float m_new = fmaxf(m[g], s);
        const float corr = exp2f(m[g] - m_new);
        const float w = exp2f(s - m_new);
        l[g] = l[g] * corr + w;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = acc[g][i] * corr + w * vf[i];
        m[g] = m_new;
      }
    }
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (sub == 0) {
      sm_m[hw][g] = m[g];
      sm_l[hw][g] = l[g];
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) sm_acc[hw][g][sub * 8 + i] = acc[g][i];
  }
  __syncthreads();
  const int64_t n_qh = int64_t(p.n_seq) * p.n_head;
  const int d = threadIdx.x;  // threads [0, D) own one output dim each
  if (d >= D) return;  // after the block's last barrier
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float M = -INFINITY;
#pragma unroll
    for (int h = 0; h < kTokGroups; ++h) M = fmaxf(M, sm_m[h][g]);
    float Lsum = 0.f, o = 0.f;
    if (M > -INFINITY) {
#pragma unroll
      for (int h = 0; h < kTokGroups; ++h) {
        const float w = exp2f(sm_m[h][g] - M);
        Lsum += sm_l[h][g] * w;
        o += sm_acc[h][g][d] * w;
      }
    }
    const int64_t qh = int64_t(seq) * p.n_head + kvh * G + g;
    const int64_t part = p.part0 + split;
    part_out[(part * n_qh + qh) * D + d] = Lsum > 0.f ? o / Lsum : 0.f;
    if (d == 0) part_lse[part * n_qh + qh] = Lsum > 0.f ? (M + log2f(Lsum)) * 0.6931471805599453f : -INFINITY;
  }
}

__global__ void attn_merge_kernel(int n_part, int64_t n_qh, int head_dim, const float* __restrict__ part_out,
                                  const float* __restrict__ part_lse, __nv_bfloat16* out_bf16, float* out_f32,
                                  float* lse) {
  const int64_t i = blockIdx.x;
  const int d = threadIdx.x;
  float M = -INFINITY;
  for (int j = 0; j < n_part; ++j) M = fmaxf(M, part_lse[j * n_qh + i]);
  float sum = 0.f, o = 0.f;
  if (M > -INFINITY) {
    for (int j = 0; j < n_part; ++j) {
      const float w = __expf(part_lse[j * n_qh + i] - M);
      sum += w;
      if (d < head_dim) o += w * part_out[(j * n_qh + i) * head_dim + d];
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
void launch(const DecodeAttnParams& p, const void* q, const uint8_t* k, const uint8_t* v, const int32_t* idx,
            float* po, float* pl, cudaStream_t s) {
  const dim3 grid(unsigned(p.n_split), unsigned(p.n_seq * p.n_kv_head));
  decode_attn_kernel<E, G, D><<<grid, kThreads, 0, s>>>(p, static_cast<const __nv_bfloat16*>(q), k, v, idx, po, pl);
  KVT_CUDA_LAUNCH_CHECK("decode_attn_kernel");
}

template <KvElt E, int D>
void dispatch_group(const DecodeAttnParams& p, const void* q, const uint8_t* k, const uint8_t* v,
                    const int32_t* idx, float* po, float* pl, cudaStream_t s) {
  switch (p.n_head / p.n_kv_head) {
    case 1: return launch<E, 1, D>(p, q, k, v, idx, po, pl, s);
    case 2: return launch<E, 2, D>(p, q, k, v, idx, po, pl, s);
    case 3: return launch<E, 3, D>(p, q, k, v, idx, po, pl, s);
    case 4: return launch<E, 4, D>(p, q, k, v, idx, po, pl, s);
    case 8: return launch<E, 8, D>(p, q, k, v, idx, po, pl, s);
    default: fail("decode_attn (CUDA): GQA group {} unsupported (1, 2, 3, 4, 8)", p.n_head / p.n_kv_head);
  }
}

}  // namespace

bool decode_attn_supports(int head_dim, int group) {
  const bool group_ok = group == 1 || group == 2 || group == 3 || group == 4 || group == 8;
  return (head_dim == 64 || head_dim == 128) && group_ok;
}

int decode_attn_splits(int64_t n_rows, int64_t n_tok, int64_t min_tokens) {
  // ~8 blocks (32 warps) per SM: enough loads in flight to cover HBM latency.
  const int64_t want = (int64_t(device_info().n_sm) * 8 + n_rows - 1) / std::max<int64_t>(1, n_rows);
  const int64_t cap = std::max<int64_t>(1, n_tok / std::max<int64_t>(1, min_tokens));
  return int(std::max<int64_t>(1, std::min(want, cap)));
}

void decode_attn(const DecodeAttnParams& p, const void* q_bf16, const uint8_t* k, const uint8_t* v,
                 const int32_t* idx, float* part_out, float* part_lse, cudaStream_t s) {
  KVT_CHECK(decode_attn_supports(p.head_dim, 1), "decode_attn (CUDA): head_dim {} unsupported (64 or 128)", p.head_dim);
  KVT_CHECK(p.n_kv_head > 0 && p.n_head % p.n_kv_head == 0, "decode_attn: n_head {} vs n_kv_head {}", p.n_head,
            p.n_kv_head);
  KVT_CHECK(p.n_split >= 1, "decode_attn: n_split {} < 1", p.n_split);
  const int64_t align = p.elt == KvElt::bf16 ? 16 : 8;
  KVT_CHECK(p.row_stride % align == 0 && p.tok_stride % align == 0 &&
                reinterpret_cast<uintptr_t>(k) % align == 0 && reinterpret_cast<uintptr_t>(v) % align == 0,
            "decode_attn: K/V rows must be {}-byte aligned (row_stride {}, tok_stride {})", align, p.row_stride,
            p.tok_stride);
  // The one dispatch switch from (element type, head_dim) to the kernel; the
  // GQA group is the next switch (dispatch_group).
  const bool bf16 = p.elt == KvElt::bf16;
  if (p.head_dim == 64) {
    if (bf16) dispatch_group<KvElt::bf16, 64>(p, q_bf16, k, v, idx, part_out, part_lse, s);
    else dispatch_group<KvElt::fp8, 64>(p, q_bf16, k, v, idx, part_out, part_lse, s);
  } else {
    if (bf16) dispatch_group<KvElt::bf16, 128>(p, q_bf16, k, v, idx, part_out, part_lse, s);
    else dispatch_group<KvElt::fp8, 128>(p, q_bf16, k, v, idx, part_out, part_lse, s);
  }
}

void attn_merge(int n_part, int64_t n_qh, int head_dim, const float* part_out, const float* part_lse,
                void* out_bf16, float* out_f32, float* lse, cudaStream_t s) {
  KVT_CHECK(head_dim > 0 && head_dim <= 1024, "attn_merge: head_dim {} out of range", head_dim);
  if (n_qh == 0) return;
  attn_merge_kernel<<<unsigned(n_qh), unsigned((head_dim + 31) / 32 * 32), 0, s>>>(
      n_part, n_qh, head_dim, part_out, part_lse, static_cast<__nv_bfloat16*>(out_bf16), out_f32, lse);
  KVT_CUDA_LAUNCH_CHECK("attn_merge_kernel");
}

}  // namespace kvtier::cuda
