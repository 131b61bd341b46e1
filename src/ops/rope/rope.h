// Rotary position embedding with the frequency schedules of the supported
// families: plain (theta^(-2i/d)), Llama-3.1 scaling, linear scaling, and
// per-frequency divisors from a GGUF rope_freqs tensor.
#pragma once
#include <cstdint>
#include <vector>

#include "kvtier/model_config.h"

namespace kvtier {

class Rope {
 public:
  // freq_divisors: optional [head_dim/2] (GGUF rope_freqs.weight), else empty.
  Rope(const ModelConfig& cfg, std::vector<float> freq_divisors = {});

  // x: [n_tok, n_heads, head_dim] f32, rotated in place; token t sits at positions[t].
  void apply(float* x, int64_t n_tok, int n_heads, const int64_t* positions) const;
  void apply_ref(float* x, int64_t n_tok, int n_heads, const int64_t* positions) const;

  const std::vector<float>& inv_freq() const { return inv_freq_; }  // [head_dim/2]

 private:
  int head_dim_;
  bool interleaved_;
  std::vector<float> inv_freq_;
};

}  // namespace kvtier
