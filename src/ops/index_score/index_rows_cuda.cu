// The decode step's scoring and selection on the GPU (index_rows.h; the
// CPU versions in index_rows_cpu.cpp are the specification). Rows are
// (sequence, KV head); every kernel reads its row's storage and lengths from
// the row tables and the per-sequence StepRanges, so one launch serves a
// batch of sequences of any lengths, and nothing depends on host values that
// change per step (a captured CUDA graph replays the step).
//
// Here: the step plan (and reselect=N's choice of who selects anew, with
// the selections kept between or, rescore=D, the candidates rescored), the index query, the mask of forced chunks, the
// expansion of chunks to tokens and the resident list. Scoring and the GQA
// aggregation are in score_rows_cuda.cu, the top-k in topk_rows_cuda.cu.
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cub/block/block_scan.cuh>

#include "backend/cuda_backend.h"
#include "ops/index_score/index_rows_cuda.h"

namespace kvtier::cuda {
namespace {

// ---- step plan

__global__ void step_plan_kernel(StepPlanParams p, const int64_t* __restrict__ n, const int32_t* __restrict__ budget,
                                 const int32_t* __restrict__ n_outlier, StepRanges* __restrict__ out) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= p.n_seq) return;
  StepRanges r;
  r.n = n[s];
  const int64_t n_indexed = r.n / p.unit * p.unit;
  r.n_chunk = n_indexed / p.chunk;
  const int64_t window = max(int64_t(p.local), r.n - n_indexed);
  r.win_lo = min(r.n, max(int64_t(p.sink), r.n - window));
  r.c_lo = min(int64_t(p.sink / p.chunk), r.n_chunk);
  const int64_t open_end = r.n - p.local;
  r.c_hi = open_end > 0 ? min(r.n_chunk, (open_end + p.chunk - 1) / p.chunk) : 0;
  r.c_hi = max(r.c_hi, r.c_lo);
  const int64_t want = max(1, min(budget[s], p.kmax));
  r.k = min(want, r.c_hi - r.c_lo);
  r.n_res = min(r.n, int64_t(p.sink)) + (r.n - r.win_lo);
  r.n_out = n_outlier ? n_outlier[s] : 0;
  r.fresh = 1;
  out[s] = r;
}

// ---- reselect=N: who selects anew, and the kept selections

__global__ void reselect_kernel(int n_seq, int every, int rescore, int64_t* const* __restrict__ last,
                                const StepRanges* __restrict__ ranges, StepRanges* __restrict__ out) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= n_seq) return;
  StepRanges r = ranges[s];
  int64_t* at = last[s];
  const int64_t a = at[0];
  if (a <= 0 || r.n <= a || r.n - a >= every) {
    at[0] = r.n;
    if (rescore > 0) at[1] = candidate_count(r, rescore);
    r.fresh = 1;
  } else if (rescore > 0) {
    r.n_chunk = r.c_hi = at[1];
    r.c_lo = 0;
    r.k = min(r.k, at[1]);
    r.fresh = 0;
  } else {
    r.n_chunk = r.c_lo = r.c_hi = r.k = 0;
    r.fresh = 0;
  }
  out[s] = r;
}

// ---- rescore=D: the candidates rescored between picks

constexpr int kCandThreads = 256;
struct MaxOp {
  __device__ long long operator()(long long a, long long b) const { return a > b ? a : b; }
};

