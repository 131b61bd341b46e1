// The decode step's scoring and selection on the CPU: the specification of
// index_rows.h (and the CPU backend's implementation). Scores come from the
// CPU quantizer's score() over the records in place.
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <vector>

#include "core/half.h"
#include "core/status.h"
#include "core/threads.h"
#include "ops/decode_attn/decode_attn_kernels.h"
#include "ops/index_score/index_rows.h"
#include "ops/quant/hadamard.h"
#include "ops/topk/topk.h"

namespace kvtier {

void step_plan_rows_cpu(const StepPlanParams& p, const int64_t* n, const int32_t* budget_chunks,
                        const int32_t* n_outlier, StepRanges* out) {
  for (int s = 0; s < p.n_seq; ++s) {
    StepRanges& r = out[s];
    r.n = n[s];
    const int64_t n_indexed = r.n / p.unit * p.unit;
    r.n_chunk = n_indexed / p.chunk;
    // Always attended: the window and the tokens of a unit not indexed yet.
    const int64_t window = std::max<int64_t>(p.local, r.n - n_indexed);
    r.win_lo = std::min(r.n, std::max<int64_t>(p.sink, r.n - window));
    r.c_lo = std::min<int64_t>(p.sink / p.chunk, r.n_chunk);
    const int64_t open_end = r.n - p.local;  // tokens below it may be selected
    r.c_hi = open_end > 0 ? std::min(r.n_chunk, (open_end + p.chunk - 1) / p.chunk) : 0;
    r.c_hi = std::max(r.c_hi, r.c_lo);
    const int64_t want = std::max<int32_t>(1, std::min(budget_chunks[s], p.kmax));
    r.k = std::min(want, r.c_hi - r.c_lo);
    r.n_res = std::min<int64_t>(r.n, p.sink) + (r.n - r.win_lo);
    r.n_out = n_outlier ? n_outlier[s] : 0;
    r.fresh = 1;
  }
}

void reselect_rows_cpu(int n_seq, int every, int rescore, int64_t* const* last, const StepRanges* ranges,
                       StepRanges* out) {
  for (int s = 0; s < n_seq; ++s) {
    StepRanges r = ranges[s];
    int64_t* at = last[s];
    if (at[0] <= 0 || r.n <= at[0] || r.n - at[0] >= every) {
      at[0] = r.n;
      if (rescore > 0) at[1] = candidate_count(r, rescore);
      r.fresh = 1;
    } else if (rescore > 0) {
      r.n_chunk = r.c_hi = at[1];
      r.c_lo = 0;
      r.k = std::min(r.k, at[1]);
      r.fresh = 0;
    } else {
      r.n_chunk = r.c_lo = r.c_hi = r.k = 0;
      r.fresh = 0;
    }
    out[s] = r;
  }
}

void candidate_rows_cpu(const CandidateRowsParams& p, const StepRanges* ranges, int32_t* const* cand, int32_t* sel) {
  const int64_t run = int64_t(p.rescore) + 1;
  for (int64_t r = 0; r < p.n_rows; ++r) {
    const StepRanges& sr = ranges[r / p.n_kv_head];
    int32_t* row = sel + r * p.kmax;
    int32_t* c = cand[r];
    if (!sr.fresh) {
      for (int i = 0; i < p.kmax; ++i)
        if (row[i] >= 0) row[i] = c[row[i]];
      continue;
    }
    const int64_t k = std::min<int64_t>(sr.k, p.kmax), w = candidate_count(sr, p.rescore);
    if (w < k * run) {  // every id of [c_lo, c_hi)
      for (int64_t i = 0; i < w; ++i) c[i] = int32_t(sr.c_lo + i);
      continue;
    }
    const int32_t* pick = row + (p.kmax - k);
    int64_t end = std::numeric_limits<int64_t>::min();  // the end of run i − 1
    for (int64_t i = 0; i < k; ++i) {
      const int64_t start = std::min(std::max<int64_t>(pick[i], end), sr.c_hi - (k - i) * run);
      for (int64_t j = 0; j < run; ++j) c[i * run + j] = int32_t(start + j);
      end = std::max<int64_t>(pick[i], end) + run;
    }
  }
}

void gather_candidates_cpu(const GatherCandParams& p, const StepRanges* ranges, const int32_t* const* cand,
                           const uint8_t* const* plane0, const uint8_t* const* plane1, uint8_t* scratch0,
                           uint8_t* scratch1, const uint8_t** rows) {
  for (int64_t r = 0; r < p.n_rows; ++r) {
    const StepRanges& sr = ranges[r / p.n_kv_head];
    if (sr.fresh) {
      rows[r] = plane0[r];
      rows[p.n_rows + r] = plane1 ? plane1[r] : nullptr;
      continue;
    }
    KVT_CHECK(sr.c_hi * p.bytes0 <= p.stride0 && sr.c_hi * p.bytes1 <= p.stride1,
              "gather_candidates: {} candidates exceed the scratch row", sr.c_hi);
    uint8_t* o0 = scratch0 + r * p.stride0;
    uint8_t* o1 = p.bytes1 ? scratch1 + r * p.stride1 : nullptr;
    for (int64_t i = 0; i < sr.c_hi; ++i) {
      const int64_t id = cand[r][i];
      std::memcpy(o0 + i * p.bytes0, plane0[r] + id * p.bytes0, size_t(p.bytes0));
      if (o1) std::memcpy(o1 + i * p.bytes1, plane1[r] + id * p.bytes1, size_t(p.bytes1));
    }
    rows[r] = o0;
    rows[p.n_rows + r] = o1;
  }
}

void keep_selection_cpu(const KeepSelParams& p, const StepRanges* ranges, const int32_t* kslots,
                        int32_t* const* kept, int32_t* sel) {
  for (int64_t r = 0; r < p.n_rows; ++r) {
    const int s = int(r / p.n_kv_head);
    const int k = std::min(kslots[s], p.width);
    int32_t* row = sel + r * p.width;
    if (ranges[s].fresh) {
      std::copy_n(row + p.width - k, k, kept[r]);
    } else {
      std::fill(row, row + p.width - k, -1);
      std::copy_n(kept[r], k, row + p.width - k);
    }
  }
}

void index_query_rows_cpu(const IndexQueryParams& p, const float* q, float* out) {
  const int H = p.n_kv_head, D = p.head_dim, G = p.n_head / p.n_kv_head, n_q = p.mean_group ? 1 : G;
  KVT_CHECK(p.rotate_group == 0 || (D % p.rotate_group == 0 && is_power_of_two(p.rotate_group)),
            "index_query: rotation group {} must be a power of two dividing head_dim {}", p.rotate_group, D);
  for (int s = 0; s < p.n_seq; ++s)
    for (int h = 0; h < H; ++h)
      for (int j = 0; j < n_q; ++j) {
        float* o = out + ((int64_t(s) * H + h) * n_q + j) * D;
        const float* qs = q + (int64_t(s) * p.n_head + int64_t(h) * G) * D;
        if (p.mean_group) {
          std::fill(o, o + D, 0.0f);
          for (int g = 0; g < G; ++g)
            for (int d = 0; d < D; ++d) o[d] += qs[int64_t(g) * D + d];
          for (int d = 0; d < D; ++d) o[d] /= float(G);
        } else {
          std::copy_n(qs + int64_t(j) * D, D, o);
        }
        if (p.rotate_group > 0)
          for (int g0 = 0; g0 < D; g0 += p.rotate_group) {
            if (p.signs)
              for (int d = 0; d < p.rotate_group; ++d) o[g0 + d] *= p.signs[d];
            hadamard_transform(o + g0, p.rotate_group);
          }
      }
}

void score_rows_cpu(const ScoreRowsParams& p, const float* q, const uint8_t* const* plane0,
                    const uint8_t* const* plane1, const StepRanges* ranges, float* scores) {
  KVT_CHECK(p.layout != IndexRecLayout::planar_higgs2, "score_rows: the planar index is the GPU's layout");
  KVT_CHECK(!p.cand, "score_rows: the CPU scores candidates that gather_candidates copied, not by id");
  const int H = p.n_kv_head, D = p.head_dim;
  const int64_t n_rows = int64_t(p.n_seq) * H;
  // Jobs of (row, block of chunks): a few rows (3 KV heads) would leave
  // threads idle, so long rows split into blocks of at least kMinBlock chunks.
  constexpr int64_t kMinBlock = 1024;
  ThreadPool& pool = default_pool();
  int64_t n_max = 0;
  for (int64_t r = 0; r < n_rows; ++r) {
    const StepRanges& sr = ranges[r / H];
    n_max = std::max(n_max, p.candidates_only ? sr.c_hi - sr.c_lo : sr.n_chunk);
  }
  const int64_t want = (2 * int64_t(pool.n_threads()) + n_rows - 1) / std::max<int64_t>(n_rows, 1);
  const int64_t n_block = std::max<int64_t>(1, std::min(want, n_max / kMinBlock));
  pool.parallel_for(n_rows * n_block, 1, [&](int64_t j0, int64_t j1, int) {
    std::vector<float> meta;  // [n_q, n_meta]
    for (int64_t job = j0; job < j1; ++job) {
      const int64_t r = job / n_block, b = job % n_block;
      const StepRanges& sr = ranges[r / H];
      QuantSpec fmt = p.fmt.spec;
      if (p.seq_scales) fmt.tensor_scale = p.seq_scales[r / H];
      const int64_t c_row = p.candidates_only ? sr.c_lo : 0;
      const int64_t n_row = p.candidates_only ? sr.c_hi - sr.c_lo : sr.n_chunk;
      KVT_CHECK(n_row <= p.out_stride, "score_rows: {} chunks exceed the row stride {}", n_row, p.out_stride);
      // This job's chunks: [c_row + i0, c_row + i1), written at out + i0.
      const int64_t per = (n_row + n_block - 1) / n_block;
      const int64_t i0 = std::min(n_row, b * per), i1 = std::min(n_row, i0 + per), n = i1 - i0;
      if (n <= 0) continue;
      const int64_t c0 = c_row + i0;
      float* out = scores + r * p.n_q * p.out_stride + i0;
      ScoreParams sp;
      sp.q = q + r * p.n_q * D;
      sp.n_q = p.n_q;
      sp.dim = D;
      sp.codes = plane0[r] + c0 * p.fmt.bytes;
      sp.n_vec = n;
      sp.scores = out;  // [n_q, n] scores, out_stride apart
      sp.score_stride = p.out_stride;
      score(fmt, sp);
      sp.score_stride = 0;
      if (p.layout == IndexRecLayout::residual) {
        const int64_t u0 = c0 / p.m, u1 = (c0 + n + p.m - 1) / p.m;
        meta.resize(size_t(p.n_q) * (u1 - u0));
        sp.codes = plane1[r] + u0 * p.meta.bytes;
        sp.n_vec = u1 - u0;
        sp.scores = meta.data();
        score(p.meta.spec, sp);
        for (int j = 0; j < p.n_q; ++j)
          for (int64_t i = 0; i < n; ++i) out[j * p.out_stride + i] += meta[size_t(j * (u1 - u0) + (c0 + i) / p.m - u0)];
      }
      for (int j = 0; j < p.n_q; ++j)
        for (int64_t i = 0; i < n; ++i) out[j * p.out_stride + i] *= p.scale;
    }
  });
}

namespace {

// log Σ e^x over n scores (−∞ when all are −∞), 8 lanes at a time.
float log_sum_exp(const float* x, int64_t n) {
  __m256 m8 = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(x + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m8);
  float m = -INFINITY;
  for (const float l : lanes) m = std::max(m, l);
  for (; i < n; ++i) m = std::max(m, x[i]);
  if (m == -INFINITY) return m;
  constexpr int64_t kBlock = 512;
  alignas(32) float e[kBlock];
  __m256 sum8 = _mm256_setzero_ps();
  float tail = 0.f;
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t b = std::min(kBlock, n - i0);
    for (int64_t j = 0; j < b; ++j) e[j] = x[i0 + j] - m;
    attn_kernels::exp_avx2(e, b, e);
    int64_t j = 0;
    for (; j + 8 <= b; j += 8) sum8 = _mm256_add_ps(sum8, _mm256_load_ps(e + j));
    for (; j < b; ++j) tail += e[j];
  }
  _mm256_store_ps(lanes, sum8);
  float sum = tail;
  for (const float l : lanes) sum += l;
  return m + std::log(sum);
}

}  // namespace

