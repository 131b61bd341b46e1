// decode_attn and attn_merge on the CPU: f32 accumulation, online softmax
// per (row, split), the splits spread over the thread pool.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/half.h"
#include "core/status.h"
#include "core/threads.h"
#include "ops/decode_attn/decode_attn.h"
#include "ops/quant/quant_scalar.h"

namespace kvtier {

void decode_attn_cpu(const DecodeAttnParams& p, const float* q, const uint8_t* const* rows, const int32_t* idx,
                     float* part_out, float* part_lse);
void attn_merge_cpu(int n_part, int64_t n_qh, int head_dim, const float* part_out, const float* part_lse, float* out,
                    float* lse);

namespace {

// One slot's K or V row as f32.
inline void load_row(KvElt e, const uint8_t* src, float* dst, int n) {
  if (e == KvElt::f32) {
    std::memcpy(dst, src, size_t(n) * 4);
  } else if (e == KvElt::bf16) {
    const auto* s = reinterpret_cast<const uint16_t*>(src);
    for (int i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
  } else {
    for (int i = 0; i < n; ++i) dst[i] = e4m3_to_f32(src[i]);
  }
}

}  // namespace

void decode_attn_cpu(const DecodeAttnParams& p, const float* q, const uint8_t* const* rows, const int32_t* idx,
                     float* part_out, float* part_lse) {
  KVT_CHECK(p.n_kv_head > 0 && p.n_head % p.n_kv_head == 0 && p.n_split >= 1,
            "decode_attn: n_head {} n_kv_head {} n_split {}", p.n_head, p.n_kv_head, p.n_split);
  const int G = p.n_head / p.n_kv_head, D = p.head_dim;
  const int64_t n_rows = int64_t(p.n_seq) * p.n_kv_head, n_qh = int64_t(p.n_seq) * p.n_head;
  default_pool().parallel_for(n_rows * p.n_split, 1, [&](int64_t w0, int64_t w1, int) {
    std::vector<float> kr(static_cast<size_t>(D)), vr(static_cast<size_t>(D)), acc(size_t(G) * D);
    std::vector<float> m(static_cast<size_t>(G)), l(static_cast<size_t>(G));
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t r = w / p.n_split;
      const int b = int(w % p.n_split);
      const int64_t seq = r / p.n_kv_head, kvh = r % p.n_kv_head;
      const int64_t n = p.n_tok ? p.n_tok[seq * p.n_tok_stride] : p.n_tok_fixed;
      const int64_t chunk = (n + p.n_split - 1) / p.n_split;
      const int64_t j0 = int64_t(b) * chunk, j1 = std::min(n, j0 + chunk);
      const float* qg = q + (seq * p.n_head + kvh * G) * D;
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(m.begin(), m.end(), -INFINITY);
      std::fill(l.begin(), l.end(), 0.f);
      for (int64_t j = j0; j < j1; ++j) {
        const int64_t slot = idx ? idx[r * p.idx_stride + j] : j;
        if (slot < 0) continue;
        load_row(p.elt, rows[r] + slot * p.tok_stride, kr.data(), D);
        load_row(p.elt, rows[r] + p.v_offset + slot * p.tok_stride, vr.data(), D);
        for (int g = 0; g < G; ++g) {
          const float* qh = qg + int64_t(g) * D;
          float sc = 0.f;
          for (int d = 0; d < D; ++d) sc += qh[d] * kr[size_t(d)];
          sc *= p.scale;
          float* a = acc.data() + size_t(g) * D;
          if (sc > m[size_t(g)]) {
            const float c = std::exp(m[size_t(g)] - sc);  // 0 on the first slot
            for (int d = 0; d < D; ++d) a[d] *= c;
            l[size_t(g)] *= c;
            m[size_t(g)] = sc;
          }
          const float e = std::exp(sc - m[size_t(g)]);
          l[size_t(g)] += e;
          for (int d = 0; d < D; ++d) a[d] += e * vr[size_t(d)];
        }
      }
      for (int g = 0; g < G; ++g) {
        const int64_t qh = seq * p.n_head + kvh * G + g;
        float* o = part_out + ((p.part0 + b) * n_qh + qh) * D;
        const float li = l[size_t(g)];
        for (int d = 0; d < D; ++d) o[d] = li > 0 ? acc[size_t(g) * D + d] / li : 0.f;
        part_lse[(p.part0 + b) * n_qh + qh] = li > 0 ? m[size_t(g)] + std::log(li) : -INFINITY;
      }
    }
  });
}

void attn_merge_cpu(int n_part, int64_t n_qh, int head_dim, const float* part_out, const float* part_lse, float* out,
                    float* lse) {
  for (int64_t i = 0; i < n_qh; ++i) {
    float m = -INFINITY;
    for (int j = 0; j < n_part; ++j) m = std::max(m, part_lse[j * n_qh + i]);
    float* o = out + i * head_dim;
    std::fill(o, o + head_dim, 0.f);
    float sum = 0;
    if (m > -INFINITY)
      for (int j = 0; j < n_part; ++j) {
        const float w = std::exp(part_lse[j * n_qh + i] - m);
        if (w == 0.f) continue;
        sum += w;
        const float* po = part_out + (j * n_qh + i) * head_dim;
        for (int c = 0; c < head_dim; ++c) o[c] += w * po[c];
      }
    for (int c = 0; c < head_dim && sum > 0; ++c) o[c] /= sum;
    if (lse) lse[i] = sum > 0 ? m + std::log(sum) : -INFINITY;
  }
}

}  // namespace kvtier
