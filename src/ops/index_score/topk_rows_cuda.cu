// topk_rows on the GPU (index_rows.h; the CPU version in index_rows_cpu.cpp
// is the specification): each row's k best candidate chunks, a cluster of
// thread blocks per row reading the row's lengths from the StepRanges.
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>

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

// Cluster c does rows c, c + C, .. (C clusters in the grid); mode: null, or
// per row 2 where the sampled path (below) has already written the row's
// picks: the cluster then skips it, so that a grid of the clusters that fit
// at once passes over rows already done in one wave.
template <bool GQA>
__global__ void __launch_bounds__(kTopThreads)
    topk_rows_kernel(int64_t n_rows, int n_kv_head, int kmax, TopkSource source,
                     const StepRanges* __restrict__ ranges, const int32_t* __restrict__ mode,
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
  // One row (every block of the cluster takes the same branches; a row's
  // last remote reads precede its last cluster barrier, so the next row may
  // reuse the shared memory).
  auto one_row = [&](const int64_t row) {
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
    const bool one_tile = chunk <= kTile;  // every block's part fits a tile (the same for the whole cluster)
    if (one_tile) {
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
        if (!one_tile) load_tile<GQA>(src + int64_t(t) * kTile, tile_len(t), warp, lane, keys, n_q, q_stride, s_lse);
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
      for (uint32_t b = tid; b < 2048; b += kTopThreads)
        g += (b > sel0 ? hist[b] : 0u) + (b > sel1 ? hist[2048 + b] : 0u);
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
      if (!one_tile) load_tile<GQA>(src + int64_t(t) * kTile, tile_len(t), warp, lane, keys, n_q, q_stride, s_lse);
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
  };
  for (int64_t row = blockIdx.x / kCluster; row < n_rows; row += gridDim.x / kCluster)
    if (!mode || mode[row] != 2) one_row(row);
}

// ---- gqa top-k by a sampled threshold
// 1. topk_sample_kernel, a block per row: each query's log-sum-exp, then the
//    aggregates of 256 runs of 8 consecutive candidates spread over the row.
//    T is the sample's r-th largest key (to 16 bits, rounded down), r =
//    μ + 6σ + 8 for μ = 2048·k/n (σ the binomial's): about 1.2–2 k
//    candidates of the row reach T, and fewer than k only when the sample
//    is far off.
// 2. topk_filter_kernel, a block per 4,096 candidates: keeps the keys ≥ T
//    with their ids, in index order, in the block's own region (at most
//    kTopkFilterCap; more marks the region as overflowing).
// 3. topk_kept_kernel, a block per row: the exact top-k of the kept,
//    held in registers (warp w the 512 from 512 w on): a radix select over
//    (key − T), shifted past the bits all of them share, then the cluster
//    kernel's ordered compaction with one scan over the warps.
//    It gives up on a row (leaves its mode at 1) where a region overflowed
//    or fewer than k or more than kMaxKept were kept.
//    A row too short or too dense for the sample (rescore's candidates: k
//    a third of the row) but within kMaxKept (mode 3) skips the filter: the
//    kept kernel loads all of its candidates, in index order, with T = 0,
//    one block per row where the cluster kernel would take eight.
// 4. The cluster kernel does the rows not done (mode ≠ 2).
// The picks equal the cluster kernel's: a candidate not kept has a key
// < T, and with ≥ k kept the k-th largest key is ≥ T, so every candidate
// the top-k takes (ties at the k-th key included) was kept.
constexpr int kSampleThreads = 256, kRunLen = 8, kSamples = kSampleThreads * kRunLen;
constexpr int kFiltThreads = kTopkFilterTile / kPerLane;  // load_tile's layout: warp spans of 512
constexpr int kKeptThreads = 1024, kKeptPer = 16, kMaxKept = kKeptThreads * kKeptPer;
constexpr int64_t kMinSampledRow = 8192;
constexpr int kMaxRegions = kKeptThreads;  // a row of ≤ 4M candidates
static_assert(kFiltThreads % 32 == 0 && kFiltThreads <= kTopThreads, "filter block");
static_assert(kKeptPer == kPerLane && kKeptThreads / 32 * kWarpSpan == kMaxKept, "a kept warp spans 512");

struct SampledView {
  uint32_t* thr;     // [rows] T
  int32_t* mode;     // [rows] 0: the cluster kernel's row, 1: sampled, 2: done, 3: small (all kept)
  float* lse;        // [rows · n_q]
  uint32_t* counts;  // [rows · nb] kept per region
  uint2* kept;       // [rows · nb · kTopkFilterCap] (key, candidate index)
  int nb;            // regions per row: ⌈stride / kTopkFilterTile⌉
};

SampledView sampled_view(void* scratch, int64_t n_rows, int n_q, int64_t stride) {
  SampledView v;
  v.nb = int((stride + kTopkFilterTile - 1) / kTopkFilterTile);
  auto* w = static_cast<uint32_t*>(scratch);
  v.thr = w;
  v.mode = reinterpret_cast<int32_t*>(w + n_rows);
  v.lse = reinterpret_cast<float*>(w + 2 * n_rows);
  v.counts = w + n_rows * (2 + n_q);
  const int64_t head = n_rows * (2 + n_q) + n_rows * v.nb;
  v.kept = reinterpret_cast<uint2*>(static_cast<uint8_t*>(scratch) + ((head * 4 + 15) & ~int64_t(15)));
  return v;
}

__global__ void __launch_bounds__(kSampleThreads)
    topk_sample_kernel(int n_kv_head, int kmax, TopkSource source, const StepRanges* __restrict__ ranges,
                       SampledView v) {
  __shared__ float s_lse[kMaxGqaQueries];
  __shared__ uint32_t s_cnt[2][kSampleThreads / 32];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  constexpr int kW = kSampleThreads / 32;
  const int64_t row = blockIdx.x;
  const StepRanges sr = ranges[row / n_kv_head];
  const int64_t n = sr.c_hi - sr.c_lo;
  const int k = int(min(min(sr.k, int64_t(kmax)), n));
  const bool sampled = k > 0 && n >= kMinSampledRow && int64_t(k) * 8 <= n && k <= kMaxKept / 2 &&
                       n <= int64_t(kMaxRegions) * kTopkFilterTile;
  const bool small = !sampled && k > 0 && n <= kMaxKept;  // the kept kernel takes the whole row
  if (!sampled && !small) {
    if (tid == 0) v.mode[row] = 0;
    return;
  }
  const int n_q = source.n_q;
  for (int j = warp; j < n_q; j += kW) {
    const float l = score_detail::query_lse(source.gp, row * n_q + j, lane);
    if (lane == 0) {
      s_lse[j] = l;
      v.lse[row * n_q + j] = l;
    }
  }
  __syncthreads();
  if (small) {
    if (tid == 0) v.mode[row] = 3;
    return;
  }
  const float* src = source.scores + row * n_q * source.stride + sr.c_lo;
  const int64_t start = int64_t(tid) * (n - kRunLen) / (kSampleThreads - 1);
  uint32_t keys[kRunLen];
#pragma unroll
  for (int i = 0; i < kRunLen; ++i) {
    float best = -INFINITY;
    for (int j = 0; j < n_q; ++j) best = fmaxf(best, src[j * source.stride + start + i] - s_lse[j]);
    keys[i] = order_key(best);
  }
  const float p = float(k) / float(n), mu = kSamples * p;
  const uint32_t r = uint32_t(min(float(kSamples), ceilf(mu + 6.f * sqrtf(mu * (1.f - p))) + 8.f));
  // T: the largest key with ≥ r sampled keys at or above it, bit by bit,
  // its top 16 bits only (T may then sit a little lower: a few more kept).
  uint32_t t = 0;
  for (int bit = 31; bit >= 16; --bit) {
    const uint32_t cand = t | (1u << bit);
    uint32_t c = 0;
#pragma unroll
    for (int i = 0; i < kRunLen; ++i) c += keys[i] >= cand;
    c = __reduce_add_sync(0xffffffffu, c);
    uint32_t* cnt = s_cnt[bit & 1];  // alternating: the next write goes to the other half
    if (lane == 0) cnt[warp] = c;
    __syncthreads();
    uint32_t total = 0;
#pragma unroll
    for (int w = 0; w < kW; ++w) total += cnt[w];
    if (total >= r) t = cand;
  }
  if (tid == 0) {
    v.thr[row] = t;
    v.mode[row] = 1;
  }
}

__global__ void __launch_bounds__(kFiltThreads)
    topk_filter_kernel(int n_kv_head, TopkSource source, const StepRanges* __restrict__ ranges, SampledView v) {
  __shared__ float s_lse[kMaxGqaQueries];
  __shared__ uint32_t s_warp[kFiltThreads / 32];
  const int64_t row = blockIdx.y;
  if (v.mode[row] != 1) return;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const StepRanges sr = ranges[row / n_kv_head];
  const int64_t n = sr.c_hi - sr.c_lo, begin = int64_t(blockIdx.x) * kTopkFilterTile;
  if (begin >= n) return;
  const int len = int(min(int64_t(kTopkFilterTile), n - begin));
  const int n_q = source.n_q;
  if (tid < n_q) s_lse[tid] = v.lse[row * n_q + tid];
  __syncthreads();
  const uint32_t t = v.thr[row];
  uint32_t keys[kPerLane];
  load_tile<true>(source.scores + row * n_q * source.stride + sr.c_lo + begin, len, warp, lane, keys, n_q,
                  source.stride, s_lse);
  uint32_t masks[kPerLane], w_total = 0;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    masks[i] = __ballot_sync(0xffffffffu, warp * kWarpSpan + i * 32 + lane < len && keys[i] >= t);
    w_total += __popc(masks[i]);
  }
  if (lane == 0) s_warp[warp] = w_total;
  __syncthreads();
  uint32_t base = 0, total = 0;
#pragma unroll
  for (int w = 0; w < kFiltThreads / 32; ++w) {
    base += w < warp ? s_warp[w] : 0u;
    total += s_warp[w];
  }
  const int64_t region = row * v.nb + blockIdx.x;
  if (tid == 0) v.counts[region] = total;
  if (total > uint32_t(kTopkFilterCap)) return;
  uint2* out = v.kept + region * kTopkFilterCap;
  const uint32_t lt = (1u << lane) - 1u;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (masks[i] >> lane & 1u)
      out[base + __popc(masks[i] & lt)] = make_uint2(keys[i], uint32_t(begin + warp * kWarpSpan + i * 32 + lane));
    base += __popc(masks[i]);
  }
}

