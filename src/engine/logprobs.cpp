#include "engine/logprobs.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace kvtier {

TokenLogprob token_logprob(const float* logits, int n_vocab, int32_t token, int n_top) {
  // log p_i = x_i - (m + log Σ exp(x_j - m)), m = max x: no overflow.
  float m = logits[0];
  for (int i = 1; i < n_vocab; ++i) m = std::max(m, logits[i]);
  double sum = 0;
  for (int i = 0; i < n_vocab; ++i) sum += std::exp(double(logits[i]) - double(m));
  const double lse = double(m) + std::log(sum);
  TokenLogprob r;
  r.token = token;
  r.logprob = float(double(logits[token]) - lse);
  n_top = std::clamp(n_top, 0, n_vocab);
  if (n_top > 0) {
    std::vector<int32_t> ids(static_cast<size_t>(n_vocab));
    for (int i = 0; i < n_vocab; ++i) ids[size_t(i)] = i;
    std::partial_sort(ids.begin(), ids.begin() + n_top, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int k = 0; k < n_top; ++k)
      r.top.push_back({ids[size_t(k)], float(double(logits[ids[size_t(k)]]) - lse)});
  }
  return r;
}

}  // namespace kvtier
