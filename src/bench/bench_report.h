// Summaries of bench records: a Markdown table per task and policy, and an SVG
// plot of score against GPU KV bytes per token, one line per policy family.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvtier::bench {

struct SummaryRow {
  std::string task;
  std::string policy;
  int64_t ctx = 0;
  int64_t n = 0;  // records in the mean (not excluded)
  int64_t n_excluded = 0;
  double score = 0;  // mean, 0-100
  double context_tokens = 0;
  double gpu_bytes_per_token = 0;
  double host_bytes_per_token = 0;
  double prefill_s = 0;
  double decode_s = 0;
  double new_tokens = 0;
};

// One row per (task, ctx, policy), in first-seen order.
std::vector<SummaryRow> summarize(const std::vector<nlohmann::json>& records);
std::string summary_markdown(const std::vector<SummaryRow>& rows);

// The family of a policy string: its preset, the text before the first ','.
std::string policy_family(const std::string& policy);

// SVG: one panel per task (mean over its context lengths per policy), x =
// GPU KV bytes per token (log scale when it spans more than 10x), y = score.
std::string score_vs_memory_svg(const std::vector<SummaryRow>& rows);

}  // namespace kvtier::bench
