// Low-rank key reconstruction on the tensor cores. A block owns 64 selected
// tokens of one row (seq, kv head): it stages their A rows and the head's
// slice of B through shared memory, 32 rank columns at a time (the next slab
// is loaded into registers while the current one is multiplied), runs the
// [64, rank] × [rank, head_dim] product with WMMA bf16 → f32, parks the
// accumulators in shared memory, and rotates each (j, j + head_dim/2) pair
// there before the single bf16 store. Ranks that are not a multiple of 32
// read as zero-padded.
#include <cuda_bf16.h>
#include <mma.h>

#include <cstdint>

#include "backend/cuda_backend.h"
#include "ops/lowrank_k/lowrank_k_cuda.h"

namespace kvtier::cuda {
namespace {

using namespace nvcuda;

constexpr int kThreads = 256;     // 8 warps: 4 strips of 16 tokens × 2 halves of the head
constexpr int kTok = 64;          // selected tokens per block
constexpr int kSlab = 32;         // rank columns staged per step (two MMA k-steps)
constexpr int kLdA = kSlab + 8;   // shared leading dimensions in elements: the +16 B
                                  // moves rows across banks and keeps fragments 32-B aligned

template <int HD>
struct Tile {
  static constexpr int kLdB = HD + 8;  // bf16
  static constexpr int kLdC = HD + 4;  // f32
  static constexpr int kBytesA = kTok * kLdA * 2;
  static constexpr int kBytesB = kSlab * kLdB * 2;
  static constexpr int kBytesC = kTok * kLdC * 4;
  static constexpr int kBytes = kBytesA + kBytesB > kBytesC ? kBytesA + kBytesB : kBytesC;
  static constexpr int kFragN = HD / 2 / 16;                // 16-wide accumulator tiles per warp
  static constexpr int kVecB = kSlab * HD / 8 / kThreads;  // 16-byte B loads per thread per slab
  static_assert(kTok * kSlab / 8 == kThreads, "one 16-byte A load per thread per slab");
  static_assert(kVecB >= 1 && kVecB * kThreads * 8 == kSlab * HD, "B slab split evenly over the threads");
};

// Eight bf16 from p of which the first n_valid exist; the others read as 0.
__device__ __forceinline__ uint4 load8(const __nv_bfloat16* p, int n_valid, bool vec) {
  if (vec && n_valid >= 8) return __ldg(reinterpret_cast<const uint4*>(p));
  const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
  uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int e = 0; e < 8; ++e)
    if (e < n_valid) w[e >> 1] |= uint32_t(__ldg(h + e)) << (16 * (e & 1));
  return make_uint4(w[0], w[1], w[2], w[3]);
}

template <int HD>
__global__ void __launch_bounds__(kThreads) lowrank_k_kernel(LowrankKParams p, const __nv_bfloat16* __restrict__ a,
                                                             const __nv_bfloat16* __restrict__ b,
                                                             const int32_t* __restrict__ idx,
                                                             const float* __restrict__ inv_freq,
                                                             __nv_bfloat16* __restrict__ out, bool vec_a, bool vec_b) {
  using T = Tile<HD>;
  __shared__ __align__(128) unsigned char smem[T::kBytes];
  __shared__ int32_t s_tok[kTok];
  __nv_bfloat16* sa = reinterpret_cast<__nv_bfloat16*>(smem);               // [kTok, kLdA] bf16
  __nv_bfloat16* sb = reinterpret_cast<__nv_bfloat16*>(smem + T::kBytesA);  // [kSlab, kLdB] bf16
  float* sc = reinterpret_cast<float*>(smem);                                // [kTok, kLdC] f32, after the MMAs
  const int tid = threadIdx.x, warp = tid >> 5;
  const int64_t r = blockIdx.y;
  const int64_t seq = r / p.n_kv_head, g = r % p.n_kv_head;
  const int i0 = blockIdx.x * kTok;
  const int64_t width = int64_t(p.n_kv_head) * HD;

  // This thread stages columns [ac, ac + 8) of the slab for tile token ar.
  const int ar = tid >> 2, ac = (tid & 3) * 8;
  const int32_t t = i0 + ar < p.k ? idx[r * p.k + i0 + ar] : -1;
  if ((tid & 3) == 0) s_tok[ar] = t;
  const __nv_bfloat16* a_row = a + seq * p.a_seq_stride + int64_t(t < 0 ? 0 : t) * p.rank;
  const __nv_bfloat16* b_head = b + seq * p.b_seq_stride + g * HD;  // rows `width` apart

  uint4 ra, rb[T::kVecB];
  auto fetch = [&](int k0) {
    ra = load8(a_row + k0 + ac, t < 0 ? 0 : p.rank - (k0 + ac), vec_a);
#pragma unroll
    for (int u = 0; u < T::kVecB; ++u) {
      const int e = tid + u * kThreads, row = e / (HD / 8), col = (e % (HD / 8)) * 8;
      const int j = k0 + row;
      rb[u] = load8(b_head + int64_t(j < p.rank ? j : 0) * width + col, j < p.rank ? 8 : 0, vec_b);
    }
  };
  auto stash = [&] {
    *reinterpret_cast<uint4*>(sa + ar * kLdA + ac) = ra;
#pragma unroll
    for (int u = 0; u < T::kVecB; ++u) {
      const int e = tid + u * kThreads, row = e / (HD / 8), col = (e % (HD / 8)) * 8;
      *reinterpret_cast<uint4*>(sb + row * T::kLdB + col) = rb[u];
    }
  };

  const int strip = warp & 3, half = warp >> 2;  // tokens [16·strip, +16), dims [half·HD/2, +HD/2)
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[T::kFragN];
#pragma unroll
  for (int n = 0; n < T::kFragN; ++n) wmma::fill_fragment(acc[n], 0.f);
  const int n_slab = (p.rank + kSlab - 1) / kSlab;
  fetch(0);
  for (int sl = 0; sl < n_slab; ++sl) {
    __syncthreads();  // every warp has loaded its fragments of the previous slab
    stash();
    __syncthreads();
    if (sl + 1 < n_slab) fetch((sl + 1) * kSlab);  // in flight during the MMAs
#pragma unroll
    for (int kk = 0; kk < kSlab; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
      wmma::load_matrix_sync(fa, sa + strip * 16 * kLdA + kk, kLdA);
#pragma unroll
      for (int n = 0; n < T::kFragN; ++n) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
        wmma::load_matrix_sync(fb, sb + kk * T::kLdB + half * (HD / 2) + n * 16, T::kLdB);
        wmma::mma_sync(acc[n], fa, fb, acc[n]);
      }
    }
  }
  __syncthreads();  // sa/sb become sc
#pragma unroll
  for (int n = 0; n < T::kFragN; ++n)
    wmma::store_matrix_sync(sc + strip * 16 * T::kLdC + half * (HD / 2) + n * 16, acc[n], T::kLdC,
                            wmma::mem_row_major);
  __syncthreads();