// One block per row. A fresh row's runs: run i starts at
// u_i = i·run + max_{j ≤ i} (p_j − j·run) (the later of p_i and the end of
// run i − 1), pushed left to c_hi − (k − i)·run; the prefix max is a block
// scan over tiles of the pick, carried from tile to tile.
__global__ void candidate_rows_kernel(CandidateRowsParams p, const StepRanges* __restrict__ ranges,
                                      int32_t* const* __restrict__ cand, int32_t* __restrict__ sel) {
  using Scan = cub::BlockScan<long long, kCandThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ long long carry;
  const int64_t r = blockIdx.x;
  const StepRanges sr = ranges[r / p.n_kv_head];
  int32_t* row = sel + r * p.kmax;
  int32_t* c = cand[r];
  if (!sr.fresh) {
    for (int i = threadIdx.x; i < p.kmax; i += kCandThreads) {
      const int32_t v = row[i];
      if (v >= 0) row[i] = c[v];
    }
    return;
  }
  const long long run = p.rescore + 1;
  const long long k = min(sr.k, int64_t(p.kmax)), w = candidate_count(sr, p.rescore);
  if (w < k * run) {
    for (long long i = threadIdx.x; i < w; i += kCandThreads) c[i] = int32_t(sr.c_lo + i);
    return;
  }
  const int32_t* pick = row + (p.kmax - k);
  if (threadIdx.x == 0) carry = LLONG_MIN;
  __syncthreads();
  for (long long t0 = 0; t0 < k; t0 += kCandThreads) {
    const long long i = t0 + threadIdx.x;
    const long long v = i < k ? pick[i] - i * run : LLONG_MIN;
    long long m;
    Scan(tmp).InclusiveScan(v, m, MaxOp());
    m = max(m, carry);
    __syncthreads();  // every thread has read carry
    if (threadIdx.x == kCandThreads - 1) carry = m;
    if (i < k) {
      const long long start = min(i * run + m, sr.c_hi - (k - i) * run);
      for (long long j = 0; j < run; ++j) c[i * run + j] = int32_t(start + j);
    }
    __syncthreads();  // carry written; the scan's storage free again
  }
}

__device__ __forceinline__ void copy_record(uint8_t* dst, const uint8_t* src, int64_t bytes) {
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | uintptr_t(bytes)) & 15) == 0) {
    for (int64_t i = 0; i < bytes; i += 16)
      *reinterpret_cast<uint4*>(dst + i) = __ldg(reinterpret_cast<const uint4*>(src + i));
  } else if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | uintptr_t(bytes)) & 1) == 0) {
    for (int64_t i = 0; i < bytes; i += 2)
      *reinterpret_cast<uint16_t*>(dst + i) = *reinterpret_cast<const uint16_t*>(src + i);
  } else {
    for (int64_t i = 0; i < bytes; ++i) dst[i] = src[i];
  }
}

// Blocks (row, part): a thread per candidate record.
__global__ void gather_candidates_kernel(GatherCandParams p, const StepRanges* __restrict__ ranges,
                                         const int32_t* const* __restrict__ cand,
                                         const uint8_t* const* __restrict__ plane0,
                                         const uint8_t* const* __restrict__ plane1, uint8_t* __restrict__ scratch0,
                                         uint8_t* __restrict__ scratch1, const uint8_t** __restrict__ rows) {
  const int64_t r = blockIdx.x;
  const StepRanges& sr = ranges[r / p.n_kv_head];
  uint8_t* o0 = scratch0 + r * p.stride0;
  uint8_t* o1 = p.bytes1 ? scratch1 + r * p.stride1 : nullptr;
  if (blockIdx.y == 0 && threadIdx.x == 0) {
    rows[r] = sr.fresh ? plane0[r] : o0;
    rows[p.n_rows + r] = sr.fresh ? (plane1 ? plane1[r] : nullptr) : o1;
  }
  if (sr.fresh) return;
  const int32_t* c = cand[r];
  const uint8_t* src0 = plane0[r];
  const uint8_t* src1 = o1 ? plane1[r] : nullptr;
  for (int64_t i = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; i < sr.c_hi; i += int64_t(gridDim.y) * blockDim.x) {
    const int64_t id = c[i];
    copy_record(o0 + i * p.bytes0, src0 + id * p.bytes0, p.bytes0);
    if (o1) copy_record(o1 + i * p.bytes1, src1 + id * p.bytes1, p.bytes1);
  }
}

