// The tiered KV store: host store (every token's K and V, quantized) + key
// index + always-resident tokens (sinks, local window, shadowkv outliers).
// Prefill is dense over the prompt's exact K/V (a working copy, released at
// set_phase(decode)); each decode query runs the step of STYLE.md:
//   score the index → top-k ∪ sinks ∪ window ∪ pending → split resident/host
//   → gather host rows → attend to each part → merge by log-sum-exp.
// On the CPU "resident" is ordinary memory accounted as the GPU tier; the
// split and the merge are kept so the CUDA port mirrors this file.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kv/host_store.h"
#include "kv/key_index.h"
#include "kv/kv_store.h"
#include "kv/policy.h"
#include "kv/selector.h"

namespace kvtier {

struct TieredStats {
  int64_t n_queries = 0;        // decode queries (per layer)
  int64_t n_selected = 0;       // selected (kv head, token) rows
  int64_t n_host_rows = 0;      // rows gathered from the host tier
  int64_t n_host_bytes = 0;     // bytes of host records read
  // Reuse across decode steps, as the GPU path's reuse buffer sees it: host
  // (kv head, token) rows of a query, and those of them that the previous
  // query of the same layer also fetched for the same kv head.
  int64_t n_host_head_rows = 0;
  int64_t n_host_reused = 0;
  double reuse_rate() const { return n_host_head_rows ? double(n_host_reused) / double(n_host_head_rows) : 0.0; }
  // Distinct tokens among a query's host (kv head, token) rows: 1 when the
  // heads select disjoint tokens, 1/n_kv_head when they all select the same
  // ones. What a fetch per token (not per head and token) would read.
  double distinct_rate() const { return n_host_head_rows ? double(n_host_rows) / double(n_host_head_rows) : 0.0; }
};

class TieredKvStore : public KvStore {
 public:
  TieredKvStore(const PolicyConfig& p, const KvGeometry& g);

  void append(int layer, const float* k_pre, const float* k, const float* v, int n_tok) override;
  void attend(int layer, const float* q, int n_tok, float scale, float* out) override;
  void set_phase(KvPhase phase) override;
  bool dense_attention_now() const override { return phase_ == KvPhase::prefill; }
  int64_t n_tokens(int layer) const override { return n_tok_[layer]; }
  KvMemory memory() const override;
  std::string describe() const override;

  // One decode query that sees tokens [0, n_visible) of `layer`.
  // q: [n_head, head_dim] f32, out: [n_head, head_dim] f32; sel (may be null)
  // receives the selection.
  void attend_one(int layer, const float* q, float scale, int64_t n_visible, float* out,
                  Selection* sel);

  const PolicyConfig& config() const { return p_; }
  int64_t budget() const { return budget_; }    // tokens (set at set_phase(decode))
  int64_t n_prompt() const { return n_prompt_; }
  const TieredStats& stats() const { return stats_; }
  const HostStore& host() const { return host_; }

 private:
  bool is_resident(int layer, int kv_head, int64_t t) const;
  // Exact K or V row of a resident token for one kv head: [head_dim] f32.
  const float* resident_row(int layer, int kv_head, int64_t t, bool key) const;
  void round_resident(float* x, int64_t n) const;

  PolicyConfig p_;
  KvGeometry g_;
  int width_;
  HostStore host_;
  KeyIndex index_;
  KvPhase phase_ = KvPhase::prefill;
  int64_t n_prompt_ = 0;
  int64_t budget_ = 0;
  std::vector<int64_t> n_tok_;                      // per layer
  std::vector<std::vector<float>> dense_k_, dense_v_;  // prefill: [n_tok, width] f32
  std::vector<std::vector<float>> sink_k_, sink_v_;    // [≤ sink, width]
  std::vector<std::vector<float>> ring_k_, ring_v_;    // [local, width], row = pos % local
  // shadowkv outliers: per layer per kv head, rows [n_outlier_chunks·chunk, head_dim]
  std::vector<std::vector<std::vector<float>>> out_k_, out_v_;
  std::vector<std::vector<std::vector<int64_t>>> outliers_;  // [layer][kv_head] chunk ids
  std::vector<std::vector<std::vector<int64_t>>> prev_host_;  // [layer][kv_head] last query's host rows, sorted
  // reselect=N: per layer the tokens visible at the last pick (0: none yet)
  // and per KV head the tokens it picked that were not resident then, sorted.
  // rescore=D: instead, per KV head the candidates rescored until the next
  // pick (candidate_rows' runs of the pick), sorted.
  std::vector<int64_t> picked_at_;
  std::vector<std::vector<std::vector<int64_t>>> kept_;
  TieredStats stats_;
};

}  // namespace kvtier
