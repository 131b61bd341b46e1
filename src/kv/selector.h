// Token selection for one decode query (SPEC "Policies": budgets are always
// unioned): per KV head, sinks ∪ local window ∪ pending (not yet indexed)
// tokens ∪ forced chunks (shadowkv outliers) ∪ the top-k chunks by index score
// among the rest, k = budget / chunk. The result is an index list (STYLE rule
// 5): indices of KV head g are [indptr[g], indptr[g+1]), sorted, unique.
#pragma once
#include <cstdint>
#include <vector>

#include "kv/policy.h"

namespace kvtier {

struct Selection {
  std::vector<int64_t> indptr;   // [n_kv_head + 1]
  std::vector<int64_t> indices;  // [indptr[n_kv_head]] token positions
};

// GQA aggregation of scaled per-query-head scores into one score per KV head.
// shadowkv: softmax over the n entries of each query head, then the max over
//   the heads of the group (ShadowKV sums over query positions too; decode has one).
// mean: the score of the group's mean query, i.e. the mean of the raw scores.
// raw: [n_head, n] f32, out: [n_kv_head, n] f32
void aggregate_gqa(GqaMode mode, int n_head, int n_kv_head, int64_t n, const float* raw,
                   float* out);

struct SelectParams {
  int64_t n_visible = 0;  // tokens [0, n_visible) may be chosen
  int chunk = 1;
  int64_t n_chunk = 0;    // indexed chunks, covering [0, n_chunk·chunk) ⊆ [0, n_visible)
  int64_t budget = 0;     // sparse budget in tokens
  int sink = 0;
  int local = 0;
};

// scores: [n_kv_head, n_chunk] f32 (higher first; ties: lower chunk first)
// forced: per KV head sorted chunk ids always taken and not counted in the
//         budget (shadowkv outliers); may be null.
void select_tokens(const SelectParams& p, int n_kv_head, const float* scores,
                   const std::vector<std::vector<int64_t>>* forced, Selection* out);

}  // namespace kvtier