__global__ void __launch_bounds__(kKeptThreads)
    topk_kept_kernel(int n_kv_head, int kmax, TopkSource source, const StepRanges* __restrict__ ranges,
                     SampledView v, int32_t* __restrict__ out) {
  __shared__ uint32_t s_base[kMaxRegions];
  __shared__ uint32_t s_hist[256];
  __shared__ uint32_t s_warp[kKeptThreads / 32];
  __shared__ uint32_t s_prefix, s_remaining;
  __shared__ float s_lse[kMaxGqaQueries];
  const int64_t row = blockIdx.x;
  const int mode = v.mode[row];
  if (mode != 1 && mode != 3) return;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const StepRanges sr = ranges[row / n_kv_head];
  const int64_t n = sr.c_hi - sr.c_lo;
  const int k = int(min(min(sr.k, int64_t(kmax)), n));
  uint32_t keys[kKeptPer], ids[kKeptPer], hi = 0, m = 0, t = 0;
  if (mode == 3) {  // a small row: all its candidates, in index order
    const int n_q = source.n_q;
    if (tid < n_q) s_lse[tid] = v.lse[row * n_q + tid];
    __syncthreads();
    m = uint32_t(n);
    load_tile<true>(source.scores + row * n_q * source.stride + sr.c_lo, int(n), warp, lane, keys, n_q,
                    source.stride, s_lse);
    // Less the row's smallest key: the aggregates (log-probabilities) share
    // their top bits, which would put every key in a few bins of the first
    // pass and serialize its shared atomics; the order and ties are kept.
    uint32_t lo = 0xffffffffu;
#pragma unroll
    for (int i = 0; i < kKeptPer; ++i) {
      ids[i] = uint32_t(warp * kWarpSpan + i * 32 + lane);
      if (ids[i] < m) lo = min(lo, keys[i]);
    }
    lo = __reduce_min_sync(0xffffffffu, lo);
    if (lane == 0) s_warp[warp] = lo;
    __syncthreads();
    lo = __reduce_min_sync(0xffffffffu, s_warp[lane]);
#pragma unroll
    for (int i = 0; i < kKeptPer; ++i) {
      keys[i] = ids[i] < m ? keys[i] - lo : 0u;
      hi = max(hi, keys[i]);  // 0 past the row's end
    }
  } else {
  const int nbr = int((n + kTopkFilterTile - 1) / kTopkFilterTile);
  // Where each region's kept candidates start in the row's list.
  const uint32_t c = tid < nbr ? v.counts[row * v.nb + tid] : 0u;
  const bool overflow = __syncthreads_or(c > uint32_t(kTopkFilterCap));
  const uint32_t incl = warp_inclusive_sum(c, lane);
  if (lane == 31) s_warp[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const uint32_t w = s_warp[lane];
    const uint32_t wi = warp_inclusive_sum(w, lane);
    s_warp[lane] = wi - w;
    if (lane == 31) s_remaining = wi;  // the row's kept count, for a moment
  }
  __syncthreads();
  m = s_remaining;
  if (tid < nbr) s_base[tid] = s_warp[warp] + incl - c;
  if (overflow || m < uint32_t(k) || m > uint32_t(kMaxKept)) return;  // the cluster kernel does this row
  __syncthreads();
  t = v.thr[row];
#pragma unroll
  for (int i = 0; i < kKeptPer; ++i) {
    const uint32_t e = uint32_t(warp * kWarpSpan + i * 32 + lane);
    keys[i] = 0;
    ids[i] = 0;
    if (e < m) {
      int lo = 0, up = nbr - 1;  // the last region whose list starts at or before e
      while (lo < up) {
        const int mid = (lo + up + 1) / 2;
        if (s_base[mid] <= e) lo = mid;
        else up = mid - 1;
      }
      const uint2 kv = v.kept[(row * v.nb + lo) * kTopkFilterCap + (e - s_base[lo])];
      keys[i] = kv.x - t;  // ≥ 0: kept keys are ≥ T
      ids[i] = kv.y;
      hi = max(hi, keys[i]);
    }
  }
  }
  hi = __reduce_max_sync(0xffffffffu, hi);
  __syncthreads();
  if (lane == 0) s_warp[warp] = hi;
  __syncthreads();
  hi = __reduce_max_sync(0xffffffffu, s_warp[lane]);
  const int up = hi ? __clz(hi) : 0;
#pragma unroll
  for (int i = 0; i < kKeptPer; ++i) keys[i] <<= up;
  // Radix select, 8 bits a pass from the top: the k-th largest key and how
  // many of its equals to take.
  uint32_t prefix = 0, prefix_mask = 0, remaining = uint32_t(k);
#pragma unroll
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    if (tid < 256) s_hist[tid] = 0;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kKeptPer; ++i)
      if (uint32_t(warp * kWarpSpan + i * 32 + lane) < m && (keys[i] & prefix_mask) == prefix)
        atomicAdd(&s_hist[(keys[i] >> shift) & 255u], 1u);
    __syncthreads();
    if (warp == 0) {  // lane l holds bins 255 − 8l … 248 − 8l, the largest first
      uint32_t h[8], sum = 0;
#pragma unroll
      for (int b = 0; b < 8; ++b) {
        h[b] = s_hist[255 - 8 * lane - b];
        sum += h[b];
      }
      const uint32_t in = warp_inclusive_sum(sum, lane), ex = in - sum;
      if (ex < remaining && in >= remaining) {
        uint32_t acc = ex;
#pragma unroll
        for (int b = 0; b < 8; ++b) {
          if (acc + h[b] >= remaining) {
            s_prefix = prefix | (uint32_t(255 - 8 * lane - b) << shift);
            s_remaining = remaining - acc;
            break;
          }
          acc += h[b];
        }
      }
    }
    __syncthreads();
    prefix = s_prefix;
    remaining = s_remaining;
    prefix_mask |= 255u << shift;
  }
  const uint32_t thr = prefix, need_eq = remaining;
  int32_t* orow = out + row * kmax;
  for (int i = tid; i < kmax - k; i += kKeptThreads) orow[i] = -1;
  int32_t* osel = orow + (kmax - k);
  // Warp w holds kept [512 w, 512 w + 512) in order: one scan of the warps'
  // counts places every warp's picks.
  const uint32_t lt = (1u << lane) - 1u;
  uint32_t w_gt = 0, w_eq = 0;
