// The loaded model on a CUDA GPU: every weight of the Model's source
// dequantized to bf16 and uploaded, and the same straight-line forward as
// Model::forward (src/model/llama_forward.cpp) over the CUDA kernels of
// src/ops (cuBLASLt GEMM, fused residual-add RMSNorm, RoPE, SwiGLU, flash
// prefill, split-K decode attention; the MoE block of Qwen3-MoE / Mixtral
// layers: ops/moe/moe_cuda.h). Includable without the CUDA toolkit:
// without KVT_CUDA, make_gpu_model comes from backend/cuda_stub.cpp and says
// why it cannot run (STYLE rule 14).
//
// Where the KV cache lives depends on the sequence's store:
// - `full` (FullKvStore): K/V in bf16 on the GPU, attention on the GPU; the
//   KvStore passed to forward() is left untouched (memory() reports the GPU
//   cache instead).
// - a tiered policy the GPU decodes natively (gpu_tiered_kv.h: per-token
//   higgs2 landmarks at head_dim 128, HIGGS4, fp8 or bf16 host K/V — yakv
//   and its variants): the GPU keeps the key index,
//   the resident tokens and, in pinned host memory, the host tier, and runs
//   the whole decode step as kernels with no host synchronization; the
//   KvStore passed to forward() is left untouched, as under `full`.
// - every other policy (oracle, shadowkv, chunked landmarks, head_dim 64,
//   analysis...): the CPU store keeps selecting and storing: each layer's new
//   k/v are copied to the host and appended to the store. In decode, q goes
//   to the host and the store's attention output comes back. Correct for
//   every preset, but one synchronization per layer.
// While a tiered store's prefill is dense, the GPU attends over its own bf16
// copy of the prompt (freed when decoding starts).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kv/kv_store.h"

namespace kvtier {

class Model;
class GpuTieredKv;

// Where a GPU sequence keeps its KV cache (see above).
enum class KvPath { gpu_full, gpu_tiered, host_store };

// One sequence's forward state on the GPU (activations, and the KV cache for
// `full`). Not thread-safe; one sequence at a time per GpuModel.
class GpuSequence {
 public:
  virtual ~GpuSequence() = default;
  // The contract of Model::forward: tokens [n_tok] at positions
  // [pos0, pos0 + n_tok); logits: [n_logits, n_vocab] f32 on the host for
  // the last n_logits tokens. Returns when the logits are on the host.
  virtual void forward(const int32_t* tokens, int n_tok, int64_t pos0, KvStore& kv, int n_logits,
                       float* logits) = 0;
  // True when K/V live on the GPU (policy `full`), false when in `kv`.
  virtual bool kv_on_gpu() const = 0;
  virtual KvPath kv_path() const = 0;
  // The GPU tiers of a natively decoding tiered policy, else null.
  virtual const GpuTieredKv* tiered() const = 0;
  // The sequence's KV accounting: the GPU cache for `full`, else kv.memory().
  virtual KvMemory memory(const KvStore& kv) const = 0;
};

class GpuModel {
 public:
  virtual ~GpuModel() = default;
  // capacity: most tokens per forward (the prefill chunk); kv: the store the
  // sequence will pass to forward() (its policy decides where K/V live);
  // n_ctx: the most tokens it will hold, when known (the GPU cache or the
  // GPU tiers are then sized once instead of grown), else 0.
  virtual std::unique_ptr<GpuSequence> start(int capacity, const KvStore& kv, int64_t n_ctx = 0) = 0;
  virtual size_t weight_bytes() const = 0;
  virtual std::string describe() const = 0;  // device and weight bytes, one line
};

// Uploads `model` (which must outlive the result) to CUDA device 0. Throws
// kvtier::Error when kvtier was built without CUDA, when there is no CUDA
// device, or when a shape is outside what the kernels support (head_dim 64
// or 128; n_embd, n_ff and the expert width multiples of 8; up to 1024
// experts, 32 per token).
std::unique_ptr<GpuModel> make_gpu_model(const Model& model);

}  // namespace kvtier
