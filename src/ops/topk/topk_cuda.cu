// One cluster of 8 blocks per row (sm_90 thread block clusters); block b owns
// a contiguous chunk of the row. Pass p (p = 0, 1, 2) builds each block's
// shared histogram of the next 11/11/10 key bits (elements whose higher bits
// match the prefix found so far); after a cluster barrier every block reads
// all 8 histograms through distributed shared memory and picks, identically,
// the bin that holds the k-th largest (first a sum over 32-bin groups, then
// the bins of one group). A block's counts of key > T and key == T follow
// from its own histograms; the lower ranks' counts give its output offsets.
// The compaction walks the chunk in index order: key > T is taken, key == T
// for the first (k − count(> T)) occurrences of the row; positions come from
// warp ballots and one scan over the 32 warps.
// Chunks up to 16384 scores stay in registers between the passes; longer
// chunks are read again per pass (from L2).
#include <cooperative_groups.h>

#include "backend/cuda_backend.h"
#include "ops/topk/topk_cuda.h"

namespace kvtier::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kCluster = 8;  // blocks per row; 8 is the portable cluster size
constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kPerLane = 16;                // keys per thread per tile, in registers
constexpr int kWarpSpan = 32 * kPerLane;    // consecutive scores a warp owns in a tile
constexpr int kTile = kThreads * kPerLane;  // 16384 scores
constexpr int kHistWords = 2048 + 2048 + 1024;
static_assert(kWarps == 32, "the scans over warps use one lane per warp");

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

// Lane j of warp w holds tile scores w*kWarpSpan + i*32 + lane (i < kPerLane):
// each load is coalesced and a warp's scores are contiguous, so index order is
// (warp, i, lane). Scores past `len` get key 0 and must be masked by the caller.
__device__ __forceinline__ void load_tile(const float* __restrict__ src, int len, int warp, int lane,
                                          uint32_t (&keys)[kPerLane]) {
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int off = warp * kWarpSpan + i * 32 + lane;
    keys[i] = off < len ? order_key(src[off]) : 0u;
  }
}

// Run by warp 0 of every block on the same cluster-wide data, so all blocks
// get the same answer: the bin (from the top) holding the `remaining`-th
// largest among the elements counted in `hist` (per rank) and `group`
// (per rank: sums of 32 consecutive ranges of n_bins/32 bins). Requires
// 1 <= remaining <= the cluster's total count.
__device__ void select_bin(const cg::cluster_group& cluster, uint32_t* hist, uint32_t* group, int n_bins, int shift,
                           uint32_t prefix, uint32_t remaining, int lane, uint32_t* s_prefix,
                           uint32_t* s_remaining) {
  // Lane L sums group 31 − L over the cluster.
  uint32_t c = 0;
#pragma unroll
  for (int r = 0; r < kCluster; ++r) c += cluster.map_shared_rank(group, r)[31 - lane];
  uint32_t incl = warp_inclusive_sum(c, lane);
  uint32_t excl = incl - c;
  const int g_lane = __ffs(__ballot_sync(0xffffffffu, excl < remaining && incl >= remaining)) - 1;
  remaining -= __shfl_sync(0xffffffffu, excl, g_lane);
  // The group's bins from its top: lane L owns bins top − L*per_lane − q.
  const int per_group = n_bins / 32, per_lane = per_group / 32;  // per_lane is 2 or 1
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
  if (excl < remaining && incl >= remaining) {  // exactly one lane
    const bool first = excl + c0 >= remaining;
    *s_prefix = prefix | (uint32_t(first ? b0 : b1) << shift);
    *s_remaining = remaining - excl - (first ? 0u : c0);
  }
}

