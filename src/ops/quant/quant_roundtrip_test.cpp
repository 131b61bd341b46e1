// Every format: fast quantize/dequantize equal the reference bit for bit
// (HIGGS: see higgs_test.cpp), exact round trips on representable values,
// error bounds of the uniform quantizer, and score() fast vs reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/half.h"
#include "core/status.h"
#include "ops/quant/higgs_grid.h"
#include "ops/quant/quant_format.h"
#include "ops/quant/quant_scalar.h"

namespace kvtier {
namespace {

// [n_vec, dim] f32: Gaussian with a different scale per vector and a few outliers.
std::vector<float> test_vectors(int64_t n_vec, int dim, uint64_t seed) {
  std::vector<float> x(static_cast<size_t>(n_vec * dim));
  gaussian_fill(x.data(), int64_t(x.size()), seed);
  for (int64_t v = 0; v < n_vec; ++v) {
    float scale = std::ldexp(1.0f, int(v % 13) - 6);
    for (int i = 0; i < dim; ++i) x[size_t(v * dim + i)] *= scale * ((i % 37 == 5) ? 20.0f : 1.0f);
  }
  return x;
}

TEST(QuantRoundTrip, FastEqualsReferenceBitForBit) {
  const int dim = 128, n_vec = 40;
  std::vector<float> x = test_vectors(n_vec, dim, 1);
  for (const char* text : {"f32", "bf16", "fp8", "fp8s", "nvfp4", "int8", "int4", "int4:g32", "int3:g64",
                           "int2:g16", "1bit", "1bit:g32", "int1", "int5:g128", "int7:g8"}) {
    QuantSpec spec = parse_quant_spec(text);
    if (spec.kind == QuantKind::nvfp4) spec.tensor_scale = nvfp4_tensor_scale(x.data(), int64_t(x.size()));
    size_t bpv = bytes_per_vector(spec, dim);
    std::vector<uint8_t> a(bpv * n_vec, 0xcd), b(bpv * n_vec, 0xab);
    quantize(spec, x.data(), n_vec, dim, a.data());
    quantize_ref(spec, x.data(), n_vec, dim, b.data());
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0) << text;
    std::vector<float> ya(x.size()), yb(x.size());
    dequantize(spec, a.data(), n_vec, dim, ya.data());
    dequantize_ref(spec, a.data(), n_vec, dim, yb.data());
    ASSERT_EQ(std::memcmp(ya.data(), yb.data(), ya.size() * 4), 0) << text;
  }
}

TEST(QuantRoundTrip, Fp8ExactOnRepresentableValues) {
  std::vector<float> x;  // every finite E4M3 value: [252] f32
  for (int c = 0; c < 256; ++c)
    if ((c & 0x7f) != 0x7f && c != 0x80) x.push_back(e4m3_to_f32(uint8_t(c)));
  const int dim = int(x.size());
  for (float scale : {1.0f, 0.25f, 64.0f}) {  // fp8s: x·scale → stored scale = scale exactly
    std::vector<float> xs(x.size()), y(x.size());
    for (size_t i = 0; i < x.size(); ++i) xs[i] = x[i] * scale;
    for (const char* text : {"fp8", "fp8s"}) {
      if (std::string(text) == "fp8" && scale != 1.0f) continue;
      QuantSpec spec = parse_quant_spec(text);
      std::vector<uint8_t> q(bytes_per_vector(spec, dim));
      quantize(spec, xs.data(), 1, dim, q.data());
      dequantize(spec, q.data(), 1, dim, y.data());
      for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], xs[i]) << text << " scale " << scale;
    }
  }
  // unscaled fp8 saturates; scaled fp8 does not
  std::vector<float> big = {1000.0f, -3000.0f, 1.0f, 0.0f};
  std::vector<float> y(4);
  std::vector<uint8_t> q(8);
  quantize(parse_quant_spec("fp8"), big.data(), 1, 4, q.data());
  dequantize(parse_quant_spec("fp8"), q.data(), 1, 4, y.data());
  EXPECT_EQ(y[0], 448.0f);
  EXPECT_EQ(y[1], -448.0f);
  quantize(parse_quant_spec("fp8s"), big.data(), 1, 4, q.data());
  dequantize(parse_quant_spec("fp8s"), q.data(), 1, 4, y.data());
  EXPECT_FLOAT_EQ(y[1], -3000.0f);
  EXPECT_NEAR(y[0], 1000.0f, 1000.0f / 16);
}

