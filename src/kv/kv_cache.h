// The KV cache of one sequence, on one device: what the model's forward pass
// appends to and attends through, every layer. Activations are the device's:
// f32 host pointers on the CPU, bf16 device pointers on CUDA ([n_tok, heads,
// head_dim] rows, tok_stride elements apart). Implementations: `full`
// (full_kv.*: every token resident, dense attention) and the tiered policies
// (tiered_kv.*: key index + resident tokens + host tier; prefill is dense
// over a working copy, decode runs decode_step.cpp).
#pragma once
#include <cstdint>
#include <memory>

#include "backend/device.h"
#include "kv/kv_plan.h"
#include "kvtier/kv_report.h"

namespace kvtier {

class KvCache {
 public:
  virtual ~KvCache() = default;
  virtual const KvPlan& plan() const = 0;
  // Tokens [n_tokens(layer), + n_tok) of `layer`: k_pre (before RoPE; may be
  // null unless the policy needs it), k (after RoPE), v.
  virtual void append(int layer, const void* k_pre, const void* k, const void* v, int64_t tok_stride, int n_tok) = 0;
  // Causal attention of the last n_tok appended positions of `layer`:
  // q [n_tok, n_head, head_dim] → out, rows q_stride elements apart.
  virtual void attend(int layer, const void* q, int64_t q_stride, int n_tok, float scale, void* out) = 0;
  // Before layer 0 of every forward pass (n_tok tokens at the cache's end): in
  // decode, the step's host-side staging (positions, lengths) and its small
  // uploads. The layers' appends and attends after it take their lengths from
  // device memory, so a captured graph of them replays every step.
  virtual void begin_step(int n_tok) {}
  // Changes whenever a buffer that decode steps read or write moves (growth,
  // a new batch): a captured graph of the step is valid while it holds.
  virtual uint64_t graph_token() const { return 0; }
  // Whether a decode step's appends and attends may be captured as a graph.
  virtual bool graph_safe() const { return false; }
  // After the prompt: the index is finished and decoding starts.
  virtual void start_decode() = 0;
  virtual bool decoding() const = 0;
  virtual int64_t n_tokens(int layer) const = 0;
  // Room for n tokens without growing (GPU memory is taken up front).
  virtual void reserve(int64_t n) = 0;
  virtual KvMemory memory() const = 0;
  virtual KvStats stats() const = 0;
};

// Throws kvtier::LimitError when memory runs out.
std::unique_ptr<KvCache> make_kv_cache(const KvPlan& plan, const Device& dev);

}  // namespace kvtier