// grid: kCluster * n_rows blocks; cluster c handles row c. Requires k < n.
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads)
    topk_kernel(const float* __restrict__ scores, int64_t n, int64_t row_stride, int k, int64_t tok_offset,
                int32_t* __restrict__ out) {
  const cg::cluster_group cluster = cg::this_cluster();
  // Every pass has its own histogram and group sums: other blocks may still
  // read pass p's while this block fills pass p + 1's.
  __shared__ uint32_t hist[kHistWords];
  __shared__ uint32_t group[3][32];
  __shared__ uint32_t s_warp[kWarps];
  __shared__ uint32_t s_counts[2];  // this block's (key > T, key == T), read by higher ranks
  __shared__ uint32_t s_base[2];    // the same counts summed over lower ranks
  __shared__ uint32_t s_prefix, s_remaining;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int rank = int(cluster.block_rank());
  const int64_t row = blockIdx.x / kCluster;

  // Chunks are multiples of 32 scores; the last ranks of a short row get none.
  const int64_t chunk = ((n + kCluster - 1) / kCluster + 31) & ~int64_t(31);
  const int64_t begin = min(n, rank * chunk), len = min(n, begin + chunk) - begin;
  const float* src = scores + row * row_stride + begin;
  const int n_tiles = int((len + kTile - 1) / kTile);
  auto tile_len = [&](int t) { return int(min(int64_t(kTile), len - int64_t(t) * kTile)); };

  for (int b = tid; b < kHistWords; b += kThreads) hist[b] = 0;
  uint32_t keys[kPerLane];
  if (n_tiles <= 1) load_tile(src, int(len), warp, lane, keys);  // len <= kTile
  __syncthreads();

  uint32_t prefix = 0, prefix_mask = 0, remaining = uint32_t(k);
  constexpr int kShift[3] = {21, 10, 0}, kBits[3] = {11, 11, 10}, kHistAt[3] = {0, 2048, 4096};
#pragma unroll
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = kShift[pass], n_bins = 1 << kBits[pass];
    uint32_t* h = hist + kHistAt[pass];
    for (int t = 0; t < n_tiles; ++t) {
      if (n_tiles > 1) load_tile(src + int64_t(t) * kTile, tile_len(t), warp, lane, keys);
      const int tl = tile_len(t);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const bool ok = warp * kWarpSpan + i * 32 + lane < tl;
        if (ok && (keys[i] & prefix_mask) == prefix) atomicAdd(&h[(keys[i] >> shift) & (n_bins - 1)], 1u);
      }
    }
    __syncthreads();
    {  // warp w sums bins [w*per_group, (w+1)*per_group)
      const int per_group = n_bins / 32;
      uint32_t v = 0;
      for (int b = lane; b < per_group; b += 32) v += h[warp * per_group + b];
      v = __reduce_add_sync(0xffffffffu, v);
      if (lane == 0) group[pass][warp] = v;
    }
    cluster.sync();  // all histograms of the cluster are complete
    if (warp == 0)
      select_bin(cluster, h, group[pass], n_bins, shift, prefix, remaining, lane, &s_prefix, &s_remaining);
    __syncthreads();
    prefix = s_prefix;
    remaining = s_remaining;
    prefix_mask |= uint32_t(n_bins - 1) << shift;
  }
  // Threshold T = prefix; `remaining` elements equal to T are taken (lowest first).
  const uint32_t thr = prefix, need_eq = remaining;

  {  // This block's counts from its histograms: key > T is decided at the first
     // pass where its bits differ from T's.
    const uint32_t sel0 = thr >> 21, sel1 = (thr >> 10) & 2047u, sel2 = thr & 1023u;
    uint32_t g = 0;
    for (uint32_t b = tid; b < 2048; b += kThreads) g += (b > sel0 ? hist[b] : 0u) + (b > sel1 ? hist[2048 + b] : 0u);
    for (uint32_t b = tid; b < 1024; b += kThreads) g += b > sel2 ? hist[4096 + b] : 0u;
    g = __reduce_add_sync(0xffffffffu, g);
    if (lane == 0) s_warp[warp] = g;
    __syncthreads();
    if (warp == 0) {
      g = __reduce_add_sync(0xffffffffu, s_warp[lane]);
      if (lane == 0) {
        s_counts[0] = g;
        s_counts[1] = hist[4096 + sel2];
      }
    }
  }
  cluster.sync();  // counts published
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
  // The last access to another block's shared memory is above: after this
  // barrier every block may exit.
  cluster.sync();

  uint32_t run_gt = s_base[0], run_eq = s_base[1];
  if (s_counts[0] == 0 && (s_counts[1] == 0 || run_eq >= need_eq)) return;  // nothing taken here
  int32_t* orow = out + row * k;
  const uint32_t lt = (1u << lane) - 1u;
  for (int t = 0; t < n_tiles; ++t) {
    if (n_tiles > 1) load_tile(src + int64_t(t) * kTile, tile_len(t), warp, lane, keys);
    const int tl = tile_len(t);
    uint32_t w_gt = 0, w_eq = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const bool ok = warp * kWarpSpan + i * 32 + lane < tl;
      w_gt += __popc(__ballot_sync(0xffffffffu, ok && keys[i] > thr));
      w_eq += __popc(__ballot_sync(0xffffffffu, ok && keys[i] == thr));
    }
    if (lane == 0) s_warp[warp] = (w_gt << 16) | w_eq;  // a tile's counts stay < 2^16
    __syncthreads();
    const uint32_t v = s_warp[lane];
    const uint32_t incl = warp_inclusive_sum(v, lane);
    const uint32_t before = __shfl_sync(0xffffffffu, incl - v, warp), total = __shfl_sync(0xffffffffu, incl, 31);
    uint32_t my_gt = run_gt + (before >> 16), my_eq = run_eq + (before & 0xffffu);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int off = warp * kWarpSpan + i * 32 + lane;
      const bool ok = off < tl, gt = ok && keys[i] > thr, eq = ok && keys[i] == thr;
      const uint32_t m_gt = __ballot_sync(0xffffffffu, gt), m_eq = __ballot_sync(0xffffffffu, eq);
      const uint32_t g = my_gt + __popc(m_gt & lt), e = my_eq + __popc(m_eq & lt);
      if (gt || (eq && e < need_eq)) orow[g + min(e, need_eq)] = int32_t(tok_offset + begin + int64_t(t) * kTile + off);
      my_gt += __popc(m_gt);
      my_eq += __popc(m_eq);
    }
    run_gt += total >> 16;
    run_eq += total & 0xffffu;
    __syncthreads();  // s_warp is rewritten by the next tile
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
  KVT_CHECK(n_rows < (int64_t(1) << 31) / kCluster, "topk: {} rows exceed the grid ({} blocks per row)", n_rows,
            kCluster);
  topk_kernel<<<unsigned(n_rows * kCluster), kThreads, 0, s>>>(scores, n, row_stride, k, tok_offset, out);
  KVT_CUDA_LAUNCH_CHECK("topk_kernel");
}

}  // namespace kvtier::cuda
