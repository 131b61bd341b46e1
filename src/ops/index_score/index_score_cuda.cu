// Index scoring on the GPU.
// higgs2: per block, a lookup table lut[q][c][j] = q_rot[4j..4j+3]·grid[c]
// (n_q × 256 × 32 f32) turns a token's score into 32 shared-memory reads
// (the asymmetric-distance trick of product quantization). A lane owns a
// token and reads its 32 code bytes with two coalesced 16-byte loads. At step
// s lane l looks up group j = s ^ l, so the 32 lanes of a warp hit 32
// different groups = 32 different banks (the table is laid out [c][j]):
// conflict-free whatever the codes. The lane's bytes are permuted once
// (words by l / 4, bytes by l % 4) so that step s reads byte s.
// dense: lanes of a group each own 16 bytes of a record (bf16: 16 lanes,
// fp8: 8 lanes) and reduce by shuffles.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "backend/cuda_backend.h"
#include "ops/index_score/index_score_cuda.h"

namespace kvtier::cuda {
namespace {

constexpr int kScoreThreads = 256;

template <int NQ>
__global__ void __launch_bounds__(kScoreThreads, 5) higgs2_score_kernel(IndexScoreParams p,
                                                                         const float* __restrict__ q,
                                                                         const uint8_t* __restrict__ index,
                                                                         const float* __restrict__ grid,
                                                                         float* __restrict__ scores) {
  extern __shared__ float lut[];  // [NQ][256 codes][32 groups]
  const int64_t row = blockIdx.y;
  {
    const int j = threadIdx.x & 31;  // fixed per thread: the stride is a multiple of 32
    for (int qi = 0; qi < NQ; ++qi) {
      const float4 qv = *reinterpret_cast<const float4*>(q + (row * NQ + qi) * 128 + 4 * j);
      for (int e = threadIdx.x; e < 8192; e += kScoreThreads) {
        const float4 g = __ldg(reinterpret_cast<const float4*>(grid) + (e >> 5));
        lut[qi * 8192 + e] = qv.x * g.x + qv.y * g.y + qv.z * g.z + qv.w * g.w;
      }
    }
  }
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const uint8_t* rbase = index + row * p.row_stride;
  const uint8_t* codes = rbase + p.tok_offset * 32;
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(rbase + p.scale_offset) + p.tok_offset;
  float* out = scores + row * p.n_tok;
  const uint32_t wsel = uint32_t(lane) >> 2, x = uint32_t(lane) & 3;
  const uint32_t bsel = x | ((1 ^ x) << 4) | ((2 ^ x) << 8) | ((3 ^ x) << 12);
  const int64_t warp_id = int64_t(blockIdx.x) * (kScoreThreads / 32) + (threadIdx.x >> 5);
  const int64_t n_warps = int64_t(gridDim.x) * (kScoreThreads / 32);
  // A warp scores kSlabs × 32 tokens per step; the next step's records are
  // loaded while this step's are scored.
  constexpr int kSlabs = 1;  // 2 measured slower on the H200 (80 registers: 3 blocks per SM instead of 5)
  auto load = [&](int64_t t, uint4& a, uint4& b, float& scale) {
    a = b = make_uint4(0, 0, 0, 0);
    scale = 0.f;
    if (t < p.n_tok) {
      a = __ldg(reinterpret_cast<const uint4*>(codes + t * 32));
      b = __ldg(reinterpret_cast<const uint4*>(codes + t * 32) + 1);
      scale = __bfloat162float(__ushort_as_bfloat16(__ldg(scales + t)));
    }
  };
  uint4 na[kSlabs], nb[kSlabs];
  float nscale[kSlabs];
  const int64_t step = n_warps * 32 * kSlabs;
#pragma unroll
  for (int u = 0; u < kSlabs; ++u) load(warp_id * 32 * kSlabs + u * 32 + lane, na[u], nb[u], nscale[u]);
  for (int64_t t0 = warp_id * 32 * kSlabs; t0 < p.n_tok; t0 += step) {
    uint4 a[kSlabs], b[kSlabs];
    float scale[kSlabs];
#pragma unroll
    for (int u = 0; u < kSlabs; ++u) {
      a[u] = na[u];
      b[u] = nb[u];
      scale[u] = nscale[u];
      load(t0 + step + u * 32 + lane, na[u], nb[u], nscale[u]);
    }
#pragma unroll
    for (int u = 0; u < kSlabs; ++u) {
      const int64_t t = t0 + u * 32 + lane;
      uint32_t w[8] = {a[u].x, a[u].y, a[u].z, a[u].w, b[u].x, b[u].y, b[u].z, b[u].w};
      // w[i] ← w[i ^ wsel] (conditional swaps per bit), then byte k ← byte k ^ x:
      // byte s of the result is code byte s ^ lane.
#pragma unroll
      for (int bit = 1; bit < 8; bit <<= 1) {
        const bool f = (wsel & uint32_t(bit)) != 0;
#pragma unroll
        for (int i = 0; i < 8; ++i)
          if (!(i & bit)) {
            const uint32_t lo = w[i], hi = w[i | bit];
            w[i] = f ? hi : lo;
            w[i | bit] = f ? lo : hi;
          }
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) w[i] = __byte_perm(w[i], 0, bsel);
      float acc[NQ];
#pragma unroll
      for (int qi = 0; qi < NQ; ++qi) acc[qi] = 0.f;
#pragma unroll
      for (int s = 0; s < 32; ++s) {
        const uint32_t c = (w[s >> 2] >> (8 * (s & 3))) & 255u;
        const uint32_t at = (c << 5) | (uint32_t(s) ^ uint32_t(lane));
#pragma unroll
        for (int qi = 0; qi < NQ; ++qi) acc[qi] += lut[qi * 8192 + at];
      }
      if (p.per_query) {
#pragma unroll
        for (int qi = 0; qi < NQ; ++qi)
          if (t < p.n_tok) scores[(row * NQ + qi) * p.n_tok + t] = scale[u] * acc[qi];
        continue;
      }
      float best = acc[0];
#pragma unroll
      for (int qi = 1; qi < NQ; ++qi) best = fmaxf(best, acc[qi]);
      if (t < p.n_tok) out[t] = scale[u] * best;
    }
  }
}

__device__ __forceinline__ void unpack16(const uint4& raw, float* v, bool fp8) {
  if (fp8) {
    const uint8_t* b = reinterpret_cast<const uint8_t*>(&raw);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      __nv_fp8_e4m3 f;
      f.__x = b[i];
      v[i] = float(f);
    }
  } else {
    const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 f = __bfloat1622float2(b[i]);
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  }
}

// LANES lanes per record, 16 bytes each; EPL elements per lane (8 bf16 / 16 fp8).
template <bool FP8, int NQ>
__global__ void __launch_bounds__(256) dense_score_kernel(IndexScoreParams p, const float* __restrict__ q,
                                                          const uint8_t* __restrict__ index,
                                                          float* __restrict__ scores) {
  constexpr int EPL = FP8 ? 16 : 8;
  constexpr int LANES = 128 / EPL;  // head_dim 128
  constexpr int RPW = 32 / LANES;   // records per warp per step
  constexpr int UNROLL = 4;
  const int64_t row = blockIdx.y;
  const int lane = threadIdx.x & 31, sub = lane % LANES, grp = lane / LANES;
  float qv[NQ][EPL];
#pragma unroll
  for (int qi = 0; qi < NQ; ++qi)
#pragma unroll
    for (int i = 0; i < EPL; ++i) qv[qi][i] = q[(row * NQ + qi) * 128 + sub * EPL + i];
  const int64_t rec = FP8 ? 128 : 256;
  const uint8_t* base = index + row * p.row_stride + p.tok_offset * rec;
  float* out = scores + row * p.n_tok;
  const int64_t warp_global = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t n_warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t t_base = warp_global * RPW * UNROLL; t_base < p.n_tok; t_base += n_warps * RPW * UNROLL) {
    uint4 raw[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t t = t_base + u * RPW + grp;
      raw[u] = t < p.n_tok ? __ldg(reinterpret_cast<const uint4*>(base + t * rec) + sub) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      float v[EPL];
      unpack16(raw[u], v, FP8);
      float best = -INFINITY;
#pragma unroll
      for (int qi = 0; qi < NQ; ++qi) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < EPL; ++i) s += qv[qi][i] * v[i];
#pragma unroll
        for (int off = LANES / 2; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        best = fmaxf(best, s);
      }
      const int64_t t = t_base + u * RPW + grp;
      if (sub == 0 && t < p.n_tok) out[t] = best;
    }
  }
}

