// The vector quantizers of quant_format.h on the device, one thread per
// record: quantize, dequantize, and score q·dequant(record) from the codes.
// Header-only; the functions are __host__ __device__ (the host build serves
// quant_dev_host_test.cpp), nvcc C++17, any sm.
//
// Bit-exact with the FAST CPU path (quant_cpu.cpp, higgs_cpu.cpp), which is
// what production runs: dev_quantize writes the bytes quantize() writes and
// dev_dequantize the values dequantize() gives. Where the readable
// references differ from the fast path, this follows the fast path:
//   * HIGGS nearest point: the largest u·c − ‖c‖²/2 in f32, built as
//     −‖c‖²/2 then one FMA per coordinate in order (higgs_cpu's search),
//     lowest index on ties; higgs_ref takes the smallest f64 squared distance,
//     which can pick the other point of a near-tie;
//   * HIGGS rotation: hadamard_transform's f32 butterflies (spans 1, 2, 4, …)
//     then × f32(1/√G), then × f32(1/σ) (higgs_ref: f64 matrix product, ÷σ);
//   * the CPU's scalar search (grids whose n is not a multiple of 8) now
//     spells its FMAs out too (higgs_cpu.cpp): left to gcc, it fused some of
//     those sums and not others, and quant_dev_check.h's near-tie rows of
//     EDEN4-12 / EDEN8-20 picked other points.
// uniform/1bit dequantize min + code·step: code·step is exact in f32 (8-bit
// code × bf16 step), so fused (here) or not (the CPU, per build) agree.
// Scores accumulate in f32 in another order than score(): they agree to
// ~1e-7·‖q‖·‖x̂‖, not bit for bit. The CPU refuses non-finite inputs (and
// uniform groups beyond bf16); here such a record is unspecified but the
// call returns. A corrupt HIGGS code ≥ n (possible only for n not a power of
// two) reads grid point n − 1 instead of failing.
//
// Cost per record (one thread): a pass or two over x for the scalar formats;
// HIGGS adds the G·log2 G butterflies per group and, to quantize, n·d FMAs
// per sub-vector of d values (EDEN4-256 over 128 values: 32 Ki FMAs).
// Stage the grid in shared memory (dev_stage_grid) when a block quantizes
// many records. Records are read and written through aligned 32-bit words
// where the address allows (quant_dev_scalar.cuh), so mapped pinned host
// memory (zero-copy) works and costs few PCIe transactions.
#pragma once
#include <cmath>
#include <cstdint>

#include "ops/kv_append/kv_write.h"
#include "ops/quant/quant_dev_scalar.cuh"
#include "ops/quant/quant_format.h"
#include "ops/quant/quant_layout.h"

