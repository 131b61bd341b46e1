// The one harness behind quant_dev_host_test.cpp (quant_dev.cuh compiled for
// the CPU) and quant_dev_cuda_test.cpp (the same code on the GPU): every spec
// of a grid against the CPU quantizer's fast path (quantize / dequantize /
// score, what production runs):
//   * records byte-identical, and no byte around them written;
//   * dequantized values bit-identical;
//   * scores (raw query, and query rotated by dev_rotate_query) within
//     1e-5·‖q‖·‖x̂‖ of score() (a relative bound on the largest score the
//     pair can have: the two sum in different orders);
//   * the rotated query bit-identical to the CPU's rotation.
// Each spec runs in the runner's placements (Runner::placements): records at
// offset 0 and at odd offsets, in device and mapped pinned host memory, HIGGS
// with the grid in global or shared memory, out of place or in place, one
// thread or one warp per record.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/half.h"
#include "ops/quant/hadamard.h"
#include "ops/quant/higgs_grid.h"
#include "ops/quant/quant_dev.cuh"
#include "ops/quant/quant_format.h"
#include "ops/quant/quant_scalar.h"

namespace kvtier::quant_dev_testing {

struct Placement {
  bool mapped_host = false;  // records in mapped pinned host memory (GPU)
  int offset = 0;            // bytes before the first record
  bool in_place = false;     // HIGGS quantize with scratch = x (x destroyed)
  bool stage_grid = false;   // HIGGS grid and half norms staged (shared memory)
  bool warp = false;         // quantize with dev_quantize_warp (GPU), scratch = x or its own
};

// Runs the device functions, one record per thread, on a device.
class Runner {
 public:
  virtual ~Runner() = default;
  // make_dev_format with the grid / signs in this runner's memory; grid:
  // [n, d] f32 instead of higgs_grid(d, n) when given.
  virtual DevFormat format(const QuantSpec& s, int dim, const std::vector<float>* grid = nullptr) = 0;
  // x: [n_vec, dim] → n_vec packed records; guards_ok: bytes around them untouched.
  virtual std::vector<uint8_t> quantize(const DevFormat& f, const std::vector<float>& x, int64_t n_vec,
                                        const Placement& p, bool& guards_ok) = 0;
  // → [n_vec, dim]
  virtual std::vector<float> dequantize(const DevFormat& f, const std::vector<uint8_t>& rec, int64_t n_vec,
                                        const Placement& p) = 0;
  // → [n_q, n_vec]: dev_score(q_j, rec_i), or dev_score_rotated when rotated (q from rotate()).
  virtual std::vector<float> score(const DevFormat& f, const std::vector<float>& q, int n_q,
                                   const std::vector<uint8_t>& rec, int64_t n_vec, bool rotated,
                                   const Placement& p) = 0;
  // q: [n_q, dim] → dev_rotate_query of each row
  virtual std::vector<float> rotate(const DevFormat& f, const std::vector<float>& q, int n_q) = 0;
  // Where each case runs: records at offset 0 (device memory) with the grid
  // in global memory (half norms computed per point), and at an odd offset
  // (mapped pinned host memory on the GPU) in place with the grid staged.
  virtual std::vector<Placement> placements(bool higgs) const {
    return {Placement{false, 0, false, false}, Placement{true, 3, higgs, higgs}};
  }
};

struct Case {
  std::string spec;
  int dim = 0;
  int64_t n_vec = 0;
  bool unit_tensor_scale = false;  // nvfp4: tensor scale 1 (block scales saturate) instead of amax/(448·6)
};

// Families of the grid (one test each).
inline std::vector<std::string> case_families() { return {"scalar", "uniform", "higgs", "grids", "layer"}; }

// n_many: vectors per case for dims up to 256 (fewer for wider ones).
inline std::vector<Case> cases(const std::string& family, int64_t n_many) {
  std::vector<Case> out;
  auto add = [&](const std::string& spec, int dim, bool unit = false) {
    QuantSpec s = parse_quant_spec(spec);
    const int g = resolved_group(s, dim);
    if ((s.kind == QuantKind::uniform || s.kind == QuantKind::binary || s.kind == QuantKind::higgs) &&
        (g > dim || dim % g != 0 || (s.kind == QuantKind::higgs && g % s.grid_dim != 0)))
      return;
    const int64_t n = dim <= 256    ? n_many
                      : dim <= 1024 ? std::max<int64_t>(n_many / 4, 8)
                                    : std::max<int64_t>(n_many / 16, 3);
    out.push_back({spec, dim, n, unit});
  };
  const int dims[] = {64, 128, 192, 256, 1024};
  for (int dim : dims) {
    if (family == "scalar") {
      for (const char* s : {"f32", "bf16", "fp8", "fp8s", "nvfp4"}) add(s, dim);
      add("nvfp4", dim, true);
    } else if (family == "uniform") {
      for (int b = 1; b <= 8; ++b)
        for (const char* g : {"", ":g8", ":g32", ":g64"}) add("int" + std::to_string(b) + g, dim);
      for (const char* g : {"", ":g16", ":g64"}) add(std::string("1bit") + g, dim);
    } else if (family == "higgs") {
      for (const char* b : {"4", "3", "2", "1", "0.5"})
        for (const char* g : {"", ":g32", ":g64", ":g128", ":g256"})
          for (const char* rs : {"", ":rs"}) add(std::string("higgs") + b + g + rs, dim);
    } else if (family == "grids") {
      // shipped EDEN grids beyond the defaults (12-bit codes, d = 16), a custom
      // seed, and Lloyd grids: d = 1 and 32 (the generic search), n neither a
      // multiple of 8 nor a power of two (the CPU's scalar search; 4- and 5-bit codes)
      // and U<n> grids (n uniform levels, scored in integers)
      for (const char* s : {"higgs:EDEN4-256:g128", "higgs:EDEN2-16", "higgs:EDEN4-16:g32:rs", "higgs:EDEN8-128:rs",
                            "higgs:EDEN8-4096:g64", "higgs:EDEN16-256:g128", "higgs2:g128:rs123", "higgs:EDEN1-8:g64",
                            "higgs:EDEN4-12:g64:rs", "higgs:EDEN8-20:g32", "higgs:EDEN32-2:g128:rs", "higgs:U4:g128",
                            "higgs:U2:g64:rs", "higgs:U16:g32", "higgs:U8"})
        add(s, dim);
    }
  }
  if (family == "layer")  // layer-wide records: 64 KV heads × 128
    for (const char* s :
         {"higgs4", "higgs2:g1024:rs", "higgs:EDEN8-256", "int4:g128", "1bit:g64", "fp8s", "nvfp4", "bf16"})
      add(s, 8192);
  return out;
}

// [n_vec, dim] f32: Gaussian rows at scales 2^-6..2^6 with outlier channels,
// and rows that hit the edges: zeros, a constant, ±0, huge (fp8 saturates),
// tiny (E4M3 subnormals), E4M3 and E2M1 rounding ties, small integers.
inline std::vector<float> vectors(int64_t n_vec, int dim, uint64_t seed) {
  std::vector<float> x(size_t(n_vec) * size_t(dim));
  gaussian_fill(x.data(), int64_t(x.size()), seed);
  const float e2m1_mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  for (int64_t v = 0; v < n_vec; ++v) {
    float* r = x.data() + v * dim;
    for (int i = 0; i < dim; ++i) {
      const float neg = i % 3 == 1 ? -1.0f : 1.0f;
      switch (v % 16) {
        case 0: r[i] = 0.0f; break;
        case 1: r[i] = 0.7f; break;
        case 2: r[i] = i % 3 == 0 ? -0.0f : i % 3 == 1 ? 0.0f : 0.01f * float(i); break;
        case 3: r[i] *= 1000.0f; break;
        case 4: r[i] *= 1e-6f; break;
        case 5: {
          const uint8_t c = uint8_t((i * 7) % 125);
          r[i] = neg * 0.5f * (e4m3_to_f32(c) + e4m3_to_f32(uint8_t(c + 1)));
          break;
        }
        case 6: r[i] = i % 16 == 15 ? 6.0f : neg * e2m1_mid[i % 7]; break;
        case 7: r[i] = float(i % 5); break;
        default: r[i] *= std::ldexp(1.0f, int(v % 13) - 6) * (i % 37 == 5 ? 20.0f : 1.0f); break;
      }
    }
  }
  return x;
}

// HIGGS rows whose rotated sub-vectors sit on the boundary between a random
// grid point and its nearest neighbour: u = (c1 + c2)/2 per sub-vector, the
// last one setting ‖u‖² ≈ G, and x = t · s ⊙ H(u) with t a bf16 value, so
// that σ = t and the rotated x is u up to rounding. Which point wins then
// depends on every rounding of the rotation and the search: the rows that
// tell an exact emulation from a close one. row: [dim] f32.
inline void near_tie_row(const QuantSpec& s, int dim, uint64_t seed, float* row) {
  const HiggsGrid& grid = higgs_grid_of(s);
  const int G = resolved_group(s, dim), d = s.grid_dim, n = grid.size, n_sub = G / d;
  if (n_sub < 2) return;
  std::vector<float> signs(size_t(G), 1.0f);
  if (s.random_signs) hadamard_signs(s.sign_seed, G, signs.data());
  uint64_t state = seed;
  auto next = [&] {  // splitmix64
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  const float t = bf16_to_f32(f32_to_bf16(std::ldexp(1.0f + float(next() % 64) / 64.0f, int(next() % 7) - 3)));
  for (int g = 0; g < dim / G; ++g) {
    float* u = row + size_t(g) * G;
    double norm2 = 0;
    for (int p = 0; p + 1 < n_sub; ++p) {
      const int c1 = int(next() % uint64_t(n));
      int c2 = c1 == 0 ? 1 : 0;
      double best = INFINITY;
      for (int c = 0; c < n; ++c) {
        double e = 0;
        for (int k = 0; k < d; ++k)
          e += std::pow(double(grid.points[size_t(c) * d + k]) - grid.points[size_t(c1) * d + k], 2);
        if (c != c1 && e < best) best = e, c2 = c;
      }
      for (int k = 0; k < d; ++k) {
        u[p * d + k] = 0.5f * (grid.points[size_t(c1) * d + k] + grid.points[size_t(c2) * d + k]);
        norm2 += double(u[p * d + k]) * u[p * d + k];
      }
    }
    const double rest = std::max(0.0, double(G) - norm2);
    for (int k = 0; k < d; ++k) u[(n_sub - 1) * d + k] = float(std::sqrt(rest / d));
    hadamard_transform(u, G);
    for (int i = 0; i < G; ++i) u[i] *= t * signs[size_t(i)];
  }
}

// The CPU's rotation of q in score(): per group H(s ⊙ q_g) (identity if not HIGGS).
inline std::vector<float> cpu_rotate(const QuantSpec& s, const std::vector<float>& q, int n_q, int dim) {
  std::vector<float> out = q;
  if (s.kind != QuantKind::higgs) return out;
  const int G = resolved_group(s, dim);
  std::vector<float> signs(size_t(G), 1.0f);
  if (s.random_signs) hadamard_signs(s.sign_seed, G, signs.data());
  for (int j = 0; j < n_q; ++j)
    for (int g = 0; g < dim / G; ++g) {
      float* u = out.data() + size_t(j) * dim + size_t(g) * G;
      for (int i = 0; i < G; ++i) u[i] *= signs[size_t(i)];
      hadamard_transform(u, G);
    }
  return out;
}

struct Tally {
  int64_t n_case = 0, n_record = 0, n_value = 0, n_score = 0;
  double max_score_err = 0;  // |dev − cpu| / (‖q‖·‖x̂‖)
};

inline void check_case(Runner& run, const Case& c, Tally& tally) {
  SCOPED_TRACE(c.spec + " dim " + std::to_string(c.dim));
  QuantSpec s = parse_quant_spec(c.spec);
  const int dim = c.dim;
  const int64_t n_vec = c.n_vec;
  std::vector<float> x = vectors(n_vec, dim, 1000 + uint64_t(dim) + std::hash<std::string>{}(c.spec) % 977);
  if (s.kind == QuantKind::higgs)
    for (int64_t v = 0; v < n_vec; ++v)
      if ((v % 16 >= 8 && v % 2 == 0) || (n_vec <= 16 && v == n_vec - 1))
        near_tie_row(s, dim, uint64_t(v), x.data() + v * dim);
  if (s.kind == QuantKind::nvfp4)
    s.tensor_scale = c.unit_tensor_scale ? 1.0f : nvfp4_tensor_scale(x.data(), int64_t(x.size()));
  const size_t bpv = bytes_per_vector(s, dim);
  std::vector<uint8_t> rec(bpv * size_t(n_vec));
  quantize(s, x.data(), n_vec, dim, rec.data());
  std::vector<float> deq(x.size());
  dequantize(s, rec.data(), n_vec, dim, deq.data());
  const int n_q = 3;
  std::vector<float> q(size_t(n_q) * dim);
  gaussian_fill(q.data(), int64_t(q.size()), 77 + uint64_t(dim));
  std::vector<float> want(size_t(n_q) * size_t(n_vec));
  ScoreParams sp;
  sp.q = q.data(), sp.n_q = n_q, sp.codes = rec.data(), sp.n_vec = n_vec, sp.dim = dim, sp.scores = want.data();
  score(s, sp);
  auto norm = [&](const float* v) {
    double a = 0;
    for (int i = 0; i < dim; ++i) a += double(v[i]) * v[i];
    return std::sqrt(a);
  };

  DevFormat f = run.format(s, dim);
  ASSERT_EQ(f.bytes, int64_t(bpv));
  const std::vector<float> q_rot = run.rotate(f, q, n_q);
  const std::vector<float> q_cpu = cpu_rotate(s, q, n_q, dim);
  ASSERT_EQ(q_rot.size(), q_cpu.size());
  EXPECT_EQ(std::memcmp(q_rot.data(), q_cpu.data(), q_cpu.size() * 4), 0) << "rotated query differs from the CPU's";
  const bool higgs = s.kind == QuantKind::higgs;
  for (const Placement& p : run.placements(higgs)) {
    SCOPED_TRACE(std::string(p.mapped_host ? "mapped host" : "device") + " offset " + std::to_string(p.offset) +
                 (p.in_place ? " in place" : "") + (p.stage_grid ? " staged grid" : "") + (p.warp ? " warp" : ""));
    bool guards_ok = false;
    const std::vector<uint8_t> got = run.quantize(f, x, n_vec, p, guards_ok);
    EXPECT_TRUE(guards_ok) << "bytes outside the records were written";
    ASSERT_EQ(got.size(), rec.size());
    int64_t bad_rec = 0, first_bad = -1;
    for (int64_t v = 0; v < n_vec; ++v)
      if (std::memcmp(got.data() + v * bpv, rec.data() + v * bpv, bpv) != 0) {
        ++bad_rec;
        if (first_bad < 0) first_bad = v;
      }
    EXPECT_EQ(bad_rec, 0) << "records differ from quantize(), first: vector " << first_bad;
    tally.n_record += n_vec;

    const std::vector<float> y = run.dequantize(f, rec, n_vec, p);
    ASSERT_EQ(y.size(), deq.size());
    int64_t bad_val = 0, first_val = -1;
    for (size_t i = 0; i < y.size(); ++i)
      if (std::memcmp(&y[i], &deq[i], 4) != 0) {
        ++bad_val;
        if (first_val < 0) first_val = int64_t(i);
      }
    EXPECT_EQ(bad_val, 0) << "dequantized values differ, first: value " << first_val << " = "
                          << (first_val >= 0 ? y[size_t(first_val)] : 0.f) << ", CPU "
                          << (first_val >= 0 ? deq[size_t(first_val)] : 0.f);
    tally.n_value += int64_t(y.size());

    for (bool rotated : {false, true}) {
      const std::vector<float> got_s = run.score(f, rotated ? q_rot : q, n_q, rec, n_vec, rotated, p);
      ASSERT_EQ(got_s.size(), want.size());
      int64_t bad_s = 0;
      for (int j = 0; j < n_q; ++j)
        for (int64_t v = 0; v < n_vec; ++v) {
          const size_t k = size_t(j) * size_t(n_vec) + size_t(v);
          const double scale = norm(q.data() + size_t(j) * dim) * norm(deq.data() + v * dim);
          const double err = std::fabs(double(got_s[k]) - double(want[k]));
          if (!(err <= 1e-5 * scale + 1e-30)) {
            if (bad_s++ == 0)
              ADD_FAILURE() << (rotated ? "rotated" : "raw") << " score of query " << j << " and vector " << v << ": "
                            << got_s[k] << ", CPU " << want[k] << " (‖q‖·‖x̂‖ " << scale << ")";
          }
          if (scale > 0) tally.max_score_err = std::max(tally.max_score_err, err / scale);
        }
      EXPECT_EQ(bad_s, 0) << (rotated ? "rotated" : "raw") << " scores beyond 1e-5·‖q‖·‖x̂‖";
      tally.n_score += int64_t(got_s.size());
    }
  }
  ++tally.n_case;
}

inline void check_family(Runner& run, const std::string& family, int64_t n_many) {
  Tally tally;
  for (const Case& c : cases(family, n_many)) {
    check_case(run, c, tally);
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_GT(tally.n_case, 0);
  std::printf("[quant_dev %s] %lld specs×dims, %lld records and %lld values identical, %lld scores, "
              "max |Δscore|/(‖q‖‖x̂‖) %.2e\n",
              family.c_str(), (long long)tally.n_case, (long long)tally.n_record, (long long)tally.n_value,
              (long long)tally.n_score, tally.max_score_err);
}

// Exact ties: a grid holding every point of EDEN2-16 twice (2i and 2i + 1)
// must give code 2c where the CPU with EDEN2-16 gives c (the lowest index
// wins), and dequantize to the CPU's values.
inline void check_tie_rule(Runner& run) {
  const int dim = 128;
  const int64_t n_vec = 64;
  const QuantSpec s16 = parse_quant_spec("higgs:EDEN2-16:g64"), s32 = parse_quant_spec("higgs:EDEN2-32:g64");
  const HiggsGrid& g16 = higgs_grid(2, 16);
  std::vector<float> twice(64);  // [32, 2] f32
  for (int c = 0; c < 32; ++c)
    for (int k = 0; k < 2; ++k) twice[size_t(c) * 2 + k] = g16.points[size_t(c / 2) * 2 + k];
  std::vector<float> x = vectors(n_vec, dim, 5);
  for (int64_t v = 8; v < n_vec; v += 4) near_tie_row(s16, dim, uint64_t(v), x.data() + v * dim);
  const size_t b16 = bytes_per_vector(s16, dim), b32 = bytes_per_vector(s32, dim);
  std::vector<uint8_t> want(b16 * size_t(n_vec));
  quantize(s16, x.data(), n_vec, dim, want.data());
  std::vector<float> deq(x.size());
  dequantize(s16, want.data(), n_vec, dim, deq.data());

  const DevFormat f = run.format(s32, dim, &twice);
  for (const Placement& p : run.placements(true)) {
    SCOPED_TRACE(std::string(p.warp ? "warp" : "thread") + (p.stage_grid ? ", staged grid" : ""));
    bool guards_ok = false;
    const std::vector<uint8_t> got = run.quantize(f, x, n_vec, p, guards_ok);
    EXPECT_TRUE(guards_ok);
    ASSERT_EQ(got.size(), b32 * size_t(n_vec));
    const int n_group = dim / 64, n_sub = 32;  // per group
    int64_t bad = 0;
    for (int64_t v = 0; v < n_vec; ++v)
      for (int g = 0; g < n_group; ++g) {
        const uint8_t* r16 = want.data() + v * b16;
        const uint8_t* r32 = got.data() + v * b32;
        for (int sp = 0; sp < n_sub; ++sp) {
          const uint32_t c16 = get_bits(r16 + g * 16, int64_t(sp) * 4, 4);  // 32 codes × 4 bits per group
          const uint32_t c32 = get_bits(r32 + g * 20, int64_t(sp) * 5, 5);  // 32 codes × 5 bits per group
          bad += c32 != 2 * c16;
        }
        bad += std::memcmp(r16 + n_group * 16 + 2 * g, r32 + n_group * 20 + 2 * g, 2) != 0;  // σ
      }
    EXPECT_EQ(bad, 0) << "codes not 2·(the CPU's) or scales differ";
    const std::vector<float> y = run.dequantize(f, got, n_vec, p);
    EXPECT_EQ(std::memcmp(y.data(), deq.data(), deq.size() * 4), 0) << "dequantized values differ";
  }
}

}  // namespace kvtier::quant_dev_testing
