// The tiered KV cache of one sequence (every policy with a key index), on
// either device: per layer the key index, the host tier, the resident tokens
// and the decode state (kv_plan.h says which layout each takes). Memory
// layout per layer, row r = KV head:
//   index    plane0 [H rows][cap_chunks] records (planar higgs2: codes [cap][32]),
//            plane1 [H rows] scales (planar) or meta records (residual)
//   host     [cap tokens][host_tok_bytes]  (values_only: + kplane for generated keys)
//   resident [H rows][sink + ring + outlier tokens][K|V]
//   slots    [H rows][kmax][K|V]  the slot cache (both devices: decoded K|V);
//            cache=all: [H rows][cap][K|V], token t in slot t
// Prefill attends densely to every earlier token (policy prefill=, chosen
// at the prompt's first append): dense over a working copy of every layer's
// K/V, or streamed: each layer's K/V decoded from the host tier into one
// layer-sized buffer as the layer runs (fetch_dense), so the device holds one
// layer's copy, allocated when the prompt first attends. A reserved
// sequence whose prompt has not started holds neither. The copies are
// released at start_decode, when the index is finished (shadowkv: its SVD
// and outliers).
// Decode steps run through a DecodeBatch (decode_batch.h) of one or more
// sequences that share the plan.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "kv/kv_cache.h"
#include "ops/gather/fetch.h"
#include "ops/kv_append/kv_write.h"

namespace kvtier {

class DecodeBatch;

// Whether a sequence decodes with every token's K/V cached on the GPU
// (policy cache=all|step|auto, see policy.h): all_bytes is that cache,
// free/total the device's memory. auto takes it on the GPU when free memory
// holds it twice (the second copy is what the next sequence of this length
// needs for its prefill) plus max(1 GiB, 10 % of total); step on the CPU.
// cache=all that does not fit even once throws kvtier::Error.
bool choose_cache_all(CacheMode mode, bool gpu, int64_t all_bytes, int64_t free, int64_t total);

// Whether a sequence's prefill streams its K/V from the host tier (policy
// prefill=dense|stream|auto): dense_bytes is every layer's K/V copy at its
// capacity, free/total the device's memory. auto streams on the GPU when the
// copy and a margin of max(1 GiB, 10 % of total) do not fit in free memory;
// dense on the CPU.
bool choose_prefill_stream(PrefillMode mode, bool gpu, int64_t dense_bytes, int64_t free, int64_t total);

struct TieredLayer {
  Buffer plane0, plane1;
  Buffer host, kplane;
  Buffer resident;
  Buffer slots, prev_sel, prev_slot, slot_of;
  Buffer kept_sel;                 // policy reselect > 1: [H][kept_words] int32, the selection kept between
                                   // picks, or (rescore=D) the candidates rescored
  Buffer outliers;                 // shadowkv: [H][outliers] int32 chunk ids, ascending
  Buffer svd_a, svd_b;             // shadowkv: U·S [n_prompt][rank], Vᵀ [rank][H·D], bf16
  Buffer stats;                    // shadowkv prefill: [H][cap_chunks] f32 min cos
  Buffer dense_k, dense_v;         // prefill working copy [cap][H][D] (device activations)
  Buffer kpre;                     // shadowkv prefill: pre-RoPE keys [cap][H·D] (host tier)
  Buffer gram;                     // shadowkv prefill: [H·D][H·D] f32
  float k_scale = 1.f, v_scale = 1.f;  // nvfp4 host tier
  float index_scale = 1.f;             // nvfp4 landmarks
  bool scales_set = false;
};

class TieredSeq {
 public:
  TieredSeq(const KvPlan& plan, const Device& dev);
  ~TieredSeq();

