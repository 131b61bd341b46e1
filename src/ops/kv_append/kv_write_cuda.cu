// kv_write on the GPU (contracts in kv_write.h; kv_write_cpu.cpp is the
// specification). Positions come from device arrays and stores from row
// tables, so one launch writes a whole batch and a captured graph replays it.
//  * planar higgs2 index (head_dim 128, per token): one warp per (token, KV
//    head); lane l owns values 4l..4l+3, the Hadamard of 128 runs across the
//    warp; the norm in f64, the nearest point by f32 scores, like the CPU's
//    fast path (the rotation rounds in another order: a code may differ).
//  * bf16 / FP8 host entries: one thread per 8 values, 16-byte loads, stored
//    straight through the pinned memory's mapped address.
//  * HIGGS host records: a block per (token, record), a warp each for K
//    and V, the entry stored as 16-byte chunks.
//  * any other record (host entries of the other formats, landmarks of any
//    chunk size, residual landmarks): one thread per record with the device
//    quantizer library (quant_dev.cuh).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "backend/cuda_backend.h"
#include "ops/kv_append/kv_write_cuda.h"
#include "ops/quant/hadamard_cuda.cuh"
#include "ops/quant/quant_dev.cuh"

namespace kvtier::cuda {
namespace {

cudaStream_t st(const Exec& x) { return static_cast<cudaStream_t>(x.stream); }

__device__ __forceinline__ float bf(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }

// ---- resident tokens

__global__ void resident_write_kernel(ResidentWriteParams p, const __nv_bfloat16* __restrict__ k,
                                      const __nv_bfloat16* __restrict__ v, const int64_t* __restrict__ pos0,
                                      uint8_t* const* __restrict__ rows) {
  // block per (seq, new token, head); threads over head_dim
  const int h = blockIdx.x % p.n_kv_head;
  const int i = (blockIdx.x / p.n_kv_head) % p.n_new;
  const int s = blockIdx.x / (p.n_kv_head * p.n_new);
  const int64_t t = pos0[s] + i;
  int64_t at = -1;
  if (t < p.sink) at = t;
  else if (p.ring > 0 && i >= p.n_new - p.ring) at = p.sink + t % p.ring;
  if (at < 0) return;
  const int64_t in = (int64_t(s) * p.n_new + i) * p.in_tok_stride + int64_t(h) * p.head_dim;
  auto* dst = reinterpret_cast<__nv_bfloat16*>(rows[int64_t(s) * p.n_kv_head + h] + at * 4 * p.head_dim);
  for (int d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
    dst[d] = k[in + d];
    dst[p.head_dim + d] = v[in + d];
  }
}

// ---- host tier: bf16 / fp8 entries per head, as they are

__global__ void entry_write_kernel(HostWriteParams p, KvElt elt, const __nv_bfloat16* __restrict__ k,
                                   const __nv_bfloat16* __restrict__ v, const int64_t* __restrict__ pos0,
                                   uint8_t* const* __restrict__ host) {
  const int per_half = p.head_dim / 8;  // threads per K (or V) row
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n = int64_t(p.n_seq) * p.n_new * p.n_kv_head * 2 * per_half;
  if (i >= n) return;
  const int part = int(i % per_half);
  const int kv = int((i / per_half) % 2);
  const int64_t th = i / (2 * per_half);
  const int h = int(th % p.n_kv_head);
  const int64_t ti = th / p.n_kv_head;  // s · n_new + token
  const int s = int(ti / p.n_new);
  const int64_t t = pos0[s] + ti % p.n_new;
  const __nv_bfloat16* src = (kv ? v : k) + ti * p.in_tok_stride + int64_t(h) * p.head_dim + 8 * part;
  const uint4 raw = *reinterpret_cast<const uint4*>(src);
  uint8_t* e = host[s] + t * p.tok_bytes + int64_t(h) * p.entry_bytes;
  if (elt == KvElt::bf16) {
    *reinterpret_cast<uint4*>(e + int64_t(kv) * p.head_dim * 2 + 16 * part) = raw;
    return;
  }
  const __nv_bfloat16* b = reinterpret_cast<const __nv_bfloat16*>(&raw);
  uint8_t out[8];
  for (int j = 0; j < 8; ++j) out[j] = __nv_cvt_float_to_fp8(__bfloat162float(b[j]), __NV_SATFINITE, __NV_E4M3);
  *reinterpret_cast<uint2*>(e + int64_t(kv) * p.head_dim + 8 * part) = *reinterpret_cast<const uint2*>(out);
}

// ---- host tier: any record format, one thread per (token, record, K or V)

constexpr int kMaxLocal = 1024;  // values of one record a thread holds (layer-wide records up to this width)

__global__ void __launch_bounds__(64) record_write_kernel(HostWriteParams p, DevFormat f, const __nv_bfloat16* k,
                                                          const __nv_bfloat16* v, const int64_t* __restrict__ pos0,
                                                          uint8_t* const* __restrict__ host,
                                                          uint8_t* const* __restrict__ kplane,
                                                          const int64_t* __restrict__ key_first) {
  const int n_rec = p.layer_wide ? 1 : p.n_kv_head;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(p.n_seq) * p.n_new * n_rec * 2) return;
  const int which = int(i % 2);  // 0: K, 1: V
  const int h = int((i / 2) % n_rec);
  const int64_t ti = i / (2 * n_rec);
  const int s = int(ti / p.n_new);
  const int64_t t = pos0[s] + ti % p.n_new;
  DevFormat g = f;
  if (p.seq_scales) g.tensor_scale = p.seq_scales[2 * s + which];
  else g.tensor_scale = which ? p.v_scale : p.k_scale;
  uint8_t* dst;
  if (p.values_only) {
    if (which == 0) {
      if (!key_first || key_first[s] < 0 || t < key_first[s]) return;
      dst = kplane[s] + (t - key_first[s]) * p.tok_bytes + int64_t(h) * p.entry_bytes;
    } else {
      dst = host[s] + t * p.tok_bytes + int64_t(h) * p.entry_bytes;
    }
  } else {
    dst = host[s] + t * p.tok_bytes + int64_t(h) * p.entry_bytes + int64_t(which) * f.bytes;
  }
  const __nv_bfloat16* src = (which ? v : k) + ti * p.in_tok_stride + int64_t(h) * f.dim;
  float x[kMaxLocal], scratch[kMaxLocal];
  for (int d = 0; d < f.dim; ++d) x[d] = bf(src, d);
  dev_quantize(g, x, dst, dev_needs_scratch(g) ? scratch : nullptr);
}

// ---- host tier: HIGGS records, a block per (token, record): warp 0 encodes
// K, warp 1 V (dev_quantize_warp: the rotation and the nearest-point
// searches spread over the lanes, the grid in shared memory) into an entry
// assembled in shared memory, which the block then stores as 16-byte chunks.
// One thread per record (record_write_kernel) left a decode step's append
// with 16 busy threads per layer (8.9 ms per token at 128K on the H200).

constexpr size_t kStagedGridBytes = 24 * 1024;  // larger (custom) grids stay in global memory

__global__ void __launch_bounds__(64) higgs_record_write_kernel(HostWriteParams p, DevFormat f,
                                                                const __nv_bfloat16* k, const __nv_bfloat16* v,
                                                                const int64_t* __restrict__ pos0,
                                                                uint8_t* const* __restrict__ host,
                                                                uint8_t* const* __restrict__ kplane,
                                                                const int64_t* __restrict__ key_first,
                                                                int64_t grid_floats) {
  extern __shared__ float4 smem4[];  // [grid_floats] grid, [2][dim] f32 scratch, [2][entry_bytes] entries
  float* smem = reinterpret_cast<float*>(smem4);
  const int n_rec = p.layer_wide ? 1 : p.n_kv_head;
  const int h = int(blockIdx.x % n_rec);
  const int64_t ti = blockIdx.x / n_rec;
  const int s = int(ti / p.n_new);
  const int64_t t = pos0[s] + ti % p.n_new;
  const bool want_key = !p.values_only || (key_first && key_first[s] >= 0 && t >= key_first[s]);
  if (grid_floats) dev_stage_grid(f, smem);  // else the grid is too large: read from global memory
  const int which = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);  // 0: K, 1: V
  float* x = smem + grid_floats + int64_t(which) * f.dim;
  uint8_t* ent = reinterpret_cast<uint8_t*>(smem + grid_floats + 2 * int64_t(f.dim));
  const int64_t eb = p.entry_bytes;
  for (int64_t i = threadIdx.x; i < 2 * eb; i += blockDim.x) ent[i] = 0;  // the entries' padding
  __syncthreads();
  if (which == 1 || want_key) {
    DevFormat g = f;
    if (p.seq_scales) g.tensor_scale = p.seq_scales[2 * s + which];
    else g.tensor_scale = which ? p.v_scale : p.k_scale;
    const __nv_bfloat16* src = (which ? v : k) + ti * p.in_tok_stride + int64_t(h) * f.dim;
    for (int d = lane; d < f.dim; d += 32) x[d] = bf(src, d);
    __syncwarp();
    // values_only: V in entry 0, the key in entry 1; else K ‖ V in entry 0.
    uint8_t* rec = p.values_only ? ent + (which ? 0 : eb) : ent + int64_t(which) * f.bytes;
    dev_quantize_warp(g, x, rec, x);
  }
  __syncthreads();
  const int64_t chunks = eb / 16;
  const uint4* e4 = reinterpret_cast<const uint4*>(ent);
  uint4* dst = reinterpret_cast<uint4*>(host[s] + t * p.tok_bytes + int64_t(h) * eb);
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) dst[c] = e4[c];
  if (p.values_only && want_key) {
    uint4* kd = reinterpret_cast<uint4*>(kplane[s] + (t - key_first[s]) * p.tok_bytes + int64_t(h) * eb);
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) kd[c] = e4[chunks + c];
  }
}

