// GpuModel on CUDA: weight upload (dequantize → bf16) and the per-sequence
// forward pass, straight-line op calls mirroring Model::forward
// (src/model/llama_forward.cpp). Differences from the CPU path, all from the
// storage type: activations and the residual stream are bf16 between ops
// (f32 math inside each op); logits are f32. MoE layers (Qwen3-MoE, Mixtral)
// run ops/moe/moe_cuda.h instead of the SwiGLU block.
#include "model/model_cuda.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cuda_backend.h"
#include "backend/cuda_device.h"
#include "ops/embed/embed_cuda.h"
#include "core/half.h"
#include "core/threads.h"
#include "kv/decode_groups.h"
#include "model/model.h"
#include "ops/dequant/dequant.h"
#include "ops/gemm/gemm_cuda.h"
#include "ops/moe/moe_cuda.h"
#include "ops/rmsnorm/rmsnorm_cuda.h"
#include "ops/rope/rope.h"
#include "ops/rope/rope_cuda.h"
#include "ops/swiglu/swiglu_cuda.h"

namespace kvtier {
namespace {

using cuda::DeviceBuffer;
using cuda::PinnedBuffer;

// Rows of logits a sequence's buffers start with (a GPU decode batch's).
constexpr int kInitialLogitRows = 256;

// A source tensor of n_elements = n_rows * n_cols, dequantized row by row
// (rows of n_cols) and rounded to bf16: [n_rows, n_cols] bf16 bits.
std::vector<uint16_t> to_bf16(const TensorRef& t, int64_t n_rows, int64_t n_cols) {
  KVT_CHECK(t.n_elements() == n_rows * n_cols, "{}: {} values, expected {} x {}", t.source, t.n_elements(),
            n_rows, n_cols);
  KVT_CHECK(dequant_supported(t.type), "{}: type {} cannot be dequantized for the GPU", t.source,
            ggml_type_name(t.type));
  const size_t row_bytes = ggml_row_bytes(t.type, n_cols);
  KVT_CHECK(row_bytes * size_t(n_rows) <= t.n_bytes, "{}: {} bytes, expected {}", t.source, t.n_bytes,
            row_bytes * size_t(n_rows));
  std::vector<uint16_t> out(size_t(n_rows * n_cols));
  default_pool().parallel_for(n_rows, 8, [&](int64_t r0, int64_t r1, int) {
    std::vector<float> row(static_cast<size_t>(n_cols));  // [n_cols] f32
    for (int64_t r = r0; r < r1; ++r) {
      dequantize_row(t.type, t.data + size_t(r) * row_bytes, row.data(), n_cols);
      uint16_t* dst = &out[size_t(r * n_cols)];
      for (int64_t i = 0; i < n_cols; ++i) dst[i] = f32_to_bf16(row[size_t(i)]);
    }
  });
  return out;
}

// A weight view (any dequantizable type) appended to `out` as bf16 bits:
// [n_out, n_in] bf16 after what `out` held.
void append_bf16(const WeightView& w, std::vector<uint16_t>& out) {
  KVT_CHECK(dequant_supported(w.type), "type {} cannot be dequantized for the GPU", ggml_type_name(w.type));
  const size_t base = out.size();
  out.resize(base + size_t(w.n_out * w.n_in));
  default_pool().parallel_for(w.n_out, 8, [&](int64_t r0, int64_t r1, int) {
    std::vector<float> row(static_cast<size_t>(w.n_in));  // [n_in] f32
    for (int64_t r = r0; r < r1; ++r) {
      dequantize_row(w.type, w.row(r), row.data(), w.n_in);
      uint16_t* dst = &out[base + size_t(r * w.n_in)];
      for (int64_t i = 0; i < w.n_in; ++i) dst[i] = f32_to_bf16(row[size_t(i)]);
    }
  });
}

std::vector<float> to_f32(const TensorRef& t, int64_t n) {
  KVT_CHECK(t.n_elements() == n, "{}: {} values, expected {}", t.source, t.n_elements(), n);
  std::vector<float> v(static_cast<size_t>(n));
  dequantize_row(t.type, t.data, v.data(), n);
  return v;
}

template <class T>
DeviceBuffer upload(const std::vector<T>& h, size_t* total) {
  DeviceBuffer d(h.size() * sizeof(T));
  KVT_CUDA_CHECK(cudaMemcpy(d.data(), h.data(), d.bytes(), cudaMemcpyHostToDevice));
  *total += d.bytes();
  return d;
}

struct GpuLayer {
  DeviceBuffer attn_norm, ffn_norm;  // [n_embd] bf16
  DeviceBuffer wq, wk, wv, wo;       // [q_dim, n_embd], [kv_dim, n_embd] x2, [n_embd, q_dim] bf16
  DeviceBuffer bq, bk, bv;           // [q_dim], [kv_dim], [kv_dim] f32 or empty (Qwen2)
  DeviceBuffer q_norm, k_norm;       // [head_dim] bf16 or empty (Qwen3)
  DeviceBuffer w_gate_up;            // [2 * n_ff, n_embd] bf16: gate rows, then up rows
  DeviceBuffer w_down;               // [n_embd, n_ff] bf16
  // MoE layers instead of w_gate_up / w_down (ops/moe/moe_cuda.h):
  DeviceBuffer moe_router;   // [n_expert, n_embd] bf16
  DeviceBuffer moe_gate_up;  // [n_expert, 2 * n_ff_expert, n_embd] bf16: expert e's gate rows, then its up rows
  DeviceBuffer moe_down;     // [n_expert, n_embd, n_ff_expert] bf16
  cuda::MoeDeviceWeights moe() const { return {moe_router.data(), moe_gate_up.data(), moe_down.data()}; }
};

// A MoE layer's router and experts, dequantized and uploaded one expert at a
// time, so that host memory holds one expert in bf16, never the layer's.
void upload_experts(const ModelSource& src, int l, GpuLayer* L, size_t* total) {
  const ModelConfig& c = src.config;
  const MoeWeights w = view_experts(src, l);
  std::vector<uint16_t> buf;  // [n_expert, n_embd], then one expert's matrices, bf16
  append_bf16(w.router, buf);
  L->moe_router = upload(buf, total);
  const size_t gu_bytes = size_t(2) * size_t(c.n_ff_expert) * size_t(c.n_embd) * 2;  // one expert's gate|up
  const size_t down_bytes = gu_bytes / 2;                                             // one expert's down
  L->moe_gate_up = DeviceBuffer(gu_bytes * size_t(c.n_expert));
  L->moe_down = DeviceBuffer(down_bytes * size_t(c.n_expert));
  for (int e = 0; e < c.n_expert; ++e) {
    buf.clear();
    append_bf16(w.gate[size_t(e)], buf);
    append_bf16(w.up[size_t(e)], buf);
    KVT_CUDA_CHECK(cudaMemcpy(L->moe_gate_up.data<uint8_t>() + size_t(e) * gu_bytes, buf.data(), gu_bytes,
                              cudaMemcpyHostToDevice));
    buf.clear();
    append_bf16(w.down[size_t(e)], buf);
    KVT_CUDA_CHECK(cudaMemcpy(L->moe_down.data<uint8_t>() + size_t(e) * down_bytes, buf.data(), down_bytes,
                              cudaMemcpyHostToDevice));
  }
  *total += L->moe_gate_up.bytes() + L->moe_down.bytes();
}

class CudaSequence;

class CudaModel final : public GpuModel {
 public:
  CudaModel(const Model& model, bool graphs);
  ~CudaModel() override;
  std::unique_ptr<GpuSequence> start(int capacity) override;
  void forward_decode(const int32_t* tokens, const int64_t* pos, KvCache* const* kvs, int n_seq,
                      float* logits) override;
  const Device& device() const override { return dev_; }
  Device& device() override { return dev_; }
  size_t weight_bytes() const override { return weight_bytes_; }
  std::string describe() const override {
    return fmt::format("cuda ({}), weights {:.1f} MiB bf16", cuda_device_summary(),
                       double(weight_bytes_) / (1 << 20));
  }