  const KvPlan& plan() const { return plan_; }
  const Device& device() const { return dev_; }
  void reserve(int64_t n);
  // Prefill / single-sequence appends (decode appends go through a DecodeBatch).
  void append(int layer, const void* k_pre, const void* k, const void* v, int64_t tok_stride, int n_tok);
  void attend_prefill(int layer, const void* q, int64_t q_stride, int n_tok, float scale, void* out);
  void start_decode();
  bool decoding() const { return decoding_; }
  int64_t n_tokens(int layer) const { return n_[size_t(layer)]; }
  int64_t n_prompt() const { return n_prompt_; }
  int64_t capacity() const { return cap_; }
  int64_t budget_tokens() const { return budget_; }
  int kmax_tokens() const { return kmax_tok_; }
  // reselect > 1: int32 words per KV head of the selection kept between picks
  // (kmax_tokens), or with rescore=D of the candidates ((D + 1)·kmax_tokens).
  int64_t kept_words() const { return int64_t(kmax_tok_) * (plan_.policy.rescore + 1); }
  bool cache_all() const { return cache_all_; }        // policy cache=all (or auto that chose it)
  // policy store=gpu on a CUDA device: the store (host tier) in device memory
  bool store_on_gpu() const { return plan_.policy.store == StoreMode::gpu && dev_.kind() == DeviceKind::cuda; }
  bool prefill_streamed() const { return stream_; }     // policy prefill=stream (or auto that chose it)
  // Slots per row: kmax, the capacity (cache=all: token t in slot t), or none
  // (the plan's in_place: the attention reads the store).
  int64_t slot_row_tokens() const { return plan_.in_place ? 0 : cache_all_ ? cap_ : kmax_tok_; }
  // prev_sel words per row: the last selection, or (cache=all) the bitmap of the tokens held.
  int64_t sel_state_words() const { return cache_all_ ? (cap_ + 31) / 32 : kmax_tok_; }
  bool needs_fill() const { return needs_fill_; }          // cache=all: the prompt is not in the slots yet
  void note_filled() { needs_fill_ = false; }
  KvMemory memory() const;
  KvStats stats() const;

  // The decode state the batch reads (row pointers are built from these).
  TieredLayer& layer(int l) { return layers_[size_t(l)]; }
  int64_t plane0_row_bytes() const { return p0_row_; }
  int64_t plane1_row_bytes() const { return p1_row_; }
  int64_t resident_slots() const { return res_slots_; }
  int64_t resident_slot_bytes() const { return res_slot_; }
  int64_t stats_row() const { return cap_chunks_; }
  unsigned long long* counters() const { return counters_.data<unsigned long long>(); }
  int64_t* reselect_at() const { return reselect_at_.data<int64_t>(); }  // null unless reselect > 1
  void note_decode_append(int layer) { ++n_[size_t(layer)]; }
  uint64_t generation() const { return generation_; }  // bumps when buffers move
  uint64_t uid() const { return uid_; }  // unique in the process (an address may be reused)
  // Bytes of the prompt's working copies (the dense prefill's K/V of every
  // layer, or the streamed prefill's layer copies); 0 once decoding.
  int64_t prefill_work_bytes() const;

 private:
  void grow(int64_t need);
  void finish_shadowkv();
  void choose_cache();
  Buffer alloc_store(size_t bytes) const;  // the store's memory: pinned host, or device under store=gpu
  // The prompt's first append: chooses dense or streamed attention (by the
  // memory free then, not at the reservation) and allocates the dense copy
  // of every layer, or the streamed reads' row tables.
  void begin_prefill();
  size_t layer_copy_bytes() const;  // one layer's K (or V) at the capacity, activation precision
  void upload_stream_tables();
  // Streamed prefill: a layer's K/V [cap][H·D] at the activation precision,
  // and fetch_dense's staging. Two on CUDA: one is read into while the other
  // is attended to.
  struct StreamBuf {
    Buffer k, v, scratch;
  };
  // Allocates the streamed prefill's copies at the capacity, where missing:
  // they exist only while the prompt attends (a reserved sequence waiting
  // for its turn holds none), and grow() drops them.
  void stream_bufs();
  FetchParams stream_params(int layer, int64_t cap) const;
 public:
  // The host tier's part of a fetch over n_seq sequences of this plan (the
  // decode batch adds its selection and slots, the streamed prefill its pass).
  FetchParams fetch_params(int n_seq) const;
 private:
  // Tokens [t0, t1) of `layer` decoded from the host tier into rows t0.. of w, on x.
  void stream_read(const Exec& x, int layer, int64_t t0, int64_t t1, StreamBuf& w);

