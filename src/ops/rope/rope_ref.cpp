#include <cmath>

#include "core/status.h"
#include "ops/rope/rope.h"

namespace kvtier {

Rope::Rope(const ModelConfig& cfg, std::vector<float> freq_divisors)
    : head_dim_(cfg.head_dim), interleaved_(cfg.rope_interleaved) {
  KVT_CHECK(head_dim_ > 0 && head_dim_ % 2 == 0, "rope: head_dim {} must be even", head_dim_);
  const int half = head_dim_ / 2;
  KVT_CHECK(freq_divisors.empty() || int(freq_divisors.size()) == half,
            "rope: rope_freqs has {} values, expected head_dim/2 = {}", freq_divisors.size(), half);
  inv_freq_.resize(size_t(half));
  for (int i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(double(cfg.rope_theta), 2.0 * i / head_dim_);
    if (cfg.rope_scaling == RopeScaling::linear) {
      f /= cfg.rope_factor;
    } else if (cfg.rope_scaling == RopeScaling::llama3 && freq_divisors.empty()) {
      // Llama 3.1: long wavelengths are divided by `factor`, short ones kept,
      // the band between interpolated (Meta's reference rope scaling).
      const double low_wavelen = cfg.rope_original_ctx / cfg.rope_low_freq_factor;
      const double high_wavelen = cfg.rope_original_ctx / cfg.rope_high_freq_factor;
      const double wavelen = 2 * M_PI / f;
      if (wavelen > low_wavelen) {
        f /= cfg.rope_factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (cfg.rope_original_ctx / wavelen - cfg.rope_low_freq_factor) /
                              (cfg.rope_high_freq_factor - cfg.rope_low_freq_factor);
        f = (1 - smooth) * f / cfg.rope_factor + smooth * f;
      }
    }
    if (!freq_divisors.empty()) f /= freq_divisors[size_t(i)];
    inv_freq_[size_t(i)] = float(f);
  }
}

void Rope::apply_ref(float* x, int64_t n_tok, int n_heads, const int64_t* positions) const {
  const int half = head_dim_ / 2;
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim_;
      for (int i = 0; i < half; ++i) {
        const double a = double(positions[t]) * inv_freq_[size_t(i)];
        const double c = std::cos(a), s = std::sin(a);
        const int i0 = interleaved_ ? 2 * i : i;
        const int i1 = interleaved_ ? 2 * i + 1 : i + half;
        const double x0 = v[i0], x1 = v[i1];
        v[i0] = float(x0 * c - x1 * s);
        v[i1] = float(x0 * s + x1 * c);
      }
    }
  }
}

}  // namespace kvtier