 private:
  friend class CudaSequence;
  Device dev_{DeviceKind::cuda};
  const Model& model_;
  const ModelConfig& c_;
  std::vector<GpuLayer> layers_;
  DeviceBuffer tok_embd_;   // [n_vocab, n_embd] bf16
  DeviceBuffer output_;     // [n_vocab, n_embd] bf16, empty when tied to tok_embd_
  DeviceBuffer out_norm_;   // [n_embd] bf16
  DeviceBuffer inv_freq_;   // [head_dim / 2] f32
  size_t weight_bytes_ = 0;
  cuda::Gemm gemm_;
  const bool graphs_;
  std::unique_ptr<CudaSequence> batch_;  // forward_decode's activations, grown to the largest batch
  int batch_cap_ = 0;
  void random_weights();
};

CudaModel::CudaModel(const Model& model, bool graphs) : model_(model), c_(model.config()), graphs_(graphs) {
  const ModelConfig& c = c_;
  const ModelSource& src = model.source();
  KVT_CHECK(c.head_dim == 64 || c.head_dim == 128 || c.head_dim == 256,
            "{}: head_dim {} is not supported on the GPU (64, 128 or 256); use --device cpu", src.path, c.head_dim);
  KVT_CHECK(c.n_embd % 8 == 0 && c.n_ff % 8 == 0 && c.n_embd <= 8192,
            "{}: n_embd {} and n_ff {} must be multiples of 8 (n_embd <= 8192) on the GPU", src.path, c.n_embd,
            c.n_ff);
  KVT_CHECK(!c.is_moe() || c.n_ff_expert % 8 == 0, "{}: the expert width {} must be a multiple of 8 on the GPU",
            src.path, c.n_ff_expert);
  const int64_t E = c.n_embd, q_dim = int64_t(c.n_head) * c.head_dim, kv_dim = int64_t(c.n_kv_head) * c.head_dim;
  size_t* total = &weight_bytes_;
  if (src.shape_only) {
    random_weights();
    return;
  }
  auto mat = [&](const std::string& name, int64_t n_out, int64_t n_in) {
    return upload(to_bf16(src.tensor(name), n_out, n_in), total);
  };
  auto vec_bf16 = [&](const std::string& name, int64_t n) { return upload(to_bf16(src.tensor(name), 1, n), total); };
  auto maybe_bias = [&](const std::string& name, int64_t n) {
    return src.find(name) ? upload(to_f32(src.tensor(name), n), total) : DeviceBuffer();
  };
  layers_.resize(size_t(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    auto name = [l](const char* what) { return fmt::format("blk.{}.{}", l, what); };
    GpuLayer& L = layers_[size_t(l)];
    L.attn_norm = vec_bf16(name("attn_norm.weight"), E);
    L.ffn_norm = vec_bf16(name("ffn_norm.weight"), E);
    L.wq = mat(name("attn_q.weight"), q_dim, E);
    L.wk = mat(name("attn_k.weight"), kv_dim, E);
    L.wv = mat(name("attn_v.weight"), kv_dim, E);
    L.wo = mat(name("attn_output.weight"), E, q_dim);
    L.bq = maybe_bias(name("attn_q.bias"), q_dim);
    L.bk = maybe_bias(name("attn_k.bias"), kv_dim);
    L.bv = maybe_bias(name("attn_v.bias"), kv_dim);
    if (src.find(name("attn_q_norm.weight"))) L.q_norm = vec_bf16(name("attn_q_norm.weight"), c.head_dim);
    if (src.find(name("attn_k_norm.weight"))) L.k_norm = vec_bf16(name("attn_k_norm.weight"), c.head_dim);
    if (c.is_moe_layer(l)) {
      upload_experts(src, l, &L, total);
      continue;
    }
    std::vector<uint16_t> gate_up = to_bf16(src.tensor(name("ffn_gate.weight")), c.n_ff, E);
    const std::vector<uint16_t> up = to_bf16(src.tensor(name("ffn_up.weight")), c.n_ff, E);
    gate_up.insert(gate_up.end(), up.begin(), up.end());
    L.w_gate_up = upload(gate_up, total);
    L.w_down = mat(name("ffn_down.weight"), E, c.n_ff);
  }
  tok_embd_ = mat("token_embd.weight", c.n_vocab, E);
  if (src.find("output.weight")) output_ = mat("output.weight", c.n_vocab, E);
  out_norm_ = vec_bf16("output_norm.weight", E);
  // The same frequency table as the CPU model (Rope handles every scaling).
  std::vector<float> freq_divisors;
  if (src.find("rope_freqs.weight")) freq_divisors = to_f32(src.tensor("rope_freqs.weight"), c.head_dim / 2);
  const Rope rope(c, std::move(freq_divisors));
  inv_freq_ = upload(rope.inv_freq(), total);
  weight_bytes_ -= inv_freq_.bytes();
}

// A model shape (no weights): every matrix (routers and experts included)
// uniform in ±1/√n_in and every norm 1, made on the GPU from a counter-based hash (no files, no host copy),
// for speed and memory runs at real shapes.
void CudaModel::random_weights() {
  const ModelConfig& c = c_;
  const int64_t E = c.n_embd, q_dim = int64_t(c.n_head) * c.head_dim, kv_dim = int64_t(c.n_kv_head) * c.head_dim;
  const cudaStream_t s = static_cast<cudaStream_t>(dev_.exec().stream);
  uint64_t seed = 1;
  auto mat = [&](int64_t n_out, int64_t n_in) {
    DeviceBuffer d(size_t(n_out * n_in) * 2);
    const float a = 1.f / std::sqrt(float(n_in));
    cuda::fill_uniform_bf16(d.data(), n_out * n_in, seed++, -a, a, s);
    weight_bytes_ += d.bytes();
    return d;
  };
  auto ones = [&](int64_t n) {
    DeviceBuffer d(size_t(n) * 2);
    cuda::fill_uniform_bf16(d.data(), n, seed++, 1.f, 1.f, s);
    weight_bytes_ += d.bytes();
    return d;
  };
  layers_.resize(size_t(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    GpuLayer& L = layers_[size_t(l)];
    L.attn_norm = ones(E);
    L.ffn_norm = ones(E);
    L.wq = mat(q_dim, E);
    L.wk = mat(kv_dim, E);
    L.wv = mat(kv_dim, E);
    L.wo = mat(E, q_dim);
    if (c.qk_norm) {
      L.q_norm = ones(c.head_dim);
      L.k_norm = ones(c.head_dim);
    }
    if (c.is_moe_layer(l)) {
      const int64_t n_exp = c.n_expert, F = c.n_ff_expert;
      L.moe_router = mat(n_exp, E);
      L.moe_gate_up = mat(n_exp * 2 * F, E);  // [n_expert, 2 F, n_embd]
      L.moe_down = mat(n_exp * E, F);         // [n_expert, n_embd, F]
      continue;
    }
    L.w_gate_up = mat(2 * int64_t(c.n_ff), E);
    L.w_down = mat(E, c.n_ff);
  }
  tok_embd_ = mat(c.n_vocab, E);
  if (!c.tied_embeddings) output_ = mat(c.n_vocab, E);
  out_norm_ = ones(E);
  const Rope rope(c);
  size_t unused = 0;
  inv_freq_ = upload(rope.inv_freq(), &unused);
  KVT_CUDA_CHECK(cudaStreamSynchronize(s));
}

class CudaSequence final : public GpuSequence {
 public:
  CudaSequence(CudaModel& m, int capacity);
  ~CudaSequence() override;
  void forward(const int32_t* tokens, int n_tok, int64_t pos0, KvCache& kv, int n_logits, float* logits) override;
  // CudaModel::forward_decode: token i of the forward is sequence i's step.
  void forward_decode(const int32_t* tokens, const int64_t* pos, KvCache* const* kvs, int n_seq, float* logits);

 private:
  // What the forward pass needs of a cache whose next token sits at `pos`.
  void check_cache(const KvCache& kv, int64_t pos) const;
  // The forward pass's device work, staged inputs to staged logits. n_kv 1:
  // every token goes to kvs[0]; n_kv = n_tok: token i goes to kvs[i].
  void run(int n_tok, KvCache* const* kvs, int n_kv, int n_logits);
  void capture_and_launch(int n_tok, KvCache* const* kvs, int n_kv, int n_logits);

  CudaModel& m_;
  const ModelConfig& c_;
  const int cap_;
  const int64_t q_dim_, kv_dim_;
  cudaStream_t s_;
  DeviceBuffer ids_;    // [cap] int32
  DeviceBuffer pos_;    // [cap] int64
  DeviceBuffer x_;      // [cap, n_embd] bf16, residual stream
  DeviceBuffer xb_;     // [cap, n_embd] bf16, normed input of a block
  DeviceBuffer delta_;  // [cap, n_embd] bf16, a block's output before the residual add
  DeviceBuffer q_;      // [cap, n_head, head_dim] bf16
  DeviceBuffer k_pre_;  // [cap, n_kv_head, head_dim] bf16, keys before RoPE
  DeviceBuffer k_;      // [cap, n_kv_head, head_dim] bf16
  DeviceBuffer v_;      // [cap, n_kv_head, head_dim] bf16
  DeviceBuffer att_;    // [cap, n_head, head_dim] bf16
  DeviceBuffer gu_;     // [cap, 2 * n_ff] bf16 (empty when every layer is MoE)
  DeviceBuffer h_;      // [cap, n_ff] bf16 (empty when every layer is MoE)
  DeviceBuffer logits_; // [logit_rows_, n_vocab] f32 (rows as many as a call asks for, grown on demand)
  std::unique_ptr<cuda::MoeRunner> moe_;  // MoE models: the expert block's working memory
  PinnedBuffer h_ids_, h_pos_;  // staging of the step's inputs
  PinnedBuffer h_logits_;       // [logit_rows_, n_vocab] f32: the logits' host copy (a graph's copy target)
  int logit_rows_ = 0;
  void ensure_logit_rows(int rows);
  cudaGraphExec_t graph_ = nullptr;
  uint64_t graph_key_ = 0, warm_key_ = 0;
  DecodeGroups groups_;  // forward_decode's arrangement of the batch (rows of one tiered policy together)
};

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

}  // namespace

std::unique_ptr<GpuModel> make_gpu_model(const Model& model, bool graphs) {
  KVT_CHECK(cuda_device_count() > 0, "--device cuda: no CUDA device found ({})", cuda_device_summary());
  return std::make_unique<CudaModel>(model, graphs);
}

}  // namespace kvtier
