// fetch_rows on the GPU (fetch.h): a slot cache per (sequence, KV head) row.
// Pass 1, one block per row: slots are assigned as gather.h specifies (hits
// keep their slot, found by binary search in the previous selection; free
// slots ranked by a scan over a bitmap; the m-th miss in token order takes the
// m-th free slot), the row's misses listed, the selection kept for the next
// step. Pass 2 reads only the misses from pinned host memory (zero-copy), as
// 16-byte chunks with several loads in flight per thread (PCIe reads are
// bound by their count: a thread reading a record byte by byte was ~10×
// slower): raw entries straight into their slots; records into a staging
// row in GPU memory, then (pass 3) decoded into bf16 K|V slots (HIGGS,
// NVFP4, f32, layer-wide records, pre-RoPE keys with RoPE applied, shadowkv's
// keys rebuilt from the SVD). cache=all rows skip the assignment's search:
// token t lives in slot t, a bitmap says which are held, and fetch_fill
// reads the prompt into them in order when decode starts.
#include <cuda_bf16.h>

#include <cub/block/block_scan.cuh>

#include "backend/cuda_backend.h"
#include "ops/gather/fetch_cuda.h"
#include "ops/quant/quant_dev.cuh"

namespace kvtier::cuda {
namespace {

cudaStream_t st(const Exec& x) { return static_cast<cudaStream_t>(x.stream); }

constexpr int kMaxSlots = 32768;  // slots per row (the assignment's bitmap)
constexpr int kAssignThreads = 1024;
constexpr int kWords = kMaxSlots / 32;
constexpr int kPrevCache = 8192;

__device__ __forceinline__ int find_sorted(const int32_t* a, int n, int32_t t) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (a[mid] < t) lo = mid + 1;
    else hi = mid;
  }
  return (lo < n && a[lo] == t) ? lo : -1;
}

struct Scratch {
  int2* miss_list;      // [rows, kmax] (token, slot)
  int32_t* miss_count;  // [rows]
  uint8_t* miss;        // [rows, kmax]
  uint8_t* stage;       // [rows, kmax, stage_span] records read from the host (null: raw)
  int64_t stage_span;
  bool by_token = false;  // fetch_dense by copy: [kmax][tok_bytes], the host tier's layout
};

// Row r's staged record of miss m (head h's entry, or the token's layer-wide record).
__device__ __forceinline__ const uint8_t* staged(const FetchParams& p, const Scratch& sc, int64_t r, int64_t m, int h) {
  if (sc.by_token) return sc.stage + m * p.tok_bytes + (p.layer_wide ? 0 : int64_t(h) * p.entry_bytes);
  return sc.stage + (r * p.kmax + m) * sc.stage_span;
}

// Bytes staged per miss: the head's entry (layer-wide: the token's record;
// values_only: V, then the generated token's key from kplane).
int64_t stage_span_of(const FetchParams& p) {
  if (p.raw) return 0;
  return p.values_only ? 2 * p.entry_bytes : p.entry_bytes;
}

Scratch scratch_of(const FetchParams& p, void* s) {
  const int64_t rows = int64_t(p.n_seq) * p.n_kv_head;
  Scratch c;
  c.stage = static_cast<uint8_t*>(s);  // first: 16-byte aligned
  c.stage_span = stage_span_of(p);
  c.miss_list = reinterpret_cast<int2*>(c.stage + rows * p.kmax * c.stage_span);
  c.miss_count = reinterpret_cast<int32_t*>(c.miss_list + rows * p.kmax);
  c.miss = reinterpret_cast<uint8_t*>(c.miss_count + rows);
  if (!c.stage_span) c.stage = nullptr;
  return c;
}