// ---- key index: planar 2-bit HIGGS per token (head_dim 128)

// A block per (token, KV head) row: every warp rotates the key (lane = group
// of 4 values), then warp w searches grid points [64w, 64w + 64) for its 32
// groups and the block keeps, per group, the first largest score in point
// order (the CPU's search). One warp walking all 256 points took ~10 µs per
// decode step, on the scoring's path.
constexpr int kPlanarWarps = 4;
constexpr int kWarpsPerBlock = 4;  // the index kernels that take a warp per job
constexpr int kPlanarSpan = 256 / kPlanarWarps;

__global__ void __launch_bounds__(32 * kPlanarWarps) planar_index_kernel(
    IndexWriteParams p, const __nv_bfloat16* __restrict__ k, const int64_t* __restrict__ pos0,
    uint8_t* const* __restrict__ codes_rows, uint8_t* const* __restrict__ scale_rows, const float* __restrict__ grid,
    const float* __restrict__ half_norm2, const float* __restrict__ signs) {
  __shared__ float4 pts[256];
  __shared__ float hn[256];
  __shared__ float best_s_of[kPlanarWarps][32];
  __shared__ int best_of[kPlanarWarps][32];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    pts[i] = reinterpret_cast<const float4*>(grid)[i];
    hn[i] = half_norm2 ? half_norm2[i] : qdev::half_norm2_of(grid + 4 * i, 4);
  }
  __syncthreads();
  const int64_t w = blockIdx.x;  // the row
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int h = int(w % p.n_kv_head);
  const int64_t ti = w / p.n_kv_head;
  const int s = int(ti / p.n_new);
  const int64_t tok = pos0[s] + ti % p.n_new;
  const __nv_bfloat16* kr = k + ti * p.in_tok_stride + int64_t(h) * 128 + 4 * lane;
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
  float u[4];
  for (int i = 0; i < 4; ++i) u[i] = sigma > 0 ? x[i] * inv_sqrt / sigma : 0.f;
  int best = warp * kPlanarSpan;  // the first largest u·c − ‖c‖²/2 of this warp's points, in f32
  float best_s = -INFINITY;
  for (int cc = warp * kPlanarSpan; cc < (warp + 1) * kPlanarSpan; ++cc) {
    const float4 g = pts[cc];
    float sc = -hn[cc];
    sc = __fmaf_rn(u[0], g.x, sc);
    sc = __fmaf_rn(u[1], g.y, sc);
    sc = __fmaf_rn(u[2], g.z, sc);
    sc = __fmaf_rn(u[3], g.w, sc);
    if (sc > best_s) {
      best_s = sc;
      best = cc;
    }
  }
  best_s_of[warp][lane] = best_s;
  best_of[warp][lane] = best;
  __syncthreads();
  if (warp != 0) return;
  for (int v = 1; v < kPlanarWarps; ++v)  // later points win only when strictly larger
    if (best_s_of[v][lane] > best_s) {
      best_s = best_s_of[v][lane];
      best = best_of[v][lane];
    }
  const int64_t r = int64_t(s) * p.n_kv_head + h;
  codes_rows[r][32 * tok + lane] = uint8_t(best);
  if (lane == 0) reinterpret_cast<__nv_bfloat16*>(scale_rows[r])[tok] = sigma_h;
}

