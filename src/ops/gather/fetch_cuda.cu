// fetch_rows on the GPU (fetch.h): a slot cache per (sequence, KV head) row.
// Pass 1, one block per row: slots are assigned as gather.h specifies (hits
// keep their slot, found by binary search in the previous selection; free
// slots ranked by a scan over a bitmap; the m-th miss in token order takes the
// m-th free slot), the row's misses listed, the selection kept for the next
// step. A head's own HIGGS entries (the default host tier) then take one
// kernel that reads each miss and decodes it (fetch_read_cuda.cu). Else
// pass 2 reads only the misses from pinned host memory (zero-copy), as
// 16-byte chunks with several loads in flight per thread (PCIe reads are
// bound by their count: a thread reading a record byte by byte was ~10×
// slower): raw entries straight into their slots; records into a staging
// row in GPU memory, then (pass 3) decoded into bf16 K|V slots (HIGGS,
// NVFP4, f32, layer-wide records, pre-RoPE keys with RoPE applied, shadowkv's
// keys rebuilt from the SVD). cache=all rows skip the assignment's search:
// token t lives in slot t, a bitmap says which are held, and fetch_fill
// reads the prompt into them in order when decode starts.
//
// Here: pass 1 and the entry points; passes 2 and 3 (read_misses) are in
// fetch_read_cuda.cu.
#include <cuda_bf16.h>

#include <cub/block/block_scan.cuh>

#include "backend/cuda_backend.h"
#include "ops/gather/fetch_cuda.h"
#include "ops/gather/fetch_cuda_detail.cuh"

namespace kvtier::cuda {
namespace {

using fetch_detail::read_misses;
using fetch_detail::Scratch;

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
