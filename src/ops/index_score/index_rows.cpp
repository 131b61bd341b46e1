// index_rows.h's dispatchers: the one place that picks the CPU or CUDA version.
#include "core/status.h"
#include "ops/index_score/index_rows.h"
#include "ops/quant/quant_layout.h"
#ifdef KVT_CUDA
#include "ops/index_score/index_rows_cuda.h"
#endif

#include <atomic>
#include <cstdlib>
#include <string>

namespace kvtier {

namespace {
std::atomic<int64_t> g_cpu_calls{0};
}  // namespace
int64_t cpu_decode_op_calls() { return g_cpu_calls.load(); }
void note_cpu_decode_op() { g_cpu_calls.fetch_add(1, std::memory_order_relaxed); }

LutShape lut_shape(const QuantSpec& fmt, int dim) {
  LutShape s;
  const bool higgs = fmt.kind == QuantKind::higgs;
  if (!(higgs || fmt.kind == QuantKind::uniform || fmt.kind == QuantKind::binary) || dim < 1 || dim > 256) return s;
  if (fmt.uniform_levels) return s;  // U<n> grids score in integers (quant_format.h), not through f32 tables
  const quant_layout::Grouped l = quant_layout::grouped_layout(fmt, dim);
  const bool whole_bytes = (l.bits == 1 || l.bits == 2 || l.bits == 4 || l.bits == 8) &&
                           int64_t(l.n_code) * l.bits == 8 * int64_t(l.code_bytes);
  const int64_t bytes = int64_t(bytes_per_vector(fmt, dim));
  if (!whole_bytes || bytes > 160) return s;
  s.n_pos = l.n_group * int(l.code_bytes);
  s.dim = dim;
  s.n_group = l.n_group;
  s.grid_floats = higgs ? fmt.grid_size * fmt.grid_dim : 0;
  s.rec_bytes = bytes;
  return s;
}

int table_blocks_per_row(int64_t n_rows, int64_t slots, int max_per_row) {
  if (n_rows <= 0 || slots <= 0 || max_per_row <= 1) return 1;
  // Busy fraction of the slots over the launch's waves; a larger count must
  // gain 2 points to be taken (each block builds its table again).
  int best = 1;
  double best_busy = 0;
  for (int bx = 1; bx <= max_per_row; ++bx) {
    const int64_t blocks = n_rows * bx, waves = (blocks + slots - 1) / slots;
    const double busy = double(blocks) / double(waves * slots);
    if (busy > best_busy + 0.02) best = bx, best_busy = busy;
    if (best_busy >= 0.95) break;
  }
  return best;
}

int lut_queries_per_pass(const QuantSpec& fmt, int dim) {
  const LutShape s = lut_shape(fmt, dim);
  if (s.n_pos == 0) return 0;
  for (int nq : {4, 2, 1})
    if (lut_smem(s, nq).floats * 4 <= kLutMaxSmem) return nq;
  return 0;
}

PlanarScorer planar_scorer_from_name(std::string_view name) {
  if (name == "xor") return PlanarScorer::xor_table;
  if (name == "rotated") return PlanarScorer::rotated_table;
  if (name == "mma") return PlanarScorer::mma;
  if (name == "mma16") return PlanarScorer::mma16;
  fail("unknown planar scorer '{}' (xor, rotated, mma, mma16)", name);
}

const char* planar_scorer_name(PlanarScorer s) {
  switch (s) {
    case PlanarScorer::automatic: return "automatic";
    case PlanarScorer::xor_table: return "xor";
    case PlanarScorer::rotated_table: return "rotated";
    case PlanarScorer::mma: return "mma";
    case PlanarScorer::mma16: return "mma16";
  }
  return "?";
}

PlanarScorer planar_scorer_resolved(PlanarScorer s) {
  if (s != PlanarScorer::automatic) return s;
  static const PlanarScorer from_env = [] {
    const char* e = std::getenv("KVT_PLANAR_SCORER");
    return e && *e ? planar_scorer_from_name(e) : PlanarScorer::mma16;
  }();
  return from_env;
}

bool score_rows_by_table(const ScoreRowsParams& p) {
  switch (p.layout) {
    case IndexRecLayout::planar_higgs2: return false;
    case IndexRecLayout::records: return lut_queries_per_pass(p.fmt.spec, p.head_dim) > 0;
    case IndexRecLayout::residual:
      return p.meta_scratch && lut_queries_per_pass(p.fmt.spec, p.head_dim) > 0 &&
             lut_queries_per_pass(p.meta.spec, p.head_dim) > 0;
  }
  return false;
}

bool score_rows_leaves_partials(const ScoreRowsParams& p) {
  return p.n_q > 1 && (p.layout == IndexRecLayout::planar_higgs2 || score_rows_by_table(p));
}

bool score_rows_reads_candidates(const Exec& x, const ScoreRowsParams& p) {
  return x.cuda() && p.layout == IndexRecLayout::planar_higgs2 && p.head_dim == 128 && !p.fmt.spec.uniform_levels &&
         planar_scorer_resolved(p.planar_scorer) == PlanarScorer::mma16;
}

void step_plan_rows(const Exec& x, const StepPlanParams& p, const int64_t* n, const int32_t* budget_chunks, const int32_t* n_outlier, StepRanges* out) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::step_plan_rows(x, p, n, budget_chunks, n_outlier, out);
#endif
  KVT_CHECK(!x.cuda(), "step_plan_rows: built without CUDA");
  note_cpu_decode_op();
  step_plan_rows_cpu(p, n, budget_chunks, n_outlier, out);
}