// The planar index with the U4 grid (4 uniform levels per dim): a warp per
// (token, KV head) row, rotated as planar_index_kernel; lane l's dims
// 4l .. 4l + 3 each take the first largest u·c − c²/2 of the 4 levels (the
// CPU's search) and fill code byte l, dim 4l + i in bits 2i .. 2i + 1.
__global__ void __launch_bounds__(32 * kWarpsPerBlock) planar_u4_index_kernel(
    IndexWriteParams p, int64_t n_rows, const __nv_bfloat16* __restrict__ k, const int64_t* __restrict__ pos0,
    uint8_t* const* __restrict__ codes_rows, uint8_t* const* __restrict__ scale_rows, const float* __restrict__ grid,
    const float* __restrict__ half_norm2, const float* __restrict__ signs) {
  const int64_t w = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);  // the row
  if (w >= n_rows) return;
  const int lane = threadIdx.x & 31;
  const int h = int(w % p.n_kv_head);
  const int64_t ti = w / p.n_kv_head;
  const int s = int(ti / p.n_new);
  const int64_t tok = pos0[s] + ti % p.n_new;
  const __nv_bfloat16* kr = k + ti * p.in_tok_stride + int64_t(h) * 128 + 4 * lane;
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
  float lv[4], hn[4];
  for (int c = 0; c < 4; ++c) lv[c] = grid[c], hn[c] = half_norm2 ? half_norm2[c] : 0.5f * grid[c] * grid[c];
  uint32_t byte = 0;
  for (int i = 0; i < 4; ++i) {
    const float u = sigma > 0 ? x[i] * inv_sqrt / sigma : 0.f;
    int best = 0;
    float best_s = -INFINITY;
    for (int c = 0; c < 4; ++c) {
      const float sc = __fmaf_rn(u, lv[c], -hn[c]);
      if (sc > best_s) best_s = sc, best = c;
    }
    byte |= uint32_t(best) << (2 * i);
  }
  const int64_t r = int64_t(s) * p.n_kv_head + h;
  codes_rows[r][32 * tok + lane] = uint8_t(byte);
  if (lane == 0) reinterpret_cast<__nv_bfloat16*>(scale_rows[r])[tok] = sigma_h;
}

