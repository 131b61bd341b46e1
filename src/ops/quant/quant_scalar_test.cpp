// FP8 E4M3 and FP4 E2M1 casts: exact on representable values, round to
// nearest even at midpoints, saturation, NaN; the bit-trick casts equal the
// search-based definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "ops/quant/quant_scalar.h"

namespace kvtier {
namespace {

TEST(QuantScalar, E4m3DecodeKnownValues) {
  EXPECT_EQ(e4m3_to_f32(0x00), 0.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));   // smallest subnormal
  EXPECT_EQ(e4m3_to_f32(0x08), std::ldexp(1.0f, -6));   // smallest normal
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xfe), -448.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xff)));
}

TEST(QuantScalar, E4m3ExactOnRepresentable) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    float v = e4m3_to_f32(uint8_t(c));
    uint8_t expect = (c == 0x80) ? 0x80 : uint8_t(c);  // -0 keeps its sign
    EXPECT_EQ(f32_to_e4m3(v), expect) << "code " << c;
    EXPECT_EQ(f32_to_e4m3_ref(v), expect) << "code " << c;
  }
}

TEST(QuantScalar, E4m3MidpointsRoundToEven) {
  for (int c = 0; c < 0x7e; ++c) {
    float lo = e4m3_to_f32(uint8_t(c)), hi = e4m3_to_f32(uint8_t(c + 1));
    float mid = 0.5f * (lo + hi);  // exact in f32
    uint8_t even = (c % 2 == 0) ? uint8_t(c) : uint8_t(c + 1);
    EXPECT_EQ(f32_to_e4m3(mid), even) << "between codes " << c << " and " << c + 1;
    EXPECT_EQ(f32_to_e4m3_ref(mid), even);
    EXPECT_EQ(f32_to_e4m3(-mid), uint8_t(0x80 | even));
    // just off the midpoint goes to the nearer side
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 0.0f)), uint8_t(c));
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 1000.0f)), uint8_t(c + 1));
  }
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(1.0625f)), 1.0f);   // between 1 (even) and 1.125
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(1.1875f)), 1.25f);  // between 1.125 and 1.25 (even)
}

TEST(QuantScalar, E4m3SaturatesAndKeepsNan) {
  for (float v : {448.0f, 449.0f, 464.0f, 480.0f, 1e6f, std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(f32_to_e4m3(v), 0x7e) << v;
    EXPECT_EQ(f32_to_e4m3(-v), 0xfe) << v;
    EXPECT_EQ(f32_to_e4m3_ref(v), 0x7e) << v;
  }
  EXPECT_EQ(f32_to_e4m3(std::nanf("")) & 0x7f, 0x7f);
  EXPECT_EQ(f32_to_e4m3_ref(std::nanf("")) & 0x7f, 0x7f);
  EXPECT_EQ(f32_to_e4m3(1e-30f), 0x00);  // underflow to zero
}

TEST(QuantScalar, E4m3FastEqualsReferenceOnRandomFloats) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> expo(-14.0f, 10.0f);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  for (int i = 0; i < 200000; ++i) {
    float v = std::ldexp(mant(rng), int(expo(rng))) * ((i & 1) ? -1.0f : 1.0f);
    ASSERT_EQ(f32_to_e4m3(v), f32_to_e4m3_ref(v)) << v;
  }
}

TEST(QuantScalar, E2m1ExactMidpointsSaturation) {
  const float mags[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(e2m1_to_f32(uint8_t(c)), mags[c]);
    EXPECT_EQ(f32_to_e2m1(mags[c]), c);
    EXPECT_EQ(f32_to_e2m1_ref(mags[c]), c);
    if (c > 0) {
      EXPECT_EQ(f32_to_e2m1(-mags[c]), 8 | c);
    }
  }
  for (int c = 0; c < 7; ++c) {
    float mid = 0.5f * (mags[c] + mags[c + 1]);
    int even = (c % 2 == 0) ? c : c + 1;
    EXPECT_EQ(f32_to_e2m1(mid), even) << mid;
    EXPECT_EQ(f32_to_e2m1_ref(mid), even) << mid;
  }
  EXPECT_EQ(f32_to_e2m1(7.0f), 7);
  EXPECT_EQ(f32_to_e2m1(-1e9f), 15);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-8.0f, 8.0f);
  for (int i = 0; i < 100000; ++i) {
    float v = u(rng);
    ASSERT_EQ(f32_to_e2m1(v), f32_to_e2m1_ref(v)) << v;
  }
}

TEST(QuantScalar, BitStreamRoundTrip) {
  for (int bits : {1, 2, 3, 5, 6, 7, 8, 12}) {
    std::vector<uint8_t> buf(64, 0xff);
    std::vector<uint32_t> vals(20);
    for (size_t i = 0; i < vals.size(); ++i) vals[i] = uint32_t(i * 2654435761u) & ((1u << bits) - 1);
    for (size_t i = 0; i < vals.size(); ++i) put_bits(buf.data(), int64_t(i) * bits, vals[i], bits);
    for (size_t i = 0; i < vals.size(); ++i) EXPECT_EQ(get_bits(buf.data(), int64_t(i) * bits, bits), vals[i]);
  }
}

}  // namespace
}  // namespace kvtier
