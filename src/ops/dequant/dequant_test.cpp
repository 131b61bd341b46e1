#include "ops/dequant/dequant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/half.h"
#include "core/status.h"

namespace kvtier {
namespace {

size_t row_bytes(GgmlType t, int64_t n) { return ggml_row_bytes(t, n); }

std::vector<float> dequant(GgmlType t, const void* src, int64_t n, bool ref = true) {
  std::vector<float> y(static_cast<size_t>(n));
  if (ref)
    dequantize_row_ref(t, src, y.data(), n);
  else
    dequantize_row(t, src, y.data(), n);
  return y;
}

// ---- golden values from the gguf Python package (scripts/make_dequant_golden.py)

TEST(Dequant, MatchesGgufPythonGolden) {
  std::ifstream in(std::string(KVT_SOURCE_DIR) + "/tests/golden/dequant_golden.txt");
  ASSERT_TRUE(in) << "tests/golden/dequant_golden.txt missing";
  std::string header, hex, floats;
  int n_records = 0;
  while (std::getline(in, header) && std::getline(in, hex) && std::getline(in, floats)) {
    std::istringstream hs(header);
    std::string type_name;
    int n_blocks = 0;
    hs >> type_name >> n_blocks;
    GgmlType type{};
    bool found = false;
    for (uint32_t id = 0; id < 40; ++id) {
      GgmlTypeTraits tr{};
      if (ggml_type_traits(id, &tr) && tr.name == type_name) {
        type = GgmlType(id);
        found = true;
      }
    }
    ASSERT_TRUE(found) << type_name;
    std::vector<uint8_t> bytes(hex.size() / 2);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
    std::vector<float> expect;
    std::istringstream fs(floats);
    for (float v; fs >> v;) expect.push_back(v);
    GgmlTypeTraits tr{};
    ggml_type_traits(uint32_t(type), &tr);
    int64_t n = int64_t(n_blocks) * tr.block_size;
    ASSERT_EQ(bytes.size(), row_bytes(type, n)) << type_name;
    ASSERT_EQ(expect.size(), size_t(n)) << type_name;
    for (bool ref : {true, false}) {
      auto got = dequant(type, bytes.data(), n, ref);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(got[i], expect[i], 1e-6f + 1e-6f * std::fabs(expect[i]))
            << type_name << " value " << i << (ref ? " (ref)" : " (fast)");
    }
    ++n_records;
  }
  EXPECT_EQ(n_records, 10);
}

// ---- known values: blocks built by hand from logical fields ---------------------

constexpr uint16_t kF16One = 0x3C00;   // 1.0
constexpr uint16_t kF16Half = 0x3800;  // 0.5

TEST(Dequant, Q2KKnownValues) {
  // Sub-block s (16 values): scale s % 16, min 15 - s; value i has q = (i * 7) % 4.
  BlockQ2_K b{};
  b.d = kF16One;
  b.dmin = kF16Half;
  for (int s = 0; s < 16; ++s) b.scales[s] = uint8_t((s % 16) | ((15 - s) << 4));
  auto q_of = [](int i) { return (i * 7) % 4; };
  for (int byte = 0; byte < 64; ++byte)
    for (int plane = 0; plane < 4; ++plane) {
      int i = (byte / 32) * 128 + plane * 32 + byte % 32;
      b.qs[byte] |= uint8_t(q_of(i) << (2 * plane));
    }
  auto y = dequant(GgmlType::Q2_K, &b, 256);
  for (int i = 0; i < 256; ++i) {
    int s = i / 16;
    EXPECT_FLOAT_EQ(y[i], 1.0f * float(s) * float(q_of(i)) - 0.5f * float(15 - s)) << i;
  }
}

TEST(Dequant, Q3KKnownValues) {
  // Scale of sub-block s is s - 20 (6-bit with +32 bias: 12..43); value q in [-4, 3].
  BlockQ3_K b{};
  b.d = kF16Half;
  auto scale_of = [](int s) { return s * 3 - 20; };  // -20..25, exercises the high bits
  auto q_of = [](int i) { return (i * 5 + 3) % 8 - 4; };
  for (int s = 0; s < 16; ++s) {
    int v = scale_of(s) + 32;
    if (s < 8)
      b.scales[s] |= uint8_t(v & 0xF);
    else
      b.scales[s - 8] |= uint8_t((v & 0xF) << 4);
    b.scales[8 + s % 4] |= uint8_t((v >> 4) << (2 * (s / 4)));
  }
  for (int i = 0; i < 256; ++i) {
    int stored = q_of(i) + 4;  // 0..7: low 2 bits in qs, bit 2 in hmask
    int h = i / 128, plane = (i % 128) / 32, l = i % 32;
    b.qs[32 * h + l] |= uint8_t((stored & 3) << (2 * plane));
    if (stored & 4) b.hmask[l] |= uint8_t(1 << (4 * h + plane));
  }
  auto y = dequant(GgmlType::Q3_K, &b, 256);
  for (int i = 0; i < 256; ++i)
    EXPECT_FLOAT_EQ(y[i], 0.5f * float(scale_of(i / 16)) * float(q_of(i))) << i;
}

// Packs eight 6-bit (scale, min) pairs the way Q4_K / Q5_K store them.
void pack_k4(const int* sc, const int* mn, uint8_t* out) {
  for (int s = 0; s < 4; ++s) {
    out[s] = uint8_t((sc[s] & 63) | ((sc[s + 4] >> 4) << 6));
    out[s + 4] = uint8_t((mn[s] & 63) | ((mn[s + 4] >> 4) << 6));
    out[s + 8] = uint8_t((sc[s + 4] & 0xF) | ((mn[s + 4] & 0xF) << 4));
  }
}

TEST(Dequant, Q4KKnownValues) {
  int sc[8] = {1, 2, 3, 63, 17, 33, 48, 62};
  int mn[8] = {0, 5, 10, 63, 20, 40, 49, 31};
  BlockQ4_K b{};
  b.d = kF16Half;
  b.dmin = kF16One;
  pack_k4(sc, mn, b.scales);
  auto q_of = [](int i) { return (i * 11 + 1) % 16; };
  for (int i = 0; i < 256; ++i) {
    int chunk = i / 64, r = i % 64;
    b.qs[32 * chunk + r % 32] |= uint8_t(q_of(i) << (r < 32 ? 0 : 4));
  }
  auto y = dequant(GgmlType::Q4_K, &b, 256);
  for (int i = 0; i < 256; ++i)
    EXPECT_FLOAT_EQ(y[i], 0.5f * float(sc[i / 32]) * float(q_of(i)) - float(mn[i / 32])) << i;
}

TEST(Dequant, Q5KKnownValues) {
  int sc[8] = {63, 1, 16, 31, 32, 47, 5, 60};
  int mn[8] = {2, 63, 0, 15, 16, 50, 61, 7};
  BlockQ5_K b{};
  b.d = kF16One;
  b.dmin = kF16Half;
  pack_k4(sc, mn, b.scales);
  auto q_of = [](int i) { return (i * 13 + 7) % 32; };
  for (int i = 0; i < 256; ++i) {
    int q = q_of(i), chunk = i / 64, r = i % 64;
    b.qs[32 * chunk + r % 32] |= uint8_t((q & 0xF) << (r < 32 ? 0 : 4));
    if (q & 16) b.qh[i % 32] |= uint8_t(1 << (i / 32));
  }
  auto y = dequant(GgmlType::Q5_K, &b, 256);
  for (int i = 0; i < 256; ++i)
    EXPECT_FLOAT_EQ(y[i], float(sc[i / 32]) * float(q_of(i)) - 0.5f * float(mn[i / 32])) << i;
}

TEST(Dequant, Q6KKnownValues) {
  BlockQ6_K b{};
  b.d = kF16Half;
  auto scale_of = [](int s) { return s * 17 - 128; };  // int8: -128..127
  for (int s = 0; s < 16; ++s) b.scales[s] = int8_t(scale_of(s));
  auto q_of = [](int i) { return (i * 29 + 5) % 64 - 32; };
  for (int i = 0; i < 256; ++i) {
    int stored = q_of(i) + 32;
    int h = i / 128, plane = (i % 128) / 32, l = i % 32;
    b.ql[64 * h + 32 * (plane % 2) + l] |= uint8_t((stored & 0xF) << (plane < 2 ? 0 : 4));
    b.qh[32 * h + l] |= uint8_t((stored >> 4) << (2 * plane));
  }
  auto y = dequant(GgmlType::Q6_K, &b, 256);
  for (int i = 0; i < 256; ++i)
    EXPECT_FLOAT_EQ(y[i], 0.5f * float(scale_of(i / 16)) * float(q_of(i))) << i;
}

TEST(Dequant, LegacyKnownValues) {
  BlockQ5_0 b0{};
  b0.d = kF16Half;
  BlockQ5_1 b1{};
  b1.d = kF16One;
  b1.m = kF16Half;
  uint32_t qh = 0;
  for (int i = 0; i < 32; ++i) {
    int q = (i * 9 + 4) % 32;
    b0.qs[i % 16] |= uint8_t((q & 0xF) << (i < 16 ? 0 : 4));
    if (q & 16) qh |= 1u << i;
  }
  std::memcpy(b0.qh, &qh, 4);
  std::memcpy(b1.qs, b0.qs, 16);
  std::memcpy(b1.qh, b0.qh, 4);
  auto y0 = dequant(GgmlType::Q5_0, &b0, 32);
  auto y1 = dequant(GgmlType::Q5_1, &b1, 32);
  for (int i = 0; i < 32; ++i) {
    int q = (i * 9 + 4) % 32;
    EXPECT_FLOAT_EQ(y0[i], 0.5f * float(q - 16)) << i;
    EXPECT_FLOAT_EQ(y1[i], float(q) + 0.5f) << i;
  }
}

// ---- fast path vs reference on random blocks --------------------------------------

// Random block bytes with finite f16 scale fields (at the given offsets).
std::vector<uint8_t> random_blocks(GgmlType t, int n_blocks, std::mt19937& rng) {
  GgmlTypeTraits tr{};
  ggml_type_traits(uint32_t(t), &tr);
  std::vector<uint8_t> b(tr.block_bytes * size_t(n_blocks));
  for (auto& x : b) x = uint8_t(rng());
  std::vector<size_t> f16_fields;
  switch (t) {
    case GgmlType::F16:
      for (size_t o = 0; o < b.size(); o += 2) f16_fields.push_back(o);
      break;
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: f16_fields = {0}; break;
    case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q8_1: case GgmlType::Q4_K:
    case GgmlType::Q5_K: f16_fields = {0, 2}; break;
    case GgmlType::Q2_K: f16_fields = {80, 82}; break;
    case GgmlType::Q3_K: f16_fields = {108}; break;
    case GgmlType::Q6_K: f16_fields = {208}; break;
    default: break;
  }
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  size_t stride = t == GgmlType::F16 ? b.size() : tr.block_bytes;
  for (size_t base = 0; base < b.size(); base += stride)
    for (size_t off : f16_fields) {
      uint16_t h = f32_to_f16(u(rng));
      std::memcpy(&b[base + off], &h, 2);
    }
  if (t == GgmlType::F32 || t == GgmlType::BF16 || t == GgmlType::Q8_K) {
    // finite floats / bf16 / Q8_K scales
    for (int k = 0; k < n_blocks; ++k) {
      if (t == GgmlType::F32) {
        float v = u(rng);
        std::memcpy(&b[size_t(k) * 4], &v, 4);
      } else if (t == GgmlType::BF16) {
        uint16_t h = f32_to_bf16(u(rng));
        std::memcpy(&b[size_t(k) * 2], &h, 2);
      } else {
        float v = u(rng);
        std::memcpy(&b[size_t(k) * tr.block_bytes], &v, 4);
      }
    }
  }
  return b;
}

TEST(Dequant, FastMatchesReferenceAllTypes) {
  std::mt19937 rng(7);
  for (uint32_t id = 0; id < 40; ++id) {
    GgmlTypeTraits tr{};
    if (!ggml_type_traits(id, &tr)) continue;
    GgmlType t = GgmlType(id);
    for (int n_blocks : {1, 3, 17}) {
      // scalar types: odd lengths exercise the vector tails
      int64_t n = tr.block_size == 1 ? int64_t(n_blocks) * 5 + 3 : int64_t(n_blocks) * tr.block_size;
      auto bytes = random_blocks(t, int(row_bytes(t, n) / tr.block_bytes), rng);
      auto a = dequant(t, bytes.data(), n, true);
      auto b = dequant(t, bytes.data(), n, false);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_TRUE(std::isfinite(a[i])) << tr.name << " " << i;
        // these paths multiply exactly representable products, so results are bit-equal
        ASSERT_EQ(a[i], b[i]) << tr.name << " value " << i << " of " << n;
      }
    }
  }
}

// ---- round trips ------------------------------------------------------------------

std::vector<float> random_row(int64_t n, float scale, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, scale);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = g(rng);
  return x;
}

