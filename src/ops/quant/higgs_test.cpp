// HIGGS: embedded grids equal the shipped .pt files; quantizing N(0, 1) data
// reaches the grid's own MSE (within 2 %) at every bit width; the fast path
// agrees with the reference; Lloyd's grids match the shipped grids' MSE.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "ops/quant/higgs_grid.h"
#include "ops/quant/quant_format.h"

namespace kvtier {
namespace {

// A stored (uncompressed) zip, read through its central directory:
// name → bytes. Enough for PyTorch's .pt files.
std::map<std::string, std::string> read_stored_zip(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::string z((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto u16 = [&](size_t o) { return uint32_t(uint8_t(z[o])) | uint32_t(uint8_t(z[o + 1])) << 8; };
  auto u32 = [&](size_t o) { return u16(o) | u16(o + 2) << 16; };
  size_t eocd = z.rfind(std::string("PK\x05\x06", 4));
  EXPECT_NE(eocd, std::string::npos) << path;
  std::map<std::string, std::string> files;
  if (eocd == std::string::npos) return files;
  size_t n_entry = u16(eocd + 10), cd = u32(eocd + 16);
  for (size_t e = 0; e < n_entry; ++e) {
    EXPECT_EQ(u32(cd), 0x02014b50u);
    EXPECT_EQ(u16(cd + 10), 0u) << "compressed entry in " << path;
    size_t size = u32(cd + 20), name_len = u16(cd + 28), extra = u16(cd + 30), comment = u16(cd + 32);
    size_t local = u32(cd + 42);
    std::string name = z.substr(cd + 46, name_len);
    size_t data = local + 30 + u16(local + 26) + u16(local + 28);
    files[name] = z.substr(data, size);
    cd += 46 + name_len + extra + comment;
  }
  return files;
}

std::string grid_dir() { return std::string(KVT_SOURCE_DIR) + "/data/higgs_grids"; }

TEST(HiggsGrid, EmbeddedGridsEqualShippedFiles) {
  if (!std::filesystem::exists(grid_dir())) GTEST_SKIP() << "no " << grid_dir();
  int n_checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(grid_dir())) {
    std::string stem = entry.path().stem().string();  // EDEN4-256
    int d = 0, n = 0;
    ASSERT_EQ(std::sscanf(stem.c_str(), "EDEN%d-%d", &d, &n), 2) << stem;
    auto files = read_stored_zip(entry.path().string());
    const std::string& raw = files.at(stem + "/data/0");
    ASSERT_GE(raw.size(), size_t(n) * d * 4) << stem;
    const ShippedGrid* shipped = nullptr;
    for (const ShippedGrid& s : shipped_higgs_grids())
      if (s.dim == d && s.size == n) shipped = &s;
    ASSERT_NE(shipped, nullptr) << stem << " is not embedded: rerun scripts/gen_higgs_grids.py";
    EXPECT_EQ(std::memcmp(raw.data(), shipped->points, size_t(n) * d * 4), 0) << stem;
    EXPECT_EQ(higgs_grid(d, n).source, stem);
    ++n_checked;
  }
  EXPECT_EQ(n_checked, int(shipped_higgs_grids().size()));
}

// MSE per coordinate of quantize → dequantize on N(0, 1) vectors.
double roundtrip_mse(const QuantSpec& spec, int dim, int n_vec, uint64_t seed, bool ref) {
  std::vector<float> x(size_t(n_vec) * dim), y(x.size());  // [n_vec, dim] f32
  gaussian_fill(x.data(), int64_t(x.size()), seed);
  std::vector<uint8_t> q(bytes_per_vector(spec, dim) * size_t(n_vec));
  if (ref) {
    quantize_ref(spec, x.data(), n_vec, dim, q.data());
    dequantize_ref(spec, q.data(), n_vec, dim, y.data());
  } else {
    quantize(spec, x.data(), n_vec, dim, q.data());
    dequantize(spec, q.data(), n_vec, dim, y.data());
  }
  double err = 0;
  for (size_t i = 0; i < x.size(); ++i) err += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
  return err / double(x.size());
}

TEST(Higgs, GaussianMseWithinTwoPercentOfGridMse) {
  for (const char* text : {"higgs4:g128", "higgs3:g128", "higgs2:g128", "higgs1:g128", "higgs0.5:g128",
                           "higgs2:g128:rs", "higgs4:g1024"}) {
    QuantSpec spec = parse_quant_spec(text);
    const HiggsGrid& grid = higgs_grid(spec.grid_dim, spec.grid_size);
    double grid_mse = grid_gaussian_mse(grid.points.data(), grid.size, grid.dim, 400000 / grid.dim, 99);
    int dim = spec.group;
    double mse = roundtrip_mse(spec, dim, 262144 / dim, 5, /*ref=*/false);
    RecordProperty(text, fmt::format("mse {:.5f} grid {:.5f}", mse, grid_mse));
    EXPECT_NEAR(mse / grid_mse, 1.0, 0.02) << text << ": mse " << mse << ", grid " << grid_mse;
  }
}

TEST(Higgs, ReferenceMseMatchesFast) {
  for (const char* text : {"higgs2:g128", "higgs0.5:g64:rs", "higgs3:g32"}) {
    QuantSpec spec = parse_quant_spec(text);
    double fast = roundtrip_mse(spec, 256, 300, 21, false);
    double ref = roundtrip_mse(spec, 256, 300, 21, true);
    EXPECT_NEAR(fast / ref, 1.0, 1e-3) << text;
  }
}

TEST(Higgs, FastCodesEqualReferenceCodes) {
  for (const char* text : {"higgs4:g64", "higgs2:g128", "higgs1:g128:rs7", "higgs3:g256", "higgs:EDEN8-4096:g64"}) {
    QuantSpec spec = parse_quant_spec(text);
    const int dim = 256, n_vec = 64;
    std::vector<float> x(size_t(n_vec) * dim);
    gaussian_fill(x.data(), int64_t(x.size()), 77);
    for (size_t i = 0; i < x.size(); ++i) x[i] *= 0.05f + float(i % 7);  // varied scales
    size_t bpv = bytes_per_vector(spec, dim);
    std::vector<uint8_t> a(bpv * n_vec), b(bpv * n_vec);
    quantize(spec, x.data(), n_vec, dim, a.data());
    quantize_ref(spec, x.data(), n_vec, dim, b.data());
    size_t n_diff = 0;
    for (size_t i = 0; i < a.size(); ++i) n_diff += a[i] != b[i];
    // f32 vs f64 nearest-point search may differ only at near-ties
    EXPECT_LE(double(n_diff), 0.002 * double(a.size())) << text;
    std::vector<float> ya(x.size()), yb(x.size());
    dequantize(spec, b.data(), n_vec, dim, ya.data());
    dequantize_ref(spec, b.data(), n_vec, dim, yb.data());
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(ya[i], yb[i], 1e-4f * (1 + std::fabs(yb[i]))) << text;
  }
}

TEST(Higgs, ZeroVectorAndScaleEquivariance) {
  QuantSpec spec = parse_quant_spec("higgs2:g64");
  std::vector<float> x(128, 0.0f), y(128, 1.0f);
  std::vector<uint8_t> q(bytes_per_vector(spec, 128));
  quantize(spec, x.data(), 1, 128, q.data());
  dequantize(spec, q.data(), 1, 128, y.data());
  for (float v : y) EXPECT_EQ(v, 0.0f);
  x[3] = std::nanf("");
  EXPECT_THROW(quantize(spec, x.data(), 1, 128, q.data()), Error);
}

TEST(HiggsGrid, LloydMatchesShippedGridMse) {
  for (auto [d, n] : {std::pair{2, 16}, std::pair{2, 64}, std::pair{4, 16}}) {
    std::vector<float> lloyd = make_gaussian_grid(d, n, 1234);
    const HiggsGrid& shipped = higgs_grid(d, n);
    double m_lloyd = grid_gaussian_mse(lloyd.data(), n, d, 200000, 4321);
    double m_shipped = grid_gaussian_mse(shipped.points.data(), n, d, 200000, 4321);
    RecordProperty(fmt::format("lloyd_eden{}_{}", d, n), fmt::format("lloyd {:.5f} shipped {:.5f}", m_lloyd, m_shipped));
    EXPECT_LT(m_lloyd, 1.02 * m_shipped) << "EDEN" << d << "-" << n << ": lloyd " << m_lloyd << ", shipped " << m_shipped;
    EXPECT_GT(m_lloyd, 0.98 * m_shipped) << "EDEN" << d << "-" << n;
  }
}

// The points in use are the shipped ones rounded to fp16 (the GPU's
// tensor-core scorer reads them exactly): each within half an fp16 step,
// and an fp16 value (a further round trip through 11 significant bits and
// fp16's subnormal step leaves it unchanged).
TEST(HiggsGrid, PointsAreTheShippedOnesRoundedToFp16) {
  for (const ShippedGrid& s : shipped_higgs_grids()) {
    const HiggsGrid& g = higgs_grid(s.dim, s.size);
    ASSERT_EQ(g.points.size(), size_t(s.size) * s.dim);
    int moved = 0;
    for (size_t i = 0; i < g.points.size(); ++i) {
      const float v = g.points[i], raw = s.points[i];
      const float ulp = std::abs(raw) < 0x1p-14f ? 0x1p-24f : std::ldexp(1.f, std::ilogb(raw) - 10);
      ASSERT_LE(std::abs(v - raw), 0.5f * ulp) << g.source << " point " << i;
      const float step = std::abs(v) < 0x1p-14f ? 0x1p-24f : std::ldexp(1.f, std::ilogb(v) - 10);
      ASSERT_EQ(std::fmod(v, step), 0.f) << g.source << " point " << i << " = " << v << " is no fp16 value";
      moved += v != raw;
    }
    EXPECT_GT(moved, 0) << g.source;  // the raw grids are f32: rounding must change some points
  }
}

TEST(HiggsGrid, UnshippedGridComesFromLloyd) {
  const HiggsGrid& g = higgs_grid(1, 8);  // scalar 3-bit Lloyd–Max
  EXPECT_EQ(g.source, "lloyd1-8");
  // The Lloyd–Max 8-level quantizer of N(0, 1) has MSE 0.03455 (Max 1960).
  EXPECT_NEAR(grid_gaussian_mse(g.points.data(), 8, 1, 400000, 3), 0.03455, 0.001);
}

}  // namespace
}  // namespace kvtier
