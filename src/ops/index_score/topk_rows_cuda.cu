// topk_rows on the GPU (index_rows.h; the CPU version in index_rows_cpu.cpp
// is the specification): each row's k best candidate chunks, a cluster of
// thread blocks per row reading the row's lengths from the StepRanges.
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <string_view>

#include "backend/cuda_backend.h"
#include "ops/index_score/index_rows_cuda.h"
#include "ops/index_score/score_rows_cuda.cuh"
#include "ops/quant/quant_dev.cuh"

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

// Bit i: element warp · 512 + 32i + lane of a kept block is below m.
__device__ __forceinline__ uint32_t valid_below(uint32_t m) {
  const uint32_t first = uint32_t((threadIdx.x / 32) * kWarpSpan + threadIdx.x % 32);
  uint32_t bits = 0;
#pragma unroll
  for (int i = 0; i < kKeptPer; ++i) bits |= (first + 32u * i < m ? 1u : 0u) << i;
  return bits;
}

// The k-th largest of a block's keys (keys[i] taking part where bit i of
// valid is set; k ≤ their count) and how many of its equals to take: a
// radix select, 8 bits a pass from the top. Every thread of the block
// calls it and gets both; s_hist holds 256 words, s_sel 2.
__device__ void block_radix_select(const uint32_t (&keys)[kKeptPer], uint32_t valid, uint32_t k, uint32_t* s_hist,
                                   uint32_t* s_sel, uint32_t& thr, uint32_t& need_eq) {
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  uint32_t prefix = 0, prefix_mask = 0, remaining = k;
#pragma unroll
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    if (tid < 256) s_hist[tid] = 0;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kKeptPer; ++i)
      if ((valid >> i & 1u) && (keys[i] & prefix_mask) == prefix) atomicAdd(&s_hist[(keys[i] >> shift) & 255u], 1u);
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
            s_sel[0] = prefix | (uint32_t(255 - 8 * lane - b) << shift);
            s_sel[1] = remaining - acc;
            break;
          }
          acc += h[b];
        }
      }
    }
    __syncthreads();
    prefix = s_sel[0];
    remaining = s_sel[1];
    prefix_mask |= 255u << shift;
  }
  thr = prefix;
  need_eq = remaining;
}

// A kept block's regions (thread b < nbr holding region b's count c):
// where each starts in the row's list (s_base) and their total, on every
// thread. s_warp holds 32 words, s_total 1.
__device__ uint32_t region_starts(uint32_t c, int nbr, uint32_t* s_warp, uint32_t* s_base, uint32_t* s_total) {
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const uint32_t incl = warp_inclusive_sum(c, lane);
  if (lane == 31) s_warp[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const uint32_t w = s_warp[lane];
    const uint32_t wi = warp_inclusive_sum(w, lane);
    s_warp[lane] = wi - w;
    if (lane == 31) *s_total = wi;
  }
  __syncthreads();
  if (tid < nbr) s_base[tid] = s_warp[warp] + incl - c;
  const uint32_t total = *s_total;
  __syncthreads();  // s_base complete; s_warp free again
  return total;
}

// Element e of the list: its region (the last whose list starts at or before e).
__device__ __forceinline__ int region_of(const uint32_t* s_base, int nbr, uint32_t e) {
  int lo = 0, up = nbr - 1;
  while (lo < up) {
    const int mid = (lo + up + 1) / 2;
    if (s_base[mid] <= e) lo = mid;
    else up = mid - 1;
  }
  return lo;
}

// The block's keys shifted left past the bits all of them share above
// their largest's top bit (thread maxima hi): the same order and ties, but
// the radix select's first pass then splits them. Returns the shift.
__device__ int shift_keys_up(uint32_t (&keys)[kKeptPer], uint32_t hi, uint32_t* s_warp) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  hi = __reduce_max_sync(0xffffffffu, hi);
  __syncthreads();
  if (lane == 0) s_warp[warp] = hi;
  __syncthreads();
  hi = __reduce_max_sync(0xffffffffu, s_warp[lane]);
  const int up = hi ? __clz(hi) : 0;
#pragma unroll
  for (int i = 0; i < kKeptPer; ++i) keys[i] <<= up;
  return up;
}

