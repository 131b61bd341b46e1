#include "bench/bench_stats.h"

#include <algorithm>
#include <cmath>

#include "bench/compose.h"
#include "core/status.h"

namespace kvtier::bench {

namespace {

double mean_of(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v;
  return x.empty() ? 0.0 : s / static_cast<double>(x.size());
}

// The q-quantile of sorted values, linear interpolation between order statistics.
double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double at = q * static_cast<double>(sorted.size() - 1);
  const size_t i = static_cast<size_t>(std::floor(at));
  const size_t j = std::min(i + 1, sorted.size() - 1);
  return sorted[i] + (at - static_cast<double>(i)) * (sorted[j] - sorted[i]);
}

void check_args(int n_resamples, double level) {
  KVT_CHECK(n_resamples >= 1, "bootstrap: {} resamples (need ≥ 1)", n_resamples);
  KVT_CHECK(level > 0 && level < 1, "bootstrap: level {} outside (0, 1)", level);
}

}  // namespace

Interval bootstrap_mean(const std::vector<double>& x, uint64_t seed, int n_resamples, double level) {
  check_args(n_resamples, level);
  Interval r;
  r.n = static_cast<int64_t>(x.size());
  r.mean = r.lo = r.hi = mean_of(x);
  if (x.size() < 2) return r;
  Rng rng(seed);
  std::vector<double> means(static_cast<size_t>(n_resamples));
  for (double& m : means) {
    double s = 0;
    for (size_t i = 0; i < x.size(); ++i) s += x[rng.below(x.size())];
    m = s / static_cast<double>(x.size());
  }
  std::sort(means.begin(), means.end());
  r.lo = quantile(means, (1 - level) / 2);
  r.hi = quantile(means, 1 - (1 - level) / 2);
  return r;
}

Interval bootstrap_ratio(const std::vector<double>& num, const std::vector<double>& den, uint64_t seed,
                         int n_resamples, double level) {
  check_args(n_resamples, level);
  KVT_CHECK(num.size() == den.size(), "bootstrap ratio: {} numerators, {} denominators", num.size(), den.size());
  Interval r;
  const double d = mean_of(den);
  if (d == 0) return r;
  r.n = static_cast<int64_t>(num.size());
  r.mean = r.lo = r.hi = mean_of(num) / d;
  if (num.size() < 2) return r;
  Rng rng(seed);
  std::vector<double> ratios;
  ratios.reserve(static_cast<size_t>(n_resamples));
  for (int b = 0; b < n_resamples; ++b) {
    double sn = 0, sd = 0;
    for (size_t i = 0; i < num.size(); ++i) {
      const size_t k = rng.below(num.size());
      sn += num[k];
      sd += den[k];
    }
    if (sd != 0) ratios.push_back(sn / sd);
  }
  if (ratios.empty()) return r;
  std::sort(ratios.begin(), ratios.end());
  r.lo = quantile(ratios, (1 - level) / 2);
  r.hi = quantile(ratios, 1 - (1 - level) / 2);
  return r;
}

}  // namespace kvtier::bench
