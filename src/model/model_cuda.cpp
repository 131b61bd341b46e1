// GpuModel on CUDA: the per-sequence forward pass, straight-line op calls
// mirroring Model::forward (src/model/llama_forward.cpp); the weights are
// uploaded (dequantized to bf16) by model_weights_cuda.cpp. Differences from
// the CPU path, all from the storage type: activations and the residual
// stream are bf16 between ops (f32 math inside each op); logits are f32. MoE
// layers (Qwen3-MoE, Mixtral) run ops/moe/moe_cuda.h instead of the SwiGLU
// block.
#include "model/model_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "model/model_cuda_detail.h"
#include "ops/argmax/argmax_cuda.h"
#include "ops/embed/embed_cuda.h"
#include "ops/gemm/gemm_fp8_cuda.h"
#include "ops/rmsnorm/rmsnorm_cuda.h"
#include "ops/rope/qkv_split_cuda.h"
#include "ops/rope/rope_cuda.h"
#include "ops/swiglu/swiglu_cuda.h"

namespace kvtier {
namespace model_cuda_detail {

// Rows of logits a sequence's buffers start with (a GPU decode batch's).
constexpr int kInitialLogitRows = 256;

CudaSequence::~CudaSequence() {
  if (graph_) cudaGraphExecDestroy(graph_);
}

CudaSequence::CudaSequence(CudaModel& m, int capacity)
    : m_(m),
      c_(m.c_),
      cap_(capacity),
      q_dim_(int64_t(m.c_.n_head) * m.c_.head_dim),
      kv_dim_(int64_t(m.c_.n_kv_head) * m.c_.head_dim),
      s_(static_cast<cudaStream_t>(m.dev_.exec().stream)),
      groups_(m.dev_) {
  KVT_CHECK(capacity > 0, "GPU sequence: capacity {} must be positive", capacity);
  // The activations a forward of `capacity` tokens needs exist from the
  // start, so that a sequence that cannot run fails here, not mid-prompt.
  std::lock_guard lk(m_.forward_mu_);
  activations(capacity, std::min(capacity, kInitialLogitRows));
}

Activations& CudaModel::activations(int rows, int logit_rows) {
  Activations& a = act_;
  if (rows <= a.cap && logit_rows <= a.logit_rows) return a;
  KVT_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(dev_.exec().stream)));  // queued work may use them
  ++a.generation;
  if (rows > a.cap) {
    const size_t n = size_t(rows), E = size_t(c_.n_embd), bf = 2;
    const size_t q_dim = size_t(c_.n_head) * size_t(c_.head_dim), kv_dim = size_t(c_.n_kv_head) * size_t(c_.head_dim);
    // The old buffers go first, so that growing needs only the new size free.
    for (DeviceBuffer* b :
         {&a.ids, &a.pos, &a.x, &a.xb, &a.delta, &a.q, &a.k_pre, &a.k, &a.v, &a.qkv, &a.att, &a.gu, &a.h, &a.x8,
          &a.x8_scale})
      *b = DeviceBuffer();
    a.moe.reset();
    a.cap = 0;
    a.ids = DeviceBuffer(n * 4);
    a.pos = DeviceBuffer(n * 8);
    a.x = DeviceBuffer(n * E * bf);
    a.xb = DeviceBuffer(n * E * bf);
    a.delta = DeviceBuffer(n * E * bf);
    a.q = DeviceBuffer(n * q_dim * bf);
    a.k_pre = DeviceBuffer(n * kv_dim * bf);
    a.k = DeviceBuffer(n * kv_dim * bf);
    a.v = DeviceBuffer(n * kv_dim * bf);
    a.qkv = DeviceBuffer(n * (q_dim + 2 * kv_dim) * bf);
    a.att = DeviceBuffer(n * q_dim * bf);
    bool any_dense = false;  // MoE models may have no SwiGLU layer at all
    for (int l = 0; l < c_.n_layer; ++l) any_dense = any_dense || !c_.is_moe_layer(l);
    if (any_dense) {
      a.gu = DeviceBuffer(n * 2 * size_t(c_.n_ff) * bf);
      a.h = DeviceBuffer(n * size_t(c_.n_ff) * bf);
    }
    if (prefill_fp8_) {
      a.x8 = DeviceBuffer(n * std::max({E, q_dim, any_dense ? size_t(c_.n_ff) : size_t(0)}));
      a.x8_scale = DeviceBuffer(n * 4);
    }
    if (c_.is_moe()) a.moe = std::make_unique<cuda::MoeRunner>(moe_config(c_), rows);
    a.h_ids = PinnedBuffer(n * 4);
    a.h_pos = PinnedBuffer(n * 8);
    a.cap = rows;
  }
  if (logit_rows > a.logit_rows) {
    // A prompt chunk needs one row of logits (prompt scoring and Engine::logits
    // more): [capacity, n_vocab] f32 would be 8.4 GB at 16K tokens of a 128K vocabulary.
    a.logits = DeviceBuffer();
    a.h_logits = PinnedBuffer();
    a.logit_rows = 0;
    a.logits = DeviceBuffer(size_t(logit_rows) * size_t(c_.n_vocab) * 4);
    a.h_logits = PinnedBuffer(size_t(logit_rows) * size_t(c_.n_vocab) * 4);
    a.argmax = DeviceBuffer(size_t(logit_rows) * 4);
    a.h_argmax = PinnedBuffer(size_t(logit_rows) * 4);
    a.logit_rows = logit_rows;
  }
  return a;
}

Activations& CudaSequence::activations(int n_tok, int n_logits) {
  Activations& a = m_.activations(n_tok, n_logits);
  if (a.generation != act_generation_) {  // a captured graph reads buffers that moved
    if (graph_) cudaGraphExecDestroy(graph_);
    graph_ = nullptr;
    graph_key_ = warm_key_ = 0;
    act_generation_ = a.generation;
  }
  return a;
}

void CudaSequence::forward(const int32_t* tokens, int n_tok, int64_t pos0, KvCache& kv, int n_logits,
                           float* logits) {
  const ModelConfig& c = c_;
  KVT_CHECK(n_tok > 0 && n_tok <= cap_, "GPU forward: {} tokens, the sequence holds {}", n_tok, cap_);
  KVT_CHECK(n_logits >= 0 && n_logits <= n_tok, "GPU forward: n_logits {} out of [0, {}]", n_logits, n_tok);
  check_cache(kv, pos0);
  for (int t = 0; t < n_tok; ++t)
    KVT_CHECK(tokens[t] >= 0 && tokens[t] < c.n_vocab, "token id {} out of vocabulary ({})", tokens[t], c.n_vocab);
  std::lock_guard lk(m_.forward_mu_);
  Activations& a = activations(n_tok, n_logits);
  auto* hi = a.h_ids.host<int32_t>();
  auto* hp = a.h_pos.host<int64_t>();
  for (int t = 0; t < n_tok; ++t) {
    hi[t] = tokens[t];
    hp[t] = pos0 + t;
  }
  kv.begin_step(n_tok);
  KvCache* kvp = &kv;
  // A decode step replays the graph of the last one when nothing it reads moved.
  const bool graph = m_.graphs_ && n_tok == 1 && n_logits == 1 && kv.decoding() && kv.graph_safe();
  if (graph) {
    const uint64_t key = (kv.graph_token() + 1) * 0x9E3779B97F4A7C15ull ^ uint64_t(reinterpret_cast<uintptr_t>(&kv));
    if (graph_ && key == graph_key_) {
      KVT_CUDA_CHECK(cudaGraphLaunch(graph_, s_));
    } else if (key == warm_key_) {
      capture_and_launch(a, n_tok, &kvp, 1, n_logits);
      graph_key_ = key;
    } else {  // the first step after a change runs eagerly: lazy allocations happen outside a capture
      run(a, n_tok, &kvp, 1, n_logits);
      warm_key_ = key;
    }
  } else {
    run(a, n_tok, &kvp, 1, n_logits);
  }
  const size_t bytes = size_t(n_logits) * size_t(c.n_vocab) * 4;
  if (n_logits > 0)
    KVT_CUDA_CHECK(cudaMemcpyAsync(a.h_logits.host(), a.logits.data(), bytes, cudaMemcpyDeviceToHost, s_));
  KVT_CUDA_CHECK(cudaStreamSynchronize(s_));
  if (n_logits > 0) std::memcpy(logits, a.h_logits.host(), bytes);
}

void CudaSequence::forward_decode(const int32_t* tokens, const int64_t* pos, KvCache* const* kvs, int n_seq,
                                  float* logits, int32_t* greedy, const uint8_t* want_logits) {
  const ModelConfig& c = c_;
  KVT_CHECK(n_seq > 0 && n_seq <= cap_, "GPU batch: {} sequences, the batch holds {}", n_seq, cap_);
  std::vector<const KvCache*> seen(kvs, kvs + n_seq);
  std::sort(seen.begin(), seen.end());
  KVT_CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end(), "GPU batch: a KV cache appears twice");
  for (int i = 0; i < n_seq; ++i) {
    KVT_CHECK(kvs[i], "GPU batch: sequence {} has no KV cache", i);
    check_cache(*kvs[i], pos[i]);
    KVT_CHECK(tokens[i] >= 0 && tokens[i] < c.n_vocab, "token id {} out of vocabulary ({})", tokens[i], c.n_vocab);
  }
  std::lock_guard lk(m_.forward_mu_);
  Activations& a = activations(n_seq, n_seq);
  groups_.arrange(kvs, n_seq);  // row j of the forward is sequence order()[j]
  const std::vector<int>& order = groups_.order();
  std::vector<KvCache*> rows(static_cast<size_t>(n_seq), nullptr);
  auto* hi = a.h_ids.host<int32_t>();
  auto* hp = a.h_pos.host<int64_t>();
  for (int j = 0; j < n_seq; ++j) {
    const int i = order[size_t(j)];
    rows[size_t(j)] = kvs[i];
    hi[j] = tokens[i];
    hp[j] = pos[i];
  }
  groups_.begin_step(rows.data(), n_seq);
  // The batch replays the graph of its last step while the same caches
  // step together in the same order and none of them moved (the solo rule,
  // per cache and per group).
  bool graph = m_.graphs_;
  uint64_t key = 0x9E3779B97F4A7C15ull * uint64_t(n_seq);
  for (int j = 0; j < n_seq && graph; ++j) {
    KvCache* kv = rows[size_t(j)];
    graph = kv->decoding() && kv->graph_safe();
    key = (key ^ (kv->graph_token() + 1)) * 0x100000001B3ull ^ uint64_t(reinterpret_cast<uintptr_t>(kv));
  }
  key = groups_.graph_key(key);
  if (graph && graph_ && key == graph_key_) {
    KVT_CUDA_CHECK(cudaGraphLaunch(graph_, s_));
  } else if (graph && key == warm_key_) {
    capture_and_launch(a, n_seq, rows.data(), n_seq, n_seq);
    graph_key_ = key;
  } else {  // eager: the first step of a new batch (lazy allocations happen outside a capture)
    run(a, n_seq, rows.data(), n_seq, n_seq);
    warm_key_ = graph ? key : 0;
  }
  // Only the rows that are wanted cross to the host (a greedy sequence's
  // token is its row's argmax, already on its way in h_argmax).
  const size_t row_bytes = size_t(c.n_vocab) * 4;
  for (int j = 0; j < n_seq; ++j)
    if (!want_logits || want_logits[order[size_t(j)]])
      KVT_CUDA_CHECK(cudaMemcpyAsync(a.h_logits.host<uint8_t>() + size_t(j) * row_bytes,
                                     a.logits.data<uint8_t>() + size_t(j) * row_bytes, row_bytes,
                                     cudaMemcpyDeviceToHost, s_));
  KVT_CUDA_CHECK(cudaStreamSynchronize(s_));
  for (int j = 0; j < n_seq; ++j) {
    const int i = order[size_t(j)];
    if (greedy) greedy[i] = a.h_argmax.host<int32_t>()[j];
    if (!want_logits || want_logits[i])
      std::memcpy(logits + size_t(i) * c.n_vocab, a.h_logits.host<uint8_t>() + size_t(j) * row_bytes, row_bytes);
  }
}

void CudaSequence::check_cache(const KvCache& kv, int64_t pos) const {
  KVT_CHECK(kv.plan().device == DeviceKind::cuda, "GPU forward: the KV cache lives on {}",
            device_name(kv.plan().device));
  KVT_CHECK(pos == kv.n_tokens(0), "GPU forward: position {} but the cache holds {} tokens", pos, kv.n_tokens(0));
}

void CudaSequence::capture_and_launch(Activations& a, int n_tok, KvCache* const* kvs, int n_kv, int n_logits) {
  cudaGraph_t g = nullptr;
  KVT_CUDA_CHECK(cudaStreamBeginCapture(s_, cudaStreamCaptureModeThreadLocal));
  try {
    run(a, n_tok, kvs, n_kv, n_logits);
  } catch (...) {
    cudaStreamEndCapture(s_, &g);
    if (g) cudaGraphDestroy(g);
    throw;
  }
  KVT_CUDA_CHECK(cudaStreamEndCapture(s_, &g));
  if (graph_) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(graph_, g, &info) != cudaSuccess) {
      cudaGetLastError();
      cudaGraphExecDestroy(graph_);
      graph_ = nullptr;
    }
  }
  if (!graph_) KVT_CUDA_CHECK(cudaGraphInstantiate(&graph_, g, 0));
  cudaGraphDestroy(g);
  KVT_CUDA_CHECK(cudaGraphLaunch(graph_, s_));
}

void CudaSequence::run(Activations& a, int n_tok, KvCache* const* kvs, int n_kv, int n_logits) {
  const ModelConfig& c = c_;
  KVT_CHECK(n_kv == 1 || n_kv == n_tok, "GPU forward: {} caches for {} tokens", n_kv, n_tok);
  KVT_CUDA_CHECK(cudaMemcpyAsync(a.ids.data(), a.h_ids.host(), size_t(n_tok) * 4, cudaMemcpyHostToDevice, s_));
  KVT_CUDA_CHECK(cudaMemcpyAsync(a.pos.data(), a.h_pos.host(), size_t(n_tok) * 8, cudaMemcpyHostToDevice, s_));
  const int E = c.n_embd, hd = c.head_dim;
  const float scale = 1.0f / std::sqrt(float(hd));
  cuda::Gemm& gemm = m_.gemm_;
  // A prompt chunk's weight products in FP8 (PrefillGemm::fp8): each input is
  // quantized once per token row, then multiplied by the matrices' FP8 copies.
  // Decode steps (the cache decoding, or a batch of sequences) stay bf16.
  const bool fp8 = m_.prefill_fp8_ && n_kv == 1 && !kvs[0]->decoding();
  auto quantize = [&](const void* x, int64_t k) {
    cuda::quantize_rows_fp8(x, n_tok, k, 0, a.x8.data<uint8_t>(), a.x8_scale.data<float>(), s_);
  };
  auto gemm8 = [&](int64_t n, int64_t k, const Fp8Matrix& w, void* y) {
    cuda::gemm_fp8(gemm, n_tok, n, k, a.x8.data<uint8_t>(), a.x8_scale.data<float>(), w.q.data<uint8_t>(),
                   w.scale.data<float>(), y, s_);
  };
  cuda::embed_rows(m_.tok_embd_.data(), a.ids.data<int32_t>(), n_tok, E, a.x.data(), s_);
  const void* delta = nullptr;  // the previous block's output, added to x by the next norm
  for (int l = 0; l < c.n_layer; ++l) {
    const GpuLayer& L = m_.layers_[size_t(l)];
    // Attention block.
    cuda::add_rmsnorm(a.x.data(), delta, L.attn_norm.data(), n_tok, E, c.rms_eps, a.xb.data(), s_);
    // RoPE right after the product, unless biases or q/k norms come between.
    const bool rope_now =
        !fp8 && !L.bq.bytes() && !L.bk.bytes() && !L.bv.bytes() && !L.q_norm.bytes() && !L.k_norm.bytes();
    if (fp8) {
      quantize(a.xb.data(), E);
      gemm8(q_dim_, E, L.wq8, a.q.data());
      gemm8(kv_dim_, E, L.wk8, a.k_pre.data());
      gemm8(kv_dim_, E, L.wv8, a.v.data());
    } else {  // q|k|v in one product, then apart: q [n_tok, n_head, hd], k_pre and v [n_tok, n_kv_head, hd]
      gemm.run(n_tok, q_dim_ + 2 * kv_dim_, E, a.xb.data(), L.wqkv.data(), a.qkv.data(), s_);
      cuda::qkv_split(a.qkv.data(), n_tok, int(q_dim_), int(kv_dim_), hd, a.q.data(), a.k_pre.data(), a.v.data(),
                      a.k.data(), rope_now ? a.pos.data<int64_t>() : nullptr, m_.inv_freq_.data<float>(),
                      c.rope_interleaved, s_);
    }
    if (!rope_now) {
      if (L.bq.bytes()) cuda::add_bias(a.q.data(), L.bq.data<float>(), n_tok, int(q_dim_), s_);
      if (L.bk.bytes()) cuda::add_bias(a.k_pre.data(), L.bk.data<float>(), n_tok, int(kv_dim_), s_);
      if (L.bv.bytes()) cuda::add_bias(a.v.data(), L.bv.data<float>(), n_tok, int(kv_dim_), s_);
      if (L.q_norm.bytes())
        cuda::add_rmsnorm(a.q.data(), nullptr, L.q_norm.data(), int64_t(n_tok) * c.n_head, hd, c.rms_eps, a.q.data(),
                          s_);
      if (L.k_norm.bytes())
        cuda::add_rmsnorm(a.k_pre.data(), nullptr, L.k_norm.data(), int64_t(n_tok) * c.n_kv_head, hd, c.rms_eps,
                          a.k_pre.data(), s_);
      KVT_CUDA_CHECK(cudaMemcpyAsync(a.k.data(), a.k_pre.data(), size_t(n_tok) * size_t(kv_dim_) * 2,
                                     cudaMemcpyDeviceToDevice, s_));
      cuda::rope(a.q.data(), n_tok, q_dim_, c.n_head, hd, a.pos.data<int64_t>(), m_.inv_freq_.data<float>(),
                 c.rope_interleaved, s_);
      cuda::rope(a.k.data(), n_tok, kv_dim_, c.n_kv_head, hd, a.pos.data<int64_t>(), m_.inv_freq_.data<float>(),
                 c.rope_interleaved, s_);
    }
    if (n_kv == 1) {
      kvs[0]->append(l, a.k_pre.data(), a.k.data(), a.v.data(), kv_dim_, n_tok);
      kvs[0]->attend(l, a.q.data(), q_dim_, n_tok, scale, a.att.data());  // att: [n_tok, n_head, hd]
    } else {  // a batch of steps: row i through sequence i's cache, a group's rows through its DecodeBatch
      for (int i = 0; i < n_kv;) {
        const size_t kv_row = size_t(i) * size_t(kv_dim_), q_row = size_t(i) * size_t(q_dim_);
        const uint16_t *kp = a.k_pre.data<uint16_t>() + kv_row, *k = a.k.data<uint16_t>() + kv_row,
                       *v = a.v.data<uint16_t>() + kv_row, *q = a.q.data<uint16_t>() + q_row;
        uint16_t* out = a.att.data<uint16_t>() + q_row;
        if (const DecodeGroups::Group* g = groups_.starting_at(i)) {
          g->batch->append(l, kp, k, v, kv_dim_);
          g->batch->attend(l, q, scale, out);
          i += g->n;
        } else {
          kvs[i]->append(l, kp, k, v, kv_dim_, 1);
          kvs[i]->attend(l, q, q_dim_, 1, scale, out);
          ++i;
        }
      }
    }
    if (fp8) {
      quantize(a.att.data(), q_dim_);
      gemm8(E, q_dim_, L.wo8, a.delta.data());
    } else {
      gemm.run(n_tok, E, q_dim_, a.att.data(), L.wo.data(), a.delta.data(), s_);
    }

    // Feed-forward block: the mixture of experts, or one SwiGLU.
    cuda::add_rmsnorm(a.x.data(), a.delta.data(), L.ffn_norm.data(), n_tok, E, c.rms_eps, a.xb.data(), s_);
    if (c.is_moe_layer(l)) {
      a.moe->run(L.moe(), a.xb.data(), n_tok, a.delta.data(), gemm, s_);  // [n_tok, n_embd]
    } else if (fp8) {
      quantize(a.xb.data(), E);  // gate|up unscaled: SwiGLU applies the scales as it reads them
      gemm.run_fp8_codes(n_tok, 2 * int64_t(c.n_ff), E, a.x8.data<uint8_t>(), L.w_gate_up8.q.data<uint8_t>(),
                         a.gu.data(), s_);
      cuda::swiglu(a.gu.data(), n_tok, c.n_ff, a.h.data(), s_, a.x8_scale.data<float>(),
                   L.w_gate_up8.scale.data<float>());
      quantize(a.h.data(), c.n_ff);
      gemm8(E, c.n_ff, L.w_down8, a.delta.data());
    } else {
      gemm.run(n_tok, 2 * int64_t(c.n_ff), E, a.xb.data(), L.w_gate_up.data(), a.gu.data(), s_);  // [n_tok, 2 n_ff]
      cuda::swiglu(a.gu.data(), n_tok, c.n_ff, a.h.data(), s_);                                   // [n_tok, n_ff]
      gemm.run(n_tok, E, c.n_ff, a.h.data(), L.w_down.data(), a.delta.data(), s_);
    }
    delta = a.delta.data();
  }
  if (n_logits > 0) {
    cuda::add_rmsnorm(a.x.data(), delta, m_.out_norm_.data(), n_tok, E, c.rms_eps, a.xb.data(), s_);
    const uint16_t* last = a.xb.data<uint16_t>() + size_t(n_tok - n_logits) * size_t(E);  // [n_logits, n_embd]
    const void* head = m_.output_.bytes() ? m_.output_.data() : m_.tok_embd_.data();
    gemm.run_f32(n_logits, c.n_vocab, E, last, head, a.logits.data<float>(), s_);  // [n_logits, n_vocab]
    // The rows' greedy tokens; the logits are copied by the caller, the rows it needs.
    cuda::argmax_rows(a.logits.data<float>(), n_logits, c.n_vocab, a.argmax.data<int32_t>(), s_);
    KVT_CUDA_CHECK(
        cudaMemcpyAsync(a.h_argmax.host(), a.argmax.data(), size_t(n_logits) * 4, cudaMemcpyDeviceToHost, s_));
  }
}

CudaModel::~CudaModel() = default;

std::unique_ptr<GpuSequence> CudaModel::start(int capacity) { return std::make_unique<CudaSequence>(*this, capacity); }

void CudaModel::forward_decode(const int32_t* tokens, const int64_t* pos, KvCache* const* kvs, int n_seq,
                               float* logits, int32_t* greedy, const uint8_t* want_logits) {
  KVT_CHECK(n_seq > 0, "GPU batch: {} sequences", n_seq);
  if (n_seq > batch_cap_) {
    const int cap = std::max({n_seq, 8, 2 * batch_cap_});
    batch_.reset();
    batch_ = std::make_unique<CudaSequence>(*this, cap);
    batch_cap_ = cap;
  }
  batch_->forward_decode(tokens, pos, kvs, n_seq, logits, greedy, want_logits);
}

}  // namespace model_cuda_detail

std::unique_ptr<GpuModel> make_gpu_model(const Model& model, bool graphs, PrefillGemm prefill_gemm) {
  KVT_CHECK(cuda_device_count() > 0, "--device cuda: no CUDA device found ({})", cuda_device_summary());
  return std::make_unique<model_cuda_detail::CudaModel>(model, graphs, prefill_gemm);
}

}  // namespace kvtier