__global__ void __launch_bounds__(kKeptThreads)
    topk_kept_kernel(int n_kv_head, int kmax, TopkSource source, const StepRanges* __restrict__ ranges,
                     SampledView v, int32_t* __restrict__ out) {
  __shared__ uint32_t s_base[kMaxRegions];
  __shared__ uint32_t s_hist[256];
  __shared__ uint32_t s_warp[kKeptThreads / 32];
  __shared__ uint32_t s_sel[2];
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
    if (lane == 31) s_sel[0] = wi;  // the row's kept count, for a moment
  }
  __syncthreads();
  m = s_sel[0];
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
  uint32_t thr, need_eq;
  block_radix_select(keys, valid_below(m), uint32_t(k), s_hist, s_sel, thr, need_eq);
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

// ---- scoring and top-k fused (gqa_score_topk_rows)
// 1. keep_threshold_kernel, a block per row: scores a sample of the row
//    itself: every non-candidate chunk up to 256 (the sinks and the window,
//    often the heaviest) and 2,048 candidates evenly spaced, each weighted
//    by the chunks it stands for, give ℓ̂_j; the sampled candidates'
//    aggregates max_j (s_j − ℓ̂_j) give T̂ as topk_sample_kernel gives T;
//    θ_j = T̂ + ℓ̂_j. (U4's sample scores are the scorer's floats, higgs2's
//    f32 sums in another order: an estimate either way.) Mode 1, or 0 for
//    a row the sample does not serve (short, dense, or a θ not finite).
// 2. score_rows, pass 1 (TopkKeep): each block of a mode-1 row appends its
//    kept candidates to its own region of the row's list.
// 3. fused_kept_kernel, a block per mode-1 row: the aggregates of the kept
//    (the same floats the cluster kernel computes), their exact top-k by
//    radix select; the check A_k > θ_j − ℓ_j for every query; ties at A_k
//    to the lower chunk by a second select over the tied chunks' ids; the
//    picks set bits of a bitmap of the row's candidates, which a block scan
//    turns into ascending ids. Mode 2, or 4 where a region overflowed, the
//    row kept fewer than k or more than kMaxKept, or the check failed.
// 4. score_rows, pass 2: the mode-4 rows in full; 5. the cluster kernel
//    does the rows of modes 0 and 4.
constexpr int kThrThreads = 1024, kThrSamples = 2048, kThrEdge = 256, kThrPer = kThrSamples / kThrThreads;
constexpr int kFusedMaxQ = 4;  // the table holds 4 queries (int4 / float4 entries)
constexpr size_t kThrSmem = size_t(32) * 256 * 16;
constexpr int64_t kFusedMaxRow = int64_t(1) << 20;  // the bitmap's 128 KB of shared memory
static_assert(kThrEdge <= kThrThreads, "an edge sample per thread");

struct FusedView {
  uint32_t* count;  // [rows, kTopkKeepMaxBlocks]: kept per scorer block
  int32_t* mode;    // [rows], where SampledView keeps it (gqa_topk_row_paths reads either)
  int32_t* nblk;    // [rows]: the scorer's blocks per row
  float* theta;     // [rows · n_q]
  int32_t* ids;     // [rows · kTopkKeepSlots]
  float* kept;      // [rows · n_q · kTopkKeepSlots]
};

FusedView fused_view(void* scratch, int64_t n_rows, int n_q) {
  FusedView v;
  auto* w = static_cast<uint32_t*>(scratch);
  v.mode = reinterpret_cast<int32_t*>(w + n_rows);
  v.nblk = reinterpret_cast<int32_t*>(w + 2 * n_rows);
  v.theta = reinterpret_cast<float*>(w + 3 * n_rows);
  v.count = w + n_rows * (3 + n_q);
  const int64_t head = n_rows * (3 + n_q + kTopkKeepMaxBlocks);
  v.ids = reinterpret_cast<int32_t*>(static_cast<uint8_t*>(scratch) + ((head * 4 + 15) & ~int64_t(15)));
  v.kept = reinterpret_cast<float*>(v.ids + n_rows * kTopkKeepSlots);
  return v;
}

