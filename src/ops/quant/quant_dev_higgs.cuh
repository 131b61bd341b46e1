// HIGGS on the device: the Hadamard rotation of a group, the nearest grid
// point to each sub-vector, and quantize / dequantize / score of one record
// (quant_dev.cuh's header comment says where these follow the CPU's fast path).
// Part of quant_dev.cuh (include that).
#pragma once
#include <cmath>
#include <cstdint>

#include "ops/quant/quant_dev_format.cuh"
#include "ops/quant/quant_dev_scalar.cuh"

namespace kvtier::qdev {

// ‖c‖²/2 as higgs_grid's finish_grid: f64 sum of squares in order, halved, to f32.
KVT_QD_INLINE float half_norm2_of(const float* c, int d) {
  double s = 0;
  for (int k = 0; k < d; ++k) s = d_add(s, d_mul(double(c[k]), double(c[k])));
  return d_to_f(d_mul(0.5, s));
}

template <int D>
KVT_QD_INLINE void load_point(const float* p, float (&c)[D]) {  // p: 4·D-byte aligned when D is 2 or 4k
#ifdef __CUDA_ARCH__
  if constexpr (D % 4 == 0) {
KVT_QD_UNROLL
    for (int k = 0; k < D; k += 4) {
      const float4 v = *reinterpret_cast<const float4*>(p + k);
      c[k] = v.x, c[k + 1] = v.y, c[k + 2] = v.z, c[k + 3] = v.w;
    }
  } else if constexpr (D == 2) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    c[0] = v.x, c[1] = v.y;
  } else {
    for (int k = 0; k < D; ++k) c[k] = p[k];
  }
#else
  for (int k = 0; k < D; ++k) c[k] = p[k];
#endif
}

// hadamard_transform: butterflies of span 1, 2, 4, … (Sylvester order), then × scale.
KVT_QD void fwht(float* x, int n, float scale) {
  for (int h = 1; h < n; h *= 2)
    for (int i = 0; i < n; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = f_add(a, b);
        x[j + h] = f_sub(a, b);
      }
  for (int i = 0; i < n; ++i) x[i] = f_mul(x[i], scale);
}

// The nearest point to u [2] among the candidates of u's cell (higgs_cells.h),
// in nearest_fixed's order and arithmetic: its answer; −1 when u is outside
// the table's square (or NaN).
KVT_QD int nearest_in_cell(const DevFormat& f, const float* u) {
  const uint32_t* w = f.cells;
  const int side = int(w[0]);
  const float lo = bits_f32(w[1]), inv = bits_f32(w[2]);
  const float fx = f_mul(f_sub(u[0], lo), inv), fy = f_mul(f_sub(u[1], lo), inv);
  if (!(fx >= 0.f && fx < float(side) && fy >= 0.f && fy < float(side))) return -1;
  const uint32_t* first = w + 4;  // kCellsHeaderWords
  const uint32_t* cand = first + side * side + 1;
  const int cell = int(fy) * side + int(fx);
  int best = 0;
  float best_s = -INFINITY;
  for (uint32_t i = first[cell], end = first[cell + 1]; i < end; ++i) {
    const int c = int(cand[i]);
    float pc[2];
    load_point<2>(f.grid + 2 * c, pc);
    float s = -(f.half_norm2 ? f.half_norm2[c] : half_norm2_of(pc, 2));
    s = f_fma(u[0], pc[0], s);
    s = f_fma(u[1], pc[1], s);
    if (s > best_s) best_s = s, best = c;
  }
  return best;
}

