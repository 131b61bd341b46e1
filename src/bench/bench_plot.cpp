#include "bench/bench_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace kvtier::bench {

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

// A policy of a task, its samples pooled over context lengths.
struct Point {
  std::string policy;
  double bytes = 0;  // mean GPU KV bytes per token over the rows
  int64_t n_rows = 0;
  RowSamples pooled;
};

struct Metric {
  const char* title;  // panel title suffix and axis label
  std::vector<double> RowSamples::*values;
  bool percent;  // 0-100 axis; otherwise 0 to the largest upper bound
  uint64_t seed;
};

const Metric k_metrics[] = {
    {"score", &RowSamples::score, true, 11},
    {"top-1 agreement with full attention (%)", &RowSamples::top1_agree_full, true, 15},
    {"KL(full ‖ policy), nats per answer token", &RowSamples::kl_full, false, 16},
};

void append(std::vector<double>& to, const std::vector<double>& from) { to.insert(to.end(), from.begin(), from.end()); }

}  // namespace

std::string score_vs_memory_svg(const std::vector<SummaryRow>& rows) {
  std::vector<std::string> task_order;
  std::map<std::string, std::map<std::string, Point>> per_task;
  for (const auto& r : rows) {
    if (r.n == 0 && r.n_fidelity == 0) continue;
    if (!per_task.count(r.task)) task_order.push_back(r.task);
    Point& p = per_task[r.task][r.policy];
    p.policy = r.policy;
    p.bytes += r.gpu_bytes_per_token;
    ++p.n_rows;
    append(p.pooled.score, r.samples.score);
    append(p.pooled.top1_agree_full, r.samples.top1_agree_full);
    append(p.pooled.kl_full, r.samples.kl_full);
  }
  struct Panel {
    std::string task;
    const Metric* metric;
  };
  std::vector<Panel> panels;
  for (const auto& t : task_order)
    for (const Metric& m : k_metrics) {
      bool any = false;
      for (const auto& [_, p] : per_task[t]) any = any || !(p.pooled.*(m.values)).empty();
      if (any) panels.push_back({t, &m});
    }
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
  const double w = 640, panel_h = 360, ml = 70, mr = 150, mt = 40, mb = 50;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      w, panel_h * static_cast<double>(std::max<size_t>(1, panels.size())));
  std::map<std::string, const char*> family_color;
  for (size_t k = 0; k < panels.size(); ++k) {
    const Metric& m = *panels[k].metric;
    const double y0 = panel_h * static_cast<double>(k);
    struct Drawn {
      double x;
      Interval y;
      std::string policy;
    };
    std::map<std::string, std::vector<Drawn>> fam;
    double xmin = 1e300, xmax = 0, ymax = 0;
    for (const auto& [name, p] : per_task[panels[k].task]) {
      const std::vector<double>& v = p.pooled.*(m.values);
      if (v.empty()) continue;
      const double x = p.bytes / static_cast<double>(p.n_rows);
      const Interval y = bootstrap_mean(v, m.seed);
      fam[policy_family(name)].push_back({x, y, name});
      xmin = std::min(xmin, x);
      xmax = std::max(xmax, x);
      ymax = std::max(ymax, y.hi);
    }
    if (xmin <= 0) xmin = std::max(1e-3, xmax / 1000);
    const bool log_x = xmax > 10 * xmin;
    const double ytop = m.percent ? 100.0 : (ymax > 0 ? ymax * 1.1 : 1.0);
    auto fx = [&](double x) {
      double lo = log_x ? std::log10(xmin) - 0.1 : xmin * 0.9, hi = log_x ? std::log10(xmax) + 0.1 : xmax * 1.1;
      if (hi <= lo) hi = lo + 1;
      const double v = log_x ? std::log10(std::max(x, xmin)) : x;
      return ml + (v - lo) / (hi - lo) * (w - ml - mr);
    };
    auto fy = [&](double s) { return y0 + mt + (ytop - s) / ytop * (panel_h - mt - mb); };
    svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"14\">{}{}</text>\n", ml, y0 + 22,
                       xml_escape(panels[k].task), m.values == &RowSamples::score ? "" : " — fidelity");
    svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#444\"/>\n", ml,
                       y0 + mt, w - ml - mr, panel_h - mt - mb);
    for (int t = 0; t <= 4; ++t) {
      const double s = ytop * t / 4;
      svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", ml - 6, fy(s) + 4,
                         m.percent ? fmt::format("{:.0f}", s) : fmt::format("{:.3g}", s));
    }
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">GPU KV bytes per token{}</text>\n",
                       (ml + w - mr) / 2, y0 + panel_h - 12, log_x ? " (log scale)" : "");
    svg += fmt::format("<text transform=\"translate({},{}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n", 18,
                       y0 + panel_h / 2, xml_escape(m.title));
    // One polyline per family through its policies, by increasing memory.
    double legend_y = y0 + mt + 10;
    std::vector<double> xs;
    for (auto& [f, pts] : fam) {
      std::sort(pts.begin(), pts.end(), [](const Drawn& a, const Drawn& b) { return a.x < b.x; });
      if (!family_color.count(f)) family_color[f] = colors[family_color.size() % 8];
      const char* col = family_color[f];
      std::string path;
      for (const auto& d : pts) path += fmt::format("{:.1f},{:.1f} ", fx(d.x), fy(d.y.mean));
      svg += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n", path, col);
      for (const auto& d : pts) {
        xs.push_back(d.x);
        if (d.y.hi > d.y.lo)
          svg += fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"{3}\"/>\n",
                             fx(d.x), fy(d.y.lo), fy(d.y.hi), col);
        svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\" fill=\"{}\"><title>{}: {:.{}f} [{:.{}f}, "
                           "{:.{}f}] (n = {}) at {:.0f} B/token</title></circle>\n",
                           fx(d.x), fy(d.y.mean), col, xml_escape(d.policy), d.y.mean, m.percent ? 1 : 4, d.y.lo,
                           m.percent ? 1 : 4, d.y.hi, m.percent ? 1 : 4, d.y.n, d.x);
      }
      svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>\n",
                         w - mr + 12, legend_y - 10, col, w - mr + 30, legend_y, xml_escape(f));
      legend_y += 18;
    }
    // x tick labels at the points' memory values
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