__global__ void keep_selection_kernel(KeepSelParams p, const StepRanges* __restrict__ ranges,
                                      const int32_t* __restrict__ kslots, int32_t* const* __restrict__ kept,
                                      int32_t* __restrict__ sel) {
  // one block per row
  const int64_t r = blockIdx.x;
  const int s = int(r / p.n_kv_head);
  const int k = min(kslots[s], p.width);
  int32_t* row = sel + r * p.width;
  int32_t* keep = kept[r];
  if (ranges[s].fresh) {
    for (int i = threadIdx.x; i < k; i += blockDim.x) keep[i] = row[p.width - k + i];
  } else {
    for (int i = threadIdx.x; i < p.width; i += blockDim.x) row[i] = i < p.width - k ? -1 : keep[i - (p.width - k)];
  }
}

// ---- the query

__global__ void index_query_kernel(IndexQueryParams p, const __nv_bfloat16* __restrict__ q, float* __restrict__ out) {
  // one block per (seq, kv head, j); blockDim = head_dim (a power of two)
  extern __shared__ float v[];
  const int d = threadIdx.x, hd = blockDim.x;
  const int group = p.n_head / p.n_kv_head, n_q = p.mean_group ? 1 : group;
  const int j = blockIdx.x % n_q;
  const int g = (blockIdx.x / n_q) % p.n_kv_head;
  const int seq = blockIdx.x / (n_q * p.n_kv_head);
  const __nv_bfloat16* qs = q + (int64_t(seq) * p.n_head + int64_t(g) * group) * hd;
  float acc = 0.f;
  if (p.mean_group) {
    for (int h = 0; h < group; ++h) acc += __bfloat162float(qs[h * hd + d]);
    acc /= float(group);
  } else {
    acc = __bfloat162float(qs[j * hd + d]);
  }
  const int G = p.rotate_group;
  if (G > 0 && p.signs) acc *= p.signs[d % G];
  v[d] = acc;
  if (G > 0) {
    for (int len = 1; len < G; len <<= 1) {  // Sylvester-order butterflies within each group
      __syncthreads();
      const float a = v[d], b = v[d ^ len];
      __syncthreads();
      v[d] = (d & len) ? b - a : a + b;
    }
    __syncthreads();
    acc = v[d] * rsqrtf(float(G));
  }
  out[int64_t(blockIdx.x) * hd + d] = acc;
}

// ---- mask, expand, resident list

__global__ void mask_rows_kernel(int64_t n_rows, int n_kv_head, int64_t stride, int n_forced,
                                 const int32_t* __restrict__ forced, const StepRanges* __restrict__ ranges,
                                 float* __restrict__ scores) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_rows * n_forced) return;
  const int64_t r = i / n_forced;
  const StepRanges sr = ranges[r / n_kv_head];
  const int64_t c = forced[i];
  if (c >= sr.c_lo && c < sr.c_hi) scores[r * stride + (c - sr.c_lo)] = -INFINITY;
}

__device__ __forceinline__ bool is_forced(const int32_t* f, int n, int32_t c) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (f[mid] < c) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && f[lo] == c;
}

constexpr int kExpandThreads = 256;

// One block per row: kept tokens counted per chunk, scanned, written
// right-aligned (−1 first), ascending.
__global__ void __launch_bounds__(kExpandThreads) expand_rows_kernel(ExpandRowsParams p,
                                                                      const int32_t* __restrict__ chunks,
                                                                      const int32_t* __restrict__ forced,
                                                                      const StepRanges* __restrict__ ranges,
                                                                      int32_t* __restrict__ tokens) {
  using Scan = cub::BlockScan<int, kExpandThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ int s_total;
  const int64_t r = blockIdx.x;
  const StepRanges sr = ranges[r / p.n_kv_head];
  const int64_t width = int64_t(p.kmax) * p.chunk;
  const int32_t* cr = chunks + r * p.kmax;
  const int32_t* fr = forced ? forced + r * p.n_forced : nullptr;
  int32_t* out = tokens + r * width;
  auto keep = [&](int32_t c, int t) -> bool {
    if (c < 0 || (fr && is_forced(fr, p.n_forced, c))) return false;
    const int64_t tok = int64_t(c) * p.chunk + t;
    return tok >= p.sink && tok < sr.win_lo;
  };
  // Pass 1: the total kept.
  int mine = 0;
  for (int i = threadIdx.x; i < p.kmax; i += kExpandThreads)
    for (int t = 0; t < p.chunk; ++t) mine += keep(cr[i], t);
  int ignore = 0, total = 0;
  Scan(tmp).ExclusiveSum(mine, ignore, total);
  if (threadIdx.x == 0) s_total = total;
  __syncthreads();
  total = s_total;
  for (int64_t i = threadIdx.x; i < width - total; i += kExpandThreads) out[i] = -1;
  // Pass 2: chunk by chunk in order, a block-wide scan of the kept counts.
  int base = int(width - total);
  for (int i0 = 0; i0 < p.kmax; i0 += kExpandThreads) {
    const int i = i0 + threadIdx.x;
    const int32_t c = i < p.kmax ? cr[i] : -1;
    int cnt = 0;
    for (int t = 0; t < p.chunk; ++t) cnt += keep(c, t);
    int before = 0, sum = 0;
    __syncthreads();
    Scan(tmp).ExclusiveSum(cnt, before, sum);
    int at = base + before;
    for (int t = 0; t < p.chunk; ++t)
      if (keep(c, t)) out[at++] = int32_t(int64_t(c) * p.chunk + t);
    base += sum;
  }
}