// per_sm: resident blocks per SM of the kernel (cudaOccupancy..., asked once per kernel).
int blocks_per_row(int per_sm, int64_t work_items, int64_t n_rows) {
  const int64_t want = (int64_t(per_sm > 0 ? per_sm : 1) * device_info().n_sm + n_rows - 1) / n_rows;
  return int(std::max<int64_t>(1, std::min<int64_t>(want, work_items)));
}

template <int NQ>
void launch_higgs2(const IndexScoreParams& p, const float* q, const uint8_t* index, const float* grid,
                   float* scores, cudaStream_t s) {
  const size_t smem = size_t(NQ) * 256 * 32 * 4;
  auto k = higgs2_score_kernel<NQ>;
  static const int per_sm = [k, smem] {  // once per instance: the decode step launches it every layer
    KVT_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    int n = 0;
    KVT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, kScoreThreads, smem));
    return n;
  }();
  const int64_t n_rows = int64_t(p.n_seq) * p.n_kv_head;
  // Fill the GPU, but give each block at least ~8 warp-steps (8 × 32 tokens
  // per warp) so that building the table stays a small share.
  const int64_t per_block = (kScoreThreads / 32) * 32 * 8;
  const int bx = blocks_per_row(per_sm, (p.n_tok + per_block - 1) / per_block, n_rows);
  k<<<dim3(unsigned(bx), unsigned(n_rows)), kScoreThreads, smem, s>>>(p, q, index, grid, scores);
  KVT_CUDA_LAUNCH_CHECK("higgs2_score_kernel");
}

