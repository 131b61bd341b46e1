// topk_rows on the GPU (index_rows.h; the CPU version in index_rows_cpu.cpp
// is the specification): each row's k best candidate chunks, a cluster of
// thread blocks per row reading the row's lengths from the StepRanges.
#include <cooperative_groups.h>

#include "backend/cuda_backend.h"
#include "ops/index_score/index_rows_cuda.h"
#include "ops/index_score/score_rows_cuda.cuh"

namespace kvtier::cuda {
namespace {

namespace cg = cooperative_groups;

// ---- top-k (one cluster of 8 blocks per row)
// Block b of a cluster owns a contiguous chunk of the row. Pass p (p = 0, 1,
// 2) builds each block's shared histogram of the next 11/11/10 key bits
// (elements whose higher bits match the prefix found so far); after a cluster
// barrier every block reads all 8 histograms through distributed shared
// memory and picks, identically, the bin that holds the k-th largest. The
// compaction walks the chunk in index order: key > T is taken, key == T for
// the first (k − count(> T)) occurrences of the row.
//
// A row that fits one tile per block first shifts its keys left past the
// bits they all share (a cluster-wide min and max): the same order and
// ties, but pass 0's 11 bits are then the first that differ. Scores spread
// over a few binary exponents would otherwise land in a dozen of pass 0's
// 2,048 bins, and the shared atomics on them serialize.
//
// gqa_topk_rows reads gqa_rows' aggregate where it would read a score:
// max_j (raw_j[i] − lse_j), the same floats gqa_max_kernel writes, so the
// aggregate row is never written and read back.

constexpr int kCluster = 8;
constexpr int kTopThreads = 1024;
constexpr int kWarps = kTopThreads / 32;
constexpr int kPerLane = 16;
constexpr int kWarpSpan = 32 * kPerLane;
constexpr int kTile = kTopThreads * kPerLane;
constexpr int kHistWords = 2048 + 2048 + 1024;

__device__ __forceinline__ uint32_t order_key(float x) {
  uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ uint32_t warp_inclusive_sum(uint32_t v, int lane) {
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const uint32_t u = __shfl_up_sync(0xffffffffu, v, off);
    if (lane >= off) v += u;
  }
  return v;
}

constexpr int kMaxGqaQueries = 64;

// Where a row's candidates' scores come from: scores[row · stride + i], or
// (GQA) the aggregate of raw[(row · n_q + j) · stride + c_lo + i] over the
// row's n_q queries, whose log-sum-exps the kernel gets from gp.
struct TopkSource {
  const float* scores = nullptr;
  int64_t stride = 0;
  int n_q = 0;
  score_detail::GqaPartials gp{};
};

// A tile's keys from src (the block's first candidate; queries q_stride
// apart for GQA, with their log-sum-exps in lse).
template <bool GQA>
__device__ __forceinline__ void load_tile(const float* __restrict__ src, int len, int warp, int lane,
                                          uint32_t (&keys)[kPerLane], int n_q, int64_t q_stride, const float* lse) {
  if constexpr (GQA) {
    float best[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) best[i] = -INFINITY;
    for (int j = 0; j < n_q; ++j) {
      const float* xj = src + j * q_stride;
      const float l = lse[j];
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int off = warp * kWarpSpan + i * 32 + lane;
        if (off < len) best[i] = fmaxf(best[i], xj[off] - l);
      }
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) keys[i] = warp * kWarpSpan + i * 32 + lane < len ? order_key(best[i]) : 0u;
  } else {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int off = warp * kWarpSpan + i * 32 + lane;
      keys[i] = off < len ? order_key(src[off]) : 0u;
    }
  }
}

