// DevFormat: one record format of quant_format.h resolved for the device
// (make_dev_format, on the host), and the shared memory dev_stage_grid needs.
// Part of quant_dev.cuh (include that).
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
  const uint32_t* cells = nullptr;    // higgs with d = 2, optional: the search's bucket table (higgs_cells.h);
                                      // null: every point is scored
  float uniform_half_step = 0.f;      // higgs U<n> (QuantSpec::uniform_levels): h, scored in integers; else 0
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
    f.cells = s.grid_dim == 2 ? r.cells : nullptr;
    f.hadamard_scale = 1.0f / std::sqrt(float(f.group));
    if (s.uniform_levels) f.uniform_half_step = higgs_uniform_half_step(s.grid_size);
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

}  // namespace kvtier
