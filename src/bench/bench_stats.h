// Means with 95 % percentile-bootstrap intervals over the samples of a bench
// cell, and the paired ratio of two policies' means over the same samples.
// Resampling is seeded, so a summary is the same every time it is rebuilt.
#pragma once
#include <cstdint>
#include <vector>

namespace kvtier::bench {

struct Interval {
  double mean = 0;
  double lo = 0;  // 2.5th percentile of the bootstrap distribution
  double hi = 0;  // 97.5th percentile
  int64_t n = 0;  // samples
};

inline constexpr int k_bootstrap_resamples = 2000;
// Cells with fewer samples than this are flagged in summaries: their
// intervals are wide and the percentile bootstrap under-covers.
inline constexpr int64_t k_min_cell_samples = 20;

// Mean of x with its percentile-bootstrap interval (Efron & Tibshirani,
// "An Introduction to the Bootstrap", ch. 13). n = 0: all zero; n = 1: lo = hi = mean.
Interval bootstrap_mean(const std::vector<double>& x, uint64_t seed = 1, int n_resamples = k_bootstrap_resamples,
                        double level = 0.95);

// mean(num) / mean(den) with a paired bootstrap interval: each resample
// draws the same sample indices for both (num[i], den[i] belong to sample i).
// Resamples whose denominator mean is 0 are skipped. When the denominator's
// own mean is 0 the ratio is undefined: all zero with n = 0.
Interval bootstrap_ratio(const std::vector<double>& num, const std::vector<double>& den, uint64_t seed = 1,
                         int n_resamples = k_bootstrap_resamples, double level = 0.95);

}  // namespace kvtier::bench
