// Mixture-of-experts feed-forward block (Qwen3-MoE, Mixtral): a router picks,
// for every token, k of n_expert SwiGLU experts; the block's output is the
// routing-weighted sum of those experts' outputs (Shazeer et al. 2017; the
// Mixtral and Qwen3-MoE model code of HF transformers):
//
//   p    = softmax(x · Wrᵀ)                    over all n_expert experts
//   ids  = the k largest p (descending; ties to the lower expert id)
//   w_j  = p[ids_j], divided by Σ_j w_j when norm_topk, times scale
//   y    = Σ_j w_j · down_{ids_j}( silu(gate_{ids_j} · x) ⊙ (up_{ids_j} · x) )
//
// The CPU version evaluates an expert only for the tokens routed to it: the
// (token, slot) pairs are grouped by expert (an indptr/index list) and each
// expert runs one matrix–matrix product over its gathered rows.
#pragma once
#include <cstdint>
#include <vector>

#include "ops/matmul/matmul.h"

namespace kvtier {

class ThreadPool;

struct MoeConfig {
  int n_embd = 0;
  int n_ff = 0;           // width of one expert
  int n_expert = 0;
  int n_expert_used = 0;  // k
  bool norm_topk = true;
  float scale = 1.0f;
};

// One layer's router and experts. The router must be a type matmul runs
// (matmul_supports); the experts may be any type dequantize_row reads — those
// matmul does not run are dequantized to f32 when an expert is used, so that
// a model's experts are never all expanded in memory.
struct MoeWeights {
  WeightView router;                 // [n_expert, n_embd]
  std::vector<WeightView> gate, up;  // per expert [n_ff, n_embd]
  std::vector<WeightView> down;      // per expert [n_embd, n_ff]
};

// Routing: logits [n_tok, n_expert] f32 → ids [n_tok, k] int32 and
// weights [n_tok, k] f32 (softmax in f64). The specification of every
// routing implementation (the CUDA one is tested against it).
void moe_route(const float* logits, int64_t n_tok, const MoeConfig& c, int32_t* ids, float* weights);

// The routed (token, slot) pairs grouped by expert: expert e's pairs are rows
// [indptr[e], indptr[e + 1]) of token/slot, in token order.
struct MoeGroups {
  std::vector<int64_t> indptr;  // [n_expert + 1]
  std::vector<int32_t> token;   // [n_tok * k]
  std::vector<int32_t> slot;    // [n_tok * k]
};
void moe_group(const int32_t* ids, int64_t n_tok, const MoeConfig& c, MoeGroups* g);

// Reference of the experts' part for given routing: x [n_tok, n_embd] f32,
// ids/weights [n_tok, k] → y [n_tok, n_embd] f32. Each expert through
// matmul_ref (f64 accumulation), token by token.
void moe_experts_ref(const MoeWeights& w, const MoeConfig& c, const float* x, int64_t n_tok,
                     const int32_t* ids, const float* weights, float* y);

// Reference of the whole block: router (matmul_ref), moe_route, moe_experts_ref.
void moe_ffn_ref(const MoeWeights& w, const MoeConfig& c, const float* x, int64_t n_tok, float* y);

// Working memory of moe_ffn, grown on demand and reused across calls.
struct MoeScratch {
  std::vector<float> logits;        // [n_tok, n_expert]
  std::vector<int32_t> ids;         // [n_tok, k]
  std::vector<float> weights;       // [n_tok, k]
  MoeGroups groups;
  std::vector<float> xe;            // [rows, n_embd] the rows routed to one expert
  std::vector<float> gate, up;      // [rows, n_ff]
  std::vector<float> out;           // [rows, n_embd]
  std::vector<float> dequantized;   // [n_ff * n_embd] one expert matrix in f32 (types matmul does not run)
};

// x, y: [n_tok, n_embd] f32 (must not alias). Each expert runs once over the
// rows routed to it.
void moe_ffn(const MoeWeights& w, const MoeConfig& c, const float* x, int64_t n_tok, float* y, MoeScratch& s,
             ThreadPool& pool);

}  // namespace kvtier