TEST(QuantRoundTrip, Nvfp4ExactOnRepresentableValues) {
  const float mags[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  const int dim = 64;
  for (float ts : {1.0f, 0.0625f, 3.0f}) {
    std::vector<float> x(dim);  // [4 blocks of 16]: E2M1 value × E4M3 block scale × tensor scale
    const float block_scales[4] = {1.0f, 0.75f, 20.0f, 0.015625f};
    for (int i = 0; i < dim; ++i) {
      int c = (i * 5 + i / 16) % 8;
      if (i % 16 == 3) c = 7;  // every block holds ±6, so its scale is amax/6 exactly
      x[size_t(i)] = ((i % 3 == 0) ? -1.0f : 1.0f) * mags[c] * block_scales[i / 16] * ts;
    }
    QuantSpec spec = parse_quant_spec("nvfp4");
    spec.tensor_scale = ts;
    std::vector<uint8_t> q(bytes_per_vector(spec, dim));
    std::vector<float> y(dim);
    quantize(spec, x.data(), 1, dim, q.data());
    dequantize(spec, q.data(), 1, dim, y.data());
    for (int i = 0; i < dim; ++i) ASSERT_EQ(y[size_t(i)], x[size_t(i)]) << "ts " << ts << " i " << i;
  }
  // A block scale beyond E4M3's 448 saturates: the largest element clips to 6·448·ts.
  QuantSpec spec = parse_quant_spec("nvfp4");
  spec.tensor_scale = 1.0f;
  std::vector<float> x(16, 1.0f), y(16);
  x[0] = 6.0f * 448.0f * 4.0f;
  std::vector<uint8_t> q(bytes_per_vector(spec, 16));
  quantize(spec, x.data(), 1, 16, q.data());
  dequantize(spec, q.data(), 1, 16, y.data());
  EXPECT_EQ(y[0], 6.0f * 448.0f);
  // The standard tensor scale avoids that.
  spec.tensor_scale = nvfp4_tensor_scale(x.data(), 16);
  quantize(spec, x.data(), 1, 16, q.data());
  dequantize(spec, q.data(), 1, 16, y.data());
  EXPECT_NEAR(y[0], x[0], x[0] * 1e-6);
}

TEST(QuantRoundTrip, UniformErrorWithinHalfStep) {
  const int dim = 256, n_vec = 50;
  std::vector<float> x = test_vectors(n_vec, dim, 2);
  for (int bits = 1; bits <= 8; ++bits) {
    for (int group : {8, 64, 256}) {
      QuantSpec spec = parse_quant_spec(fmt::format("int{}:g{}", bits, group));
      size_t bpv = bytes_per_vector(spec, dim);
      std::vector<uint8_t> q(bpv * n_vec);
      std::vector<float> y(x.size());
      quantize(spec, x.data(), n_vec, dim, q.data());
      dequantize(spec, q.data(), n_vec, dim, y.data());
      const int n_group = dim / group;
      const size_t meta = size_t(n_group) * size_t((group * bits + 7) / 8);
      for (int v = 0; v < n_vec; ++v)
        for (int g = 0; g < n_group; ++g) {
          const float* xg = x.data() + v * dim + g * group;
          float lo = xg[0], hi = xg[0];
          for (int i = 0; i < group; ++i) lo = std::min(lo, xg[i]), hi = std::max(hi, xg[i]);
          uint16_t step_h;
          std::memcpy(&step_h, q.data() + size_t(v) * bpv + meta + 4 * size_t(g) + 2, 2);
          float step = bf16_to_f32(step_h);
          float ideal = (hi - lo) / float((1 << bits) - 1);
          // bf16 rounding of min (down) and step (up) costs at most 2^-7 relative
          ASSERT_LE(step, ideal * (1 + 1.0f / 64) + std::fabs(lo) / 64 / float((1 << bits) - 1) + 1e-30f);
          for (int i = 0; i < group; ++i) {
            float err = std::fabs(xg[i] - y[size_t(v * dim + g * group + i)]);
            ASSERT_LE(err, 0.5f * step * (1 + 1e-5f) + 1e-6f * std::fabs(xg[i]))
                << "int" << bits << ":g" << group << " vector " << v << " group " << g << " i " << i;
          }
        }
    }
  }
  // a constant group is exact when its value is a bf16
  std::vector<float> c(32, -2.5f), y(32);
  std::vector<uint8_t> q(bytes_per_vector(parse_quant_spec("int2"), 32));
  quantize(parse_quant_spec("int2"), c.data(), 1, 32, q.data());
  dequantize(parse_quant_spec("int2"), q.data(), 1, 32, y.data());
  for (float v : y) EXPECT_EQ(v, -2.5f);
}

TEST(QuantRoundTrip, OneBitIsTheTwoMeansQuantizer) {
  // Gaussian data: levels ±√(2/π)σ, error (1 − 2/π)σ² ≈ 0.363σ²; min/max int1 is far worse.
  const int dim = 256, n_vec = 400;
  std::vector<float> x(static_cast<size_t>(n_vec * dim)), y(x.size());
  gaussian_fill(x.data(), int64_t(x.size()), 8);
  for (const char* text : {"1bit", "int1"}) {
    QuantSpec spec = parse_quant_spec(text);
    std::vector<uint8_t> q(bytes_per_vector(spec, dim) * n_vec);
    quantize(spec, x.data(), n_vec, dim, q.data());
    dequantize(spec, q.data(), n_vec, dim, y.data());
    double err = 0;
    for (size_t i = 0; i < x.size(); ++i) err += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    err /= double(x.size());
    if (spec.kind == QuantKind::binary) EXPECT_NEAR(err, 1 - 2 / M_PI, 0.01) << text;
    else EXPECT_GT(err, 1.0) << text;
  }
}

TEST(QuantRoundTrip, NonFiniteInputThrows) {
  std::vector<float> x(64, 1.0f);
  x[17] = std::nanf("");
  std::vector<uint8_t> q(1024);
  for (const char* text : {"fp8s", "nvfp4", "int4", "1bit", "higgs2"}) {
    EXPECT_THROW(quantize(parse_quant_spec(text), x.data(), 1, 64, q.data()), Error) << text;
    EXPECT_THROW(quantize_ref(parse_quant_spec(text), x.data(), 1, 64, q.data()), Error) << text;
  }
}

TEST(QuantScore, FastMatchesReference) {
  const int dim = 128;
  // A GQA group of queries (HIGGS-256 grids: the 4-wide table), then one.
  for (int n_q : {3, 1}) {
    const std::vector<float> q = test_vectors(n_q, dim, 9);
    for (int64_t n_vec : {5, 701}) {  // HIGGS: direct path and lookup-table path (odd: the 2-record loop's tail)
      std::vector<float> x = test_vectors(n_vec, dim, 10 + uint64_t(n_vec));
      for (const char* text : {"f32", "bf16", "fp8", "fp8s", "nvfp4", "int8", "int4:g32", "int2:g64", "1bit", "int1",
                               "higgs4:g128", "higgs3:g64", "higgs2:g128", "higgs1:g128:rs", "higgs0.5:g32",
                               "higgs:EDEN8-4096:g128", "higgs4:g16"}) {
        QuantSpec spec = parse_quant_spec(text);
        if (spec.kind == QuantKind::nvfp4) spec.tensor_scale = nvfp4_tensor_scale(x.data(), int64_t(x.size()));
        size_t bpv = bytes_per_vector(spec, dim);
        for (int64_t stride : {int64_t(0), int64_t(bpv) + 3}) {
          int64_t step = stride ? stride : int64_t(bpv);
          std::vector<uint8_t> codes(size_t(step * n_vec));
          for (int64_t i = 0; i < n_vec; ++i) quantize(spec, x.data() + i * dim, 1, dim, codes.data() + i * step);
          std::vector<float> fast(static_cast<size_t>(n_q * n_vec)), ref(fast.size()), k(static_cast<size_t>(dim));
          ScoreParams p;
          p.q = q.data(), p.n_q = n_q, p.codes = codes.data(), p.n_vec = n_vec, p.code_stride = stride;
          p.dim = dim, p.scores = fast.data();
          score(spec, p);
          {  // queries' scores score_stride apart: the same values, the gaps untouched
            const int64_t ss = n_vec + 5;
            std::vector<float> strided(static_cast<size_t>(n_q * ss), -7.f);
            ScoreParams ps = p;
            ps.scores = strided.data(), ps.score_stride = ss;
            score(spec, ps);
            for (int j = 0; j < n_q; ++j)
              for (int64_t i = 0; i < ss; ++i)
                ASSERT_EQ(strided[size_t(j * ss + i)], i < n_vec ? fast[size_t(j * n_vec + i)] : -7.f)
                    << text << " strided scores, query " << j << " vector " << i;
          }
          p.scores = ref.data();
          score_ref(spec, p);
          for (int64_t i = 0; i < n_vec; ++i) {
            dequantize_ref(spec, codes.data() + i * step, 1, dim, k.data());
            for (int j = 0; j < n_q; ++j) {
              double sum_abs = 0;
              for (int t = 0; t < dim; ++t) sum_abs += std::fabs(double(q[size_t(j * dim + t)]) * k[size_t(t)]);
              ASSERT_NEAR(fast[size_t(j * n_vec + i)], ref[size_t(j * n_vec + i)], 1e-5 * sum_abs + 1e-30)
                  << text << " n_vec " << n_vec << " stride " << stride << " vector " << i << " query " << j;
            }
          }
        }
      }
    }
  }
  // the one-query overload
  const std::vector<float> q = test_vectors(1, dim, 9);
  QuantSpec spec = parse_quant_spec("higgs2");
  std::vector<float> x = test_vectors(4, dim, 3);
  std::vector<uint8_t> codes(bytes_per_vector(spec, dim) * 4);
  quantize(spec, x.data(), 4, dim, codes.data());
  std::vector<float> s1(4), s2(4);
  score(spec, q.data(), codes.data(), 4, dim, s1.data());
  ScoreParams p;
  p.q = q.data(), p.codes = codes.data(), p.n_vec = 4, p.dim = dim, p.scores = s2.data();
  score_ref(spec, p);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(s1[size_t(i)], s2[size_t(i)], 1e-3f * (1 + std::fabs(s2[size_t(i)])));
}

}  // namespace
}  // namespace kvtier
