// Passes 2 and 3 of fetch_rows on the GPU (fetch_cuda.cu describes all
// three; fetch_fill and fetch_dense read through them too): the listed
// misses read from pinned host memory, raw entries straight into their
// slots, records staged in GPU memory and decoded into bf16 K|V slots
// (HIGGS, NVFP4, f32, layer-wide records, pre-RoPE keys with RoPE applied,
// shadowkv's keys rebuilt from the SVD).
#include <cuda_bf16.h>

#include "backend/cuda_backend.h"
#include "ops/gather/fetch_cuda_detail.cuh"
#include "ops/quant/quant_dev.cuh"

namespace kvtier::cuda::fetch_detail {
namespace {

cudaStream_t st(const Exec& x) { return static_cast<cudaStream_t>(x.stream); }

// Row r's staged record of miss m (head h's entry, or the token's layer-wide record).
__device__ __forceinline__ const uint8_t* staged(const FetchParams& p, const Scratch& sc, int64_t r, int64_t m, int h) {
  if (sc.by_token) return sc.stage + m * p.tok_bytes + (p.layer_wide ? 0 : int64_t(h) * p.entry_bytes);
  return sc.stage + (r * p.kmax + m) * sc.stage_span;
}

constexpr int kCopyThreads = 256;
constexpr int kUnroll = 4;

// The misses' host bytes as 16-byte chunks, kUnroll loads in flight: raw
// entries into their slots, records into the row's staging area (part 0: the
// head's entry or the token's layer-wide record; part 1, values_only: the
// generated token's key from kplane).
__global__ void __launch_bounds__(kCopyThreads) copy_misses_kernel(FetchParams p, FetchRows fr, Scratch sc) {
  const int64_t r = blockIdx.y;
  const int s = int(r / p.n_kv_head), h = int(r % p.n_kv_head);
  const int64_t chunks = p.entry_bytes >> 4, parts = sc.stage && p.values_only ? 2 : 1;
  const int2* ml = sc.miss_list + r * p.kmax;
  const int64_t n_items = int64_t(sc.miss_count[r]) * parts * chunks;
  const int64_t head_off = p.layer_wide ? 0 : int64_t(h) * p.entry_bytes;
  const uint8_t* host = fr.host[s] + head_off;
  const int64_t key_first = p.values_only ? fr.key_first[s] : -1;
  const uint8_t* kplane = p.values_only ? fr.kplane[s] + head_off : nullptr;
  const int64_t stride = int64_t(gridDim.x) * kCopyThreads;
  for (int64_t b = int64_t(blockIdx.x) * kCopyThreads + threadIdx.x; b < n_items; b += stride * kUnroll) {
    uint4 v[kUnroll];
    uint4* d[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t item = b + u * stride;
      d[u] = nullptr;
      if (item >= n_items) continue;
      const int64_t m = item / (parts * chunks), part = (item / chunks) % parts, c = item % chunks;
      const int2 ts = ml[m];  // (token, slot)
      const uint8_t* src;
      if (part == 0) {
        src = host + int64_t(ts.x) * p.tok_bytes;
      } else {
        if (key_first < 0 || ts.x < key_first) continue;  // a prompt key: rebuilt from the SVD
        src = kplane + (ts.x - key_first) * p.tok_bytes;
      }
      v[u] = *(reinterpret_cast<const uint4*>(src) + c);  // plain load: pinned memory
      uint8_t* dst = sc.stage ? sc.stage + (r * p.kmax + m) * sc.stage_span + part * p.entry_bytes
                              : fr.slots[r] + int64_t(ts.y) * p.slot_bytes;
      d[u] = reinterpret_cast<uint4*>(dst) + c;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (d[u]) *d[u] = v[u];
  }
}

constexpr size_t kStagedGridBytes = 24 * 1024;  // larger (custom) HIGGS grids stay in global memory
constexpr int kMaxDim = 1024;  // values of a record a thread decodes (layer-wide records up to this width)

// RoPE of pair i of a key at position t (the angle in f64, as the CPU's Rope).
__device__ __forceinline__ void rope_pair(float* k, int D, int64_t t, int i, const float* inv_freq, bool interleaved) {
  double sn, cs;
  sincos(double(t) * inv_freq[i], &sn, &cs);
  const float c = float(cs), s = float(sn);
  const int i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + D / 2;
  const float x0 = k[i0], x1 = k[i1];
  k[i0] = x0 * c - x1 * s;
  k[i1] = x0 * s + x1 * c;
}

__device__ void rope_key(float* k, int D, int64_t t, const float* inv_freq, bool interleaved) {
  for (int i = 0; i < D / 2; ++i) rope_pair(k, D, t, i, inv_freq, interleaved);
}

// Where row r's decoded K (which 0) or V (1) of `slot` goes: its slot, or
// (fetch_dense) dense row `slot` of the outputs, head r (a layer-wide record
// is one row, r = 0, written whole).
__device__ __forceinline__ __nv_bfloat16* dst_of(const FetchParams& p, const FetchRows& fr, int64_t r, int slot,
                                                 int which) {
  if (fr.dense_k) {
    const int64_t W = int64_t(p.n_kv_head) * p.head_dim;
    return static_cast<__nv_bfloat16*>(which ? fr.dense_v : fr.dense_k) + int64_t(slot) * W +
           (r % p.n_kv_head) * p.head_dim;
  }
  return reinterpret_cast<__nv_bfloat16*>(fr.slots[r] + int64_t(slot) * p.slot_bytes) + int64_t(which) * p.head_dim;
}

// Staged records decoded into bf16 K|V slots: a thread per (row, miss, K or
// V). MaxDim: the widest record (the thread's local array).
template <int MaxDim>
__global__ void __launch_bounds__(64) slot_decode_rows_kernel(FetchParams p, DevFormat f, FetchRows fr, Scratch sc) {
  const int64_t r = blockIdx.y;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(sc.miss_count[r]) * 2) return;
  const int which = int(i % 2);  // 0: K, 1: V
  const int64_t m = i / 2;
  const int2 ts = sc.miss_list[r * p.kmax + m];
  const int s = int(r / p.n_kv_head), h = int(r % p.n_kv_head), D = p.head_dim;
  const int64_t t = ts.x;
  DevFormat g = f;
  g.tensor_scale = p.seq_scales ? p.seq_scales[2 * s + which] : (which ? p.v_scale : p.k_scale);
  float x[MaxDim];
  const uint8_t* rec = staged(p, sc, r, m, h);
  float* val = x;
  if (p.values_only) {
    if (which == 1) {
      dev_dequantize(g, rec, x);
    } else if (fr.key_first[s] >= 0 && t >= fr.key_first[s]) {
      dev_dequantize(g, rec + p.entry_bytes, x);
    } else {
      return;  // a prompt key: svd_rebuild_kernel rebuilds it
    }
  } else if (p.layer_wide) {
    dev_dequantize(g, rec + int64_t(which) * f.bytes, x);
    if (!fr.dense_k) val = x + int64_t(h) * D;
  } else {
    dev_dequantize(g, rec + int64_t(which) * f.bytes, x);
  }
  const int n_val = fr.dense_k && p.layer_wide ? f.dim : D;  // dense layer-wide: every head
  if (which == 0 && p.keys_prerope)
    for (int o = 0; o < n_val; o += D) rope_key(val + o, D, t, p.inv_freq, p.interleaved);
  __nv_bfloat16* dst = dst_of(p, fr, r, ts.y, which);
  for (int d = 0; d < n_val; ++d) dst[d] = __float2bfloat16_rn(val[d]);
}

// The same for HIGGS records, a warp per (row, miss, K or V) and kDecodeWarps
// warps per block looping over the row's misses: lanes place σ·grid[code]
// for their codes, run the inverse Hadamard's butterflies together in shared
// memory (each value sees the serial fwht's operations in its order, so the
// result is dev_dequantize's bit for bit), apply the signs, RoPE by pairs and
// store the head's values coalesced. A thread per record (the kernel above)
// decoded 128–1024 values serially from local memory: 9.5 ms per token at
// 128K on the H200.
constexpr int kDecodeWarps = 4;

__device__ __forceinline__ uint32_t read_bits(const uint8_t* base, int64_t bit, int n) {
  const uint8_t* b = base + (bit >> 3);
  const int sh = int(bit & 7);
  uint32_t w = 0;
  for (int j = 0; j * 8 < sh + n; ++j) w |= uint32_t(b[j]) << (8 * j);
  return (w >> sh) & ((1u << n) - 1u);
}

__host__ __device__ constexpr int ilog2(int v) {
  int n = 0;
  while (v > 1) v >>= 1, ++n;
  return n;
}

// kDim, kG, kGd: a record's values, its Hadamard group and the grid's
// dimension fixed at compile time (codes of one byte, a head's own record),
// or 0: read from f. With run-time sizes every loop is a branch: ~1,600
// instructions per record, ~48 µs per layer at 128K under cache=step (H200,
// ncu); the fixed ones unroll.
template <int kDim, int kG, int kGd>
struct HiggsDims {
  static constexpr bool kFixed = kDim > 0;
  int dim, G, d, n_group, n_code, lg;  // lg: G = 2^lg
  __device__ __forceinline__ explicit HiggsDims(const DevFormat& f)
      : dim(kFixed ? kDim : f.dim), G(kFixed ? kG : f.group), d(kFixed ? kGd : f.grid_dim),
        n_group(kFixed ? kDim / kG : f.n_group), n_code(kFixed ? kG / kGd : f.n_code),
        lg(ilog2(kFixed ? kG : f.group)) {}
};

// A head's own record of D = 32·V values in one Hadamard group with a 2-D
// grid (the default HIGGS4 entry at head_dim 128 or 64), decoded in
// registers: lane l holds values l·V … l·V + V − 1 (its V/2 codes), the
// butterflies of span < V run inside the lane and those of span V·2^b
// between lanes l and l ^ 2^b by shuffles, then the scale, the signs and
// one V·2-byte store. Every value sees the same operations in the same
// order as the shared-memory path (so as dev_dequantize), with a few
// instructions per value instead of shared-memory round trips per span.
template <int kDim>
__device__ __forceinline__ void higgs_decode_regs(const FetchParams& p, const DevFormat& f, const FetchRows& fr,
                                                  int64_t r, const uint8_t* rec, int2 ts, int which, int lane) {
  constexpr int V = kDim / 32, C = V / 2;
  static_assert(V >= 2 && (V & (V - 1)) == 0, "two or more values per lane, a power of two");
  const uint8_t* mp = rec + f.meta_offset;
  const float sigma = qdev::bf16_f32(uint32_t(mp[0]) | uint32_t(mp[1]) << 8);
  float v[V];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int code = min(int(rec[lane * C + c]), f.grid_size - 1);
    const float2 pt = *reinterpret_cast<const float2*>(f.grid + 2 * code);
    v[2 * c] = qdev::f_mul(sigma, pt.x);
    v[2 * c + 1] = qdev::f_mul(sigma, pt.y);
  }
#pragma unroll
  for (int hh = 1; hh < V; hh *= 2)
#pragma unroll
    for (int i = 0; i < V; ++i)
      if (!(i & hh)) {
        const float a = v[i], b = v[i + hh];
        v[i] = qdev::f_add(a, b);
        v[i + hh] = qdev::f_sub(a, b);
      }
#pragma unroll
  for (int m = 1; m < 32; m *= 2) {
    const bool upper = (lane & m) != 0;  // holds the pair's second value: a − b with a its partner's
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float o = __shfl_xor_sync(0xffffffffu, v[i], m);
      v[i] = upper ? qdev::f_sub(o, v[i]) : qdev::f_add(v[i], o);
    }
  }
#pragma unroll
  for (int i = 0; i < V; ++i) {
    float u = qdev::f_mul(v[i], f.hadamard_scale);
    if (f.signs) u = qdev::f_mul(u, f.signs[lane * V + i]);
    v[i] = u;
  }
  __nv_bfloat16* dst = dst_of(p, fr, r, ts.y, which) + lane * V;
  __nv_bfloat162 pk[V / 2];
#pragma unroll
  for (int i = 0; i < V / 2; ++i) pk[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  if ((reinterpret_cast<uintptr_t>(dst) & (2 * V - 1)) == 0) {
    if constexpr (V == 4) *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(pk);
    else *reinterpret_cast<__nv_bfloat162*>(dst) = pk[0];
  } else {
#pragma unroll
    for (int i = 0; i < V / 2; ++i) dst[2 * i] = pk[i].x, dst[2 * i + 1] = pk[i].y;
  }
  __syncwarp();  // the record's shared memory is the next item's
}

// One miss's K (which 0) or V (1) of row r, from its record `rec` (the head's
// entry, or the token's layer-wide record), into its slot (or dense row):
// the whole warp, y its [dim] floats of shared memory.
template <int kDim, int kG, int kGd>
__device__ __forceinline__ void higgs_decode_one(const FetchParams& p, const DevFormat& f, const FetchRows& fr,
                                                 const HiggsDims<kDim, kG, kGd>& z, int64_t r, const uint8_t* rec,
                                                 int2 ts, int which, float* y, int lane) {
  const int s = int(r / p.n_kv_head), h = int(r % p.n_kv_head);
  const int D = z.kFixed ? kDim : p.head_dim, G = z.G, d = z.d, lg = z.lg;
  const int64_t t = ts.x;
  int64_t off = 0;  // where the head's values start in the record
  if (p.values_only) {
    if (which == 0) {
      if (fr.key_first[s] < 0 || t < fr.key_first[s]) return;  // a prompt key: svd_rebuild_kernel's
      rec += p.entry_bytes;
    }
  } else {
    rec += int64_t(which) * f.bytes;
    if (p.layer_wide && !fr.dense_k) off = int64_t(h) * D;
  }
  if constexpr (kDim >= 64 && kG == kDim && kGd == 2) {
    if (!p.values_only && !p.layer_wide && !(which == 0 && p.keys_prerope)) {  // RoPE: the pairs below
      higgs_decode_regs<kDim>(p, f, fr, r, rec, ts, which, lane);
      return;
    }
  }
  for (int g = 0; g < z.n_group; ++g) {
    const uint8_t* mp = rec + f.meta_offset + 2 * g;
    const float sigma = qdev::bf16_f32(uint32_t(mp[0]) | uint32_t(mp[1]) << 8);
    const uint8_t* cg = rec + int64_t(g) * f.code_bytes;
    float* yg = y + g * G;
#pragma unroll
    for (int q = lane; q < z.n_code; q += 32) {
      const uint32_t raw = z.kFixed || f.code_bits == 8 ? uint32_t(cg[q]) : read_bits(cg, int64_t(q) * f.code_bits, f.code_bits);
      const int c = min(int(raw), f.grid_size - 1);
      const float* pc = f.grid + c * d;
#pragma unroll
      for (int k = 0; k < d; ++k) yg[q * d + k] = qdev::f_mul(sigma, pc[k]);
    }
  }
  __syncwarp();
  // Every group's butterflies at once. G is a power of two (the quantizer
  // checks it), so the indices are shifts and masks (divisions by run-time
  // values were most of this kernel's instructions).
  const int half = z.dim / 2;
#pragma unroll
  for (int sh = 0; sh < lg; ++sh) {
    const int hh = 1 << sh;
#pragma unroll
    for (int k = lane; k < half; k += 32) {
      const int kk = k & ((G >> 1) - 1);
      const int j = ((k >> (lg - 1)) << lg) + ((kk >> sh) << (sh + 1)) + (kk & (hh - 1));
      const float a = y[j], b = y[j + hh];
      y[j] = qdev::f_add(a, b);
      y[j + hh] = qdev::f_sub(a, b);
    }
    __syncwarp();
  }
#pragma unroll
  for (int j = lane; j < z.dim; j += 32) {
    float u = qdev::f_mul(y[j], f.hadamard_scale);
    if (f.signs) u = qdev::f_mul(u, f.signs[j & (G - 1)]);
    y[j] = u;
  }
  __syncwarp();
  float* val = y + off;
  const int n_val = fr.dense_k && p.layer_wide ? z.dim : D;  // dense layer-wide: every head
  if (which == 0 && p.keys_prerope) {  // rope_key's pairs, spread over the lanes
    for (int o = 0; o < n_val; o += D)
#pragma unroll
      for (int q = lane; q < D / 2; q += 32) rope_pair(val + o, D, t, q, p.inv_freq, p.interleaved);
    __syncwarp();
  }
  __nv_bfloat16* dst = dst_of(p, fr, r, ts.y, which);
#pragma unroll
  for (int j = lane; j < n_val; j += 32) dst[j] = __float2bfloat16_rn(val[j]);
  __syncwarp();  // y is the next item's
}

template <int kDim, int kG, int kGd>
__global__ void __launch_bounds__(32 * kDecodeWarps) higgs_decode_rows_kernel(FetchParams p, DevFormat f, FetchRows fr,
                                                                            Scratch sc, int64_t grid_floats) {
  extern __shared__ float4 smem4[];  // [grid_floats] grid, [kDecodeWarps][dim] values
  float* smem = reinterpret_cast<float*>(smem4);
  const int64_t r = blockIdx.y;
  const int64_t n_items = int64_t(sc.miss_count[r]) * 2;
  if (int64_t(blockIdx.x) * kDecodeWarps >= n_items) return;  // the same for the whole block
  if (grid_floats) dev_stage_grid(f, smem);
  const HiggsDims<kDim, kG, kGd> z(f);
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  float* y = smem + grid_floats + int64_t(warp) * z.dim;
  const int h = int(r % p.n_kv_head);
  for (int64_t i = int64_t(blockIdx.x) * kDecodeWarps + warp; i < n_items; i += int64_t(gridDim.x) * kDecodeWarps) {
    const int64_t m = i / 2;
    higgs_decode_one(p, f, fr, z, r, staged(p, sc, r, m, h), sc.miss_list[r * p.kmax + m], int(i % 2), y, lane);
  }
}

// Both passes at once for a head's own HIGGS entries (no staging): a warp
// per miss reads the entry from pinned host memory (a lane per 16 bytes)
// into shared memory and decodes its K and V, the next miss's entry already
// in flight. The SMs decode while other warps wait on PCIe, so the step pays
// about the reads' time, not the reads' plus the decode's.
constexpr int kMaxEntryChunks = 32;  // 16-byte chunks of an entry held per lane (one each)

template <int kDim>
__global__ void __launch_bounds__(32 * kDecodeWarps) higgs_read_decode_kernel(FetchParams p, DevFormat f, FetchRows fr,
                                                                            Scratch sc, int64_t grid_floats) {
  extern __shared__ float4 smem4[];  // [grid_floats] grid, [kDecodeWarps][kDim] values, [kDecodeWarps][entry]
  float* smem = reinterpret_cast<float*>(smem4);
  const int64_t r = blockIdx.y;
  const int64_t n = sc.miss_count[r];
  if (int64_t(blockIdx.x) * kDecodeWarps >= n) return;  // the same for the whole block
  if (grid_floats) dev_stage_grid(f, smem);
  const HiggsDims<kDim, kDim, 2> z(f);
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  float* y = smem + grid_floats + int64_t(warp) * kDim;
  uint4* ent = reinterpret_cast<uint4*>(smem + grid_floats + int64_t(kDecodeWarps) * kDim) + int64_t(warp) * (p.entry_bytes >> 4);
  const int s = int(r / p.n_kv_head), h = int(r % p.n_kv_head);
  const uint8_t* host = fr.host[s] + int64_t(h) * p.entry_bytes;
  const int chunks = int(p.entry_bytes >> 4);
  const int2* ml = sc.miss_list + r * p.kmax;
  const int64_t stride = int64_t(gridDim.x) * kDecodeWarps;
  int64_t m = int64_t(blockIdx.x) * kDecodeWarps + warp;
  auto read = [&](int64_t mm, int2& ts, uint4& v) {
    if (mm >= n) return;
    ts = ml[mm];
    if (lane < chunks) v = *(reinterpret_cast<const uint4*>(host + int64_t(ts.x) * p.tok_bytes) + lane);  // pinned
  };
  int2 ts{0, 0}, nts{0, 0};
  uint4 v{}, nv{};
  read(m, ts, v);
  for (; m < n; m += stride) {
    read(m + stride, nts, nv);  // the next entry's read in flight while this one decodes
    if (lane < chunks) ent[lane] = v;
    __syncwarp();
    const uint8_t* rec = reinterpret_cast<const uint8_t*>(ent);
    higgs_decode_one(p, f, fr, z, r, rec, ts, 0, y, lane);
    higgs_decode_one(p, f, fr, z, r, rec, ts, 1, y, lane);
    ts = nts;
    v = nv;
  }
}

// ShadowKV's prompt-key misses, K = RoPE(A[t] · B[:, head h]) (the SVD's
// rebuild), a block per (row, miss) and a thread per dimension: B's rows are
// read coalesced and A[t] from shared memory, the sum over the rank in the
// same order as a lone thread would; then RoPE by pairs in shared memory.
__global__ void __launch_bounds__(1024) svd_rebuild_kernel(FetchParams p, FetchRows fr, Scratch sc) {
  extern __shared__ float smem[];  // [rank] A[t], [head_dim] the key
  const int64_t r = blockIdx.y;
  const int s = int(r / p.n_kv_head), h = int(r % p.n_kv_head), D = p.head_dim, d = int(threadIdx.x);
  const int64_t W = int64_t(p.n_kv_head) * D;
  float* a_s = smem;
  float* k_s = smem + p.rank;
  const int n_miss = sc.miss_count[r];
  const int64_t key_first = fr.key_first[s];
  for (int m = int(blockIdx.x); m < n_miss; m += int(gridDim.x)) {
    const int64_t t = sc.miss_list[r * p.kmax + m].x;
    const int slot = sc.miss_list[r * p.kmax + m].y;
    if (key_first >= 0 && t >= key_first) continue;  // a decode key, stored whole (the same for the block)
    const uint16_t* a = fr.svd_a[s] + t * p.rank;
    for (int q = d; q < p.rank; q += int(blockDim.x)) a_s[q] = __bfloat162float(__ushort_as_bfloat16(a[q]));
    __syncthreads();
    if (d < D) {
      const uint16_t* b = fr.svd_b[s] + int64_t(h) * D + d;
      float acc = 0.f;
      for (int q = 0; q < p.rank; ++q) acc += a_s[q] * __bfloat162float(__ushort_as_bfloat16(b[q * W]));
      k_s[d] = acc;
    }
    __syncthreads();
    for (int pass = 0; pass < (p.keys_prerope ? 2 : 1); ++pass) {  // as slot_decode_rows_kernel's K path
      if (d < D / 2) rope_pair(k_s, D, t, d, p.inv_freq, p.interleaved);
      __syncthreads();
    }
    if (d < D) reinterpret_cast<__nv_bfloat16*>(fr.slots[r] + int64_t(slot) * p.slot_bytes)[d] = __float2bfloat16_rn(k_s[d]);
    __syncthreads();
  }
}

}  // namespace