#pragma unroll
  for (int i = 0; i < kKeptPer; ++i) {
    const bool ok = uint32_t(warp * kWarpSpan + i * 32 + lane) < m;
    w_gt += __popc(__ballot_sync(0xffffffffu, ok && keys[i] > thr));
    w_eq += __popc(__ballot_sync(0xffffffffu, ok && keys[i] == thr));
  }
  if (lane == 0) s_warp[warp] = (w_gt << 16) | w_eq;
  __syncthreads();
  const uint32_t wv = s_warp[lane];
  const uint32_t before = __shfl_sync(0xffffffffu, warp_inclusive_sum(wv, lane) - wv, warp);
  uint32_t my_gt = before >> 16, my_eq = before & 0xffffu;
#pragma unroll
  for (int i = 0; i < kKeptPer; ++i) {
    const bool ok = uint32_t(warp * kWarpSpan + i * 32 + lane) < m;
    const bool gt = ok && keys[i] > thr, eq = ok && keys[i] == thr;
    const uint32_t m_gt = __ballot_sync(0xffffffffu, gt), m_eq = __ballot_sync(0xffffffffu, eq);
    const uint32_t g = my_gt + __popc(m_gt & lt), e = my_eq + __popc(m_eq & lt);
    if (gt || (eq && e < need_eq)) osel[g + min(e, need_eq)] = int32_t(sr.c_lo + ids[i]);
    my_gt += __popc(m_gt);
    my_eq += __popc(m_eq);
  }
  if (tid == 0) v.mode[row] = 2;
}

