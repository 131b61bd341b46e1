// Grid registry, Lloyd's algorithm and the Gaussian helpers of HIGGS.
#include "ops/quant/higgs_grid.h"

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "core/status.h"
#include "ops/quant/higgs_cells.h"

namespace kvtier {
namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in (0, 1): 53 random bits, never 0 (Box–Muller takes its log).
double uniform01(uint64_t& state) { return (double(splitmix64(state) >> 11) + 0.5) * 0x1p-53; }

// x rounded to the nearest fp16 value (ties to even; |x| ≤ 65504): the
// grids' points are fp16 values, so the GPU's tensor-core scorer reads them
// exactly (score_rows_cuda.cu). The change to a grid's MSE is ~1e-7.
float round_to_fp16(float x) {
  if (std::abs(x) < 0x1p-14f) return std::nearbyint(x * 0x1p24f) * 0x1p-24f;  // fp16 subnormals
  uint32_t b;
  std::memcpy(&b, &x, 4);
  b += 0x0FFFu + ((b >> 13) & 1u);
  b &= ~0x1FFFu;
  std::memcpy(&x, &b, 4);
  return x;
}

std::vector<float> fp16_points(std::vector<float> points) {
  for (float& v : points) {
    KVT_CHECK(std::abs(v) <= 65504.f, "higgs grid: point coordinate {} outside fp16's range", v);
    v = round_to_fp16(v);
  }
  return points;
}

HiggsGrid finish_grid(int d, int n, std::vector<float> points, std::string source) {
  HiggsGrid g;
  g.dim = d;
  g.size = n;
  g.points = std::move(points);
  g.points_t.resize(size_t(n) * size_t(d));
  g.half_norm2.resize(size_t(n));
  for (int c = 0; c < n; ++c) {
    double s = 0;
    for (int k = 0; k < d; ++k) {
      float v = g.points[size_t(c) * size_t(d) + size_t(k)];
      g.points_t[size_t(k) * size_t(n) + size_t(c)] = v;
      s += double(v) * v;
    }
    g.half_norm2[size_t(c)] = float(0.5 * s);
  }
  g.source = std::move(source);
  return g;
}

}  // namespace

void gaussian_fill(float* x, int64_t n, uint64_t seed) {
  uint64_t state = seed;
  for (int64_t i = 0; i < n; i += 2) {
    double r = std::sqrt(-2.0 * std::log(uniform01(state)));
    double t = 2.0 * M_PI * uniform01(state);
    x[i] = float(r * std::cos(t));
    if (i + 1 < n) x[i + 1] = float(r * std::sin(t));
  }
}

int nearest_grid_point(const float* points, int n, int d, const float* u) {
  int best = 0;
  double best_dist = INFINITY;
  for (int c = 0; c < n; ++c) {
    double dist = 0;
    for (int k = 0; k < d; ++k) {
      double e = double(u[k]) - points[size_t(c) * size_t(d) + size_t(k)];
      dist += e * e;
    }
    if (dist < best_dist) {
      best_dist = dist;
      best = c;
    }
  }
  return best;
}

double grid_gaussian_mse(const float* points, int n, int d, int64_t n_sample, uint64_t seed) {
  std::vector<float> u(size_t(n_sample) * size_t(d));  // [n_sample, d] f32
  gaussian_fill(u.data(), int64_t(u.size()), seed);
  double err = 0;
  for (int64_t i = 0; i < n_sample; ++i) {
    const float* ui = u.data() + i * d;
    const float* c = points + size_t(nearest_grid_point(points, n, d, ui)) * size_t(d);
    for (int k = 0; k < d; ++k) err += (double(ui[k]) - c[k]) * (double(ui[k]) - c[k]);
  }
  return err / (double(n_sample) * d);
}

