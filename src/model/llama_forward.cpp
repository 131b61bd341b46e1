// The forward pass of the Llama family, as straight-line op calls over the
// scratch buffers (STYLE rule 1). Qwen2 adds q/k/v biases, Qwen3 RMSNorm over
// each head of q and k before RoPE; the MoE layers of Qwen3-MoE and Mixtral
// replace the SwiGLU block by the mixture of experts (ops/moe).
#include <cmath>
#include <cstring>
#include <functional>

#include "core/status.h"
#include "core/threads.h"
#include "model/model.h"
#include "ops/dequant/dequant.h"
#include "ops/rmsnorm/rmsnorm.h"
#include "ops/swiglu/swiglu.h"

namespace kvtier {
namespace {

void add_bias(float* y, const std::vector<float>& b, int n_tok) {
  if (b.empty()) return;
  const size_t n = b.size();
  for (int t = 0; t < n_tok; ++t)
    for (size_t i = 0; i < n; ++i) y[t * n + i] += b[i];
}

}  // namespace

void Model::forward(const int32_t* tokens, int n_tok, int64_t pos0, KvCache& kv, ForwardScratch& s,
                    int n_logits, float* logits) const {
  const ModelConfig& c = source_.config;
  KVT_CHECK(n_tok > 0 && n_tok <= s.capacity, "forward: {} tokens, scratch holds {}", n_tok,
            s.capacity);
  KVT_CHECK(n_logits >= 0 && n_logits <= n_tok, "forward: n_logits {} out of [0, {}]", n_logits, n_tok);
  check_cpu_cache(kv);
  kv.begin_step(n_tok);
  for (int t = 0; t < n_tok; ++t) s.positions[size_t(t)] = pos0 + t;
  const int q_dim = c.n_head * c.head_dim, kv_dim = c.n_kv_head * c.head_dim;
  const float att_scale = 1.0f / std::sqrt(float(c.head_dim));
  run_layers(tokens, n_tok, s, [&](int l) {
    kv.append(l, s.k_pre.data(), s.k.data(), s.v.data(), kv_dim, n_tok);
    kv.attend(l, s.q.data(), q_dim, n_tok, att_scale, s.att.data());  // att: [n_tok, n_head, hd]
  }, n_logits, logits);
}

void Model::forward_decode(const int32_t* tokens, const int64_t* pos, KvCache* const* kvs, int n_seq,
                           ForwardScratch& s, float* logits) const {
  const ModelConfig& c = source_.config;
  KVT_CHECK(n_seq > 0 && n_seq <= s.capacity, "forward_decode: {} sequences, scratch holds {}", n_seq,
            s.capacity);
  for (int i = 0; i < n_seq; ++i) {
    check_cpu_cache(*kvs[i]);
    kvs[i]->begin_step(1);
    s.positions[size_t(i)] = pos[i];
  }
  const int q_dim = c.n_head * c.head_dim, kv_dim = c.n_kv_head * c.head_dim;
  const float att_scale = 1.0f / std::sqrt(float(c.head_dim));
  run_layers(tokens, n_seq, s, [&](int l) {
    // Row i is sequence i's token: it attends through its own cache alone.
    for (int i = 0; i < n_seq; ++i) {
      const size_t kv_at = size_t(i) * kv_dim, q_at = size_t(i) * q_dim;
      kvs[i]->append(l, &s.k_pre[kv_at], &s.k[kv_at], &s.v[kv_at], kv_dim, 1);
      kvs[i]->attend(l, &s.q[q_at], q_dim, 1, att_scale, &s.att[q_at]);
    }
  }, n_seq, logits);
}

void Model::check_cpu_cache(const KvCache& kv) const {
  KVT_CHECK(kv.plan().device == DeviceKind::cpu, "forward: the KV cache lives on {}", device_name(kv.plan().device));
  KVT_CHECK(!source_.shape_only, "{}: a model shape has no weights; it runs with random weights on the GPU "
            "(--device cuda)", source_.path);
}

void Model::run_layers(const int32_t* tokens, int n_tok, ForwardScratch& s, const std::function<void(int)>& attend,
                       int n_logits, float* logits) const {
  const ModelConfig& c = source_.config;
  ThreadPool& pool = default_pool();
  const int E = c.n_embd, hd = c.head_dim;
  const size_t emb_row = ggml_row_bytes(tok_embd_->type, E);

  // x: [n_tok, n_embd] residual stream
  for (int t = 0; t < n_tok; ++t) {
    KVT_CHECK(tokens[t] >= 0 && tokens[t] < tok_embd_->shape[0], "token id {} out of vocabulary ({})",
              tokens[t], tok_embd_->shape[0]);
    dequantize_row(tok_embd_->type, tok_embd_->data + size_t(tokens[t]) * emb_row, &s.x[size_t(t) * E], E);
  }

  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = layers_[size_t(l)];
    // Attention block.
    rmsnorm(s.x.data(), L.attn_norm.data(), n_tok, E, c.rms_eps, s.xb.data());
    {
      // q: [n_tok, n_head, hd], k and v: [n_tok, n_kv_head, hd]
      const WeightView* ws[3] = {&L.wq, &L.wk, &L.wv};
      float* ys[3] = {s.q.data(), s.k.data(), s.v.data()};
      matmul_group(ws, ys, 3, s.xb.data(), n_tok, pool);
    }
    add_bias(s.q.data(), L.bq, n_tok);
    add_bias(s.k.data(), L.bk, n_tok);
    add_bias(s.v.data(), L.bv, n_tok);
    if (!L.q_norm.empty()) rmsnorm(s.q.data(), L.q_norm.data(), int64_t(n_tok) * c.n_head, hd, c.rms_eps, s.q.data());
    if (!L.k_norm.empty()) rmsnorm(s.k.data(), L.k_norm.data(), int64_t(n_tok) * c.n_kv_head, hd, c.rms_eps, s.k.data());
    std::memcpy(s.k_pre.data(), s.k.data(), sizeof(float) * size_t(n_tok) * c.n_kv_head * hd);
    rope_->apply(s.q.data(), n_tok, c.n_head, s.positions.data());
    rope_->apply(s.k.data(), n_tok, c.n_kv_head, s.positions.data());
    attend(l);  // k_pre, k, v → the cache(s); q → att: [n_tok, n_head, hd]
    matmul(L.wo, s.att.data(), n_tok, s.xb.data(), pool);
    for (size_t i = 0; i < size_t(n_tok) * E; ++i) s.x[i] += s.xb[i];

    // Feed-forward block: the mixture of experts, or one SwiGLU.
    rmsnorm(s.x.data(), L.ffn_norm.data(), n_tok, E, c.rms_eps, s.xb.data());
    const float* ffn_out = s.xb.data();  // [n_tok, n_embd]
    if (c.is_moe_layer(l)) {
      moe_ffn(L.moe, moe_, s.xb.data(), n_tok, s.moe_out.data(), s.moe, pool);
      ffn_out = s.moe_out.data();
    } else {
      {
        // gate, up: [n_tok, n_ff]
        const WeightView* ws[2] = {&L.w_gate, &L.w_up};
        float* ys[2] = {s.gate.data(), s.up.data()};
        matmul_group(ws, ys, 2, s.xb.data(), n_tok, pool);
      }
      swiglu(s.gate.data(), s.up.data(), int64_t(n_tok) * c.n_ff, s.gate.data());
      matmul(L.w_down, s.gate.data(), n_tok, s.xb.data(), pool);
    }
    for (size_t i = 0; i < size_t(n_tok) * E; ++i) s.x[i] += ffn_out[i];
  }

  if (n_logits == 0) return;
  float* last = &s.x[size_t(n_tok - n_logits) * E];  // [n_logits, n_embd]
  rmsnorm(last, output_norm_.data(), n_logits, E, c.rms_eps, last);
  matmul(output_, last, n_logits, logits, pool);  // [n_logits, n_vocab]
}

}  // namespace kvtier
