// index_append: one warp per (token, KV head); lane l owns values 4l..4l+3
// and the Hadamard of 128 runs across the warp (hadamard_cuda.cuh). The norm and the nearest-point search are in f64 like
// the CPU reference, so codes differ only at exact f32-rounding ties.
// entry_append: one thread per 8 elements of K or V (16-byte load, 8- or
// 16-byte store), straight to the destination (pinned host through its mapped
// pointer, or device memory).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "backend/cuda_backend.h"
#include "ops/kv_append/kv_append_cuda.h"
#include "ops/quant/hadamard_cuda.cuh"

namespace kvtier::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

__global__ void index_append_kernel(IndexAppendParams p, const __nv_bfloat16* __restrict__ k, int64_t k_tok_stride,
                                    const float* __restrict__ grid, const float* __restrict__ signs,
                                    uint8_t* __restrict__ index) {
  __shared__ float4 pts[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) pts[i] = reinterpret_cast<const float4*>(grid)[i];
  __syncthreads();
  const int64_t w = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (w >= p.n_tok * p.n_kv_head) return;
  const int lane = threadIdx.x & 31;
  const int64_t t = w / p.n_kv_head;
  const int h = int(w % p.n_kv_head);
  const __nv_bfloat16* kr = k + t * k_tok_stride + int64_t(h) * 128 + 4 * lane;
  float x[4];
  double n2 = 0;
  for (int i = 0; i < 4; ++i) {
    x[i] = __bfloat162float(kr[i]);
    n2 += double(x[i]) * double(x[i]);
    if (signs) x[i] *= signs[4 * lane + i];
  }
  for (int m = 16; m >= 1; m >>= 1) n2 += __shfl_xor_sync(0xffffffffu, n2, m);
  warp_hadamard128(x, lane);
  const float inv_sqrt = 0.08838834764831845f;  // 1/√128
  const __nv_bfloat16 sigma_h = __float2bfloat16_rn(float(sqrt(n2 / 128.0)));
  const float sigma = __bfloat162float(sigma_h);
  double u[4];
  for (int i = 0; i < 4; ++i) u[i] = sigma > 0 ? double(x[i] * inv_sqrt / sigma) : 0.0;
  int best = 0;
  double best_d = 1e300;
  for (int cc = 0; cc < 256; ++cc) {
    const float4 g = pts[cc];
    const double e0 = u[0] - g.x, e1 = u[1] - g.y, e2 = u[2] - g.z, e3 = u[3] - g.w;
    const double dist = e0 * e0 + e1 * e1 + e2 * e2 + e3 * e3;
    if (dist < best_d) {
      best_d = dist;
      best = cc;
    }
  }
  uint8_t* row = index + int64_t(h) * p.row_stride;
  const int64_t tok = p.pos0 + t;
  row[32 * tok + lane] = uint8_t(best);
  if (lane == 0) *reinterpret_cast<__nv_bfloat16*>(row + p.scale_offset + 2 * tok) = sigma_h;
}

__global__ void entry_append_kernel(EntryAppendParams p, const __nv_bfloat16* __restrict__ k,
                                    const __nv_bfloat16* __restrict__ v, int64_t kv_tok_stride, uint8_t* dst) {
  const int per_half = p.head_dim / 8;  // threads per K (or V) row
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n = p.n_tok * p.n_kv_head * 2 * per_half;
  if (i >= n) return;
  const int part = int(i % per_half);
  const int kv = int((i / per_half) % 2);
  const int64_t th = i / (2 * per_half);
  const int64_t t = th / p.n_kv_head;
  const int h = int(th % p.n_kv_head);
  const __nv_bfloat16* src = (kv ? v : k) + t * kv_tok_stride + int64_t(h) * p.head_dim + 8 * part;
  const uint4 raw = *reinterpret_cast<const uint4*>(src);
  uint8_t* e = dst + (p.pos0 + t) * p.tok_stride + int64_t(h) * p.row_stride;
  if (p.elt == KvElt::bf16) {
    *reinterpret_cast<uint4*>(e + int64_t(kv) * p.head_dim * 2 + 16 * part) = raw;
    return;
  }
  const __nv_bfloat16* b = reinterpret_cast<const __nv_bfloat16*>(&raw);
  uint8_t out[8];
  for (int j = 0; j < 8; ++j) out[j] = __nv_cvt_float_to_fp8(__bfloat162float(b[j]), __NV_SATFINITE, __NV_E4M3);
  *reinterpret_cast<uint2*>(e + int64_t(kv) * p.head_dim + 8 * part) = *reinterpret_cast<const uint2*>(out);
}

