// The specification of decode_attn and attn_merge (decode_attn.h): f64
// accumulation, the slot list split as the kernels split it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/half.h"
#include "core/status.h"
#include "ops/decode_attn/decode_attn.h"
#include "ops/quant/quant_scalar.h"

namespace kvtier {
namespace {
float load_elt(KvElt e, const uint8_t* p, int d) {
  if (e == KvElt::fp8) return e4m3_to_f32(p[d]);
  if (e == KvElt::f32) {
    float f;
    std::memcpy(&f, p + 4 * d, 4);
    return f;
  }
  uint16_t b;
  std::memcpy(&b, p + 2 * d, 2);
  return bf16_to_f32(b);
}
}  // namespace

void decode_attn_ref(const DecodeAttnParams& p, const float* q, const uint8_t* const* rows, const int32_t* idx,
                     float* part_out, float* part_lse) {
  KVT_CHECK(p.n_kv_head > 0 && p.n_head % p.n_kv_head == 0, "decode_attn: n_head {} vs n_kv_head {}", p.n_head,
            p.n_kv_head);
  KVT_CHECK(p.n_split >= 1, "decode_attn: n_split {} < 1", p.n_split);
  const int group = p.n_head / p.n_kv_head;
  const int64_t n_qh = int64_t(p.n_seq) * p.n_head;
  std::vector<double> acc(size_t(p.head_dim));
  std::vector<double> s;
  std::vector<int64_t> slots;
  for (int seq = 0; seq < p.n_seq; ++seq) {
    const int64_t n = p.n_tok ? p.n_tok[int64_t(seq) * p.n_tok_stride] : p.n_tok_fixed;
    const int64_t chunk = (n + p.n_split - 1) / p.n_split;
    for (int h = 0; h < p.n_head; ++h) {
      const int64_t r = int64_t(seq) * p.n_kv_head + h / group;
      const float* qv = q + (int64_t(seq) * p.n_head + h) * p.head_dim;
      for (int b = 0; b < p.n_split; ++b) {
        const int64_t j0 = int64_t(b) * chunk, j1 = std::min(n, j0 + chunk);
        s.clear();
        slots.clear();
        for (int64_t j = j0; j < j1; ++j) {
          const int64_t slot = idx ? idx[r * p.idx_stride + j] : j;
          if (slot < 0) continue;
          const uint8_t* kr = rows[r] + slot * p.tok_stride;
          double d = 0;
          for (int c = 0; c < p.head_dim; ++c) d += double(qv[c]) * load_elt(p.elt, kr, c);
          s.push_back(d * p.scale);
          slots.push_back(slot);
        }
        const int64_t part = p.part0 + b;
        float* o = part_out + (part * n_qh + int64_t(seq) * p.n_head + h) * p.head_dim;
        float* l = part_lse + part * n_qh + int64_t(seq) * p.n_head + h;
        if (s.empty()) {
          std::fill(o, o + p.head_dim, 0.f);
          *l = -INFINITY;
          continue;
        }
        double m = -INFINITY;
        for (double x : s) m = std::max(m, x);
        double sum = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (size_t j = 0; j < s.size(); ++j) {
          const double w = std::exp(s[j] - m);
          sum += w;
          const uint8_t* vr = rows[r] + p.v_offset + slots[j] * p.tok_stride;
          for (int c = 0; c < p.head_dim; ++c) acc[size_t(c)] += w * load_elt(p.elt, vr, c);
        }
        for (int c = 0; c < p.head_dim; ++c) o[c] = float(acc[size_t(c)] / sum);
        *l = float(m + std::log(sum));
      }
    }
  }
}

void attn_merge_ref(int n_part, int64_t n_qh, int head_dim, const float* part_out, const float* part_lse,
                    float* out, float* lse) {
  for (int64_t i = 0; i < n_qh; ++i) {
    double m = -INFINITY;
    for (int j = 0; j < n_part; ++j) m = std::max(m, double(part_lse[j * n_qh + i]));
    double sum = 0;
    std::vector<double> acc(size_t(head_dim), 0.0);
    if (m > -INFINITY) {
      for (int j = 0; j < n_part; ++j) {
        const double w = std::exp(double(part_lse[j * n_qh + i]) - m);
        sum += w;
        for (int c = 0; c < head_dim; ++c) acc[size_t(c)] += w * part_out[(j * n_qh + i) * head_dim + c];
      }
    }
    for (int c = 0; c < head_dim; ++c) out[i * head_dim + c] = sum > 0 ? float(acc[size_t(c)] / sum) : 0.f;
    if (lse) lse[i] = sum > 0 ? float(m + std::log(sum)) : -INFINITY;
  }
}

}  // namespace kvtier
