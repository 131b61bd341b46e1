// Internal: record-layout arithmetic shared by the reference and fast
// quantizers (quant_ref.cpp, higgs_ref.cpp, quant_cpu.cpp, quant_score_cpu.cpp).
// The layouts themselves are documented in quant_format.h.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/half.h"
#include "core/status.h"
#include "ops/quant/quant_format.h"

namespace kvtier::quant_layout {

inline int code_bits(int n) {  // ceil(log2 n)
  int b = 0;
  while ((1 << b) < n) ++b;
  return b;
}

// Byte offsets inside one record of a grouped format (uniform, higgs).
struct Grouped {
  int group = 0;             // values per group
  int n_group = 0;
  int bits = 0;              // bits per code
  int n_code = 0;            // codes per group (uniform: group; higgs: group / d)
  size_t code_bytes = 0;     // bytes of one group's codes
  size_t meta_offset = 0;    // where the per-group bf16 metadata starts
  size_t meta_bytes = 0;     // per group: 4 (uniform: min, step) or 2 (higgs: scale)
};

inline Grouped grouped_layout(const QuantSpec& s, int dim) {
  Grouped l;
  l.group = resolved_group(s, dim);
  l.n_group = dim / l.group;
  if (s.kind == QuantKind::uniform || s.kind == QuantKind::binary) {
    l.bits = s.bits;
    l.n_code = l.group;
    l.meta_bytes = 4;
  } else {
    l.bits = code_bits(s.grid_size);
    l.n_code = l.group / s.grid_dim;
    l.meta_bytes = 2;
  }
  l.code_bytes = (size_t(l.n_code) * size_t(l.bits) + 7) / 8;
  l.meta_offset = size_t(l.n_group) * l.code_bytes;
  return l;
}

// False when any value is NaN or ±inf (x·0 is NaN exactly for those); the
// min/max reductions alone would skip a NaN.
inline bool all_finite(const float* x, int n) {
  float z = 0;
  for (int i = 0; i < n; ++i) z += x[i] * 0.0f;
  return z == 0;
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline void store_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
inline float load_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
inline void store_f32(uint8_t* p, float v) { std::memcpy(p, &v, 4); }

// bf16 with directed rounding (the uniform quantizer's min goes down and its
// step up, so that [min, min + (2^b − 1)·step] covers the group).
inline uint16_t bf16_round_down(float f) {
  uint32_t u = f32_to_bits(f);
  uint16_t h = uint16_t(u >> 16);  // truncation: toward zero
  if ((u & 0xffffu) != 0 && (u >> 31)) ++h;  // negative: one more in magnitude
  return h;
}
inline uint16_t bf16_round_up(float f) {
  uint32_t u = f32_to_bits(f);
  uint16_t h = uint16_t(u >> 16);
  if ((u & 0xffffu) != 0 && !(u >> 31)) ++h;
  return h;
}

// The two levels of the 1bit quantizer for one group xg [n]: lo/hi = means of
// the values below / at-or-above the group mean, stored as bf16 min = lo and
// step = hi − min (RNE). Shared by the reference and fast paths: it is the
// definition, and it is cheap.
inline void binary_levels(const float* xg, int n, uint16_t& min_h, uint16_t& step_h) {
  double mean = 0;
  for (int i = 0; i < n; ++i) mean += xg[i];
  mean /= n;
  double lo = 0, hi = 0;
  int n_lo = 0;
  for (int i = 0; i < n; ++i) {
    if (xg[i] < mean) lo += xg[i], ++n_lo;
    else hi += xg[i];
  }
  lo = n_lo ? lo / n_lo : mean;
  hi = n_lo < n ? hi / (n - n_lo) : mean;
  min_h = f32_to_bf16(float(lo));
  step_h = f32_to_bf16(std::max(0.0f, float(hi) - bf16_to_f32(min_h)));
}

// 1bit code of x for the stored levels: the nearer one (ties: the lower).
inline uint32_t binary_code(float x, float minv, float step) { return (x - minv) > 0.5f * step ? 1u : 0u; }

}  // namespace kvtier::quant_layout