std::vector<float> round_trip(GgmlType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(row_bytes(t, int64_t(x.size())));
  quantize_row(t, x.data(), q.data(), int64_t(x.size()));
  return dequant(t, q.data(), int64_t(x.size()), false);
}

TEST(Dequant, RoundTripWithinFormatBound) {
  std::mt19937 rng(11);
  for (float scale : {1e-3f, 1.0f, 300.0f}) {
    auto x = random_row(32 * 64, scale, rng);
    auto f32 = round_trip(GgmlType::F32, x);
    auto f16 = round_trip(GgmlType::F16, x);
    auto bf16 = round_trip(GgmlType::BF16, x);
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(f32[i], x[i]);
      EXPECT_NEAR(f16[i], x[i], std::fabs(x[i]) * 0x1p-11f + 0x1p-24f);
      EXPECT_NEAR(bf16[i], x[i], std::fabs(x[i]) * 0x1p-8f);
    }
    for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q4_0, GgmlType::Q4_1}) {
      auto y = round_trip(t, x);
      for (size_t b = 0; b < x.size(); b += 32) {
        float amax = 0, lo = x[b], hi = x[b];
        for (size_t i = b; i < b + 32; ++i) {
          amax = std::max(amax, std::fabs(x[i]));
          lo = std::min(lo, x[i]);
          hi = std::max(hi, x[i]);
        }
        // half a quantization step, plus the f16 rounding of the scale times the
        // largest integer, plus that of the Q4_1 offset. f16 rounding of v is at
        // most |v| 2^-11, or 2^-25 absolute in the subnormal range.
        auto f16_err = [](float v) { return std::fabs(v) * 0x1p-11f + 0x1p-25f; };
        float bound = 0;
        if (t == GgmlType::Q8_0 || t == GgmlType::Q8_1)
          bound = amax / 127 * 0.5f + 127 * f16_err(amax / 127);
        // Q4_0 maps the signed extreme to -8, so the opposite side tops out at
        // +7 steps: values there may be clamped by up to one full step.
        if (t == GgmlType::Q4_0) bound = amax / 8 + 8 * f16_err(amax / 8);
        if (t == GgmlType::Q4_1)
          bound = (hi - lo) / 15 * 0.5f + 15 * f16_err((hi - lo) / 15) + f16_err(lo);
        for (size_t i = b; i < b + 32; ++i)
          ASSERT_LE(std::fabs(y[i] - x[i]), bound * 1.01f + 1e-30f)
              << ggml_type_name(t) << " scale " << scale << " value " << i;
      }
    }
  }
}

