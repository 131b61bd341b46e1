// Bootstrap intervals: degenerate cases, agreement with the normal
// approximation, coverage over repeated draws, and pairing in the ratio.
#include <gtest/gtest.h>

#include <cmath>

#include "bench/bench_stats.h"
#include "bench/compose.h"
#include "core/status.h"

namespace kvtier::bench {
namespace {

TEST(Bootstrap, DegenerateCells) {
  const Interval empty = bootstrap_mean({});
  EXPECT_EQ(empty.n, 0);
  EXPECT_EQ(empty.mean, 0);
  const Interval one = bootstrap_mean({42});
  EXPECT_EQ(one.n, 1);
  EXPECT_EQ(one.lo, 42);
  EXPECT_EQ(one.hi, 42);
  const Interval same = bootstrap_mean({7, 7, 7, 7});
  EXPECT_DOUBLE_EQ(same.lo, 7);
  EXPECT_DOUBLE_EQ(same.hi, 7);
  EXPECT_THROW(bootstrap_mean({1, 2}, 1, 0), Error);
  EXPECT_THROW(bootstrap_mean({1, 2}, 1, 100, 1.5), Error);
}

TEST(Bootstrap, MatchesTheNormalApproximationAndIsSeeded) {
  std::vector<double> x;
  for (int i = 0; i < 100; ++i) x.push_back(i);
  const Interval a = bootstrap_mean(x, 3);
  // mean 49.5, standard error 28.87 / sqrt(100) = 2.887: ±5.66 at 95 %.
  EXPECT_DOUBLE_EQ(a.mean, 49.5);
  EXPECT_NEAR(a.lo, 49.5 - 5.66, 0.8);
  EXPECT_NEAR(a.hi, 49.5 + 5.66, 0.8);
  const Interval b = bootstrap_mean(x, 3);
  EXPECT_EQ(a.lo, b.lo);
  EXPECT_EQ(a.hi, b.hi);
  // A narrower level gives a narrower interval.
  const Interval c = bootstrap_mean(x, 3, k_bootstrap_resamples, 0.5);
  EXPECT_GT(c.lo, a.lo);
  EXPECT_LT(c.hi, a.hi);
}

TEST(Bootstrap, CoversTheTrueMeanAboutNinetyFivePercentOfTheTime) {
  // 300 cells of 30 Bernoulli(0.3) scores (0 or 100): the intervals should
  // hold the true mean 30 in roughly 95 % of cells (bootstrap under-covers a little).
  Rng rng(99);
  int covered = 0;
  const int n_cells = 300;
  for (int c = 0; c < n_cells; ++c) {
    std::vector<double> x;
    for (int i = 0; i < 30; ++i) x.push_back(rng.uniform() < 0.3 ? 100.0 : 0.0);
    const Interval iv = bootstrap_mean(x, uint64_t(c) + 1, 1000);
    covered += iv.lo <= 30.0 && 30.0 <= iv.hi;
  }
  const double rate = double(covered) / n_cells;
  EXPECT_GT(rate, 0.88);
  EXPECT_LT(rate, 0.99);
}

TEST(Bootstrap, RatioIsPaired) {
  // Scores vary a lot between samples, but the policy keeps 90 % of full's
  // score on every one: a paired interval is tight around 0.9.
  Rng rng(5);
  std::vector<double> full, policy;
  for (int i = 0; i < 25; ++i) {
    const double f = 10 + 90 * rng.uniform();
    full.push_back(f);
    policy.push_back(0.9 * f);
  }
  const Interval r = bootstrap_ratio(policy, full);
  EXPECT_NEAR(r.mean, 0.9, 1e-12);
  EXPECT_NEAR(r.lo, 0.9, 1e-9);
  EXPECT_NEAR(r.hi, 0.9, 1e-9);
  // Unpaired (the policy's samples in another order), the ratio is uncertain.
  std::vector<double> shuffled = policy;
  rng.shuffle(shuffled);
  const Interval u = bootstrap_ratio(shuffled, full);
  EXPECT_GT(u.hi - u.lo, 0.1);
  EXPECT_EQ(bootstrap_ratio({1, 2}, {0, 0}).n, 0);  // full attention scored 0: no ratio
  EXPECT_EQ(bootstrap_ratio({1, 2}, {0, 0}).mean, 0);
  EXPECT_THROW(bootstrap_ratio({1, 2}, {1}), Error);
}

}  // namespace
}  // namespace kvtier::bench
