// Decode attention read straight from the quantized store: no slot cache, no
// decoded K|V written anywhere. Each selected token's HIGGS K and V records
// (a head's own entry; d = 2 grid, one byte per code, one Hadamard group per
// head) are attended in the rotated domain:
//   k = s ⊙ (c·H·σ_k·g_k)  ⇒  q·k = σ_k · (c·H·(s ⊙ q))·g_k
//   Σ pᵢ vᵢ = s ⊙ (c·H·Σ pᵢ σ_vᵢ g_vᵢ)
// (H the unnormalized Hadamard matrix, c = 1/√head_dim, s the ±1 signs, g the
// grid points of the codes, σ the record's scale), so a kernel rotates the
// query once, reads 2·head_dim/2 code bytes and two scales per token, and
// rotates its partial output back once.
//
// Addressing: sequence s's record of token t, KV head h, lies at
// host[s] + t·tok_bytes + h·entry_bytes: K, then V at fmt.bytes. Row r =
// s·n_kv_head + h reads the tokens sel[r·idx_stride + j] for j < n_tok_fixed
// (−1 = skip), split as decode_attn splits (same parts, same part0).
#pragma once
#include <cstdint>

#include "ops/decode_attn/decode_attn.h"
#include "ops/kv_append/kv_write.h"

namespace kvtier {

struct RecordAttnParams {
  DecodeAttnParams attn;    // n_seq .. scale, idx_stride, n_tok_fixed, n_tok_max,
                            // n_split, part0 (elt, strides unused)
  RecordFormat fmt;         // the store's record format (grid and signs on the kernel's device)
  int64_t entry_bytes = 0;  // a head's K|V entry
  int64_t tok_bytes = 0;    // a token's entries
  // Optional, [n_seq] (device): counters[s][0] += the tokens row s attended
  // (fetch.h's "selected" statistic). The reference leaves them.
  unsigned long long* const* counters = nullptr;
};

// Whether decode_attn_records takes this store: HIGGS with d = 2 and byte
// codes, one group per head, head_dim 64 or 128, GQA group ≤ 8, per-head
// entries holding K then V.
bool record_attn_supported(const RecordFormat& fmt, int head_dim, int n_head, int n_kv_head);

// decode_attn_records' splits per row (attn.n_split) for n_rows rows of up to
// n_tok tokens: on CUDA the most that keep its blocks within one wave
// (three blocks per SM; a second, partial wave would be the tail), at least
// 128 tokens a split; elsewhere decode_attn_splits'.
int record_attn_splits(const Exec& x, int64_t n_rows, int64_t n_tok);
constexpr int64_t kRecordSplitTokens = 128;

// q: [n_seq, n_head, head_dim] (CPU f32, CUDA bf16); host: [n_seq] store
// bases; sel: [rows, idx_stride] token ids; outputs as decode_attn's.
void decode_attn_records(const Exec& x, const RecordAttnParams& p, const void* q, const uint8_t* const* host,
                         const int32_t* sel, float* part_out, float* part_lse);
// The specification: every selected record decoded to f32 by the CPU
// quantizer, then decode_attn_ref (f64 accumulation).
void decode_attn_records_ref(const RecordAttnParams& p, const float* q, const uint8_t* const* host, const int32_t* sel,
                             float* part_out, float* part_lse);

namespace cuda {
int record_attn_splits(int64_t n_rows, int64_t n_tok);
void decode_attn_records(const Exec& x, const RecordAttnParams& p, const void* q_bf16, const uint8_t* const* host,
                         const int32_t* sel, float* part_out, float* part_lse);
}  // namespace cuda

}  // namespace kvtier
