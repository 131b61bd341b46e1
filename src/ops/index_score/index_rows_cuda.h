// CUDA versions of index_rows.h (device pointers; q of index_query bf16).
#pragma once
#include <vector>

#include "ops/index_score/index_rows.h"

namespace kvtier::cuda {

void step_plan_rows(const Exec& x, const StepPlanParams& p, const int64_t* n, const int32_t* budget_chunks,
                    const int32_t* n_outlier, StepRanges* out);
void reselect_rows(const Exec& x, int n_seq, int every, int rescore, int64_t* const* last,
                   const StepRanges* ranges, StepRanges* out);
void candidate_rows(const Exec& x, const CandidateRowsParams& p, const StepRanges* ranges, int32_t* const* cand,
                    int32_t* sel);
void gather_candidates(const Exec& x, const GatherCandParams& p, const StepRanges* ranges,
                       const int32_t* const* cand, const uint8_t* const* plane0, const uint8_t* const* plane1,
                       uint8_t* scratch0, uint8_t* scratch1, const uint8_t** rows);
void keep_selection(const Exec& x, const KeepSelParams& p, const StepRanges* ranges, const int32_t* kslots,
                    int32_t* const* kept, int32_t* sel);
void index_query_rows(const Exec& x, const IndexQueryParams& p, const void* q_bf16, float* out);
void score_rows(const Exec& x, const ScoreRowsParams& p, const float* q, const uint8_t* const* plane0,
                const uint8_t* const* plane1, const StepRanges* ranges, float* scores);
void gqa_rows(const Exec& x, const GqaRowsParams& p, const float* raw, const StepRanges* ranges, float* out);
void mask_rows(const Exec& x, int64_t n_rows, int n_kv_head, int64_t stride, int n_forced, const int32_t* forced,
               const StepRanges* ranges, float* scores);
void topk_rows(const Exec& x, int64_t n_rows, int n_kv_head, int64_t stride, int kmax, const float* scores,
               const StepRanges* ranges, int32_t* out);
void gqa_topk_rows(const Exec& x, const GqaRowsParams& p, const float* raw, const StepRanges* ranges, int kmax,
                   int32_t* out);
void gqa_score_topk_rows(const Exec& x, const ScoreRowsParams& sp, const GqaRowsParams& gp, const float* q,
                         const uint8_t* const* plane0, const uint8_t* const* plane1, const StepRanges* ranges,
                         int kmax, float* scores, int32_t* out);
// Whether gqa_score_topk_rows with these parameters takes its fused path.
bool gqa_score_topk_fuses(const ScoreRowsParams& sp, const GqaRowsParams& gp);
// Which path each row of the last gqa_topk_rows (or gqa_score_topk_rows)
// with this topk_scratch took: 0 the cluster top-k, 1 the sampled filter
// and then the cluster top-k (the filter kept too few or too many), 2 the
// sampled or fused path alone (or, a row of at most 16,384 candidates, its
// last kernel over all of them), 4 the fused path's fallback (scored again
// in full, then the cluster top-k).
std::vector<int32_t> gqa_topk_row_paths(const Exec& x, const void* topk_scratch, int64_t n_rows);
void expand_rows(const Exec& x, const ExpandRowsParams& p, const int32_t* chunks, const int32_t* forced,
                 const StepRanges* ranges, int32_t* tokens);
void resident_list(const Exec& x, const ResidentListParams& p, const int32_t* forced, const StepRanges* ranges,
                   int32_t* slots);

}  // namespace kvtier::cuda
