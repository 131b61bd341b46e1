// Causal GQA prefill attention on the GPU, flash style: bf16 Q/K/V in, f32
// accumulation (tensor cores through WMMA, online softmax), bf16 out. The
// specification is attention_causal_ref (ops/attention/attention.h): query i
// sits at position n_kv - n_q + i and sees keys [0, n_kv - n_q + i].
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvtier::cuda {

struct FlashPrefillParams {
  int n_head = 0;
  int n_kv_head = 0;
  int head_dim = 128;  // 64 or 128 (flash_prefill_supports)
  float scale = 0.f;
  int64_t n_q = 0;
  int64_t n_kv = 0;
  int64_t q_tok_stride = 0;   // elements between tokens of q (and out when out_tok_stride is 0)
  int64_t kv_tok_stride = 0;  // elements between tokens of k and v
  int64_t out_tok_stride = 0;
};

bool flash_prefill_supports(int head_dim);

// q:   [n_q, q_tok_stride] bf16, head h at + h*head_dim
// k,v: [n_kv, kv_tok_stride] bf16, kv head g at + g*head_dim
// out: [n_q, out_tok_stride] bf16
void flash_prefill(const FlashPrefillParams& p, const void* q, const void* k, const void* v, void* out,
                   cudaStream_t s);

}  // namespace kvtier::cuda
