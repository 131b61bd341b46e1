// The sequences of one plan that decode together, and what their decode
// steps need (DESIGN: plan once, run many): row tables (per layer, the
// storage of every (sequence, KV head) row), per-sequence lengths, the scratch
// of every stage. Rebuilt when the batch changes or a sequence's buffers move;
// a step itself allocates nothing and waits for nothing. decode_step.cpp runs
// one layer of the step over this state.
#pragma once
#include <cstdint>
#include <vector>

#include "kv/tiered_kv.h"
#include "ops/gather/fetch.h"
#include "ops/index_score/index_rows.h"

namespace kvtier {

// Device addresses of one layer's row tables (rows = sequence · n_kv_head + head).
struct LayerRows {
  uint8_t* const* plane0 = nullptr;    // [rows]
  uint8_t* const* plane1 = nullptr;    // [rows]
  uint8_t* const* resident = nullptr;  // [rows]
  uint8_t* const* slots = nullptr;     // [rows]
  float* const* stats = nullptr;       // [rows]
  int32_t* const* prev_sel = nullptr;  // [rows]
  int32_t* const* prev_slot = nullptr; // [rows]
  int32_t* const* kept_sel = nullptr;  // [rows] (policy reselect > 1)
  uint8_t* const* host = nullptr;      // [seqs]
  uint8_t* const* kplane = nullptr;    // [seqs]
  const uint16_t* const* svd_a = nullptr;  // [seqs]
  const uint16_t* const* svd_b = nullptr;  // [seqs]
  unsigned long long* const* counters = nullptr;  // [seqs]
};

class DecodeBatch {
 public:
  DecodeBatch(const KvPlan& plan, const Device& dev);
  ~DecodeBatch();
  // Sequences in decode, all of this plan. Their order is the batch order of q/out.
  void set_sequences(const std::vector<TieredSeq*>& seqs);
  int n_seq() const { return int(seqs_.size()); }
  const KvPlan& plan() const { return plan_; }

  // Builds the step's tables now (else the next begin_step does), filling the
  // cache=all slots of sequences that just joined: prefill-side work.
  void prepare();
  // Before layer 0 of a step: every sequence appends one token this step.
  void begin_step();
  // k_pre, k, v: [n_seq, n_kv_head, head_dim], tok_stride elements apart.
  void append(int layer, const void* k_pre, const void* k, const void* v, int64_t tok_stride);
  // q: [n_seq, n_head, head_dim] contiguous → out (same shape).
  void attend(int layer, const void* q, float scale, void* out);

  // The selection of the last attend (CPU only: analysis reads it):
  // [n_seq · n_kv_head, selection_width()] token ids, ascending, −1 first.
  const int32_t* last_selection() const { return last_sel_; }
  int selection_width() const { return last_sel_width_; }
  int kmax_tokens() const { return kmax_tok_; }
  uint64_t builds() const { return builds_; }  // table rebuilds so far (buffers the step reads moved)
  int kmax_chunks() const { return kmax_chunk_; }

 private:
  friend void decode_step(DecodeBatch& b, int layer, const void* q, float scale, void* out);
  void build_tables();
  void fill_caches();
  LayerRows rows(int layer) const;
  const float* signs() const;
  ScoreRowsParams score_params(int n_q, float scale) const;
  const int32_t* forced(int layer) const;
  FetchParams fetch_params() const;
  const float* seq_scales(int layer) const;
  const float* index_scales(int layer) const;
  // The ranges the scoring and the top-k read: the step's, or under
  // reselect > 1 those of reselect_rows (no candidates where a sequence keeps
  // its last selection).
  const StepRanges* select_ranges() const;
  const int32_t* kslots() const;  // [seqs] each sequence's budget in tokens
  GatherCandParams gather_params() const;  // rescore=D: the candidates' records and their scratch
  FetchRows fetch_rows(const LayerRows& t);
  const uint8_t** view_rows();

  KvPlan plan_;
  const Device& dev_;
  Exec x_;
  std::vector<TieredSeq*> seqs_;
  std::vector<uint64_t> gens_;
  int kmax_tok_ = 0, kmax_chunk_ = 0, n_res_slots_ = 0, n_out_ = 0;
  int64_t score_stride_ = 0;
  int n_split_ = 0;
  bool tables_ok_ = false;
  uint64_t builds_ = 0;
  Buffer gqa_scratch_;
  Buffer topk_scratch_;                // CUDA, GQA without outliers: gqa_topk_rows' sampled path
  Buffer tables_;                     // per layer: 8 [rows] + 5 [seqs] pointer arrays
  std::vector<uintptr_t> host_tables_;
  Buffer state_;                      // [seqs]: pos0 int64, key_first int64, budget int32, kslots int32, ranges,
                                      // (reselect > 1) the select ranges and each sequence's reselect_at
  std::vector<uint8_t> host_state_;
  Buffer stage_;                      // host staging of pos0 (pinned on CUDA, so a graph can replay the copy)
  Buffer forced_;                     // [layers][rows][n_out] int32
  Buffer cand_rec0_, cand_rec1_;      // rescore=D: [rows] the candidates' index records (gather_params)
  Buffer score_planes_;               // rescore=D: [2][rows] where score_rows reads each row's records this layer
  Buffer qidx_, scores_, agg_, meta_scores_, chunks_, toks_, res_list_, slot_of_, part_out_, part_lse_, fetch_scratch_;
  std::vector<const uint8_t*> cpu_view_rows_;
  std::vector<const uint8_t*> cpu_res_rows_;
  const int32_t* last_sel_ = nullptr;
  int last_sel_width_ = 0;
  size_t off_pos0_ = 0, off_n_ = 0, off_key_first_ = 0, off_budget_ = 0, off_kslots_ = 0, off_nout_ = 0,
         off_scales_ = 0, off_iscales_ = 0, off_ranges_ = 0, off_cache_all_ = 0, off_fill_ = 0,
         off_sel_ranges_ = 0, off_last_ = 0;
};

// One layer of one decode step for every sequence of the batch (decode_step.cpp).
void decode_step(DecodeBatch& b, int layer, const void* q, float scale, void* out);

}  // namespace kvtier