constexpr int kRecordThreads = 256;

__global__ void __launch_bounds__(kRecordThreads) record_append_kernel(HiggsRecordLayout L, int64_t pos0,
                                                                       int64_t tok_stride,
                                                                       const __nv_bfloat16* __restrict__ k,
                                                                       const __nv_bfloat16* __restrict__ v,
                                                                       int64_t kv_tok_stride,
                                                                       const float* __restrict__ grid,
                                                                       const float* __restrict__ signs, uint8_t* dst) {
  extern __shared__ float u[];  // [group]
  __shared__ float2 pts[256];
  __shared__ double part[kRecordThreads / 32];
  const int64_t t = blockIdx.x / 2;
  const int which = blockIdx.x % 2;  // 0: K, 1: V
  const int tid = threadIdx.x, G = L.group;
  for (int i = tid; i < 256; i += blockDim.x) pts[i] = reinterpret_cast<const float2*>(grid)[i];
  const __nv_bfloat16* src = (which ? v : k) + t * kv_tok_stride;
  uint8_t* tok = dst + (pos0 + t) * tok_stride;
  for (int g = 0; g < L.n_group; ++g) {
    double n2 = 0;
    for (int i = tid; i < G; i += blockDim.x) {
      const float x = __bfloat162float(src[int64_t(g) * G + i]);
      n2 += double(x) * double(x);
      u[i] = signs ? x * signs[i] : x;
    }
    for (int m = 16; m >= 1; m >>= 1) n2 += __shfl_xor_sync(0xffffffffu, n2, m);
    if ((tid & 31) == 0) part[tid / 32] = n2;
    __syncthreads();
    n2 = 0;
    for (int w = 0; w < kRecordThreads / 32; ++w) n2 += part[w];
    const __nv_bfloat16 sigma_h = __float2bfloat16_rn(float(sqrt(n2 / G)));
    const float sigma = __bfloat162float(sigma_h);
    for (int len = 1; len < G; len <<= 1) {  // Sylvester-order butterflies
      for (int q = tid; q < G / 2; q += blockDim.x) {
        const int i = (q / len) * 2 * len + q % len;
        const float a = u[i], b = u[i + len];
        u[i] = a + b;
        u[i + len] = a - b;
      }
      __syncthreads();
    }
    const float inv = rsqrtf(float(G));
    for (int p = tid; p < G / 2; p += blockDim.x) {
      const double u0 = sigma > 0 ? double(u[2 * p] * inv / sigma) : 0.0;
      const double u1 = sigma > 0 ? double(u[2 * p + 1] * inv / sigma) : 0.0;
      int best = 0;
      double best_d = 1e300;
      for (int c = 0; c < 256; ++c) {
        const double e0 = u0 - pts[c].x, e1 = u1 - pts[c].y;
        const double d = e0 * e0 + e1 * e1;
        if (d < best_d) {
          best_d = d;
          best = c;
        }
      }
      tok[L.code_offset(g, which) + p] = uint8_t(best);
    }
    if (tid == 0) *reinterpret_cast<__nv_bfloat16*>(tok + L.scale_offset(g, which)) = sigma_h;
    __syncthreads();  // u and part are reused by the next group
  }
  // Zero padding: after both records, or after each head's codes and scales.
  if (which == 1) {
    if (L.per_head) {
      const int64_t used = 2 * L.code_bytes + 4, pad = L.entry_bytes - used;
      for (int64_t i = tid; i < L.n_group * pad; i += blockDim.x) tok[(i / pad) * L.entry_bytes + used + i % pad] = 0;
    } else {
      for (int64_t i = 2 * L.record_bytes + tid; i < L.entry_bytes; i += blockDim.x) tok[i] = 0;
    }
  }
}

}  // namespace

