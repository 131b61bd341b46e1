#include <algorithm>

#include <cub/block/block_scan.cuh>

#include "ops/gather/gather_cuda.h"

namespace kvtier::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // independent 16-byte loads in flight per thread

// Lower bound of t in the ascending list a[0..n).
__device__ __forceinline__ int find_sorted(const int32_t* a, int n, int32_t t) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (a[mid] < t) lo = mid + 1;
    else hi = mid;
  }
  return (lo < n && a[lo] == t) ? lo : -1;
}

// Copies 16-byte work items [first, n_items) with the given stride, kUnroll
// items per thread per round so that their loads are in flight together.
// at(item, src, dst) sets the item's addresses, or returns false to skip it.
template <class At>
__device__ __forceinline__ void copy_items(int64_t first, int64_t n_items, int64_t stride, At at) {
  for (int64_t base = first; base < n_items; base += stride * kUnroll) {
    uint4 v[kUnroll];
    uint4* d[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      d[u] = nullptr;
      const int64_t item = base + u * stride;
      const uint4* s = nullptr;
      if (item >= n_items || !at(item, s, d[u])) {
        d[u] = nullptr;
        continue;
      }
      v[u] = *s;  // plain load: pinned host memory must not go through the non-coherent path
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (d[u]) *d[u] = v[u];
  }
}

// Work item = one 16-byte chunk of one selected entry; a thread takes kUnroll
// items spaced by the grid size so that each load is independent.
__global__ void __launch_bounds__(kThreads) gather_kernel(GatherParams p, const uint8_t* __restrict__ src,
                                                          const int32_t* __restrict__ idx,
                                                          const int32_t* __restrict__ prev_idx,
                                                          const uint8_t* __restrict__ prev_dst,
                                                          uint8_t* __restrict__ dst,
                                                          unsigned long long* misses) {
  const int64_t chunks = p.entry_bytes >> 4;
  unsigned long long my_misses = 0;
  copy_items(int64_t(blockIdx.x) * kThreads + threadIdx.x, p.n_rows * p.k * chunks, int64_t(gridDim.x) * kThreads,
             [&](int64_t item, const uint4*& s, uint4*& d) {
               const int64_t c = item % chunks, e = item / chunks;
               const int64_t r = e / p.k;
               const int32_t t = idx[e];
               if (t < 0) return false;
               if (p.k_prev > 0) {
                 const int j = find_sorted(prev_idx + r * p.k_prev, p.k_prev, t);
                 if (j >= 0) s = reinterpret_cast<const uint4*>(prev_dst + r * p.dst_row_stride + j * p.entry_bytes) + c;
               }
               if (!s) {
                 s = reinterpret_cast<const uint4*>(src + r * p.src_row_stride + int64_t(t) * p.src_tok_stride) + c;
                 if (c == 0) ++my_misses;
               }
               d = reinterpret_cast<uint4*>(dst + r * p.dst_row_stride + (e % p.k) * p.entry_bytes) + c;
               return true;
             });
  if (misses) {
    for (int off = 16; off > 0; off >>= 1) my_misses += __shfl_xor_sync(0xffffffffu, my_misses, off);
    if ((threadIdx.x & 31) == 0 && my_misses) atomicAdd(misses, my_misses);
  }
}

// Slot cache, pass 1: one block per row assigns slots (gather.h): hits keep
// theirs (binary search in the previous sorted selection), the free slots
// (a bitmap) are ranked by a scan over 32-slot words, and the m-th miss in
// token order takes the m-th free slot.
constexpr int kAssignThreads = 1024;
constexpr int kWords = kSlotGatherMaxK / 32;
constexpr int kPrevCache = 8192;

__global__ void __launch_bounds__(kAssignThreads) slot_assign_kernel(int k, const int32_t* __restrict__ idx,
                                                                      const int32_t* __restrict__ prev_idx,
                                                                      const int32_t* __restrict__ prev_slot,
                                                                      int32_t* __restrict__ slot_of,
                                                                      uint8_t* __restrict__ miss,
                                                                      int2* __restrict__ miss_list,
                                                                      int32_t* __restrict__ miss_count) {
  using Scan = cub::BlockScan<uint32_t, kAssignThreads>;
  __shared__ uint32_t used[kWords];
  __shared__ uint32_t free_before[kWords];  // free slots in the words before
  __shared__ int32_t prev_cache[kPrevCache];  // the previous selection, searched in shared memory when it fits
  __shared__ typename Scan::TempStorage scan_tmp;
  const int64_t r = blockIdx.x;
  const int32_t* ir = idx + r * k;
  const int32_t* pi = prev_idx + r * k;
  if (k <= kPrevCache) {
    for (int j = threadIdx.x; j < k; j += kAssignThreads) prev_cache[j] = pi[j];
    pi = prev_cache;
  }
  const int32_t* ps = prev_slot + r * k;
  int32_t* so = slot_of + r * k;
  uint8_t* mr = miss + r * k;
  const int n_words = (k + 31) / 32;
  for (int w = threadIdx.x; w < n_words; w += kAssignThreads) used[w] = 0;
  __syncthreads();
  for (int j = threadIdx.x; j < k; j += kAssignThreads) {
    const int32_t t = ir[j];
    int32_t slot = -1;
    bool is_miss = false;
    if (t >= 0) {
      const int at = find_sorted(pi, k, t);
      if (at >= 0) {
        slot = ps[at];
        atomicOr(&used[slot >> 5], 1u << (slot & 31));
      } else {
        is_miss = true;
      }
    }
    so[j] = slot;
    mr[j] = is_miss;
  }
  __syncthreads();
  // Exclusive prefix of the free-slot counts over words (2 words per thread).
  {
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
  // Misses in token order take the free slots in slot order.
  uint32_t base = 0;
  for (int j0 = 0; j0 < k; j0 += kAssignThreads) {
    const int j = j0 + threadIdx.x;
    const uint32_t m = j < k ? mr[j] : 0u;
    uint32_t rank, total;
    __syncthreads();  // scan_tmp reuse
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
      so[j] = lo * 32 + pos;
      miss_list[r * k + want] = make_int2(ir[j], lo * 32 + pos);  // (token, slot)
    }
    base += total;
  }
  if (threadIdx.x == 0) miss_count[r] = int32_t(base);
}

// Slot cache, pass 2: only the misses, from each row's compact list of
// (token, slot): a block takes 16-byte chunks of its row's misses, several
// loads in flight per thread, so a few misses cost one round trip over PCIe
// rather than one per pass over all selected entries.
__global__ void __launch_bounds__(kThreads) slot_copy_kernel(GatherParams p, const uint8_t* __restrict__ src,
                                                             const int2* __restrict__ miss_list,
                                                             const int32_t* __restrict__ miss_count,
                                                             uint8_t* __restrict__ dst,
                                                             unsigned long long* misses) {
  const int64_t r = blockIdx.y;
  const int64_t chunks = p.entry_bytes >> 4;
  const int2* ml = miss_list + r * p.k;
  copy_items(int64_t(blockIdx.x) * kThreads + threadIdx.x, int64_t(miss_count[r]) * chunks,
             int64_t(gridDim.x) * kThreads, [&](int64_t item, const uint4*& s, uint4*& d) {
               const int2 ts = ml[item / chunks];  // (token, slot)
               const int64_t c = item % chunks;
               s = reinterpret_cast<const uint4*>(src + r * p.src_row_stride + int64_t(ts.x) * p.src_tok_stride) + c;
               d = reinterpret_cast<uint4*>(dst + r * p.dst_row_stride + int64_t(ts.y) * p.entry_bytes) + c;
               return true;
             });
  if (misses && blockIdx.x == 0 && threadIdx.x == 0 && miss_count[r] > 0)
    atomicAdd(misses, (unsigned long long)miss_count[r]);
}

int copy_blocks(int64_t n_items) {
  // Enough threads in flight to cover PCIe latency (~1-2 µs × 55 GB/s ≈ 100 KB
  // outstanding); more blocks than that only queue.
  const int64_t want = int64_t(device_info().n_sm) * 8;
  const int64_t need = (n_items + int64_t(kThreads) * kUnroll - 1) / (int64_t(kThreads) * kUnroll);
  return int(std::max<int64_t>(1, std::min(want, need)));
}

}  // namespace

