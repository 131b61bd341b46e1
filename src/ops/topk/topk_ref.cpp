#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/status.h"
#include "ops/topk/topk.h"

namespace kvtier {

uint32_t topk_order_key(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

void topk_ref(const float* scores, int64_t n_rows, int64_t n, int k, int64_t tok_offset, int32_t* out) {
  KVT_CHECK(k > 0 && n >= 0, "topk: k {} must be positive, n {} non-negative", k, n);
  const int64_t kk = std::min<int64_t>(k, n);
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* s = scores + r * n;
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return topk_order_key(s[a]) > topk_order_key(s[b]);
    });
    std::sort(order.begin(), order.begin() + kk);
    for (int64_t i = 0; i < kk; ++i) out[r * kk + i] = int32_t(tok_offset + order[size_t(i)]);
  }
}

}  // namespace kvtier
