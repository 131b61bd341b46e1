// One block of 4 warps per (64-query tile, head); each warp owns 16 query
// rows. Per 64-key tile: S = Q·Kᵀ on tensor cores (WMMA 16×16×16 bf16 → f32),
// online softmax over shared memory (2 lanes per row), O (kept in shared
// memory in f32, rescaled in place) += P·V. Heavy (late) query tiles are
// scheduled first for causal load balance.
#include <cuda_bf16.h>
#include <mma.h>

#include "backend/cuda_backend.h"
#include "ops/flash_prefill/flash_prefill_cuda.h"

namespace kvtier::cuda {
namespace {

using namespace nvcuda;
constexpr int kBQ = 64, kBK = 64, kWarps = 4;
constexpr float kLog2e = 1.4426950408889634f;

template <int kD>
struct Smem {
  __nv_bfloat16 k[kBK * kD];             // [key, dim]
  __nv_bfloat16 v[kBK * kD];             // [key, dim]
  float s[kWarps][16 * kBK];             // [warp][row, key]
  __nv_bfloat16 pm[kWarps][16 * kBK];    // [warp][row, key]
  float o[kWarps][16 * kD];              // [warp][row, dim]
  float m[kWarps][16], l[kWarps][16];
};

template <int kD>
__global__ void __launch_bounds__(kWarps * 32) flash_prefill_kernel(FlashPrefillParams p, const __nv_bfloat16* q,
                                                                    const __nv_bfloat16* k,
                                                                    const __nv_bfloat16* v,
                                                                    __nv_bfloat16* out) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Smem<kD>& sm = *reinterpret_cast<Smem<kD>*>(smem_raw);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t n_qt = (p.n_q + kBQ - 1) / kBQ;
  const int64_t qt = n_qt - 1 - blockIdx.x;
  const int h = blockIdx.y, g = h / (p.n_head / p.n_kv_head);
  const int64_t q0 = qt * kBQ;
  const int64_t pos0 = p.n_kv - p.n_q + q0;  // position of query q0
  const float sl2 = p.scale * kLog2e;
  const int64_t out_stride = p.out_tok_stride ? p.out_tok_stride : p.q_tok_stride;