__global__ void __launch_bounds__(kAssignThreads) slot_assign_rows_kernel(FetchParams p, const int32_t* __restrict__ sel,
                                                                           FetchRows fr, Scratch sc) {
  using Scan = cub::BlockScan<uint32_t, kAssignThreads>;
  __shared__ uint32_t used[kWords];
  __shared__ uint32_t free_before[kWords];
  __shared__ int32_t prev_cache[kPrevCache];
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ uint32_t n_selected;
  __shared__ uint32_t n_missed;
  const int64_t r = blockIdx.x;
  const int s = int(r / p.n_kv_head);
  const int K = p.kmax, k = fr.kslots[s];
  const int32_t* ir = sel + r * K + (K - k);
  if (fr.cache_all && fr.cache_all[s]) {  // cache=all: slot = token; a bitmap says which are held
    uint32_t* held = reinterpret_cast<uint32_t*>(fr.prev_sel[r]);
    int32_t* so = fr.slot_of + r * K;
    if (threadIdx.x == 0) n_selected = n_missed = 0;
    __syncthreads();
    for (int j = threadIdx.x; j < K - k; j += kAssignThreads) so[j] = -1;
    uint32_t mine = 0;
    for (int j = threadIdx.x; j < k; j += kAssignThreads) {
      const int32_t t = ir[j];
      so[K - k + j] = t;
      if (t < 0) continue;
      ++mine;
      const uint32_t bit = 1u << (t & 31);
      if (!(atomicOr(&held[t >> 5], bit) & bit))  // the selection's tokens are distinct
        sc.miss_list[r * K + atomicAdd(&n_missed, 1u)] = make_int2(t, t);
    }
    if (mine) atomicAdd(&n_selected, mine);
    __syncthreads();
    if (threadIdx.x == 0) {
      sc.miss_count[r] = int32_t(n_missed);
      if (fr.counters) {
        atomicAdd(&fr.counters[s][0], (unsigned long long)n_selected);
        atomicAdd(&fr.counters[s][1], (unsigned long long)n_missed);
      }
    }
    return;
  }
  int32_t* prev_global = fr.prev_sel[r];
  const int32_t* pi = prev_global;
  if (k <= kPrevCache) {
    for (int j = threadIdx.x; j < k; j += kAssignThreads) prev_cache[j] = pi[j];
    pi = prev_cache;
  }
  int32_t* ps = fr.prev_slot[r];
  int32_t* so = fr.slot_of + r * K;
  uint8_t* mr = sc.miss + r * K;
  const int n_words = (k + 31) / 32;
  for (int w = threadIdx.x; w < n_words; w += kAssignThreads) used[w] = 0;
  for (int j = threadIdx.x; j < K - k; j += kAssignThreads) so[j] = -1;
  if (threadIdx.x == 0) n_selected = 0;
  __syncthreads();
  uint32_t mine = 0;
  for (int j = threadIdx.x; j < k; j += kAssignThreads) {
    const int32_t t = ir[j];
    int32_t slot = -1;
    bool is_miss = false;
    if (t >= 0) {
      ++mine;
      const int at = find_sorted(pi, k, t);
      if (at >= 0) {
        slot = ps[at];
        atomicOr(&used[slot >> 5], 1u << (slot & 31));
      } else {
        is_miss = true;
      }
    }
    so[K - k + j] = slot;
    mr[j] = is_miss;
  }
  if (mine) atomicAdd(&n_selected, mine);
  __syncthreads();
  {  // exclusive prefix of the free-slot counts over words
    constexpr int kPer = kWords / kAssignThreads;
    uint32_t cnt[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int w = threadIdx.x * kPer + i;
      const int bits = w < n_words ? min(32, k - 32 * w) : 0;
      const uint32_t valid = bits == 32 ? 0xffffffffu : (1u << bits) - 1u;
      cnt[i] = w < n_words ? __popc(~used[w] & valid) : 0u;
    }
    Scan(scan_tmp).ExclusiveSum(cnt, cnt);
#pragma unroll
    for (int i = 0; i < kPer; ++i) free_before[threadIdx.x * kPer + i] = cnt[i];
  }
  __syncthreads();
  uint32_t base = 0;
  for (int j0 = 0; j0 < k; j0 += kAssignThreads) {
    const int j = j0 + threadIdx.x;
    const uint32_t m = j < k ? mr[j] : 0u;
    uint32_t rank, total;
    __syncthreads();
    Scan(scan_tmp).ExclusiveSum(m, rank, total);
    if (m) {
      const uint32_t want = base + rank;
      int lo = 0, hi = n_words - 1;  // last word with free_before <= want
      while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (free_before[mid] <= want) lo = mid;
        else hi = mid - 1;
      }
      const int bits = min(32, k - 32 * lo);
      const uint32_t valid = bits == 32 ? 0xffffffffu : (1u << bits) - 1u;
      const uint32_t f = ~used[lo] & valid;
      const int pos = int(__fns(f, 0, int(want - free_before[lo]) + 1));
      so[K - k + j] = lo * 32 + pos;
      sc.miss_list[r * K + want] = make_int2(ir[j], lo * 32 + pos);
    }
    base += total;
  }
  __syncthreads();
  // This step's selection is the next step's cache state.
  for (int j = threadIdx.x; j < k; j += kAssignThreads) {
    prev_global[j] = ir[j];
    ps[j] = so[K - k + j];
  }
  if (threadIdx.x == 0) {
    sc.miss_count[r] = int32_t(base);
    if (fr.counters) {
      atomicAdd(&fr.counters[s][0], (unsigned long long)n_selected);
      atomicAdd(&fr.counters[s][1], (unsigned long long)base);
    }
  }
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

