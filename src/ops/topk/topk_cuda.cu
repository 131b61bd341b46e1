// One 1024-thread block per row. Pass p (p = 0, 1, 2) histograms the next
// 11/11/10 key bits of the elements whose higher bits match the prefix found
// so far, and picks the bin that holds the k-th largest. The final pass walks
// the row in index order: key > T is taken, key == T is taken for the first
// (k − count(> T)) occurrences; positions come from one block scan per chunk
// of packed (gt, eq) counts.
#include <cub/block/block_scan.cuh>

#include "backend/cuda_backend.h"
#include "ops/topk/topk_cuda.h"

namespace kvtier::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kBins = 2048;

__device__ __forceinline__ uint32_t order_key(float x) {
  uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(kThreads) topk_kernel(const float* __restrict__ scores, int64_t n,
                                                        int64_t row_stride, int k, int64_t tok_offset,
                                                        int32_t* __restrict__ out) {
  using Scan = cub::BlockScan<uint32_t, kThreads>;
  __shared__ uint32_t hist[kBins];
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ uint32_t s_prefix, s_remaining;
  const float* row = scores + int64_t(blockIdx.x) * row_stride;
  int32_t* orow = out + int64_t(blockIdx.x) * k;
  const int tid = threadIdx.x;

  uint32_t prefix = 0, prefix_mask = 0, remaining = uint32_t(k);
  const int shifts[3] = {21, 10, 0};
  const int widths[3] = {11, 11, 10};
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = shifts[pass], n_bins = 1 << widths[pass];
    for (int b = tid; b < kBins; b += kThreads) hist[b] = 0;
    __syncthreads();
    for (int64_t i = tid; i < n; i += kThreads) {
      const uint32_t key = order_key(row[i]);
      if ((key & prefix_mask) == prefix) atomicAdd(&hist[(key >> shift) & (n_bins - 1)], 1u);
    }
    __syncthreads();
    // Warp 0 finds the bin, scanning from the top: lane L owns bins
    // [L*per, (L+1)*per) counted from the highest.
    if (tid < 32) {
      const int per = n_bins / 32;
      uint32_t sum = 0;
      for (int j = 0; j < per; ++j) sum += hist[n_bins - 1 - (tid * per + j)];
      uint32_t incl = sum;
      for (int off = 1; off < 32; off <<= 1) {
        uint32_t v = __shfl_up_sync(0xffffffffu, incl, off);
        if (tid >= off) incl += v;
      }
      const uint32_t excl = incl - sum;
      if (excl < remaining && incl >= remaining) {  // exactly one lane
        uint32_t acc = excl;
        for (int j = 0; j < per; ++j) {
          const int bin = n_bins - 1 - (tid * per + j);
          const uint32_t c = hist[bin];
          if (acc + c >= remaining) {
            s_prefix = prefix | (uint32_t(bin) << shift);
            s_remaining = remaining - acc;
            break;
          }
          acc += c;
        }
      }
    }
    __syncthreads();
    prefix = s_prefix;
    remaining = s_remaining;
    prefix_mask |= uint32_t(n_bins - 1) << shift;
    __syncthreads();
  }
  // Threshold T = prefix; `remaining` elements equal to T are taken (lowest first).
  const uint32_t thr = prefix, need_eq = remaining;
  uint32_t gt_before = 0, eq_before = 0;  // running totals over earlier chunks
  constexpr int kPer = 4;                  // consecutive elements per thread per chunk
  for (int64_t c0 = 0; c0 < n; c0 += int64_t(kThreads) * kPer) {
    const int64_t i0 = c0 + int64_t(tid) * kPer;
    uint32_t keys[kPer];
    uint32_t n_gt = 0, n_eq = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      keys[j] = i0 + j < n ? order_key(row[i0 + j]) : 0u;
      n_gt += (i0 + j < n && keys[j] > thr);
      n_eq += (i0 + j < n && keys[j] == thr);
    }
    const uint32_t packed = (n_gt << 16) | n_eq;  // per chunk counts stay < 2^16
    uint32_t excl, total;
    Scan(scan_tmp).ExclusiveSum(packed, excl, total);
    uint32_t my_gt = gt_before + (excl >> 16), my_eq = eq_before + (excl & 0xffffu);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (i0 + j >= n) break;
      const bool gt = keys[j] > thr, eq = keys[j] == thr;
      if (gt || (eq && my_eq < need_eq)) orow[my_gt + min(my_eq, need_eq)] = int32_t(tok_offset + i0 + j);
      my_gt += gt;
      my_eq += eq;
    }
    gt_before += total >> 16;
    eq_before += total & 0xffffu;
    __syncthreads();
  }
}

__global__ void iota_kernel(int64_t n, int64_t tok_offset, int32_t* out) {
  int32_t* orow = out + int64_t(blockIdx.x) * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) orow[i] = int32_t(tok_offset + i);
}

}  // namespace

void topk(const float* scores, int64_t n_rows, int64_t n, int64_t row_stride, int k, int64_t tok_offset,
          int32_t* out, cudaStream_t s) {
  KVT_CHECK(k > 0 && n >= 0 && row_stride >= n, "topk: k {} n {} row_stride {} invalid", k, n, row_stride);
  KVT_CHECK(n < (int64_t(1) << 31), "topk: row of {} scores too long (max 2^31)", n);
  if (n_rows == 0 || n == 0) return;
  if (n <= k) {  // everything is selected
    iota_kernel<<<unsigned(n_rows), 256, 0, s>>>(n, tok_offset, out);
    KVT_CUDA_LAUNCH_CHECK("iota_kernel");
    return;
  }
  topk_kernel<<<unsigned(n_rows), kThreads, 0, s>>>(scores, n, row_stride, k, tok_offset, out);
  KVT_CUDA_LAUNCH_CHECK("topk_kernel");
}

}  // namespace kvtier::cuda
