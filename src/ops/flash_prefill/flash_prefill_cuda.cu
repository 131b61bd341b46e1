// Flash attention, FA2 style, on mma.sync tensor cores (m16n8k16 bf16 → f32).
// One block of 4 warps per (64-query tile, head); each warp owns 16 query
// rows and keeps everything of them in registers: Q fragments, S = Q·Kᵀ of the
// current 64-key tile, P = exp2(S − m) re-packed as the A operand of P·V
// (the accumulator layout of two n8 tiles is the A layout of one k16 step),
// and the f32 O accumulator. K and V tiles go global → shared with cp.async,
// double-buffered (the next tile loads while this one is computed); shared
// rows are XOR-swizzled in 16-byte chunks so that ldmatrix (plain for K,
// .trans for V) is conflict-free. The blocks of one query tile run for all
// heads back to back (heads on blockIdx.x) so a GQA group's K/V tile is read
// from L2; heavy (late) query tiles are scheduled first.
// This file also holds the checks and the dispatch between this kernel and the
// Hopper one (flash_prefill_sm90.cu), see FlashPrefillKernel.
#include <cuda_bf16.h>

#include <atomic>

#include "backend/cuda_backend.h"
#include "backend/cuda_mma.cuh"
#include "ops/flash_prefill/flash_prefill_cuda.h"
#include "ops/flash_prefill/flash_prefill_sm90.h"

namespace kvtier::cuda {
namespace {

using namespace mma;

constexpr int kBQ = 64, kBK = 64, kWarps = 4, kThreads = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;

// rows [0, kRows) of a tile starting at token t0 (tokens ≥ n zero-filled).
template <int kD, int kRows>
__device__ __forceinline__ void load_tile(__nv_bfloat16* dst, const __nv_bfloat16* src, int64_t t0, int64_t n,
                                          int64_t tok_stride) {
  constexpr int kChunks = kD / 8;
#pragma unroll
  for (int i = threadIdx.x; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const int64_t t = t0 + r;
    const bool ok = t < n;
    cp_async16(dst + swz<kD>(r, c * 8), src + (ok ? t : 0) * tok_stride + c * 8, ok);
  }
}

template <int kD>
__global__ void __launch_bounds__(kThreads, 2) flash_prefill_kernel(FlashPrefillParams p,
                                                                    const __nv_bfloat16* __restrict__ q,
                                                                    const __nv_bfloat16* __restrict__ k,
                                                                    const __nv_bfloat16* __restrict__ v,
                                                                    __nv_bfloat16* __restrict__ out) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  auto* sk = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [2][kBK, kD]
  auto* sv = sk + 2 * kBK * kD;                            // [2][kBK, kD]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tig = lane & 3;  // mma fragment row group / thread in group
  const int h = blockIdx.x, kvh = h / (p.n_head / p.n_kv_head);
  const int64_t n_qt = (p.n_q + kBQ - 1) / kBQ;
  const int64_t q0 = (n_qt - 1 - blockIdx.y) * kBQ;
  const int64_t pos0 = p.n_kv - p.n_q + q0;  // position of query q0
  const float sl2 = p.scale * kLog2e;
  const int64_t out_stride = p.out_tok_stride ? p.out_tok_stride : p.q_tok_stride;
  const __nv_bfloat16* kh = k + int64_t(kvh) * kD;
  const __nv_bfloat16* vh = v + int64_t(kvh) * kD;

  const int64_t kv_end = min(p.n_kv, pos0 + kBQ);
  const int n_tiles = int((kv_end + kBK - 1) / kBK);

  // Q staged through the second K buffer, then held as A fragments.
  load_tile<kD, kBQ>(sk + kBK * kD, q + int64_t(h) * kD, q0, p.n_q, p.q_tok_stride);
  cp_async_commit();
  load_tile<kD, kBK>(sk, kh, 0, p.n_kv, p.kv_tok_stride);
  load_tile<kD, kBK>(sv, vh, 0, p.n_kv, p.kv_tok_stride);
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();
  uint32_t qf[kD / 16][4];
  {
    const __nv_bfloat16* sq = sk + kBK * kD;
    const int r = warp * 16 + (lane & 15);
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) ldmatrix_x4(qf[kk], sq + swz<kD>(r, kk * 16 + (lane >> 4) * 8));
  }
  __syncthreads();  // the Q staging area is the next K buffer