// ---- key index: landmark records of any format and chunk size, residual landmarks

constexpr int kMaxM = 16;  // landmarks per residual unit a thread holds

// Job i of an index append: sequence s, KV head h, unit u, row r; ok is false
// past the last job and when this append does not complete unit u.
struct UnitJob {
  int s = 0, h = 0;
  int64_t u = 0, n0 = 0, r = 0;
  bool ok = false;
};
__device__ __forceinline__ UnitJob unit_job(const IndexWriteParams& p, const int64_t* pos0, int64_t i,
                                            int64_t max_units) {
  UnitJob j;
  if (i >= int64_t(p.n_seq) * max_units * p.n_kv_head) return j;
  j.h = int(i % p.n_kv_head);
  j.s = int(i / (p.n_kv_head * max_units));
  j.n0 = pos0[j.s];
  j.u = j.n0 / p.unit + (i / p.n_kv_head) % max_units;
  j.r = int64_t(j.s) * p.n_kv_head + j.h;
  j.ok = j.u < (j.n0 + p.n_new) / p.unit;
  return j;
}
// Value d of token t's key for job j: from this append's keys, or (an earlier
// token) from the resident ring.
__device__ __forceinline__ float unit_key(const IndexWriteParams& p, const UnitJob& j, const __nv_bfloat16* k,
                                          uint8_t* const* resident, int64_t t, int d) {
  const int D = p.head_dim;
  if (t >= j.n0) return bf(k, (int64_t(j.s) * p.n_new + (t - j.n0)) * p.in_tok_stride + int64_t(j.h) * D + d);
  const auto* slot = reinterpret_cast<const __nv_bfloat16*>(resident[j.r] + (p.sink + t % p.ring) * 4 * int64_t(D));
  return __bfloat162float(slot[d]);
}