__global__ void resident_list_kernel(ResidentListParams p, const int32_t* __restrict__ forced,
                                     const StepRanges* __restrict__ ranges, int32_t* __restrict__ slots) {
  // One block per row; thread 0 lists the outliers (at most a few hundred), the rest in parallel.
  const int64_t r = blockIdx.x;
  const StepRanges sr = ranges[r / p.n_kv_head];
  const int64_t n_sink = min(sr.n, int64_t(p.sink)), n_win = sr.n - sr.win_lo;
  int32_t* o = slots + r * p.n_slots;
  for (int64_t j = threadIdx.x; j < p.n_slots; j += blockDim.x) {
    int32_t v = -1;
    if (j < n_sink) v = int32_t(j);
    else if (j < n_sink + n_win) v = int32_t(p.sink + (sr.win_lo + (j - n_sink)) % p.ring);
    o[j] = v;
  }
  __syncthreads();
  if (threadIdx.x == 0 && forced) {
    int64_t j = n_sink + n_win;
    const int n_out = int(sr.n_out / p.chunk);
    for (int i = 0; i < n_out; ++i) {
      const int64_t ch = forced[r * p.n_forced + (p.n_forced - n_out) + i];
      for (int t = 0; t < p.chunk; ++t) {
        const int64_t tok = ch * p.chunk + t;
        if (tok >= p.sink && tok < sr.win_lo) o[j++] = int32_t(p.sink + p.ring + int64_t(i) * p.chunk + t);
      }
    }
  }
}

cudaStream_t st(const Exec& x) { return static_cast<cudaStream_t>(x.stream); }

}  // namespace

void step_plan_rows(const Exec& x, const StepPlanParams& p, const int64_t* n, const int32_t* budget_chunks,
                    const int32_t* n_outlier, StepRanges* out) {
  if (p.n_seq <= 0) return;
  step_plan_kernel<<<unsigned((p.n_seq + 127) / 128), 128, 0, st(x)>>>(p, n, budget_chunks, n_outlier, out);
  KVT_CUDA_LAUNCH_CHECK("step_plan_kernel");
}

void reselect_rows(const Exec& x, int n_seq, int every, int rescore, int64_t* const* last,
                   const StepRanges* ranges, StepRanges* out) {
  if (n_seq <= 0) return;
  reselect_kernel<<<unsigned((n_seq + 127) / 128), 128, 0, st(x)>>>(n_seq, every, rescore, last, ranges, out);
  KVT_CUDA_LAUNCH_CHECK("reselect_kernel");
}

void candidate_rows(const Exec& x, const CandidateRowsParams& p, const StepRanges* ranges, int32_t* const* cand,
                    int32_t* sel) {
  if (p.n_rows == 0 || p.kmax == 0) return;
  candidate_rows_kernel<<<unsigned(p.n_rows), kCandThreads, 0, st(x)>>>(p, ranges, cand, sel);
  KVT_CUDA_LAUNCH_CHECK("candidate_rows_kernel");
}