// The listed misses (sc.miss_list / miss_count) from pinned host memory into
// their slots: copied as they are (raw), or staged and decoded.
void read_misses(const Exec& x, const FetchParams& p, const FetchRows& r, const Scratch& sc, int64_t rows) {
  if (p.raw)
    KVT_CHECK(p.slot_bytes == p.entry_bytes && !p.layer_wide && !p.values_only,
              "fetch_rows: raw slots ({} bytes) hold whole per-head entries ({} bytes)", p.slot_bytes, p.entry_bytes);
  else
    KVT_CHECK(p.elt == KvElt::bf16, "fetch_rows (CUDA): decoded slots are bf16");
  // A head's own record of one-byte codes and one group, as the engine's
  // host tier stores HIGGS4 at head_dim 128 or 64: the sizes fixed, and
  // (from host memory) read and decoded by one kernel.
  const bool higgs = !p.raw && p.fmt.spec.kind == QuantKind::higgs;
  const DevFormat hf = higgs ? make_dev_format(p.fmt) : DevFormat{};
  const bool own = higgs && !p.layer_wide && !p.values_only && hf.dim == p.head_dim &&
                   (p.head_dim == 128 || p.head_dim == 64) && hf.code_bits == 8 && hf.group == hf.dim &&
                   hf.grid_dim == 2 && p.entry_bytes <= 16 * kMaxEntryChunks;
  if (own && !sc.by_token) {
    const DevFormat& f = hf;
    const int64_t grid_floats = dev_grid_smem_bytes(f) <= kStagedGridBytes ? dev_grid_floats(f) : 0;
    const size_t smem = size_t(grid_floats + int64_t(kDecodeWarps) * f.dim) * 4 + size_t(kDecodeWarps) * p.entry_bytes;
    const int64_t per_row = std::max<int64_t>(1, int64_t(device_info().n_sm) * 16 / rows);
    const int64_t need = (int64_t(p.kmax) + kDecodeWarps - 1) / kDecodeWarps;
    const dim3 g{unsigned(std::min(per_row, need)), unsigned(rows)};
    if (p.head_dim == 128) higgs_read_decode_kernel<128><<<g, 32 * kDecodeWarps, smem, st(x)>>>(p, f, r, sc, grid_floats);
    else higgs_read_decode_kernel<64><<<g, 32 * kDecodeWarps, smem, st(x)>>>(p, f, r, sc, grid_floats);
    KVT_CUDA_LAUNCH_CHECK("higgs_read_decode_kernel");
    return;
  }
  if (!sc.by_token) {  // else already copied
    const int64_t parts = !p.raw && p.values_only ? 2 : 1;
    const int64_t per_row = std::max<int64_t>(1, int64_t(device_info().n_sm) * 8 / rows);
    const int64_t need =
        (int64_t(p.kmax) * parts * (p.entry_bytes / 16) + kCopyThreads * kUnroll - 1) / (kCopyThreads * kUnroll);
    copy_misses_kernel<<<dim3(unsigned(std::min(per_row, need)), unsigned(rows)), kCopyThreads, 0, st(x)>>>(p, r, sc);
    KVT_CUDA_LAUNCH_CHECK("copy_misses_kernel");
  }
  if (p.raw) return;
  KVT_CHECK(p.fmt.dim <= kMaxDim, "fetch_rows (CUDA): records of {} values exceed {}", p.fmt.dim, kMaxDim);
  const DevFormat f = make_dev_format(p.fmt);
  if (f.kind == qdev::kHiggs) {
    const int64_t grid_floats = dev_grid_smem_bytes(f) <= kStagedGridBytes ? dev_grid_floats(f) : 0;
    const size_t smem = size_t(grid_floats + int64_t(kDecodeWarps) * f.dim) * 4;
    KVT_CHECK(smem <= 48 * 1024, "fetch_rows (CUDA): {} bytes of shared memory for {}-value records", smem, f.dim);
    const int64_t per_row = std::max<int64_t>(1, int64_t(device_info().n_sm) * 16 / rows);
    const int64_t need = (int64_t(p.kmax) * 2 + kDecodeWarps - 1) / kDecodeWarps;
    const dim3 g{unsigned(std::min(per_row, need)), unsigned(rows)};
    if (own && f.dim == 128)
      higgs_decode_rows_kernel<128, 128, 2><<<g, 32 * kDecodeWarps, smem, st(x)>>>(p, f, r, sc, grid_floats);
    else if (own && f.dim == 64)
      higgs_decode_rows_kernel<64, 64, 2><<<g, 32 * kDecodeWarps, smem, st(x)>>>(p, f, r, sc, grid_floats);
    else
      higgs_decode_rows_kernel<0, 0, 0><<<g, 32 * kDecodeWarps, smem, st(x)>>>(p, f, r, sc, grid_floats);
    KVT_CUDA_LAUNCH_CHECK("higgs_decode_rows_kernel");
  } else {
    const dim3 grid{unsigned((int64_t(p.kmax) * 2 + 63) / 64), unsigned(rows)};
    if (p.fmt.dim <= 256) slot_decode_rows_kernel<256><<<grid, 64, 0, st(x)>>>(p, f, r, sc);
    else slot_decode_rows_kernel<kMaxDim><<<grid, 64, 0, st(x)>>>(p, f, r, sc);
    KVT_CUDA_LAUNCH_CHECK("slot_decode_rows_kernel");
  }
  if (p.values_only && !r.dense_k) {  // fetch_dense: the keys come from the pre-RoPE copy
    KVT_CHECK(p.head_dim % 2 == 0 && p.head_dim <= 1024 && p.rank > 0, "fetch_rows: SVD rebuild of head_dim {} rank {}",
              p.head_dim, p.rank);
    const unsigned threads = unsigned((p.head_dim + 31) / 32 * 32);
    const size_t smem = size_t(p.rank + p.head_dim) * sizeof(float);
    const dim3 g2{unsigned(std::min<int64_t>(p.kmax, std::max<int64_t>(1, int64_t(device_info().n_sm) * 16 / rows))),
                  unsigned(rows)};
    svd_rebuild_kernel<<<g2, threads, smem, st(x)>>>(p, r, sc);
    KVT_CUDA_LAUNCH_CHECK("svd_rebuild_kernel");
  }
}

}  // namespace kvtier::cuda::fetch_detail
