// quant_dev.cuh compiled for the CPU (its __host__ __device__ code) against
// the CPU quantizer, on quant_dev_check.h's grid: the device algorithms
// checked without a GPU; quant_dev_cuda_test.cpp runs the same grid on one.
// Built with -ffp-contract=off (src/ops/CMakeLists.txt) so that the host
// build rounds exactly where the device build does: every fused operation in
// the header is an explicit FMA.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <deque>
#include <vector>

#include "ops/quant/hadamard.h"
#include "ops/quant/higgs_cells.h"
#include "ops/quant/higgs_grid.h"
#include "ops/quant/quant_dev.cuh"
#include "ops/quant/quant_dev_check.h"

namespace kvtier {
namespace {
using namespace quant_dev_testing;

constexpr uint8_t kGuard = 0xa5;
constexpr int kGuardBytes = 16;

class HostRunner : public Runner {
 public:
  DevFormat format(const QuantSpec& s, int dim, const std::vector<float>* grid = nullptr) override {
    RecordFormat r;
    r.spec = s;
    r.dim = dim;
    r.bytes = int64_t(bytes_per_vector(s, dim));
    if (s.kind == QuantKind::higgs) {
      r.grid = grid ? keep_.emplace_back(*grid).data() : higgs_grid_of(s).points.data();
      if (!grid && !higgs_grid_of(s).cells.empty())
        r.cells = higgs_grid_of(s).cells.data();  // d = 2: the search by cells
      if (s.random_signs) {
        const int G = resolved_group(s, dim);
        std::vector<float>& sg = keep_.emplace_back(size_t(G));
        hadamard_signs(s.sign_seed, G, sg.data());
        r.signs = sg.data();
      }
    }
    return make_dev_format(r);
  }

  std::vector<uint8_t> quantize(const DevFormat& f0, const std::vector<float>& x, int64_t n_vec, const Placement& p,
                                bool& guards_ok) override {
    const DevFormat f = placed(f0, p);
    std::vector<float> xs = x;  // in place: destroyed
    std::vector<float> scratch(p.in_place || !dev_needs_scratch(f) ? 0 : x.size());
    std::vector<uint8_t> buf(size_t(p.offset) + size_t(n_vec * f.bytes) + kGuardBytes, kGuard);
    for (int64_t v = 0; v < n_vec; ++v) {
      float* xv = xs.data() + v * f.dim;
      float* sc = p.in_place ? xv : scratch.empty() ? nullptr : scratch.data() + v * f.dim;
      dev_quantize(f, xv, buf.data() + p.offset + v * f.bytes, sc);
    }
    guards_ok = true;
    for (int i = 0; i < p.offset; ++i) guards_ok &= buf[size_t(i)] == kGuard;
    for (size_t i = buf.size() - kGuardBytes; i < buf.size(); ++i) guards_ok &= buf[i] == kGuard;
    return {buf.begin() + p.offset, buf.end() - kGuardBytes};
  }

  std::vector<float> dequantize(const DevFormat& f0, const std::vector<uint8_t>& rec, int64_t n_vec,
                                const Placement& p) override {
    const DevFormat f = placed(f0, p);
    std::vector<uint8_t> buf = at_offset(rec, p);
    std::vector<float> y(size_t(n_vec) * size_t(f.dim), NAN);
    for (int64_t v = 0; v < n_vec; ++v) dev_dequantize(f, buf.data() + p.offset + v * f.bytes, y.data() + v * f.dim);
    return y;
  }

  std::vector<float> score(const DevFormat& f0, const std::vector<float>& q, int n_q, const std::vector<uint8_t>& rec,
                           int64_t n_vec, bool rotated, const Placement& p) override {
    const DevFormat f = placed(f0, p);
    std::vector<uint8_t> buf = at_offset(rec, p);
    std::vector<float> scratch(dev_needs_scratch(f) ? size_t(f.dim) : 0);
    std::vector<float> out(size_t(n_q) * size_t(n_vec));
    for (int j = 0; j < n_q; ++j)
      for (int64_t v = 0; v < n_vec; ++v) {
        const float* qj = q.data() + size_t(j) * f.dim;
        const uint8_t* r = buf.data() + p.offset + v * f.bytes;
        out[size_t(j) * n_vec + v] = rotated ? dev_score_rotated(f, qj, r)
                                             : dev_score(f, qj, r, scratch.empty() ? nullptr : scratch.data());
      }
    return out;
  }