  float o[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_row[2] = {-INFINITY, -INFINITY}, l_row[2] = {0.f, 0.f};
  const int64_t qpos_lo = pos0 + warp * 16 + g;  // row g; row g + 8 is qpos_lo + 8

  for (int j = 0; j < n_tiles; ++j) {
    const int64_t kv0 = int64_t(j) * kBK;
    if (j + 1 < n_tiles) {
      const int nb = (j + 1) & 1;
      load_tile<kD, kBK>(sk + nb * kBK * kD, kh, kv0 + kBK, p.n_kv, p.kv_tok_stride);
      load_tile<kD, kBK>(sv + nb * kBK * kD, vh, kv0 + kBK, p.n_kv, p.kv_tok_stride);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const __nv_bfloat16* ck = sk + (j & 1) * kBK * kD;
    const __nv_bfloat16* cv = sv + (j & 1) * kBK * kD;

    // S = Q Kᵀ: ldmatrix x4 gives the B fragments of two 8-key tiles.
    float s[kBK / 8][4];
#pragma unroll
    for (int n = 0; n < kBK / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < kBK / 16; ++np) {
        uint32_t b[4];
        const int key = np * 16 + (lane & 7) + ((lane >> 4) & 1) * 8;
        ldmatrix_x4(b, ck + swz<kD>(key, kk * 16 + ((lane >> 3) & 1) * 8));
        mma16816(s[2 * np], qf[kk], b[0], b[1]);
        mma16816(s[2 * np + 1], qf[kk], b[2], b[3]);
      }
    }
    // Online softmax on the two rows this thread holds (g and g + 8); a row
    // is spread over the 4 threads of a quad.
    const bool need_mask = kv0 + kBK - 1 > pos0;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kBK / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        float x = s[n][e] * sl2;
        if (need_mask) {
          const int64_t kpos = kv0 + n * 8 + tig * 2 + (e & 1);
          if (kpos > qpos_lo + 8 * r || kpos >= p.n_kv) x = -INFINITY;
        }
        s[n][e] = x;
        mx[r] = fmaxf(mx[r], x);
      }
    float corr[2], m_use[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m_row[r], mx[r]);
      m_use[r] = m_new == -INFINITY ? 0.f : m_new;
      corr[r] = exp2f(m_row[r] - m_use[r]);
      m_row[r] = m_new;
    }
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < kBK / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pe = exp2f(s[n][e] - m_use[e >> 1]);
        s[n][e] = pe;
        sum[e >> 1] += pe;
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) l_row[r] = l_row[r] * corr[r] + sum[r];
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      o[n][0] *= corr[0];
      o[n][1] *= corr[0];
      o[n][2] *= corr[1];
      o[n][3] *= corr[1];
    }
    // O += P V: P's A fragment for keys [16kk, 16kk+16) is tiles 2kk, 2kk+1.
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      const uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                              pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int dp = 0; dp < kD / 16; ++dp) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, cv + swz<kD>(key, dp * 16 + (lane >> 4) * 8));
        mma16816(o[2 * dp], pa, b[0], b[1]);
        mma16816(o[2 * dp + 1], pa, b[2], b[3]);
      }
    }
    __syncthreads();  // this buffer is refilled two tiles from now
  }
  // out = O / l
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_row[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int64_t t = q0 + warp * 16 + g + 8 * r;
    if (t >= p.n_q) continue;
    __nv_bfloat16* orow = out + t * out_stride + int64_t(h) * kD;
#pragma unroll
    for (int n = 0; n < kD / 8; ++n)
      *reinterpret_cast<__nv_bfloat162*>(orow + n * 8 + tig * 2) =
          __floats2bfloat162_rn(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
  }
}

