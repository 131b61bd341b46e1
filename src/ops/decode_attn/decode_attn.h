// Decode attention: one query token per head over a list of KV slots per
// row (row r = sequence s · n_kv_head + KV head), split over the slots
// (split-K / flash-decoding). Every split writes its normalized partial
// output and its log-sum-exp, so that splits — and partial attentions over
// disjoint token sets (resident + fetched) — merge exactly (attn_merge).
//
// Slot addressing: row r's slot i holds K at rows[r] + i·tok_stride and V at
// rows[r] + v_offset + i·tok_stride (bytes; v_offset may be negative). The
// slots a row reads: idx[r·idx_stride + j] for j < n_tok(s) when idx is given
// (−1 = skip), else 0..n_tok(s)−1, where n_tok(s) = n_tok[s·n_tok_stride] or
// n_tok_fixed when n_tok is null. Rows of different lengths share a launch.
// Elements: bf16, FP8-E4M3 (unscaled), or f32 (CPU only).
#pragma once
#include <cstdint>

#include "backend/device.h"

namespace kvtier {

enum class KvElt { bf16, fp8, f32 };
inline int kv_elt_bytes(KvElt e) { return e == KvElt::fp8 ? 1 : e == KvElt::bf16 ? 2 : 4; }

struct DecodeAttnParams {
  int n_seq = 1;
  int n_head = 0;
  int n_kv_head = 0;
  int head_dim = 128;
  float scale = 0.f;
  KvElt elt = KvElt::bf16;
  int64_t tok_stride = 0;   // bytes between slots of a row
  int64_t v_offset = 0;     // bytes from a slot's K to its V
  int64_t idx_stride = 0;   // int32 entries between rows of idx
  const int64_t* n_tok = nullptr;  // per sequence, n_tok_stride int64 apart (device memory on CUDA)
  int n_tok_stride = 1;
  int64_t n_tok_fixed = 0;  // when n_tok is null
  int64_t n_tok_max = 0;    // an upper bound of n_tok(s) (sizes the splits)
  int n_split = 1;          // partial results written: parts [part0, part0 + n_split)
  int part0 = 0;
};

// q:        [n_seq, n_head, head_dim] (CPU f32, CUDA bf16)
// rows:     [n_seq · n_kv_head] slot bases
// part_out: [n_part, n_seq, n_head, head_dim] f32 (normalized partial outputs)
// part_lse: [n_part, n_seq, n_head] f32 (−inf for an empty split, output 0)
void decode_attn(const Exec& x, const DecodeAttnParams& p, const void* q, const uint8_t* const* rows,
                 const int32_t* idx, float* part_out, float* part_lse);
// The specification (f64 accumulation; writes all n_split parts, splitting
// the slot list as the CUDA kernel does).
void decode_attn_ref(const DecodeAttnParams& p, const float* q, const uint8_t* const* rows, const int32_t* idx,
                     float* part_out, float* part_lse);
// Splits that fill the device for n_rows rows of up to n_tok slots, each
// split at least min_tokens long (the CPU: its threads).
int decode_attn_splits(const Exec& x, int64_t n_rows, int64_t n_tok, int64_t min_tokens = 256);

// Merges n_part partial results into out [n_qh, head_dim] (CPU f32, CUDA
// bf16 unless out_f32 is set) and, when not null, lse [n_qh] f32.
void attn_merge(const Exec& x, int n_part, int64_t n_qh, int head_dim, const float* part_out, const float* part_lse,
                void* out, bool out_f32, float* lse);
void attn_merge_ref(int n_part, int64_t n_qh, int head_dim, const float* part_out, const float* part_lse,
                    float* out, float* lse);

}  // namespace kvtier