  std::vector<float> rotate(const DevFormat& f, const std::vector<float>& q, int n_q) override {
    std::vector<float> out(q.size());
    for (int j = 0; j < n_q; ++j) dev_rotate_query(f, q.data() + size_t(j) * f.dim, out.data() + size_t(j) * f.dim);
    return out;
  }

 private:
  // The staged grid as dev_stage_grid builds it (a copy with its half norms).
  DevFormat placed(DevFormat f, const Placement& p) {
    if (!p.stage_grid || f.kind != qdev::kHiggs) return f;
    std::vector<float>& st = keep_.emplace_back(dev_grid_smem_bytes(f) / 4);
    const int nd = f.grid_size * f.grid_dim;
    std::memcpy(st.data(), f.grid, size_t(nd) * 4);
    float* hn = st.data() + ((nd + 3) & ~3);
    for (int c = 0; c < f.grid_size; ++c) hn[c] = qdev::half_norm2_of(f.grid + c * f.grid_dim, f.grid_dim);
    f.grid = st.data();
    f.half_norm2 = hn;
    return f;
  }
  static std::vector<uint8_t> at_offset(const std::vector<uint8_t>& rec, const Placement& p) {
    std::vector<uint8_t> buf(size_t(p.offset) + rec.size(), kGuard);
    std::memcpy(buf.data() + p.offset, rec.data(), rec.size());
    return buf;
  }
  std::deque<std::vector<float>> keep_;  // signs and staged grids, alive while the formats are
};

class QuantDevHost : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantDevHost, MatchesTheCpuQuantizer) {
  HostRunner run;
  check_family(run, GetParam(), 24);
}

INSTANTIATE_TEST_SUITE_P(Families, QuantDevHost, ::testing::ValuesIn(case_families()),
                         [](const auto& info) { return info.param; });

TEST(QuantDevHost, TiesGoToTheLowestIndex) {
  HostRunner run;
  check_tie_rule(run);
}

// The search by cells (higgs_cells.h) picks the point the full search
// picks: random u in and beyond the square, and the hard cases: u on cell
// edges and corners, halfway between two points (a tie, up to rounding) and
// a step to either side, on the points, at 0, and NaN.
TEST(QuantDevHost, CellSearchEqualsTheFullSearch) {
  for (const auto [n, want_side] : {std::pair{256, 64}, {64, 32}, {16, 16}, {100, 40}}) {
    const HiggsGrid& g = higgs_grid(2, n);
    ASSERT_FALSE(g.cells.empty()) << n;
    ASSERT_EQ(int(g.cells[0]), want_side) << n;
    DevFormat full;
    full.kind = qdev::kHiggs;
    full.grid_dim = 2;
    full.grid_size = n;
    full.grid = g.points.data();
    full.half_norm2 = g.half_norm2.data();
    DevFormat cells = full;
    cells.cells = g.cells.data();
    std::vector<float> us;
    auto add = [&](float a, float b) { us.push_back(a), us.push_back(b); };
    std::vector<float> z(2 * 200000);
    gaussian_fill(z.data(), int64_t(z.size()), 0x5eed + n);
    for (size_t i = 0; i < z.size(); i += 2) {
      const float s = i % 6 == 0 ? 3.f : 1.f;  // a third far out: beyond the square too
      add(s * z[i], s * z[i + 1]);
    }
    const int side = int(g.cells[0]);
    const float lo = std::bit_cast<float>(g.cells[1]), inv = std::bit_cast<float>(g.cells[2]);
    for (int k = 0; k <= side; ++k) {  // edges and corners, and a step either side
      const float e = lo + float(k) / inv;
      for (int j = 0; j < 40; ++j) {
        add(e, z[size_t(j)]), add(z[size_t(j)], e);
        add(std::nextafter(e, -INFINITY), z[size_t(j + 1)]), add(z[size_t(j + 1)], std::nextafter(e, INFINITY));
      }
      for (int m = 0; m <= side; m += 7) add(e, lo + float(m) / inv);
    }
    for (int a = 0; a < n; ++a) {
      add(g.points[size_t(2 * a)], g.points[size_t(2 * a + 1)]);
      for (int b = a + 1; b < n; ++b) {  // halfway between neighbours: the hardest ties
        const float mx = 0.5f * (g.points[size_t(2 * a)] + g.points[size_t(2 * b)]);
        const float my = 0.5f * (g.points[size_t(2 * a + 1)] + g.points[size_t(2 * b + 1)]);
        const float dx = g.points[size_t(2 * a)] - g.points[size_t(2 * b)];
        const float dy = g.points[size_t(2 * a + 1)] - g.points[size_t(2 * b + 1)];
        if (dx * dx + dy * dy > 1.0f) continue;
        add(mx, my);
        add(std::nextafter(mx, INFINITY), my), add(mx, std::nextafter(my, -INFINITY));
      }
    }
    add(0.f, 0.f), add(NAN, 0.f), add(0.f, INFINITY);
    int64_t differ = 0;
    for (size_t i = 0; i < us.size(); i += 2)
      differ += qdev::nearest(cells, us.data() + i) != qdev::nearest(full, us.data() + i);
    EXPECT_EQ(differ, 0) << "EDEN2-" << n << ": " << differ << " of " << us.size() / 2 << " points";
  }
}

// The tables: empty for other dimensions; every cell lists a point, and few.
TEST(QuantDevHost, CellTablesAreSmall) {
  EXPECT_TRUE(higgs_grid(4, 256).cells.empty());
  EXPECT_TRUE(higgs_grid(1, 8).cells.empty());
  const HiggsGrid& g = higgs_grid(2, 256);
  const int side = int(g.cells[0]);
  const uint32_t* first = g.cells.data() + kCellsHeaderWords;
  const uint32_t n_cand = g.cells[3];
  ASSERT_EQ(g.cells.size(), size_t(kCellsHeaderWords) + size_t(side) * side + 1 + n_cand);
  uint32_t most = 0;
  for (int c = 0; c < side * side; ++c) {
    ASSERT_LT(first[c], first[c + 1]) << "cell " << c << " lists no point";
    most = std::max(most, first[c + 1] - first[c]);
  }
  EXPECT_EQ(first[side * side], n_cand);
  EXPECT_LE(most, 12u);                       // of 256 points
  EXPECT_LT(n_cand, uint32_t(3 * side * side));  // under 3 a cell on average
}

// make_dev_format refuses a record that does not fit (the message names spec and sizes).
TEST(QuantDevHost, MakeDevFormatChecks) {
  RecordFormat r;
  r.spec = parse_quant_spec("higgs2:g128:rs");
  r.dim = 128;
  r.bytes = int64_t(bytes_per_vector(r.spec, 128));
  EXPECT_THROW(make_dev_format(r), Error);  // no grid
  r.grid = higgs_grid(4, 256).points.data();
  EXPECT_THROW(make_dev_format(r), Error);  // random signs without a sign vector
  std::vector<float> sg(128);
  hadamard_signs(r.spec.sign_seed, 128, sg.data());
  r.signs = sg.data();
  const DevFormat f = make_dev_format(r);
  EXPECT_EQ(f.group, 128);
  EXPECT_EQ(f.n_code, 32);
  EXPECT_EQ(f.code_bits, 8);
  EXPECT_EQ(f.meta_offset, 32);
  EXPECT_EQ(f.hadamard_scale, 1.0f / std::sqrt(128.0f));
  r.bytes += 1;
  EXPECT_THROW(make_dev_format(r), Error);
  RecordFormat n;
  n.spec = parse_quant_spec("nvfp4");
  n.dim = 64;
  n.bytes = int64_t(bytes_per_vector(n.spec, 64));
  EXPECT_THROW(make_dev_format(n, 0.0f), Error);  // tensor scale must be > 0
  EXPECT_EQ(make_dev_format(n, 0.5f).tensor_scale, 0.5f);
  RecordFormat u;
  u.spec = parse_quant_spec("int4:g32");
  u.dim = 48;  // not a multiple of the group
  u.bytes = 0;
  EXPECT_THROW(make_dev_format(u), Error);
}

}  // namespace
}  // namespace kvtier