  KvPlan plan_;
  const Device& dev_;
  Exec x_;
  std::vector<TieredLayer> layers_;
  std::vector<int64_t> n_;
  int64_t cap_ = 0, cap_chunks_ = 0, cap_units_ = 0;
  int64_t p0_row_ = 0, p1_row_ = 0;
  int64_t res_slots_ = 0, res_slot_ = 0;
  int64_t n_prompt_ = 0, budget_ = 0;
  int kmax_tok_ = 0;
  bool cache_all_ = false, needs_fill_ = false;
  bool stream_ = false, prefill_chosen_ = false;
  StreamBuf work_[2];
  Buffer index_slab_;               // every layer's plane0 and plane1 (their Buffers are views of it)
  Buffer store_slab_;               // every layer's store (host), unless in the pinned pool
  Buffer stream_tables_;            // [n_layer][3] host tier, kplane, key_first: fetch_dense's row tables
  int pref_layer_ = -1, pref_buf_ = 0;  // work_[pref_buf_] holds (or is being read on the side stream)
  int64_t pref_n_ = 0;                  // tokens [0, pref_n_) of pref_layer_
  int n_outlier_tok_ = 0;
  bool decoding_ = false;
  uint64_t generation_ = 0;
  uint64_t uid_ = 0;
  Buffer grid_, signs_, meta_grid_, meta_signs_, host_grid_, host_signs_;  // quantizer tables (device)
  Buffer inv_freq_;                 // RoPE [head_dim/2] f32 (device)
  Buffer counters_;                 // [2] selected, misses (device)
  Buffer reselect_at_;              // policy reselect > 1: int64 tokens held at the last selection (0: none yet),
                                    // then (rescore) int64 its candidate count
  Buffer scales_;                   // [n_layer][3] nvfp4 per-tensor scales: host K, host V, landmarks (device)
  Buffer tables_;                   // this sequence's row tables for prefill appends (device)
  std::vector<uint8_t> host_tables_;
  uint64_t tables_gen_ = ~0ull;

  friend class DecodeBatch;
  friend class TieredKv;
 public:
  RecordFormat index_fmt() const;
  RecordFormat meta_fmt() const;
  RecordFormat host_fmt() const;
  const float* inv_freq() const { return inv_freq_.data<float>(); }
  const float* query_signs() const;  // planar higgs2 with random signs: [head_dim], else null
  HostWriteParams host_write_params(int layer, int n_seq, int n_new, int64_t tok_stride) const;
  IndexWriteParams index_write_params(int layer, int n_seq, int n_new, int64_t tok_stride) const;
  const float* layer_scales(int layer) const { return scales_.data<float>() + 3 * layer; }  // k, v, index
  int outlier_tokens() const { return n_outlier_tok_; }  // per head, ≤ plan().n_outlier_tok
};

// KvCache over one TieredSeq.
class TieredKv final : public KvCache {
 public:
  TieredKv(const KvPlan& plan, const Device& dev);
  ~TieredKv() override;
  const KvPlan& plan() const override { return seq_->plan(); }
  void append(int layer, const void* k_pre, const void* k, const void* v, int64_t tok_stride, int n_tok) override;
  void attend(int layer, const void* q, int64_t q_stride, int n_tok, float scale, void* out) override;
  void start_decode() override;
  void begin_step(int n_tok) override;
  uint64_t graph_token() const override;
  bool graph_safe() const override { return true; }
  bool decoding() const override { return seq_->decoding(); }
  int64_t n_tokens(int layer) const override { return seq_->n_tokens(layer); }
  void reserve(int64_t n) override { seq_->reserve(n); }
  KvMemory memory() const override { return seq_->memory(); }
  KvStats stats() const override { return seq_->stats(); }
  TieredSeq& seq() { return *seq_; }
  DecodeBatch& batch() { return *batch_; }

 private:
  uint64_t batch_builds() const;
  std::unique_ptr<TieredSeq> seq_;
  std::unique_ptr<DecodeBatch> batch_;
};

}  // namespace kvtier
