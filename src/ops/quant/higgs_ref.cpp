// HIGGS reference (SPEC "Quantizers"): per Hadamard group g of G values,
//   σ = bf16(‖x_g‖ / √G)                       (the stored scale)
//   u = H_G (s ⊙ x_g) / σ                      (orthonormal H; coordinates ≈ N(0, 1))
//   code_p = argmin_c ‖u[p·d, (p+1)·d) − grid_c‖   for p < G/d
// and back: x̂_g = s ⊙ H_G (σ · grid[code]), H_G being its own inverse. s are
// the ±1 signs of hadamard_signs(sign_seed) when random_signs, else all 1.
// Written for clarity: O(G²) Hadamard, f64 brute-force nearest point.
#include <cmath>
#include <vector>

#include "ops/quant/hadamard.h"
#include "ops/quant/higgs_grid.h"
#include "ops/quant/higgs_quant.h"
#include "ops/quant/quant_layout.h"
#include "ops/quant/quant_scalar.h"

namespace kvtier {
using namespace quant_layout;

void higgs_quantize_ref(const QuantSpec& s, const float* x, int64_t n_vec, int dim, uint8_t* out) {
  size_t bpv = bytes_per_vector(s, dim);
  Grouped l = grouped_layout(s, dim);
  const HiggsGrid& grid = higgs_grid_of(s);
  const int d = s.grid_dim, G = l.group;
  std::vector<float> signs(size_t(G), 1.0f);  // [G] f32
  if (s.random_signs) hadamard_signs(s.sign_seed, G, signs.data());
  std::vector<float> u(static_cast<size_t>(G));  // [G] f32, the rotated group
  for (int64_t v = 0; v < n_vec; ++v) {
    uint8_t* rec = out + size_t(v) * bpv;
    for (int g = 0; g < l.n_group; ++g) {
      const float* xg = x + v * dim + int64_t(g) * G;
      double norm2 = 0;
      for (int i = 0; i < G; ++i) norm2 += double(xg[i]) * xg[i];
      KVT_CHECK(std::isfinite(norm2), "quantize {}: non-finite value in vector {}", to_string(s), v);
      uint16_t sigma_h = f32_to_bf16(float(std::sqrt(norm2 / G)));
      float sigma = bf16_to_f32(sigma_h);
      KVT_CHECK(std::isfinite(sigma), "quantize {}: group {} of vector {} has norm {} beyond bf16",
                to_string(s), g, v, std::sqrt(norm2));
      for (int i = 0; i < G; ++i) u[size_t(i)] = signs[size_t(i)] * xg[i];
      hadamard_transform_ref(u.data(), G);
      uint8_t* codes = rec + size_t(g) * l.code_bytes;
      for (int p = 0; p < l.n_code; ++p) {
        float sub[64];  // one d-dim sub-vector (d <= 64)
        for (int k = 0; k < d; ++k) sub[k] = sigma > 0 ? u[size_t(p * d + k)] / sigma : 0.0f;
        int c = nearest_grid_point(grid.points.data(), grid.size, d, sub);
        put_bits(codes, int64_t(p) * l.bits, uint32_t(c), l.bits);
      }
      store_u16(rec + l.meta_offset + 2 * size_t(g), sigma_h);
    }
  }
}

void higgs_dequantize_ref(const QuantSpec& s, const uint8_t* in, int64_t n_vec, int dim, float* out) {
  size_t bpv = bytes_per_vector(s, dim);
  Grouped l = grouped_layout(s, dim);
  const HiggsGrid& grid = higgs_grid_of(s);
  const int d = s.grid_dim, G = l.group;
  std::vector<float> signs(size_t(G), 1.0f);  // [G] f32
  if (s.random_signs) hadamard_signs(s.sign_seed, G, signs.data());
  std::vector<float> y(static_cast<size_t>(G));  // [G] f32
  for (int64_t v = 0; v < n_vec; ++v) {
    const uint8_t* rec = in + size_t(v) * bpv;
    for (int g = 0; g < l.n_group; ++g) {
      float sigma = bf16_to_f32(load_u16(rec + l.meta_offset + 2 * size_t(g)));
      const uint8_t* codes = rec + size_t(g) * l.code_bytes;
      for (int p = 0; p < l.n_code; ++p) {
        uint32_t c = get_bits(codes, int64_t(p) * l.bits, l.bits);
        KVT_CHECK(c < uint32_t(grid.size), "dequantize {}: code {} >= grid size {} in vector {}",
                  to_string(s), c, grid.size, v);
        for (int k = 0; k < d; ++k) y[size_t(p * d + k)] = sigma * grid.points[size_t(c) * d + k];
      }
      hadamard_transform_ref(y.data(), G);
      float* og = out + v * dim + int64_t(g) * G;
      for (int i = 0; i < G; ++i) og[i] = signs[size_t(i)] * y[size_t(i)];
    }
  }
}

}  // namespace kvtier
