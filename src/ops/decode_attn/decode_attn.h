// Decode attention: one query token per head over a list of KV rows, split
// over the tokens (split-K / flash-decoding); every split writes its
// normalized partial output and its log-sum-exp so that splits — and
// partial attentions over disjoint token sets (resident + gathered) — merge
// exactly (attn_merge).
//
// KV addressing: row r = (seq, kv head); slot i of row r holds K at
// k + r*row_stride + i*tok_stride and V likewise from v (bytes). Slots used:
// idx[r*idx_stride + j] for j < n_tok when idx is given (-1 = skip), else
// 0..n_tok-1. Elements are bf16 or FP8-E4M3 (unscaled).
#pragma once
#include <cstdint>

namespace kvtier {

enum class KvElt { bf16, fp8 };

struct DecodeAttnParams {
  int n_seq = 1;
  int n_head = 0;
  int n_kv_head = 0;
  int head_dim = 128;
  float scale = 0.f;
  KvElt elt = KvElt::bf16;
  int64_t row_stride = 0;  // bytes
  int64_t tok_stride = 0;  // bytes
  int64_t n_tok = 0;       // slots (or idx entries) per row
  int64_t idx_stride = 0;  // int32 entries between rows of idx
  int n_split = 1;         // partial results written: parts [part0, part0 + n_split)
  int part0 = 0;
};

// q:        [n_seq, n_head, head_dim] f32
// part_out: [n_part, n_seq, n_head, head_dim] f32 (normalized partial outputs)
// part_lse: [n_part, n_seq, n_head] f32 (-inf for an empty split, output 0)
// The reference writes a single part (n_split is ignored: part0 only).
void decode_attn_ref(const DecodeAttnParams& p, const float* q, const uint8_t* k, const uint8_t* v,
                     const int32_t* idx, float* part_out, float* part_lse);

// The CPU version (decode_attn_cpu.cpp; kernels per ISA, chosen by
// cpu_path()): q f32, K/V read in their stored precision. Writes parts
// [part0, part0 + n_split); split j covers entries [j·c, min(n_tok, (j+1)·c)),
// c = ceil(n_tok / n_split), as the CUDA kernel. The (row, split) jobs run on
// the default thread pool. head_dim: any multiple of 8 is vectorized, others
// take a scalar path.
void decode_attn_cpu(const DecodeAttnParams& p, const float* q, const uint8_t* k, const uint8_t* v,
                     const int32_t* idx, float* part_out, float* part_lse);

// Splits for decode_attn_cpu that give n_threads threads work over n_rows rows
// of n_tok entries, each split at least min_tokens long.
int decode_attn_cpu_splits(int64_t n_rows, int64_t n_tok, int n_threads, int64_t min_tokens = 256);

// Merges n_part partial results into out [n_seq*n_head, head_dim] f32 and,
// when not null, lse [n_seq*n_head].
void attn_merge_cpu(int n_part, int64_t n_qh, int head_dim, const float* part_out, const float* part_lse,
                    float* out, float* lse);
void attn_merge_ref(int n_part, int64_t n_qh, int head_dim, const float* part_out, const float* part_lse,
                    float* out, float* lse);

}  // namespace kvtier