void record_append(const HiggsRecordLayout& L, int64_t n_tok, int64_t pos0, int64_t tok_stride, const void* k_bf16,
                   const void* v_bf16, int64_t kv_tok_stride, const float* grid, const float* signs, uint8_t* dst,
                   cudaStream_t s) {
  KVT_CHECK(L.group >= 128 && L.group <= 8192 && L.n_group * L.group == L.width && L.tok_bytes >= 2 * L.record_bytes,
            "record_append: layout of group {} over {} values invalid", L.group, L.width);
  KVT_CHECK(n_tok >= 0 && pos0 >= 0 && tok_stride >= L.tok_bytes && kv_tok_stride >= L.width,
            "record_append: n_tok {} pos0 {} tok_stride {} kv_tok_stride {} invalid", n_tok, pos0, tok_stride,
            kv_tok_stride);
  if (n_tok == 0) return;
  const size_t smem = size_t(L.group) * 4;
  auto kern = record_append_kernel;
  if (smem > 48 * 1024)
    KVT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kern<<<unsigned(2 * n_tok), kRecordThreads, smem, s>>>(L, pos0, tok_stride, static_cast<const __nv_bfloat16*>(k_bf16),
                                                        static_cast<const __nv_bfloat16*>(v_bf16), kv_tok_stride, grid,
                                                        signs, dst);
  KVT_CUDA_LAUNCH_CHECK("record_append_kernel");
}

void index_append(const IndexAppendParams& p, const void* k_bf16, int64_t k_tok_stride, const float* grid,
                  const float* signs, uint8_t* index, cudaStream_t s) {
  KVT_CHECK(p.n_kv_head > 0 && p.n_tok >= 0 && p.pos0 >= 0, "index_append: n_kv_head {} n_tok {} pos0 {} invalid",
            p.n_kv_head, p.n_tok, p.pos0);
  KVT_CHECK(p.scale_offset >= 32 * (p.pos0 + p.n_tok) && p.scale_offset % 2 == 0 &&
                p.row_stride >= p.scale_offset + 2 * (p.pos0 + p.n_tok),
            "index_append: row_stride {} / scale_offset {} leave no room for token {}", p.row_stride, p.scale_offset,
            p.pos0 + p.n_tok);
  KVT_CHECK(k_tok_stride >= int64_t(p.n_kv_head) * 128 && reinterpret_cast<uintptr_t>(k_bf16) % 8 == 0,
            "index_append: key token stride {} or alignment invalid", k_tok_stride);
  if (p.n_tok == 0) return;
  const int64_t n_warps = p.n_tok * p.n_kv_head;
  const unsigned blocks = unsigned((n_warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
  index_append_kernel<<<blocks, 32 * kWarpsPerBlock, 0, s>>>(p, static_cast<const __nv_bfloat16*>(k_bf16),
                                                               k_tok_stride, grid, signs, index);
  KVT_CUDA_LAUNCH_CHECK("index_append_kernel");
}

void entry_append(const EntryAppendParams& p, const void* k_bf16, const void* v_bf16, int64_t kv_tok_stride,
                  uint8_t* dst, cudaStream_t s) {
  KVT_CHECK(p.n_kv_head > 0 && p.n_tok >= 0 && p.pos0 >= 0 && p.head_dim % 16 == 0 && p.head_dim > 0,
            "entry_append: n_kv_head {} n_tok {} pos0 {} head_dim {} invalid", p.n_kv_head, p.n_tok, p.pos0,
            p.head_dim);
  const int64_t entry = kv_entry_bytes(p.elt, p.head_dim);
  KVT_CHECK(p.row_stride >= entry && p.tok_stride >= p.n_kv_head * p.row_stride && p.row_stride % 16 == 0 &&
                p.tok_stride % 16 == 0,
            "entry_append: strides ({}, {}) do not hold {}-byte entries of {} heads (multiples of 16)", p.tok_stride,
            p.row_stride, entry, p.n_kv_head);
  KVT_CHECK(kv_tok_stride % 8 == 0 && reinterpret_cast<uintptr_t>(k_bf16) % 16 == 0 &&
                reinterpret_cast<uintptr_t>(v_bf16) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0,
            "entry_append: sources and destination must be 16-byte aligned");
  const int64_t n = p.n_tok * p.n_kv_head * 2 * (p.head_dim / 8);
  if (n == 0) return;
  entry_append_kernel<<<unsigned((n + 255) / 256), 256, 0, s>>>(p, static_cast<const __nv_bfloat16*>(k_bf16),
                                                                 static_cast<const __nv_bfloat16*>(v_bf16),
                                                                 kv_tok_stride, dst);
  KVT_CUDA_LAUNCH_CHECK("entry_append_kernel");
}

}  // namespace kvtier::cuda
