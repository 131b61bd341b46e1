// Fast CPU quantize/dequantize of every format (bit-trick casts instead of
// the search-based definitions; HIGGS in higgs_cpu.cpp) and the entry points
// of quant_format.h. Single-threaded on purpose: callers (the KV store)
// parallelize over layers and heads, and ThreadPool is not reentrant.
#include <algorithm>
#include <cmath>

#include "ops/quant/higgs_quant.h"
#include "ops/quant/quant_cpu_detail.h"
#include "ops/quant/quant_layout.h"
#include "ops/quant/quant_scalar.h"

namespace kvtier {
namespace {
using namespace quant_layout;

float amax_fast(const QuantSpec& s, const float* x, int n, int64_t vec) {
  float amax = 0;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  KVT_CHECK(all_finite(x, n), "quantize {}: non-finite value in vector {}", to_string(s), vec);
  return amax;
}

// b-bit codes appended LSB-first through a 64-bit accumulator.
struct BitWriter {
  uint8_t* p;
  uint64_t acc = 0;
  int n_acc = 0;
  void put(uint32_t v, int bits) {
    acc |= uint64_t(v) << n_acc;
    n_acc += bits;
    while (n_acc >= 8) {
      *p++ = uint8_t(acc);
      acc >>= 8;
      n_acc -= 8;
    }
  }
  void flush() {
    if (n_acc > 0) *p++ = uint8_t(acc);
    acc = 0, n_acc = 0;
  }
};

void quantize_one_cpu(const QuantSpec& s, const float* x, int dim, int64_t vec, uint8_t* out) {
  switch (s.kind) {
    case QuantKind::f32:
      std::memcpy(out, x, size_t(dim) * 4);
      return;
    case QuantKind::bf16:
      for (int i = 0; i < dim; ++i) store_u16(out + 2 * i, f32_to_bf16(x[i]));
      return;
    case QuantKind::fp8:
      for (int i = 0; i < dim; ++i) out[i] = f32_to_e4m3(x[i]);
      return;
    case QuantKind::fp8_scaled: {
      float scale = amax_fast(s, x, dim, vec) / kE4m3Max;
      if (scale > 0) {
        for (int i = 0; i < dim; ++i) out[i] = f32_to_e4m3(x[i] / scale);
      } else {
        std::memset(out, 0, size_t(dim));
      }
      store_f32(out + dim, scale);
      return;
    }
    case QuantKind::nvfp4: {
      uint8_t* block_scales = out + dim / 2;  // [dim / 16] E4M3
      for (int b = 0; b < dim / 16; ++b) {
        const float* xb = x + 16 * b;
        uint8_t sc = f32_to_e4m3((amax_fast(s, xb, 16, vec) / kE2m1Max) / s.tensor_scale);
        float scale = e4m3_to_f32(sc) * s.tensor_scale;
        block_scales[b] = sc;
        for (int i = 0; i < 16; i += 2) {
          uint8_t lo = scale > 0 ? f32_to_e2m1(xb[i] / scale) : 0;
          uint8_t hi = scale > 0 ? f32_to_e2m1(xb[i + 1] / scale) : 0;
          out[(16 * b + i) / 2] = uint8_t(lo | (hi << 4));
        }
      }
      return;
    }
    case QuantKind::binary: {
      Grouped l = grouped_layout(s, dim);
      for (int g = 0; g < l.n_group; ++g) {
        const float* xg = x + int64_t(g) * l.group;
        KVT_CHECK(all_finite(xg, l.group), "quantize {}: non-finite value in vector {}", to_string(s), vec);
        uint16_t min_h, step_h;
        binary_levels(xg, l.group, min_h, step_h);
        float minv = bf16_to_f32(min_h), step = bf16_to_f32(step_h);
        BitWriter w{out + size_t(g) * l.code_bytes};
        for (int i = 0; i < l.group; ++i) w.put(binary_code(xg[i], minv, step), 1);
        w.flush();
        store_u16(out + l.meta_offset + 4 * size_t(g), min_h);
        store_u16(out + l.meta_offset + 4 * size_t(g) + 2, step_h);
      }
      return;
    }
    case QuantKind::uniform: {
      Grouped l = grouped_layout(s, dim);
      const uint32_t levels = (1u << s.bits) - 1;
      for (int g = 0; g < l.n_group; ++g) {
        const float* xg = x + int64_t(g) * l.group;
        float lo = xg[0], hi = xg[0];
        for (int i = 1; i < l.group; ++i) lo = std::min(lo, xg[i]), hi = std::max(hi, xg[i]);
        KVT_CHECK(all_finite(xg, l.group), "quantize {}: non-finite value in vector {}",
                  to_string(s), vec);
        uint16_t min_h = bf16_round_down(lo);
        float minv = bf16_to_f32(min_h);
        uint16_t step_h = bf16_round_up((hi - minv) / float(levels));
        float step = bf16_to_f32(step_h);
        KVT_CHECK(std::isfinite(minv) && std::isfinite(step), "quantize {}: group {} of vector {} spans "
                  "[{}, {}], beyond bf16 range", to_string(s), g, vec, lo, hi);
        BitWriter w{out + size_t(g) * l.code_bytes};
        for (int i = 0; i < l.group; ++i) {
          float q = step > 0 ? std::nearbyint((xg[i] - minv) / step) : 0.0f;
          w.put(uint32_t(std::clamp(q, 0.0f, float(levels))), s.bits);
        }
        w.flush();
        store_u16(out + l.meta_offset + 4 * size_t(g), min_h);
        store_u16(out + l.meta_offset + 4 * size_t(g) + 2, step_h);
      }
      return;
    }
    case QuantKind::higgs:
      break;
  }
}

}  // namespace

void dequantize_one_cpu(const QuantSpec& s, const uint8_t* in, int dim, float* out) {
  switch (s.kind) {
    case QuantKind::f32:
      std::memcpy(out, in, size_t(dim) * 4);
      return;
    case QuantKind::bf16:
      for (int i = 0; i < dim; ++i) out[i] = bf16_to_f32(load_u16(in + 2 * i));
      return;
    case QuantKind::fp8:
      for (int i = 0; i < dim; ++i) out[i] = e4m3_table()[in[i]];
      return;
    case QuantKind::fp8_scaled: {
      float scale = load_f32(in + dim);
      for (int i = 0; i < dim; ++i) out[i] = e4m3_table()[in[i]] * scale;
      return;
    }
    case QuantKind::nvfp4:
      for (int b = 0; b < dim / 16; ++b) {
        float scale = e4m3_table()[in[dim / 2 + b]] * s.tensor_scale;
        for (int i = 0; i < 8; ++i) {
          uint8_t byte = in[8 * b + i];
          out[16 * b + 2 * i] = e2m1_to_f32(byte & 15) * scale;
          out[16 * b + 2 * i + 1] = e2m1_to_f32(byte >> 4) * scale;
        }
      }
      return;
    case QuantKind::binary:
    case QuantKind::uniform: {
      Grouped l = grouped_layout(s, dim);
      const uint32_t mask = (1u << s.bits) - 1;
      for (int g = 0; g < l.n_group; ++g) {
        float minv = bf16_to_f32(load_u16(in + l.meta_offset + 4 * size_t(g)));
        float step = bf16_to_f32(load_u16(in + l.meta_offset + 4 * size_t(g) + 2));
        const uint8_t* codes = in + size_t(g) * l.code_bytes;
        float* og = out + int64_t(g) * l.group;
        uint64_t acc = 0;
        int n_acc = 0;
        for (int i = 0; i < l.group; ++i) {
          if (n_acc < s.bits) acc |= uint64_t(*codes++) << n_acc, n_acc += 8;
          og[i] = minv + float(uint32_t(acc) & mask) * step;
          acc >>= s.bits;
          n_acc -= s.bits;
        }
      }
      return;
    }
    case QuantKind::higgs:
      higgs_dequantize_cpu(s, in, 1, dim, out);
      return;
  }
}

const float* e4m3_table() {
  static const auto table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[size_t(c)] = e4m3_to_f32(uint8_t(c));
    return t;
  }();
  return table.data();
}

void quantize(const QuantSpec& spec, const float* x, int64_t n_vec, int dim, uint8_t* out) {
  size_t bpv = bytes_per_vector(spec, dim);
  if (spec.kind == QuantKind::higgs) return higgs_quantize_cpu(spec, x, n_vec, dim, out);
  for (int64_t v = 0; v < n_vec; ++v) quantize_one_cpu(spec, x + v * dim, dim, v, out + size_t(v) * bpv);
}

void dequantize(const QuantSpec& spec, const uint8_t* in, int64_t n_vec, int dim, float* out) {
  size_t bpv = bytes_per_vector(spec, dim);
  if (spec.kind == QuantKind::higgs) return higgs_dequantize_cpu(spec, in, n_vec, dim, out);
  for (int64_t v = 0; v < n_vec; ++v) dequantize_one_cpu(spec, in + size_t(v) * bpv, dim, out + v * dim);
}

}  // namespace kvtier