void reselect_rows(const Exec& x, int n_seq, int every, int rescore, int64_t* const* last,
                   const StepRanges* ranges, StepRanges* out) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::reselect_rows(x, n_seq, every, rescore, last, ranges, out);
#endif
  KVT_CHECK(!x.cuda(), "reselect_rows: built without CUDA");
  note_cpu_decode_op();
  reselect_rows_cpu(n_seq, every, rescore, last, ranges, out);
}

void candidate_rows(const Exec& x, const CandidateRowsParams& p, const StepRanges* ranges, int32_t* const* cand,
                    int32_t* sel) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::candidate_rows(x, p, ranges, cand, sel);
#endif
  KVT_CHECK(!x.cuda(), "candidate_rows: built without CUDA");
  note_cpu_decode_op();
  candidate_rows_cpu(p, ranges, cand, sel);
}

void gather_candidates(const Exec& x, const GatherCandParams& p, const StepRanges* ranges,
                       const int32_t* const* cand, const uint8_t* const* plane0, const uint8_t* const* plane1,
                       uint8_t* scratch0, uint8_t* scratch1, const uint8_t** rows) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::gather_candidates(x, p, ranges, cand, plane0, plane1, scratch0, scratch1, rows);
#endif
  KVT_CHECK(!x.cuda(), "gather_candidates: built without CUDA");
  note_cpu_decode_op();
  gather_candidates_cpu(p, ranges, cand, plane0, plane1, scratch0, scratch1, rows);
}

void keep_selection(const Exec& x, const KeepSelParams& p, const StepRanges* ranges, const int32_t* kslots,
                    int32_t* const* kept, int32_t* sel) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::keep_selection(x, p, ranges, kslots, kept, sel);
#endif
  KVT_CHECK(!x.cuda(), "keep_selection: built without CUDA");
  note_cpu_decode_op();
  keep_selection_cpu(p, ranges, kslots, kept, sel);
}

void index_query_rows(const Exec& x, const IndexQueryParams& p, const void* q, float* out) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::index_query_rows(x, p, q, out);
#endif
  KVT_CHECK(!x.cuda(), "index_query_rows: built without CUDA");
  note_cpu_decode_op();
  index_query_rows_cpu(p, static_cast<const float*>(q), out);
}

