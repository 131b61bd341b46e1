// The K and V of one KV head out of HIGGS host entries (kv_append.h's
// record_append: a token's K and V records over the layer's KV width, or,
// with group 128, the head's own group), as bf16 for decode attention. Used
// on a slot cache (gather.h): row r = KV head r of a sequence, slot s of row
// r holds an entry at
// src + r·src_row_stride + s·entry_bytes; for every slot listed in
// idx[r·k + j] (−1: none) the head's K then V (head_dim bf16 each) go to
// dst + r·dst_row_stride + s·4·head_dim bytes.
// Only the head's slice is rebuilt: with Sylvester order, H_G = H_{G/128} ⊗
// H_128, so head a of a Hadamard group is H_128 (Σ_b ±y_b) / √G over the
// group's 128-value blocks y_b = σ·grid[codes].
#pragma once
#include <cstdint>
#include <string>

#include "ops/kv_append/kv_append.h"

namespace kvtier {

struct RecordDequantParams {
  int n_rows = 0;
  int n_kv_head = 0;          // row r is KV head r % n_kv_head
  int k = 0;                  // idx entries per row
  int64_t src_row_stride = 0;  // bytes
  int64_t dst_row_stride = 0;  // bytes
};

// dst: bf16 bits (RNE of the CPU quantizer's f32 dequantization).
void record_dequant_ref(const std::string& spec, const HiggsRecordLayout& L, const RecordDequantParams& p,
                        const uint8_t* src, const int32_t* idx, uint8_t* dst);

}  // namespace kvtier
