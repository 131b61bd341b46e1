// THE decode step (STYLE "a decode step should read like the algorithm"),
// one layer, every sequence of a batch, either device:
//   score the key index → select the top-k chunks (∪ sinks, window, outliers)
//   → fetch the selected K|V (only slot-cache misses cross PCIe)
//   ∥ attend to the resident tokens → attend to the fetched ones → merge by LSE.
// With the store in GPU memory (plan in_place, policy cache=none) the fetch
// and its slots drop out: the attention reads the selected records themselves.
// Under reselect=N a sequence scores and picks on every Nth step only: on
// the others its rows have no candidates (the scoring and the top-k skip
// them) and take back the selection kept from its last pick, or (rescore=D)
// score only the candidates that pick left and attend to their top-k.
// Each stage is one op over all rows (row = sequence · KV head); the state it
// reads is built once by DecodeBatch (decode_batch.cpp). No allocation, no
// host synchronization: on CUDA the whole step is kernels on two streams.
#include "backend/stage_clock.h"
#include "kv/decode_batch.h"
#include "ops/decode_attn/decode_attn.h"
#include "ops/decode_attn/record_attn.h"
#include "ops/gather/fetch.h"
#include "ops/index_score/index_rows.h"

namespace kvtier {

void decode_step(DecodeBatch& b, int layer, const void* q, float scale, void* out) {
  const KvPlan& k = b.plan_;
  const KvGeometry& g = k.geometry;
  const Exec& x = b.x_;
  const LayerRows t = b.rows(layer);
  const auto* ranges = reinterpret_cast<const StepRanges*>(b.state_.data<uint8_t>() + b.off_ranges_);
  const StepRanges* picks = b.select_ranges();  // ranges, less the sequences that keep their selection
  const int n_seq = b.n_seq(), H = g.n_kv_head, D = g.head_dim;
  const int64_t n_rows = int64_t(n_seq) * H, n_qh = int64_t(n_seq) * g.n_head;
  auto* part_out = b.part_out_.data<float>();
  auto* part_lse = b.part_lse_.data<float>();

  // 0. The resident tokens (sinks, window, outliers) → part 0, on the side stream.
  stage(x, "index");
  fork(x);
  const Exec side = side_exec(x);
  const int32_t* forced = b.n_out_ ? b.forced(layer) : nullptr;
  ResidentListParams rl{n_rows, H, k.sink, k.ring, b.n_res_slots_, k.chunk, b.n_out_};
  resident_list(side, rl, forced, ranges, b.res_list_.data<int32_t>());
  DecodeAttnParams ra{n_seq, g.n_head, H, D, scale, k.resident_elt};
  ra.tok_stride = 2 * int64_t(D) * kv_elt_bytes(k.resident_elt);
  ra.v_offset = int64_t(D) * kv_elt_bytes(k.resident_elt);
  ra.idx_stride = ra.n_tok_fixed = ra.n_tok_max = b.n_res_slots_;
  decode_attn(side, ra, q, t.resident, b.res_list_.data<int32_t>(), part_out, part_lse);

  // 1. Score the key index: the group's mean query against the candidates, or
  //    (gqa=shadowkv) each query against every chunk, then softmax-max.
  const int group = g.n_head / H;
  const bool per_query = k.policy.gqa == GqaMode::shadowkv && group > 1;
  IndexQueryParams iq{n_seq, g.n_head, H, D, !per_query, k.rotate_group, b.signs()};
  index_query_rows(x, iq, q, b.qidx_.data<float>());
  ScoreRowsParams sp = b.score_params(per_query ? group : 1, scale);
  sp.seq_scales = b.index_scales(layer);
  sp.candidates_only = !per_query;
  float* cand = per_query ? b.agg_.data<float>() : b.scores_.data<float>();
  if (sp.layout == IndexRecLayout::residual) sp.meta_scratch = b.meta_scores_.data<float>();
  // The planar and byte-table scorers also sum each query's softmax as they go (on CUDA).
  const bool fused = per_query && x.cuda() && score_rows_leaves_partials(sp);
  if (fused) sp.gqa_scratch = b.gqa_scratch_.data();
  // rescore=D: a row that keeps its pick scores its candidates instead (as
  // chunks 0 .. W − 1), read by id where the scorer can, else their records
  // gathered where the scoring reads them.
  const bool rescore = k.policy.rescore > 0;
  const uint8_t* const* plane0 = t.plane0;
  const uint8_t* const* plane1 = t.plane1;
  if (rescore && score_rows_reads_candidates(x, sp)) {
    sp.cand = t.kept_sel;
  } else if (rescore) {
    const uint8_t** planes = b.score_planes_.data<const uint8_t*>();
    gather_candidates(x, b.gather_params(), picks, t.kept_sel, t.plane0, t.plane1, b.cand_rec0_.data<uint8_t>(),
                      b.cand_rec1_.data<uint8_t>(), planes);
    plane0 = planes;
    plane1 = planes + n_rows;
  }
  const GqaRowsParams gp{n_seq, H, group, b.score_stride_, b.score_stride_, b.gqa_scratch_.data(), fused,
                         b.topk_scratch_.data()};
  if (per_query && !forced) {
    // 2. Without outliers to mask, the aggregation happens inside the
    //    top-k; scoring and selection are one op (gqa_score_topk_rows: on
    //    CUDA, with $KVT_GQA_TOPK=fused, the scoring keeps only the
    //    candidates that may make the top-k).
    gqa_score_topk_rows(x, sp, gp, b.qidx_.data<float>(), plane0, plane1, picks, b.kmax_chunk_,
                        b.scores_.data<float>(), cand, b.chunks_.data<int32_t>());
    stage(x, "select");
  } else {
    score_rows(x, sp, b.qidx_.data<float>(), plane0, plane1, picks, b.scores_.data<float>());
    if (per_query) gqa_rows(x, gp, b.scores_.data<float>(), picks, cand);
    // 2. Select: outlier chunks out of the race, the top-k chunks.
    stage(x, "select");
    if (forced) mask_rows(x, n_rows, H, b.score_stride_, b.n_out_, forced, picks, cand);
    topk_rows(x, n_rows, H, b.score_stride_, b.kmax_chunk_, cand, picks, b.chunks_.data<int32_t>());
  }
  int32_t* sel = b.chunks_.data<int32_t>();
  int sel_width = b.kmax_chunk_;
  // rescore=D: a fresh pick becomes the row's candidates; a rescored one, positions among them, their ids.
  if (rescore) candidate_rows(x, CandidateRowsParams{n_rows, H, b.kmax_chunk_, k.policy.rescore}, picks, t.kept_sel, sel);
  if (k.chunk > 1 || forced) {
    ExpandRowsParams ep{n_rows, H, b.kmax_chunk_, k.chunk, k.sink, b.n_out_};
    expand_rows(x, ep, sel, forced, picks, b.toks_.data<int32_t>());
    sel = b.toks_.data<int32_t>();
    sel_width = b.kmax_tok_;
  }
  // reselect=N: a fresh pick is kept for the steps that follow; they take it back.
  if (k.policy.reselect > 1 && !rescore) keep_selection(x, KeepSelParams{n_rows, H, sel_width}, picks, b.kslots(), t.kept_sel, sel);
  b.last_sel_ = sel;
  b.last_sel_width_ = sel_width;

  if (k.in_place) {
    // 3–4. Attend to the selected records where the store lies → parts 1..n_split.
    stage(x, "attend");
    RecordAttnParams ra;
    ra.attn = DecodeAttnParams{n_seq, g.n_head, H, D, scale, KvElt::bf16};
    ra.attn.idx_stride = ra.attn.n_tok_fixed = ra.attn.n_tok_max = b.kmax_tok_;
    ra.attn.n_split = b.n_split_;
    ra.attn.part0 = 1;
    const FetchParams fp = b.fetch_params();
    ra.fmt = fp.fmt;
    ra.entry_bytes = fp.entry_bytes;
    ra.tok_bytes = fp.tok_bytes;
    ra.counters = t.counters;
    decode_attn_records(x, ra, q, t.host, sel, part_out, part_lse);
  } else {
    // 3. Fetch the selected K|V (the slot cache keeps what earlier steps read).
    stage(x, "fetch");
    FetchView view;
    FetchParams fp = b.fetch_params();
    fp.seq_scales = b.seq_scales(layer);
    fetch_rows(x, fp, sel, b.fetch_rows(t), b.view_rows(), &view);

    // 4. Attend to the fetched tokens → parts 1..n_split.
    stage(x, "attend");
    DecodeAttnParams fa{n_seq, g.n_head, H, D, scale, view.elt};
    fa.tok_stride = view.tok_stride;
    fa.v_offset = view.v_offset;
    fa.idx_stride = fa.n_tok_fixed = fa.n_tok_max = b.kmax_tok_;
    fa.n_split = b.n_split_;
    fa.part0 = 1;
    decode_attn(x, fa, q, view.rows, view.idx, part_out, part_lse);
  }

  // 5. Merge with the resident part by log-sum-exp.
  stage(x, "merge");  // waits for the resident part, if it has not finished
  join(x);
  attn_merge(x, 1 + b.n_split_, n_qh, D, part_out, part_lse, out, false, nullptr);
  stage(x, "model");
}

}  // namespace kvtier