__device__ void select_bin(const cg::cluster_group& cluster, uint32_t* hist, uint32_t* group, int n_bins, int shift,
                           uint32_t prefix, uint32_t remaining, int lane, uint32_t* s_prefix,
                           uint32_t* s_remaining) {
  uint32_t c = 0;
#pragma unroll
  for (int r = 0; r < kCluster; ++r) c += cluster.map_shared_rank(group, r)[31 - lane];
  uint32_t incl = warp_inclusive_sum(c, lane);
  uint32_t excl = incl - c;
  const int g_lane = __ffs(__ballot_sync(0xffffffffu, excl < remaining && incl >= remaining)) - 1;
  remaining -= __shfl_sync(0xffffffffu, excl, g_lane);
  const int per_group = n_bins / 32, per_lane = per_group / 32;
  const int top = (31 - g_lane) * per_group + per_group - 1;
  const int b0 = top - lane * per_lane, b1 = b0 - 1;
  uint32_t c0 = 0, c1 = 0;
#pragma unroll
  for (int r = 0; r < kCluster; ++r) {
    const uint32_t* h = cluster.map_shared_rank(hist, r);
    c0 += h[b0];
    if (per_lane == 2) c1 += h[b1];
  }
  incl = warp_inclusive_sum(c0 + c1, lane);
  excl = incl - c0 - c1;
  if (excl < remaining && incl >= remaining) {
    const bool first = excl + c0 >= remaining;
    *s_prefix = prefix | (uint32_t(first ? b0 : b1) << shift);
    *s_remaining = remaining - excl - (first ? 0u : c0);
  }
}

template <bool GQA>
__global__ void __launch_bounds__(kTopThreads)
    topk_rows_kernel(int n_kv_head, int kmax, TopkSource source, const StepRanges* __restrict__ ranges,
                     int32_t* __restrict__ out) {
  const cg::cluster_group cluster = cg::this_cluster();
  __shared__ uint32_t hist[kHistWords];
  __shared__ uint32_t group[3][32];
  __shared__ uint32_t s_warp[kWarps];
  __shared__ uint32_t s_counts[2];
  __shared__ uint32_t s_base[2];
  __shared__ uint32_t s_prefix, s_remaining;
  __shared__ uint32_t s_span[2];  // this block's smallest and largest key
  __shared__ float s_lse[GQA ? kMaxGqaQueries : 1];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int rank = int(cluster.block_rank());
  const int64_t row = blockIdx.x / kCluster;
  const StepRanges sr = ranges[row / n_kv_head];
  const int64_t n = sr.c_hi - sr.c_lo;
  const int k = int(min(min(sr.k, int64_t(kmax)), n));
  int32_t* orow = out + row * kmax;
  // Every block of the cluster takes the same branch (the same row's values).
  if (k <= 0 || n <= k) {  // nothing, or everything, is selected
    if (rank == 0)
      for (int i = tid; i < kmax; i += kTopThreads) orow[i] = i < kmax - k ? -1 : int32_t(sr.c_lo + (i - (kmax - k)));
    return;
  }
  if (rank == 0)
    for (int i = tid; i < kmax - k; i += kTopThreads) orow[i] = -1;
  int32_t* osel = orow + (kmax - k);
  const int64_t chunk = ((n + kCluster - 1) / kCluster + 31) & ~int64_t(31);
  const int64_t begin = min(n, rank * chunk), len = min(n, begin + chunk) - begin;
  const float* src = source.scores + begin;
  if constexpr (GQA) {
    src += row * source.n_q * source.stride + sr.c_lo;
    for (int j = warp; j < source.n_q; j += kWarps) {
      const float v = score_detail::query_lse(source.gp, row * source.n_q + j, lane);
      if (lane == 0) s_lse[j] = v;
    }
    __syncthreads();
  } else {
    src += row * source.stride;
  }
  const int n_q = GQA ? source.n_q : 0;
  const int64_t q_stride = source.stride;
  const int n_tiles = int((len + kTile - 1) / kTile);
  auto tile_len = [&](int t) { return int(min(int64_t(kTile), len - int64_t(t) * kTile)); };
  for (int b = tid; b < kHistWords; b += kTopThreads) hist[b] = 0;
  uint32_t keys[kPerLane];
  if (n_tiles <= 1) {
    load_tile<GQA>(src, int(len), warp, lane, keys, n_q, q_stride, s_lse);
    uint32_t lo = 0xffffffffu, hi = 0u;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (warp * kWarpSpan + i * 32 + lane < len) {
        lo = min(lo, keys[i]);
        hi = max(hi, keys[i]);
      }
    lo = __reduce_min_sync(0xffffffffu, lo);
    hi = __reduce_max_sync(0xffffffffu, hi);
    if (lane == 0) s_warp[warp] = lo;
    __syncthreads();
    if (warp == 0) {
      const uint32_t l = __reduce_min_sync(0xffffffffu, lane < kWarps ? s_warp[lane] : 0xffffffffu);
      if (lane == 0) s_span[0] = l;
    }
    __syncthreads();
    if (lane == 0) s_warp[warp] = hi;
    __syncthreads();
    if (warp == 0) {
      const uint32_t h = __reduce_max_sync(0xffffffffu, lane < kWarps ? s_warp[lane] : 0u);
      if (lane == 0) s_span[1] = h;
    }
    cluster.sync();
    uint32_t c_lo = 0xffffffffu, c_hi = 0u;
    for (int r = 0; r < kCluster; ++r) {
      const uint32_t* sp = cluster.map_shared_rank(s_span, r);
      c_lo = min(c_lo, sp[0]);
      c_hi = max(c_hi, sp[1]);
    }
    const uint32_t diff = c_lo ^ c_hi;
    const int up = diff ? __clz(diff) : 0;  // bits every key of the row shares, above the first that differs
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) keys[i] <<= up;
  }
  __syncthreads();
  uint32_t prefix = 0, prefix_mask = 0, remaining = uint32_t(k);
  constexpr int kShift[3] = {21, 10, 0}, kBits[3] = {11, 11, 10}, kHistAt[3] = {0, 2048, 4096};
