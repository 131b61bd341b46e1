// Gathering the selected tokens' K/V rows from the host store into a GPU
// buffer, optionally reusing the rows the previous step already brought over.
//
// Source layout (host store of the offload path): row r = (seq, kv head) at
// src + r * src_row_stride; token t's entry at + t * src_tok_stride; entry_bytes
// are copied per token (K|V interleaved: 2·head_dim·elt, so a token costs one
// contiguous read). Destination: dst[r][i] at dst + r * dst_row_stride +
// i * entry_bytes for the i-th selected token of row r.
// Reuse: prev_idx [n_rows, k_prev] ascending (the previous step's selection,
// -1 = empty slot) and prev_dst holding its rows (dst layout, same strides);
// an entry found there is copied on the device and not read from the host.
#pragma once
#include <cstdint>

namespace kvtier {

struct GatherParams {
  int64_t n_rows = 0;
  int k = 0;                    // selected tokens per row (idx is [n_rows, k])
  int64_t entry_bytes = 0;      // multiple of 16
  int64_t src_row_stride = 0;   // bytes
  int64_t src_tok_stride = 0;   // bytes
  int64_t dst_row_stride = 0;   // bytes (>= k * entry_bytes)
  int k_prev = 0;               // 0 = no reuse
};

// idx: [n_rows, k] int32 ascending within each row (-1 entries are skipped)
// Returns the number of entries read from the source (the misses).
int64_t gather_ref(const GatherParams& p, const uint8_t* src, const int32_t* idx, const int32_t* prev_idx,
                   const uint8_t* prev_dst, uint8_t* dst);

// Gathering into a slot cache: each row owns k slots of entry_bytes on the
// GPU that persist across steps. A token selected again keeps its slot (no
// copy at all); a newly selected token is read from the source into a slot
// freed by a token no longer selected. Assignment (deterministic): hits keep
// their slot; misses, in ascending token order, take the free slots in
// ascending slot order.
// State per row: prev_idx (the last call's idx, ascending, -1 = empty) and
// prev_slot (the last call's slot_of); both -1 before the first call.
// Output: slot_of[r][j] = the slot holding idx[r][j] (-1 where idx is -1), so
// that attention reads dst through slot_of. Needs k ≤ kSlotGatherMaxK.
constexpr int kSlotGatherMaxK = 32768;

// idx, prev_idx, prev_slot, slot_of: [n_rows, k] int32; dst: the slot
// buffer (dst_row_stride bytes per row). Returns the misses (entries read from src).
int64_t gather_slots_ref(const GatherParams& p, const uint8_t* src, const int32_t* idx, const int32_t* prev_idx,
                         const int32_t* prev_slot, int32_t* slot_of, uint8_t* dst);

}  // namespace kvtier
