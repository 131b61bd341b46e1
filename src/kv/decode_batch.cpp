#include "kv/decode_batch.h"

#include <algorithm>
#include <cstring>

#include "backend/stage_clock.h"
#include "core/status.h"
#include "ops/decode_attn/decode_attn.h"
#include "ops/decode_attn/record_attn.h"
#include "ops/kv_append/kv_write.h"

namespace kvtier {
namespace {

constexpr int kRowTables = 8, kSeqTables = 5;  // see LayerRows

size_t align64(size_t n) { return (n + 63) / 64 * 64; }

}  // namespace

DecodeBatch::DecodeBatch(const KvPlan& plan, const Device& dev) : plan_(plan), dev_(dev), x_(dev.exec()) {
  KVT_CHECK(!plan.dense, "decode batch: the tiered decode step is for policies with a key index");
}

DecodeBatch::~DecodeBatch() = default;

void DecodeBatch::set_sequences(const std::vector<TieredSeq*>& seqs) {
  for (const TieredSeq* s : seqs) {
    KVT_CHECK(s->decoding(), "decode batch: a sequence joined before its prefill finished");
    KVT_CHECK(to_string(s->plan().policy) == to_string(plan_.policy) && s->plan().device == plan_.device,
              "decode batch: policy {} joined a batch of {}", to_string(s->plan().policy), to_string(plan_.policy));
  }
  seqs_ = seqs;
  tables_ok_ = false;
}

void DecodeBatch::build_tables() {
  const KvGeometry& g = plan_.geometry;
  const int B = n_seq(), H = g.n_kv_head, L = g.n_layer;
  const int64_t R = int64_t(B) * H;
  KVT_CHECK(B > 0, "decode batch: no sequences");
  sync(x_);  // queued steps may still read the old tables and scratch
  kmax_tok_ = kmax_chunk_ = 1;
  score_stride_ = 1;
  for (const TieredSeq* s : seqs_) {
    kmax_tok_ = std::max(kmax_tok_, s->kmax_tokens());
    kmax_chunk_ = std::max(kmax_chunk_, s->kmax_tokens() / plan_.chunk);
    score_stride_ = std::max(score_stride_, s->stats_row());
  }
  score_stride_ = (score_stride_ + 3) / 4 * 4;  // rows of scores 16-byte aligned (the mma16 scorer's vector stores)
  n_res_slots_ = int(seqs_[0]->resident_slots());
  n_out_ = plan_.n_outlier_tok / plan_.chunk;
  n_split_ = plan_.in_place ? record_attn_splits(x_, R, kmax_tok_) : decode_attn_splits(x_, R, kmax_tok_, 128);
  // Row tables, every layer.
  const size_t per_layer = size_t(kRowTables) * R + size_t(kSeqTables) * B;
  host_tables_.assign(per_layer * L, 0);
  for (int l = 0; l < L; ++l) {
    uintptr_t* t = host_tables_.data() + per_layer * l;
    for (int s = 0; s < B; ++s) {
      TieredSeq& q = *seqs_[size_t(s)];
      TieredLayer& Ly = q.layer(l);
      for (int h = 0; h < H; ++h) {
        const int64_t r = int64_t(s) * H + h;
        t[0 * R + r] = Ly.plane0 ? uintptr_t(Ly.plane0.data<uint8_t>() + h * q.plane0_row_bytes()) : 0;
        t[1 * R + r] = Ly.plane1 ? uintptr_t(Ly.plane1.data<uint8_t>() + h * q.plane1_row_bytes()) : 0;
        t[2 * R + r] = uintptr_t(Ly.resident.data<uint8_t>() + h * q.resident_slots() * q.resident_slot_bytes());
        t[3 * R + r] = uintptr_t(Ly.slots.data<uint8_t>() + h * q.slot_row_tokens() * plan_.slot_bytes);
        t[4 * R + r] = Ly.stats ? uintptr_t(Ly.stats.data<float>() + h * q.stats_row()) : 0;
        t[5 * R + r] = uintptr_t(Ly.prev_sel.data<int32_t>() + h * q.sel_state_words());
        t[6 * R + r] = uintptr_t(Ly.prev_slot.data<int32_t>() + int64_t(h) * q.kmax_tokens());
        t[7 * R + r] = Ly.kept_sel ? uintptr_t(Ly.kept_sel.data<int32_t>() + int64_t(h) * q.kept_words()) : 0;
      }
      uintptr_t* st = t + kRowTables * R;
      st[0 * B + s] = uintptr_t(Ly.host.data());
      st[1 * B + s] = uintptr_t(Ly.kplane.data());
      st[2 * B + s] = uintptr_t(Ly.svd_a.data());
      st[3 * B + s] = uintptr_t(Ly.svd_b.data());
      st[4 * B + s] = uintptr_t(q.counters());
    }
  }
  upload(x_, tables_, host_tables_.data(), host_tables_.size() * sizeof(uintptr_t));
  // Per-sequence state.
  off_pos0_ = 0;
  off_n_ = align64(off_pos0_ + 8 * size_t(B));
  off_key_first_ = align64(off_n_ + 8 * size_t(B));
  off_budget_ = align64(off_key_first_ + 8 * size_t(B));
  off_kslots_ = align64(off_budget_ + 4 * size_t(B));
  off_nout_ = align64(off_kslots_ + 4 * size_t(B));
  off_scales_ = align64(off_nout_ + 4 * size_t(B));
  off_iscales_ = align64(off_scales_ + 8 * size_t(B) * L);
  off_ranges_ = align64(off_iscales_ + 4 * size_t(B) * L);
  off_cache_all_ = align64(off_ranges_ + sizeof(StepRanges) * size_t(B));
  off_fill_ = align64(off_cache_all_ + 4 * size_t(B));
  off_sel_ranges_ = align64(off_fill_ + 8 * size_t(B));
  off_last_ = align64(off_sel_ranges_ + sizeof(StepRanges) * size_t(B));
  host_state_.assign(align64(off_last_ + 8 * size_t(B)), 0);
  for (int s = 0; s < B; ++s) {
    const TieredSeq& q = *seqs_[size_t(s)];
    reinterpret_cast<int64_t*>(host_state_.data() + off_key_first_)[s] =
        plan_.host == HostLayout::values_only ? q.n_prompt() : -1;
    reinterpret_cast<int32_t*>(host_state_.data() + off_budget_)[s] = q.kmax_tokens() / plan_.chunk;
    reinterpret_cast<int32_t*>(host_state_.data() + off_kslots_)[s] = q.kmax_tokens();
    reinterpret_cast<int32_t*>(host_state_.data() + off_nout_)[s] = q.outlier_tokens();
    reinterpret_cast<int32_t*>(host_state_.data() + off_cache_all_)[s] = q.cache_all() ? 1 : 0;
    reinterpret_cast<int64_t*>(host_state_.data() + off_fill_)[s] = q.needs_fill() ? q.n_tokens(0) : 0;
    reinterpret_cast<uintptr_t*>(host_state_.data() + off_last_)[s] = uintptr_t(q.reselect_at());
    for (int l = 0; l < L; ++l) {
      float* sc = reinterpret_cast<float*>(host_state_.data() + off_scales_) + (size_t(l) * B + s) * 2;
      sc[0] = seqs_[size_t(s)]->layer(l).k_scale;
      sc[1] = seqs_[size_t(s)]->layer(l).v_scale;
      reinterpret_cast<float*>(host_state_.data() + off_iscales_)[size_t(l) * B + s] =
          seqs_[size_t(s)]->layer(l).index_scale;
    }
  }
  upload(x_, state_, host_state_.data(), host_state_.size());
  if (!stage_ || stage_.bytes() < 16 * size_t(B)) stage_ = dev_.alloc_host(16 * size_t(B));
  // Outlier chunks, contiguous per layer: [rows][n_out].
  if (n_out_ > 0) {
    forced_ = dev_.alloc(size_t(L) * R * n_out_ * 4);
    for (int l = 0; l < L; ++l)
      for (int s = 0; s < B; ++s)
        copy(x_, forced_.data<int32_t>() + (int64_t(l) * R + int64_t(s) * H) * n_out_,
             seqs_[size_t(s)]->layer(l).outliers.data(), size_t(H) * n_out_ * 4);
  }
  // Scratch.
  const int group = g.n_head / H;
  const int n_q = plan_.policy.gqa == GqaMode::shadowkv && group > 1 ? group : 1;
  auto ensure = [&](Buffer& buf, size_t bytes) {
    if (buf.bytes() < bytes) buf = dev_.alloc(bytes);
  };
  ensure(qidx_, size_t(R) * n_q * g.head_dim * 4);
  ensure(scores_, size_t(R) * n_q * score_stride_ * 4);
  // The GQA aggregate as a row of its own: on the CPU, or to mask outliers in
  // (on CUDA without outliers the top-k aggregates as it reads: gqa_topk_rows).
  if (n_q > 1 && (!x_.cuda() || n_out_ > 0)) ensure(agg_, size_t(R) * score_stride_ * 4);
  if (plan_.index == IndexLayout::residual)
    ensure(meta_scores_, size_t(R) * n_q * size_t(residual_meta_stride(score_stride_, plan_.unit / plan_.chunk)) * 4);
  ensure(chunks_, size_t(R) * kmax_chunk_ * 4);
  ensure(toks_, size_t(R) * kmax_tok_ * 4);
  ensure(res_list_, size_t(R) * n_res_slots_ * 4);
  ensure(slot_of_, size_t(R) * kmax_tok_ * 4);
  ensure(part_out_, size_t(1 + n_split_) * B * g.n_head * g.head_dim * 4);
  ensure(part_lse_, size_t(1 + n_split_) * B * g.n_head * 4);
  ensure(fetch_scratch_, size_t(std::max<int64_t>(8, fetch_scratch_bytes(x_, fetch_params()))));
  cpu_view_rows_.assign(size_t(R), nullptr);
  if (n_q > 1) ensure(gqa_scratch_, size_t(gqa_rows_scratch_bytes(R, n_q)));
  if (n_q > 1 && x_.cuda() && n_out_ == 0)
    ensure(topk_scratch_, size_t(gqa_topk_scratch_bytes(R, n_q, score_stride_)));
  // rescore=D, where the scorer does not read candidates by id: their index
  // records, and the row tables scoring reads.
  if (plan_.policy.rescore > 0 && !score_rows_reads_candidates(x_, score_params(1, 1.f))) {
    const GatherCandParams gp = gather_params();
    ensure(cand_rec0_, size_t(R * gp.stride0));
    ensure(cand_rec1_, size_t(std::max<int64_t>(16, R * gp.stride1)));
    ensure(score_planes_, size_t(2 * R) * sizeof(uintptr_t));
  }
  gens_.clear();
  for (const TieredSeq* s : seqs_) gens_.push_back(s->generation());
  tables_ok_ = true;
  ++builds_;
  fill_caches();
}

// cache=all: the prompt of each sequence that joined since the last build,
// read from the host tier into its slots, every layer, before its first step.
void DecodeBatch::fill_caches() {
  int64_t max_fill = 0;
  for (TieredSeq* s : seqs_)
    if (s->needs_fill()) max_fill = std::max(max_fill, s->n_tokens(0));
  if (max_fill == 0) return;
  const auto* fill_n = reinterpret_cast<const int64_t*>(state_.data<uint8_t>() + off_fill_);
  for (int l = 0; l < plan_.geometry.n_layer; ++l) {
    FetchParams fp = fetch_params();
    fp.seq_scales = seq_scales(l);
    fetch_fill(x_, fp, fetch_rows(rows(l)), fill_n, max_fill);
  }
  for (TieredSeq* s : seqs_) s->note_filled();
}

LayerRows DecodeBatch::rows(int layer) const {
  const int B = n_seq();
  const int64_t R = int64_t(B) * plan_.geometry.n_kv_head;
  const size_t per_layer = size_t(kRowTables) * R + size_t(kSeqTables) * B;
  auto* t = tables_.data<uintptr_t>() + per_layer * layer;
  LayerRows r;
  r.plane0 = reinterpret_cast<uint8_t* const*>(t);
  r.plane1 = reinterpret_cast<uint8_t* const*>(t + R);
  r.resident = reinterpret_cast<uint8_t* const*>(t + 2 * R);
  r.slots = reinterpret_cast<uint8_t* const*>(t + 3 * R);
  r.stats = reinterpret_cast<float* const*>(t + 4 * R);
  r.prev_sel = reinterpret_cast<int32_t* const*>(t + 5 * R);
  r.prev_slot = reinterpret_cast<int32_t* const*>(t + 6 * R);
  r.kept_sel = reinterpret_cast<int32_t* const*>(t + 7 * R);
  const uintptr_t* st = t + kRowTables * R;
  r.host = reinterpret_cast<uint8_t* const*>(st);
  r.kplane = reinterpret_cast<uint8_t* const*>(st + B);
  r.svd_a = reinterpret_cast<const uint16_t* const*>(st + 2 * B);
  r.svd_b = reinterpret_cast<const uint16_t* const*>(st + 3 * B);
  r.counters = reinterpret_cast<unsigned long long* const*>(st + 4 * B);
  return r;
}

const float* DecodeBatch::signs() const { return seqs_.empty() ? nullptr : seqs_[0]->query_signs(); }

ScoreRowsParams DecodeBatch::score_params(int n_q, float scale) const {
  const TieredSeq& s = *seqs_[0];
  ScoreRowsParams p;
  p.n_seq = n_seq();
  p.n_kv_head = plan_.geometry.n_kv_head;
  p.head_dim = plan_.geometry.head_dim;
  p.n_q = n_q;
  p.layout = plan_.index == IndexLayout::higgs2_planar ? IndexRecLayout::planar_higgs2
             : plan_.index == IndexLayout::residual  ? IndexRecLayout::residual
                                                     : IndexRecLayout::records;
  p.fmt = s.index_fmt();
  p.meta = s.meta_fmt();
  p.m = plan_.unit / plan_.chunk;
  p.scale = scale;
  p.out_stride = score_stride_;
  return p;
}

const int32_t* DecodeBatch::forced(int layer) const {
  const int64_t R = int64_t(n_seq()) * plan_.geometry.n_kv_head;
  return forced_.data<int32_t>() + int64_t(layer) * R * n_out_;
}

FetchParams DecodeBatch::fetch_params() const {
  FetchParams p = seqs_[0]->fetch_params(n_seq());
  p.kmax = kmax_tok_;
  p.raw = !plan_.dequant_on_fetch;
  p.elt = plan_.fetch_elt;
  p.slot_bytes = plan_.slot_bytes;
  return p;
}

const float* DecodeBatch::index_scales(int layer) const {
  return reinterpret_cast<const float*>(state_.data<uint8_t>() + off_iscales_) + size_t(layer) * n_seq();
}

const StepRanges* DecodeBatch::select_ranges() const {
  return reinterpret_cast<const StepRanges*>(state_.data<uint8_t>() +
                                             (plan_.policy.reselect > 1 ? off_sel_ranges_ : off_ranges_));
}

GatherCandParams DecodeBatch::gather_params() const {
  GatherCandParams p;
  p.n_rows = int64_t(n_seq()) * plan_.geometry.n_kv_head;
  p.n_kv_head = plan_.geometry.n_kv_head;
  const bool planar = plan_.index == IndexLayout::higgs2_planar;
  p.bytes0 = planar ? 32 : plan_.index_rec_bytes;  // planar: the codes; a bf16 scale in plane 1
  p.bytes1 = planar ? 2 : 0;
  const int64_t w = int64_t(kmax_tok_) * (plan_.policy.rescore + 1);  // candidates per row at most (chunk = 1)
  p.stride0 = (w * p.bytes0 + 15) / 16 * 16;
  p.stride1 = (w * p.bytes1 + 15) / 16 * 16;
  return p;
}

const int32_t* DecodeBatch::kslots() const {
  return reinterpret_cast<const int32_t*>(state_.data<uint8_t>() + off_kslots_);
}

const float* DecodeBatch::seq_scales(int layer) const {
  return reinterpret_cast<const float*>(state_.data<uint8_t>() + off_scales_) + size_t(layer) * n_seq() * 2;
}

FetchRows DecodeBatch::fetch_rows(const LayerRows& t) {
  FetchRows r;
  r.host = t.host;
  r.kplane = t.kplane;
  r.key_first = reinterpret_cast<const int64_t*>(state_.data<uint8_t>() + off_key_first_);
  r.svd_a = t.svd_a;
  r.svd_b = t.svd_b;
  r.kslots = kslots();
  r.slots = t.slots;
  r.prev_sel = t.prev_sel;
  r.prev_slot = t.prev_slot;
  r.slot_of = slot_of_.data<int32_t>();
  r.scratch = fetch_scratch_.data();
  r.counters = t.counters;
  r.cache_all = reinterpret_cast<const int32_t*>(state_.data<uint8_t>() + off_cache_all_);
  return r;
}

const uint8_t** DecodeBatch::view_rows() { return cpu_view_rows_.data(); }

void DecodeBatch::prepare() {
  bool moved = !tables_ok_;
  for (size_t i = 0; i < seqs_.size() && !moved; ++i) moved = gens_[i] != seqs_[i]->generation();
  if (moved) build_tables();
}

void DecodeBatch::begin_step() {
  prepare();
  const int B = n_seq();
  auto* stage = stage_.host_ptr<int64_t>();  // [pos0 × B, n × B]
  for (int s = 0; s < B; ++s) {
    stage[s] = seqs_[size_t(s)]->n_tokens(0);
    stage[B + s] = stage[s] + 1;
  }
  copy(x_, state_.data<uint8_t>() + off_pos0_, stage, 8 * size_t(B));
  copy(x_, state_.data<uint8_t>() + off_n_, stage + B, 8 * size_t(B));
  // The step appends one token to every layer of every sequence at the staged
  // positions (the kernels read them from the device, so a graph replays them).
  for (TieredSeq* s : seqs_)
    for (int l = 0; l < plan_.geometry.n_layer; ++l) s->note_decode_append(l);
  StepPlanParams sp;
  sp.n_seq = B;
  sp.chunk = plan_.chunk;
  sp.unit = plan_.unit;
  sp.sink = plan_.sink;
  sp.local = plan_.local;
  sp.ring = plan_.ring;
  sp.kmax = kmax_chunk_;
  step_plan_rows(x_, sp, reinterpret_cast<const int64_t*>(state_.data<uint8_t>() + off_n_),
                 reinterpret_cast<const int32_t*>(state_.data<uint8_t>() + off_budget_),
                 reinterpret_cast<const int32_t*>(state_.data<uint8_t>() + off_nout_),
                 reinterpret_cast<StepRanges*>(state_.data<uint8_t>() + off_ranges_));
  if (plan_.policy.reselect > 1)
    reselect_rows(x_, B, plan_.policy.reselect, plan_.policy.rescore,
                  reinterpret_cast<int64_t* const*>(state_.data<uint8_t>() + off_last_),
                  reinterpret_cast<const StepRanges*>(state_.data<uint8_t>() + off_ranges_),
                  reinterpret_cast<StepRanges*>(state_.data<uint8_t>() + off_sel_ranges_));
}

void DecodeBatch::append(int layer, const void* k_pre, const void* k, const void* v, int64_t tok_stride) {
  const KvGeometry& g = plan_.geometry;
  const LayerRows t = rows(layer);
  const TieredSeq& s0 = *seqs_[0];
  const auto* pos0 = reinterpret_cast<const int64_t*>(state_.data<uint8_t>() + off_pos0_);
  stage(x_, "append");
  // The new token's index entry first, on this stream: the scoring reads it
  // (gqa=shadowkv's softmax runs over every chunk, the window's included),
  // and it reads the unit's earlier keys from the ring before the ring write.
  IndexWriteParams ip = s0.index_write_params(layer, n_seq(), 1, tok_stride);
  ip.seq_scales = index_scales(layer);
  index_write(x_, ip, k, pos0, t.plane0, t.plane1, t.resident, nullptr);
  // The host tier's record and the ring slot on the side stream: nothing on
  // this stream reads them in this step (the token is in the window, which
  // only the resident attention reads, on the side stream after them, until
  // `local` steps on); decode_step joins the side stream before this layer
  // ends, while k and v are still this layer's. Encoding HIGGS4 records is
  // the longest append.
  fork(x_);
  const Exec side = side_exec(x_);
  HostWriteParams hp = s0.host_write_params(layer, n_seq(), 1, tok_stride);
  hp.seq_scales = seq_scales(layer);
  host_write(side, hp, k, k_pre, v, pos0, t.host, t.kplane,
             reinterpret_cast<const int64_t*>(state_.data<uint8_t>() + off_key_first_));
  ResidentWriteParams rp{n_seq(), 1, g.n_kv_head, g.head_dim, plan_.sink, plan_.ring, tok_stride, plan_.resident_elt};
  resident_write(side, rp, k, v, pos0, t.resident);
  stage(x_, "model");
}

void DecodeBatch::attend(int layer, const void* q, float scale, void* out) {
  decode_step(*this, layer, q, scale, out);
}

}  // namespace kvtier
