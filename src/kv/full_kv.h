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
// policy's precision (kv=bf16 by default, f32 for exact reference runs). The
// CPU keeps the dequantized rows (bit-identical to decoding the records).
class FullKvStore : public KvStore {
 public:
  FullKvStore(const PolicyConfig& p, const KvGeometry& g);
  void append(int layer, const float* k_pre, const float* k, const float* v, int n_tok) override;
  void attend(int layer, const float* q, int n_tok, float scale, float* out) override;
  void set_phase(KvPhase phase) override { phase_ = phase; }
  int64_t n_tokens(int layer) const override { return n_tok_[layer]; }
  KvMemory memory() const override;
  std::string describe() const override;

  // [n_tokens, n_kv_head, head_dim] f32 of `layer` (analysis reads them).
  const float* keys(int layer) const { return k_[layer].data(); }
  const float* values(int layer) const { return v_[layer].data(); }

 private:
  PolicyConfig p_;
  KvGeometry g_;
  QuantSpec spec_;
  KvPhase phase_ = KvPhase::prefill;
  std::vector<int64_t> n_tok_;
  std::vector<std::vector<float>> k_, v_;  // per layer [n_tok, n_kv_head, head_dim]
  std::vector<uint8_t> scratch_;
};

}  // namespace kvtier
