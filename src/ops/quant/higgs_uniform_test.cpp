// HIGGS with U<n> grids (n uniform levels per rotated coordinate): the spec
// string, the levels, the MSE against the Lloyd–Max grid of the same size,
// and score() in integers (quant_format.h) against a plain re-derivation of
// its definition and against q·dequant.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/half.h"
#include "core/status.h"
#include "ops/quant/hadamard.h"
#include "ops/quant/higgs_grid.h"
#include "ops/quant/quant_format.h"

namespace kvtier {
namespace {

TEST(HiggsUniform, SpecStringRoundTripsAndRejectsNonsense) {
  const QuantSpec s = parse_quant_spec("higgs:U4:g128");
  EXPECT_EQ(s.kind, QuantKind::higgs);
  EXPECT_TRUE(s.uniform_levels);
  EXPECT_EQ(s.grid_dim, 1);
  EXPECT_EQ(s.grid_size, 4);
  EXPECT_EQ(s.group, 128);
  EXPECT_EQ(to_string(s), "higgs:U4:g128");
  EXPECT_TRUE(same_format(parse_quant_spec(to_string(s)), s));
  EXPECT_FALSE(same_format(parse_quant_spec("higgs:EDEN1-4:g128"), s));  // same shape, other levels
  EXPECT_EQ(to_string(parse_quant_spec("higgs:U16:rs9")), "higgs:U16:rs9");
  EXPECT_EQ(bytes_per_vector(s, 128), 34u);  // 128 2-bit codes + a bf16 scale
  for (const char* bad : {"higgs:U3", "higgs:U32", "higgs:U", "higgs:Ux", "higgs2:U4", "int4:U4", "higgs:U4:EDEN1-4",
                          "higgs:EDEN1-4:U4"})
    EXPECT_THROW(parse_quant_spec(bad), Error) << bad;
}

TEST(HiggsUniform, LevelsAreEvenAndNearTheLloydMaxMse) {
  // Max (1960): the optimal uniform steps; h keeps 8 significant bits.
  EXPECT_EQ(higgs_uniform_half_step(4), 0.498046875f);
  EXPECT_THROW(higgs_uniform_half_step(5), Error);
  for (int n : {2, 4, 8, 16}) {
    const HiggsGrid& g = higgs_uniform_grid(n);
    const float h = higgs_uniform_half_step(n);
    ASSERT_EQ(g.size, n);
    ASSERT_EQ(g.dim, 1);
    for (int c = 0; c < n; ++c) EXPECT_EQ(g.points[size_t(c)], float(2 * c - (n - 1)) * h) << n << " " << c;
    EXPECT_NEAR(h, [n] { return n == 2 ? 0.798 : n == 4 ? 0.49785 : n == 8 ? 0.293 : 0.1676; }(), 2e-3) << n;
    // Uniform levels cost little against Lloyd–Max's (n = 4: 0.1188 vs 0.1175)
    // and are never better.
    const double u = grid_gaussian_mse(g.points.data(), n, 1, 200000, 5);
    const double l = grid_gaussian_mse(higgs_grid(1, n).points.data(), n, 1, 200000, 5);
    EXPECT_GE(u, l * 0.999) << n;
    EXPECT_LT(u, l * 1.25) << n;  // n = 16: 0.0115 vs 0.0095
  }
  EXPECT_EQ(&higgs_grid_of(parse_quant_spec("higgs:U8")), &higgs_uniform_grid(8));
  EXPECT_EQ(&higgs_grid_of(parse_quant_spec("higgs:EDEN1-8")), &higgs_grid(1, 8));
}

// score() re-derived from quant_format.h with plain loops: per group the
// rotated query as int8, the codes read bit by bit.
std::vector<float> int8_scores(const QuantSpec& s, const std::vector<float>& q, int n_q, const std::vector<uint8_t>& rec,
                               int64_t n_vec, int dim) {
  const int G = resolved_group(s, dim), n_group = dim / G, n = s.grid_size, bits = int(std::log2(n));
  const size_t bpv = bytes_per_vector(s, dim), code_bytes = size_t(G * bits + 7) / 8;
  const float h = higgs_uniform_half_step(n);
  std::vector<float> signs(size_t(G), 1.f), out(size_t(n_q * n_vec));
  if (s.random_signs) hadamard_signs(s.sign_seed, G, signs.data());
  for (int j = 0; j < n_q; ++j)
    for (int64_t v = 0; v < n_vec; ++v) {
      float total = 0.f;
      for (int g = 0; g < n_group; ++g) {
        std::vector<float> qg(static_cast<size_t>(G));
        for (int i = 0; i < G; ++i) qg[size_t(i)] = signs[size_t(i)] * q[size_t(j * dim + g * G + i)];
        hadamard_transform(qg.data(), G);
        float amax = 0.f;
        for (float x : qg) amax = std::max(amax, std::fabs(x));
        const float inv = amax > 0 ? 127.f / amax : 0.f, factor = amax > 0 ? h * (amax / 127.f) : 0.f;
        const uint8_t* codes = rec.data() + size_t(v) * bpv + size_t(g) * code_bytes;
        int32_t dot = 0, sum = 0;
        for (int i = 0; i < G; ++i) {
          const int32_t q8 = int32_t(std::nearbyint(qg[size_t(i)] * inv));
          int32_t c = 0;
          for (int b = 0; b < bits; ++b) c |= ((codes[size_t(i * bits + b) / 8] >> ((i * bits + b) % 8)) & 1) << b;
          dot += q8 * c;
          sum += q8;
        }
        const uint16_t sig = uint16_t(rec[size_t(v) * bpv + code_bytes * n_group + 2 * g] |
                                      rec[size_t(v) * bpv + code_bytes * n_group + 2 * g + 1] << 8);
        const float sigma = bf16_to_f32(sig);
        total += (sigma * factor) * float(2 * dot - (n - 1) * sum);
      }
      out[size_t(j * n_vec + v)] = total;
    }
  return out;
}

TEST(HiggsUniform, ScoresAreTheInt8DefinitionAndCloseToTheDequantizedDot) {
  // U4 at 128 (the GPU's planar index; enough records for the byte table),
  // two groups with random signs, and 8 and 16 levels (codes unpacked).
  struct Case {
    const char* spec;
    int dim, n_q;
    int64_t n_vec;
  };
  // (U4 with more than 4 queries takes the per-query table instead of the side-by-side one.)
  for (const Case c : {Case{"higgs:U4:g128", 128, 4, 300}, Case{"higgs:U4:g128:rs", 256, 3, 40},
                       Case{"higgs:U4:g128", 128, 6, 300},
                       Case{"higgs:U8:g64", 128, 2, 50}, Case{"higgs:U16", 64, 1, 20}, Case{"higgs:U2:g32", 64, 2, 30}}) {
    SCOPED_TRACE(c.spec);
    const QuantSpec s = parse_quant_spec(c.spec);
    std::vector<float> x(size_t(c.n_vec * c.dim)), q(size_t(c.n_q * c.dim));
    gaussian_fill(x.data(), int64_t(x.size()), 31);
    gaussian_fill(q.data(), int64_t(q.size()), 32);
    for (size_t i = 0; i < x.size(); i += 9) x[i] *= 6.f;  // outliers
    std::vector<uint8_t> rec(bytes_per_vector(s, c.dim) * size_t(c.n_vec));
    quantize(s, x.data(), c.n_vec, c.dim, rec.data());
    std::vector<float> got(size_t(c.n_q * c.n_vec)), xh(x.size());
    ScoreParams sp;
    sp.q = q.data(), sp.n_q = c.n_q, sp.codes = rec.data(), sp.n_vec = c.n_vec, sp.dim = c.dim, sp.scores = got.data();
    score(s, sp);
    const auto want = int8_scores(s, q, c.n_q, rec, c.n_vec, c.dim);
    dequantize(s, rec.data(), c.n_vec, c.dim, xh.data());
    for (int j = 0; j < c.n_q; ++j)
      for (int64_t v = 0; v < c.n_vec; ++v) {
        const size_t at = size_t(j * c.n_vec + v);
        ASSERT_EQ(got[at], want[at]) << j << " " << v;
        double dot = 0, nq = 0, nx = 0;
        for (int i = 0; i < c.dim; ++i) {
          dot += double(q[size_t(j * c.dim + i)]) * xh[size_t(v * c.dim + i)];
          nq += double(q[size_t(j * c.dim + i)]) * q[size_t(j * c.dim + i)];
          nx += double(xh[size_t(v * c.dim + i)]) * xh[size_t(v * c.dim + i)];
        }
        // int8 rounding: at most ½ of amax/127 per rotated query value.
        EXPECT_NEAR(got[at], dot, 0.02 * std::sqrt(nq * nx)) << j << " " << v;
      }
  }
}

TEST(HiggsUniform, CodesAreTheNearestLevel) {
  const QuantSpec s = parse_quant_spec("higgs:U4:g128");
  std::vector<float> x(128 * 8);
  gaussian_fill(x.data(), int64_t(x.size()), 41);
  std::vector<uint8_t> a(34 * 8), b(34 * 8);
  quantize(s, x.data(), 8, 128, a.data());
  quantize_ref(s, x.data(), 8, 128, b.data());
  int diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += a[i] != b[i];
  EXPECT_LE(diff, 1);  // f32 against f64 at a near-tie at most
  std::vector<float> y(x.size());
  dequantize(s, a.data(), 8, 128, y.data());
  double e = 0, n2 = 0;
  for (size_t i = 0; i < x.size(); ++i) e += (x[i] - y[i]) * double(x[i] - y[i]), n2 += double(x[i]) * x[i];
  EXPECT_LT(e / n2, 0.13);  // U4's MSE per unit variance, 0.119, plus the bf16 scale
  EXPECT_GT(e / n2, 0.10);
}

}  // namespace
}  // namespace kvtier
