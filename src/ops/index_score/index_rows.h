// The decode step's scoring and selection over a batch of rows (row r =
// sequence s · n_kv_head + KV head), each row with its own index storage and
// its own lengths, so that sequences of any length share one launch:
//   index_query   the query each row scores with (mean of the GQA group, or
//                 each of its heads), rotated for a HIGGS index;
//   score_rows    q · landmark for chunks [0, n_chunk[s]) (every chunk; with
//                 gqa=mean only the candidates [c_lo[s], c_hi[s])), reading
//                 the records in place (no dequantized copy of the index);
//   gqa_rows      ShadowKV's GQA aggregation over the candidates: per query
//                 the softmax over all n_chunk scores, then the max over the
//                 group's queries, in log form;
//   mask_rows     chunks forced resident (shadowkv outliers) out of the race;
//   topk_rows     the k[s] best candidates per row, as chunk ids ascending,
//                 right-aligned in kmax slots with −1 before them;
//   expand_rows   chunk ids → token ids (ascending, −1 first), dropping
//                 tokens that are resident (sinks, the window, outliers);
//   reselect_rows, keep_selection  (policy reselect=N) which sequences pick
//                 anew this step, and the picks kept for the steps between;
//   candidate_rows, gather_candidates  (and rescore=D) the candidates rescored
//                 between picks, and their records where scoring reads them.
// The CPU functions (index_rows_cpu.cpp) are the specification the CUDA ones
// are tested against; dispatchers choose by Exec (index_rows.cpp).
#pragma once
#include <cstdint>
#include <string_view>

#include "backend/device.h"
#include "ops/kv_append/kv_write.h"

