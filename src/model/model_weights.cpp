// Weight binding: every tensor the forward pass reads, checked and viewed.
#include <fmt/format.h>

#include "core/status.h"
#include "model/model.h"
#include "ops/dequant/dequant.h"

namespace kvtier {

WeightView Model::view_matrix(const std::string& name) {
  const TensorRef& t = source_.tensor(name);
  KVT_CHECK(t.shape.size() == 2, "{}: expected a matrix, found {} dims", t.source, t.shape.size());
  WeightView w;
  w.n_out = t.shape[0];
  w.n_in = t.shape[1];
  if (matmul_supports(t.type)) {
    w.type = t.type;
    w.data = t.data;
    w.row_bytes = ggml_row_bytes(t.type, w.n_in);
    KVT_CHECK(w.row_bytes * size_t(w.n_out) <= t.n_bytes, "{}: {} bytes, expected {}", t.source,
              t.n_bytes, w.row_bytes * size_t(w.n_out));
    return w;
  }
  // Types without a native product (F16, BF16, K-quants...) become f32.
  owned_.emplace_back(size_t(w.n_out * w.n_in));
  auto& buf = owned_.back();
  const size_t src_row = ggml_row_bytes(t.type, w.n_in);
  for (int64_t r = 0; r < w.n_out; ++r)
    dequantize_row(t.type, t.data + size_t(r) * src_row, &buf[size_t(r * w.n_in)], w.n_in);
  w.type = GgmlType::F32;
  w.data = buf.data();
  w.row_bytes = size_t(w.n_in) * sizeof(float);
  return w;
}

std::vector<float> Model::load_vector(const std::string& name, int64_t expected) {
  const TensorRef& t = source_.tensor(name);
  KVT_CHECK(t.n_elements() == expected, "{}: {} values, expected {}", t.source, t.n_elements(),
            expected);
  std::vector<float> v(static_cast<size_t>(expected));
  dequantize_row(t.type, t.data, v.data(), expected);
  return v;
}

std::vector<float> Model::maybe_vector(const std::string& name, int64_t expected) {
  return source_.find(name) ? load_vector(name, expected) : std::vector<float>{};
}

Model::Model(ModelSource source) : source_(std::move(source)) {
  const ModelConfig& c = source_.config;
  KVT_CHECK(c.n_layer > 0 && c.n_head > 0 && c.n_kv_head > 0 && c.head_dim > 0 &&
                c.n_head % c.n_kv_head == 0,
            "{}: inconsistent heads (n_head {}, n_kv_head {}, head_dim {})", source_.path, c.n_head,
            c.n_kv_head, c.head_dim);
  const int64_t q_dim = int64_t(c.n_head) * c.head_dim, kv_dim = int64_t(c.n_kv_head) * c.head_dim;
  if (c.is_moe()) moe_ = moe_config(c);
  if (source_.shape_only) {  // no weights: the GPU model makes random ones (speed runs)
    rope_ = std::make_unique<Rope>(c);
    return;
  }
  layers_.resize(size_t(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    auto name = [l](const char* what) { return fmt::format("blk.{}.{}", l, what); };
    LayerWeights& L = layers_[size_t(l)];
    L.attn_norm = load_vector(name("attn_norm.weight"), c.n_embd);
    L.wq = view_matrix(name("attn_q.weight"));
    L.wk = view_matrix(name("attn_k.weight"));
    L.wv = view_matrix(name("attn_v.weight"));
    L.wo = view_matrix(name("attn_output.weight"));
    L.bq = maybe_vector(name("attn_q.bias"), q_dim);
    L.bk = maybe_vector(name("attn_k.bias"), kv_dim);
    L.bv = maybe_vector(name("attn_v.bias"), kv_dim);
    L.q_norm = maybe_vector(name("attn_q_norm.weight"), c.head_dim);
    L.k_norm = maybe_vector(name("attn_k_norm.weight"), c.head_dim);
    L.ffn_norm = load_vector(name("ffn_norm.weight"), c.n_embd);
    if (c.is_moe_layer(l)) {
      L.moe = view_experts(source_, l);
      L.moe.router = view_matrix(name("ffn_gate_inp.weight"));  // small: f32 unless matmul runs its type
    } else {
      L.w_gate = view_matrix(name("ffn_gate.weight"));
      L.w_up = view_matrix(name("ffn_up.weight"));
      L.w_down = view_matrix(name("ffn_down.weight"));
    }
    KVT_CHECK(L.wq.n_out == q_dim && L.wq.n_in == c.n_embd && L.wk.n_out == kv_dim &&
                  L.wv.n_out == kv_dim && L.wo.n_in == q_dim && L.wo.n_out == c.n_embd &&
                  (c.is_moe_layer(l) || (L.w_gate.n_out == c.n_ff && L.w_down.n_in == c.n_ff)),
              "{}: layer {} weight shapes do not match the config", source_.path, l);
  }
  tok_embd_ = &source_.tensor("token_embd.weight");
  KVT_CHECK(tok_embd_->shape.size() == 2 && tok_embd_->shape[1] == c.n_embd,
            "{}: token_embd.weight must be [n_vocab, {}]", source_.path, c.n_embd);
  output_norm_ = load_vector("output_norm.weight", c.n_embd);
  output_ = view_matrix(source_.find("output.weight") ? "output.weight" : "token_embd.weight");
  std::vector<float> freq_divisors;
  if (source_.find("rope_freqs.weight")) freq_divisors = load_vector("rope_freqs.weight", c.head_dim / 2);
  rope_ = std::make_unique<Rope>(c, std::move(freq_divisors));
}

KvGeometry Model::kv_geometry() const {
  const ModelConfig& c = source_.config;
  KvGeometry g{c.n_layer, c.n_head, c.n_kv_head, c.head_dim};
  // Policies that rebuild post-RoPE keys (shadowkv's SVD, keys_prerope) use
  // the model's own RoPE; the Rope outlives every KV store of this model.
  const Rope* rope = rope_.get();
  const int n_kv_head = c.n_kv_head;
  g.apply_rope = [rope, n_kv_head](float* k, const int64_t* pos, int64_t n) {
    rope->apply(k, n, n_kv_head, pos);
  };
  g.rope_inv_freq = rope->inv_freq();
  g.rope_interleaved = c.rope_interleaved;
  return g;
}

ForwardScratch Model::make_scratch(int capacity) const {
  const ModelConfig& c = source_.config;
  ForwardScratch s;
  s.capacity = capacity;
  const size_t n = size_t(capacity);
  s.x.resize(n * c.n_embd);
  s.xb.resize(n * c.n_embd);
  s.q.resize(n * c.n_head * c.head_dim);
  s.att.resize(n * c.n_head * c.head_dim);
  s.k.resize(n * c.n_kv_head * c.head_dim);
  s.k_pre.resize(s.k.size());
  s.v.resize(s.k.size());
  bool any_dense = false;
  for (int l = 0; l < c.n_layer; ++l) any_dense = any_dense || !c.is_moe_layer(l);
  if (any_dense) {
    s.gate.resize(n * c.n_ff);
    s.up.resize(n * c.n_ff);
  }
  if (c.is_moe()) s.moe_out.resize(n * c.n_embd);
  s.positions.resize(n);
  return s;
}

}  // namespace kvtier
