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

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
};

// Index of the largest logit (the lowest index among ties).
int32_t argmax(const float* logits, int n);

}  // namespace kvtier