int64_t gather_slots_scratch_bytes(const GatherParams& p) { return p.n_rows * (int64_t(p.k) * 9 + 4); }

void gather_slots(const GatherParams& p, const uint8_t* src, const int32_t* idx, const int32_t* prev_idx,
                  const int32_t* prev_slot, int32_t* slot_of, void* scratch, uint8_t* dst,
                  unsigned long long* misses, cudaStream_t s) {
  KVT_CHECK(p.entry_bytes > 0 && p.entry_bytes % 16 == 0,
            "gather_slots: entry_bytes {} must be a positive multiple of 16", p.entry_bytes);
  KVT_CHECK(p.k > 0 && p.k <= kSlotGatherMaxK, "gather_slots: k {} outside [1, {}]", p.k, kSlotGatherMaxK);
  KVT_CHECK(p.src_row_stride % 16 == 0 && p.src_tok_stride % 16 == 0 && p.dst_row_stride % 16 == 0,
            "gather_slots: strides ({}, {}, {}) must be multiples of 16", p.src_row_stride, p.src_tok_stride,
            p.dst_row_stride);
  KVT_CHECK(p.dst_row_stride >= p.k * p.entry_bytes, "gather_slots: dst_row_stride {} < k {} x entry_bytes {}",
            p.dst_row_stride, p.k, p.entry_bytes);
  if (p.n_rows == 0) return;
  KVT_CHECK(reinterpret_cast<uintptr_t>(scratch) % 8 == 0, "gather_slots: scratch must be 8-byte aligned");
  // scratch: miss lists [n_rows, k] int2 (token, slot), miss counts [n_rows], flags [n_rows, k]
  auto* miss_list = static_cast<int2*>(scratch);
  auto* miss_count = reinterpret_cast<int32_t*>(miss_list + p.n_rows * p.k);
  auto* miss = reinterpret_cast<uint8_t*>(miss_count + p.n_rows);
  slot_assign_kernel<<<unsigned(p.n_rows), kAssignThreads, 0, s>>>(p.k, idx, prev_idx, prev_slot, slot_of, miss,
                                                                    miss_list, miss_count);
  KVT_CUDA_LAUNCH_CHECK("slot_assign_kernel");
  // Blocks per row: the copy grid's share of ~8 blocks per SM (a round of
  // loads covers k·entry_bytes/16 chunks per row at b1; big batches take a few).
  const int64_t per_row = std::max<int64_t>(1, int64_t(device_info().n_sm) * 8 / p.n_rows);
  const int64_t need = (int64_t(p.k) * (p.entry_bytes / 16) + int64_t(kThreads) * kUnroll - 1) / (int64_t(kThreads) * kUnroll);
  const dim3 grid(unsigned(std::min(per_row, need)), unsigned(p.n_rows));
  slot_copy_kernel<<<grid, kThreads, 0, s>>>(p, src, miss_list, miss_count, dst, misses);
  KVT_CUDA_LAUNCH_CHECK("slot_copy_kernel");
}