template <bool FP8, int NQ>
void launch_dense(const IndexScoreParams& p, const float* q, const uint8_t* index, float* scores, cudaStream_t s) {
  auto k = dense_score_kernel<FP8, NQ>;
  const int64_t n_rows = int64_t(p.n_seq) * p.n_kv_head;
  const int64_t per_block = (256 / 32) * (32 / (FP8 ? 8 : 16)) * 4;
  static const int per_sm = [k] {
    int n = 0;
    KVT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, 256, 0));
    return n;
  }();
  const int bx = blocks_per_row(per_sm, (p.n_tok + per_block - 1) / per_block, n_rows);
  k<<<dim3(unsigned(bx), unsigned(n_rows)), 256, 0, s>>>(p, q, index, scores);
  KVT_CUDA_LAUNCH_CHECK("dense_score_kernel");
}

__global__ void index_query_kernel(const __nv_bfloat16* __restrict__ q, int n_head, int n_kv_head, int group,
                                   int n_q, bool mean_group, bool rotate, const float* __restrict__ signs,
                                   float* __restrict__ out) {
  // one block per (seq, kv head, j); blockDim = head_dim (power of two)
  extern __shared__ float v[];
  const int d = threadIdx.x, hd = blockDim.x;
  const int j = blockIdx.x % n_q;
  const int g = (blockIdx.x / n_q) % n_kv_head;
  const int seq = blockIdx.x / (n_q * n_kv_head);
  const __nv_bfloat16* qs = q + (int64_t(seq) * n_head + g * group) * hd;
  float acc = 0.f;
  if (mean_group) {
    for (int h = 0; h < group; ++h) acc += __bfloat162float(qs[h * hd + d]);
    acc /= float(group);
  } else {
    acc = __bfloat162float(qs[j * hd + d]);
  }
  if (rotate && signs) acc *= signs[d];
  v[d] = acc;
  if (rotate) {
    for (int len = 1; len < hd; len <<= 1) {  // Sylvester-order butterflies
      __syncthreads();
      const float a = v[d], b = v[d ^ len];
      __syncthreads();
      v[d] = (d & len) ? b - a : a + b;
    }
    __syncthreads();
    acc = v[d] * rsqrtf(float(hd));
  }
  out[int64_t(blockIdx.x) * hd + d] = acc;
}

