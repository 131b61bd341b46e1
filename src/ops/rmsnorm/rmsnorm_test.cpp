#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "ops/rmsnorm/rmsnorm.h"
#include "ops/swiglu/swiglu.h"

namespace kvtier {
namespace {

TEST(RmsNorm, MatchesReference) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int dim : {1, 7, 64, 576}) {
    std::vector<float> x(static_cast<size_t>(4 * dim)), w(static_cast<size_t>(dim)), y(x.size(), NAN), r(x.size());
    for (auto& v : x) v = nd(rng);
    for (auto& v : w) v = nd(rng);
    rmsnorm(x.data(), w.data(), 4, dim, 1e-5f, y.data());
    rmsnorm_ref(x.data(), w.data(), 4, dim, 1e-5f, r.data());
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], r[i], 1e-5f * (1 + std::fabs(r[i])));
  }
}

TEST(SwiGlu, MatchesReference) {
  std::vector<float> g{-30, -2, -0.5f, 0, 0.5f, 2, 30}, u{1, 2, 3, 4, 5, 6, 7}, h(7, NAN), r(7);
  swiglu(g.data(), u.data(), 7, h.data());
  swiglu_ref(g.data(), u.data(), 7, r.data());
  for (int i = 0; i < 7; ++i) EXPECT_NEAR(h[i], r[i], 1e-5f * (1 + std::fabs(r[i])));
  EXPECT_NEAR(r[6], 30 * 7, 1e-3);
  EXPECT_NEAR(r[3], 0, 1e-12);
}

}  // namespace
}  // namespace kvtier
