// GpuModel's weights on CUDA (model_cuda.h): every weight of the Model's
// source dequantized to bf16 and uploaded (MoE experts one at a time), or
// random weights at the model's shape made on the GPU. The forward pass that
// reads them is in model_cuda.cpp.
#include <cmath>
#include <vector>

#include "core/half.h"
#include "core/threads.h"
#include "model/model_cuda_detail.h"
#include "ops/dequant/dequant.h"
#include "ops/gemm/gemm_fp8_cuda.h"
#include "ops/rope/rope.h"

namespace kvtier::model_cuda_detail {
namespace {

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

}  // namespace

CudaModel::CudaModel(const Model& model, bool graphs, PrefillGemm prefill_gemm)
    : model_(model), c_(model.config()), graphs_(graphs), prefill_fp8_(prefill_gemm == PrefillGemm::fp8) {
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
  if (prefill_fp8_) {
    cuda::require_fp8_tensor_cores("--prefill-gemm fp8 products");
    bool any_dense = false;  // a layer with the SwiGLU block (MoE models may have some)
    for (int l = 0; l < c.n_layer; ++l) any_dense = any_dense || !c.is_moe_layer(l);
    KVT_CHECK(E % 16 == 0 && q_dim % 16 == 0 && (!any_dense || c.n_ff % 16 == 0),
              "{}: --prefill-gemm fp8 needs n_embd {}, n_head * head_dim {} and n_ff {} to be multiples of 16",
              src.path, E, q_dim, c.n_ff);
  }
  if (src.shape_only) {
    random_weights();
    if (prefill_fp8_) make_fp8_copies();
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
    std::vector<uint16_t> qkv = to_bf16(src.tensor(name("attn_q.weight")), q_dim, E);
    for (const char* w : {"attn_k.weight", "attn_v.weight"}) {
      const std::vector<uint16_t> part = to_bf16(src.tensor(name(w)), kv_dim, E);
      qkv.insert(qkv.end(), part.begin(), part.end());
    }
    L.wqkv = upload(qkv, total);
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
  if (prefill_fp8_) make_fp8_copies();
}

// The FP8 copies of the dense matrices, quantized on the GPU from their bf16
// values: one scale per output channel (ops/gemm/gemm_fp8.h).
void CudaModel::make_fp8_copies() {
  const ModelConfig& c = c_;
  const int64_t E = c.n_embd, q_dim = int64_t(c.n_head) * c.head_dim, kv_dim = int64_t(c.n_kv_head) * c.head_dim;
  const cudaStream_t s = static_cast<cudaStream_t>(dev_.exec().stream);
  auto fp8 = [&](const void* w, int64_t n_out, int64_t n_in) {
    Fp8Matrix m{DeviceBuffer(size_t(n_out * n_in)), DeviceBuffer(size_t(n_out) * 4)};
    cuda::quantize_rows_fp8(w, n_out, n_in, 0, m.q.data<uint8_t>(), m.scale.data<float>(), s);
    fp8_bytes_ += m.q.bytes() + m.scale.bytes();
    return m;
  };
  for (int l = 0; l < c.n_layer; ++l) {
    GpuLayer& L = layers_[size_t(l)];
    const uint16_t* wqkv = L.wqkv.data<uint16_t>();  // wq's rows, then wk's, then wv's
    L.wq8 = fp8(wqkv, q_dim, E);
    L.wk8 = fp8(wqkv + q_dim * E, kv_dim, E);
    L.wv8 = fp8(wqkv + (q_dim + kv_dim) * E, kv_dim, E);
    L.wo8 = fp8(L.wo.data(), E, q_dim);
    if (c.is_moe_layer(l)) continue;
    L.w_gate_up8 = fp8(L.w_gate_up.data(), 2 * int64_t(c.n_ff), E);
    L.w_down8 = fp8(L.w_down.data(), E, c.n_ff);
  }
  weight_bytes_ += fp8_bytes_;
  KVT_CUDA_CHECK(cudaStreamSynchronize(s));
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
    L.wqkv = mat(q_dim + 2 * kv_dim, E);
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

}  // namespace kvtier::model_cuda_detail
