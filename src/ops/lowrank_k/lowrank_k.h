// Rebuilding the selected tokens' post-RoPE keys from ShadowKV's low-rank
// pre-RoPE key cache (SPEC "Why": a rank-160 SVD projection held on the GPU).
//
// Per layer and sequence the pre-RoPE keys K_pre [n_ctx, n_kv_head·head_dim]
// are kept as A·B: A = U·S [n_ctx, rank], shared by the layer's KV heads, and
// B = Vᵀ [rank, n_kv_head·head_dim]. Keys are rebuilt only for the tokens the
// sparse selection picked (ShadowKV, Sun et al., ICML 2025, §4.2). For row
// r = (seq, kv head g) and its i-th selected token t = idx[r][i]:
//   out[r][i][:] = RoPE(A[seq][t, :] · B[seq][:, g·head_dim .. (g+1)·head_dim), position t)
// RoPE rotates the pairs (j, j + head_dim/2), or (2j, 2j+1) when interleaved,
// by the angle t·inv_freq[j] (ops/rope: the model's own frequency table);
// inv_freq = null leaves the keys un-rotated (pre-RoPE).
// idx entries of -1 are skipped: their output rows are left untouched.
#pragma once
#include <cstdint>

namespace kvtier {

struct LowrankKParams {
  int n_seq = 1;
  int n_kv_head = 0;
  int head_dim = 128;
  int rank = 0;
  int k = 0;                   // selected tokens per row (idx is [n_seq·n_kv_head, k])
  int64_t n_ctx = 0;           // tokens per sequence in A; idx values lie in [0, n_ctx)
  int64_t a_seq_stride = 0;    // elements between sequences of A (>= n_ctx·rank)
  int64_t b_seq_stride = 0;    // elements between sequences of B (>= rank·n_kv_head·head_dim)
  int64_t out_row_stride = 0;  // elements between rows of out (>= k·head_dim)
  bool interleaved = false;    // RoPE pairing
};

// a:        [n_seq][n_ctx, rank] bf16 bits (a_seq_stride elements apart)
// b:        [n_seq][rank, n_kv_head·head_dim] bf16 bits (b_seq_stride apart)
// idx:      [n_seq·n_kv_head, k] int32 token ids (-1 = skip)
// inv_freq: [head_dim/2] f32, or null for no RoPE
// out:      [n_seq·n_kv_head][k, head_dim] f32 (out_row_stride elements apart);
//           products accumulated in f64, RoPE in f64.
void lowrank_k_ref(const LowrankKParams& p, const uint16_t* a, const uint16_t* b, const int32_t* idx,
                   const float* inv_freq, float* out);

}  // namespace kvtier