void score_rows(const Exec& x, const ScoreRowsParams& p, const float* q, const uint8_t* const* plane0, const uint8_t* const* plane1, const StepRanges* ranges, float* scores) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::score_rows(x, p, q, plane0, plane1, ranges, scores);
#endif
  KVT_CHECK(!x.cuda(), "score_rows: built without CUDA");
  note_cpu_decode_op();
  score_rows_cpu(p, q, plane0, plane1, ranges, scores);
}

void gqa_rows(const Exec& x, const GqaRowsParams& p, const float* raw, const StepRanges* ranges, float* out) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::gqa_rows(x, p, raw, ranges, out);
#endif
  KVT_CHECK(!x.cuda(), "gqa_rows: built without CUDA");
  note_cpu_decode_op();
  gqa_rows_cpu(p, raw, ranges, out);
}

void mask_rows(const Exec& x, int64_t n_rows, int n_kv_head, int64_t stride, int n_forced, const int32_t* forced, const StepRanges* ranges, float* scores) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::mask_rows(x, n_rows, n_kv_head, stride, n_forced, forced, ranges, scores);
#endif
  KVT_CHECK(!x.cuda(), "mask_rows: built without CUDA");
  note_cpu_decode_op();
  mask_rows_cpu(n_rows, n_kv_head, stride, n_forced, forced, ranges, scores);
}

void topk_rows(const Exec& x, int64_t n_rows, int n_kv_head, int64_t stride, int kmax, const float* scores, const StepRanges* ranges, int32_t* out) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::topk_rows(x, n_rows, n_kv_head, stride, kmax, scores, ranges, out);
#endif
  KVT_CHECK(!x.cuda(), "topk_rows: built without CUDA");
  note_cpu_decode_op();
  topk_rows_cpu(n_rows, n_kv_head, stride, kmax, scores, ranges, out);
}

void gqa_topk_rows(const Exec& x, const GqaRowsParams& p, const float* raw, const StepRanges* ranges, int kmax,
                   float* agg, int32_t* out) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::gqa_topk_rows(x, p, raw, ranges, kmax, out);
#endif
  KVT_CHECK(!x.cuda(), "gqa_topk_rows: built without CUDA");
  note_cpu_decode_op();
  gqa_rows_cpu(p, raw, ranges, agg);
  topk_rows_cpu(int64_t(p.n_seq) * p.n_kv_head, p.n_kv_head, p.out_stride, kmax, agg, ranges, out);
}

void gqa_score_topk_rows(const Exec& x, const ScoreRowsParams& sp, const GqaRowsParams& gp, const float* q,
                         const uint8_t* const* plane0, const uint8_t* const* plane1, const StepRanges* ranges,
                         int kmax, float* scores, float* agg, int32_t* out) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::gqa_score_topk_rows(x, sp, gp, q, plane0, plane1, ranges, kmax, scores, out);
#endif
  score_rows(x, sp, q, plane0, plane1, ranges, scores);
  gqa_topk_rows(x, gp, scores, ranges, kmax, agg, out);
}

void expand_rows(const Exec& x, const ExpandRowsParams& p, const int32_t* chunks, const int32_t* forced, const StepRanges* ranges, int32_t* tokens) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::expand_rows(x, p, chunks, forced, ranges, tokens);
#endif
  KVT_CHECK(!x.cuda(), "expand_rows: built without CUDA");
  note_cpu_decode_op();
  expand_rows_cpu(p, chunks, forced, ranges, tokens);
}

void resident_list(const Exec& x, const ResidentListParams& p, const int32_t* forced, const StepRanges* ranges, int32_t* slots) {
#ifdef KVT_CUDA
  if (x.cuda()) return cuda::resident_list(x, p, forced, ranges, slots);
#endif
  KVT_CHECK(!x.cuda(), "resident_list: built without CUDA");
  note_cpu_decode_op();
  resident_list_cpu(p, forced, ranges, slots);
}

}  // namespace kvtier
