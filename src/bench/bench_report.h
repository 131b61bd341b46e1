// Summaries of bench records: one row per task, context length and policy,
// with 95 % bootstrap intervals on the task score, on the score relative to
// full attention (paired over the same samples) and on the fidelity metrics.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_stats.h"

namespace kvtier::bench {

// Per-sample values of one summary row (for intervals, pairing and pooling).
struct RowSamples {
  std::vector<std::string> score_ids;
  std::vector<double> score;  // 0-100, excluded records left out
  std::vector<double> answer_nll, answer_token_acc, top1_agree_full, kl_full;  // accuracies in %
};

struct SummaryRow {
  std::string task;
  std::string policy;
  int64_t ctx = 0;
  int64_t n = 0;  // scored records in the mean (not excluded)
  int64_t n_excluded = 0;
  int64_t n_fidelity = 0;  // records with fidelity metrics
  Interval score;          // 0-100
  // mean(score) / mean(full's score) over the samples both scored, from the
  // row of policy "full" with the same task and ctx (n = 0: no such pairs,
  // or full attention scored 0 on them).
  Interval score_vs_full;
  Interval answer_nll;        // nats per answer token
  Interval answer_token_acc;  // %
  Interval top1_agree_full;   // %
  Interval kl_full;           // nats per answer token
  // Means over the row's records.
  double context_tokens = 0;
  double gpu_bytes_per_token = 0;
  double host_bytes_per_token = 0;
  double prefill_s = 0;
  double decode_s = 0;
  double new_tokens = 0;
  RowSamples samples;
};

// One row per (task, ctx, policy), in first-seen order.
std::vector<SummaryRow> summarize(const std::vector<nlohmann::json>& records);

// Markdown table; cells with fewer than k_min_cell_samples samples say so.
std::string summary_markdown(const std::vector<SummaryRow>& rows);

// The family of a policy string: its preset, the text before the first ','.
std::string policy_family(const std::string& policy);

}  // namespace kvtier::bench