void gqa_rows_cpu(const GqaRowsParams& p, const float* raw, const StepRanges* ranges, float* out) {
  // f32 with the vector e^x (as the CUDA kernels). Each (row, query)'s
  // log-sum-exp is a job, then blocks of candidates take the best query.
  const int64_t n_rows = int64_t(p.n_seq) * p.n_kv_head;
  std::vector<float> lse(size_t(n_rows * p.n_q));
  ThreadPool& pool = default_pool();
  pool.parallel_for(n_rows * p.n_q, 1, [&](int64_t j0, int64_t j1, int) {
    for (int64_t j = j0; j < j1; ++j)
      lse[size_t(j)] = log_sum_exp(raw + j * p.in_stride, ranges[j / p.n_q / p.n_kv_head].n_chunk);
  });
  constexpr int64_t kBlock = 2048;
  int64_t n_block = 1;
  for (int64_t r = 0; r < n_rows; ++r) {
    const StepRanges& sr = ranges[r / p.n_kv_head];
    n_block = std::max(n_block, (sr.c_hi - sr.c_lo + kBlock - 1) / kBlock);
  }
  pool.parallel_for(n_rows * n_block, 1, [&](int64_t j0, int64_t j1, int) {
    for (int64_t job = j0; job < j1; ++job) {
      const int64_t r = job / n_block, b = job % n_block;
      const StepRanges& sr = ranges[r / p.n_kv_head];
      const int64_t i0 = b * kBlock, i1 = std::min(sr.c_hi - sr.c_lo, i0 + kBlock);
      if (i0 >= i1) continue;
      float* o = out + r * p.out_stride;
      const float* x0 = raw + r * p.n_q * p.in_stride + sr.c_lo;
      std::fill(o + i0, o + i1, -INFINITY);
      for (int j = 0; j < p.n_q; ++j) {
        const float* x = x0 + j * p.in_stride;
        const float l = lse[size_t(r * p.n_q + j)];
        const __m256 l8 = _mm256_set1_ps(l);
        int64_t i = i0;
        for (; i + 8 <= i1; i += 8)
          _mm256_storeu_ps(o + i, _mm256_max_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), l8), _mm256_loadu_ps(o + i)));
        for (; i < i1; ++i) o[i] = std::max(o[i], x[i] - l);  // NaN (no finite score) keeps o[i], as max_ps
      }
    }
  });
}