  constexpr int kHalf = HD / 2;
  __nv_bfloat16* orow = out + r * p.out_row_stride;
  for (int e = tid; e < kTok * kHalf; e += kThreads) {
    const int tok = e / kHalf, j = e % kHalf;
    const int32_t pos = s_tok[tok];
    if (pos < 0) continue;  // skipped entry or past the row's k tokens
    const int d0 = p.interleaved ? 2 * j : j, d1 = p.interleaved ? 2 * j + 1 : j + kHalf;
    float x0 = sc[tok * T::kLdC + d0], x1 = sc[tok * T::kLdC + d1];
    if (inv_freq) {
      // As ops/rope: the angle is formed in f64 and reduced before the f32
      // sincos, which would lose digits at 128K positions.
      const double ang = double(pos) * double(inv_freq[j]);
      const float red = float(ang - 6.283185307179586 * floor(ang / 6.283185307179586));
      float sn, cs;
      sincosf(red, &sn, &cs);
      const float y0 = x0 * cs - x1 * sn, y1 = x0 * sn + x1 * cs;
      x0 = y0;
      x1 = y1;
    }
    __nv_bfloat16* o = orow + int64_t(i0 + tok) * HD;
    o[d0] = __float2bfloat16(x0);
    o[d1] = __float2bfloat16(x1);
  }
}

template <int HD>
void launch(const LowrankKParams& p, const void* a, const void* b, const int32_t* idx, const float* inv_freq,
            void* out, cudaStream_t s) {
  // 16-byte loads need every row start 16-byte aligned: A rows rank·2 bytes
  // apart; B rows n_kv_head·head_dim·2 apart, heads head_dim·2 in (both × 16 B).
  const bool vec_a = p.rank % 8 == 0 && p.a_seq_stride % 8 == 0 && reinterpret_cast<uintptr_t>(a) % 16 == 0;
  const bool vec_b = p.b_seq_stride % 8 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0;
  const dim3 grid(unsigned((p.k + kTok - 1) / kTok), unsigned(int64_t(p.n_seq) * p.n_kv_head));
  lowrank_k_kernel<HD><<<grid, kThreads, 0, s>>>(p, static_cast<const __nv_bfloat16*>(a),
                                                  static_cast<const __nv_bfloat16*>(b), idx, inv_freq,
                                                  static_cast<__nv_bfloat16*>(out), vec_a, vec_b);
  KVT_CUDA_LAUNCH_CHECK("lowrank_k_kernel");
}

}  // namespace

bool lowrank_k_supports(int head_dim) { return head_dim == 64 || head_dim == 128; }

void lowrank_k(const LowrankKParams& p, const void* a, const void* b, const int32_t* idx, const float* inv_freq,
               void* out, cudaStream_t s) {
  KVT_CHECK(lowrank_k_supports(p.head_dim), "lowrank_k (CUDA): head_dim {} unsupported (64 or 128)", p.head_dim);
  KVT_CHECK(p.n_seq >= 0 && p.n_kv_head > 0 && int64_t(p.n_seq) * p.n_kv_head <= 65535,
            "lowrank_k (CUDA): n_seq {} x n_kv_head {} rows invalid (1..65535)", p.n_seq, p.n_kv_head);
  KVT_CHECK(p.rank >= 1 && p.k >= 0, "lowrank_k: rank {} must be >= 1 and k {} >= 0", p.rank, p.k);
  KVT_CHECK(p.a_seq_stride >= p.n_ctx * p.rank, "lowrank_k: a_seq_stride {} < n_ctx {} x rank {}", p.a_seq_stride,
            p.n_ctx, p.rank);
  KVT_CHECK(p.b_seq_stride >= int64_t(p.rank) * p.n_kv_head * p.head_dim,
            "lowrank_k: b_seq_stride {} < rank {} x {} KV dims", p.b_seq_stride, p.rank,
            int64_t(p.n_kv_head) * p.head_dim);
  KVT_CHECK(p.out_row_stride >= int64_t(p.k) * p.head_dim, "lowrank_k: out_row_stride {} < k {} x head_dim {}",
            p.out_row_stride, p.k, p.head_dim);
  if (p.k == 0 || p.n_seq == 0) return;
  // The one dispatch switch from head_dim to the kernel instance.
  if (p.head_dim == 64) launch<64>(p, a, b, idx, inv_freq, out, s);
  else launch<128>(p, a, b, idx, inv_freq, out, s);
}

}  // namespace kvtier::cuda
