// Oracle analysis (SPEC "Policies": analysis mode). A KvStore that drives the
// sequence with exact dense attention (f32) while every policy under study
// receives the same appends and, at each decode query, makes its own
// selection and computes its own sparse attention output. For each policy,
// layer and query head it accumulates, against the oracle (exact top-k of the
// true scores with the same budgets):
//   token recall  |S_policy ∩ S_oracle| / |S_oracle|   (per KV head)
//   mass recall   Σ_{S_policy} p / Σ_{S_oracle} p       (p: true attention probabilities;
//                 per query head, so it can pass 1 where the oracle's group
//                 aggregate kept tokens another head attends less)
//   output error  ‖o_policy − o_dense‖ / ‖o_dense‖
// Replaying every policy against one dense sequence (rather than letting each
// decode its own text) keeps the inputs identical, so the numbers compare the
// selections and nothing else. "analyze:" alone measures only the attention
// statistics below.
//
// Attention statistics of the dense attention itself, per layer and query
// head at each decode query, tell how concentrated a model's attention is
// (a test model should resemble a real LLM here):
//   entropy       −Σ p log p (nats), and divided by log(n_visible) (1: uniform)
//   top-3 % mass  Σ of the largest ⌈0.03·n_visible⌉ probabilities
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kv/kv_cache.h"
#include "kv/selector.h"

namespace kvtier {

inline constexpr std::string_view kAnalysisPrefix = "analyze:";

struct HeadMetrics {
  double token_recall = 0;  // sums over decode queries
  double mass_recall = 0;
  double rel_error = 0;
  int64_t n = 0;
  double mean_token_recall() const { return n ? token_recall / double(n) : 0; }
  double mean_mass_recall() const { return n ? mass_recall / double(n) : 0; }
  double mean_rel_error() const { return n ? rel_error / double(n) : 0; }
};

struct AttentionStats {
  double entropy = 0;       // sums over decode queries
  double norm_entropy = 0;
  double top_mass = 0;
  int64_t n = 0;
  double mean_entropy() const { return n ? entropy / double(n) : 0; }
  double mean_norm_entropy() const { return n ? norm_entropy / double(n) : 0; }
  double mean_top_mass() const { return n ? top_mass / double(n) : 0; }
};

inline constexpr double k_top_mass_fraction = 0.03;

// Sums of the attention statistics over a set of heads.
AttentionStats sum_attention(const AttentionStats* by_head, int n_head);

// Statistics of one decode query's dense attention. q: [n_head, head_dim];
// k: [n_visible, n_kv_head, head_dim]. Adds into by_head[0..n_head).
void accumulate_attention(const KvGeometry& g, const float* q, float scale, const float* k,
                          int64_t n_visible, double top_fraction, AttentionStats* by_head);

struct PolicyAnalysis {
  std::string policy;           // as given
  std::string resolved;         // to_string of the parsed policy
  std::vector<HeadMetrics> by_head;  // [n_layer, n_head]
  HeadMetrics total() const;
  HeadMetrics layer(int l, int n_head) const;
};

// Metrics of one query for one policy. k, v: [n_visible, n_kv_head, head_dim]
// exact; q: [n_head, head_dim]; out_dense, out_policy: [n_head, head_dim];
// sel / oracle: selections over [0, n_visible). Adds into by_head[0..n_head).
void accumulate_metrics(const KvGeometry& g, const float* q, float scale, const float* k,
                        int64_t n_visible, const float* out_dense, const float* out_policy,
                        const Selection& sel, const Selection& oracle, HeadMetrics* by_head);

// The oracle selection: exact per-token scores aggregated as the policy says,
// top `budget` tokens ∪ sinks ∪ window. k: [n_visible, n_kv_head, head_dim].
void oracle_selection(const KvGeometry& g, const PolicyConfig& p, int64_t budget,
                      const float* q, float scale, const float* k, int64_t n_visible,
                      Selection* out);

// A KvCache on the CPU (created by make_analysis_cache for "analyze:P1|P2|…").
class AnalysisKv final : public KvCache {
 public:
  // policies: "P1|P2|…", each a policy string with a sparse index.
  AnalysisKv(const std::string& policies, const KvGeometry& g, const Device& cpu);
  ~AnalysisKv() override;

  const KvPlan& plan() const override { return dense_plan_; }
  void append(int layer, const void* k_pre, const void* k, const void* v, int64_t tok_stride, int n_tok) override;
  void attend(int layer, const void* q, int64_t q_stride, int n_tok, float scale, void* out) override;
  void start_decode() override;
  void begin_step(int n_tok) override;
  bool decoding() const override { return decoding_; }
  int64_t n_tokens(int layer) const override { return dense_->n_tokens(layer); }
  void reserve(int64_t n) override;
  KvMemory memory() const override { return dense_->memory(); }
  KvStats stats() const override { return {}; }

  const std::vector<PolicyAnalysis>& results() const { return results_; }
  int64_t n_decode_queries() const { return n_queries_; }
  const std::vector<AttentionStats>& attention() const { return attention_; }  // [n_layer, n_head]
  // Per policy: its plan, its budget in tokens, its slot-cache statistics (the
  // share of host rows the previous query also fetched), and the distinct
  // tokens per (KV head, token) host row.
  const KvPlan& policy_plan(size_t i) const;
  int64_t budget_tokens(size_t i) const;
  KvStats policy_stats(size_t i) const;
  double distinct_rate(size_t i) const { return distinct_[i].second ? double(distinct_[i].first) / double(distinct_[i].second) : 0.0; }

 private:
  KvGeometry g_;
  KvPlan dense_plan_;
  std::unique_ptr<KvCache> dense_;
  bool decoding_ = false;
  std::vector<std::unique_ptr<KvCache>> stores_;
  std::vector<PolicyAnalysis> results_;
  std::vector<AttentionStats> attention_;
  std::vector<std::pair<int64_t, int64_t>> distinct_;  // distinct (token) vs (head, token) host rows
  int64_t n_queries_ = 0;
};

}  // namespace kvtier