  // Q rows of this warp → the K tile buffer (reused), then fragments.
  {
    __nv_bfloat16* qs = sm.k + warp * 16 * kD;
    for (int i = lane; i < 16 * kD / 8; i += 32) {
      const int r = i / (kD / 8), c = i % (kD / 8);
      const int64_t t = q0 + warp * 16 + r;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (t < p.n_q) val = *reinterpret_cast<const uint4*>(q + t * p.q_tok_stride + int64_t(h) * kD + c * 8);
      reinterpret_cast<uint4*>(qs)[i] = val;
    }
  }
  __syncthreads();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> qf[kD / 16];
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) wmma::load_matrix_sync(qf[kk], sm.k + warp * 16 * kD + kk * 16, kD);
  for (int i = lane; i < 16 * kD; i += 32) sm.o[warp][i] = 0.f;
  if (lane < 16) {
    sm.m[warp][lane] = -INFINITY;
    sm.l[warp][lane] = 0.f;
  }
  const int64_t kv_end = min(p.n_kv, pos0 + kBQ);
  for (int64_t kv0 = 0; kv0 < kv_end; kv0 += kBK) {
    __syncthreads();  // previous tile (and the Q staging) consumed
    for (int i = threadIdx.x; i < kBK * kD / 8; i += kWarps * 32) {
      const int r = i / (kD / 8), c = i % (kD / 8);
      const int64_t t = kv0 + r;
      uint4 kv_k = make_uint4(0, 0, 0, 0), kv_v = make_uint4(0, 0, 0, 0);
      if (t < p.n_kv) {
        const int64_t off = t * p.kv_tok_stride + int64_t(g) * kD + c * 8;
        kv_k = *reinterpret_cast<const uint4*>(k + off);
        kv_v = *reinterpret_cast<const uint4*>(v + off);
      }
      reinterpret_cast<uint4*>(sm.k)[i] = kv_k;
      reinterpret_cast<uint4*>(sm.v)[i] = kv_v;
    }
    __syncthreads();
    // S = Q Kᵀ
#pragma unroll
    for (int n = 0; n < kBK / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.f);
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> kf;
        wmma::load_matrix_sync(kf, sm.k + n * 16 * kD + kk * 16, kD);
        wmma::mma_sync(acc, qf[kk], kf, acc);
      }
      wmma::store_matrix_sync(sm.s[warp] + n * 16, acc, kBK, wmma::mem_row_major);
    }
    __syncwarp();
    // Online softmax, one row at a time across the warp (lane c and c+32
    // own two keys): conflict-free shared-memory access, shuffle reductions.
    for (int r = 0; r < 16; ++r) {
      const int64_t qpos = pos0 + warp * 16 + r;
      float* srow = sm.s[warp] + r * kBK;
      float x[2];
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int c = lane + 32 * j;
        const int64_t kpos = kv0 + c;
        x[j] = (kpos <= qpos && kpos < p.n_kv) ? srow[c] * sl2 : -INFINITY;
        mx = fmaxf(mx, x[j]);
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_old = sm.m[warp][r];
      const float m_new = fmaxf(m_old, mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float corr = exp2f(m_old - m_use);
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const __nv_bfloat16 b = __float2bfloat16(exp2f(x[j] - m_use));
        sm.pm[warp][r * kBK + lane + 32 * j] = b;
        sum += __bfloat162float(b);  // normalize by what P·V actually sums
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      float* orow = sm.o[warp] + r * kD;
#pragma unroll
      for (int j = 0; j < kD / 32; ++j) orow[lane + 32 * j] *= corr;
      if (lane == 0) {
        sm.l[warp][r] = sm.l[warp][r] * corr + sum;
        sm.m[warp][r] = m_new;
      }
    }
    __syncwarp();
    // O += P V
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> pf[kBK / 16];
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) wmma::load_matrix_sync(pf[kk], sm.pm[warp] + kk * 16, kBK);
#pragma unroll
    for (int d = 0; d < kD / 16; ++d) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, sm.o[warp] + d * 16, kD, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> vf;
        wmma::load_matrix_sync(vf, sm.v + kk * 16 * kD + d * 16, kD);
        wmma::mma_sync(acc, pf[kk], vf, acc);
      }
      wmma::store_matrix_sync(sm.o[warp] + d * 16, acc, kD, wmma::mem_row_major);
    }
    __syncwarp();
  }
  // out = O / l
  for (int i = lane; i < 16 * kD / 2; i += 32) {
    const int r = i / (kD / 2), c = (i % (kD / 2)) * 2;
    const int64_t t = q0 + warp * 16 + r;
    if (t >= p.n_q) continue;
    const float l = sm.l[warp][r];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const float2 o = make_float2(sm.o[warp][r * kD + c] * inv, sm.o[warp][r * kD + c + 1] * inv);
    *reinterpret_cast<__nv_bfloat162*>(out + t * out_stride + int64_t(h) * kD + c) = __float22bfloat162_rn(o);
  }
}

template <int kD>
void launch(const FlashPrefillParams& p, const void* q, const void* k, const void* v, void* out, cudaStream_t s) {
  const size_t smem = sizeof(Smem<kD>);
  KVT_CUDA_CHECK(cudaFuncSetAttribute(flash_prefill_kernel<kD>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(unsigned((p.n_q + kBQ - 1) / kBQ), unsigned(p.n_head));
  flash_prefill_kernel<kD><<<grid, kWarps * 32, smem, s>>>(p, static_cast<const __nv_bfloat16*>(q),
                                                           static_cast<const __nv_bfloat16*>(k),
                                                           static_cast<const __nv_bfloat16*>(v),
                                                           static_cast<__nv_bfloat16*>(out));
  KVT_CUDA_LAUNCH_CHECK("flash_prefill_kernel");
}

}  // namespace

bool flash_prefill_supports(int head_dim) { return head_dim == 64 || head_dim == 128; }

void flash_prefill(const FlashPrefillParams& p, const void* q, const void* k, const void* v, void* out,
                   cudaStream_t s) {
  KVT_CHECK(flash_prefill_supports(p.head_dim), "flash_prefill: head_dim {} unsupported (64 or 128)", p.head_dim);
  KVT_CHECK(p.n_kv_head > 0 && p.n_head % p.n_kv_head == 0, "flash_prefill: n_head {} vs n_kv_head {}", p.n_head,
            p.n_kv_head);
  KVT_CHECK(p.n_q >= 0 && p.n_q <= p.n_kv, "flash_prefill: n_q {} must be <= n_kv {}", p.n_q, p.n_kv);
  KVT_CHECK(p.q_tok_stride % 8 == 0 && p.kv_tok_stride % 8 == 0 && p.out_tok_stride % 8 == 0,
            "flash_prefill: token strides must be multiples of 8 elements");
  if (p.n_q == 0) return;
  // The one dispatch switch from the runtime head_dim to the kernel's tile width.
  switch (p.head_dim) {
    case 64: return launch<64>(p, q, k, v, out, s);
    case 128: return launch<128>(p, q, k, v, out, s);
  }
}

}  // namespace kvtier::cuda