__global__ void __launch_bounds__(64) unit_index_kernel(IndexWriteParams p, DevFormat f, DevFormat meta,
                                                        const __nv_bfloat16* __restrict__ k,
                                                        const int64_t* __restrict__ pos0,
                                                        uint8_t* const* __restrict__ plane0,
                                                        uint8_t* const* __restrict__ plane1,
                                                        uint8_t* const* __restrict__ resident,
                                                        float* const* __restrict__ stats, int64_t max_units) {
  // one thread per (seq, completed unit, head)
  const UnitJob j = unit_job(p, pos0, int64_t(blockIdx.x) * blockDim.x + threadIdx.x, max_units);
  if (!j.ok) return;
  const int64_t u = j.u, r = j.r;
  const int D = p.head_dim, c = p.chunk, m = p.unit / c;
  auto key = [&](int64_t t, int d) { return unit_key(p, j, k, resident, t, d); };
  float lm[kMaxM][256];
  for (int q = 0; q < m; ++q) {  // chunk means, summed in token order then divided (as the CPU)
    float* mean = lm[q];
    for (int d = 0; d < D; ++d) mean[d] = 0.f;
    for (int t = 0; t < c; ++t)
      for (int d = 0; d < D; ++d) mean[d] += key(u * p.unit + q * c + t, d);
    for (int d = 0; d < D; ++d) mean[d] /= float(c);
    if (p.cos_stats && stats) {
      double mn = 0;
      for (int d = 0; d < D; ++d) mn += double(mean[d]) * mean[d];
      float worst = 2.f;
      for (int t = 0; t < c; ++t) {
        double dot = 0, kn = 0;
        for (int d = 0; d < D; ++d) {
          const double kv = key(u * p.unit + q * c + t, d);
          dot += kv * mean[d];
          kn += kv * kv;
        }
        const double den = sqrt(mn * kn);
        worst = fminf(worst, den > 0 ? float(dot / den) : 1.f);
      }
      stats[r][u * m + q] = worst;
    }
  }
  if (p.layout == IndexRecLayout::records) {
    DevFormat g = f;
    if (p.seq_scales) g.tensor_scale = p.seq_scales[j.s];
    dev_quantize(g, lm[0], plane0[r] + u * f.bytes);
    return;
  }
  // Residual (residual_quant.h): the meta is the mean of the m landmarks; each
  // residual is taken against the dequantized meta.
  float mt[256], mh[256];
  for (int d = 0; d < D; ++d) mt[d] = 0.f;
  for (int q = 0; q < m; ++q)
    for (int d = 0; d < D; ++d) mt[d] += lm[q][d];
  for (int d = 0; d < D; ++d) mt[d] /= float(m);
  uint8_t* mrec = plane1[r] + u * meta.bytes;
  dev_quantize(meta, mt, mrec);
  dev_dequantize(meta, mrec, mh);
  for (int q = 0; q < m; ++q) {
    for (int d = 0; d < D; ++d) lm[q][d] -= mh[d];
    dev_quantize(f, lm[q], plane0[r] + (u * m + q) * f.bytes);
  }
}

// HIGGS landmark records (no residual, no cosine stats): a warp per (seq,
// completed chunk, head), the chunk mean in shared memory, dev_quantize_warp
// spreading the rotation and the nearest-point searches over the lanes (the
// bytes of dev_quantize). One thread per record took ~190 µs per layer for
// higgs1's 256-point 8-D grid, whose search has no cell table.
__global__ void __launch_bounds__(32 * kWarpsPerBlock) higgs_index_kernel(IndexWriteParams p, DevFormat f,
                                                                         const __nv_bfloat16* __restrict__ k,
                                                                         const int64_t* __restrict__ pos0,
                                                                         uint8_t* const* __restrict__ plane0,
                                                                         uint8_t* const* __restrict__ resident,
                                                                         int64_t max_units) {
  __shared__ float xs[kWarpsPerBlock][256];
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const UnitJob j = unit_job(p, pos0, int64_t(blockIdx.x) * kWarpsPerBlock + warp, max_units);
  if (!j.ok) return;  // warp-uniform
  const int D = p.head_dim, c = p.chunk;
  float* x = xs[warp];
  for (int d = lane; d < D; d += 32) {  // the chunk mean, in token order then divided (as the CPU)
    float sum = 0.f;
    for (int t = 0; t < c; ++t) sum += unit_key(p, j, k, resident, j.u * p.unit + t, d);
    x[d] = sum / float(c);
  }
  __syncwarp();
  dev_quantize_warp(f, x, plane0[j.r] + j.u * f.bytes, x);
}

// ---- rounding through a format, and the amax of a tensor

