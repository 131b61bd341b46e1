// Fidelity of a KV policy to full attention, independent of how good the
// model is at the task: the reference answer is decoded teacher-forced under
// each policy (Engine::teacher_force) and every answer position's next-token
// distribution is compared with full attention's at the same position.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvtier::bench {

// Per-sample means over the answer tokens.
struct FidelityStats {
  int64_t n_tokens = 0;
  double answer_nll = 0;        // −log p(answer[i]), nats
  double answer_token_acc = 0;  // share of positions whose argmax is answer[i]
  double top1_agree_full = 0;   // share of positions whose argmax is full attention's argmax
  double kl_full = 0;           // KL(p_full ‖ p_policy), nats
};

// log softmax of logits[0..n) into out (f64 accumulation).
void log_softmax(const float* logits, int n, float* out);

// Full attention's distributions over one answer: the reference every policy
// of the sample is compared with. Rows are added in answer order.
class FidelityReference {
 public:
  FidelityReference(std::vector<int32_t> answer, int n_vocab);
  void add(const float* logits);  // [n_vocab], the logits that predict answer[n_rows()]
  int64_t n_rows() const { return static_cast<int64_t>(argmax_.size()); }
  bool complete() const { return n_rows() == static_cast<int64_t>(answer_.size()); }
  const std::vector<int32_t>& answer() const { return answer_; }
  int n_vocab() const { return n_vocab_; }
  const float* log_probs(int64_t i) const { return &log_probs_[static_cast<size_t>(i) * n_vocab_]; }
  int32_t argmax(int64_t i) const { return argmax_[static_cast<size_t>(i)]; }
  // Full attention's own statistics (KL 0, agreement 1).
  FidelityStats stats() const;

 private:
  std::vector<int32_t> answer_;
  int n_vocab_;
  std::vector<float> log_probs_;  // [n_rows, n_vocab]
  std::vector<int32_t> argmax_;   // [n_rows]
};

// One policy's pass over the same answer, compared position by position.
class FidelityAccumulator {
 public:
  explicit FidelityAccumulator(const FidelityReference& full);
  void add(int64_t i, const float* logits);  // [n_vocab], the logits that predict answer[i]
  FidelityStats stats() const;               // throws unless every position was added

 private:
  const FidelityReference& full_;
  std::vector<float> lp_;  // [n_vocab] scratch
  int64_t n_ = 0;
  double nll_ = 0, acc_ = 0, agree_ = 0, kl_ = 0;
};

}  // namespace kvtier::bench
