#include "bench/fidelity.h"

#include <algorithm>
#include <cmath>

#include "core/status.h"
#include "ops/argmax/argmax.h"

namespace kvtier::bench {

void log_softmax(const float* logits, int n, float* out) {
  const float mx = *std::max_element(logits, logits + n);
  double z = 0;
  for (int i = 0; i < n; ++i) z += std::exp(double(logits[i]) - mx);
  const double lz = std::log(z) + mx;
  for (int i = 0; i < n; ++i) out[i] = float(double(logits[i]) - lz);
}

FidelityReference::FidelityReference(std::vector<int32_t> answer, int n_vocab)
    : answer_(std::move(answer)), n_vocab_(n_vocab) {
  KVT_CHECK(!answer_.empty(), "fidelity: empty answer");
  KVT_CHECK(n_vocab_ > 0, "fidelity: vocabulary of {} tokens", n_vocab_);
  for (int32_t t : answer_)
    KVT_CHECK(t >= 0 && t < n_vocab_, "fidelity: answer token {} outside the vocabulary [0, {})", t, n_vocab_);
  log_probs_.reserve(answer_.size() * size_t(n_vocab_));
}

void FidelityReference::add(const float* logits) {
  KVT_CHECK(!complete(), "fidelity: more rows than the {} answer tokens", answer_.size());
  const size_t at = log_probs_.size();
  log_probs_.resize(at + size_t(n_vocab_));
  log_softmax(logits, n_vocab_, &log_probs_[at]);
  argmax_.push_back(argmax_ref(logits, n_vocab_));
}

FidelityStats FidelityReference::stats() const {
  KVT_CHECK(complete(), "fidelity: reference has {} of {} rows", n_rows(), answer_.size());
  FidelityStats s;
  s.n_tokens = n_rows();
  for (int64_t i = 0; i < n_rows(); ++i) {
    s.answer_nll -= log_probs(i)[answer_[size_t(i)]];
    s.answer_token_acc += argmax(i) == answer_[size_t(i)];
  }
  s.answer_nll /= double(s.n_tokens);
  s.answer_token_acc /= double(s.n_tokens);
  s.top1_agree_full = 1;
  s.kl_full = 0;
  return s;
}

FidelityAccumulator::FidelityAccumulator(const FidelityReference& full) : full_(full), lp_(size_t(full.n_vocab())) {
  KVT_CHECK(full.complete(), "fidelity: the full-attention reference is incomplete");
}

void FidelityAccumulator::add(int64_t i, const float* logits) {
  KVT_CHECK(i == n_ && i < full_.n_rows(), "fidelity: position {} added out of order (expected {} of {})", i, n_,
            full_.n_rows());
  const int nv = full_.n_vocab();
  log_softmax(logits, nv, lp_.data());
  const int32_t target = full_.answer()[size_t(i)];
  const int32_t top = argmax_ref(logits, nv);
  nll_ -= lp_[size_t(target)];
  acc_ += top == target;
  agree_ += top == full_.argmax(i);
  // KL(p ‖ q) = Σ p (log p − log q); terms with p = 0 (underflow) add nothing.
  const float* lf = full_.log_probs(i);
  double kl = 0;
  for (int v = 0; v < nv; ++v) {
    const double p = std::exp(double(lf[v]));
    if (p > 0) kl += p * (double(lf[v]) - double(lp_[size_t(v)]));
  }
  kl_ += std::max(0.0, kl);  // rounding can leave a tiny negative value
  ++n_;
}

FidelityStats FidelityAccumulator::stats() const {
  KVT_CHECK(n_ == full_.n_rows(), "fidelity: {} of {} positions added", n_, full_.n_rows());
  FidelityStats s;
  s.n_tokens = n_;
  const double n = double(n_);
  s.answer_nll = nll_ / n;
  s.answer_token_acc = acc_ / n;
  s.top1_agree_full = agree_ / n;
  s.kl_full = kl_ / n;
  return s;
}

}  // namespace kvtier::bench