// Nearest grid point to u [D]: the first c with the largest −‖c‖²/2 + Σ_k u_k·c_k.
template <int D>
KVT_QD int nearest_fixed(const DevFormat& f, const float* u) {
  if constexpr (D == 2) {
    if (f.cells) {
      const int c = nearest_in_cell(f, u);
      if (c >= 0) return c;
    }
  }
  float uu[D];
  for (int k = 0; k < D; ++k) uu[k] = u[k];
  int best = 0;
  float best_s = -INFINITY;
  for (int c = 0; c < f.grid_size; ++c) {
    float pc[D];
    load_point<D>(f.grid + c * D, pc);
    float s = -(f.half_norm2 ? f.half_norm2[c] : half_norm2_of(pc, D));
KVT_QD_UNROLL
    for (int k = 0; k < D; ++k) s = f_fma(uu[k], pc[k], s);
    if (s > best_s) best_s = s, best = c;
  }
  return best;
}
KVT_QD int nearest_any(const DevFormat& f, const float* u) {
  const int d = f.grid_dim;
  int best = 0;
  float best_s = -INFINITY;
  for (int c = 0; c < f.grid_size; ++c) {
    const float* pc = f.grid + c * d;
    float s = -(f.half_norm2 ? f.half_norm2[c] : half_norm2_of(pc, d));
    for (int k = 0; k < d; ++k) s = f_fma(u[k], pc[k], s);
    if (s > best_s) best_s = s, best = c;
  }
  return best;
}
KVT_QD_INLINE int nearest(const DevFormat& f, const float* u) {
  switch (f.grid_dim) {  // d divides a power of two: 1, 2, 4, …
    case 1: return nearest_fixed<1>(f, u);
    case 2: return nearest_fixed<2>(f, u);
    case 4: return nearest_fixed<4>(f, u);
    case 8: return nearest_fixed<8>(f, u);
    case 16: return nearest_fixed<16>(f, u);
    default: return nearest_any(f, u);
  }
}

KVT_QD_INLINE int read_code(const DevFormat& f, BitReader& codes) {
  const int c = int(codes.get(f.code_bits));
  return c < f.grid_size ? c : f.grid_size - 1;
}

// Σ_p qg[p·d, (p+1)·d) · grid[code_p] over one group's codes (rotated domain).
template <int D>
KVT_QD float group_dot_fixed(const DevFormat& f, const float* qg, BitReader& codes) {
  float acc = 0;
  for (int p = 0; p < f.n_code; ++p) {
    float pc[D];
    load_point<D>(f.grid + read_code(f, codes) * D, pc);
KVT_QD_UNROLL
    for (int k = 0; k < D; ++k) acc = f_fma(qg[p * D + k], pc[k], acc);
  }
  return acc;
}
KVT_QD float group_dot(const DevFormat& f, const float* qg, BitReader& codes) {
  switch (f.grid_dim) {
    case 2: return group_dot_fixed<2>(f, qg, codes);
    case 4: return group_dot_fixed<4>(f, qg, codes);
    case 8: return group_dot_fixed<8>(f, qg, codes);
    default: break;
  }
  const int d = f.grid_dim;
  float acc = 0;
  for (int p = 0; p < f.n_code; ++p) {
    const float* pc = f.grid + read_code(f, codes) * d;
    for (int k = 0; k < d; ++k) acc = f_fma(qg[p * d + k], pc[k], acc);
  }
  return acc;
}

// u ← H_G(s ⊙ src)·f32(1/√G): the CPU's rotation of a group (u may be src).
KVT_QD_INLINE void rotate_group(const DevFormat& f, const float* src, float* u) {
  for (int i = 0; i < f.group; ++i) u[i] = f.signs ? f_mul(f.signs[i], src[i]) : src[i];
  fwht(u, f.group, f.hadamard_scale);
}

KVT_QD void higgs_quantize(const DevFormat& f, const float* x, uint8_t* rec, float* scratch) {
  float local[kDevLocalGroup];
  if (!scratch && f.group > kDevLocalGroup) fail();
  const int G = f.group, d = f.grid_dim;
  BitWriter codes(rec), meta(rec + f.meta_offset);
  for (int g = 0; g < f.n_group; ++g) {
    const float* xg = x + int64_t(g) * G;
    double n2 = 0;
    for (int i = 0; i < G; ++i) n2 = d_add(n2, d_mul(double(xg[i]), double(xg[i])));  // products exact
    const uint32_t sigma_h = f32_bf16(d_to_f(d_sqrt(d_div(n2, double(G)))));
    const float sigma = bf16_f32(sigma_h);
    float* u = scratch ? scratch + int64_t(g) * G : local;
    rotate_group(f, xg, u);
    const float inv = sigma > 0 ? f_div(1.0f, sigma) : 0.0f;
    for (int i = 0; i < G; ++i) u[i] = f_mul(u[i], inv);
    for (int p = 0; p < f.n_code; ++p) codes.put(uint32_t(nearest(f, u + p * d)), f.code_bits);
    codes.next_byte();
    meta.put(sigma_h, 16);
  }
  codes.finish();
  meta.finish();
}

