// GpuModel on CUDA: weight upload (dequantize → bf16) and the per-sequence
// forward pass, straight-line op calls mirroring Model::forward
// (src/model/llama_forward.cpp). Differences from the CPU path, all from the
// storage type: activations and the residual stream are bf16 between ops
// (f32 math inside each op), the KV cache of `full` is bf16; logits are f32.
#include "gpu/gpu_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "backend/cuda_backend.h"
#include "backend/cuda_device.h"
#include "core/half.h"
#include "core/threads.h"
#include "gpu/gpu_model_kernels.h"
#include "gpu/gpu_tiered_kv.h"
#include "kv/policy.h"
#include "kv/full_kv.h"
#include "kv/tiered_store.h"
#include "model/model.h"
#include "ops/decode_attn/decode_attn_cuda.h"
#include "ops/dequant/dequant.h"
#include "ops/flash_prefill/flash_prefill_cuda.h"
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

// A weight view (any dequantizable type) appended to `out` as bf16 bits.
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
  DeviceBuffer moe_gate_up;  // [n_expert, 2 * n_ff_expert, n_embd] bf16
  DeviceBuffer moe_down;     // [n_expert, n_embd, n_ff_expert] bf16
  cuda::MoeDeviceWeights moe() const { return {moe_router.data(), moe_gate_up.data(), moe_down.data()}; }
};

// A MoE layer's router and experts, uploaded one expert at a time (bounded host memory).
void upload_experts(const ModelSource& src, int l, GpuLayer* L, size_t* total) {
  const ModelConfig& c = src.config;
  const MoeWeights w = view_experts(src, l);
  std::vector<uint16_t> buf;
  append_bf16(w.router, buf);
  L->moe_router = upload(buf, total);
  const size_t gu_bytes = size_t(2) * size_t(c.n_ff_expert) * size_t(c.n_embd) * 2;  // per expert
  L->moe_gate_up = DeviceBuffer(gu_bytes * size_t(c.n_expert));
  L->moe_down = DeviceBuffer(gu_bytes / 2 * size_t(c.n_expert));
  for (int e = 0; e < c.n_expert; ++e) {
    buf.clear();
    append_bf16(w.gate[size_t(e)], buf);
    append_bf16(w.up[size_t(e)], buf);
    KVT_CUDA_CHECK(cudaMemcpy(L->moe_gate_up.data<uint8_t>() + size_t(e) * gu_bytes, buf.data(), gu_bytes,
                              cudaMemcpyHostToDevice));
    buf.clear();
    append_bf16(w.down[size_t(e)], buf);
    KVT_CUDA_CHECK(cudaMemcpy(L->moe_down.data<uint8_t>() + size_t(e) * gu_bytes / 2, buf.data(), gu_bytes / 2,
                              cudaMemcpyHostToDevice));
  }
  *total += L->moe_gate_up.bytes() + L->moe_down.bytes();
}

class CudaSequence;

class CudaModel final : public GpuModel {
 public:
  explicit CudaModel(const Model& model);
  std::unique_ptr<GpuSequence> start(int capacity, const KvStore& kv, int64_t n_ctx) override;
  size_t weight_bytes() const override { return weight_bytes_; }
  std::string describe() const override {
    return fmt::format("cuda ({}), weights {:.1f} MiB bf16", cuda_device_summary(),
                       double(weight_bytes_) / (1 << 20));
  }

 private:
  friend class CudaSequence;
  const Model& model_;
  const ModelConfig& c_;
  std::vector<GpuLayer> layers_;
  DeviceBuffer tok_embd_;   // [n_vocab, n_embd] bf16
  DeviceBuffer output_;     // [n_vocab, n_embd] bf16, empty when tied to tok_embd_
  DeviceBuffer out_norm_;   // [n_embd] bf16
  DeviceBuffer inv_freq_;   // [head_dim / 2] f32
  size_t weight_bytes_ = 0;
  cuda::Gemm gemm_;
  cuda::Stream stream_;
  std::set<std::string> noted_;  // policies already told to fall back to the CPU store
};

