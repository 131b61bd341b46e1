#include <algorithm>
#include <cstring>
#include <vector>

#include "core/status.h"
#include "ops/gather/gather.h"

namespace kvtier {

int64_t gather_ref(const GatherParams& p, const uint8_t* src, const int32_t* idx, const int32_t* prev_idx,
                   const uint8_t* prev_dst, uint8_t* dst) {
  KVT_CHECK(p.entry_bytes > 0 && p.entry_bytes % 16 == 0, "gather: entry_bytes {} must be a positive multiple of 16",
            p.entry_bytes);
  KVT_CHECK(p.dst_row_stride >= p.k * p.entry_bytes, "gather: dst_row_stride {} < k {} x entry_bytes {}",
            p.dst_row_stride, p.k, p.entry_bytes);
  int64_t misses = 0;
  for (int64_t r = 0; r < p.n_rows; ++r) {
    for (int i = 0; i < p.k; ++i) {
      const int32_t t = idx[r * p.k + i];
      if (t < 0) continue;
      uint8_t* d = dst + r * p.dst_row_stride + i * p.entry_bytes;
      const uint8_t* s = nullptr;
      if (p.k_prev > 0) {
        const int32_t* pr = prev_idx + r * p.k_prev;
        const int32_t* hit = std::find(pr, pr + p.k_prev, t);
        if (hit != pr + p.k_prev) s = prev_dst + r * p.dst_row_stride + (hit - pr) * p.entry_bytes;
      }
      if (!s) {
        s = src + r * p.src_row_stride + int64_t(t) * p.src_tok_stride;
        ++misses;
      }
      std::memcpy(d, s, size_t(p.entry_bytes));
    }
  }
  return misses;
}

int64_t gather_slots_ref(const GatherParams& p, const uint8_t* src, const int32_t* idx, const int32_t* prev_idx,
                         const int32_t* prev_slot, int32_t* slot_of, uint8_t* dst) {
  KVT_CHECK(p.entry_bytes > 0 && p.entry_bytes % 16 == 0, "gather_slots: entry_bytes {} must be a positive multiple of 16",
            p.entry_bytes);
  KVT_CHECK(p.k > 0 && p.k <= kSlotGatherMaxK, "gather_slots: k {} outside [1, {}]", p.k, kSlotGatherMaxK);
  KVT_CHECK(p.dst_row_stride >= p.k * p.entry_bytes, "gather_slots: dst_row_stride {} < k {} x entry_bytes {}",
            p.dst_row_stride, p.k, p.entry_bytes);
  int64_t misses = 0;
  for (int64_t r = 0; r < p.n_rows; ++r) {
    const int32_t* ir = idx + r * p.k;
    const int32_t* pi = prev_idx + r * p.k;
    const int32_t* ps = prev_slot + r * p.k;
    int32_t* so = slot_of + r * p.k;
    std::vector<char> used(size_t(p.k), 0);
    std::vector<int> miss;
    for (int j = 0; j < p.k; ++j) {
      so[j] = -1;
      if (ir[j] < 0) continue;
      const int32_t* hit = std::find(pi, pi + p.k, ir[j]);
      if (hit != pi + p.k) {
        so[j] = ps[hit - pi];
        used[size_t(so[j])] = 1;
      } else {
        miss.push_back(j);
      }
    }
    int free_slot = 0;
    for (int j : miss) {
      while (used[size_t(free_slot)]) ++free_slot;
      so[j] = free_slot++;
      std::memcpy(dst + r * p.dst_row_stride + int64_t(so[j]) * p.entry_bytes,
                  src + r * p.src_row_stride + int64_t(ir[j]) * p.src_tok_stride, size_t(p.entry_bytes));
      ++misses;
    }
  }
  return misses;
}

}  // namespace kvtier
