// The `full` policy as a KvCache on either device: every token's K and V
// resident ([cap][n_kv_head·head_dim] per layer, the device's activation type,
// rounded through the policy's kv format when it is not the activation's
// own), dense attention: flash prefill for chunks of queries, split-K decode
// attention (CPU: attention_causal) for one.
//
// The CPU prefills into f32 rows (what attention_causal reads) and, when the
// kv format is bf16 or FP8 (exact in bf16), narrows them to bf16 once at the
// start of decode: decode then reads half the bytes per token, as llama.cpp
// reads its f16 cache. Queries after that go through the decode kernels.
#pragma once
#include <cstdint>
#include <vector>

#include "kv/kv_cache.h"
#include "ops/decode_attn/decode_attn.h"
#include "ops/kv_append/kv_write.h"

namespace kvtier {

class DenseKv final : public KvCache {
 public:
  DenseKv(const KvPlan& plan, const Device& dev);
  const KvPlan& plan() const override { return plan_; }
  void append(int layer, const void* k_pre, const void* k, const void* v, int64_t tok_stride, int n_tok) override;
  void attend(int layer, const void* q, int64_t q_stride, int n_tok, float scale, void* out) override;
  void start_decode() override;
  void begin_step(int n_tok) override;
  uint64_t graph_token() const override { return uint64_t(cap_); }
  bool graph_safe() const override { return true; }
  bool decoding() const override { return decoding_; }
  int64_t n_tokens(int layer) const override { return n_[size_t(layer)]; }
  void reserve(int64_t n) override;
  KvMemory memory() const override;
  KvStats stats() const override { return {}; }

  // [n_tokens, n_kv_head, head_dim] of `layer`, elements of type element().
  const void* keys(int layer) const { return k_[size_t(layer)].data(); }
  const void* values(int layer) const { return v_[size_t(layer)].data(); }
  KvElt element() const { return elt_; }

 private:
  void grow(int64_t need);
  void narrow_to_bf16();
  void build_row_table();
  void attend_each(int layer, const float* q, int64_t q_stride, int n_tok, float scale, float* out);
  RecordFormat round_format() const;

  KvPlan plan_;
  const Device& dev_;
  Exec x_;
  bool round_ = false;  // values go through the kv format (quantize + dequantize) on append
  bool narrow_ = false;  // CPU: rows become bf16 at the start of decode
  KvElt elt_ = KvElt::f32;  // the stored rows' element type
  bool decoding_ = false;
  bool stepping_ = false;  // GPU decode: begin_step staged the position
  int64_t cap_ = 0;
  std::vector<int64_t> n_;
  std::vector<Buffer> k_, v_;
  Buffer rows_;         // [n_layer][n_kv_head] K bases (decode attention's row table)
  Buffer part_out_, part_lse_;
  int n_split_ = 1;     // decode attention's splits for the capacity (fixed, so a graph replays)
  Buffer n_dev_, stage_;  // the tokens a decode step attends to: device copy, pinned staging
  Buffer grid_, signs_;  // the kv format's HIGGS tables, when rounding through HIGGS
};

}  // namespace kvtier