__device__ __forceinline__ float from_order_key(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__global__ void __launch_bounds__(kThrThreads)
    keep_threshold_kernel(ScoreRowsParams p, int kmax, bool u4, const float* __restrict__ q,
                          const uint8_t* const* __restrict__ codes_rows, const uint8_t* const* __restrict__ scale_rows,
                          const StepRanges* __restrict__ ranges, FusedView v, float bias) {
  // The row's table: entry (code byte g, value b) holds the n_q queries'
  // products with the dims byte g codes (U4: Σ q8·c in integers, exact).
  extern __shared__ __align__(16) uint8_t thr_smem[];
  auto* lut_f = reinterpret_cast<float4*>(thr_smem);  // [32][256]
  auto* lut_i = reinterpret_cast<int4*>(thr_smem);
  __shared__ __align__(16) float s_q[kFusedMaxQ][128];
  __shared__ int8_t s_q8[kFusedMaxQ][128];  // U4: the queries' int8 values, their factor and sum
  __shared__ float s_fac[kFusedMaxQ];
  __shared__ int32_t s_qsum[kFusedMaxQ];
  __shared__ float2 s_red[kThrThreads / 32][kFusedMaxQ];
  __shared__ float s_lhat[kFusedMaxQ];
  __shared__ uint32_t s_keys[kThrSamples];
  constexpr int kW = kThrThreads / 32;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t row = blockIdx.x;
  const StepRanges sr = ranges[row / p.n_kv_head];
  const int64_t nc = sr.c_hi - sr.c_lo;
  const int k = int(min(min(sr.k, int64_t(kmax)), nc));
  const bool ok = k > 0 && nc >= kMinSampledRow && int64_t(k) * 8 <= nc && k <= kMaxKept / 2 &&
                  sr.n_chunk <= kFusedMaxRow;
  if (!ok) {
    if (tid == 0) v.mode[row] = 0;
    return;
  }
  const int n_q = p.n_q;
  for (int e = tid; e < kFusedMaxQ * 128; e += kThrThreads)
    s_q[e / 128][e % 128] = e / 128 < n_q ? q[row * n_q * 128 + e] : 0.f;
  __syncthreads();
  if (u4) {  // the queries in integers, as u4_imma_kernel makes them (quant_format.h)
    for (int j = warp; j < kFusedMaxQ; j += kW) {
      float amax = 0.f;
      for (int d = lane; d < 128; d += 32) amax = fmaxf(amax, fabsf(s_q[j][d]));
      amax = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(amax)));  // ≥ 0: ordered as bits
      const qdev::UniformQuery u = qdev::uniform_query(amax, __ldg(p.fmt.grid + 2));
      int32_t sum = 0;
      for (int d = lane; d < 128; d += 32) {
        const int32_t v8 = qdev::uniform_q8(s_q[j][d], u);
        s_q8[j][d] = int8_t(v8);
        sum += v8;
      }
      sum = __reduce_add_sync(0xffffffffu, sum);
      if (lane == 0) s_fac[j] = u.factor, s_qsum[j] = sum;
    }
    __syncthreads();
    for (int e = tid; e < 32 * 256; e += kThrThreads) {
      const int g = e / 256, b = e % 256;
      int32_t d[kFusedMaxQ];
#pragma unroll
      for (int j = 0; j < kFusedMaxQ; ++j) {
        const char4 q8 = *reinterpret_cast<const char4*>(&s_q8[j][4 * g]);
        d[j] = int32_t(q8.x) * (b & 3) + int32_t(q8.y) * ((b >> 2) & 3) + int32_t(q8.z) * ((b >> 4) & 3) +
               int32_t(q8.w) * (b >> 6);
      }
      lut_i[e] = make_int4(d[0], d[1], d[2], d[3]);
    }
  } else {
    for (int e = tid; e < 32 * 256; e += kThrThreads) {
      const int g = e / 256, b = e % 256;
      const float4 x = __ldg(reinterpret_cast<const float4*>(p.fmt.grid) + b);
      float d[kFusedMaxQ];
#pragma unroll
      for (int j = 0; j < kFusedMaxQ; ++j) {
        const float4 qv = *reinterpret_cast<const float4*>(&s_q[j][4 * g]);
        d[j] = qv.x * x.x + qv.y * x.y + qv.z * x.z + qv.w * x.w;
      }
      lut_f[e] = make_float4(d[0], d[1], d[2], d[3]);
    }
  }
  __syncthreads();
  const uint8_t* codes = codes_rows[row];
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(scale_rows[row]);
  // Chunk c's scores of every query (scale and p.scale folded in; −inf past n_q).
  auto score = [&](int64_t c, float (&sc)[kFusedMaxQ]) {
    const uint4* cw = reinterpret_cast<const uint4*>(codes + c * 32);
    const uint4 a = __ldg(cw), b = __ldg(cw + 1);
    const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    const float sigma = __bfloat162float(__ushort_as_bfloat16(__ldg(scales + c)));
    if (u4) {
      int4 acc = make_int4(0, 0, 0, 0);
#pragma unroll
      for (int g = 0; g < 32; ++g) {
        const int4 t = lut_i[g * 256 + ((w[g / 4] >> (8 * (g % 4))) & 0xffu)];
        acc.x += t.x, acc.y += t.y, acc.z += t.z, acc.w += t.w;
      }
      const int32_t dot[4] = {acc.x, acc.y, acc.z, acc.w};
#pragma unroll
      for (int j = 0; j < kFusedMaxQ; ++j)
        sc[j] = j < n_q ? __fmul_rn(qdev::uniform_group_score(sigma, qdev::UniformQuery{0.f, s_fac[j]}, dot[j],
                                                              s_qsum[j], 4),
                                    p.scale)
                        : -INFINITY;
      return;
    }
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int g = 0; g < 32; ++g) {
      const float4 t = lut_f[g * 256 + ((w[g / 4] >> (8 * (g % 4))) & 0xffu)];
      acc.x += t.x, acc.y += t.y, acc.z += t.z, acc.w += t.w;
    }
    const float f = sigma * p.scale, d[4] = {acc.x, acc.y, acc.z, acc.w};
