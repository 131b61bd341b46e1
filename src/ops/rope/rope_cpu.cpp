#include <cmath>
#include <vector>

#include "ops/rope/rope.h"

namespace kvtier {

void Rope::apply(float* x, int64_t n_tok, int n_heads, const int64_t* positions) const {
  const int half = head_dim_ / 2;
  std::vector<float> cs(size_t(2 * half));  // [half] cos, [half] sin for one position
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int i = 0; i < half; ++i) {
      // The angle in f64: in f32, pos * inv_freq loses ~pos * 2^-24 radians,
      // 0.006 at 100K tokens. Computed once per token and frequency, so cheap.
      const double a = double(positions[t]) * inv_freq_[size_t(i)];
      cs[size_t(i)] = float(std::cos(a));
      cs[size_t(half + i)] = float(std::sin(a));
    }
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim_;
      for (int i = 0; i < half; ++i) {
        const float c = cs[size_t(i)], s = cs[size_t(half + i)];
        const int i0 = interleaved_ ? 2 * i : i;
        const int i1 = interleaved_ ? 2 * i + 1 : i + half;
        const float x0 = v[i0], x1 = v[i1];
        v[i0] = x0 * c - x1 * s;
        v[i1] = x0 * s + x1 * c;
      }
    }
  }
}

}  // namespace kvtier
