// The formats other than HIGGS decoded value by value (f32, bf16, fp8, fp8s,
// nvfp4, uniform, 1bit), into a sink that stores each value or accumulates a
// dot product. Part of quant_dev.cuh (include that).
#pragma once
#include <cstdint>

#include "ops/quant/quant_dev_format.cuh"
#include "ops/quant/quant_dev_scalar.cuh"

namespace kvtier::qdev {

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

}  // namespace kvtier::qdev
