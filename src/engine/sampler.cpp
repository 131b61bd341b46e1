#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "ops/argmax/argmax.h"

namespace kvtier {

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}

int32_t Sampler::sample(const float* logits, int n_vocab) {
  if (greedy()) return argmax_ref(logits, n_vocab);
  // Tokens at -inf (forbidden by a constraint) are never candidates, so that
  // rounding in the draw below cannot land on one.
  cand_.clear();
  for (int i = 0; i < n_vocab; ++i)
    if (logits[i] > -INFINITY) cand_.push_back({logits[i], i});
  if (cand_.empty()) return argmax_ref(logits, n_vocab);
  size_t n = cand_.size();
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  if (p_.top_k > 0 && size_t(p_.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
    n = size_t(p_.top_k);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Softmax at temperature over the kept candidates (sorted, largest first).
  const float mx = cand_[0].first;
  std::vector<double> prob(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    prob[i] = std::exp(double(cand_[i].first - mx) / p_.temperature);
    sum += prob[i];
  }
  if (p_.top_p < 1.0f) {
    double cum = 0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      cum += prob[i] / sum;
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
    sum = 0;
    for (size_t i = 0; i < n; ++i) sum += prob[i];
  }
  std::uniform_real_distribution<double> u(0.0, sum);
  double r = u(rng_);
  for (size_t i = 0; i < n; ++i) {
    r -= prob[i];
    if (r <= 0) return cand_[i].second;
  }
  return cand_[n - 1].second;
}

}  // namespace kvtier