#pragma unroll
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = kShift[pass], n_bins = 1 << kBits[pass];
    uint32_t* h = hist + kHistAt[pass];
    for (int t = 0; t < n_tiles; ++t) {
      if (n_tiles > 1) load_tile<GQA>(src + int64_t(t) * kTile, tile_len(t), warp, lane, keys, n_q, q_stride, s_lse);
      const int tl = tile_len(t);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const bool ok = warp * kWarpSpan + i * 32 + lane < tl;
        if (ok && (keys[i] & prefix_mask) == prefix) atomicAdd(&h[(keys[i] >> shift) & (n_bins - 1)], 1u);
      }
    }
    __syncthreads();
    for (int gi = warp; gi < 32; gi += kWarps) {  // 32 groups of bins
      const int per_group = n_bins / 32;
      uint32_t v = 0;
      for (int b = lane; b < per_group; b += 32) v += h[gi * per_group + b];
      v = __reduce_add_sync(0xffffffffu, v);
      if (lane == 0) group[pass][gi] = v;
    }
    cluster.sync();
    if (warp == 0)
      select_bin(cluster, h, group[pass], n_bins, shift, prefix, remaining, lane, &s_prefix, &s_remaining);
    __syncthreads();
    prefix = s_prefix;
    remaining = s_remaining;
    prefix_mask |= uint32_t(n_bins - 1) << shift;
  }
  const uint32_t thr = prefix, need_eq = remaining;
  {
    const uint32_t sel0 = thr >> 21, sel1 = (thr >> 10) & 2047u, sel2 = thr & 1023u;
    uint32_t g = 0;
    for (uint32_t b = tid; b < 2048; b += kTopThreads) g += (b > sel0 ? hist[b] : 0u) + (b > sel1 ? hist[2048 + b] : 0u);
    for (uint32_t b = tid; b < 1024; b += kTopThreads) g += b > sel2 ? hist[4096 + b] : 0u;
    g = __reduce_add_sync(0xffffffffu, g);
    if (lane == 0) s_warp[warp] = g;
    __syncthreads();
    if (warp == 0) {
      g = __reduce_add_sync(0xffffffffu, lane < kWarps ? s_warp[lane] : 0u);
      if (lane == 0) {
        s_counts[0] = g;
        s_counts[1] = hist[4096 + sel2];
      }
    }
  }
  cluster.sync();
  if (warp == 0) {
    uint32_t g = 0, e = 0;
    if (lane < rank) {
      const uint32_t* c = cluster.map_shared_rank(s_counts, lane);
      g = c[0];
      e = c[1];
    }
    g = __reduce_add_sync(0xffffffffu, g);
    e = __reduce_add_sync(0xffffffffu, e);
    if (lane == 0) {
      s_base[0] = g;
      s_base[1] = e;
    }
  }
  cluster.sync();
  uint32_t run_gt = s_base[0], run_eq = s_base[1];
  if (s_counts[0] == 0 && (s_counts[1] == 0 || run_eq >= need_eq)) return;
  const uint32_t lt = (1u << lane) - 1u;
  for (int t = 0; t < n_tiles; ++t) {
    if (n_tiles > 1) load_tile<GQA>(src + int64_t(t) * kTile, tile_len(t), warp, lane, keys, n_q, q_stride, s_lse);
    const int tl = tile_len(t);
    uint32_t w_gt = 0, w_eq = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const bool ok = warp * kWarpSpan + i * 32 + lane < tl;
      w_gt += __popc(__ballot_sync(0xffffffffu, ok && keys[i] > thr));
      w_eq += __popc(__ballot_sync(0xffffffffu, ok && keys[i] == thr));
    }
    if (lane == 0) s_warp[warp] = (w_gt << 16) | w_eq;
    __syncthreads();
    const uint32_t v = lane < kWarps ? s_warp[lane] : 0u;
    const uint32_t incl = warp_inclusive_sum(v, lane);
    const uint32_t before = __shfl_sync(0xffffffffu, incl - v, warp), total = __shfl_sync(0xffffffffu, incl, 31);
    uint32_t my_gt = run_gt + (before >> 16), my_eq = run_eq + (before & 0xffffu);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int off = warp * kWarpSpan + i * 32 + lane;
      const bool ok = off < tl, gt = ok && keys[i] > thr, eq = ok && keys[i] == thr;
      const uint32_t m_gt = __ballot_sync(0xffffffffu, gt), m_eq = __ballot_sync(0xffffffffu, eq);
      const uint32_t g = my_gt + __popc(m_gt & lt), e = my_eq + __popc(m_eq & lt);
      if (gt || (eq && e < need_eq)) osel[g + min(e, need_eq)] = int32_t(sr.c_lo + begin + int64_t(t) * kTile + off);
      my_gt += __popc(m_gt);
      my_eq += __popc(m_eq);
    }
    run_gt += total >> 16;
    run_eq += total & 0xffffu;
    __syncthreads();
  }
}

