#include "bench/bench_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>

namespace kvtier::bench {

using nlohmann::json;

std::vector<SummaryRow> summarize(const std::vector<json>& records) {
  std::vector<SummaryRow> rows;
  std::map<std::string, size_t> index;
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
    }
    SummaryRow& row = rows[it->second];
    if (r.value("excluded", false)) {
      ++row.n_excluded;
      continue;
    }
    ++row.n;
    row.score += r.value("score", 0.0);
    row.context_tokens += static_cast<double>(r.value("context_tokens", int64_t{0}));
    row.gpu_bytes_per_token += r.value("gpu_bytes_per_token", 0.0);
    row.host_bytes_per_token += r.value("host_bytes_per_token", 0.0);
    row.prefill_s += r.value("prefill_s", 0.0);
    row.decode_s += r.value("decode_s", 0.0);
    row.new_tokens += static_cast<double>(r.value("n_new_tokens", int64_t{0}));
  }
  for (auto& row : rows) {
    if (row.n == 0) continue;
    const double n = static_cast<double>(row.n);
    for (double* v : {&row.score, &row.context_tokens, &row.gpu_bytes_per_token, &row.host_bytes_per_token,
                      &row.prefill_s, &row.decode_s, &row.new_tokens})
      *v /= n;
  }
  return rows;
}

std::string summary_markdown(const std::vector<SummaryRow>& rows) {
  std::string out =
      "| task | ctx | policy | n | score | context tokens | GPU KV B/token | host KV B/token | prefill s | decode s "
      "| new tokens |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : rows) {
    out += fmt::format("| {} | {} | {} | {}{} | {:.1f} | {:.0f} | {:.1f} | {:.1f} | {:.2f} | {:.2f} | {:.0f} |\n",
                       r.task, r.ctx, r.policy, r.n, r.n_excluded ? fmt::format(" (+{} excl.)", r.n_excluded) : "",
                       r.score, r.context_tokens, r.gpu_bytes_per_token, r.host_bytes_per_token, r.prefill_s,
                       r.decode_s, r.new_tokens);
  }
  return out;
}

std::string policy_family(const std::string& policy) { return policy.substr(0, policy.find(',')); }

namespace {

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

}  // namespace

std::string score_vs_memory_svg(const std::vector<SummaryRow>& rows) {
  // task -> policy -> (sum score, sum bytes, n) over context lengths
  std::map<std::string, std::map<std::string, std::array<double, 3>>> per_task;
  std::vector<std::string> task_order;
  for (const auto& r : rows) {
    if (r.n == 0) continue;
    if (!per_task.count(r.task)) task_order.push_back(r.task);
    auto& a = per_task[r.task][r.policy];
    a[0] += r.score;
    a[1] += r.gpu_bytes_per_token;
    a[2] += 1;
  }
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
  const double w = 640, panel_h = 360, ml = 70, mr = 150, mt = 40, mb = 50;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      w, panel_h * static_cast<double>(std::max<size_t>(1, task_order.size())));
  std::map<std::string, const char*> family_color;
  for (size_t t = 0; t < task_order.size(); ++t) {
    const double y0 = panel_h * static_cast<double>(t);
    const auto& pol = per_task[task_order[t]];
    double xmin = 1e300, xmax = 0;
    for (const auto& [p, a] : pol) {
      const double x = a[1] / a[2];
      xmin = std::min(xmin, x);
      xmax = std::max(xmax, x);
    }
    if (xmin <= 0) xmin = std::max(1e-3, xmax / 1000);
    const bool log_x = xmax > 10 * xmin;
    auto fx = [&](double x) {
      double lo = log_x ? std::log10(xmin) - 0.1 : xmin * 0.9, hi = log_x ? std::log10(xmax) + 0.1 : xmax * 1.1;
      if (hi <= lo) hi = lo + 1;
      const double v = log_x ? std::log10(std::max(x, xmin)) : x;
      return ml + (v - lo) / (hi - lo) * (w - ml - mr);
    };
    auto fy = [&](double s) { return y0 + mt + (100 - s) / 100 * (panel_h - mt - mb); };
    svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"14\">{}</text>\n", ml, y0 + 22, xml_escape(task_order[t]));
    svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#444\"/>\n", ml,
                       y0 + mt, w - ml - mr, panel_h - mt - mb);
    for (int s = 0; s <= 100; s += 25)
      svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", ml - 6, fy(s) + 4, s);
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">GPU KV bytes per token{}</text>\n",
                       (ml + w - mr) / 2, y0 + panel_h - 12, log_x ? " (log scale)" : "");
    svg += fmt::format("<text transform=\"translate({},{}) rotate(-90)\" text-anchor=\"middle\">score</text>\n", 18,
                       y0 + panel_h / 2);
    // One polyline per family through its policies, by increasing memory.
    std::map<std::string, std::vector<std::tuple<double, double, std::string>>> fam;
    for (const auto& [p, a] : pol) fam[policy_family(p)].emplace_back(a[1] / a[2], a[0] / a[2], p);
    double legend_y = y0 + mt + 10;
    for (auto& [f, pts] : fam) {
      std::sort(pts.begin(), pts.end());
      if (!family_color.count(f)) family_color[f] = colors[family_color.size() % 8];
      const char* col = family_color[f];
      std::string path;
      for (const auto& [x, y, p] : pts) path += fmt::format("{:.1f},{:.1f} ", fx(x), fy(y));
      svg += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n", path, col);
      for (const auto& [x, y, p] : pts)
        svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\" fill=\"{}\"><title>{}: {:.1f} at {:.0f} "
                           "B/token</title></circle>\n",
                           fx(x), fy(y), col, xml_escape(p), y, x);
      svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>\n",
                         w - mr + 12, legend_y - 10, col, w - mr + 30, legend_y, xml_escape(f));
      legend_y += 18;
    }
    // x tick labels at the points' memory values
    std::vector<double> xs;
    for (const auto& [p, a] : pol) xs.push_back(a[1] / a[2]);
    std::sort(xs.begin(), xs.end());
    xs.erase(std::unique(xs.begin(), xs.end()), xs.end());
    double last_px = -1e9;
    for (double x : xs) {
      if (fx(x) - last_px < 40) continue;
      last_px = fx(x);
      svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{:.0f}</text>\n", fx(x),
                         y0 + panel_h - mb + 16, x);
    }
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace kvtier::bench
