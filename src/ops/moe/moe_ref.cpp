// The specification of the MoE block (moe.h): routing, grouping by expert and
// a token-by-token evaluation of the experts with f64 accumulation.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/status.h"
#include "ops/moe/moe.h"
#include "ops/swiglu/swiglu.h"

namespace kvtier {
namespace {

void check_config(const MoeConfig& c) {
  KVT_CHECK(c.n_embd > 0 && c.n_ff > 0 && c.n_expert > 0 && c.n_expert_used >= 1 &&
                c.n_expert_used <= c.n_expert,
            "moe: n_embd {}, n_ff {}, {} experts, {} used: expected positive sizes and 1 <= used <= experts",
            c.n_embd, c.n_ff, c.n_expert, c.n_expert_used);
}

}  // namespace

void moe_route(const float* logits, int64_t n_tok, const MoeConfig& c, int32_t* ids, float* weights) {
  check_config(c);
  const int n = c.n_expert, k = c.n_expert_used;
  std::vector<int32_t> order(static_cast<size_t>(n));
  for (int64_t t = 0; t < n_tok; ++t) {
    const float* l = logits + t * n;  // [n_expert]
    // Ordering by logit is ordering by probability; stable: ties to the lower id.
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [l](int32_t a, int32_t b) { return l[a] > l[b]; });
    const double mx = l[order[0]];
    double denom = 0;
    for (int e = 0; e < n; ++e) denom += std::exp(double(l[e]) - mx);
    double top = 0;
    for (int j = 0; j < k; ++j) top += std::exp(double(l[order[size_t(j)]]) - mx) / denom;
    for (int j = 0; j < k; ++j) {
      const int32_t e = order[size_t(j)];
      double p = std::exp(double(l[e]) - mx) / denom;
      if (c.norm_topk) p /= top;
      ids[t * k + j] = e;
      weights[t * k + j] = float(p * c.scale);
    }
  }
}

void moe_group(const int32_t* ids, int64_t n_tok, const MoeConfig& c, MoeGroups* g) {
  const int k = c.n_expert_used;
  g->indptr.assign(size_t(c.n_expert) + 1, 0);
  for (int64_t i = 0; i < n_tok * k; ++i) {
    KVT_CHECK(ids[i] >= 0 && ids[i] < c.n_expert, "moe: expert id {} out of [0, {})", ids[i], c.n_expert);
    ++g->indptr[size_t(ids[i]) + 1];
  }
  for (int e = 0; e < c.n_expert; ++e) g->indptr[size_t(e) + 1] += g->indptr[size_t(e)];
  g->token.resize(size_t(n_tok * k));
  g->slot.resize(size_t(n_tok * k));
  std::vector<int64_t> fill(g->indptr.begin(), g->indptr.end() - 1);  // [n_expert] next free row
  for (int64_t t = 0; t < n_tok; ++t)
    for (int j = 0; j < k; ++j) {
      const int64_t row = fill[size_t(ids[t * k + j])]++;
      g->token[size_t(row)] = int32_t(t);
      g->slot[size_t(row)] = j;
    }
}

void moe_experts_ref(const MoeWeights& w, const MoeConfig& c, const float* x, int64_t n_tok,
                     const int32_t* ids, const float* weights, float* y) {
  check_config(c);
  const int E = c.n_embd, F = c.n_ff, k = c.n_expert_used;
  std::vector<float> gate(static_cast<size_t>(F)), up(gate.size()), out(static_cast<size_t>(E));
  std::vector<double> acc(static_cast<size_t>(E));
  for (int64_t t = 0; t < n_tok; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int j = 0; j < k; ++j) {
      const int32_t e = ids[t * k + j];
      KVT_CHECK(e >= 0 && e < c.n_expert, "moe: expert id {} out of [0, {})", e, c.n_expert);
      matmul_ref(w.gate[size_t(e)], x + t * E, 1, gate.data());
      matmul_ref(w.up[size_t(e)], x + t * E, 1, up.data());
      swiglu_ref(gate.data(), up.data(), F, gate.data());
      matmul_ref(w.down[size_t(e)], gate.data(), 1, out.data());
      for (int i = 0; i < E; ++i) acc[size_t(i)] += double(weights[t * k + j]) * out[size_t(i)];
    }
    for (int i = 0; i < E; ++i) y[t * E + i] = float(acc[size_t(i)]);
  }
}

void moe_ffn_ref(const MoeWeights& w, const MoeConfig& c, const float* x, int64_t n_tok, float* y) {
  check_config(c);
  std::vector<float> logits(size_t(n_tok) * size_t(c.n_expert));  // [n_tok, n_expert]
  std::vector<int32_t> ids(size_t(n_tok) * size_t(c.n_expert_used));
  std::vector<float> weights(ids.size());
  matmul_ref(w.router, x, n_tok, logits.data());
  moe_route(logits.data(), n_tok, c, ids.data(), weights.data());
  moe_experts_ref(w, c, x, n_tok, ids.data(), weights.data(), y);
}

}  // namespace kvtier