void gather_candidates(const Exec& x, const GatherCandParams& p, const StepRanges* ranges,
                       const int32_t* const* cand, const uint8_t* const* plane0, const uint8_t* const* plane1,
                       uint8_t* scratch0, uint8_t* scratch1, const uint8_t** rows) {
  if (p.n_rows == 0) return;
  KVT_CHECK(p.bytes0 > 0, "gather_candidates: records of {} bytes", p.bytes0);
  const int64_t w_max = p.stride0 / p.bytes0;  // the most candidates a row holds
  const unsigned parts = unsigned(std::max<int64_t>(1, std::min<int64_t>(64, (w_max + 255) / 256)));
  gather_candidates_kernel<<<dim3(unsigned(p.n_rows), parts), 256, 0, st(x)>>>(p, ranges, cand, plane0, plane1,
                                                                               scratch0, scratch1, rows);
  KVT_CUDA_LAUNCH_CHECK("gather_candidates_kernel");
}

void keep_selection(const Exec& x, const KeepSelParams& p, const StepRanges* ranges, const int32_t* kslots,
                    int32_t* const* kept, int32_t* sel) {
  if (p.n_rows == 0 || p.width == 0) return;
  keep_selection_kernel<<<unsigned(p.n_rows), 256, 0, st(x)>>>(p, ranges, kslots, kept, sel);
  KVT_CUDA_LAUNCH_CHECK("keep_selection_kernel");
}

void index_query_rows(const Exec& x, const IndexQueryParams& p, const void* q_bf16, float* out) {
  KVT_CHECK(p.n_kv_head > 0 && p.n_head % p.n_kv_head == 0, "index_query: n_head {} not a multiple of n_kv_head {}",
            p.n_head, p.n_kv_head);
  KVT_CHECK(p.head_dim >= 2 && p.head_dim <= 1024 && (p.head_dim & (p.head_dim - 1)) == 0,
            "index_query: head_dim {} must be a power of two <= 1024", p.head_dim);
  KVT_CHECK(p.rotate_group == 0 || p.head_dim % p.rotate_group == 0, "index_query: rotation group {}", p.rotate_group);
  const int n_q = p.mean_group ? 1 : p.n_head / p.n_kv_head;
  index_query_kernel<<<unsigned(p.n_seq * p.n_kv_head * n_q), unsigned(p.head_dim), p.head_dim * sizeof(float),
                       st(x)>>>(p, static_cast<const __nv_bfloat16*>(q_bf16), out);
  KVT_CUDA_LAUNCH_CHECK("index_query_kernel");
}

void mask_rows(const Exec& x, int64_t n_rows, int n_kv_head, int64_t stride, int n_forced, const int32_t* forced,
               const StepRanges* ranges, float* scores) {
  const int64_t n = n_rows * n_forced;
  if (n == 0) return;
  mask_rows_kernel<<<unsigned((n + 255) / 256), 256, 0, st(x)>>>(n_rows, n_kv_head, stride, n_forced, forced, ranges,
                                                                 scores);
  KVT_CUDA_LAUNCH_CHECK("mask_rows_kernel");
}

void expand_rows(const Exec& x, const ExpandRowsParams& p, const int32_t* chunks, const int32_t* forced,
                 const StepRanges* ranges, int32_t* tokens) {
  if (p.n_rows == 0) return;
  expand_rows_kernel<<<unsigned(p.n_rows), kExpandThreads, 0, st(x)>>>(p, chunks, forced, ranges, tokens);
  KVT_CUDA_LAUNCH_CHECK("expand_rows_kernel");
}

void resident_list(const Exec& x, const ResidentListParams& p, const int32_t* forced, const StepRanges* ranges,
                   int32_t* slots) {
  if (p.n_rows == 0 || p.n_slots == 0) return;
  resident_list_kernel<<<unsigned(p.n_rows), 128, 0, st(x)>>>(p, forced, ranges, slots);
  KVT_CUDA_LAUNCH_CHECK("resident_list_kernel");
}

}  // namespace kvtier::cuda
