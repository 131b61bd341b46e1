#include "bench/bench_report.h"

#include <fmt/format.h>

#include <map>

namespace kvtier::bench {

using nlohmann::json;

namespace {

// Seeds of the bootstrap: one per metric, so that rows are reproducible.
enum : uint64_t { k_seed_score = 11, k_seed_ratio, k_seed_nll, k_seed_acc, k_seed_agree, k_seed_kl };

std::string cell_key(const std::string& task, int64_t ctx) { return fmt::format("{}\x1f{}", task, ctx); }

}  // namespace

std::vector<SummaryRow> summarize(const std::vector<json>& records) {
  std::vector<SummaryRow> rows;
  std::map<std::string, size_t> index;
  std::vector<int64_t> n_records;
  for (const auto& r : records) {
    const std::string key = fmt::format("{}\x1f{}\x1f{}", r.value("task", ""), r.value("ctx", int64_t{0}),
                                        r.value("policy", ""));
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, rows.size()).first;
      SummaryRow row;
      row.task = r.value("task", "");
      row.policy = r.value("policy", "");
      row.ctx = r.value("ctx", int64_t{0});
      rows.push_back(row);
      n_records.push_back(0);
    }
    SummaryRow& row = rows[it->second];
    if (r.value("excluded", false)) {
      ++row.n_excluded;
      continue;
    }
    ++n_records[it->second];
    if (r.contains("score")) {
      row.samples.score_ids.push_back(r.value("id", ""));
      row.samples.score.push_back(r.value("score", 0.0));
    }
    if (r.contains("kl_full")) {
      row.samples.answer_nll.push_back(r.value("answer_nll", 0.0));
      row.samples.answer_token_acc.push_back(100.0 * r.value("answer_token_acc", 0.0));
      row.samples.top1_agree_full.push_back(100.0 * r.value("top1_agree_full", 0.0));
      row.samples.kl_full.push_back(r.value("kl_full", 0.0));
    }
    row.context_tokens += static_cast<double>(r.value("context_tokens", int64_t{0}));
    row.gpu_bytes_per_token += r.value("gpu_bytes_per_token", 0.0);
    row.host_bytes_per_token += r.value("host_bytes_per_token", 0.0);
    row.prefill_s += r.value("prefill_s", 0.0);
    row.decode_s += r.value("decode_s", 0.0);
    row.new_tokens += static_cast<double>(r.value("n_new_tokens", int64_t{0}));
  }
  // Full attention's score per sample of each (task, ctx), for the paired ratio.
  std::map<std::string, std::map<std::string, double>> full_scores;
  for (const auto& row : rows) {
    if (row.policy != "full") continue;
    auto& m = full_scores[cell_key(row.task, row.ctx)];
    for (size_t i = 0; i < row.samples.score.size(); ++i) m[row.samples.score_ids[i]] = row.samples.score[i];
  }
  for (size_t k = 0; k < rows.size(); ++k) {
    SummaryRow& row = rows[k];
    const RowSamples& s = row.samples;
    row.n = static_cast<int64_t>(s.score.size());
    row.n_fidelity = static_cast<int64_t>(s.kl_full.size());
    row.score = bootstrap_mean(s.score, k_seed_score);
    row.answer_nll = bootstrap_mean(s.answer_nll, k_seed_nll);
    row.answer_token_acc = bootstrap_mean(s.answer_token_acc, k_seed_acc);
    row.top1_agree_full = bootstrap_mean(s.top1_agree_full, k_seed_agree);
    row.kl_full = bootstrap_mean(s.kl_full, k_seed_kl);
    auto full = full_scores.find(cell_key(row.task, row.ctx));
    if (full != full_scores.end()) {
      std::vector<double> num, den;
      for (size_t i = 0; i < s.score.size(); ++i) {
        auto f = full->second.find(s.score_ids[i]);
        if (f == full->second.end()) continue;
        num.push_back(s.score[i]);
        den.push_back(f->second);
      }
      row.score_vs_full = bootstrap_ratio(num, den, k_seed_ratio);
    }
    if (n_records[k] == 0) continue;
    const double n = static_cast<double>(n_records[k]);
    for (double* v : {&row.context_tokens, &row.gpu_bytes_per_token, &row.host_bytes_per_token, &row.prefill_s,
                      &row.decode_s, &row.new_tokens})
      *v /= n;
  }
  return rows;
}

namespace {

std::string with_interval(const Interval& x, int digits) {
  if (x.n == 0) return "–";
  if (x.n == 1) return fmt::format("{:.{}f}", x.mean, digits);
  return fmt::format("{:.{}f} [{:.{}f}, {:.{}f}]", x.mean, digits, x.lo, digits, x.hi, digits);
}

std::string sample_count(int64_t n) {
  return n > 0 && n < k_min_cell_samples ? fmt::format("{} (< {})", n, k_min_cell_samples) : fmt::format("{}", n);
}

}  // namespace

std::string summary_markdown(const std::vector<SummaryRow>& rows) {
  bool fidelity = false, small = false;
  for (const auto& r : rows) {
    fidelity = fidelity || r.n_fidelity > 0;
    small = small || (r.n > 0 && r.n < k_min_cell_samples) || (r.n_fidelity > 0 && r.n_fidelity < k_min_cell_samples);
  }
  std::string out = "| task | ctx | policy | n | score [95% CI] | ÷ full [95% CI] |";
  std::string rule = "|---|---|---|---|---|---|";
  if (fidelity) {
    out += " n fid. | answer NLL | answer top-1 % | top-1 = full % | KL(full‖policy) |";
    rule += "---|---|---|---|---|";
  }
  out += " GPU KV B/token | host KV B/token | context tokens | prefill s | decode s | new tokens |\n";
  rule += "---|---|---|---|---|---|\n";
  out += rule;
  for (const auto& r : rows) {
    out += fmt::format("| {} | {} | {} | {}{} | {} | {} |", r.task, r.ctx, r.policy, sample_count(r.n),
                       r.n_excluded ? fmt::format(" (+{} excl.)", r.n_excluded) : "", with_interval(r.score, 1),
                       with_interval(r.score_vs_full, 3));
    if (fidelity)
      out += fmt::format(" {} | {} | {} | {} | {} |", sample_count(r.n_fidelity), with_interval(r.answer_nll, 3),
                         with_interval(r.answer_token_acc, 1), with_interval(r.top1_agree_full, 1),
                         with_interval(r.kl_full, 4));
    out += fmt::format(" {:.1f} | {:.1f} | {:.0f} | {:.2f} | {:.2f} | {:.0f} |\n", r.gpu_bytes_per_token,
                       r.host_bytes_per_token, r.context_tokens, r.prefill_s, r.decode_s, r.new_tokens);
  }
  out += "\nIntervals: 95 % percentile bootstrap over the cell's samples (÷ full: paired, same samples).";
  if (fidelity)
    out += " Fidelity: the reference answer decoded teacher-forced under each policy, compared token by token "
           "with full attention (NLL and KL in nats per answer token).";
  out += "\n";
  if (small)
    out += fmt::format("A count marked (< {}) is a cell with fewer samples than the {} it needs: its intervals are "
                       "wide and under-cover.\n",
                       k_min_cell_samples, k_min_cell_samples);
  return out;
}

std::string policy_family(const std::string& policy) { return policy.substr(0, policy.find(',')); }

}  // namespace kvtier::bench