// CUDA: per (row, query) up to 256 partials (max, sum) and their count.
int64_t gqa_rows_scratch_bytes(int64_t n_rows, int n_q) { return n_rows * n_q * (256 * 8 + 4) + 16; }

int64_t gqa_topk_scratch_bytes(int64_t n_rows, int n_q, int64_t stride) {
  const int64_t nb = (stride + kTopkFilterTile - 1) / kTopkFilterTile;
  const int64_t head = n_rows * (2 + n_q) + n_rows * nb;  // thresholds, modes, log-sum-exps; counts (4 B each)
  const int64_t sampled = ((head * 4 + 15) & ~int64_t(15)) + n_rows * nb * kTopkFilterCap * 8;
  // gqa_score_topk_rows: modes, block counts, thresholds, per-block counts; ids and scores of the kept.
  const int64_t fused = ((n_rows * (3 + n_q + kTopkKeepMaxBlocks) * 4 + 15) & ~int64_t(15)) +
                        n_rows * int64_t(kTopkKeepSlots) * 4 * (1 + n_q);
  return std::max(sampled, fused);
}

void mask_rows_cpu(int64_t n_rows, int n_kv_head, int64_t stride, int n_forced, const int32_t* forced,
                   const StepRanges* ranges, float* scores) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const StepRanges& sr = ranges[r / n_kv_head];
    for (int i = 0; i < n_forced; ++i) {
      const int64_t c = forced[r * n_forced + i];
      if (c >= sr.c_lo && c < sr.c_hi) scores[r * stride + (c - sr.c_lo)] = -INFINITY;
    }
  }
}

