// The KV store facade: every attention in the model reads through it. The
// engine appends each layer's new keys/values and asks it to attend; the store
// decides where tokens live (host tier, GPU tier), what the key index holds,
// and which tokens each head attends to. `full` is plain dense attention.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/kv_report.h"

namespace kvtier {

struct KvGeometry {
  int n_layer = 0;
  int n_head = 0;     // query heads
  int n_kv_head = 0;  // key/value heads (GQA groups: n_head / n_kv_head)
  int head_dim = 0;
  // The model's RoPE applied in place to keys at the given positions:
  // k: [n, n_kv_head, head_dim] f32, pos: [n]. Needed by policies that rebuild
  // post-RoPE keys (shadowkv's SVD, host keys stored before RoPE); may be
  // left empty otherwise (make_kv_store then refuses those policies).
  std::function<void(float* k, const int64_t* pos, int64_t n)> apply_rope;
  // The same RoPE as data, for either device: angle t · rope_inv_freq[i],
  // pairs (i, i + head_dim/2), or (2i, 2i+1) when interleaved.
  std::vector<float> rope_inv_freq;  // [head_dim / 2]
  bool rope_interleaved = false;
};

// g itself, after checking that its counts are positive and n_head a
// multiple of n_kv_head (what every store's constructor needs).
const KvGeometry& checked_geometry(const KvGeometry& g);

enum class KvPhase { prefill, decode };

class KvStore {
 public:
  virtual ~KvStore() = default;

  // Appends n_tok tokens to `layer`, at positions [n_tokens(layer), +n_tok).
  // k_pre: [n_tok, n_kv_head, head_dim] f32 keys before RoPE (SVD indexes use them)
  // k:     [n_tok, n_kv_head, head_dim] f32 keys after RoPE
  // v:     [n_tok, n_kv_head, head_dim] f32
  virtual void append(int layer, const float* k_pre, const float* k, const float* v,
                      int n_tok) = 0;

  // Causal attention for the last n_tok appended positions of `layer`: query i
  // sees tokens [0, n_tokens(layer) - n_tok + i].
  // q:   [n_tok, n_head, head_dim] f32 after RoPE
  // out: [n_tok, n_head, head_dim] f32
  virtual void attend(int layer, const float* q, int n_tok, float scale, float* out) = 0;

  // Prefill is dense; decode uses the policy's selection. The engine switches
  // to decode after the prompt (policies build their indexes then).
  virtual void set_phase(KvPhase phase) = 0;

  // True while attend() would be plain causal attention over every appended
  // token at bf16 precision or better (a tiered store's dense prefill): a GPU
  // backend may then attend itself and only append here.
  virtual bool dense_attention_now() const { return false; }

  virtual int64_t n_tokens(int layer) const = 0;
  virtual KvMemory memory() const = 0;
  virtual std::string describe() const = 0;  // the resolved policy, one line
};

// Builds a store from a policy string (see kv/policy.h; "full" at least).
// Throws kvtier::Error for a string that makes no sense.
std::unique_ptr<KvStore> make_kv_store(const std::string& policy, const KvGeometry& geometry);

}  // namespace kvtier
