// Token sampling: greedy, or temperature → top-k → top-p (nucleus) with a
// seeded generator, the order llama.cpp's default chain uses.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "kvtier/engine.h"

namespace kvtier {

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // logits: [n_vocab] f32 (left unchanged)
  int32_t sample(const float* logits, int n_vocab);
  // Whether sample() is the logits' argmax (ops/argmax/argmax.h), which a
  // GPU decode step can compute where the logits are.
  bool greedy() const { return p_.temperature <= 0.0f || p_.top_k == 1; }

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
};

}  // namespace kvtier