// Per (row, query, slice): the slice's max of scale·raw and Σ exp(scale·raw − max).
constexpr int kGqaSlices = 32;
constexpr int kGqaThreads = 256;

__device__ __forceinline__ void lse_combine(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;
  s = s * __expf(m - mx) + s2 * __expf(m2 - mx);
  m = mx;
}

__global__ void gqa_partial_kernel(const float* __restrict__ raw, int64_t n_tok, float scale, float2* partial) {
  const int64_t rq = blockIdx.y;  // row · n_q + j
  const float* x = raw + rq * n_tok;
  const int64_t per = (n_tok + kGqaSlices - 1) / kGqaSlices;
  const int64_t t0 = int64_t(blockIdx.x) * per, t1 = min(n_tok, t0 + per);
  float m = -INFINITY, sum = 0.f;
  for (int64_t t = t0 + threadIdx.x; t < t1; t += blockDim.x) lse_combine(m, sum, scale * x[t], 1.f);
  for (int off = 16; off > 0; off >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, off), s2 = __shfl_xor_sync(0xffffffffu, sum, off);
    lse_combine(m, sum, m2, s2);
  }
  __shared__ float2 warp[kGqaThreads / 32];
  if ((threadIdx.x & 31) == 0) warp[threadIdx.x / 32] = make_float2(m, sum);
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kGqaThreads / 32; ++w) lse_combine(m, sum, warp[w].x, warp[w].y);
    partial[rq * kGqaSlices + blockIdx.x] = make_float2(m, sum);
  }
}

__global__ void gqa_max_kernel(const float* __restrict__ raw, int n_q, int64_t n_tok, float scale, int64_t sel_offset,
                               int64_t n_sel, const float2* __restrict__ partial, float* __restrict__ out) {
  const int64_t row = blockIdx.y;
  __shared__ float lse[4];
  if (threadIdx.x < n_q) {
    float m = -INFINITY, sum = 0.f;
    const float2* pp = partial + (row * n_q + threadIdx.x) * kGqaSlices;
    for (int i = 0; i < kGqaSlices; ++i) lse_combine(m, sum, pp[i].x, pp[i].y);
    lse[threadIdx.x] = m + __logf(sum);
  }
  __syncthreads();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n_sel; i += int64_t(gridDim.x) * blockDim.x) {
    float best = -INFINITY;
    for (int j = 0; j < n_q; ++j) best = fmaxf(best, scale * raw[(row * n_q + j) * n_tok + sel_offset + i] - lse[j]);
    out[row * n_sel + i] = best;
  }
}

}  // namespace

int64_t index_gqa_scratch_bytes(int64_t n_rows, int n_q) { return n_rows * n_q * kGqaSlices * int64_t(sizeof(float2)); }

void index_gqa_softmax_max(const float* raw, int64_t n_rows, int n_q, int64_t n_tok, float scale, int64_t sel_offset,
                           int64_t n_sel, void* scratch, float* out, cudaStream_t s) {
  KVT_CHECK(n_q >= 1 && n_q <= 4 && n_rows >= 1 && n_rows < 65536 && sel_offset >= 0 && n_sel >= 0 &&
                sel_offset + n_sel <= n_tok,
            "index_gqa_softmax_max: n_rows {} n_q {} tokens [{}, +{}) of {} invalid", n_rows, n_q, sel_offset, n_sel,
            n_tok);
  KVT_CHECK(reinterpret_cast<uintptr_t>(scratch) % 8 == 0, "index_gqa_softmax_max: scratch must be 8-byte aligned");
  if (n_sel == 0) return;
  auto* partial = static_cast<float2*>(scratch);
  gqa_partial_kernel<<<dim3(kGqaSlices, unsigned(n_rows * n_q)), kGqaThreads, 0, s>>>(raw, n_tok, scale, partial);
  KVT_CUDA_LAUNCH_CHECK("gqa_partial_kernel");
  const int64_t bx = std::min<int64_t>((n_sel + kGqaThreads - 1) / kGqaThreads, std::max<int64_t>(1, 1024 / n_rows));
  gqa_max_kernel<<<dim3(unsigned(bx), unsigned(n_rows)), kGqaThreads, 0, s>>>(raw, n_q, n_tok, scale, sel_offset, n_sel,
                                                                             partial, out);
  KVT_CUDA_LAUNCH_CHECK("gqa_max_kernel");
}

