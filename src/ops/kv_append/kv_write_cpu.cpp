// kv_write on the CPU: the specification. Records come from the CPU
// quantizer (ops/quant quantize), so a CPU tiered cache holds exactly what
// the quantizer defines.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/half.h"
#include "core/status.h"
#include "ops/kv_append/kv_write.h"
#include "ops/quant/residual_quant.h"

namespace kvtier {
namespace {

void store_elt(KvElt e, uint8_t* dst, const float* x, int n) {
  if (e == KvElt::f32) {
    std::memcpy(dst, x, size_t(n) * 4);
    return;
  }
  KVT_CHECK(e == KvElt::bf16, "resident tokens: element type must be bf16 or f32");
  auto* d = reinterpret_cast<uint16_t*>(dst);
  for (int i = 0; i < n; ++i) d[i] = f32_to_bf16(x[i]);
}

void load_elt(KvElt e, const uint8_t* src, float* x, int n) {
  if (e == KvElt::f32) {
    std::memcpy(x, src, size_t(n) * 4);
    return;
  }
  const auto* s = reinterpret_cast<const uint16_t*>(src);
  for (int i = 0; i < n; ++i) x[i] = bf16_to_f32(s[i]);
}

QuantSpec with_scale(QuantSpec s, float scale) {
  s.tensor_scale = scale;
  return s;
}

}  // namespace

void resident_write_cpu(const ResidentWriteParams& p, const float* k, const float* v, const int64_t* pos0,
                        uint8_t* const* rows) {
  const int H = p.n_kv_head, D = p.head_dim;
  const int64_t slot = 2 * int64_t(D) * kv_elt_bytes(p.elt);
  for (int s = 0; s < p.n_seq; ++s)
    for (int i = 0; i < p.n_new; ++i) {
      const int64_t t = pos0[s] + i;
      int64_t at = -1;
      if (t < p.sink) at = t;
      else if (p.ring > 0 && i >= p.n_new - p.ring) at = p.sink + t % p.ring;
      if (at < 0) continue;
      const int64_t in = (int64_t(s) * p.n_new + i) * p.in_tok_stride;
      for (int h = 0; h < H; ++h) {
        uint8_t* dst = rows[size_t(s) * H + h] + at * slot;
        store_elt(p.elt, dst, k + in + int64_t(h) * D, D);
        store_elt(p.elt, dst + slot / 2, v + in + int64_t(h) * D, D);
      }
    }
}

void host_write_cpu(const HostWriteParams& p, const float* k, const float* k_pre, const float* v, const int64_t* pos0,
                    uint8_t* const* host, uint8_t* const* kplane, const int64_t* key_first) {
  const int H = p.n_kv_head, D = p.head_dim;
  const int dim = p.fmt.dim;
  KVT_CHECK(dim == (p.layer_wide ? H * D : D), "host_write: record dim {} for {} heads of {}", dim, H, D);
  KVT_CHECK(!p.keys_prerope || k_pre, "host_write: keys_prerope needs the pre-RoPE keys");
  const int64_t rec = p.fmt.bytes;
  const float* kin = p.keys_prerope ? k_pre : k;
  const int n_rec = p.layer_wide ? 1 : H;
  for (int s = 0; s < p.n_seq; ++s)
    for (int i = 0; i < p.n_new; ++i) {
      const QuantSpec ks = with_scale(p.fmt.spec, p.seq_scales ? p.seq_scales[2 * s] : p.k_scale);
      const QuantSpec vs = with_scale(p.fmt.spec, p.seq_scales ? p.seq_scales[2 * s + 1] : p.v_scale);
      const int64_t t = pos0[s] + i;
      const int64_t in = (int64_t(s) * p.n_new + i) * p.in_tok_stride;
      uint8_t* tok = host[s] + t * p.tok_bytes;
      for (int h = 0; h < n_rec; ++h) {
        uint8_t* e = tok + int64_t(h) * p.entry_bytes;
        const int64_t off = in + int64_t(h) * dim;
        if (p.values_only) {
          quantize(vs, v + off, 1, dim, e);
          if (key_first && key_first[s] >= 0 && t >= key_first[s])
            quantize(ks, kin + off, 1, dim, kplane[s] + (t - key_first[s]) * p.tok_bytes + int64_t(h) * p.entry_bytes);
        } else {
          quantize(ks, kin + off, 1, dim, e);
          quantize(vs, v + off, 1, dim, e + rec);
        }
      }
    }
}

void index_write_cpu(const IndexWriteParams& p, const float* k, const int64_t* pos0, uint8_t* const* plane0,
                     uint8_t* const* plane1, uint8_t* const* resident, float* const* stats) {
  const int H = p.n_kv_head, D = p.head_dim, c = p.chunk;
  KVT_CHECK(p.layout != IndexRecLayout::planar_higgs2, "index_write: the planar index is the GPU's layout");
  KVT_CHECK(p.unit % c == 0 && p.ring >= p.unit - 1, "index_write: unit {} chunk {} ring {} inconsistent", p.unit, c,
            p.ring);
  const int m = p.unit / c;
  const int64_t res_slot = 2 * int64_t(D) * kv_elt_bytes(p.res_elt);
  std::vector<float> keys(size_t(p.unit) * D), lm(size_t(m) * D);  // [unit, D], [m, D]
  std::vector<uint8_t> meta_code(size_t(p.meta.bytes)), res_code(size_t(m) * size_t(p.fmt.bytes));
  ResidualSpec rs;
  if (p.layout == IndexRecLayout::residual) {
    rs.meta = p.meta.spec;
    rs.resid = p.fmt.spec;
    rs.group = m;
  }
  for (int s = 0; s < p.n_seq; ++s) {
    const int64_t n0 = pos0[s], n1 = pos0[s] + p.n_new;
    for (int64_t u = n0 / p.unit; u < n1 / p.unit; ++u)
      for (int h = 0; h < H; ++h) {
        const size_t row = size_t(s) * H + h;
        for (int j = 0; j < p.unit; ++j) {  // the unit's keys: new ones from k, older ones from the ring
          const int64_t t = u * p.unit + j;
          float* dst = keys.data() + size_t(j) * D;
          if (t >= n0) std::copy_n(k + ((int64_t(s) * p.n_new + (t - n0)) * p.in_tok_stride + int64_t(h) * D), D, dst);
          else load_elt(p.res_elt, resident[row] + (p.sink + t % p.ring) * res_slot, dst, D);
        }
        for (int q = 0; q < m; ++q) {  // chunk means, summed in token order then divided
          float* mean = lm.data() + size_t(q) * D;
          std::fill(mean, mean + D, 0.0f);
          for (int t = 0; t < c; ++t)
            for (int d = 0; d < D; ++d) mean[d] += keys[size_t(q * c + t) * D + d];
          for (int d = 0; d < D; ++d) mean[d] /= float(c);
          if (p.cos_stats && stats) {
            double mn = 0;
            for (int d = 0; d < D; ++d) mn += double(mean[d]) * mean[d];
            float worst = 2.0f;
            for (int t = 0; t < c; ++t) {
              const float* kt = keys.data() + size_t(q * c + t) * D;
              double dot = 0, kn = 0;
              for (int d = 0; d < D; ++d) dot += double(kt[d]) * mean[d], kn += double(kt[d]) * kt[d];
              const double den = std::sqrt(mn * kn);
              worst = std::min(worst, den > 0 ? float(dot / den) : 1.0f);
            }
            stats[row][u * m + q] = worst;
          }
        }
        if (p.layout == IndexRecLayout::records) {
          quantize(p.seq_scales ? with_scale(p.fmt.spec, p.seq_scales[s]) : p.fmt.spec, lm.data(), m, D,
                   plane0[row] + u * m * p.fmt.bytes);
        } else {
          quantize_residual(rs, lm.data(), m, D, meta_code.data(), res_code.data());
          std::memcpy(plane1[row] + u * p.meta.bytes, meta_code.data(), meta_code.size());
          std::memcpy(plane0[row] + u * m * p.fmt.bytes, res_code.data(), res_code.size());
        }
      }
  }
}

}  // namespace kvtier