namespace {

// Order keys of 8 scores (topk_order_key), biased by 2³¹ so that signed
// compares order them as unsigned keys.
inline __m256i biased_keys8(const float* s) {
  const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
  return _mm256_xor_si256(u, _mm256_srli_epi32(_mm256_srai_epi32(u, 31), 1));
}

// The k best of the n scores s[0, n) by (order key, lower index), written
// as positions ascending to sel[0, k). A strided sample of the keys bounds
// the k-th key from below; only the candidates at or above that bound (a
// few k) take part in the exact selection, so the result is the one a full
// nth_element gives. A bound that leaves fewer than k candidates falls
// back to all n.
void top_k_positions(const float* s, int64_t n, int64_t k, int32_t* sel, std::vector<uint32_t>& pos,
                     std::vector<uint64_t>& keyed, std::vector<uint64_t>& work) {
  if (k <= 0) return;
  auto keyed_of = [&](int64_t i) { return uint64_t(topk_order_key(s[i])) << 32 | uint32_t(0xffffffffu - uint32_t(i)); };
  pos.clear();
  keyed.clear();
  constexpr int64_t kSample = 256;
  if (n >= 8 * kSample && k * 16 <= n) {
    uint32_t sample[kSample];
    for (int64_t j = 0; j < kSample; ++j) sample[j] = topk_order_key(s[j * n / kSample]);
    // The (r+1)-th largest sampled key: about (r+1)/kSample of the row lies
    // at or above it, r chosen for ~1.25 k of n plus a margin.
    const int64_t r = std::min<int64_t>(kSample - 1, (k * kSample * 5 + 4 * n - 1) / (4 * n) + 8);
    std::nth_element(sample, sample + r, sample + kSample, std::greater<uint32_t>());
    const __m256i bound = _mm256_set1_epi32(int32_t(sample[r] ^ 0x80000000u));
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint32_t below = uint32_t(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(bound, biased_keys8(s + i)))));
      for (uint32_t at = ~below & 0xffu; at; at &= at - 1) pos.push_back(uint32_t(i + std::countr_zero(at)));
    }
    for (; i < n; ++i)
      if (topk_order_key(s[i]) >= sample[r]) pos.push_back(uint32_t(i));
  }
  if (int64_t(pos.size()) < k) {
    pos.resize(size_t(n));
    std::iota(pos.begin(), pos.end(), 0u);
  }
  for (const uint32_t i : pos) keyed.push_back(keyed_of(i));
  // The k-th largest keyed value; keys are distinct (they carry the
  // position), so exactly k candidates reach it.
  uint64_t kth = 0;
  if (int64_t(keyed.size()) > k) {
    work.assign(keyed.begin(), keyed.end());
    std::nth_element(work.begin(), work.begin() + (k - 1), work.end(), std::greater<uint64_t>());
    kth = work[size_t(k - 1)];
  }
  int64_t o = 0;
  for (size_t j = 0; j < keyed.size(); ++j)
    if (keyed[j] >= kth) sel[o++] = int32_t(pos[j]);
  KVT_CHECK(o == k, "topk: {} of {} candidates reach the k-th key, want {}", o, keyed.size(), k);
}

}  // namespace

