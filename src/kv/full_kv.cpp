#include "kv/full_kv.h"

#include "core/status.h"
#include "ops/attention/attention.h"

namespace kvtier {

FullKvStore::FullKvStore(const PolicyConfig& p, const KvGeometry& g)
    : p_(p), g_(checked_geometry(g)), spec_(p.kv) {
  KVT_CHECK(spec_.kind != QuantKind::nvfp4,
            "kv policy full: kv=nvfp4 needs a per-tensor scale; use it with a tiered policy");
  bytes_per_vector(spec_, g.n_kv_head * g.head_dim);  // validates the width
  n_tok_.assign(g.n_layer, 0);
  k_.resize(g.n_layer);
  v_.resize(g.n_layer);
}

void FullKvStore::append(int layer, const float* k_pre, const float* k, const float* v,
                         int n_tok) {
  KVT_CHECK(layer >= 0 && layer < g_.n_layer, "kv store: layer {} outside [0, {})", layer,
            g_.n_layer);
  const int w = g_.n_kv_head * g_.head_dim;
  auto push = [&](std::vector<float>& dst, const float* src) {
    const size_t old = dst.size();
    dst.insert(dst.end(), src, src + int64_t(n_tok) * w);
    if (spec_.kind == QuantKind::f32) return;
    // Round through the storage format: what attention reads is exactly what
    // the records hold.
    scratch_.resize(size_t(n_tok) * bytes_per_vector(spec_, w));
    quantize(spec_, src, n_tok, w, scratch_.data());
    dequantize(spec_, scratch_.data(), n_tok, w, dst.data() + old);
  };
  push(k_[layer], k);
  push(v_[layer], v);
  n_tok_[layer] += n_tok;
}

void FullKvStore::attend(int layer, const float* q, int n_tok, float scale, float* out) {
  const int64_t n = n_tok_[layer];
  KVT_CHECK(n_tok >= 1 && n_tok <= n, "kv store: attend to {} queries with {} tokens held",
            n_tok, n);
  const AttentionParams ap{g_.n_head, g_.n_kv_head, g_.head_dim, scale};
  attention_causal(ap, q, n_tok, k_[layer].data(), v_[layer].data(), n, out);
}

KvMemory FullKvStore::memory() const {
  KvFootprint f = kv_footprint(p_, g_, n_tok_[0]);
  KvMemory m;
  m.gpu_bytes_per_token = f.gpu_bytes_per_token;
  m.host_bytes_per_token = f.host_bytes_per_token;
  m.gpu_bytes = f.gpu_bytes;
  m.host_bytes = f.host_bytes;
  return m;
}

std::string FullKvStore::describe() const { return to_string(p_); }

}  // namespace kvtier
