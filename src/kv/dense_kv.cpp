#include "kv/dense_kv.h"

#include <algorithm>

#include "backend/stage_clock.h"
#include "core/half.h"
#include "core/status.h"
#include "core/threads.h"
#include "kv/tiered_kv.h"
#include "ops/attention/prefill_attention.h"
#include "ops/decode_attn/decode_attn.h"
#include "ops/gather/copy_rows.h"
#include "ops/kv_append/kv_write.h"
#include "ops/quant/hadamard.h"
#include "ops/quant/higgs_grid.h"

namespace kvtier {

DenseKv::DenseKv(const KvPlan& plan, const Device& dev) : plan_(plan), dev_(dev), x_(dev.exec()) {
  KVT_CHECK(plan.dense && plan.device == dev.kind(), "dense cache: plan for {} on {}", to_string(plan.policy),
            device_name(plan.device));
  const QuantKind kind = plan.host_spec.kind;
  // The CPU prefills into f32 rows (exact for kv=f32), the GPU keeps bf16 rows (exact for kv=bf16).
  round_ = !(kind == QuantKind::f32 || (kind == QuantKind::bf16 && dev.kind() == DeviceKind::cuda));
  elt_ = dev.kind() == DeviceKind::cuda ? KvElt::bf16 : KvElt::f32;
  narrow_ = dev.kind() == DeviceKind::cpu && (kind == QuantKind::bf16 || kind == QuantKind::fp8);
  if (round_ && plan.host_spec.kind == QuantKind::higgs) {
    const QuantSpec& s = plan.host_spec;
    const int W = plan.geometry.n_kv_head * plan.geometry.head_dim;
    const HiggsGrid& g = higgs_grid_of(s);
    grid_ = dev.alloc(g.points.size() * 4);
    copy(x_, grid_.data(), g.points.data(), grid_.bytes());
    if (s.random_signs) {
      std::vector<float> sg(size_t(resolved_group(s, W)));
      hadamard_signs(s.sign_seed, int(sg.size()), sg.data());
      signs_ = dev.alloc(sg.size() * 4);
      copy(x_, signs_.data(), sg.data(), signs_.bytes());
    }
    sync(x_);
  }
  n_.assign(size_t(plan.geometry.n_layer), 0);
  k_.resize(size_t(plan.geometry.n_layer));
  v_.resize(size_t(plan.geometry.n_layer));
}

void DenseKv::reserve(int64_t n) {
  if (n > cap_) grow(n);
}

void DenseKv::grow(int64_t need) {
  const KvGeometry& g = plan_.geometry;
  const int64_t W = int64_t(g.n_kv_head) * g.head_dim, ab = kv_elt_bytes(elt_);
  const int64_t cap = std::max<int64_t>({need, 2 * cap_, 256});
  sync(x_);
  for (int l = 0; l < g.n_layer; ++l) {
    Buffer k = dev_.alloc(size_t(cap * W * ab)), v = dev_.alloc(k.bytes());
    if (n_[size_t(l)] > 0) {
      copy(x_, k.data(), k_[size_t(l)].data(), size_t(n_[size_t(l)] * W * ab));
      copy(x_, v.data(), v_[size_t(l)].data(), size_t(n_[size_t(l)] * W * ab));
    }
    k_[size_t(l)] = std::move(k);
    v_[size_t(l)] = std::move(v);
  }
  build_row_table();
  n_split_ = decode_attn_splits(x_, g.n_kv_head, cap, 256);
  part_out_ = dev_.alloc(size_t(n_split_) * g.n_head * g.head_dim * 4);
  part_lse_ = dev_.alloc(size_t(n_split_) * g.n_head * 4);
  if (!n_dev_) {
    n_dev_ = dev_.alloc(16);
    stage_ = dev_.alloc_host(16);
  }
  sync(x_);
  cap_ = cap;
}

void DenseKv::build_row_table() {
  const KvGeometry& g = plan_.geometry;
  const int64_t ab = kv_elt_bytes(elt_);
  std::vector<const uint8_t*> rows(size_t(g.n_layer) * g.n_kv_head);
  for (int l = 0; l < g.n_layer; ++l)
    for (int h = 0; h < g.n_kv_head; ++h)
      rows[size_t(l) * g.n_kv_head + h] = k_[size_t(l)].data<uint8_t>() + int64_t(h) * g.head_dim * ab;
  upload(x_, rows_, rows.data(), rows.size() * sizeof(void*));
}

void DenseKv::start_decode() {
  decoding_ = true;
  if (narrow_ && elt_ == KvElt::f32) narrow_to_bf16();
}

// f32 rows → bf16 rows of the same capacity (exact: the values were rounded
// through the kv format, bf16 or FP8, on append).
void DenseKv::narrow_to_bf16() {
  const KvGeometry& g = plan_.geometry;
  const int64_t W = int64_t(g.n_kv_head) * g.head_dim;
  elt_ = KvElt::bf16;
  if (cap_ == 0) return;  // nothing held yet: grow allocates bf16 rows
  for (int l = 0; l < g.n_layer; ++l) {
    for (std::vector<Buffer>* kv : {&k_, &v_}) {
      Buffer& src = (*kv)[size_t(l)];
      Buffer dst = dev_.alloc(size_t(cap_ * W * 2));
      const float* f = src.data<float>();
      uint16_t* b = dst.data<uint16_t>();
      default_pool().parallel_for(n_[size_t(l)] * W, 1 << 16, [&](int64_t i0, int64_t i1, int) {
        for (int64_t i = i0; i < i1; ++i) b[i] = f32_to_bf16(f[i]);
      });
      src = std::move(dst);
    }
  }
  build_row_table();
}

void DenseKv::begin_step(int n_tok) {
  if (!decoding_ || !x_.cuda()) return;
  KVT_CHECK(n_tok == 1, "dense cache: a decode step takes one token, not {}", n_tok);
  if (n_[0] + 1 > cap_) grow(n_[0] + 1);
  // pos0 and the tokens held once this step's are appended, for the step's kernels.
  stage_.host_ptr<int64_t>()[0] = n_[0];
  stage_.host_ptr<int64_t>()[1] = n_[0] + 1;
  copy(x_, n_dev_.data(), stage_.data(), 16);
  for (int64_t& n : n_) n += 1;  // the step's appends write at the staged position
  stepping_ = true;
}

void DenseKv::append(int layer, const void* k_pre, const void* k, const void* v, int64_t tok_stride, int n_tok) {
  const KvGeometry& g = plan_.geometry;
  const int64_t W = int64_t(g.n_kv_head) * g.head_dim, ab = kv_elt_bytes(elt_);
  KVT_CHECK(layer >= 0 && layer < g.n_layer && n_tok >= 1, "dense cache: append of {} tokens to layer {}", n_tok,
            layer);
  KVT_CHECK(tok_stride == W, "dense cache: rows must be dense ({} elements, not {})", W, tok_stride);
  if (stepping_) {  // a decode step (GPU): the position comes from the staged device copy
    KVT_CHECK(n_tok == 1, "dense cache: a decode step appends one token");
    stage(x_, "append");
    copy_rows_at(x_, 1, W * ab, k, k_[size_t(layer)].data(), W * ab, n_dev_.data<int64_t>());
    copy_rows_at(x_, 1, W * ab, v, v_[size_t(layer)].data(), W * ab, n_dev_.data<int64_t>());
    if (round_) {
      const RecordFormat f = round_format();
      round_rows(x_, f, k_[size_t(layer)].data(), 1, W, n_dev_.data<int64_t>());
      round_rows(x_, f, v_[size_t(layer)].data(), 1, W, n_dev_.data<int64_t>());
    }
    stage(x_, "model");
    return;
  }
  const int64_t n = n_[size_t(layer)];
  if (n + n_tok > cap_) grow(n + n_tok);
  uint8_t* kd = k_[size_t(layer)].data<uint8_t>() + n * W * ab;
  uint8_t* vd = v_[size_t(layer)].data<uint8_t>() + n * W * ab;
  if (elt_ == KvElt::bf16 && !x_.cuda()) {
    // CPU after narrowing: f32 in, bf16 rows out, rounded through the kv
    // format first (FP8 values are exact in bf16).
    const int64_t m = int64_t(n_tok) * W;
    const float* kf = static_cast<const float*>(k);
    const float* vf = static_cast<const float*>(v);
    std::vector<float> kr, vr;
    if (round_ && plan_.host_spec.kind != QuantKind::bf16) {  // f32_to_bf16 below is bf16's rounding
      const RecordFormat f = round_format();
      kr.assign(kf, kf + m);
      vr.assign(vf, vf + m);
      round_rows(x_, f, kr.data(), n_tok, W);
      round_rows(x_, f, vr.data(), n_tok, W);
      kf = kr.data();
      vf = vr.data();
    }
    uint16_t* kb = reinterpret_cast<uint16_t*>(kd);
    uint16_t* vb = reinterpret_cast<uint16_t*>(vd);
    for (int64_t i = 0; i < m; ++i) {
      kb[i] = f32_to_bf16(kf[i]);
      vb[i] = f32_to_bf16(vf[i]);
    }
    n_[size_t(layer)] = n + n_tok;
    return;
  }
  copy(x_, kd, k, size_t(n_tok) * W * ab);
  copy(x_, vd, v, size_t(n_tok) * W * ab);
  if (round_) {
    const RecordFormat f = round_format();
    round_rows(x_, f, kd, n_tok, W);
    round_rows(x_, f, vd, n_tok, W);
  }
  n_[size_t(layer)] = n + n_tok;
  (void)k_pre;
}

RecordFormat DenseKv::round_format() const {
  RecordFormat f;
  f.spec = plan_.host_spec;
  f.dim = plan_.geometry.n_kv_head * plan_.geometry.head_dim;
  f.bytes = int64_t(bytes_per_vector(f.spec, f.dim));
  f.grid = grid_.data<float>();
  f.signs = signs_.data<float>();
  return f;
}

void DenseKv::attend(int layer, const void* q, int64_t q_stride, int n_tok, float scale, void* out) {
  const KvGeometry& g = plan_.geometry;
  const int64_t W = int64_t(g.n_kv_head) * g.head_dim, ab = kv_elt_bytes(elt_);
  const int64_t n = n_[size_t(layer)];
  KVT_CHECK(n_tok >= 1 && n_tok <= n, "dense cache: attend to {} queries with {} tokens held", n_tok, n);
  if (decoding_) stage(x_, "attend");
  if (elt_ == KvElt::bf16 && !x_.cuda()) {  // narrowed CPU rows: every query through the decode kernels
    attend_each(layer, static_cast<const float*>(q), q_stride, n_tok, scale, static_cast<float*>(out));
    stage(x_, "model");
    return;
  }
  if (n_tok > 1 || !decoding_) {
    if (!decoding_) stage(x_, "prefill_attend");
    AttentionParams ap{g.n_head, g.n_kv_head, g.head_dim, scale};
    prefill_attention(x_, ap, q, q_stride, n_tok, k_[size_t(layer)].data(), v_[size_t(layer)].data(), W, n, out,
                      q_stride);
    stage(x_, decoding_ ? "model" : "prefill_model");
    return;
  }
  KVT_CHECK(q_stride == int64_t(g.n_head) * g.head_dim, "dense cache: decode query rows must be dense");
  // Decode: split-K attention over the stored rows (CPU kv=f32: f32 through
  // the vector row kernels, work split by KV head and token block).
  DecodeAttnParams p{1, g.n_head, g.n_kv_head, g.head_dim, scale, elt_};
  p.tok_stride = W * ab;
  p.v_offset = v_[size_t(layer)].data<uint8_t>() - k_[size_t(layer)].data<uint8_t>();
  if (x_.cuda()) p.n_tok = n_dev_.data<int64_t>() + 1;  // staged by begin_step
  else p.n_tok_fixed = n;
  p.n_tok_max = cap_;
  p.n_split = n_split_;
  const int n_split = n_split_;
  const auto* rows = rows_.data<const uint8_t*>() + size_t(layer) * g.n_kv_head;
  decode_attn(x_, p, q, rows, nullptr, part_out_.data<float>(), part_lse_.data<float>());
  attn_merge(x_, n_split, g.n_head, g.head_dim, part_out_.data<float>(), part_lse_.data<float>(), out, false, nullptr);
  stage(x_, "model");
}

// Query i of n_tok sits at position n − n_tok + i and sees n − n_tok + i + 1
// tokens: one decode attention each (a continuation after decode began).
void DenseKv::attend_each(int layer, const float* q, int64_t q_stride, int n_tok, float scale, float* out) {
  const KvGeometry& g = plan_.geometry;
  const int64_t W = int64_t(g.n_kv_head) * g.head_dim, n = n_[size_t(layer)];
  const int64_t qw = int64_t(g.n_head) * g.head_dim;
  KVT_CHECK(q_stride >= qw, "dense cache: query rows of {} elements, need {}", q_stride, qw);
  DecodeAttnParams p{1, g.n_head, g.n_kv_head, g.head_dim, scale, KvElt::bf16};
  p.tok_stride = W * 2;
  p.v_offset = v_[size_t(layer)].data<uint8_t>() - k_[size_t(layer)].data<uint8_t>();
  p.n_tok_max = cap_;
  p.n_split = n_split_;
  const auto* rows = rows_.data<const uint8_t*>() + size_t(layer) * g.n_kv_head;
  for (int i = 0; i < n_tok; ++i) {
    p.n_tok_fixed = n - n_tok + i + 1;
    decode_attn(x_, p, q + i * q_stride, rows, nullptr, part_out_.data<float>(), part_lse_.data<float>());
    attn_merge(x_, n_split_, g.n_head, g.head_dim, part_out_.data<float>(), part_lse_.data<float>(),
               out + i * q_stride, false, nullptr);
  }
}

KvMemory DenseKv::memory() const {
  const KvFootprint f = plan_footprint(plan_, n_.empty() ? 0 : n_[0]);
  KvMemory m;
  m.gpu_bytes_per_token = f.gpu_bytes_per_token;
  m.gpu_bytes = f.gpu_bytes;
  return m;
}

std::unique_ptr<KvCache> make_kv_cache(const KvPlan& plan, const Device& dev) {
  if (plan.dense) return std::make_unique<DenseKv>(plan, dev);
  return std::make_unique<TieredKv>(plan, dev);
}

}  // namespace kvtier