#pragma unroll
    for (int j = 0; j < kFusedMaxQ; ++j) sc[j] = j < n_q ? d[j] * f : -INFINITY;
  };
  // This thread's samples: non-candidate tid (of up to kThrEdge, evenly
  // spaced) and candidates tid + i·kThrThreads (of kThrSamples), each
  // standing for the chunks between it and the next.
  const int64_t n_edge = sr.c_lo + (sr.n_chunk - sr.c_hi);
  const int m_edge = int(min(n_edge, int64_t(kThrEdge)));
  float lm[kFusedMaxQ], ls[kFusedMaxQ];
#pragma unroll
  for (int j = 0; j < kFusedMaxQ; ++j) lm[j] = -INFINITY, ls[j] = 0.f;
  if (tid < m_edge) {
    const int64_t a = int64_t(tid) * n_edge / m_edge;
    float sc[kFusedMaxQ];
    score(a < sr.c_lo ? a : sr.c_hi + (a - sr.c_lo), sc);
    const float lw = __logf(float(n_edge) / float(m_edge));
#pragma unroll
    for (int j = 0; j < kFusedMaxQ; ++j) score_detail::lse_combine(lm[j], ls[j], sc[j] + lw, 1.f);
  }
  float cs[kThrPer][kFusedMaxQ];
  const float lw = __logf(float(nc) / float(kThrSamples));
#pragma unroll
  for (int i = 0; i < kThrPer; ++i) {
    score(sr.c_lo + int64_t(tid + i * kThrThreads) * nc / kThrSamples, cs[i]);
#pragma unroll
    for (int j = 0; j < kFusedMaxQ; ++j) score_detail::lse_combine(lm[j], ls[j], cs[i][j] + lw, 1.f);
  }
#pragma unroll
  for (int j = 0; j < kFusedMaxQ; ++j) {
    score_detail::warp_lse(lm[j], ls[j]);
    if (lane == 0) s_red[warp][j] = make_float2(lm[j], ls[j]);
  }
  __syncthreads();
  if (tid < n_q) {
    float m = -INFINITY, sum = 0.f;
    for (int w = 0; w < kW; ++w) score_detail::lse_combine(m, sum, s_red[w][tid].x, s_red[w][tid].y);
    s_lhat[tid] = m + __logf(sum);
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kThrPer; ++i) {
    float best = -INFINITY;
    for (int j = 0; j < n_q; ++j) best = fmaxf(best, cs[i][j] - s_lhat[j]);
    s_keys[tid + i * kThrThreads] = order_key(best);
  }
  __syncthreads();
  if (warp != 0) return;
  // One warp, as topk_sample_kernel: the largest 16-bit level r sampled keys reach.
  const float pk = float(k) / float(nc), mu = kThrSamples * pk;
  const uint32_t r = uint32_t(min(float(kThrSamples), ceilf(mu + 6.f * sqrtf(mu * (1.f - pk))) + 8.f));
  uint32_t t = 0;
  for (int bit = 31; bit >= 16; --bit) {
    const uint32_t cand = t | (1u << bit);
    uint32_t c = 0;
    for (int i = lane; i < kThrSamples; i += 32) c += s_keys[i] >= cand;
    if (__reduce_add_sync(0xffffffffu, c) >= r) t = cand;
  }
  if (tid == 0) {
    const float tt = from_order_key(t);
    bool finite = true;
    for (int j = 0; j < n_q; ++j) {
      const float th = tt + s_lhat[j] + (j == 0 ? bias : 0.f);
      finite &= isfinite(th);
      v.theta[row * n_q + j] = th;
    }
    v.mode[row] = finite ? 1 : 0;
  }
}

