// The `full` policy on the CPU: every token's K/V resident, dense attention.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kv/kv_store.h"
#include "kv/policy.h"
#include "ops/quant/quant_format.h"

namespace kvtier {

// The `full` policy: dense attention over every token, K/V held at the
// policy's precision (kv=bf16 by default, f32 for exact reference runs).
//
// Prefill keeps f32 rows (the stored values, dequantized) for sgemm
// attention. From set_phase(decode) on, kv=bf16 and kv=fp8 keep only their
// stored elements, per KV head ([n_kv_head, capacity, head_dim]), and decode
// attention reads them in place (decode_attn_cpu): no per-step conversion of
// the cache, half (bf16) or a quarter (fp8) of the f32 bytes per step. Other
// precisions (f32, higgs…) stay f32 rows, dequantized from their records.
class FullKvStore : public KvStore {
 public:
  FullKvStore(const PolicyConfig& p, const KvGeometry& g);
  void append(int layer, const float* k_pre, const float* k, const float* v, int n_tok) override;
  void attend(int layer, const float* q, int n_tok, float scale, float* out) override;
  void set_phase(KvPhase phase) override;
  int64_t n_tokens(int layer) const override { return n_tok_[layer]; }
  KvMemory memory() const override;
  std::string describe() const override;

  // [n_tokens, n_kv_head, head_dim] f32 of `layer` (analysis reads them);
  // only while the store holds f32 rows (kv=f32 always, others in prefill).
  const float* keys(int layer) const;
  const float* values(int layer) const;

 private:
  // Stored elements of one layer, per KV head: [n_kv_head, cap, head_dim].
  struct RawLayer {
    std::vector<uint8_t> k, v;
    int64_t cap = 0;  // tokens per head
  };
  bool raw_now() const { return raw_elt_ && phase_ == KvPhase::decode; }
  void raw_reserve(int layer, int64_t n_total);
  // Appends n_tok token-major records [n_tok, n_kv_head·head_dim] to the raw layer.
  void raw_append(int layer, const uint8_t* k_rec, const uint8_t* v_rec, int64_t n_tok);
  // Widens raw tokens [0, n) of `layer` to token-major f32 (multi-token attends after prefill).
  void raw_widen(int layer, int64_t n, float* k, float* v) const;
  void attend_raw(int layer, const float* q, int n_tok, float scale, float* out);

  PolicyConfig p_;
  KvGeometry g_;
  QuantSpec spec_;
  KvPhase phase_ = KvPhase::prefill;
  bool raw_elt_ = false;  // kv=bf16 or kv=fp8: decode reads the stored elements
  int elt_bytes_ = 4;
  std::vector<int64_t> n_tok_;
  std::vector<std::vector<float>> k_, v_;  // per layer [n_tok, n_kv_head, head_dim] f32 (not raw_now())
  std::vector<RawLayer> raw_;              // per layer (raw_now())
  std::vector<uint8_t> scratch_, scratch_v_;
  std::vector<float> part_out_, part_lse_, wide_k_, wide_v_;
};

}  // namespace kvtier