void index_score(IndexElt elt, const IndexScoreParams& p, const float* q, const uint8_t* index,
                 const float* grid, float* scores, cudaStream_t s) {
  KVT_CHECK(p.head_dim == 128, "index_score (CUDA): head_dim {} unsupported (128 only)", p.head_dim);
  KVT_CHECK(p.n_q >= 1 && p.n_q <= 4 && p.n_q != 3, "index_score (CUDA): n_q {} not 1, 2 or 4", p.n_q);
  KVT_CHECK(!p.per_query || elt == IndexElt::higgs2, "index_score (CUDA): per_query is for higgs2 landmarks");
  if (p.n_tok <= 0) return;
  if (elt == IndexElt::higgs2) {
    KVT_CHECK(grid != nullptr, "index_score: higgs2 needs the EDEN4-256 grid");
    KVT_CHECK(p.scale_offset >= 32 * (p.tok_offset + p.n_tok) && p.scale_offset % 2 == 0 &&
                  p.row_stride % 16 == 0 && reinterpret_cast<uintptr_t>(index) % 16 == 0,
              "index_score: higgs2 planes misplaced (scale_offset {}, row_stride {}, {} tokens from {})",
              p.scale_offset, p.row_stride, p.n_tok, p.tok_offset);
    switch (p.n_q) {
      case 1: return launch_higgs2<1>(p, q, index, grid, scores, s);
      case 2: return launch_higgs2<2>(p, q, index, grid, scores, s);
      default: return launch_higgs2<4>(p, q, index, grid, scores, s);
    }
  }
  const int64_t rec = index_record_bytes(elt, p.head_dim);
  KVT_CHECK(p.row_stride % 16 == 0 && reinterpret_cast<uintptr_t>(index) % 16 == 0,
            "index_score: dense index rows must be 16-byte aligned (row_stride {})", p.row_stride);
  (void)rec;
  const bool fp8 = elt == IndexElt::fp8;
  switch (p.n_q * 2 + (fp8 ? 1 : 0)) {
    case 2: return launch_dense<false, 1>(p, q, index, scores, s);
    case 3: return launch_dense<true, 1>(p, q, index, scores, s);
    case 4: return launch_dense<false, 2>(p, q, index, scores, s);
    case 5: return launch_dense<true, 2>(p, q, index, scores, s);
    case 8: return launch_dense<false, 4>(p, q, index, scores, s);
    default: return launch_dense<true, 4>(p, q, index, scores, s);
  }
}

void index_query(const void* q_bf16, int n_seq, int n_head, int n_kv_head, int head_dim, bool mean_group,
                 bool rotate, const float* signs, float* out, cudaStream_t s) {
  KVT_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0, "index_query: n_head {} not a multiple of n_kv_head {}",
            n_head, n_kv_head);
  KVT_CHECK(head_dim >= 2 && head_dim <= 1024 && (head_dim & (head_dim - 1)) == 0,
            "index_query: head_dim {} must be a power of two <= 1024", head_dim);
  const int group = n_head / n_kv_head, n_q = mean_group ? 1 : group;
  index_query_kernel<<<unsigned(n_seq * n_kv_head * n_q), unsigned(head_dim), head_dim * sizeof(float), s>>>(
      static_cast<const __nv_bfloat16*>(q_bf16), n_head, n_kv_head, group, n_q, mean_group, rotate, signs, out);
  KVT_CUDA_LAUNCH_CHECK("index_query_kernel");
}

}  // namespace kvtier::cuda
