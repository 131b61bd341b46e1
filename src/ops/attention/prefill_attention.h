// Causal prefill attention on either device (the dispatcher over
// attention_causal on the CPU and flash_prefill on CUDA): query i of n_q sits
// at position n_kv − n_q + i and sees keys [0, n_kv − n_q + i].
#pragma once
#include <cstdint>

#include "backend/device.h"
#include "ops/attention/attention.h"

namespace kvtier {

// q: [n_q, q_stride] (head h at + h·head_dim), k/v: [n_kv, kv_stride],
// out: [n_q, out_stride]; CPU f32 (q_stride, kv_stride and out_stride must be
// the dense widths), CUDA bf16.
void prefill_attention(const Exec& x, const AttentionParams& p, const void* q, int64_t q_stride, int64_t n_q,
                       const void* k, const void* v, int64_t kv_stride, int64_t n_kv, void* out, int64_t out_stride);

}  // namespace kvtier