cudaStream_t st(const Exec& x) { return static_cast<cudaStream_t>(x.stream); }

bool sampled_topk_off() {
  static const bool off = [] {
    const char* e = std::getenv("KVT_GQA_TOPK");
    return e && std::string_view(e) == "cluster";
  }();
  return off;
}

// A cluster of kCluster blocks per row; after the sampled path (mode),
// only as many clusters as the GPU holds at once, each passing over rows.
template <bool GQA>
void launch_topk(const Exec& x, int64_t n_rows, int n_kv_head, int kmax, const TopkSource& src,
                 const StepRanges* ranges, const int32_t* mode, int32_t* out) {
  cudaLaunchConfig_t cfg{};
  cfg.blockDim = dim3(kTopThreads);
  cfg.stream = st(x);
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = kCluster;
  attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  static const int64_t resident = [&] {
    cudaLaunchConfig_t c = cfg;
    c.gridDim = dim3(unsigned(kCluster));
    int n = 0;
    KVT_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, topk_rows_kernel<GQA>, &c));
    return std::max<int64_t>(1, n);
  }();
  const int64_t clusters = mode ? std::min(n_rows, resident) : n_rows;
  cfg.gridDim = dim3(unsigned(clusters * kCluster));
  KVT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, topk_rows_kernel<GQA>, n_rows, n_kv_head, kmax, src, ranges, mode, out));
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
  launch_topk<false>(x, n_rows, n_kv_head, kmax, src, ranges, nullptr, out);
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
  const int32_t* mode = nullptr;
  if (p.topk_scratch && !sampled_topk_off()) {
    const SampledView v = sampled_view(p.topk_scratch, n_rows, p.n_q, p.in_stride);
    topk_sample_kernel<<<unsigned(n_rows), kSampleThreads, 0, st(x)>>>(p.n_kv_head, kmax, src, ranges, v);
    KVT_CUDA_LAUNCH_CHECK("topk_sample_kernel");
    topk_filter_kernel<<<dim3(unsigned(v.nb), unsigned(n_rows)), kFiltThreads, 0, st(x)>>>(p.n_kv_head, src, ranges,
                                                                                          v);
    KVT_CUDA_LAUNCH_CHECK("topk_filter_kernel");
    topk_kept_kernel<<<unsigned(n_rows), kKeptThreads, 0, st(x)>>>(p.n_kv_head, kmax, src, ranges, v, out);
    KVT_CUDA_LAUNCH_CHECK("topk_kept_kernel");
    mode = v.mode;
  }
  launch_topk<true>(x, n_rows, p.n_kv_head, kmax, src, ranges, mode, out);
}

std::vector<int32_t> gqa_topk_row_paths(const Exec& x, const void* topk_scratch, int64_t n_rows) {
  std::vector<int32_t> paths(static_cast<size_t>(n_rows));
  const SampledView v = sampled_view(const_cast<void*>(topk_scratch), n_rows, 0, 0);
  KVT_CUDA_CHECK(cudaStreamSynchronize(st(x)));
  KVT_CUDA_CHECK(cudaMemcpy(paths.data(), v.mode, size_t(n_rows) * 4, cudaMemcpyDeviceToHost));
  return paths;
}

}  // namespace kvtier::cuda
