#include <algorithm>

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

// Work item = one 16-byte chunk of one selected entry; a thread takes kUnroll
// items spaced by the grid size so that each load is independent.
__global__ void __launch_bounds__(kThreads) gather_kernel(GatherParams p, const uint8_t* __restrict__ src,
                                                          const int32_t* __restrict__ idx,
                                                          const int32_t* __restrict__ prev_idx,
                                                          const uint8_t* __restrict__ prev_dst,
                                                          uint8_t* __restrict__ dst,
                                                          unsigned long long* misses) {
  const int64_t chunks = p.entry_bytes >> 4;
  const int64_t n_items = p.n_rows * p.k * chunks;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  unsigned long long my_misses = 0;
  for (int64_t base = int64_t(blockIdx.x) * kThreads + threadIdx.x; base < n_items; base += stride * kUnroll) {
    uint4 v[kUnroll];
    uint4* d[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      d[u] = nullptr;
      const int64_t item = base + u * stride;
      if (item >= n_items) continue;
      const int64_t c = item % chunks, e = item / chunks;
      const int64_t r = e / p.k;
      const int i = int(e % p.k);
      const int32_t t = idx[e];
      if (t < 0) continue;
      const uint4* s = nullptr;
      if (p.k_prev > 0) {
        const int j = find_sorted(prev_idx + r * p.k_prev, p.k_prev, t);
        if (j >= 0) s = reinterpret_cast<const uint4*>(prev_dst + r * p.dst_row_stride + j * p.entry_bytes) + c;
      }
      if (!s) {
        s = reinterpret_cast<const uint4*>(src + r * p.src_row_stride + int64_t(t) * p.src_tok_stride) + c;
        if (c == 0) ++my_misses;
      }
      v[u] = *s;  // plain load: pinned host memory must not go through the non-coherent path
      d[u] = reinterpret_cast<uint4*>(dst + r * p.dst_row_stride + i * p.entry_bytes) + c;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (d[u]) *d[u] = v[u];
  }
  if (misses) {
    for (int off = 16; off > 0; off >>= 1) my_misses += __shfl_xor_sync(0xffffffffu, my_misses, off);
    if ((threadIdx.x & 31) == 0 && my_misses) atomicAdd(misses, my_misses);
  }
}

}  // namespace

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
  // Enough threads in flight to cover PCIe latency (~1-2 µs × 55 GB/s ≈ 100 KB
  // outstanding); more blocks than that only queue.
  const int64_t want = int64_t(device_info().n_sm) * 8;
  const int64_t need = (n_items + int64_t(kThreads) * kUnroll - 1) / (int64_t(kThreads) * kUnroll);
  const int blocks = int(std::max<int64_t>(1, std::min(want, need)));
  gather_kernel<<<blocks, kThreads, 0, s>>>(p, src, idx, prev_idx, prev_dst, dst, misses);
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
