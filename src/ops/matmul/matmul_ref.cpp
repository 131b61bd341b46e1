#include <cmath>
#include <vector>

#include "core/half.h"
#include "core/status.h"
#include "ops/dequant/dequant.h"
#include "ops/matmul/matmul.h"

namespace kvtier {

void matmul_ref(const WeightView& w, const float* x, int64_t n_tok, float* y) {
  std::vector<float> row(static_cast<size_t>(w.n_in));  // [n_in] f32
  for (int64_t r = 0; r < w.n_out; ++r) {
    dequantize_row(w.type, w.row(r), row.data(), w.n_in);
    for (int64_t t = 0; t < n_tok; ++t) {
      double acc = 0;
      for (int64_t i = 0; i < w.n_in; ++i) acc += double(row[i]) * double(x[t * w.n_in + i]);
      y[t * w.n_out + r] = float(acc);
    }
  }
}

void matmul_q8_ref(const WeightView& w, const float* x, int64_t n_tok, float* y) {
  KVT_CHECK(w.type == GgmlType::Q4_0 || w.type == GgmlType::Q4_1 || w.type == GgmlType::Q8_0,
            "matmul_q8_ref: weight type {} has no quantized-activation path",
            ggml_type_name(w.type));
  const int64_t n_blk = w.n_in / kQK;
  for (int64_t t = 0; t < n_tok; ++t) {
    const float* xt = x + t * w.n_in;
    // Quantize activations: d = amax / 127, q = round(x / d); d is stored as f16.
    std::vector<int8_t> xq(static_cast<size_t>(w.n_in));
    std::vector<float> xd(static_cast<size_t>(n_blk)), xs(static_cast<size_t>(n_blk));
    for (int64_t b = 0; b < n_blk; ++b) {
      float amax = 0;
      for (int i = 0; i < kQK; ++i) amax = std::max(amax, std::fabs(xt[b * kQK + i]));
      float d = amax / 127.0f;
      float id = d != 0 ? 1.0f / d : 0.0f;
      int sum = 0;
      for (int i = 0; i < kQK; ++i) {
        int q = int(std::nearbyint(xt[b * kQK + i] * id));
        xq[b * kQK + i] = int8_t(q);
        sum += q;
      }
      xd[b] = f16_to_f32(f32_to_f16(d));
      xs[b] = f16_to_f32(f32_to_f16(d * float(sum)));
    }
    for (int64_t r = 0; r < w.n_out; ++r) {
      double acc = 0;
      for (int64_t b = 0; b < n_blk; ++b) {
        const int8_t* q8 = &xq[b * kQK];
        int dot = 0;
        if (w.type == GgmlType::Q8_0) {
          auto* blk = reinterpret_cast<const BlockQ8_0*>(w.row(r)) + b;
          for (int i = 0; i < kQK; ++i) dot += int(blk->qs[i]) * q8[i];
          acc += double(f16_to_f32(blk->d)) * xd[b] * dot;
        } else if (w.type == GgmlType::Q4_0) {
          auto* blk = reinterpret_cast<const BlockQ4_0*>(w.row(r)) + b;
          for (int i = 0; i < kQK / 2; ++i) {
            dot += (int(blk->qs[i] & 0xf) - 8) * q8[i];
            dot += (int(blk->qs[i] >> 4) - 8) * q8[i + kQK / 2];
          }
          acc += double(f16_to_f32(blk->d)) * xd[b] * dot;
        } else {
          auto* blk = reinterpret_cast<const BlockQ4_1*>(w.row(r)) + b;
          for (int i = 0; i < kQK / 2; ++i) {
            dot += int(blk->qs[i] & 0xf) * q8[i];
            dot += int(blk->qs[i] >> 4) * q8[i + kQK / 2];
          }
          acc += double(f16_to_f32(blk->d)) * xd[b] * dot + double(f16_to_f32(blk->m)) * xs[b];
        }
      }
      y[t * w.n_out + r] = float(acc);
    }
  }
}

}  // namespace kvtier