namespace kvtier {

// HIGGS groups up to this size run in a per-thread local array (1 KiB of
// stack); larger ones (layer-wide records, up to any power of two) need the
// caller's `scratch` of dim floats (dev_needs_scratch).
constexpr int kDevLocalGroup = 256;

// One record format, resolved for the device (make_dev_format). Plain data:
// pass it to kernels by value; a kernel may override tensor_scale per
// sequence, or grid / half_norm2 with a shared-memory copy (dev_stage_grid).
struct DevFormat {
  int kind = 0;             // int(QuantKind)
  int bits = 0;             // QuantSpec::bits
  int group = 0;            // uniform/1bit: values per min/step; higgs: Hadamard group G; else dim
  int grid_dim = 0;         // higgs: d
  int grid_size = 0;        // higgs: n
  int dim = 0;              // values per record
  int64_t bytes = 0;        // bytes per record (bytes_per_vector)
  int n_group = 0;          // dim / group
  int code_bits = 0;        // bits per code: uniform/1bit bits, higgs ceil(log2 n), nvfp4 4, fp8/fp8s 8, else 0
  int n_code = 0;           // codes per group: uniform/1bit group, higgs G/d, else dim
  int64_t code_bytes = 0;   // bytes of one group's codes (each group starts on a byte)
  int64_t meta_offset = 0;  // start of: uniform/1bit [n_group] bf16 (min, step); higgs [n_group] bf16 σ;
                            // fp8s the f32 scale; nvfp4 the [dim/16] E4M3 block scales; else bytes
  const float* grid = nullptr;   // higgs: [grid_size, grid_dim] f32, 16-byte aligned (device or shared)
  const float* signs = nullptr;  // higgs with random signs: [group] ±1 f32; else null
  float tensor_scale = 1.f;      // nvfp4: the per-tensor scale
  // Beyond the fields above (what the device code needs precomputed):
  const float* half_norm2 = nullptr;  // higgs, optional: [grid_size] f32 ‖c‖²/2 (HiggsGrid::half_norm2 uploaded,
                                      // or dev_stage_grid); null: computed per point (f64, slower)
  float hadamard_scale = 1.f;         // higgs: f32(1/√G), as hadamard_transform computes it
};

namespace qdev {
constexpr int kF32 = int(QuantKind::f32), kBf16 = int(QuantKind::bf16), kFp8 = int(QuantKind::fp8),
              kFp8s = int(QuantKind::fp8_scaled), kNvfp4 = int(QuantKind::nvfp4),
              kUniform = int(QuantKind::uniform), kBinary = int(QuantKind::binary),
              kHiggs = int(QuantKind::higgs);
}  // namespace qdev

// True when HIGGS groups exceed kDevLocalGroup: dev_quantize and dev_score
// then need scratch ([dim] f32 per thread).
KVT_QD_INLINE bool dev_needs_scratch(const DevFormat& f) {
  return f.kind == qdev::kHiggs && f.group > kDevLocalGroup;
}

// Host: the device view of a record format (grid / signs must be device
// pointers). tensor_scale is nvfp4's per-tensor scale; the one-argument form
// takes r.spec.tensor_scale. Throws kvtier::Error when the record does not fit.
inline DevFormat make_dev_format(const RecordFormat& r, float tensor_scale) {
  QuantSpec s = r.spec;
  s.tensor_scale = tensor_scale;
  const int64_t bpv = int64_t(bytes_per_vector(s, r.dim));  // validates spec and dim
  KVT_CHECK(r.bytes == bpv, "make_dev_format {}: record of {} bytes for {} values, expected {}", to_string(s),
            r.bytes, r.dim, bpv);
  DevFormat f;
  f.kind = int(s.kind);
  f.bits = s.bits;
  f.dim = r.dim;
  f.bytes = bpv;
  f.group = resolved_group(s, r.dim);
  f.n_group = r.dim / f.group;
  f.n_code = r.dim;
  f.meta_offset = bpv;
  f.tensor_scale = tensor_scale;
  switch (s.kind) {
    case QuantKind::fp8:
      f.code_bits = 8;
      break;
    case QuantKind::fp8_scaled:
      f.code_bits = 8, f.meta_offset = r.dim;
      break;
    case QuantKind::nvfp4:
      f.code_bits = 4, f.meta_offset = r.dim / 2;
      break;
    case QuantKind::uniform:
    case QuantKind::binary:
    case QuantKind::higgs: {
      const quant_layout::Grouped l = quant_layout::grouped_layout(s, r.dim);
      f.code_bits = l.bits;
      f.n_code = l.n_code;
      f.code_bytes = int64_t(l.code_bytes);
      f.meta_offset = int64_t(l.meta_offset);
      break;
    }
    default:
      break;
  }
  if (s.kind == QuantKind::higgs) {
    KVT_CHECK(r.grid != nullptr && reinterpret_cast<uintptr_t>(r.grid) % 16 == 0,
              "make_dev_format {}: the grid pointer is null or not 16-byte aligned", to_string(s));
    KVT_CHECK(!s.random_signs || r.signs != nullptr, "make_dev_format {}: random signs but no sign vector",
              to_string(s));
    f.grid_dim = s.grid_dim;
    f.grid_size = s.grid_size;
    f.grid = r.grid;
    f.signs = s.random_signs ? r.signs : nullptr;
    f.half_norm2 = r.half_norm2;
    f.hadamard_scale = 1.0f / std::sqrt(float(f.group));
  }
  return f;
}
inline DevFormat make_dev_format(const RecordFormat& r) { return make_dev_format(r, r.spec.tensor_scale); }

// Shared memory dev_stage_grid needs, in floats (a multiple of 4; 0 unless
// HIGGS), and in bytes.
KVT_QD_INLINE int64_t dev_grid_floats(const DevFormat& f) {
  if (f.kind != qdev::kHiggs) return 0;
  return ((int64_t(f.grid_size) * f.grid_dim + 3) & ~int64_t(3)) + ((int64_t(f.grid_size) + 3) & ~int64_t(3));
}
inline size_t dev_grid_smem_bytes(const DevFormat& f) { return size_t(dev_grid_floats(f)) * 4; }

namespace qdev {

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

// Nearest grid point to u [D]: the first c with the largest −‖c‖²/2 + Σ_k u_k·c_k.
template <int D>
KVT_QD int nearest_fixed(const DevFormat& f, const float* u) {
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

// q·x̂ = Σ_g σ_g · (H(s ⊙ q_g)) · grid[codes_g]: H is orthonormal and symmetric.
KVT_QD float higgs_score_rotated(const DevFormat& f, const float* q_rot, const uint8_t* rec) {
  BitReader codes(rec, rec + f.bytes), meta(rec + f.meta_offset, rec + f.bytes);
  float total = 0;
  for (int g = 0; g < f.n_group; ++g) {
    const float sigma = bf16_f32(meta.get(16));
    const float acc = group_dot(f, q_rot + int64_t(g) * f.group, codes);
    codes.next_byte();
    total = f_fma(sigma, acc, total);
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
    const float acc = group_dot(f, u, codes);
    codes.next_byte();
    total = f_fma(sigma, acc, total);
  }
  return total;
}

// The scalar formats value by value: sink(i, x̂_i) for i < dim.
template <class Sink>
KVT_QD void decode_each(const DevFormat& f, const uint8_t* rec, Sink& sink) {
  const uint8_t* end = rec + f.bytes;
  BitReader r(rec, end);
  switch (f.kind) {
    case kF32:
      for (int i = 0; i < f.dim; ++i) sink(i, bits_f32(r.get(32)));
      return;
    case kBf16:
      for (int i = 0; i < f.dim; ++i) sink(i, bf16_f32(r.get(16)));
      return;
    case kFp8:
      for (int i = 0; i < f.dim; ++i) sink(i, e4m3_f32(r.get(8)));
      return;
    case kFp8s: {
      BitReader rs(rec + f.meta_offset, end);
      const float scale = bits_f32(rs.get(32));
      for (int i = 0; i < f.dim; ++i) sink(i, f_mul(e4m3_f32(r.get(8)), scale));
      return;
    }
    case kNvfp4: {
      BitReader rs(rec + f.meta_offset, end);
      for (int b = 0; b < f.dim / 16; ++b) {
        const float scale = f_mul(e4m3_f32(rs.get(8)), f.tensor_scale);
        for (int i = 0; i < 16; ++i) sink(16 * b + i, f_mul(e2m1_f32(r.get(4)), scale));
      }
      return;
    }
    case kUniform:
    case kBinary: {
      BitReader rm(rec + f.meta_offset, end);
      for (int g = 0; g < f.n_group; ++g) {
        const float minv = bf16_f32(rm.get(16)), step = bf16_f32(rm.get(16));
        for (int i = 0; i < f.group; ++i) sink(g * f.group + i, f_fma(float(r.get(f.code_bits)), step, minv));
        r.next_byte();
      }
      return;
    }
    default:
      return;
  }
}
struct StoreSink {
  float* out;
  KVT_QD_INLINE void operator()(int i, float v) { out[i] = v; }
};
struct DotSink {
  const float* q;
  float acc = 0;
  KVT_QD_INLINE void operator()(int i, float v) { acc = f_fma(q[i], v, acc); }
};

KVT_QD_INLINE float abs_f(float v) { return bits_f32(f32_bits(v) & 0x7fffffffu); }

}  // namespace qdev

// x: [dim] f32, read only, except that scratch may be x itself (then x is
// overwritten). scratch: null, or [dim] f32 the HIGGS path works in (required
// when dev_needs_scratch(f)). rec: f.bytes bytes, any alignment, device or
// mapped pinned host memory; no byte outside it is touched.
KVT_QD void dev_quantize(const DevFormat& f, const float* x, uint8_t* rec, float* scratch = nullptr) {
  using namespace qdev;
  BitWriter w(rec);
  switch (f.kind) {
    case kF32:
      for (int i = 0; i < f.dim; ++i) w.put(f32_bits(x[i]), 32);
      break;
    case kBf16:
      for (int i = 0; i < f.dim; ++i) w.put(f32_bf16(x[i]), 16);
      break;
    case kFp8:
      for (int i = 0; i < f.dim; ++i) w.put(f32_e4m3(x[i]), 8);
      break;
    case kFp8s: {
      float amax = 0;
      for (int i = 0; i < f.dim; ++i) amax = amax < abs_f(x[i]) ? abs_f(x[i]) : amax;
      const float scale = f_div(amax, 448.0f);
      for (int i = 0; i < f.dim; ++i) w.put(scale > 0 ? f32_e4m3(f_div(x[i], scale)) : 0u, 8);
      w.put(f32_bits(scale), 32);
      break;
    }
    case kNvfp4: {
      BitWriter ws(rec + f.meta_offset);
      for (int b = 0; b < f.dim / 16; ++b) {
        const float* xb = x + 16 * b;
        float amax = 0;
        for (int i = 0; i < 16; ++i) amax = amax < abs_f(xb[i]) ? abs_f(xb[i]) : amax;
        const uint32_t sc = f32_e4m3(f_div(f_div(amax, 6.0f), f.tensor_scale));
        const float scale = f_mul(e4m3_f32(sc), f.tensor_scale);
        ws.put(sc, 8);
        for (int i = 0; i < 16; ++i) w.put(scale > 0 ? f32_e2m1(f_div(xb[i], scale)) : 0u, 4);
      }
      ws.finish();
      break;
    }
    case kUniform: {
      BitWriter wm(rec + f.meta_offset);
      const uint32_t levels = (1u << f.code_bits) - 1;
      const float top = float(levels);
      for (int g = 0; g < f.n_group; ++g) {
        const float* xg = x + int64_t(g) * f.group;
        float lo = xg[0], hi = xg[0];
        for (int i = 1; i < f.group; ++i) lo = xg[i] < lo ? xg[i] : lo, hi = hi < xg[i] ? xg[i] : hi;
        const uint32_t min_h = bf16_round_down(lo);
        const float minv = bf16_f32(min_h);
        const uint32_t step_h = bf16_round_up(f_div(f_sub(hi, minv), top));
        const float step = bf16_f32(step_h);
        for (int i = 0; i < f.group; ++i) {
          float q = step > 0 ? f_rint(f_div(f_sub(xg[i], minv), step)) : 0.0f;
          q = q < 0.0f ? 0.0f : top < q ? top : q;  // std::clamp
          w.put(uint32_t(q), f.code_bits);
        }
        w.next_byte();
        wm.put(min_h, 16);
        wm.put(step_h, 16);
      }
      wm.finish();
      break;
    }
    case kBinary: {  // quant_layout.h's binary_levels / binary_code
      BitWriter wm(rec + f.meta_offset);
      const int n = f.group;
      for (int g = 0; g < f.n_group; ++g) {
        const float* xg = x + int64_t(g) * n;
        double mean = 0;
        for (int i = 0; i < n; ++i) mean = d_add(mean, double(xg[i]));
        mean = d_div(mean, double(n));
        double lo = 0, hi = 0;
        int n_lo = 0;
        for (int i = 0; i < n; ++i) {
          if (double(xg[i]) < mean) lo = d_add(lo, double(xg[i])), ++n_lo;
          else hi = d_add(hi, double(xg[i]));
        }
        lo = n_lo ? d_div(lo, double(n_lo)) : mean;
        hi = n_lo < n ? d_div(hi, double(n - n_lo)) : mean;
        const uint32_t min_h = f32_bf16(d_to_f(lo));
        const float gap = f_sub(d_to_f(hi), bf16_f32(min_h));
        const uint32_t step_h = f32_bf16(0.0f < gap ? gap : 0.0f);
        const float minv = bf16_f32(min_h), half_step = f_mul(0.5f, bf16_f32(step_h));
        for (int i = 0; i < n; ++i) w.put(f_sub(xg[i], minv) > half_step ? 1u : 0u, 1);
        w.next_byte();
        wm.put(min_h, 16);
        wm.put(step_h, 16);
      }
      wm.finish();
      break;
    }
    case kHiggs:
      higgs_quantize(f, x, rec, scratch);
      return;
    default:
      return;
  }
  w.finish();
}

// out: [dim] f32 (the HIGGS path rotates in place there, no scratch).
KVT_QD void dev_dequantize(const DevFormat& f, const uint8_t* rec, float* out) {
  if (f.kind == qdev::kHiggs) return qdev::higgs_dequantize(f, rec, out);
  qdev::StoreSink sink{out};
  qdev::decode_each(f, rec, sink);
}

// q_rot = the query in the record's coding domain: per HIGGS group
// H_G(s ⊙ q_g)·(1/√G), bit-identical to the CPU's rotation of q in score();
// for the other formats q itself. q_rot: [dim] f32, may be q.
KVT_QD void dev_rotate_query(const DevFormat& f, const float* q, float* q_rot) {
  if (f.kind == qdev::kHiggs) {
    for (int g = 0; g < f.n_group; ++g) qdev::rotate_group(f, q + int64_t(g) * f.group, q_rot + int64_t(g) * f.group);
    return;
  }
  if (q_rot != q)
    for (int i = 0; i < f.dim; ++i) q_rot[i] = q[i];
}

// q · dequant(rec) from the codes, f32 accumulation; q_rot from
// dev_rotate_query (rotate once, score many records).
KVT_QD float dev_score_rotated(const DevFormat& f, const float* q_rot, const uint8_t* rec) {
  if (f.kind == qdev::kHiggs) return qdev::higgs_score_rotated(f, q_rot, rec);
  qdev::DotSink sink{q_rot};
  qdev::decode_each(f, rec, sink);
  return sink.acc;
}

// The same from the raw query q [dim]: HIGGS rotates q group by group inside
// (in a local array, or in scratch [dim] f32 when given; required when
// dev_needs_scratch(f); scratch may be q, which is then overwritten).
KVT_QD float dev_score(const DevFormat& f, const float* q, const uint8_t* rec, float* scratch = nullptr) {
  if (f.kind == qdev::kHiggs) return qdev::higgs_score_raw(f, q, rec, scratch);
  return dev_score_rotated(f, q, rec);
}

#ifdef __CUDACC__
// Block-cooperative (every thread of the block calls it, then it syncs):
// copies the HIGGS grid and its half norms into smem (dev_grid_smem_bytes,
// 16-byte aligned, e.g. extern __shared__ float4[]) and points f at them.
// No-op for the other formats.
__device__ inline void dev_stage_grid(DevFormat& f, float* smem) {
  if (f.kind != qdev::kHiggs) return;
  const int nd = f.grid_size * f.grid_dim;
  const int tid = int(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  const int n_thread = int(blockDim.x * blockDim.y * blockDim.z);
  float* hn = smem + ((nd + 3) & ~3);
  for (int i = tid; i < nd; i += n_thread) smem[i] = f.grid[i];
  for (int c = tid; c < f.grid_size; c += n_thread) hn[c] = qdev::half_norm2_of(f.grid + c * f.grid_dim, f.grid_dim);
  __syncthreads();
  f.grid = smem;
  f.half_norm2 = hn;
}

// dev_quantize by a whole warp: all 32 lanes call it with the same arguments
// and it returns in each once rec is written (by lane 0). HIGGS spreads the
// rotation and the nearest-point searches over the lanes: ~32× less latency
// than one thread, for where few records are quantized at once (a decode
// step's appends); σ stays lane 0's sequential f64 sum, the CPU's order, so
// the bytes are dev_quantize's. scratch: [dim] f32 the warp shares (shared or
// global memory; may be x, then overwritten). The other formats, and HIGGS
// without scratch, run dev_quantize on lane 0.
__device__ inline void dev_quantize_warp(const DevFormat& f, const float* x, uint8_t* rec, float* scratch) {
  using namespace qdev;
  constexpr unsigned kAll = 0xffffffffu;
  unsigned lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  if (f.kind != kHiggs || !scratch) {
    if (f.kind == kHiggs && f.group > kDevLocalGroup) fail();
    if (lane == 0) dev_quantize(f, x, rec);
    __syncwarp();
    return;
  }
  const int G = f.group, d = f.grid_dim;
  BitWriter codes(rec), meta(rec + f.meta_offset);  // lane 0's
  for (int g = 0; g < f.n_group; ++g) {
    const float* xg = x + int64_t(g) * G;
    float* u = scratch + int64_t(g) * G;
    double n2 = 0;
    if (lane == 0)
      for (int i = 0; i < G; ++i) n2 = d_add(n2, d_mul(double(xg[i]), double(xg[i])));
    n2 = __shfl_sync(kAll, n2, 0);
    const uint32_t sigma_h = f32_bf16(d_to_f(d_sqrt(d_div(n2, double(G)))));
    const float sigma = bf16_f32(sigma_h);
    const float inv = sigma > 0 ? f_div(1.0f, sigma) : 0.0f;
    for (int i = int(lane); i < G; i += 32) u[i] = f.signs ? f_mul(f.signs[i], xg[i]) : xg[i];
    __syncwarp();
    for (int h = 1; h < G; h *= 2) {  // fwht's butterflies, spread over the lanes
      for (int k = int(lane); k < G / 2; k += 32) {
        const int i = (k / h) * 2 * h + k % h;
        const float a = u[i], b = u[i + h];
        u[i] = f_add(a, b);
        u[i + h] = f_sub(a, b);
      }
      __syncwarp();
    }
    for (int i = int(lane); i < G; i += 32) u[i] = f_mul(f_mul(u[i], f.hadamard_scale), inv);
    __syncwarp();
    for (int p0 = 0; p0 < f.n_code; p0 += 32) {  // lane l searches sub-vector p0 + l; lane 0 packs in order
      const int p = p0 + int(lane);
      const uint32_t c = p < f.n_code ? uint32_t(nearest(f, u + p * d)) : 0u;
      for (int k = 0; k < 32 && p0 + k < f.n_code; ++k) {
        const uint32_t ck = __shfl_sync(kAll, c, k);
        if (lane == 0) codes.put(ck, f.code_bits);
      }
    }
    if (lane == 0) {
      codes.next_byte();
      meta.put(sigma_h, 16);
    }
    __syncwarp();  // u is the next group's only after every lane's search
  }
  if (lane == 0) {
    codes.finish();
    meta.finish();
  }
  __syncwarp();
}
#endif

}  // namespace kvtier