__global__ void __launch_bounds__(32 * kDecodeWarps) higgs_decode_rows_kernel(FetchParams p, DevFormat f, FetchRows fr,
                                                                            Scratch sc, int64_t grid_floats) {
  extern __shared__ float4 smem4[];  // [grid_floats] grid, [kDecodeWarps][dim] values
  float* smem = reinterpret_cast<float*>(smem4);
  const int64_t r = blockIdx.y;
  const int64_t n_items = int64_t(sc.miss_count[r]) * 2;
  if (int64_t(blockIdx.x) * kDecodeWarps >= n_items) return;  // the same for the whole block
  if (grid_floats) dev_stage_grid(f, smem);
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  float* y = smem + grid_floats + int64_t(warp) * f.dim;
  const int s = int(r / p.n_kv_head), h = int(r % p.n_kv_head), D = p.head_dim;
  const int G = f.group, d = f.grid_dim;
  for (int64_t i = int64_t(blockIdx.x) * kDecodeWarps + warp; i < n_items; i += int64_t(gridDim.x) * kDecodeWarps) {
    const int which = int(i % 2);  // 0: K, 1: V
    const int64_t m = i / 2;
    const int2 ts = sc.miss_list[r * p.kmax + m];
    const int64_t t = ts.x;
    const uint8_t* rec = staged(p, sc, r, m, h);
    int64_t off = 0;  // where the head's values start in the record
    if (p.values_only) {
      if (which == 0) {
        if (fr.key_first[s] < 0 || t < fr.key_first[s]) continue;  // a prompt key: svd_rebuild_kernel's
        rec += p.entry_bytes;
      }
    } else {
      rec += int64_t(which) * f.bytes;
      if (p.layer_wide && !fr.dense_k) off = int64_t(h) * D;
    }
    for (int g = 0; g < f.n_group; ++g) {
      const uint8_t* mp = rec + f.meta_offset + 2 * g;
      const float sigma = qdev::bf16_f32(uint32_t(mp[0]) | uint32_t(mp[1]) << 8);
      const uint8_t* cg = rec + int64_t(g) * f.code_bytes;
      float* yg = y + int64_t(g) * G;
      for (int q = lane; q < f.n_code; q += 32) {
        const int c = min(int(read_bits(cg, int64_t(q) * f.code_bits, f.code_bits)), f.grid_size - 1);
        const float* pc = f.grid + int64_t(c) * d;
        for (int k = 0; k < d; ++k) yg[q * d + k] = qdev::f_mul(sigma, pc[k]);
      }
    }
    __syncwarp();
    const int half = f.dim / 2, gh = G / 2;
    for (int hh = 1; hh < G; hh *= 2) {  // every group's butterflies at once
      for (int k = lane; k < half; k += 32) {
        const int kk = k % gh;
        const int j = (k / gh) * G + (kk / hh) * 2 * hh + kk % hh;
        const float a = y[j], b = y[j + hh];
        y[j] = qdev::f_add(a, b);
        y[j + hh] = qdev::f_sub(a, b);
      }
      __syncwarp();
    }
    for (int j = lane; j < f.dim; j += 32) {
      float u = qdev::f_mul(y[j], f.hadamard_scale);
      if (f.signs) u = qdev::f_mul(u, f.signs[j % G]);
      y[j] = u;
    }
    __syncwarp();
    float* val = y + off;
    const int n_val = fr.dense_k && p.layer_wide ? f.dim : D;  // dense layer-wide: every head
    if (which == 0 && p.keys_prerope) {  // rope_key's pairs, spread over the lanes
      for (int q = lane; q < n_val / 2; q += 32)
        rope_pair(val + (q / (D / 2)) * D, D, t, q % (D / 2), p.inv_freq, p.interleaved);
      __syncwarp();
    }
    __nv_bfloat16* dst = dst_of(p, fr, r, ts.y, which);
    for (int j = lane; j < n_val; j += 32) dst[j] = __float2bfloat16_rn(val[j]);
    __syncwarp();  // y is the next item's
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

__global__ void fill_list_kernel(FetchParams p, FetchRows fr, Scratch sc, const int64_t* __restrict__ fill_n,
                                 int64_t t0) {
  const int64_t r = blockIdx.x;
  const int s = int(r / p.n_kv_head);
  const bool on = fr.cache_all && fr.cache_all[s];
  const int64_t n = on ? max(int64_t(0), min(int64_t(p.kmax), fill_n[s] - t0)) : 0;
  for (int64_t m = threadIdx.x; m < n; m += blockDim.x)
    sc.miss_list[r * p.kmax + m] = make_int2(int(t0 + m), int(t0 + m));
  uint32_t* held = on ? reinterpret_cast<uint32_t*>(fr.prev_sel[r]) : nullptr;
  for (int64_t w = (t0 >> 5) + threadIdx.x; n > 0 && w <= (t0 + n - 1) >> 5; w += blockDim.x) {
    const int64_t lo = max(t0, w * 32), hi = min(t0 + n, w * 32 + 32);  // bits [lo, hi) of word w
    const uint32_t mask = (hi - lo == 32 ? 0xffffffffu : ((1u << (hi - lo)) - 1u)) << (lo - w * 32);
    atomicOr(&held[w], mask);
  }
  if (threadIdx.x == 0) sc.miss_count[r] = int32_t(n);
}

// fetch_dense: tokens [a, a + n) of every row listed, token a + m into dense row first + m.
__global__ void dense_list_kernel(FetchParams p, Scratch sc, int64_t a, int64_t first, int64_t n) {
  const int64_t r = blockIdx.x;
  for (int64_t m = threadIdx.x; m < n; m += blockDim.x)
    sc.miss_list[r * p.kmax + m] = make_int2(int(a + m), int(first + m));
  if (threadIdx.x == 0) sc.miss_count[r] = int32_t(n);
}

// fetch_dense, values_only: K = RoPE(pre-RoPE key) for tokens [t0, t0 + gridDim.x), a block per
// token and a thread per pair of every head; the keys read from pinned host memory.
__global__ void kpre_rope_kernel(FetchParams p, const __nv_bfloat16* __restrict__ kpre, int64_t t0,
                                 __nv_bfloat16* __restrict__ out) {
  const int64_t i = blockIdx.x, t = t0 + i;
  const int D = p.head_dim, half = D / 2;
  const int64_t W = int64_t(p.n_kv_head) * D;
  for (int j = threadIdx.x; j < p.n_kv_head * half; j += blockDim.x) {
    const int h = j / half, q = j % half;
    const int i0 = p.interleaved ? 2 * q : q, i1 = p.interleaved ? 2 * q + 1 : q + half;
    const __nv_bfloat16* src = kpre + t * W + int64_t(h) * D;
    float k2[2] = {__bfloat162float(src[i0]), __bfloat162float(src[i1])};
    double sn, cs;
    sincos(double(t) * p.inv_freq[q], &sn, &cs);
    const float c = float(cs), sv = float(sn);
    __nv_bfloat16* dst = out + i * W + int64_t(h) * D;
    dst[i0] = __float2bfloat16_rn(k2[0] * c - k2[1] * sv);
    dst[i1] = __float2bfloat16_rn(k2[0] * sv + k2[1] * c);
  }
}

// The listed misses (sc.miss_list / miss_count) from pinned host memory into
// their slots: copied as they are (raw), or staged and decoded.
void read_misses(const Exec& x, const FetchParams& p, const FetchRows& r, const Scratch& sc, int64_t rows) {
  if (p.raw)
    KVT_CHECK(p.slot_bytes == p.entry_bytes && !p.layer_wide && !p.values_only,
              "fetch_rows: raw slots ({} bytes) hold whole per-head entries ({} bytes)", p.slot_bytes, p.entry_bytes);
  else
    KVT_CHECK(p.elt == KvElt::bf16, "fetch_rows (CUDA): decoded slots are bf16");
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
    higgs_decode_rows_kernel<<<g, 32 * kDecodeWarps, smem, st(x)>>>(p, f, r, sc, grid_floats);
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

}  // namespace

int64_t fetch_scratch_bytes(const FetchParams& p) {
  const int64_t rows = int64_t(p.n_seq) * p.n_kv_head;
  return rows * int64_t(p.kmax) * stage_span_of(p) + rows * (int64_t(p.kmax) * 9 + 4) + 16;
}

void fetch_rows(const Exec& x, const FetchParams& p, const int32_t* sel, const FetchRows& r, FetchView* view) {
  const int64_t rows = int64_t(p.n_seq) * p.n_kv_head;
  KVT_CHECK(p.kmax > 0 && p.kmax <= kMaxSlots, "fetch_rows: {} selected per row (at most {})", p.kmax, kMaxSlots);
  KVT_CHECK(p.slot_bytes % 16 == 0, "fetch_rows: slots of {} bytes must be 16-byte multiples", p.slot_bytes);
  view->rows = r.slots;
  view->tok_stride = p.slot_bytes;
  view->v_offset = int64_t(p.head_dim) * kv_elt_bytes(p.elt);
  view->elt = p.elt;
  view->idx = r.slot_of;
  if (rows == 0) return;
  const Scratch sc = scratch_of(p, r.scratch);
  KVT_CHECK(p.entry_bytes % 16 == 0 && p.tok_bytes % 16 == 0,
            "fetch_rows: host entries of {} bytes (tokens of {}) must be 16-byte multiples", p.entry_bytes,
            p.tok_bytes);
  slot_assign_rows_kernel<<<unsigned(rows), kAssignThreads, 0, st(x)>>>(p, sel, r, sc);
  KVT_CUDA_LAUNCH_CHECK("slot_assign_rows_kernel");
  read_misses(x, p, r, sc, rows);
}

void fetch_fill(const Exec& x, const FetchParams& p, const FetchRows& r, const int64_t* fill_n, int64_t max_fill) {
  const int64_t rows = int64_t(p.n_seq) * p.n_kv_head;
  if (rows == 0 || max_fill <= 0) return;
  KVT_CHECK(max_fill < (int64_t(1) << 31), "fetch_fill: {} tokens exceed int32 slots", max_fill);
  const Scratch sc = scratch_of(p, r.scratch);
  for (int64_t t0 = 0; t0 < max_fill; t0 += p.kmax) {
    fill_list_kernel<<<unsigned(rows), 256, 0, st(x)>>>(p, r, sc, fill_n, t0);
    KVT_CUDA_LAUNCH_CHECK("fill_list_kernel");
    read_misses(x, p, r, sc, rows);
  }
}

void fetch_dense(const Exec& x, const FetchParams& p0, const FetchRows& r0, int64_t t0, int64_t t1, void* k_out,
                 void* v_out) {
  FetchParams p = p0;
  p.raw = false;
  p.elt = KvElt::bf16;
  FetchRows r = r0;
  r.dense_k = k_out;
  r.dense_v = v_out;
  KVT_CHECK(p.kmax > 0 && p.entry_bytes % 16 == 0 && p.tok_bytes % 16 == 0,
            "fetch_dense: {} tokens per pass, host entries of {} bytes (tokens of {})", p.kmax, p.entry_bytes,
            p.tok_bytes);
  KVT_CHECK(!p.layer_wide || p.fmt.dim == p.n_kv_head * p.head_dim,
            "fetch_dense: layer-wide records of {} values for {} KV dims", p.fmt.dim, p.n_kv_head * p.head_dim);
  KVT_CHECK(!p.values_only || r.prefill_kpre, "fetch_dense: shadowkv's prefill needs the pre-RoPE keys");
  const int64_t rows = p.layer_wide ? 1 : p.n_kv_head;  // a layer-wide record is read once for every head
  Scratch sc = scratch_of(p, r.scratch);
  sc.by_token = r.dense_host != nullptr;
  for (int64_t a = t0; a < t1; a += p.kmax) {
    const int64_t n = std::min<int64_t>(p.kmax, t1 - a);
    if (sc.by_token)  // the range as the host lays it out, by the copy engine
      KVT_CUDA_CHECK(cudaMemcpyAsync(sc.stage, r.dense_host + a * p.tok_bytes, size_t(n * p.tok_bytes),
                                     cudaMemcpyHostToDevice, st(x)));
    dense_list_kernel<<<unsigned(rows), 256, 0, st(x)>>>(p, sc, a, a - t0, n);
    KVT_CUDA_LAUNCH_CHECK("dense_list_kernel");
    read_misses(x, p, r, sc, rows);
  }
  if (p.values_only) {
    kpre_rope_kernel<<<unsigned(t1 - t0), 256, 0, st(x)>>>(p, reinterpret_cast<const __nv_bfloat16*>(r.prefill_kpre),
                                                            t0, static_cast<__nv_bfloat16*>(k_out));
    KVT_CUDA_LAUNCH_CHECK("kpre_rope_kernel");
  }
}

}  // namespace kvtier::cuda