void topk_rows_cpu(int64_t n_rows, int n_kv_head, int64_t stride, int kmax, const float* scores,
                   const StepRanges* ranges, int32_t* out) {
  default_pool().parallel_for(n_rows, 1, [&](int64_t r0, int64_t r1, int) {
    std::vector<uint32_t> pos;
    std::vector<uint64_t> keyed, work;
    for (int64_t r = r0; r < r1; ++r) {
      const StepRanges& sr = ranges[r / n_kv_head];
      const int64_t n = sr.c_hi - sr.c_lo;
      const int64_t k = std::max<int64_t>(0, std::min<int64_t>(std::min<int64_t>(sr.k, kmax), n));
      int32_t* o = out + r * kmax;
      for (int64_t i = 0; i < kmax - k; ++i) o[i] = -1;
      int32_t* sel = o + (kmax - k);
      top_k_positions(scores + r * stride, n, k, sel, pos, keyed, work);
      for (int64_t i = 0; i < k; ++i) sel[i] += int32_t(sr.c_lo);
    }
  });
}

void expand_rows_cpu(const ExpandRowsParams& p, const int32_t* chunks, const int32_t* forced,
                     const StepRanges* ranges, int32_t* tokens) {
  const int64_t width = int64_t(p.kmax) * p.chunk;
  std::vector<int32_t> keep;
  for (int64_t r = 0; r < p.n_rows; ++r) {
    const StepRanges& sr = ranges[r / p.n_kv_head];
    keep.clear();
    for (int i = 0; i < p.kmax; ++i) {
      const int32_t c = chunks[r * p.kmax + i];
      if (c < 0) continue;
      if (forced && std::binary_search(forced + r * p.n_forced, forced + (r + 1) * p.n_forced, c)) continue;
      for (int t = 0; t < p.chunk; ++t) {
        const int64_t tok = int64_t(c) * p.chunk + t;
        if (tok >= p.sink && tok < sr.win_lo) keep.push_back(int32_t(tok));
      }
    }
    int32_t* o = tokens + r * width;
    const int64_t pad = width - int64_t(keep.size());
    std::fill(o, o + pad, -1);
    std::copy(keep.begin(), keep.end(), o + pad);
  }
}