KVT_QD void higgs_dequantize(const DevFormat& f, const uint8_t* rec, float* out) {
  const int G = f.group, d = f.grid_dim;
  BitReader codes(rec, rec + f.bytes), meta(rec + f.meta_offset, rec + f.bytes);
  for (int g = 0; g < f.n_group; ++g) {
    const float sigma = bf16_f32(meta.get(16));
    float* y = out + int64_t(g) * G;  // σ·grid[code] (rotated domain), then rotated back in place
    for (int p = 0; p < f.n_code; ++p) {
      const float* pc = f.grid + read_code(f, codes) * d;
      for (int k = 0; k < d; ++k) y[p * d + k] = f_mul(sigma, pc[k]);
    }
    codes.next_byte();
    fwht(y, G, f.hadamard_scale);
    if (f.signs)
      for (int i = 0; i < G; ++i) y[i] = f_mul(y[i], f.signs[i]);
  }
}

// ---- U<n> grids (QuantSpec::uniform_levels): scores in integers, the same
// on every device. A group's rotated query q becomes int8 values
// q8 = rint(q·inv), inv = 127/amax (amax = max |q|; all 0 when amax is 0);
// with their sum S0 and the factor h·amax/127, a record's group of codes c
// scores (σ · factor) · (2 Σ q8·c − (n − 1)·S0): q8 · (2c − (n − 1))·h·amax/127.
struct UniformQuery {
  float inv = 0.f;     // 127 / amax
  float factor = 0.f;  // h · amax / 127
};
KVT_QD_INLINE UniformQuery uniform_query(float amax, float h) {
  UniformQuery u;
  if (amax > 0) u.inv = f_div(127.f, amax), u.factor = f_mul(h, f_div(amax, 127.f));
  return u;
}
KVT_QD_INLINE int32_t uniform_q8(float q, const UniformQuery& u) { return int32_t(f_rint(f_mul(q, u.inv))); }
// dot = Σ q8·c, sum = Σ q8 over the group; n levels.
KVT_QD_INLINE float uniform_group_score(float sigma, const UniformQuery& u, int32_t dot, int32_t sum, int n) {
  return f_mul(f_mul(sigma, u.factor), float(2 * dot - (n - 1) * sum));
}
// One group's score from its rotated query qg and its codes.
KVT_QD float uniform_group_rotated(const DevFormat& f, const float* qg, BitReader& codes, float sigma) {
  float amax = 0;
  for (int i = 0; i < f.group; ++i) amax = fmaxf(amax, fabsf(qg[i]));
  const UniformQuery u = uniform_query(amax, f.uniform_half_step);
  int32_t dot = 0, sum = 0;
  for (int p = 0; p < f.n_code; ++p) {
    const int32_t q8 = uniform_q8(qg[p], u);
    dot += q8 * int32_t(read_code(f, codes));
    sum += q8;
  }
  return uniform_group_score(sigma, u, dot, sum, f.grid_size);
}

// q·x̂ = Σ_g σ_g · (H(s ⊙ q_g)) · grid[codes_g]: H is orthonormal and symmetric.
// (U<n> grids: the groups' integer scores, summed.)
KVT_QD float higgs_score_rotated(const DevFormat& f, const float* q_rot, const uint8_t* rec) {
  BitReader codes(rec, rec + f.bytes), meta(rec + f.meta_offset, rec + f.bytes);
  float total = 0;
  for (int g = 0; g < f.n_group; ++g) {
    const float sigma = bf16_f32(meta.get(16));
    if (f.uniform_half_step > 0) {
      total = f_add(total, uniform_group_rotated(f, q_rot + int64_t(g) * f.group, codes, sigma));
    } else {
      const float acc = group_dot(f, q_rot + int64_t(g) * f.group, codes);
      total = f_fma(sigma, acc, total);
    }
    codes.next_byte();
  }
  return total;
}

KVT_QD float higgs_score_raw(const DevFormat& f, const float* q, const uint8_t* rec, float* scratch) {
  float local[kDevLocalGroup];
  if (!scratch && f.group > kDevLocalGroup) fail();
  BitReader codes(rec, rec + f.bytes), meta(rec + f.meta_offset, rec + f.bytes);
  float total = 0;
  for (int g = 0; g < f.n_group; ++g) {
    float* u = scratch ? scratch + int64_t(g) * f.group : local;
    rotate_group(f, q + int64_t(g) * f.group, u);
    const float sigma = bf16_f32(meta.get(16));
    if (f.uniform_half_step > 0) {
      total = f_add(total, uniform_group_rotated(f, u, codes, sigma));
    } else {
      const float acc = group_dot(f, u, codes);
      total = f_fma(sigma, acc, total);
    }
    codes.next_byte();
  }
  return total;
}

}  // namespace kvtier::qdev