__global__ void __launch_bounds__(kKeptThreads)
    fused_kept_kernel(int n_kv_head, int kmax, int n_q, score_detail::GqaPartials gp,
                      const StepRanges* __restrict__ ranges, FusedView v, int32_t* __restrict__ out) {
  extern __shared__ uint32_t s_bits[];  // [⌈candidates / 32⌉]: the picks
  __shared__ uint32_t s_base[kTopkKeepMaxBlocks];
  __shared__ uint32_t s_hist[256];
  __shared__ uint32_t s_warp[kKeptThreads / 32];
  __shared__ uint32_t s_sel[2];
  __shared__ float s_lse[kMaxGqaQueries];
  const int64_t row = blockIdx.x;
  if (v.mode[row] != 1) return;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const StepRanges sr = ranges[row / n_kv_head];
  const int64_t n = sr.c_hi - sr.c_lo;
  const int k = int(min(min(sr.k, int64_t(kmax)), n));
  // Where each scorer block's region starts in the row's list (as topk_kept_kernel's regions).
  const int nbr = v.nblk[row];
  const uint32_t region_cap = uint32_t(kTopkKeepSlots / nbr);
  const uint32_t c = tid < nbr ? v.count[row * kTopkKeepMaxBlocks + tid] : 0u;
  const bool overflow = __syncthreads_or(c > region_cap);
  const uint32_t m = region_starts(c, nbr, s_warp, s_base, s_sel);
  if (overflow || m < uint32_t(k) || m > uint32_t(kMaxKept)) {
    if (tid == 0) v.mode[row] = 4;
    return;
  }
  for (int j = warp; j < n_q; j += kKeptThreads / 32) {
    const float l = score_detail::query_lse(gp, row * n_q + j, lane);
    if (lane == 0) s_lse[j] = l;
  }
  __syncthreads();
  const uint32_t valid = valid_below(m);
  const uint32_t first = uint32_t(warp * kWarpSpan + lane);
  const float* kept = v.kept + row * n_q * kTopkKeepSlots;
  const int32_t* ids = v.ids + row * kTopkKeepSlots;
  auto slot_of = [&](uint32_t e) {  // element e of the list → its slot
    const int b = region_of(s_base, nbr, e);
    return uint32_t(b) * region_cap + (e - s_base[b]);
  };
  uint32_t keys[kKeptPer], lo = 0xffffffffu, hi = 0;
#pragma unroll
  for (int i = 0; i < kKeptPer; ++i) {
    keys[i] = 0;
    if (valid >> i & 1u) {
      const uint32_t sl = slot_of(first + 32u * i);
      float best = -INFINITY;  // as load_tile: the cluster kernel's floats
      for (int j = 0; j < n_q; ++j) best = fmaxf(best, kept[int64_t(j) * kTopkKeepSlots + sl] - s_lse[j]);
      keys[i] = order_key(best);
      lo = min(lo, keys[i]);
    }
  }
  // Less the smallest and shifted past the bits all share (as topk_kept_kernel's small rows).
  lo = __reduce_min_sync(0xffffffffu, lo);
  if (lane == 0) s_warp[warp] = lo;
  __syncthreads();
  lo = __reduce_min_sync(0xffffffffu, s_warp[lane]);
#pragma unroll
  for (int i = 0; i < kKeptPer; ++i) {
    keys[i] = (valid >> i & 1u) ? keys[i] - lo : 0u;
    hi = max(hi, keys[i]);
  }
  const int up = shift_keys_up(keys, hi, s_warp);
  uint32_t thr, need_eq;
  block_radix_select(keys, valid, uint32_t(k), s_hist, s_sel, thr, need_eq);
  // Exact only if every candidate left out lies below A_k.
  const uint32_t a_k = (thr >> up) + lo;
  const bool fail = tid < n_q && order_key(v.theta[row * n_q + tid] - s_lse[tid]) >= a_k;
  if (__syncthreads_or(fail)) {
    if (tid == 0) v.mode[row] = 4;
    return;
  }
  // Ties at A_k: the need_eq lowest chunk ids among them (their ~id the largest).
  uint32_t eq = 0;
#pragma unroll
  for (int i = 0; i < kKeptPer; ++i)
    if ((valid >> i & 1u) && keys[i] == thr) eq |= 1u << i;
  const uint32_t w_eq = __reduce_add_sync(0xffffffffu, uint32_t(__popc(eq)));
  if (lane == 0) s_warp[warp] = w_eq;
  __syncthreads();
  const uint32_t n_eq = __reduce_add_sync(0xffffffffu, s_warp[lane]);
  uint32_t id_thr = 0;
  if (n_eq > need_eq) {
    uint32_t idk[kKeptPer];
#pragma unroll
    for (int i = 0; i < kKeptPer; ++i) idk[i] = (eq >> i & 1u) ? ~uint32_t(ids[slot_of(first + 32u * i)]) : 0u;
    uint32_t ne2;
    block_radix_select(idk, eq, need_eq, s_hist, s_sel, id_thr, ne2);
  }
  const uint32_t n_words = uint32_t((n + 31) / 32);
  for (uint32_t w = tid; w < n_words; w += kKeptThreads) s_bits[w] = 0;
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kKeptPer; ++i) {
    if (!(valid >> i & 1u)) continue;
    if (keys[i] < thr || (keys[i] == thr && !(eq >> i & 1u))) continue;
    const int32_t id = ids[slot_of(first + 32u * i)];
    if (keys[i] > thr || n_eq == need_eq || ~uint32_t(id) >= id_thr) {
      const uint32_t cc = uint32_t(int64_t(id) - sr.c_lo);
      atomicOr(&s_bits[cc / 32], 1u << (cc % 32));
    }
  }
  __syncthreads();
  // The bitmap → ascending ids: thread t scans words [t·per, t·per + per).
  const uint32_t per = (n_words + kKeptThreads - 1) / kKeptThreads;
  const uint32_t w0 = uint32_t(tid) * per, w1 = min(n_words, w0 + per);
  uint32_t cnt = 0;
  for (uint32_t w = w0; w < w1; ++w) cnt += __popc(s_bits[w]);
  const uint32_t in2 = warp_inclusive_sum(cnt, lane);
  if (lane == 31) s_warp[warp] = in2;
  __syncthreads();
  uint32_t before = in2 - cnt, total = 0;
  for (int w = 0; w < kKeptThreads / 32; ++w) {
    before += w < warp ? s_warp[w] : 0u;
    total += s_warp[w];
  }
  if (total != uint32_t(k)) {  // cannot happen: a guard, not a path
    if (tid == 0) v.mode[row] = 4;
    return;
  }
  int32_t* orow = out + row * kmax;
  for (int i = tid; i < kmax - k; i += kKeptThreads) orow[i] = -1;
  int32_t* osel = orow + (kmax - k);
  for (uint32_t w = w0; w < w1; ++w)
    for (uint32_t bits = s_bits[w]; bits; bits &= bits - 1)
      osel[before++] = int32_t(sr.c_lo + int64_t(w) * 32 + __ffs(bits) - 1);
  if (tid == 0) v.mode[row] = 2;
}

