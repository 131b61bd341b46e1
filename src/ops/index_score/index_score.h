// Scoring the GPU key index against the current decode query: one score per
// (sequence, KV head, token) that top-k then ranks. Bandwidth-bound: each
// index byte is read once.
//
// Index layouts (rows = (seq, kv head), row r starts at r * row_stride):
//  * higgs2 landmarks: the record of QuantSpec "higgs2:g128" (ops/quant/
//    quant_format.h) for head_dim 128, 34 bytes per token, split into two
//    planes per row so that every load is aligned and coalesced: the 32 bytes
//    of EDEN4-256 grid indices of token t (byte j codes rotated coordinates
//    4j..4j+3) at row + 32·t, its bf16 scale ‖k‖/√128 at
//    row + scale_offset + 2·t (t counted from the start of the row). The key
//    was rotated by the orthonormal Hadamard (optionally after ±1 signs), so
//    q·k̂ = scale · Σ_j q_rot[4j..4j+3] · grid[code_j] with q_rot = H·D·q.
//  * dense landmarks: head_dim bf16 or FP8-E4M3 (unscaled) values per token
//    (ShadowKV's chunk means, or FP8 keys / landmarks).
// GQA: n_q query vectors per KV head (1 = the group's mean query); the score
// of a token is the max over them, or, with per_query (higgs2), each query's
// own score, for index_gqa_softmax_max to aggregate.
#pragma once
#include <cstdint>

namespace kvtier {

enum class IndexElt { higgs2, bf16, fp8 };

constexpr int kHiggs2RecordBytes = 34;  // for head_dim 128

struct IndexScoreParams {
  int n_seq = 1;
  int n_kv_head = 0;
  int head_dim = 128;
  int n_q = 1;             // query vectors per kv head, 1..4
  int64_t n_tok = 0;       // tokens scored per row
  int64_t tok_offset = 0;  // first scored token within each row
  int64_t row_stride = 0;  // bytes between rows of the index
  int64_t scale_offset = 0;  // higgs2: byte offset of the scale plane in a row (>= 32 · (tok_offset + n_tok))
  bool per_query = false;    // scores [n_seq, n_kv_head, n_q, n_tok]: every query's score (higgs2 only)
};

// Bytes of one token's index entry for `elt` at head_dim.
int64_t index_record_bytes(IndexElt elt, int head_dim);

// q:      [n_seq, n_kv_head, n_q, head_dim] f32 (higgs2: already rotated)
// index:  [n_seq * n_kv_head rows, row_stride bytes]
// grid:   [256, 4] f32 EDEN4-256 (higgs2 only; else null)
// scores: [n_seq, n_kv_head, n_tok] f32 ([n_seq, n_kv_head, n_q, n_tok] with per_query)
void index_score_ref(IndexElt elt, const IndexScoreParams& p, const float* q, const uint8_t* index,
                     const float* grid, float* scores);

// The query the index is scored with: per KV head either each query head of
// its group (n_q = n_head / n_kv_head) or their mean (n_q = 1), then for
// higgs2 rotated by H·D (signs: [head_dim] ±1, or null for none).
// q:   [n_seq, n_head, head_dim] f32
// out: [n_seq, n_kv_head, n_q, head_dim] f32
void index_query_ref(const float* q, int n_seq, int n_head, int n_kv_head, int head_dim,
                     bool mean_group, bool rotate, const float* signs, float* out);

// GQA aggregation "shadowkv" (SPEC "Policies"; kv/selector.h aggregate_gqa):
// per row and query j, the softmax of scale·raw_j over the row's n_tok
// tokens, then the max over j, for tokens [sel_offset, sel_offset + n_sel).
// Written as max_j (scale·raw_j − lse_j): the log of that max, so the same
// order for top-k, without f32 underflow to 0 far below the maximum.
// raw: [n_rows, n_q, n_tok] f32; out: [n_rows, n_sel] f32.
void index_gqa_softmax_max_ref(const float* raw, int64_t n_rows, int n_q, int64_t n_tok, float scale,
                               int64_t sel_offset, int64_t n_sel, float* out);

}  // namespace kvtier
