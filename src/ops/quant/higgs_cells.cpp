// make_higgs_cells (higgs_cells.h): the cells' candidate lists, in f64.
#include "ops/quant/higgs_cells.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace kvtier {

std::vector<uint32_t> make_higgs_cells(const float* points, const float* half_norm2, int n, int d) {
  if (d != 2 || n < 2 || n > 4096) return {};  // larger grids: the build would take seconds
  double r = 0, h = 0;  // the largest |coordinate| and ‖c‖²/2
  for (int i = 0; i < 2 * n; ++i) r = std::max(r, std::abs(double(points[i])));
  for (int c = 0; c < n; ++c) h = std::max(h, double(half_norm2[c]));
  // u is a rotated group over its RMS: ~N(0, 1) per coordinate. The square
  // reaches 5 (a coordinate beyond it: ~6e-7) or a unit past the grid.
  const double half = std::max(5.0, std::ceil(r) + 1.0);
  const int side = std::clamp(int(std::ceil(4.0 * std::sqrt(double(n)))), 16, 128);  // ~4 candidates a cell
  const float lo = float(-half);
  const float inv = float(side / (2.0 * half));
  const double cell = 1.0 / double(inv);  // cell x covers u with (u − lo)·inv in [x, x + 1)
  // The slack (higgs_cells.h), in squared distance. The search's f32 score
  // of a u in the square is off by at most e; the f32 cell index puts u up to
  // delta outside its cell (two roundings of a value below side); no point is
  // farther than dist from the square.
  const double e = 3.0 * 0x1p-24 * (h + 2.0 * half * r);
  const double delta = 0x1p-23 * side * cell;
  const double dist = std::sqrt(2.0) * (2.0 * half + r);
  const double slack = 4.0 * (4.0 * e + 6.0 * delta * dist + 8.0 * delta * delta);

  std::vector<uint32_t> w = {uint32_t(side), std::bit_cast<uint32_t>(lo), std::bit_cast<uint32_t>(inv), 0};
  const size_t off = w.size();
  w.resize(off + size_t(side) * side + 1);
  std::vector<double> far(size_t(n));
  for (int y = 0; y < side; ++y)
    for (int x = 0; x < side; ++x) {
      const double x0 = double(lo) + x * cell, x1 = x0 + cell, y0 = double(lo) + y * cell, y1 = y0 + cell;
      double best_far = INFINITY;
      for (int c = 0; c < n; ++c) {
        const double px = points[2 * c], py = points[2 * c + 1];
        const double fx = std::max(std::abs(px - x0), std::abs(px - x1)), fy = std::max(std::abs(py - y0), std::abs(py - y1));
        best_far = std::min(best_far, fx * fx + fy * fy);
      }
      w[off + size_t(y) * side + x] = uint32_t(w.size() - off - (size_t(side) * side + 1));
      for (int c = 0; c < n; ++c) {
        const double px = points[2 * c], py = points[2 * c + 1];
        const double nx = std::max({0.0, x0 - px, px - x1}), ny = std::max({0.0, y0 - py, py - y1});
        if (nx * nx + ny * ny <= best_far + slack) w.push_back(uint32_t(c));
      }
    }
  const size_t n_cand = w.size() - off - (size_t(side) * side + 1);
  w[off + size_t(side) * side] = uint32_t(n_cand);
  w[3] = uint32_t(n_cand);
  return w;
}

}  // namespace kvtier