cudaStream_t st(const Exec& x) { return static_cast<cudaStream_t>(x.stream); }

// $KVT_GQA_TOPK: "cluster" turns the sampled and fused paths off,
// "unfused" the fused one (gqa_score_topk_rows then scores, then selects),
// "fused" turns it on.
std::string_view gqa_topk_env() {
  static const std::string e = [] {
    const char* v = std::getenv("KVT_GQA_TOPK");
    return std::string(v ? v : "");
  }();
  return e;
}
bool sampled_topk_off() { return gqa_topk_env() == "cluster"; }
constexpr bool kFuseByDefault = false;  // not yet faster (bench/results/gpu/batch/README.md, run19)
bool fused_topk_on(int fuse) {
  if (fuse >= 0) return fuse == 1;
  if (gqa_topk_env() == "cluster" || gqa_topk_env() == "unfused") return false;
  return kFuseByDefault || gqa_topk_env() == "fused";
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

bool gqa_score_topk_fuses(const ScoreRowsParams& sp, const GqaRowsParams& gp) {
  if (!gp.topk_scratch || !fused_topk_on(gp.fuse) || sp.layout != IndexRecLayout::planar_higgs2 || sp.cand ||
      sp.candidates_only || !sp.gqa_scratch || !gp.partials_ready || sp.head_dim != 128)
    return false;
  if (gp.n_q < 2 || gp.n_q != sp.n_q || gp.in_stride != sp.out_stride || gp.in_stride > kFusedMaxRow) return false;
  if (sp.fmt.spec.uniform_levels) return sp.fmt.spec.grid_size == 4 && gp.n_q <= kFusedMaxQ;  // U4
  return planar_scorer_resolved(sp.planar_scorer) == PlanarScorer::mma16 && gp.n_q <= 4;
}

void gqa_score_topk_rows(const Exec& x, const ScoreRowsParams& sp, const GqaRowsParams& gp, const float* q,
                         const uint8_t* const* plane0, const uint8_t* const* plane1, const StepRanges* ranges,
                         int kmax, float* scores, int32_t* out) {
  if (!gqa_score_topk_fuses(sp, gp)) {
    kvtier::cuda::score_rows(x, sp, q, plane0, plane1, ranges, scores);
    kvtier::cuda::gqa_topk_rows(x, gp, scores, ranges, kmax, out);
    return;
  }
  const int64_t n_rows = int64_t(gp.n_seq) * gp.n_kv_head;
  if (n_rows == 0) return;
  KVT_CHECK(kmax > 0 && n_rows * gp.n_q < 65536, "gqa_score_topk_rows: kmax {}, {} rows of {} queries", kmax, n_rows,
            gp.n_q);
  KVT_CHECK(reinterpret_cast<uintptr_t>(gp.topk_scratch) % 16 == 0, "gqa_score_topk_rows: needs 16-byte aligned scratch");
  const FusedView v = fused_view(gp.topk_scratch, n_rows, gp.n_q);
  static const bool thr_attr = [] {
    KVT_CUDA_CHECK(cudaFuncSetAttribute(keep_threshold_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(kThrSmem)));
    return true;
  }();
  (void)thr_attr;
  keep_threshold_kernel<<<unsigned(n_rows), kThrThreads, kThrSmem, st(x)>>>(sp, kmax, sp.fmt.spec.uniform_levels != 0, q,
                                                                     plane0, plane1, ranges, v, gp.keep_test_bias);
  KVT_CUDA_LAUNCH_CHECK("keep_threshold_kernel");
  ScoreRowsParams s1 = sp;
  s1.keep = TopkKeep{1, v.mode, v.theta, v.count, v.nblk, v.ids, v.kept};
  kvtier::cuda::score_rows(x, s1, q, plane0, plane1, ranges, scores);
  static const bool attr = [] {
    KVT_CUDA_CHECK(cudaFuncSetAttribute(fused_kept_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(kFusedMaxRow / 8)));
    return true;
  }();
  (void)attr;
  const size_t smem = size_t((gp.in_stride + 31) / 32) * 4;
  const score_detail::GqaPartials part = score_detail::gqa_partials(gp.scratch, n_rows * gp.n_q);
  fused_kept_kernel<<<unsigned(n_rows), kKeptThreads, smem, st(x)>>>(gp.n_kv_head, kmax, gp.n_q, part, ranges, v,
                                                                      out);
  KVT_CUDA_LAUNCH_CHECK("fused_kept_kernel");
  s1.keep.pass = 2;  // the rows it gave up on, in full
  kvtier::cuda::score_rows(x, s1, q, plane0, plane1, ranges, scores);
  TopkSource src;
  src.scores = scores;
  src.stride = gp.in_stride;
  src.n_q = gp.n_q;
  src.gp = part;
  launch_topk<true>(x, n_rows, gp.n_kv_head, kmax, src, ranges, v.mode, out);
}

std::vector<int32_t> gqa_topk_row_paths(const Exec& x, const void* topk_scratch, int64_t n_rows) {
  std::vector<int32_t> paths(static_cast<size_t>(n_rows));
  const SampledView v = sampled_view(const_cast<void*>(topk_scratch), n_rows, 0, 0);
  KVT_CUDA_CHECK(cudaStreamSynchronize(st(x)));
  KVT_CUDA_CHECK(cudaMemcpy(paths.data(), v.mode, size_t(n_rows) * 4, cudaMemcpyDeviceToHost));
  return paths;
}

}  // namespace kvtier::cuda
