#include "kv/full_kv.h"

#include <algorithm>
#include <cstring>

#include "core/status.h"
#include "core/threads.h"
#include "ops/attention/attention.h"
#include "ops/decode_attn/decode_attn.h"

namespace kvtier {

namespace {
// From this many queries on, an attend after prefill widens the raw cache to
// f32 once and runs the sgemm path (attention_causal); below, each query
// reads the stored elements (decode_attn_cpu).
constexpr int kWidenMinQueries = 8;

void check_geometry(const KvGeometry& g) {
  KVT_CHECK(g.n_layer > 0 && g.n_head > 0 && g.n_kv_head > 0 && g.head_dim > 0 &&
                g.n_head % g.n_kv_head == 0,
            "kv store: geometry n_layer={} n_head={} n_kv_head={} head_dim={} is not valid "
            "(positive, n_head a multiple of n_kv_head)",
            g.n_layer, g.n_head, g.n_kv_head, g.head_dim);
}
const KvGeometry& checked(const KvGeometry& g) {
  check_geometry(g);
  return g;
}
AttentionParams attention_params(const KvGeometry& g, float scale) {
  AttentionParams ap;
  ap.n_head = g.n_head;
  ap.n_kv_head = g.n_kv_head;
  ap.head_dim = g.head_dim;
  ap.scale = scale;
  return ap;
}
}  // namespace

FullKvStore::FullKvStore(const PolicyConfig& p, const KvGeometry& g)
    : p_(p), g_(checked(g)), spec_(parse_quant_spec(p.kv)) {
  KVT_CHECK(spec_.kind != QuantKind::nvfp4,
            "kv policy full: kv=nvfp4 needs a per-tensor scale; use it with a tiered policy");
  bytes_per_vector(spec_, g.n_kv_head * g.head_dim);  // validates the width
  raw_elt_ = spec_.kind == QuantKind::bf16 || spec_.kind == QuantKind::fp8;
  elt_bytes_ = spec_.kind == QuantKind::bf16 ? 2 : spec_.kind == QuantKind::fp8 ? 1 : 4;
  n_tok_.assign(g.n_layer, 0);
  k_.resize(g.n_layer);
  v_.resize(g.n_layer);
  raw_.resize(g.n_layer);
}

void FullKvStore::append(int layer, const float* k_pre, const float* k, const float* v,
                         int n_tok) {
  KVT_CHECK(layer >= 0 && layer < g_.n_layer, "kv store: layer {} outside [0, {})", layer,
            g_.n_layer);
  KVT_CHECK(n_tok >= 0, "kv store: n_tok {} < 0", n_tok);
  const int w = g_.n_kv_head * g_.head_dim;
  const size_t rec_bytes = size_t(n_tok) * bytes_per_vector(spec_, w);
  if (raw_now()) {
    scratch_.resize(rec_bytes);
    scratch_v_.resize(rec_bytes);
    quantize(spec_, k, n_tok, w, scratch_.data());
    quantize(spec_, v, n_tok, w, scratch_v_.data());
    raw_append(layer, scratch_.data(), scratch_v_.data(), n_tok);
    n_tok_[layer] += n_tok;
    return;
  }
  auto push = [&](std::vector<float>& dst, const float* src) {
    const size_t old = dst.size();
    dst.insert(dst.end(), src, src + int64_t(n_tok) * w);
    if (spec_.kind == QuantKind::f32) return;
    // Round through the storage format: what attention reads is exactly what
    // the records hold.
    scratch_.resize(rec_bytes);
    quantize(spec_, src, n_tok, w, scratch_.data());
    dequantize(spec_, scratch_.data(), n_tok, w, dst.data() + old);
  };
  push(k_[layer], k);
  push(v_[layer], v);
  n_tok_[layer] += n_tok;
}

void FullKvStore::set_phase(KvPhase phase) {
  if (phase == phase_) return;
  const int w = g_.n_kv_head * g_.head_dim;
  if (raw_elt_ && phase == KvPhase::decode) {
    // f32 rows → stored elements, layer by layer (the f32 values are the
    // stored ones dequantized, so quantizing them again is exact).
    for (int l = 0; l < g_.n_layer; ++l) {
      const int64_t n = n_tok_[l];
      n_tok_[l] = 0;  // the raw layer holds none yet
      raw_reserve(l, n + 256);
      scratch_.resize(size_t(n) * bytes_per_vector(spec_, w));
      scratch_v_.resize(scratch_.size());
      quantize(spec_, k_[l].data(), n, w, scratch_.data());
      quantize(spec_, v_[l].data(), n, w, scratch_v_.data());
      raw_append(l, scratch_.data(), scratch_v_.data(), n);
      n_tok_[l] = n;
      std::vector<float>().swap(k_[l]);
      std::vector<float>().swap(v_[l]);
    }
  } else if (raw_elt_ && phase == KvPhase::prefill) {
    for (int l = 0; l < g_.n_layer; ++l) {
      k_[l].resize(size_t(n_tok_[l]) * w);
      v_[l].resize(size_t(n_tok_[l]) * w);
      raw_widen(l, n_tok_[l], k_[l].data(), v_[l].data());
      raw_[l] = RawLayer{};
    }
  }
  phase_ = phase;
}

void FullKvStore::raw_reserve(int layer, int64_t n_total) {
  RawLayer& r = raw_[layer];
  if (n_total <= r.cap) return;
  // Grow by a quarter at least: amortized O(1) copies per token, and at most
  // 25 % slack (doubling would hold twice a long prompt's cache).
  const int64_t cap = std::max<int64_t>({n_total, r.cap + r.cap / 4, 256});
  const size_t row = size_t(g_.head_dim) * elt_bytes_;
  std::vector<uint8_t> k(size_t(g_.n_kv_head) * cap * row), v(k.size());
  const int64_t n = n_tok_[layer];
  for (int h = 0; h < g_.n_kv_head; ++h) {
    if (n == 0) break;
    std::memcpy(k.data() + h * cap * row, r.k.data() + h * r.cap * row, n * row);
    std::memcpy(v.data() + h * cap * row, r.v.data() + h * r.cap * row, n * row);
  }
  r.k.swap(k);
  r.v.swap(v);
  r.cap = cap;
}

void FullKvStore::raw_append(int layer, const uint8_t* k_rec, const uint8_t* v_rec, int64_t n_tok) {
  const int64_t n0 = n_tok_[layer];
  raw_reserve(layer, n0 + n_tok);
  RawLayer& r = raw_[layer];
  const size_t row = size_t(g_.head_dim) * elt_bytes_;
  for (int64_t t = 0; t < n_tok; ++t)
    for (int h = 0; h < g_.n_kv_head; ++h) {
      const size_t src = (size_t(t) * g_.n_kv_head + h) * row;
      const size_t dst = (size_t(h) * r.cap + n0 + t) * row;
      std::memcpy(r.k.data() + dst, k_rec + src, row);
      std::memcpy(r.v.data() + dst, v_rec + src, row);
    }
}

void FullKvStore::raw_widen(int layer, int64_t n, float* k, float* v) const {
  const RawLayer& r = raw_[layer];
  const int H = g_.n_kv_head, D = g_.head_dim;
  const size_t row = size_t(D) * elt_bytes_;
  std::vector<float> tmp(size_t(n) * D);  // [n, head_dim] one head
  for (int h = 0; h < H; ++h)
    for (int kv = 0; kv < 2; ++kv) {
      dequantize(spec_, (kv ? r.v : r.k).data() + h * r.cap * row, n, D, tmp.data());
      float* dst = kv ? v : k;
      for (int64_t t = 0; t < n; ++t)
        std::copy(tmp.data() + t * D, tmp.data() + (t + 1) * D, dst + (t * H + h) * D);
    }
}

void FullKvStore::attend(int layer, const float* q, int n_tok, float scale, float* out) {
  const int64_t n = n_tok_[layer];
  KVT_CHECK(n_tok >= 1 && n_tok <= n, "kv store: attend to {} queries with {} tokens held",
            n_tok, n);
  if (raw_now()) return attend_raw(layer, q, n_tok, scale, out);
  const AttentionParams ap = attention_params(g_, scale);
  attention_causal(ap, q, n_tok, k_[layer].data(), v_[layer].data(), n, out);
}

void FullKvStore::attend_raw(int layer, const float* q, int n_tok, float scale, float* out) {
  const int64_t n = n_tok_[layer];
  const int H = g_.n_kv_head, D = g_.head_dim, QH = g_.n_head;
  if (n_tok >= kWidenMinQueries) {
    const size_t w = size_t(H) * D;
    wide_k_.resize(size_t(n) * w);
    wide_v_.resize(size_t(n) * w);
    raw_widen(layer, n, wide_k_.data(), wide_v_.data());
    attention_causal(attention_params(g_, scale), q, n_tok, wide_k_.data(), wide_v_.data(), n, out);
    return;
  }
  const RawLayer& r = raw_[layer];
  DecodeAttnParams p;
  p.n_seq = 1;
  p.n_head = QH;
  p.n_kv_head = H;
  p.head_dim = D;
  p.scale = scale;
  p.elt = spec_.kind == QuantKind::fp8 ? KvElt::fp8 : KvElt::bf16;
  p.tok_stride = int64_t(D) * elt_bytes_;
  p.row_stride = r.cap * p.tok_stride;
  const int n_threads = default_pool().n_threads();
  const int64_t qs = int64_t(QH) * D;
  for (int i = 0; i < n_tok; ++i) {
    p.n_tok = n - n_tok + i + 1;  // query i sees tokens [0, n - n_tok + i]
    p.n_split = decode_attn_cpu_splits(H, p.n_tok, n_threads);
    part_lse_.resize(size_t(p.n_split) * QH);
    if (p.n_split == 1) {  // one part is the output itself
      decode_attn_cpu(p, q + i * qs, r.k.data(), r.v.data(), nullptr, out + i * qs, part_lse_.data());
      continue;
    }
    part_out_.resize(size_t(p.n_split) * qs);
    decode_attn_cpu(p, q + i * qs, r.k.data(), r.v.data(), nullptr, part_out_.data(), part_lse_.data());
    attn_merge_cpu(p.n_split, QH, D, part_out_.data(), part_lse_.data(), out + i * qs, nullptr);
  }
}

const float* FullKvStore::keys(int layer) const {
  KVT_CHECK(!raw_now(), "kv store: keys of layer {} are held as {} (f32 rows only before decode)", layer, p_.kv);
  return k_[layer].data();
}

const float* FullKvStore::values(int layer) const {
  KVT_CHECK(!raw_now(), "kv store: values of layer {} are held as {} (f32 rows only before decode)", layer,
            p_.kv);
  return v_[layer].data();
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
