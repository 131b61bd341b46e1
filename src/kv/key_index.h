// The key index: the small, GPU-resident summary of the keys that decode
// scores against the query to choose tokens (SPEC "Policies"). It is a sibling
// of the host store and shares its token ids: chunk c covers tokens
// [c·chunk, (c+1)·chunk). Kinds:
//   landmarks  chunk-mean of post-RoPE keys, quantized (any quant spec), or
//              residual: a meta-landmark (mean of m landmarks) + per-landmark residual
//   exact      the keys themselves (oracle)
//   shadowkv   chunk-8 bf16 landmarks + rank-r SVD of the prompt's pre-RoPE
//              keys (shared by the KV heads of a layer) + outlier chunks
// Only complete units (a chunk; m chunks for residual landmarks) are indexed;
// the trailing tokens of an incomplete unit are "pending" and always attended,
// so generated tokens are never dropped.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kv/host_store.h"
#include "kv/kv_store.h"
#include "kv/policy.h"

namespace kvtier {

// Rank-r factorization of the pre-RoPE keys of a layer's prompt (ShadowKV):
// k_pre ≈ proj · basis. Right singular vectors from the eigenvectors of the
// Gram matrix k_preᵀ·k_pre (LAPACK dsyevr, f64, only those kept), largest first.
struct KeySvd {
  int rank = 0;
  int width = 0;
  int64_t n_tok = 0;
  std::vector<float> basis;  // [rank, width]   (Vᵀ)
  std::vector<float> proj;   // [n_tok, rank]   (U·S)
};
// k_pre: [n_tok, width] f32
KeySvd key_svd(const float* k_pre, int64_t n_tok, int width, int rank);
// The top `rank` eigenvectors of a symmetric [width, width] Gram matrix
// (row-major, only the upper triangle read; destroyed), largest eigenvalue
// first: [rank, width] f32 — the right singular vectors of the keys.
std::vector<float> svd_basis_from_gram(std::vector<double>& gram, int width, int rank);
// out: [n, width] f32, rows tok[i] of proj · basis
void key_svd_reconstruct(const KeySvd& s, const int64_t* tok, int64_t n, float* out);

class KeyIndex {
 public:
  KeyIndex(const PolicyConfig& p, const KvGeometry& g);

  // k_pre, k: [n_tok, n_kv_head, head_dim] f32 (k_pre used by shadowkv in prefill)
  void append(int layer, const float* k_pre, const float* k, int64_t n_tok);
  // End of the prompt: shadowkv's SVD and outlier chunks (needs every prompt key).
  void finish_prompt();

  int chunk() const { return chunk_; }
  int64_t n_chunks(int layer) const { return n_chunks_[layer]; }
  // Per query head raw scores scale·q_h·landmark, aggregated over each GQA
  // group (policy gqa) into out: [n_kv_head, n_chunk] f32, chunks [0, n_chunk).
  // q: [n_head, head_dim] f32. only (policy rescore): per KV head the
  // chunks scored (sorted); the others score −∞ before the aggregation.
  void score(int layer, const float* q, float scale, int64_t n_chunk, float* out,
             const std::vector<std::vector<int64_t>>* only = nullptr) const;

  // shadowkv: outlier chunk ids per KV head (sorted); empty otherwise.
  const std::vector<int64_t>& outliers(int layer, int kv_head) const {
    return outliers_[layer][kv_head];
  }
  // shadowkv: tokens whose keys the SVD reconstructs ([0, svd n_tok)).
  int64_t n_svd_tokens(int layer) const {
    return svd_.empty() ? 0 : svd_[layer].n_tok;
  }
  // shadowkv: post-RoPE keys of prompt tokens rebuilt from the SVD.
  // out: [n, n_kv_head, head_dim] f32
  void reconstruct_keys(int layer, const int64_t* tok, int64_t n, float* out) const;

  int64_t gpu_bytes() const;

 private:
  void index_units(int layer);

  PolicyConfig p_;
  KvGeometry g_;
  int chunk_ = 1;
  int unit_ = 1;  // tokens per indexed unit (chunk, or chunk·m for residual)
  std::vector<int64_t> n_chunks_;             // per layer
  std::vector<std::vector<float>> pending_;   // per layer [n, n_kv_head, head_dim] post-RoPE
  std::vector<int64_t> n_appended_;           // per layer
  std::vector<CodedRows> lm_codes_;           // per layer, rows [chunk, kv_head] of head_dim
  // residual: per layer, per (unit, kv head) one meta record then m residual records
  std::vector<std::vector<uint8_t>> res_codes_;
  std::vector<std::vector<float>> mirror_;    // per layer [n_chunk, n_kv_head, head_dim] f32
  // shadowkv
  std::vector<std::vector<float>> prompt_pre_;   // per layer [n_prompt, width] f32 (until finish)
  std::vector<std::vector<float>> prompt_post_;  // per layer [n_prompt, width] f32 (until finish)
  std::vector<KeySvd> svd_;
  std::vector<std::vector<std::vector<int64_t>>> outliers_;  // [layer][kv_head] chunk ids
};

}  // namespace kvtier
