// Attention over f32 keys/values held by the KV store.
//
// attention_causal: dense causal attention (prefill and the `full` policy).
// attention_gathered: one query token per head over a per-KV-head subset of
//   tokens that the caller has gathered into contiguous rows (sparse decode);
//   it also returns the log-sum-exp of the scores so that partial results over
//   disjoint token sets can be merged exactly (merge_attention).
// The _ref versions (attention_ref.cpp, f64 accumulation) are the specification.
#pragma once
#include <cstdint>

namespace kvtier {

struct AttentionParams {
  int n_head = 0;     // query heads
  int n_kv_head = 0;  // GQA: query head h uses kv head h / (n_head / n_kv_head)
  int head_dim = 0;
  float scale = 1.0f;  // usually 1/sqrt(head_dim)
};

// q:   [n_q, n_head, head_dim]
// k,v: [n_kv, n_kv_head, head_dim]  (token-major, contiguous)
// out: [n_q, n_head, head_dim]
// Query i sits at position n_kv - n_q + i and sees keys [0, n_kv - n_q + i].
void attention_causal(const AttentionParams& p, const float* q, int n_q, const float* k,
                      const float* v, int64_t n_kv, float* out);
void attention_causal_ref(const AttentionParams& p, const float* q, int n_q, const float* k,
                          const float* v, int64_t n_kv, float* out);

// q:      [n_head, head_dim]            one query token
// k,v:    [indptr[n_kv_head], head_dim] rows of kv head g are [indptr[g], indptr[g+1])
// indptr: [n_kv_head + 1]               64-bit offsets (STYLE rule 5)
// out:    [n_head, head_dim]
// lse:    [n_head] natural-log sum of exp(scale * q.k) over the head's rows, or
//         -inf when the head has no rows (then out is 0). May be null.
void attention_gathered(const AttentionParams& p, const float* q, const float* k,
                        const float* v, const int64_t* indptr, float* out, float* lse);
void attention_gathered_ref(const AttentionParams& p, const float* q, const float* k,
                            const float* v, const int64_t* indptr, float* out, float* lse);

// Merges two partial attentions over disjoint token sets, in place into (out_a, lse_a).
// out_*: [n_head, head_dim], lse_*: [n_head]
void merge_attention(int n_head, int head_dim, float* out_a, float* lse_a, const float* out_b,
                     const float* lse_b);

}  // namespace kvtier
