// The MoE block on the CPU: router, routing, grouping by expert, then one
// matrix–matrix pass per expert over the rows routed to it (gather → gate/up
// → SwiGLU → down → weighted scatter-add). Decode (one token) thus reads
// only its k experts' weights.
#include <algorithm>
#include <cstring>

#include "core/status.h"
#include "core/threads.h"
#include "ops/dequant/dequant.h"
#include "ops/moe/moe.h"
#include "ops/swiglu/swiglu.h"

namespace kvtier {
namespace {

template <class T>
void grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// `w` itself when matmul runs its type, else its f32 copy in `buf`.
WeightView runnable(const WeightView& w, std::vector<float>& buf, ThreadPool& pool) {
  if (matmul_supports(w.type)) return w;
  grow(buf, size_t(w.n_out * w.n_in));
  float* dst = buf.data();
  pool.parallel_for(w.n_out, 16, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) dequantize_row(w.type, w.row(r), dst + r * w.n_in, w.n_in);
  });
  return WeightView{GgmlType::F32, dst, w.n_out, w.n_in, size_t(w.n_in) * sizeof(float)};
}

}  // namespace

void moe_ffn(const MoeWeights& w, const MoeConfig& c, const float* x, int64_t n_tok, float* y, MoeScratch& s,
             ThreadPool& pool) {
  const int E = c.n_embd, F = c.n_ff, k = c.n_expert_used;
  KVT_CHECK(int64_t(w.gate.size()) == c.n_expert && w.up.size() == w.gate.size() && w.down.size() == w.gate.size(),
            "moe: {} / {} / {} expert matrices for {} experts", w.gate.size(), w.up.size(), w.down.size(),
            c.n_expert);
  KVT_CHECK(w.router.n_out == c.n_expert && w.router.n_in == E, "moe: router is [{}, {}], expected [{}, {}]",
            w.router.n_out, w.router.n_in, c.n_expert, E);
  grow(s.logits, size_t(n_tok) * size_t(c.n_expert));
  grow(s.ids, size_t(n_tok) * size_t(k));
  grow(s.weights, size_t(n_tok) * size_t(k));
  matmul(w.router, x, n_tok, s.logits.data(), pool);  // [n_tok, n_expert]
  moe_route(s.logits.data(), n_tok, c, s.ids.data(), s.weights.data());
  moe_group(s.ids.data(), n_tok, c, &s.groups);

  std::memset(y, 0, sizeof(float) * size_t(n_tok) * size_t(E));
  for (int e = 0; e < c.n_expert; ++e) {
    const int64_t r0 = s.groups.indptr[size_t(e)], n_rows = s.groups.indptr[size_t(e) + 1] - r0;
    if (n_rows == 0) continue;  // an expert no token chose is never read
    grow(s.xe, size_t(n_rows) * E);
    grow(s.gate, size_t(n_rows) * F);
    grow(s.up, size_t(n_rows) * F);
    grow(s.out, size_t(n_rows) * E);
    const int32_t* tok = &s.groups.token[size_t(r0)];
    for (int64_t r = 0; r < n_rows; ++r)  // xe: [n_rows, n_embd]
      std::memcpy(&s.xe[size_t(r) * E], x + int64_t(tok[r]) * E, sizeof(float) * size_t(E));
    matmul(runnable(w.gate[size_t(e)], s.dequantized, pool), s.xe.data(), n_rows, s.gate.data(), pool);
    matmul(runnable(w.up[size_t(e)], s.dequantized, pool), s.xe.data(), n_rows, s.up.data(), pool);
    swiglu(s.gate.data(), s.up.data(), n_rows * F, s.gate.data());  // [n_rows, n_ff]
    matmul(runnable(w.down[size_t(e)], s.dequantized, pool), s.gate.data(), n_rows, s.out.data(), pool);
    for (int64_t r = 0; r < n_rows; ++r) {
      const float wt = s.weights[size_t(tok[r]) * k + size_t(s.groups.slot[size_t(r0 + r)])];
      float* yt = y + int64_t(tok[r]) * E;
      const float* o = &s.out[size_t(r) * E];
      for (int i = 0; i < E; ++i) yt[i] += wt * o[i];
    }
  }
}

}  // namespace kvtier