CudaModel::CudaModel(const Model& model) : model_(model), c_(model.config()) {
  const ModelConfig& c = c_;
  const ModelSource& src = model.source();
  KVT_CHECK(cuda::flash_prefill_supports(c.head_dim),
            "{}: head_dim {} is not supported on the GPU (64 or 128); use --device cpu", src.path, c.head_dim);
  KVT_CHECK(c.n_embd % 8 == 0 && c.n_ff % 8 == 0 && c.n_embd <= 8192,
            "{}: n_embd {} and n_ff {} must be multiples of 8 (n_embd <= 8192) on the GPU", src.path, c.n_embd,
            c.n_ff);
  KVT_CHECK(!c.is_moe() || c.n_ff_expert % 8 == 0, "{}: the expert width {} must be a multiple of 8 on the GPU",
            src.path, c.n_ff_expert);
  const int64_t E = c.n_embd, q_dim = int64_t(c.n_head) * c.head_dim, kv_dim = int64_t(c.n_kv_head) * c.head_dim;
  size_t* total = &weight_bytes_;
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

class CudaSequence final : public GpuSequence {
 public:
  // tiered: the policy of a TieredKvStore that decodes natively (null: the
  // store itself, or `full` when kv_on_gpu).
  CudaSequence(CudaModel& m, int capacity, bool kv_on_gpu, const PolicyConfig* tiered);
  void forward(const int32_t* tokens, int n_tok, int64_t pos0, KvStore& kv, int n_logits, float* logits) override;
  bool kv_on_gpu() const override { return native_; }
  KvPath kv_path() const override {
    return native_ ? KvPath::gpu_full : tiered_ ? KvPath::gpu_tiered : KvPath::host_store;
  }
  KvMemory memory(const KvStore& kv) const override;
  const GpuTieredKv* tiered() const override { return tiered_.get(); }
  // Room for n_ctx tokens up front: `full`'s cache, or the GPU tiers.
  void reserve(int64_t n_ctx) {
    if (n_ctx <= 0) return;
    if (native_) reserve_cache(n_ctx);
    if (tiered_) tiered_->reserve(n_ctx, s_);
  }

 private:
  void reserve_cache(int64_t n_ctx);
  void attend_gpu(int layer, int64_t pos0, int n_tok);
  void append_host(int layer, KvStore& kv, int n_tok);
  void attend_host(int layer, KvStore& kv, int n_tok);

  CudaModel& m_;
  const ModelConfig& c_;
  const bool native_;
  const int cap_;
  const int64_t q_dim_, kv_dim_;
  cudaStream_t s_;
  DeviceBuffer ids_;    // [cap] int32
  DeviceBuffer pos_;    // [cap] int64
  DeviceBuffer x_;      // [cap, n_embd] bf16, residual stream
  DeviceBuffer xb_;     // [cap, n_embd] bf16, normed input of a block
  DeviceBuffer delta_;  // [cap, n_embd] bf16, a block's output before the residual add
  DeviceBuffer q_;      // [cap, n_head, head_dim] bf16
  DeviceBuffer k_;      // [cap, n_kv_head, head_dim] bf16
  DeviceBuffer v_;      // [cap, n_kv_head, head_dim] bf16
  DeviceBuffer att_;    // [cap, n_head, head_dim] bf16
  DeviceBuffer gu_;     // [cap, 2 * n_ff] bf16
  DeviceBuffer h_;      // [cap, n_ff] bf16
  DeviceBuffer logits_; // [cap, n_vocab] f32
  // `full`: the cache, [n_layer, ctx_cap, n_kv_head, head_dim] bf16 each.
  // Other policies: the same, holding the prompt while the store's prefill is
  // dense (attention on the GPU), freed when decoding starts.
  DeviceBuffer kc_, vc_;
  int64_t ctx_cap_ = 0, n_cached_ = 0;
  DeviceBuffer part_out_, part_lse_;  // [n_split, n_head, head_dim], [n_split, n_head] f32
  int n_split_cap_ = 0;
  // Other policies: host copies (bf16 pinned, then f32 for the store).
  PinnedBuffer h_q_, h_kpre_, h_k_, h_v_, h_att_;
  std::vector<float> f_q_, f_kpre_, f_k_, f_v_, f_att_;
  // A natively decoding tiered policy: the whole cache on the GPU side (the
  // KvStore passed to forward() is left untouched, like `full`'s).
  std::unique_ptr<GpuTieredKv> tiered_;
  std::unique_ptr<cuda::MoeRunner> moe_;  // MoE models: the expert block's working memory
};

CudaSequence::CudaSequence(CudaModel& m, int capacity, bool kv_on_gpu, const PolicyConfig* tiered)
    : m_(m),
      c_(m.c_),
      native_(kv_on_gpu),
      cap_(capacity),
      q_dim_(int64_t(m.c_.n_head) * m.c_.head_dim),
      kv_dim_(int64_t(m.c_.n_kv_head) * m.c_.head_dim),
      s_(m.stream_.get()) {
  KVT_CHECK(capacity > 0, "GPU sequence: capacity {} must be positive", capacity);
  const size_t n = size_t(capacity), E = size_t(c_.n_embd), bf = 2;
  ids_ = DeviceBuffer(n * 4);
  pos_ = DeviceBuffer(n * 8);
  x_ = DeviceBuffer(n * E * bf);
  xb_ = DeviceBuffer(n * E * bf);
  delta_ = DeviceBuffer(n * E * bf);
  q_ = DeviceBuffer(n * size_t(q_dim_) * bf);
  k_ = DeviceBuffer(n * size_t(kv_dim_) * bf);
  v_ = DeviceBuffer(n * size_t(kv_dim_) * bf);
  att_ = DeviceBuffer(n * size_t(q_dim_) * bf);
  bool any_dense = false;  // MoE models may have no SwiGLU layer at all
  for (int l = 0; l < c_.n_layer; ++l) any_dense = any_dense || !c_.is_moe_layer(l);
  if (any_dense) {
    gu_ = DeviceBuffer(n * 2 * size_t(c_.n_ff) * bf);
    h_ = DeviceBuffer(n * size_t(c_.n_ff) * bf);
  }
  logits_ = DeviceBuffer(n * size_t(c_.n_vocab) * 4);
  if (c_.is_moe()) moe_ = std::make_unique<cuda::MoeRunner>(moe_config(c_), capacity);
  if (tiered) tiered_ = std::make_unique<GpuTieredKv>(*tiered, m.model_.kv_geometry());
  if (!native_ && !tiered_) {
    h_q_ = PinnedBuffer(n * size_t(q_dim_) * bf);
    h_att_ = PinnedBuffer(n * size_t(q_dim_) * bf);
    h_kpre_ = PinnedBuffer(n * size_t(kv_dim_) * bf);
    h_k_ = PinnedBuffer(n * size_t(kv_dim_) * bf);
    h_v_ = PinnedBuffer(n * size_t(kv_dim_) * bf);
    f_q_.resize(n * size_t(q_dim_));
    f_att_.resize(f_q_.size());
    f_kpre_.resize(n * size_t(kv_dim_));
    f_k_.resize(f_kpre_.size());
    f_v_.resize(f_kpre_.size());
  }
}

KvMemory CudaSequence::memory(const KvStore& kv) const {
  if (tiered_) return tiered_->memory();
  if (!native_) return kv.memory();
  KvMemory m;
  m.gpu_bytes_per_token = double(c_.n_layer) * 2.0 * double(kv_dim_) * 2.0;  // K and V, bf16
  m.gpu_bytes = int64_t(m.gpu_bytes_per_token) * n_cached_;
  return m;
}

void CudaSequence::reserve_cache(int64_t n_ctx) {
  if (n_ctx <= ctx_cap_) return;
  const int64_t new_cap = std::max<int64_t>({n_ctx, 2 * ctx_cap_, 256});
  const size_t row = size_t(kv_dim_) * 2;  // bytes per token and layer
  DeviceBuffer kc(size_t(c_.n_layer) * size_t(new_cap) * row), vc(kc.bytes());
  if (n_cached_ > 0) {
    // One strided copy per tensor: layer l's first n_cached_ tokens.
    KVT_CUDA_CHECK(cudaMemcpy2DAsync(kc.data(), size_t(new_cap) * row, kc_.data(), size_t(ctx_cap_) * row,
                                     size_t(n_cached_) * row, size_t(c_.n_layer), cudaMemcpyDeviceToDevice, s_));
    KVT_CUDA_CHECK(cudaMemcpy2DAsync(vc.data(), size_t(new_cap) * row, vc_.data(), size_t(ctx_cap_) * row,
                                     size_t(n_cached_) * row, size_t(c_.n_layer), cudaMemcpyDeviceToDevice, s_));
    KVT_CUDA_CHECK(cudaStreamSynchronize(s_));  // the old buffers are freed below
  }
  kc_ = std::move(kc);
  vc_ = std::move(vc);
  ctx_cap_ = new_cap;
}

void CudaSequence::attend_gpu(int layer, int64_t pos0, int n_tok) {
  const int hd = c_.head_dim;
  const size_t row = size_t(kv_dim_) * 2;
  uint8_t* kc = kc_.data<uint8_t>() + size_t(layer) * size_t(ctx_cap_) * row;  // [ctx_cap, kv_dim] bf16
  uint8_t* vc = vc_.data<uint8_t>() + size_t(layer) * size_t(ctx_cap_) * row;
  KVT_CUDA_CHECK(cudaMemcpyAsync(kc + size_t(pos0) * row, k_.data(), size_t(n_tok) * row, cudaMemcpyDeviceToDevice, s_));
  KVT_CUDA_CHECK(cudaMemcpyAsync(vc + size_t(pos0) * row, v_.data(), size_t(n_tok) * row, cudaMemcpyDeviceToDevice, s_));
  const int64_t n_kv = pos0 + n_tok;
  const float scale = 1.0f / std::sqrt(float(hd));
  if (n_tok == 1 && cuda::decode_attn_supports(hd, c_.n_head / c_.n_kv_head)) {
    const int n_split = cuda::decode_attn_splits(c_.n_kv_head, n_kv);
    if (n_split > n_split_cap_) {
      part_out_ = DeviceBuffer(size_t(n_split) * size_t(q_dim_) * 4);
      part_lse_ = DeviceBuffer(size_t(n_split) * size_t(c_.n_head) * 4);
      n_split_cap_ = n_split;
    }
    DecodeAttnParams p;
    p.n_seq = 1;
    p.n_head = c_.n_head;
    p.n_kv_head = c_.n_kv_head;
    p.head_dim = hd;
    p.scale = scale;
    p.elt = KvElt::bf16;
    p.row_stride = int64_t(hd) * 2;  // kv head g of a token at + g * head_dim
    p.tok_stride = int64_t(row);
    p.n_tok = n_kv;
    p.n_split = n_split;
    cuda::decode_attn(p, q_.data(), kc, vc, nullptr, part_out_.data<float>(), part_lse_.data<float>(), s_);
    cuda::attn_merge(n_split, c_.n_head, hd, part_out_.data<float>(), part_lse_.data<float>(), att_.data(), nullptr,
                     nullptr, s_);
    return;
  }
  cuda::FlashPrefillParams p;
  p.n_head = c_.n_head;
  p.n_kv_head = c_.n_kv_head;
  p.head_dim = hd;
  p.scale = scale;
  p.n_q = n_tok;
  p.n_kv = n_kv;
  p.q_tok_stride = q_dim_;
  p.kv_tok_stride = kv_dim_;
  p.out_tok_stride = q_dim_;
  cuda::flash_prefill(p, q_.data(), kc, vc, att_.data(), s_);
}

void bf16_to_f32_rows(const PinnedBuffer& src, std::vector<float>& dst, size_t n) {
  const uint16_t* b = src.host<uint16_t>();
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(b[i]);
}

// The layer's new keys (before and after RoPE) and values into the host store.
void CudaSequence::append_host(int layer, KvStore& kv, int n_tok) {
  const size_t nk = size_t(n_tok) * size_t(kv_dim_);
  cuda::copy_d2h_async(h_k_.host(), k_.data(), nk * 2, s_);
  cuda::copy_d2h_async(h_v_.host(), v_.data(), nk * 2, s_);
  KVT_CUDA_CHECK(cudaStreamSynchronize(s_));
  bf16_to_f32_rows(h_kpre_, f_kpre_, nk);
  bf16_to_f32_rows(h_k_, f_k_, nk);
  bf16_to_f32_rows(h_v_, f_v_, nk);
  kv.append(layer, f_kpre_.data(), f_k_.data(), f_v_.data(), n_tok);
}

void CudaSequence::attend_host(int layer, KvStore& kv, int n_tok) {
  const size_t nq = size_t(n_tok) * size_t(q_dim_);
  append_host(layer, kv, n_tok);
  cuda::copy_d2h_async(h_q_.host(), q_.data(), nq * 2, s_);
  KVT_CUDA_CHECK(cudaStreamSynchronize(s_));
  bf16_to_f32_rows(h_q_, f_q_, nq);
  kv.attend(layer, f_q_.data(), n_tok, 1.0f / std::sqrt(float(c_.head_dim)), f_att_.data());
  uint16_t* a = h_att_.host<uint16_t>();
  for (size_t i = 0; i < nq; ++i) a[i] = f32_to_bf16(f_att_[i]);
  cuda::copy_h2d_async(att_.data(), h_att_.host(), nq * 2, s_);
}

void CudaSequence::forward(const int32_t* tokens, int n_tok, int64_t pos0, KvStore& kv, int n_logits,
                           float* logits) {
  const ModelConfig& c = c_;
  KVT_CHECK(n_tok > 0 && n_tok <= cap_, "GPU forward: {} tokens, the sequence holds {}", n_tok, cap_);
  KVT_CHECK(n_logits >= 0 && n_logits <= n_tok, "GPU forward: n_logits {} out of [0, {}]", n_logits, n_tok);
  for (int t = 0; t < n_tok; ++t)
    KVT_CHECK(tokens[t] >= 0 && tokens[t] < c.n_vocab, "token id {} out of vocabulary ({})", tokens[t], c.n_vocab);
  // Dense prefill of an offloading store: attention over the GPU copy of the
  // prompt (the same function as the store's), K/V appended to the store (or
  // to the GPU tiers of a natively decoding policy).
  const bool gpu_prefill = !native_ && kv.dense_attention_now();
  const bool tiered_decode = tiered_ && !gpu_prefill;
  KVT_CHECK(!tiered_decode || n_tok == 1, "GPU forward: the tiered decode step takes one token, not {}", n_tok);
  if (tiered_decode && !tiered_->decoding()) tiered_->start_decode(n_cached_);
  if (native_ || gpu_prefill) {
    KVT_CHECK(pos0 == n_cached_, "GPU forward: position {} but {} tokens are cached", pos0, n_cached_);
    reserve_cache(pos0 + n_tok);
  } else if (ctx_cap_ > 0) {  // decoding from the store: the prompt's GPU copy is no longer needed
    kc_ = DeviceBuffer();
    vc_ = DeviceBuffer();
    ctx_cap_ = 0;
  }
  std::vector<int64_t> positions(static_cast<size_t>(n_tok));  // [n_tok]
  for (int t = 0; t < n_tok; ++t) positions[size_t(t)] = pos0 + t;
  // Pageable sources: cudaMemcpyAsync stages them before returning.
  KVT_CUDA_CHECK(cudaMemcpyAsync(ids_.data(), tokens, size_t(n_tok) * 4, cudaMemcpyHostToDevice, s_));
  KVT_CUDA_CHECK(cudaMemcpyAsync(pos_.data(), positions.data(), size_t(n_tok) * 8, cudaMemcpyHostToDevice, s_));

  const int E = c.n_embd, hd = c.head_dim;
  cuda::Gemm& gemm = m_.gemm_;
  cuda::embed_rows(m_.tok_embd_.data(), ids_.data<int32_t>(), n_tok, E, x_.data(), s_);
  const void* delta = nullptr;  // the previous block's output, added to x by the next norm
  for (int l = 0; l < c.n_layer; ++l) {
    const GpuLayer& L = m_.layers_[size_t(l)];
    // Attention block.
    cuda::add_rmsnorm(x_.data(), delta, L.attn_norm.data(), n_tok, E, c.rms_eps, xb_.data(), s_);
    gemm.run(n_tok, q_dim_, E, xb_.data(), L.wq.data(), q_.data(), s_);   // q: [n_tok, n_head, hd]
    gemm.run(n_tok, kv_dim_, E, xb_.data(), L.wk.data(), k_.data(), s_);  // k: [n_tok, n_kv_head, hd]
    gemm.run(n_tok, kv_dim_, E, xb_.data(), L.wv.data(), v_.data(), s_);  // v: [n_tok, n_kv_head, hd]
    if (L.bq.bytes()) cuda::add_bias(q_.data(), L.bq.data<float>(), n_tok, int(q_dim_), s_);
    if (L.bk.bytes()) cuda::add_bias(k_.data(), L.bk.data<float>(), n_tok, int(kv_dim_), s_);
    if (L.bv.bytes()) cuda::add_bias(v_.data(), L.bv.data<float>(), n_tok, int(kv_dim_), s_);
    if (L.q_norm.bytes())
      cuda::add_rmsnorm(q_.data(), nullptr, L.q_norm.data(), int64_t(n_tok) * c.n_head, hd, c.rms_eps, q_.data(), s_);
    if (L.k_norm.bytes())
      cuda::add_rmsnorm(k_.data(), nullptr, L.k_norm.data(), int64_t(n_tok) * c.n_kv_head, hd, c.rms_eps, k_.data(),
                        s_);
    if (!native_ && !tiered_) cuda::copy_d2h_async(h_kpre_.host(), k_.data(), size_t(n_tok) * size_t(kv_dim_) * 2, s_);
    cuda::rope(q_.data(), n_tok, q_dim_, c.n_head, hd, pos_.data<int64_t>(), m_.inv_freq_.data<float>(),
               c.rope_interleaved, s_);
    cuda::rope(k_.data(), n_tok, kv_dim_, c.n_kv_head, hd, pos_.data<int64_t>(), m_.inv_freq_.data<float>(),
               c.rope_interleaved, s_);
    if (tiered_) tiered_->append(l, k_.data(), v_.data(), kv_dim_, pos0, n_tok, s_);
    else if (gpu_prefill) append_host(l, kv, n_tok);
    if (native_ || gpu_prefill) attend_gpu(l, pos0, n_tok);  // att: [n_tok, n_head, hd]
    else if (tiered_) tiered_->attend(l, q_.data(), 1.0f / std::sqrt(float(hd)), att_.data(), s_);
    else attend_host(l, kv, n_tok);
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
  if (native_ || gpu_prefill || tiered_) n_cached_ += n_tok;
  if (n_logits > 0) {
    cuda::add_rmsnorm(x_.data(), delta, m_.out_norm_.data(), n_tok, E, c.rms_eps, xb_.data(), s_);
    const uint16_t* last = xb_.data<uint16_t>() + size_t(n_tok - n_logits) * size_t(E);  // [n_logits, n_embd]
    const void* head = m_.output_.bytes() ? m_.output_.data() : m_.tok_embd_.data();
    gemm.run_f32(n_logits, c.n_vocab, E, last, head, logits_.data<float>(), s_);  // [n_logits, n_vocab]
    KVT_CUDA_CHECK(cudaMemcpyAsync(logits, logits_.data(), size_t(n_logits) * size_t(c.n_vocab) * 4,
                                   cudaMemcpyDeviceToHost, s_));
  }
  KVT_CUDA_CHECK(cudaStreamSynchronize(s_));
}

std::unique_ptr<GpuSequence> CudaModel::start(int capacity, const KvStore& kv, int64_t n_ctx) {
  // `full` is plain dense attention over every token: the GPU keeps that
  // cache itself. Every other store selects, quantizes or analyses on the host.
  // (A `full` store at another precision than bf16 — f32 reference runs,
  // fp8 — goes through the host path, which keeps its rounding exact.)
  // A tiered store whose policy the GPU decodes natively (gpu_tiered_kv.h)
  // gets the GPU tiers; any other keeps its CPU store.
  bool native = false;
  if (dynamic_cast<const FullKvStore*>(&kv)) native = parse_policy(kv.describe()).kv == "bf16";
  if (const auto* t = dynamic_cast<const TieredKvStore*>(&kv)) {
    const std::string why = gpu_tiered_unsupported(t->config(), model_.kv_geometry());
    if (why.empty()) {
      auto seq = std::make_unique<CudaSequence>(*this, capacity, false, &t->config());
      seq->reserve(n_ctx);
      return seq;
    }
    const std::string policy = to_string(t->config());
    if (noted_.insert(policy).second)
      fmt::print(stderr,
                 "note: --device cuda: policy {} decodes through the CPU store (one host round trip per layer): {}; "
                 "yakv and its fp8/bf16 host variants decode natively on the GPU (head_dim 128)\n",
                 policy, why);
  }
  auto seq = std::make_unique<CudaSequence>(*this, capacity, native, nullptr);
  seq->reserve(n_ctx);
  return seq;
}

}  // namespace

std::unique_ptr<GpuModel> make_gpu_model(const Model& model) {
  KVT_CHECK(cuda_device_count() > 0, "--device cuda: no CUDA device found ({})", cuda_device_summary());
  return std::make_unique<CudaModel>(model);
}

}  // namespace kvtier