void gather(const GatherParams& p, const uint8_t* src, const int32_t* idx, const int32_t* prev_idx,
            const uint8_t* prev_dst, uint8_t* dst, unsigned long long* misses, cudaStream_t s) {
  KVT_CHECK(p.entry_bytes > 0 && p.entry_bytes % 16 == 0, "gather: entry_bytes {} must be a positive multiple of 16",
            p.entry_bytes);
  KVT_CHECK(p.src_row_stride % 16 == 0 && p.src_tok_stride % 16 == 0 && p.dst_row_stride % 16 == 0,
            "gather: strides ({}, {}, {}) must be multiples of 16", p.src_row_stride, p.src_tok_stride,
            p.dst_row_stride);
  KVT_CHECK(p.dst_row_stride >= p.k * p.entry_bytes, "gather: dst_row_stride {} < k {} x entry_bytes {}",
            p.dst_row_stride, p.k, p.entry_bytes);
  KVT_CHECK(p.k_prev == 0 || (prev_idx && prev_dst), "gather: reuse needs prev_idx and prev_dst");
  const int64_t n_items = p.n_rows * p.k * (p.entry_bytes / 16);
  if (n_items == 0) return;
  gather_kernel<<<copy_blocks(n_items), kThreads, 0, s>>>(p, src, idx, prev_idx, prev_dst, dst, misses);
  KVT_CUDA_LAUNCH_CHECK("gather_kernel");
}

int64_t gather_memcpy(const GatherParams& p, const uint8_t* src_host, const int32_t* idx_host, uint8_t* dst,
                      cudaStream_t s, CopyStats* stats) {
  KVT_CHECK(p.k_prev == 0, "gather_memcpy: reuse is not supported on the copy-engine path");
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  const bool contiguous_entries = p.src_tok_stride == p.entry_bytes;
  for (int64_t r = 0; r < p.n_rows; ++r) {
    const int32_t* ir = idx_host + r * p.k;
    for (int i = 0; i < p.k;) {
      if (ir[i] < 0) {
        ++i;
        continue;
      }
      int j = i + 1;
      if (contiguous_entries)
        while (j < p.k && ir[j] == ir[j - 1] + 1) ++j;
      dsts.push_back(dst + r * p.dst_row_stride + int64_t(i) * p.entry_bytes);
      srcs.push_back(src_host + r * p.src_row_stride + int64_t(ir[i]) * p.src_tok_stride);
      sizes.push_back(size_t(j - i) * size_t(p.entry_bytes));
      if (stats) stats->h2d_bytes += sizes.back();
      i = j;
    }
  }
  if (dsts.empty()) return 0;
  KVT_CHECK(s != nullptr && s != cudaStreamLegacy, "gather_memcpy: cudaMemcpyBatchAsync needs a created stream, not the legacy default stream");
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  size_t attr_idx = 0;
  KVT_CUDA_CHECK(cudaMemcpyBatchAsync(reinterpret_cast<void* const*>(dsts.data()),
                                      reinterpret_cast<const void* const*>(srcs.data()), sizes.data(), dsts.size(),
                                      &attr, &attr_idx, 1, s));
  if (stats) stats->n_copies += dsts.size();
  return int64_t(dsts.size());
}

}  // namespace kvtier::cuda