void resident_list_cpu(const ResidentListParams& p, const int32_t* forced, const StepRanges* ranges, int32_t* slots) {
  for (int64_t r = 0; r < p.n_rows; ++r) {
    const StepRanges& sr = ranges[r / p.n_kv_head];
    int32_t* o = slots + r * p.n_slots;
    int j = 0;
    for (int64_t t = 0; t < std::min<int64_t>(sr.n, p.sink); ++t) o[j++] = int32_t(t);
    for (int64_t t = sr.win_lo; t < sr.n; ++t) o[j++] = int32_t(p.sink + t % p.ring);
    const int n_out = int(sr.n_out / p.chunk);  // the row's outlier chunks: the last n_out of forced[r]
    for (int i = 0; i < n_out && forced; ++i) {
      const int64_t ch = forced[r * p.n_forced + (p.n_forced - n_out) + i];
      for (int t = 0; t < p.chunk; ++t) {
        const int64_t tok = ch * p.chunk + t;
        if (tok >= p.sink && tok < sr.win_lo) o[j++] = int32_t(p.sink + p.ring + int64_t(i) * p.chunk + t);
      }
    }
    KVT_CHECK(j <= p.n_slots, "resident_list: {} slots exceed {}", j, p.n_slots);
    for (; j < p.n_slots; ++j) o[j] = -1;
  }
}

}  // namespace kvtier