__global__ void __launch_bounds__(64) round_rows_kernel(DevFormat f, __nv_bfloat16* rows, int64_t n, int64_t stride,
                                                        const int64_t* pos) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  __nv_bfloat16* r = rows + ((pos ? *pos : 0) + i) * stride;
  float x[kMaxLocal], scratch[kMaxLocal];
  for (int d = 0; d < f.dim; ++d) x[d] = __bfloat162float(r[d]);
  uint8_t rec[4 * kMaxLocal + 64];
  dev_quantize(f, x, rec, dev_needs_scratch(f) ? scratch : nullptr);
  dev_dequantize(f, rec, x);
  for (int d = 0; d < f.dim; ++d) r[d] = __float2bfloat16_rn(x[d]);
}

__global__ void amax_kernel(const __nv_bfloat16* __restrict__ v, int64_t n, float* amax) {
  float m = 0.f;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    m = fmaxf(m, fabsf(__bfloat162float(v[i])));
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if ((threadIdx.x & 31) == 0) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(m));  // m ≥ 0: int order
}

}  // namespace

void resident_write(const Exec& x, const ResidentWriteParams& p, const void* k, const void* v, const int64_t* pos0,
                    uint8_t* const* rows) {
  KVT_CHECK(p.elt == KvElt::bf16, "resident_write (CUDA): resident tokens are bf16");
  const int64_t n = int64_t(p.n_seq) * p.n_new * p.n_kv_head;
  if (n == 0 || (p.sink == 0 && p.ring == 0)) return;
  resident_write_kernel<<<unsigned(n), 128, 0, st(x)>>>(p, static_cast<const __nv_bfloat16*>(k),
                                                        static_cast<const __nv_bfloat16*>(v), pos0, rows);
  KVT_CUDA_LAUNCH_CHECK("resident_write_kernel");
}

void host_write(const Exec& x, const HostWriteParams& p, const void* k, const void* k_pre, const void* v,
                const int64_t* pos0, uint8_t* const* host, uint8_t* const* kplane, const int64_t* key_first) {
  const int64_t n_tok = int64_t(p.n_seq) * p.n_new;
  if (n_tok == 0) return;
  const auto* kin = static_cast<const __nv_bfloat16*>(p.keys_prerope ? k_pre : k);
  const auto* vin = static_cast<const __nv_bfloat16*>(v);
  const QuantKind kind = p.fmt.spec.kind;
  if (!p.layer_wide && !p.values_only && (kind == QuantKind::bf16 || kind == QuantKind::fp8)) {
    const int64_t n = n_tok * p.n_kv_head * 2 * (p.head_dim / 8);
    entry_write_kernel<<<unsigned((n + 255) / 256), 256, 0, st(x)>>>(
        p, kind == QuantKind::fp8 ? KvElt::fp8 : KvElt::bf16, kin, vin, pos0, host);
    KVT_CUDA_LAUNCH_CHECK("entry_write_kernel");
    return;
  }
  KVT_CHECK(p.fmt.dim <= kMaxLocal, "host_write (CUDA): records of {} values exceed {}", p.fmt.dim, kMaxLocal);
  const DevFormat f = make_dev_format(p.fmt);
  if (kind == QuantKind::higgs) {
    KVT_CHECK(p.entry_bytes % 16 == 0 && p.tok_bytes % 16 == 0,
              "host_write (CUDA): entries of {} bytes (tokens of {}) must be 16-byte multiples", p.entry_bytes,
              p.tok_bytes);
    const int64_t grid_floats = dev_grid_smem_bytes(f) <= kStagedGridBytes ? dev_grid_floats(f) : 0;
    const size_t smem = size_t(grid_floats + 2 * int64_t(f.dim)) * 4 + size_t(2 * p.entry_bytes);
    KVT_CHECK(smem <= 48 * 1024, "host_write (CUDA): {} bytes of shared memory for {}-value records", smem, f.dim);
    const int64_t blocks = n_tok * (p.layer_wide ? 1 : p.n_kv_head);
    higgs_record_write_kernel<<<unsigned(blocks), 64, smem, st(x)>>>(p, f, kin, vin, pos0, host, kplane, key_first,
                                                                     grid_floats);
    KVT_CUDA_LAUNCH_CHECK("higgs_record_write_kernel");
    return;
  }
  const int64_t n = n_tok * (p.layer_wide ? 1 : p.n_kv_head) * 2;
  record_write_kernel<<<unsigned((n + 63) / 64), 64, 0, st(x)>>>(p, f, kin, vin, pos0, host, kplane, key_first);
  KVT_CUDA_LAUNCH_CHECK("record_write_kernel");
}