TEST(Dequant, Q8_1StoresScaledSum) {
  std::mt19937 rng(3);
  auto x = random_row(64, 2.0f, rng);
  BlockQ8_1 b[2];
  quantize_row(GgmlType::Q8_1, x.data(), b, 64);
  for (auto& blk : b) {
    float d = f16_to_f32(blk.d);
    int sum = 0, amax_q = 0;
    for (int8_t q : blk.qs) {
      sum += q;
      amax_q = std::max(amax_q, std::abs(int(q)));
    }
    EXPECT_EQ(amax_q, 127);  // d = amax / 127 puts the extreme on ±127
    EXPECT_NEAR(f16_to_f32(blk.s), d * float(sum), std::fabs(d * float(sum)) * 0x1p-10f + 1e-6f);
  }
}

TEST(Dequant, OddInputs) {
  // all zeros: every format decodes to exact zeros (scale 0, no division by zero)
  std::vector<float> zeros(64, 0.0f);
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q4_0, GgmlType::Q4_1}) {
    auto y = round_trip(t, zeros);
    for (float v : y) EXPECT_EQ(v, 0.0f) << ggml_type_name(t);
  }
  // a constant block survives Q4_1 exactly up to the f16 rounding of the offset
  std::vector<float> c(32, 0.375f);
  for (float v : round_trip(GgmlType::Q4_1, c)) EXPECT_EQ(v, 0.375f);
  // a single spike: Q4_0 maps the signed extreme to -8 exactly
  std::vector<float> spike(32, 0.0f);
  spike[5] = -3.0f;
  auto ys = round_trip(GgmlType::Q4_0, spike);
  EXPECT_EQ(ys[5], -3.0f);
  EXPECT_EQ(ys[0], 0.0f);
  // empty row is a no-op
  dequantize_row(GgmlType::Q4_K, nullptr, nullptr, 0);
  // lengths that are not a multiple of the block size and unknown types are errors
  float buf[64] = {};
  uint8_t qbuf[256] = {};
  EXPECT_THROW(dequantize_row(GgmlType::Q4_0, qbuf, buf, 31), Error);
  EXPECT_THROW(dequantize_row(GgmlType::Q6_K, qbuf, buf, 32), Error);
  EXPECT_THROW(dequantize_row(GgmlType(99), qbuf, buf, 32), Error);
  EXPECT_THROW(quantize_row(GgmlType::Q4_K, buf, qbuf, 256), Error);
  EXPECT_THROW(quantize_row(GgmlType::Q8_0, buf, qbuf, 33), Error);
}

}  // namespace
}  // namespace kvtier
