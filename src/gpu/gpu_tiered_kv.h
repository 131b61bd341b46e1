// The tiered KV cache of one sequence on the GPU, for the policies whose
// decode step runs natively there (see gpu_tiered_unsupported): per-token
// higgs2 landmarks (chunk 1, head_dim 128) in a GPU key index, every token's
// K|V in pinned host memory (FP8 or bf16 entries per KV head, or — yakv's
// default — HIGGS4 records over the layer's KV width), sinks and the local
// window resident in bf16, GQA by the group's mean query (gqa=mean) or by
// the max of each query's softmax (gqa=shadowkv, groups of 1, 2 or 4). The
// records are the CPU store's (ops/kv_append),
// and the decode step is TieredKvStore::attend_one's, as kernels on one
// stream with no host synchronization:
//   index_query (Hadamard-rotated) → index_score over the non-resident
//   tokens (gqa=shadowkv: every query over all tokens, then
//   index_gqa_softmax_max) → topk (the budget) → gather_slots (zero-copy
//   reads of the misses; tokens selected again keep their slot; HIGGS
//   records are then rebuilt into the head's bf16 K|V) → decode
//   attention over the slots, while a side stream attends to the resident
//   tokens → attn_merge by log-sum-exp.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "kv/kv_store.h"
#include "kv/policy.h"

namespace kvtier {

// "" when policy p decodes natively on the GPU at geometry g, else the reason
// (the GPU model then keeps the CPU store's path for it).
std::string gpu_tiered_unsupported(const PolicyConfig& p, const KvGeometry& g);

class GpuTieredKv {
 public:
  GpuTieredKv(const PolicyConfig& p, const KvGeometry& g);
  ~GpuTieredKv();

  // The next n_tok tokens of `layer`, at positions [pos0, pos0 + n_tok):
  // k (after RoPE), v: [n_tok, n_kv_head, head_dim] bf16 on the device, token
  // stride kv_tok_stride elements. Grows the tiers when needed (then syncs s).
  void append(int layer, const void* k, const void* v, int64_t kv_tok_stride, int64_t pos0, int n_tok,
              cudaStream_t s);
  // Room for n_tok tokens in every layer's host tier and index (growth
  // otherwise doubles them as tokens arrive).
  void reserve(int64_t n_tok, cudaStream_t s);
  // After a prompt of n_prompt tokens: fixes the budget (budget_tokens).
  void start_decode(int64_t n_prompt);
  bool decoding() const;
  // The decode query of `layer`'s last appended token: q [n_head, head_dim]
  // bf16 → out [n_head, head_dim] bf16.
  void attend(int layer, const void* q, float scale, void* out, cudaStream_t s);

  KvMemory memory() const;
  int64_t budget() const;
  // Host entries read over PCIe by the decode steps so far (syncs the device),
  // each entry_bytes (fp8/bf16: one head's K|V; HIGGS: the token's records).
  uint64_t host_entries_read() const;
  int64_t entry_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier
