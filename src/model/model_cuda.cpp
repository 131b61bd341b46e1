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
#include "ops/embed/embed_cuda.h"
#include "ops/rmsnorm/rmsnorm_cuda.h"
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
  const size_t n = size_t(capacity), E = size_t(c_.n_embd), bf = 2;
  ids_ = DeviceBuffer(n * 4);
  pos_ = DeviceBuffer(n * 8);
  x_ = DeviceBuffer(n * E * bf);
  xb_ = DeviceBuffer(n * E * bf);
  delta_ = DeviceBuffer(n * E * bf);
  q_ = DeviceBuffer(n * size_t(q_dim_) * bf);
  k_pre_ = DeviceBuffer(n * size_t(kv_dim_) * bf);
  k_ = DeviceBuffer(n * size_t(kv_dim_) * bf);
  v_ = DeviceBuffer(n * size_t(kv_dim_) * bf);
  att_ = DeviceBuffer(n * size_t(q_dim_) * bf);
  bool any_dense = false;  // MoE models may have no SwiGLU layer at all
  for (int l = 0; l < c_.n_layer; ++l) any_dense = any_dense || !c_.is_moe_layer(l);
  if (any_dense) {
    gu_ = DeviceBuffer(n * 2 * size_t(c_.n_ff) * bf);
    h_ = DeviceBuffer(n * size_t(c_.n_ff) * bf);
  }
  if (c_.is_moe()) moe_ = std::make_unique<cuda::MoeRunner>(moe_config(c_), capacity);
  h_ids_ = PinnedBuffer(n * 4);
  h_pos_ = PinnedBuffer(n * 8);
  // A prompt chunk needs one row of logits (prompt scoring and Engine::logits
  // more): [capacity, n_vocab] f32 would be 8.4 GB at 16K tokens of a 128K vocabulary.
  ensure_logit_rows(std::min(capacity, kInitialLogitRows));
}

void CudaSequence::ensure_logit_rows(int rows) {
  if (rows <= logit_rows_) return;
  KVT_CUDA_CHECK(cudaStreamSynchronize(s_));  // queued work may still use the old buffers
  if (graph_) {  // it copies into the old buffers
    cudaGraphExecDestroy(graph_);
    graph_ = nullptr;
  }
  graph_key_ = warm_key_ = 0;
  logits_ = DeviceBuffer(size_t(rows) * size_t(c_.n_vocab) * 4);
  h_logits_ = PinnedBuffer(size_t(rows) * size_t(c_.n_vocab) * 4);
  logit_rows_ = rows;
}

void CudaSequence::forward(const int32_t* tokens, int n_tok, int64_t pos0, KvCache& kv, int n_logits,
                           float* logits) {
  const ModelConfig& c = c_;
  KVT_CHECK(n_tok > 0 && n_tok <= cap_, "GPU forward: {} tokens, the sequence holds {}", n_tok, cap_);
  KVT_CHECK(n_logits >= 0 && n_logits <= n_tok, "GPU forward: n_logits {} out of [0, {}]", n_logits, n_tok);
  check_cache(kv, pos0);
  for (int t = 0; t < n_tok; ++t)
    KVT_CHECK(tokens[t] >= 0 && tokens[t] < c.n_vocab, "token id {} out of vocabulary ({})", tokens[t], c.n_vocab);
  auto* hi = h_ids_.host<int32_t>();
  auto* hp = h_pos_.host<int64_t>();
  for (int t = 0; t < n_tok; ++t) {
    hi[t] = tokens[t];
    hp[t] = pos0 + t;
  }
  ensure_logit_rows(n_logits);
  kv.begin_step(n_tok);
  KvCache* kvp = &kv;
  // A decode step replays the graph of the last one when nothing it reads moved.
  const bool graph = m_.graphs_ && n_tok == 1 && n_logits == 1 && kv.decoding() && kv.graph_safe();
  if (graph) {
    const uint64_t key = (kv.graph_token() + 1) * 0x9E3779B97F4A7C15ull ^ uint64_t(reinterpret_cast<uintptr_t>(&kv));
    if (graph_ && key == graph_key_) {
      KVT_CUDA_CHECK(cudaGraphLaunch(graph_, s_));
    } else if (key == warm_key_) {
      capture_and_launch(n_tok, &kvp, 1, n_logits);
      graph_key_ = key;
    } else {  // the first step after a change runs eagerly: lazy allocations happen outside a capture
      run(n_tok, &kvp, 1, n_logits);
      warm_key_ = key;
    }
  } else {
    run(n_tok, &kvp, 1, n_logits);
  }
  KVT_CUDA_CHECK(cudaStreamSynchronize(s_));
  if (n_logits > 0) std::memcpy(logits, h_logits_.host(), size_t(n_logits) * size_t(c.n_vocab) * 4);
}

void CudaSequence::forward_decode(const int32_t* tokens, const int64_t* pos, KvCache* const* kvs, int n_seq,
                                  float* logits) {
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
  groups_.arrange(kvs, n_seq);  // row j of the forward is sequence order()[j]
  const std::vector<int>& order = groups_.order();
  std::vector<KvCache*> rows(static_cast<size_t>(n_seq), nullptr);
  auto* hi = h_ids_.host<int32_t>();
  auto* hp = h_pos_.host<int64_t>();
  for (int j = 0; j < n_seq; ++j) {
    const int i = order[size_t(j)];
    rows[size_t(j)] = kvs[i];
    hi[j] = tokens[i];
    hp[j] = pos[i];
  }
  ensure_logit_rows(n_seq);
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
    capture_and_launch(n_seq, rows.data(), n_seq, n_seq);
    graph_key_ = key;
  } else {  // eager: the first step of a new batch (lazy allocations happen outside a capture)
    run(n_seq, rows.data(), n_seq, n_seq);
    warm_key_ = graph ? key : 0;
  }
  KVT_CUDA_CHECK(cudaStreamSynchronize(s_));
  const size_t row_bytes = size_t(c.n_vocab) * 4;
  for (int j = 0; j < n_seq; ++j)
    std::memcpy(logits + size_t(order[size_t(j)]) * c.n_vocab, h_logits_.host<uint8_t>() + size_t(j) * row_bytes,
                row_bytes);
}

void CudaSequence::check_cache(const KvCache& kv, int64_t pos) const {
  KVT_CHECK(kv.plan().device == DeviceKind::cuda, "GPU forward: the KV cache lives on {}",
            device_name(kv.plan().device));
  KVT_CHECK(pos == kv.n_tokens(0), "GPU forward: position {} but the cache holds {} tokens", pos, kv.n_tokens(0));
}

void CudaSequence::capture_and_launch(int n_tok, KvCache* const* kvs, int n_kv, int n_logits) {
  cudaGraph_t g = nullptr;
  KVT_CUDA_CHECK(cudaStreamBeginCapture(s_, cudaStreamCaptureModeThreadLocal));
  try {
    run(n_tok, kvs, n_kv, n_logits);
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

void CudaSequence::run(int n_tok, KvCache* const* kvs, int n_kv, int n_logits) {
  const ModelConfig& c = c_;
  KVT_CHECK(n_kv == 1 || n_kv == n_tok, "GPU forward: {} caches for {} tokens", n_kv, n_tok);
  KVT_CUDA_CHECK(cudaMemcpyAsync(ids_.data(), h_ids_.host(), size_t(n_tok) * 4, cudaMemcpyHostToDevice, s_));
  KVT_CUDA_CHECK(cudaMemcpyAsync(pos_.data(), h_pos_.host(), size_t(n_tok) * 8, cudaMemcpyHostToDevice, s_));
  const int E = c.n_embd, hd = c.head_dim;
  const float scale = 1.0f / std::sqrt(float(hd));
  cuda::Gemm& gemm = m_.gemm_;
  cuda::embed_rows(m_.tok_embd_.data(), ids_.data<int32_t>(), n_tok, E, x_.data(), s_);
  const void* delta = nullptr;  // the previous block's output, added to x by the next norm
  for (int l = 0; l < c.n_layer; ++l) {
    const GpuLayer& L = m_.layers_[size_t(l)];
    // Attention block.
    cuda::add_rmsnorm(x_.data(), delta, L.attn_norm.data(), n_tok, E, c.rms_eps, xb_.data(), s_);
    gemm.run(n_tok, q_dim_, E, xb_.data(), L.wq.data(), q_.data(), s_);      // q: [n_tok, n_head, hd]
    gemm.run(n_tok, kv_dim_, E, xb_.data(), L.wk.data(), k_pre_.data(), s_);  // k: [n_tok, n_kv_head, hd]
    gemm.run(n_tok, kv_dim_, E, xb_.data(), L.wv.data(), v_.data(), s_);      // v: [n_tok, n_kv_head, hd]
    if (L.bq.bytes()) cuda::add_bias(q_.data(), L.bq.data<float>(), n_tok, int(q_dim_), s_);
    if (L.bk.bytes()) cuda::add_bias(k_pre_.data(), L.bk.data<float>(), n_tok, int(kv_dim_), s_);
    if (L.bv.bytes()) cuda::add_bias(v_.data(), L.bv.data<float>(), n_tok, int(kv_dim_), s_);
    if (L.q_norm.bytes())
      cuda::add_rmsnorm(q_.data(), nullptr, L.q_norm.data(), int64_t(n_tok) * c.n_head, hd, c.rms_eps, q_.data(), s_);
    if (L.k_norm.bytes())
      cuda::add_rmsnorm(k_pre_.data(), nullptr, L.k_norm.data(), int64_t(n_tok) * c.n_kv_head, hd, c.rms_eps,
                        k_pre_.data(), s_);
    KVT_CUDA_CHECK(cudaMemcpyAsync(k_.data(), k_pre_.data(), size_t(n_tok) * size_t(kv_dim_) * 2,
                                   cudaMemcpyDeviceToDevice, s_));
    cuda::rope(q_.data(), n_tok, q_dim_, c.n_head, hd, pos_.data<int64_t>(), m_.inv_freq_.data<float>(),
               c.rope_interleaved, s_);
    cuda::rope(k_.data(), n_tok, kv_dim_, c.n_kv_head, hd, pos_.data<int64_t>(), m_.inv_freq_.data<float>(),
               c.rope_interleaved, s_);
    if (n_kv == 1) {
      kvs[0]->append(l, k_pre_.data(), k_.data(), v_.data(), kv_dim_, n_tok);
      kvs[0]->attend(l, q_.data(), q_dim_, n_tok, scale, att_.data());  // att: [n_tok, n_head, hd]
    } else {  // a batch of steps: row i through sequence i's cache, a group's rows through its DecodeBatch
      for (int i = 0; i < n_kv;) {
        const size_t kv_row = size_t(i) * size_t(kv_dim_), q_row = size_t(i) * size_t(q_dim_);
        const uint16_t *kp = k_pre_.data<uint16_t>() + kv_row, *k = k_.data<uint16_t>() + kv_row,
                       *v = v_.data<uint16_t>() + kv_row, *q = q_.data<uint16_t>() + q_row;
        uint16_t* out = att_.data<uint16_t>() + q_row;
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
    gemm.run(n_tok, E, q_dim_, att_.data(), L.wo.data(), delta_.data(), s_);

    // Feed-forward block: the mixture of experts, or one SwiGLU.
    cuda::add_rmsnorm(x_.data(), delta_.data(), L.ffn_norm.data(), n_tok, E, c.rms_eps, xb_.data(), s_);
    if (c.is_moe_layer(l)) {
      moe_->run(L.moe(), xb_.data(), n_tok, delta_.data(), gemm, s_);  // [n_tok, n_embd]
    } else {
      gemm.run(n_tok, 2 * int64_t(c.n_ff), E, xb_.data(), L.w_gate_up.data(), gu_.data(), s_);  // [n_tok, 2 n_ff]
      cuda::swiglu(gu_.data(), n_tok, c.n_ff, h_.data(), s_);                                   // [n_tok, n_ff]
      gemm.run(n_tok, E, c.n_ff, h_.data(), L.w_down.data(), delta_.data(), s_);
    }
    delta = delta_.data();
  }
  if (n_logits > 0) {
    cuda::add_rmsnorm(x_.data(), delta, m_.out_norm_.data(), n_tok, E, c.rms_eps, xb_.data(), s_);
    const uint16_t* last = xb_.data<uint16_t>() + size_t(n_tok - n_logits) * size_t(E);  // [n_logits, n_embd]
    const void* head = m_.output_.bytes() ? m_.output_.data() : m_.tok_embd_.data();
    gemm.run_f32(n_logits, c.n_vocab, E, last, head, logits_.data<float>(), s_);  // [n_logits, n_vocab]
    KVT_CUDA_CHECK(cudaMemcpyAsync(h_logits_.host(), logits_.data(), size_t(n_logits) * size_t(c.n_vocab) * 4,
                                   cudaMemcpyDeviceToHost, s_));
  }
}

CudaModel::~CudaModel() = default;

std::unique_ptr<GpuSequence> CudaModel::start(int capacity) { return std::make_unique<CudaSequence>(*this, capacity); }

void CudaModel::forward_decode(const int32_t* tokens, const int64_t* pos, KvCache* const* kvs, int n_seq,
                               float* logits) {
  KVT_CHECK(n_seq > 0, "GPU batch: {} sequences", n_seq);
  if (n_seq > batch_cap_) {
    const int cap = std::max({n_seq, 8, 2 * batch_cap_});
    batch_.reset();
    batch_ = std::make_unique<CudaSequence>(*this, cap);
    batch_cap_ = cap;
  }
  batch_->forward_decode(tokens, pos, kvs, n_seq, logits);
}

}  // namespace model_cuda_detail

std::unique_ptr<GpuModel> make_gpu_model(const Model& model, bool graphs) {
  KVT_CHECK(cuda_device_count() > 0, "--device cuda: no CUDA device found ({})", cuda_device_summary());
  return std::make_unique<model_cuda_detail::CudaModel>(model, graphs);
}

}  // namespace kvtier