std::vector<float> make_gaussian_grid(int d, int n, uint64_t seed) {
  KVT_CHECK(d >= 1 && d <= 64, "make_gaussian_grid: dimension {} (expected 1..64)", d);
  KVT_CHECK(n >= 2 && n <= 65536, "make_gaussian_grid: {} points (expected 2..65536)", n);
  const int64_t n_sample = std::max<int64_t>(1000ll * n, 100000);
  std::vector<float> x(size_t(n_sample) * size_t(d));  // [n_sample, d] f32
  gaussian_fill(x.data(), int64_t(x.size()), seed);
  uint64_t state = seed ^ 0xa5a5a5a5a5a5a5a5ull;

  // k-means++ start: each next point drawn with probability ∝ squared distance
  // to the nearest point chosen so far.
  std::vector<float> c(size_t(n) * size_t(d));  // [n, d] f32
  std::vector<double> near2(size_t(n_sample), INFINITY);
  int64_t first = int64_t(splitmix64(state) % uint64_t(n_sample));
  for (int k = 0; k < d; ++k) c[size_t(k)] = x[size_t(first * d + k)];
  for (int j = 1; j < n; ++j) {
    const float* prev = c.data() + size_t(j - 1) * size_t(d);
    double total = 0;
    for (int64_t i = 0; i < n_sample; ++i) {
      double dist = 0;
      for (int k = 0; k < d; ++k) dist += (double(x[size_t(i * d + k)]) - prev[k]) * (double(x[size_t(i * d + k)]) - prev[k]);
      near2[size_t(i)] = std::min(near2[size_t(i)], dist);
      total += near2[size_t(i)];
    }
    double pick = uniform01(state) * total;
    int64_t chosen = n_sample - 1;
    for (int64_t i = 0; i < n_sample; ++i) {
      pick -= near2[size_t(i)];
      if (pick <= 0) {
        chosen = i;
        break;
      }
    }
    for (int k = 0; k < d; ++k) c[size_t(j) * size_t(d) + size_t(k)] = x[size_t(chosen * d + k)];
  }

  // Lloyd iterations until the distortion stops improving (relative 1e-6).
  std::vector<int> assign(static_cast<size_t>(n_sample));
  std::vector<double> sum(size_t(n) * size_t(d));
  std::vector<int64_t> count(static_cast<size_t>(n));
  HiggsGrid g = finish_grid(d, n, c, "");
  double prev_mse = INFINITY;
  for (int iter = 0; iter < 100; ++iter) {
    double mse = 0;
    std::fill(sum.begin(), sum.end(), 0.0);
    std::fill(count.begin(), count.end(), 0);
    for (int64_t i = 0; i < n_sample; ++i) {
      const float* xi = x.data() + i * d;
      // argmax_c (x·c − ‖c‖²/2) is the nearest point
      int best = 0;
      float best_s = -INFINITY;
      for (int j = 0; j < n; ++j) {
        float s = -g.half_norm2[size_t(j)];
        for (int k = 0; k < d; ++k) s += xi[k] * g.points[size_t(j) * size_t(d) + size_t(k)];
        if (s > best_s) {
          best_s = s;
          best = j;
        }
      }
      double x2 = 0;
      for (int k = 0; k < d; ++k) {
        sum[size_t(best) * size_t(d) + size_t(k)] += xi[k];
        x2 += double(xi[k]) * xi[k];
      }
      mse += x2 - 2.0 * double(best_s);
      ++count[size_t(best)];
    }
    std::vector<float> next = g.points;
    for (int j = 0; j < n; ++j) {
      if (count[size_t(j)] == 0) continue;  // an empty cell keeps its point
      for (int k = 0; k < d; ++k)
        next[size_t(j) * size_t(d) + size_t(k)] = float(sum[size_t(j) * size_t(d) + size_t(k)] / double(count[size_t(j)]));
    }
    g = finish_grid(d, n, std::move(next), "");
    if (prev_mse - mse <= 1e-6 * mse) break;
    prev_mse = mse;
  }
  return g.points;
}

const HiggsGrid& higgs_grid(int d, int n) {
  KVT_CHECK(d >= 1 && d <= 64 && n >= 2 && n <= 65536,
            "higgs grid EDEN{}-{}: expected dimension 1..64 and 2..65536 points", d, n);
  static std::mutex mu;
  static std::map<std::pair<int, int>, std::unique_ptr<HiggsGrid>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[{d, n}];
  if (!slot) {
    for (const ShippedGrid& s : shipped_higgs_grids()) {
      if (s.dim == d && s.size == n) {
        std::vector<float> pts(s.points, s.points + size_t(n) * size_t(d));
        slot = std::make_unique<HiggsGrid>(finish_grid(d, n, fp16_points(std::move(pts)), fmt::format("EDEN{}-{}", d, n)));
      }
    }
    if (!slot) {
      slot = std::make_unique<HiggsGrid>(
          finish_grid(d, n, fp16_points(make_gaussian_grid(d, n, kLloydSeed)), fmt::format("lloyd{}-{}", d, n)));
    }
    slot->cells = make_higgs_cells(slot->points.data(), slot->half_norm2.data(), n, d);
  }
  return *slot;
}

float higgs_uniform_half_step(int n) {
  double step = 0;
  switch (n) {
    case 2: step = 1.596; break;
    case 4: step = 0.9957; break;
    case 8: step = 0.5860; break;
    case 16: step = 0.3352; break;
    default: fail("higgs grid U{}: expected 2, 4, 8 or 16 levels", n);
  }
  const int e = int(std::floor(std::log2(step / 2)));  // 8 significant bits
  return float(std::ldexp(std::nearbyint(std::ldexp(step / 2, 7 - e)), e - 7));
}

const HiggsGrid& higgs_uniform_grid(int n) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<HiggsGrid>> cache;
  const float h = higgs_uniform_half_step(n);
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[n];
  if (!slot) {
    std::vector<float> pts(static_cast<size_t>(n));
    for (int c = 0; c < n; ++c) pts[size_t(c)] = float(2 * c - (n - 1)) * h;
    slot = std::make_unique<HiggsGrid>(finish_grid(1, n, std::move(pts), fmt::format("U{}", n)));
  }
  return *slot;
}

const HiggsGrid& higgs_grid_of(const QuantSpec& s) {
  return s.uniform_levels ? higgs_uniform_grid(s.grid_size) : higgs_grid(s.grid_dim, s.grid_size);
}

}  // namespace kvtier