cudaStream_t st(const Exec& x) { return static_cast<cudaStream_t>(x.stream); }

// One cluster of kCluster blocks per row.
template <bool GQA>
void launch_topk(const Exec& x, int64_t n_rows, int n_kv_head, int kmax, const TopkSource& src,
                 const StepRanges* ranges, int32_t* out) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(n_rows * kCluster));
  cfg.blockDim = dim3(kTopThreads);
  cfg.stream = st(x);
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = kCluster;
  attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  KVT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, topk_rows_kernel<GQA>, n_kv_head, kmax, src, ranges, out));
  KVT_CUDA_LAUNCH_CHECK("topk_rows_kernel");
}

}  // namespace

void topk_rows(const Exec& x, int64_t n_rows, int n_kv_head, int64_t stride, int kmax, const float* scores,
               const StepRanges* ranges, int32_t* out) {
  KVT_CHECK(kmax > 0 && stride > 0 && stride < (int64_t(1) << 31), "topk_rows: kmax {} stride {}", kmax, stride);
  if (n_rows == 0) return;
  KVT_CHECK(n_rows < (int64_t(1) << 31) / kCluster, "topk_rows: {} rows exceed the grid", n_rows);
  TopkSource src;
  src.scores = scores;
  src.stride = stride;
  launch_topk<false>(x, n_rows, n_kv_head, kmax, src, ranges, out);
}

void gqa_topk_rows(const Exec& x, const GqaRowsParams& p, const float* raw, const StepRanges* ranges, int kmax,
                   int32_t* out) {
  const int64_t n_rows = int64_t(p.n_seq) * p.n_kv_head;
  KVT_CHECK(p.n_q >= 1 && p.n_q <= kMaxGqaQueries && n_rows * p.n_q < 65536, "gqa_topk_rows: {} rows of {} queries",
            n_rows, p.n_q);
  KVT_CHECK(kmax > 0 && p.in_stride > 0 && p.in_stride < (int64_t(1) << 31), "gqa_topk_rows: kmax {} stride {}",
            kmax, p.in_stride);
  if (n_rows == 0) return;
  KVT_CHECK(p.scratch && reinterpret_cast<uintptr_t>(p.scratch) % 8 == 0,
            "gqa_topk_rows: needs 8-byte aligned scratch");
  if (!p.partials_ready) score_detail::gqa_partials_rows(x, p, raw, ranges);
  TopkSource src;
  src.scores = raw;
  src.stride = p.in_stride;
  src.n_q = p.n_q;
  src.gp = score_detail::gqa_partials(p.scratch, n_rows * p.n_q);
  launch_topk<true>(x, n_rows, p.n_kv_head, kmax, src, ranges, out);
}

}  // namespace kvtier::cuda