template <int kD>
void launch(const FlashPrefillParams& p, const void* q, const void* k, const void* v, void* out, cudaStream_t s) {
  const int smem = 4 * kBK * kD * 2;  // K and V, double-buffered
  static const bool configured = [smem] {
    KVT_CUDA_CHECK(cudaFuncSetAttribute(flash_prefill_kernel<kD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)configured;
  const int64_t n_qt = (p.n_q + kBQ - 1) / kBQ;
  KVT_CHECK(n_qt <= 65535, "flash_prefill: {} query tokens exceed the grid limit", p.n_q);
  const dim3 grid(unsigned(p.n_head), unsigned(n_qt));
  flash_prefill_kernel<kD><<<grid, kThreads, smem, s>>>(p, static_cast<const __nv_bfloat16*>(q),
                                                        static_cast<const __nv_bfloat16*>(k),
                                                        static_cast<const __nv_bfloat16*>(v),
                                                        static_cast<__nv_bfloat16*>(out));
  KVT_CUDA_LAUNCH_CHECK("flash_prefill_kernel");
}

// Compute capability (10·major + minor) of the current device, cached per device.
int device_cc() {
  int dev = 0;
  KVT_CUDA_CHECK(cudaGetDevice(&dev));
  static std::atomic<int> cache[64] = {};  // 0: not read yet
  if (dev >= 0 && dev < 64) {
    if (const int cc = cache[dev].load(std::memory_order_relaxed)) return cc;
  }
  int major = 0, minor = 0;
  KVT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  KVT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  const int cc = 10 * major + minor;
  if (dev >= 0 && dev < 64) cache[dev].store(cc, std::memory_order_relaxed);
  return cc;
}

}  // namespace

bool flash_prefill_supports(int head_dim) { return head_dim == 64 || head_dim == 128; }

bool flash_prefill_kernel_available(FlashPrefillKernel kernel, int head_dim) {
  switch (kernel) {
    case FlashPrefillKernel::automatic:
    case FlashPrefillKernel::mma_sync:
      return flash_prefill_supports(head_dim);
    case FlashPrefillKernel::wgmma:
    case FlashPrefillKernel::wgmma_serial:
      // sm_90a machine code runs on compute capability 9.0 only.
      return head_dim == 128 && flash_prefill_sm90_built() && device_cc() == 90;
  }
  return false;
}

FlashPrefillKernel flash_prefill_resolve(FlashPrefillKernel kernel, int head_dim) {
  if (kernel != FlashPrefillKernel::automatic) return kernel;
  return flash_prefill_kernel_available(FlashPrefillKernel::wgmma, head_dim) ? FlashPrefillKernel::wgmma
                                                                             : FlashPrefillKernel::mma_sync;
}

const char* flash_prefill_kernel_name(FlashPrefillKernel kernel) {
  switch (kernel) {
    case FlashPrefillKernel::automatic: return "automatic";
    case FlashPrefillKernel::mma_sync: return "mma_sync";
    case FlashPrefillKernel::wgmma: return "wgmma";
    case FlashPrefillKernel::wgmma_serial: return "wgmma_serial";
  }
  return "?";
}

void flash_prefill(const FlashPrefillParams& p, const void* q, const void* k, const void* v, void* out,
                   cudaStream_t s) {
  KVT_CHECK(flash_prefill_supports(p.head_dim), "flash_prefill: head_dim {} unsupported (64 or 128)", p.head_dim);
  KVT_CHECK(p.n_kv_head > 0 && p.n_head % p.n_kv_head == 0, "flash_prefill: n_head {} vs n_kv_head {}", p.n_head,
            p.n_kv_head);
  KVT_CHECK(p.n_q >= 0 && p.n_q <= p.n_kv, "flash_prefill: n_q {} must be <= n_kv {}", p.n_q, p.n_kv);
  KVT_CHECK(p.q_tok_stride % 8 == 0 && p.kv_tok_stride % 8 == 0 && p.out_tok_stride % 8 == 0,
            "flash_prefill: token strides must be multiples of 8 elements");
  const auto aligned = [](const void* x) { return reinterpret_cast<uintptr_t>(x) % 16 == 0; };
  KVT_CHECK(aligned(q) && aligned(k) && aligned(v) && aligned(out), "flash_prefill: q, k, v, out must be 16-byte aligned");
  if (p.n_q == 0) return;
  const FlashPrefillKernel kernel = flash_prefill_resolve(p.kernel, p.head_dim);
  if (kernel == FlashPrefillKernel::wgmma || kernel == FlashPrefillKernel::wgmma_serial) {
    KVT_CHECK(flash_prefill_kernel_available(kernel, p.head_dim),
              "flash_prefill: the {} kernel needs head_dim 128 (got {}), a compute capability 9.0 GPU and a build "
              "with the sm_90a target (CMAKE_CUDA_ARCHITECTURES=90a)",
              flash_prefill_kernel_name(kernel), p.head_dim);
    return flash_prefill_sm90(p, q, k, v, out, kernel == FlashPrefillKernel::wgmma, s);
  }
  // The one dispatch switch from the runtime head_dim to the kernel's tile width.
  switch (p.head_dim) {
    case 64: return launch<64>(p, q, k, v, out, s);
    case 128: return launch<128>(p, q, k, v, out, s);
  }
}

}  // namespace kvtier::cuda
