#include <cmath>
#include <vector>

#include "core/half.h"
#include "core/status.h"
#include "ops/lowrank_k/lowrank_k.h"

namespace kvtier {

void lowrank_k_ref(const LowrankKParams& p, const uint16_t* a, const uint16_t* b, const int32_t* idx,
                   const float* inv_freq, float* out) {
  const int64_t width = int64_t(p.n_kv_head) * p.head_dim;  // one token's K_pre across the layer's KV heads
  KVT_CHECK(p.n_seq >= 0 && p.n_kv_head > 0 && p.head_dim > 0 && p.head_dim % 2 == 0,
            "lowrank_k: n_seq {} n_kv_head {} head_dim {} invalid (head_dim must be even)", p.n_seq, p.n_kv_head,
            p.head_dim);
  KVT_CHECK(p.rank >= 1 && p.k >= 0, "lowrank_k: rank {} must be >= 1 and k {} >= 0", p.rank, p.k);
  KVT_CHECK(p.a_seq_stride >= p.n_ctx * p.rank, "lowrank_k: a_seq_stride {} < n_ctx {} x rank {}", p.a_seq_stride,
            p.n_ctx, p.rank);
  KVT_CHECK(p.b_seq_stride >= p.rank * width, "lowrank_k: b_seq_stride {} < rank {} x {} KV dims", p.b_seq_stride,
            p.rank, width);
  KVT_CHECK(p.out_row_stride >= int64_t(p.k) * p.head_dim, "lowrank_k: out_row_stride {} < k {} x head_dim {}",
            p.out_row_stride, p.k, p.head_dim);
  const int half = p.head_dim / 2;
  std::vector<double> key(size_t(p.head_dim));
  for (int64_t r = 0; r < int64_t(p.n_seq) * p.n_kv_head; ++r) {
    const int64_t seq = r / p.n_kv_head, g = r % p.n_kv_head;
    const uint16_t* bg = b + seq * p.b_seq_stride + g * p.head_dim;  // B[seq][:, head g], row stride `width`
    for (int i = 0; i < p.k; ++i) {
      const int32_t t = idx[r * p.k + i];
      if (t < 0) continue;
      KVT_CHECK(t < p.n_ctx, "lowrank_k: idx[{}][{}] = {} outside the {} tokens of A", r, i, t, p.n_ctx);
      const uint16_t* at = a + seq * p.a_seq_stride + int64_t(t) * p.rank;
      for (int d = 0; d < p.head_dim; ++d) {
        double s = 0;
        for (int j = 0; j < p.rank; ++j) s += double(bf16_to_f32(at[j])) * double(bf16_to_f32(bg[j * width + d]));
        key[size_t(d)] = s;
      }
      if (inv_freq) {
        for (int j = 0; j < half; ++j) {
          const double ang = double(t) * double(inv_freq[j]);
          const double c = std::cos(ang), sn = std::sin(ang);
          const int i0 = p.interleaved ? 2 * j : j, i1 = p.interleaved ? 2 * j + 1 : j + half;
          const double x0 = key[size_t(i0)], x1 = key[size_t(i1)];
          key[size_t(i0)] = x0 * c - x1 * sn;
          key[size_t(i1)] = x0 * sn + x1 * c;
        }
      }
      float* o = out + r * p.out_row_stride + int64_t(i) * p.head_dim;
      for (int d = 0; d < p.head_dim; ++d) o[d] = float(key[size_t(d)]);
    }
  }
}

}  // namespace kvtier
