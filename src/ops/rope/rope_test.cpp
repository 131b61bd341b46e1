#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ops/rope/rope.h"

namespace kvtier {
namespace {

ModelConfig cfg_with(bool interleaved, RopeScaling scaling) {
  ModelConfig c;
  c.head_dim = 64;
  c.rope_theta = 500000.0f;
  c.rope_interleaved = interleaved;
  c.rope_scaling = scaling;
  c.rope_factor = 8.0f;
  c.rope_low_freq_factor = 1.0f;
  c.rope_high_freq_factor = 4.0f;
  c.rope_original_ctx = 8192;
  return c;
}

TEST(Rope, FastMatchesReferenceAndPreservesNorm) {
  for (bool inter : {false, true}) {
    for (auto sc : {RopeScaling::none, RopeScaling::llama3, RopeScaling::linear}) {
      Rope rope(cfg_with(inter, sc));
      std::mt19937 rng(3);
      std::normal_distribution<float> nd;
      std::vector<float> x(5 * 3 * 64);  // [n_tok=5, n_heads=3, head_dim=64]
      for (auto& v : x) v = nd(rng);
      std::vector<int64_t> pos{0, 1, 17, 4095, 100000};
      auto a = x, b = x;
      rope.apply(a.data(), 5, 3, pos.data());
      rope.apply_ref(b.data(), 5, 3, pos.data());
      for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << i;
      for (int r = 0; r < 15; ++r) {
        double n0 = 0, n1 = 0;
        for (int d = 0; d < 64; ++d) {
          n0 += x[r * 64 + d] * double(x[r * 64 + d]);
          n1 += b[r * 64 + d] * double(b[r * 64 + d]);
        }
        EXPECT_NEAR(n0, n1, 1e-3 * n0);
      }
      // Position 0 is the identity.
      for (int d = 0; d < 3 * 64; ++d) EXPECT_FLOAT_EQ(a[d], x[d]);
    }
  }
}

TEST(Rope, Llama3ScalingBands) {
  Rope plain(cfg_with(false, RopeScaling::none)), l3(cfg_with(false, RopeScaling::llama3));
  const auto& f0 = plain.inv_freq();
  const auto& f1 = l3.inv_freq();
  // Highest frequency (short wavelength) unchanged; lowest divided by the factor.
  EXPECT_FLOAT_EQ(f1[0], f0[0]);
  EXPECT_NEAR(f1.back(), f0.back() / 8.0f, 1e-12);
}

TEST(Rope, InterleavedPairsRotateAdjacent) {
  Rope rope(cfg_with(true, RopeScaling::none));
  std::vector<float> x(64, 0.0f);
  x[0] = 1.0f;  // pair (0, 1) at frequency 1: angle = pos
  int64_t pos = 1;
  rope.apply_ref(x.data(), 1, 1, &pos);
  EXPECT_NEAR(x[0], std::cos(1.0), 1e-6);
  EXPECT_NEAR(x[1], std::sin(1.0), 1e-6);
}

}  // namespace
}  // namespace kvtier
