// The readable references of the non-HIGGS quantizers and of score(): the
// specification the fast paths (quant_cpu.cpp, quant_score_cpu.cpp) are
// tested against. Scalar casts are the search-based definitions of
// quant_fp8_ref.cpp.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/quant/higgs_quant.h"
#include "ops/quant/quant_layout.h"
#include "ops/quant/quant_scalar.h"

namespace kvtier {
namespace {
using namespace quant_layout;

float amax_of(const QuantSpec& spec, const float* x, int n, int64_t vec) {
  float amax = 0;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  KVT_CHECK(all_finite(x, n), "quantize {}: non-finite value in vector {}", to_string(spec), vec);
  return amax;
}

void quantize_one_ref(const QuantSpec& s, const float* x, int dim, int64_t vec, uint8_t* out) {
  switch (s.kind) {
    case QuantKind::f32:
      for (int i = 0; i < dim; ++i) store_f32(out + 4 * i, x[i]);
      return;
    case QuantKind::bf16:
      for (int i = 0; i < dim; ++i) store_u16(out + 2 * i, f32_to_bf16(x[i]));
      return;
    case QuantKind::fp8:
      for (int i = 0; i < dim; ++i) out[i] = f32_to_e4m3_ref(x[i]);
      return;
    case QuantKind::fp8_scaled: {
      float scale = amax_of(s, x, dim, vec) / kE4m3Max;
      for (int i = 0; i < dim; ++i) out[i] = scale > 0 ? f32_to_e4m3_ref(x[i] / scale) : 0;
      store_f32(out + dim, scale);
      return;
    }
    case QuantKind::nvfp4: {
      uint8_t* block_scales = out + dim / 2;  // [dim / 16] E4M3
      for (int b = 0; b < dim / 16; ++b) {
        const float* xb = x + 16 * b;
        float amax = amax_of(s, xb, 16, vec);
        uint8_t sc = f32_to_e4m3_ref((amax / kE2m1Max) / s.tensor_scale);
        float scale = e4m3_to_f32(sc) * s.tensor_scale;
        block_scales[b] = sc;
        for (int i = 0; i < 16; i += 2) {
          uint8_t lo = scale > 0 ? f32_to_e2m1_ref(xb[i] / scale) : 0;
          uint8_t hi = scale > 0 ? f32_to_e2m1_ref(xb[i + 1] / scale) : 0;
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
        uint8_t* codes = out + size_t(g) * l.code_bytes;
        for (int i = 0; i < l.group; ++i) put_bits(codes, i, binary_code(xg[i], minv, step), 1);
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
        float lo = INFINITY, hi = -INFINITY;
        for (int i = 0; i < l.group; ++i) lo = std::min(lo, xg[i]), hi = std::max(hi, xg[i]);
        KVT_CHECK(all_finite(xg, l.group), "quantize {}: non-finite value in vector {}",
                  to_string(s), vec);
        uint16_t min_h = bf16_round_down(lo);
        float minv = bf16_to_f32(min_h);
        uint16_t step_h = bf16_round_up((hi - minv) / float(levels));
        float step = bf16_to_f32(step_h);
        KVT_CHECK(std::isfinite(minv) && std::isfinite(step), "quantize {}: group {} of vector {} spans "
                  "[{}, {}], beyond bf16 range", to_string(s), g, vec, lo, hi);
        uint8_t* codes = out + size_t(g) * l.code_bytes;
        for (int i = 0; i < l.group; ++i) {
          float q = step > 0 ? std::nearbyint((xg[i] - minv) / step) : 0.0f;
          uint32_t code = uint32_t(std::clamp(q, 0.0f, float(levels)));
          put_bits(codes, int64_t(i) * s.bits, code, s.bits);
        }
        store_u16(out + l.meta_offset + 4 * size_t(g), min_h);
        store_u16(out + l.meta_offset + 4 * size_t(g) + 2, step_h);
      }
      return;
    }
    case QuantKind::higgs:
      break;  // handled per batch by higgs_quantize_ref
  }
}

void dequantize_one_ref(const QuantSpec& s, const uint8_t* in, int dim, float* out) {
  switch (s.kind) {
    case QuantKind::f32:
      for (int i = 0; i < dim; ++i) out[i] = load_f32(in + 4 * i);
      return;
    case QuantKind::bf16:
      for (int i = 0; i < dim; ++i) out[i] = bf16_to_f32(load_u16(in + 2 * i));
      return;
    case QuantKind::fp8:
      for (int i = 0; i < dim; ++i) out[i] = e4m3_to_f32(in[i]);
      return;
    case QuantKind::fp8_scaled: {
      float scale = load_f32(in + dim);
      for (int i = 0; i < dim; ++i) out[i] = e4m3_to_f32(in[i]) * scale;
      return;
    }
    case QuantKind::nvfp4:
      for (int i = 0; i < dim; ++i) {
        float scale = e4m3_to_f32(in[dim / 2 + i / 16]) * s.tensor_scale;
        uint8_t e = (i & 1) ? uint8_t(in[i / 2] >> 4) : uint8_t(in[i / 2] & 15);
        out[i] = e2m1_to_f32(e) * scale;
      }
      return;
    case QuantKind::binary:
    case QuantKind::uniform: {
      Grouped l = grouped_layout(s, dim);
      for (int g = 0; g < l.n_group; ++g) {
        float minv = bf16_to_f32(load_u16(in + l.meta_offset + 4 * size_t(g)));
        float step = bf16_to_f32(load_u16(in + l.meta_offset + 4 * size_t(g) + 2));
        const uint8_t* codes = in + size_t(g) * l.code_bytes;
        for (int i = 0; i < l.group; ++i)
          out[int64_t(g) * l.group + i] = minv + float(get_bits(codes, int64_t(i) * s.bits, s.bits)) * step;
      }
      return;
    }
    case QuantKind::higgs:
      break;
  }
}

}  // namespace

void quantize_ref(const QuantSpec& spec, const float* x, int64_t n_vec, int dim, uint8_t* out) {
  size_t bpv = bytes_per_vector(spec, dim);
  if (spec.kind == QuantKind::higgs) return higgs_quantize_ref(spec, x, n_vec, dim, out);
  for (int64_t v = 0; v < n_vec; ++v) quantize_one_ref(spec, x + v * dim, dim, v, out + size_t(v) * bpv);
}

void dequantize_ref(const QuantSpec& spec, const uint8_t* in, int64_t n_vec, int dim, float* out) {
  size_t bpv = bytes_per_vector(spec, dim);
  if (spec.kind == QuantKind::higgs) return higgs_dequantize_ref(spec, in, n_vec, dim, out);
  for (int64_t v = 0; v < n_vec; ++v) dequantize_one_ref(spec, in + size_t(v) * bpv, dim, out + v * dim);
}

void score_ref(const QuantSpec& spec, const ScoreParams& p) {
  int64_t stride = p.code_stride ? p.code_stride : int64_t(bytes_per_vector(spec, p.dim));
  std::vector<float> k(static_cast<size_t>(p.dim));  // [dim] f32, one dequantized record
  for (int64_t i = 0; i < p.n_vec; ++i) {
    dequantize_ref(spec, p.codes + i * stride, 1, p.dim, k.data());
    for (int j = 0; j < p.n_q; ++j) {
      double acc = 0;
      for (int t = 0; t < p.dim; ++t) acc += double(p.q[int64_t(j) * p.dim + t]) * k[size_t(t)];
      p.scores[int64_t(j) * score_stride_of(p) + i] = float(acc);
    }
  }
}

}  // namespace kvtier
