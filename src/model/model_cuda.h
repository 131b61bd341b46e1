// The loaded model on a CUDA GPU: every weight of the Model's source
// dequantized to bf16 and uploaded, and the same straight-line forward as
// Model::forward (llama_forward.cpp) over the CUDA ops (cuBLASLt GEMM, fused
// residual-add RMSNorm, RoPE, SwiGLU; the MoE block of Qwen3-MoE / Mixtral
// layers: ops/moe/moe_cuda.h, experts uploaded one at a time). Attention
// goes through the sequence's KvCache, which holds K/V wherever its plan
// says (kv/kv_plan.h): the forward passes bf16 device rows and never moves
// KV itself. Includable
// without the CUDA toolkit: without CUDA, make_gpu_model comes from
// model_cuda_nocuda.cpp and says why it cannot run (STYLE rule 14).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/device.h"
#include "kv/kv_cache.h"

namespace kvtier {

class Model;

// One sequence's activations on the GPU. Not thread-safe.
class GpuSequence {
 public:
  virtual ~GpuSequence() = default;
  // The contract of Model::forward: tokens [n_tok] at positions
  // [pos0, pos0 + n_tok); logits: [n_logits, n_vocab] f32 on the host for
  // the last n_logits tokens. Returns when the logits are on the host.
  virtual void forward(const int32_t* tokens, int n_tok, int64_t pos0, KvCache& kv, int n_logits,
                       float* logits) = 0;
};

class GpuModel {
 public:
  virtual ~GpuModel() = default;
  // capacity: most tokens per forward (the prefill chunk).
  virtual std::unique_ptr<GpuSequence> start(int capacity) = 0;
  // One decode step of n_seq sequences together, Model::forward_decode's
  // contract on CUDA caches: tokens[i] at position pos[i], appended to and
  // attending through kvs[i] (policies may differ). The weight products run
  // once over the batch; attention runs per sequence. logits: [n_seq,
  // n_vocab] f32 on the host, row i copied there when want_logits is null
  // or want_logits[i] != 0. greedy, unless null: [n_seq], each row's argmax
  // (ops/argmax/argmax.h) computed on the GPU, so that a greedy sequence
  // needs no logits copied. Not thread-safe (one batch at a time).
  virtual void forward_decode(const int32_t* tokens, const int64_t* pos, KvCache* const* kvs, int n_seq,
                              float* logits, int32_t* greedy, const uint8_t* want_logits) = 0;
  virtual const Device& device() const = 0;
  virtual Device& device() = 0;
  virtual size_t weight_bytes() const = 0;
  virtual std::string describe() const = 0;  // device and weight bytes, one line
};

// Uploads `model` (which must outlive the result) to CUDA device 0. Throws
// kvtier::Error when kvtier was built without CUDA, when there is no CUDA
// device, or when a shape is outside what the kernels support (head_dim 64,
// 128 or 256; n_embd, n_ff and the expert width multiples of 8; up to 1024
// experts, 32 per token).
// graphs: decode steps replay a captured CUDA graph of the whole forward pass
// (captured once per KV layout; the first step after a change runs eagerly).
// prefill_gemm: the precision of the weight products of prompt chunks (a
// forward of more than one token of one sequence). fp8: E4M3 with one scale
// per token and per output channel (ops/gemm/gemm_fp8.h), over an FP8 copy of
// the dense layers' matrices made at load (half their bf16 bytes again; MoE
// experts stay bf16); it needs FP8 tensor cores. Decode steps stay bf16.
enum class PrefillGemm { bf16, fp8 };
std::unique_ptr<GpuModel> make_gpu_model(const Model& model, bool graphs = true,
                                         PrefillGemm prefill_gemm = PrefillGemm::bf16);

}  // namespace kvtier