namespace kvtier {

// Per sequence, for one decode step (all layers share it): computed from the
// tokens held by step_plan_rows.
struct StepRanges {
  int64_t n = 0;        // tokens held, the current one included
  int64_t n_chunk = 0;  // indexed chunks: [0, n_chunk) cover tokens [0, n_chunk·chunk)
  int64_t c_lo = 0, c_hi = 0;  // candidate chunks
  int64_t k = 0;        // chunks to select: min(kmax_chunks, c_hi − c_lo)
  int64_t n_res = 0;    // resident tokens attended (sinks ∪ window; outliers aside)
  int64_t win_lo = 0;   // first token of the resident window
  int64_t n_out = 0;    // outlier tokens resident per head (shadowkv)
  int64_t fresh = 1;    // 1: the step selects anew; 0: it keeps its last selection (reselect_rows)
};

struct StepPlanParams {
  int n_seq = 0;
  int chunk = 1, unit = 1;
  int sink = 0, local = 0;
  int ring = 0;
  int32_t kmax = 0;  // chunks selected per row at most (budget / chunk, ≥ 1)
};
// n: [n_seq] tokens held; budget_chunks: [n_seq] (the sequence's budget / chunk);
// n_outlier: [n_seq] outlier tokens per head, or null → out [n_seq]
void step_plan_rows(const Exec& x, const StepPlanParams& p, const int64_t* n, const int32_t* budget_chunks,
                    const int32_t* n_outlier, StepRanges* out);
void step_plan_rows_cpu(const StepPlanParams& p, const int64_t* n, const int32_t* budget_chunks,
                        const int32_t* n_outlier, StepRanges* out);

// q: [n_seq, n_head, head_dim] (CPU f32, CUDA bf16) → out [n_seq, n_kv_head, n_q, head_dim] f32,
// n_q = 1 (mean of the group) or the group; rotated by the orthonormal Hadamard of
// rotate_group values (after ±1 signs) when rotate_group > 0.
struct IndexQueryParams {
  int n_seq = 0, n_head = 0, n_kv_head = 0, head_dim = 0;
  bool mean_group = true;
  int rotate_group = 0;
  const float* signs = nullptr;  // [rotate_group] or null
};
void index_query_rows(const Exec& x, const IndexQueryParams& p, const void* q, float* out);
void index_query_rows_cpu(const IndexQueryParams& p, const float* q, float* out);

enum class PlanarScorer { automatic, xor_table, rotated_table, mma, mma16 };

// CUDA, gqa_score_topk_rows' scoring passes (set by it; off elsewhere): per
// row a path (mode) and per query a threshold θ. Pass 1: a row of mode 1
// writes no scores; each of its blocks appends the candidates some query
// scores ≥ θ on (chunk id and the n_q scores) to its own region of the
// row's list (kTopkKeepSlots / blocks slots; count may pass that: the
// slots past it are not written); other rows write every score. Pass 2:
// only rows of mode 4 run, writing every score.
constexpr int kTopkKeepSlots = 32768;    // a row's kept list
constexpr int kTopkKeepMaxBlocks = 256;  // scorer blocks per row at most
struct TopkKeep {
  int pass = 0;                   // 0: off
  const int32_t* mode = nullptr;  // [rows]
  const float* theta = nullptr;   // [rows, n_q]
  uint32_t* count = nullptr;      // [rows, kTopkKeepMaxBlocks]: kept per block
  int32_t* nblk = nullptr;        // [rows]: blocks per row
  int32_t* ids = nullptr;         // [rows, kTopkKeepSlots] chunk ids
  float* kept = nullptr;          // [rows, n_q, kTopkKeepSlots] their scores
};
PlanarScorer planar_scorer_from_name(std::string_view name);  // xor, rotated, mma, mma16; else fails
const char* planar_scorer_name(PlanarScorer s);
// automatic → $KVT_PLANAR_SCORER if set, else the default; others unchanged.
PlanarScorer planar_scorer_resolved(PlanarScorer s);

struct ScoreRowsParams {
  int n_seq = 0, n_kv_head = 0, head_dim = 0;
  int n_q = 1;               // queries per row (> 1: per-query scores for gqa_rows)
  IndexRecLayout layout = IndexRecLayout::records;
  RecordFormat fmt;          // records / residual format (planar: unused)
  RecordFormat meta;         // residual
  int m = 1;                 // residual: chunks per meta record
  bool candidates_only = false;  // score [c_lo, c_hi) only (written from index 0), else [0, n_chunk)
  float scale = 1.f;         // multiplies every score (1/√head_dim: ShadowKV's softmax temperature)
  const float* seq_scales = nullptr;  // [n_seq] nvfp4 records: each sequence's per-tensor scale
  int64_t out_stride = 0;    // floats between (row, query) score rows
  // CUDA, planar index, n_q > 1: also leave each query's softmax partials
  // (max, sum of e^(s − max) per block of tokens) in gqa_rows' scratch
  // (gqa_rows_scratch_bytes), so that gqa_rows with partials_ready skips its
  // pass over the scores. Ignored elsewhere.
  void* gqa_scratch = nullptr;
  // CUDA, residual layout: [rows, n_q, residual_meta_stride(out_stride, m)]
  // f32 where the meta-landmarks are scored once each (then added to their m
  // chunks' residual scores), which lets both run on the byte-table scorer
  // below. Null: one thread per chunk decodes its meta record and residual.
  float* meta_scratch = nullptr;
  // CUDA, table scorers (planar higgs2, byte table): blocks per row; 0 lets
  // table_blocks_per_row choose (tests and benchmarks force others).
  int blocks_per_row = 0;
  // CUDA, planar index: which scorer (score_rows_cuda.cu). xor and rotated
  // are the per-block lookup table's two layouts (the same scores up to the
  // order of the f32 sums); mma decodes the codes to the grid's fp16 points
  // and multiplies on the tensor cores, the queries split into fp16 high and
  // low parts (the same scores up to the queries' 22 bits and the order of
  // the sums); mma16 is mma with the tokens as the products' rows (16 per
  // product) in fewer instructions per token (the same scores up to the
  // order of the sums). automatic: $KVT_PLANAR_SCORER if set (xor, rotated,
  // mma, mma16), else the default, mma16.
  PlanarScorer planar_scorer = PlanarScorer::automatic;
  // rescore=D, where score_rows_reads_candidates: per row its candidates'
  // token ids (candidate_rows). A row whose sequence rescores (ranges
  // fresh = 0; its chunks 0 .. W − 1 are the candidates) then reads
  // candidate i's record at token cand[r][i] of plane0/plane1 in place, as
  // if gather_candidates had copied it; fresh rows are scored as without it.
  const int32_t* const* cand = nullptr;
  TopkKeep keep;
};
constexpr int64_t residual_meta_stride(int64_t out_stride, int m) { return out_stride / (m > 0 ? m : 1) + 2; }
// q: [rows, n_q, head_dim] f32 (index_query_rows); plane0/plane1 as index_write;
// scores: [rows, n_q, out_stride] f32
void score_rows(const Exec& x, const ScoreRowsParams& p, const float* q, const uint8_t* const* plane0,
                const uint8_t* const* plane1, const StepRanges* ranges, float* scores);
void score_rows_cpu(const ScoreRowsParams& p, const float* q, const uint8_t* const* plane0,
                    const uint8_t* const* plane1, const StepRanges* ranges, float* scores);

// CUDA's byte-table scorer (score_lut_cuda.cu), for records whose codes fill
// whole bytes in every group: HIGGS with 2-, 4-, 16- or 256-point grids
// (higgs4, higgs2, higgs1, higgs0.5), 1bit, and int1/2/4/8 whose groups fill
// bytes. Each block builds, for every code-byte position of a record and
// every byte value, the dot product of its queries with the values that byte
// stands for (the rotated query for HIGGS; Σ code·q for uniform/1bit, whose
// min·Σq is added per group), so a record scores in one shared-memory read
// per code byte, like the planar higgs2 kernel. A warp copies its 32
// records' bytes to shared memory with coalesced 4-byte loads first.
struct LutShape {
  int n_pos = 0;         // code bytes per record (0: the format does not qualify)
  int dim = 0, n_group = 0;
  int grid_floats = 0;   // HIGGS: the grid, staged in shared memory
  int64_t rec_bytes = 0;
};
constexpr int kLutThreads = 512;  // a large table leaves one block per SM: many warps hide its latency
constexpr int64_t kLutMaxSmem = 226 * 1024;  // an H100/H200 block's 227 KB, less 1 KB for static shared memory
struct LutSmem {  // offsets and sizes in floats
  int64_t lut = 0, qs = 0, qsum = 0, grid = 0, stage = 0, stage_words = 0, floats = 0;
};
constexpr LutSmem lut_smem(const LutShape& s, int nq) {
  auto pad4 = [](int64_t v) { return (v + 3) & ~int64_t(3); };
  LutSmem m;
  m.lut = 0;
  m.qs = int64_t(256) * s.n_pos * nq;
  m.qsum = m.qs + pad4(int64_t(nq) * s.dim);
  m.grid = m.qsum + pad4(int64_t(nq) * s.n_group);
  m.stage = m.grid + pad4(s.grid_floats);
  m.stage_words = (32 * s.rec_bytes + 3) / 4 + 2;  // 32 records from any byte offset
  m.floats = m.stage + (kLutThreads / 32) * m.stage_words;
  return m;
}
LutShape lut_shape(const QuantSpec& fmt, int dim);
// Blocks per row of a table scorer, whose every block builds its lookup
// table once and then scores an equal stretch of its row, on a GPU that runs
// `slots` such blocks at once (SMs × blocks per SM): the smallest count whose
// whole waves keep ≥ 95 % of the slots busy, else the busiest up to
// max_per_row. 8 rows on 132 slots: 16 (one wave); 96 rows: 4 (384 blocks
// in 3 waves, 97 % busy, where one block per row left 36 SMs idle).
int table_blocks_per_row(int64_t n_rows, int64_t slots, int max_per_row);
// Queries per pass of that scorer: 4, 2 or 1, as many as its table lets
// fit in an SM's shared memory; 0 when fmt does not qualify.
int lut_queries_per_pass(const QuantSpec& fmt, int dim);
// Whether CUDA's score_rows scores p's records (or residual landmarks, given
// meta_scratch) by that scorer.
bool score_rows_by_table(const ScoreRowsParams& p);
// Whether score_rows on x reads a rescoring row's candidates by id (p.cand):
// CUDA's mma16 planar scorer does; elsewhere gather_candidates copies them.
bool score_rows_reads_candidates(const Exec& x, const ScoreRowsParams& p);
// Whether CUDA's score_rows, given p, also leaves gqa_rows' softmax partials
// in p.gqa_scratch (the planar and byte-table scorers do; the others ignore it).
bool score_rows_leaves_partials(const ScoreRowsParams& p);

// raw: [rows, n_q, in_stride] scores over [0, n_chunk) → out: [rows, out_stride],
// out[i] = max_j (raw_j[c_lo + i] − lse_j) for i < c_hi − c_lo.
struct GqaRowsParams {
  int n_seq = 0, n_kv_head = 0, n_q = 1;
  int64_t in_stride = 0, out_stride = 0;
  void* scratch = nullptr;  // CUDA: gqa_rows_scratch_bytes of device memory
  bool partials_ready = false;  // CUDA: score_rows left the partials in scratch (ScoreRowsParams::gqa_scratch)
  // CUDA, gqa_topk_rows: gqa_topk_scratch_bytes(rows, n_q, in_stride) of
  // device memory lets long rows take the sampled-threshold path (see
  // there); null: every row takes the cluster top-k.
  void* topk_scratch = nullptr;
  // gqa_score_topk_rows: 1 fuse where it can, 0 never, −1 as
  // $KVT_GQA_TOPK says ("fused": fuse; unset: not yet, it is not faster).
  int fuse = -1;
  // Tests of gqa_score_topk_rows: added to query 0's keep threshold, to
  // drive rows onto its fallbacks.
  float keep_test_bias = 0.f;
};
int64_t gqa_rows_scratch_bytes(int64_t n_rows, int n_q);
// The sampled-threshold top-k's filter: candidates per block, and kept
// candidates a block may hold (more sends its row to the cluster top-k).
constexpr int kTopkFilterTile = 4096;
constexpr int kTopkFilterCap = 1024;
int64_t gqa_topk_scratch_bytes(int64_t n_rows, int n_q, int64_t stride);
void gqa_rows(const Exec& x, const GqaRowsParams& p, const float* raw, const StepRanges* ranges, float* out);
void gqa_rows_cpu(const GqaRowsParams& p, const float* raw, const StepRanges* ranges, float* out);

// scores [rows, stride] over candidates c_lo..: forced chunk ids (ascending,
// n_forced per row, forced[r][0..n_forced)) become −inf.
void mask_rows(const Exec& x, int64_t n_rows, int n_kv_head, int64_t stride, int n_forced,
               const int32_t* forced, const StepRanges* ranges, float* scores);
void mask_rows_cpu(int64_t n_rows, int n_kv_head, int64_t stride, int n_forced, const int32_t* forced,
                   const StepRanges* ranges, float* scores);

// scores [rows, stride] over candidates i = 0 .. c_hi − c_lo; out [rows, kmax]:
// the k[s] best (higher first, ties to the lower chunk) as chunk ids c_lo + i,
// ascending, in out[kmax − k ..], −1 before.
void topk_rows(const Exec& x, int64_t n_rows, int n_kv_head, int64_t stride, int kmax, const float* scores,
               const StepRanges* ranges, int32_t* out);
void topk_rows_cpu(int64_t n_rows, int n_kv_head, int64_t stride, int kmax, const float* scores,
                   const StepRanges* ranges, int32_t* out);

// gqa_rows, then topk_rows over its output (rows without forced chunks). On
// CUDA the aggregate is never written: the top-k reads each candidate's
// queries and subtracts their log-sum-exps as it loads them (agg unused);
// on the CPU through agg ([rows, p.out_stride] f32). With p.topk_scratch, a
// long row is first filtered: a sample of its aggregates sets a threshold
// that, by a wide margin, more than k candidates reach; one pass keeps the
// candidates at or above it, and the exact top-k runs over those. Rows
// where the filter kept too few or too many fall back to the full top-k.
// The picks are the same either way.
void gqa_topk_rows(const Exec& x, const GqaRowsParams& p, const float* raw, const StepRanges* ranges, int kmax,
                   float* agg, int32_t* out);

// score_rows (sp, per-query scores over [0, n_chunk), its softmax partials
// in gp.scratch), then gqa_topk_rows: the same picks. On CUDA, where
// fusing is on (gp.fuse), the planar index is scored on the tensor cores
// (mma16, U4) in one launch per row (n_q ≤ 4) and gp.topk_scratch is
// given, a long row's scores
// are never written: a sample of the row sets per-query thresholds θ_j =
// T̂ + ℓ̂_j (ℓ̂_j its estimate of query j's log-sum-exp, T̂ a level about 2k
// of the sampled aggregates reach), the scorer keeps the candidates some
// query reaches θ_j on, and the exact top-k runs over those. It is exact
// when its k-th aggregate A_k exceeds every θ_j − ℓ_j: a candidate left
// out has all s_j < θ_j, so its aggregate max_j (s_j − ℓ_j) < A_k. A row
// that fails the check (or kept too few or too many) is scored again in
// full and takes the cluster top-k. scores: [rows, n_q, stride] (what
// score_rows writes; a fused row's stay unwritten); agg as gqa_topk_rows.
void gqa_score_topk_rows(const Exec& x, const ScoreRowsParams& sp, const GqaRowsParams& gp, const float* q,
                         const uint8_t* const* plane0, const uint8_t* const* plane1, const StepRanges* ranges,
                         int kmax, float* scores, float* agg, int32_t* out);

// chunks [rows, kmax] (topk_rows) → tokens [rows, kmax·chunk], ascending, −1
// first; a token is dropped when t < sink, t ≥ win_lo, or its chunk is forced.
struct ExpandRowsParams {
  int64_t n_rows = 0;
  int n_kv_head = 0, kmax = 0, chunk = 1, sink = 0, n_forced = 0;
};
void expand_rows(const Exec& x, const ExpandRowsParams& p, const int32_t* chunks, const int32_t* forced,
                 const StepRanges* ranges, int32_t* tokens);
void expand_rows_cpu(const ExpandRowsParams& p, const int32_t* chunks, const int32_t* forced,
                     const StepRanges* ranges, int32_t* tokens);

// Policy reselect=N (N > 1): whether each sequence selects anew this step.
// last[s] points at the sequence's token count when it last selected (0:
// never), and with rescore > 0 at its candidate count after it. It selects
// anew when it never did, when it holds no more tokens than then (it was
// rewound), or when N tokens were added since, and then stores n there (and
// candidate_count(ranges[s], rescore) after it). out[s] is ranges[s]
// (fresh = 1), or for a sequence that keeps its selection ranges[s] without
// candidates (n_chunk = c_lo = c_hi = k = 0, fresh = 0), so that scoring and
// top-k given out skip its rows; with rescore > 0 its candidates instead, as
// chunks 0 .. W − 1 (n_chunk = c_hi = W, c_lo = 0, k = min(k, W), fresh = 0),
// which gather_candidates puts where score_rows reads them.
void reselect_rows(const Exec& x, int n_seq, int every, int rescore, int64_t* const* last,
                   const StepRanges* ranges, StepRanges* out);
void reselect_rows_cpu(int n_seq, int every, int rescore, int64_t* const* last, const StepRanges* ranges,
                       StepRanges* out);

// Policy rescore=D: the candidates a row rescores on the steps between its
// picks. A pick of k ids p_0 < .. < p_{k−1} in [c_lo, c_hi) becomes runs of
// D + 1 ids: run i starts at p_i, or right after run i − 1 where that is
// later, and is pushed left where the runs would reach c_hi, so that the
// k·(D + 1) candidates are distinct, ascending and in [c_lo, c_hi). Where
// that is no fewer than c_hi − c_lo, every id there is a candidate.
constexpr int64_t candidate_count(const StepRanges& r, int rescore) {
  const int64_t n = r.c_hi - r.c_lo, w = r.k * (int64_t(rescore) + 1);
  return w < n ? w : n;
}
// sel [rows, kmax] (topk_rows' output); cand[r]: the row's candidates, as
// many as candidate_count. A fresh row's pick (ranges[s].fresh, its k ids
// right-aligned in sel) becomes its candidates; a kept row's sel holds
// positions into its candidates (the top-k of the rescored ones), which
// become the candidates' ids in place (ascending, as the positions were).
struct CandidateRowsParams {
  int64_t n_rows = 0;
  int n_kv_head = 0, kmax = 0, rescore = 0;
};
void candidate_rows(const Exec& x, const CandidateRowsParams& p, const StepRanges* ranges, int32_t* const* cand,
                    int32_t* sel);
void candidate_rows_cpu(const CandidateRowsParams& p, const StepRanges* ranges, int32_t* const* cand, int32_t* sel);

// The index records a kept row rescores, where score_rows reads them:
// rows[r] and rows[n_rows + r] become plane0[r] and plane1[r] for a fresh
// row, or scratch0 + r·stride0 and scratch1 + r·stride1 for a kept row,
// whose W = ranges[s].c_hi candidates' records (bytes0 in plane0, bytes1 in
// plane1; 0: the plane is unused) are copied there in order.
struct GatherCandParams {
  int64_t n_rows = 0;
  int n_kv_head = 0;
  int64_t bytes0 = 0, bytes1 = 0;    // record bytes per chunk in each plane
  int64_t stride0 = 0, stride1 = 0;  // scratch bytes per row
};
void gather_candidates(const Exec& x, const GatherCandParams& p, const StepRanges* ranges,
                       const int32_t* const* cand, const uint8_t* const* plane0, const uint8_t* const* plane1,
                       uint8_t* scratch0, uint8_t* scratch1, const uint8_t** rows);
void gather_candidates_cpu(const GatherCandParams& p, const StepRanges* ranges, const int32_t* const* cand,
                           const uint8_t* const* plane0, const uint8_t* const* plane1, uint8_t* scratch0,
                           uint8_t* scratch1, const uint8_t** rows);

// The selection each row keeps between the steps that select (reselect=N):
// sel [rows, width] (token or chunk ids, −1 first, at most kslots[s] of
// them); kept[r] holds kslots[s] ids, −1 first. A fresh row's last
// kslots[s] ids are copied into kept[r]; another row's sel becomes kept[r]'s
// ids, right-aligned, −1 before.
struct KeepSelParams {
  int64_t n_rows = 0;
  int n_kv_head = 0, width = 0;
};
void keep_selection(const Exec& x, const KeepSelParams& p, const StepRanges* ranges, const int32_t* kslots,
                    int32_t* const* kept, int32_t* sel);
void keep_selection_cpu(const KeepSelParams& p, const StepRanges* ranges, const int32_t* kslots,
                        int32_t* const* kept, int32_t* sel);

// Resident slots attended by each row's query (sinks, then the window's ring
// slots in token order, then the outlier tokens that are neither sinks nor in
// the window: outlier chunk i's token j sits in slot sink + ring + i·chunk + j,
// the row's chunk ids in forced[r] with −1 first), −1 padded to n_slots:
// slots [rows, n_slots].
struct ResidentListParams {
  int64_t n_rows = 0;
  int n_kv_head = 0, sink = 0, ring = 0, n_slots = 0;
  int chunk = 1, n_forced = 0;  // outlier chunks per row (forced's width)
};
void resident_list(const Exec& x, const ResidentListParams& p, const int32_t* forced, const StepRanges* ranges,
                   int32_t* slots);
void resident_list_cpu(const ResidentListParams& p, const int32_t* forced, const StepRanges* ranges, int32_t* slots);

// How many times a decode-step op (kv_write, index_rows, fetch, decode_attn)
// ran its CPU version in this process: a GPU sequence must never.
int64_t cpu_decode_op_calls();
void note_cpu_decode_op();

}  // namespace kvtier