void index_write(const Exec& x, const IndexWriteParams& p, const void* k, const int64_t* pos0, uint8_t* const* plane0,
                 uint8_t* const* plane1, uint8_t* const* resident, float* const* stats) {
  const auto* kin = static_cast<const __nv_bfloat16*>(k);
  if (p.layout == IndexRecLayout::planar_higgs2) {
    KVT_CHECK(p.head_dim == 128 && p.chunk == 1 && p.unit == 1, "index_write: the planar index is per-token at 128");
    const int64_t n = int64_t(p.n_seq) * p.n_new * p.n_kv_head;
    if (n == 0) return;
    KVT_CHECK(n < (int64_t(1) << 31), "index_write: {} rows exceed the grid", n);
    if (p.fmt.spec.uniform_levels) {
      KVT_CHECK(p.fmt.spec.grid_size == 4, "index_write: the planar index takes U4, not U{}", p.fmt.spec.grid_size);
      planar_u4_index_kernel<<<unsigned((n + kWarpsPerBlock - 1) / kWarpsPerBlock), 32 * kWarpsPerBlock, 0, st(x)>>>(
          p, n, kin, pos0, plane0, plane1, p.fmt.grid, p.fmt.half_norm2, p.fmt.signs);
      KVT_CUDA_LAUNCH_CHECK("planar_u4_index_kernel");
      return;
    }
    planar_index_kernel<<<unsigned(n), 32 * kPlanarWarps, 0, st(x)>>>(p, kin, pos0, plane0, plane1, p.fmt.grid,
                                                                      p.fmt.half_norm2, p.fmt.signs);
    KVT_CUDA_LAUNCH_CHECK("planar_index_kernel");
    return;
  }
  KVT_CHECK(p.head_dim <= 256 && p.unit / p.chunk <= kMaxM, "index_write (CUDA): head_dim {} with {} landmarks per unit",
            p.head_dim, p.unit / p.chunk);
  // Units completed by this append, at most: new tokens / unit + 1 (a unit straddling the start).
  const int64_t max_units = p.n_new / p.unit + 1;
  const int64_t n = int64_t(p.n_seq) * max_units * p.n_kv_head;
  const DevFormat f = make_dev_format(p.fmt);
  if (p.layout == IndexRecLayout::records && f.kind == qdev::kHiggs && !p.cos_stats && p.unit == p.chunk) {
    higgs_index_kernel<<<unsigned((n + kWarpsPerBlock - 1) / kWarpsPerBlock), 32 * kWarpsPerBlock, 0, st(x)>>>(
        p, f, kin, pos0, plane0, resident, max_units);
    KVT_CUDA_LAUNCH_CHECK("higgs_index_kernel");
    return;
  }
  const DevFormat meta = p.layout == IndexRecLayout::residual ? make_dev_format(p.meta) : DevFormat{};
  unit_index_kernel<<<unsigned((n + 63) / 64), 64, 0, st(x)>>>(p, f, meta, kin, pos0, plane0, plane1, resident, stats,
                                                               max_units);
  KVT_CUDA_LAUNCH_CHECK("unit_index_kernel");
}

void round_rows(const Exec& x, const RecordFormat& fmt, void* rows, int64_t n, int64_t stride, const int64_t* pos) {
  KVT_CHECK(fmt.dim <= kMaxLocal && fmt.bytes <= 4 * kMaxLocal + 64, "round_rows (CUDA): rows of {} values exceed {}",
            fmt.dim, kMaxLocal);
  if (n == 0) return;
  round_rows_kernel<<<unsigned((n + 63) / 64), 64, 0, st(x)>>>(make_dev_format(fmt), static_cast<__nv_bfloat16*>(rows),
                                                               n, stride, pos);
  KVT_CUDA_LAUNCH_CHECK("round_rows_kernel");
}

void amax_bf16(const Exec& x, const void* v, int64_t n, float* amax) {
  if (n == 0) return;
  amax_kernel<<<unsigned(std::min<int64_t>(1024, (n + 255) / 256)), 256, 0, st(x)>>>(
      static_cast<const __nv_bfloat16*>(v), n, amax);
  KVT_CUDA_LAUNCH_CHECK("amax_kernel");
}

}  // namespace kvtier::cuda
