// Fidelity metrics on hand-computed distributions.
#include <gtest/gtest.h>

#include <cmath>

#include "bench/fidelity.h"
#include "core/status.h"

namespace kvtier::bench {
namespace {

TEST(Fidelity, LogSoftmax) {
  const float logits[] = {1.0f, 2.0f, 3.0f, 1000.0f};
  float lp[4];
  log_softmax(logits, 4, lp);
  double z = 0;
  for (float v : lp) z += std::exp(double(v));
  EXPECT_NEAR(z, 1.0, 1e-6);
  EXPECT_NEAR(lp[3], 0.0, 1e-6);  // no overflow with a large logit
  log_softmax(logits, 3, lp);
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  EXPECT_NEAR(lp[0], 1.0 - lse, 1e-6);
  EXPECT_NEAR(lp[2], 3.0 - lse, 1e-6);
}

TEST(Fidelity, HandComputedRows) {
  // Vocabulary of 2; answer tokens 1 then 0.
  FidelityReference full({1, 0}, 2);
  const float f0[] = {0.0f, 0.0f};                       // p = (0.5, 0.5): argmax 0 (ties go low)
  const float f1[] = {std::log(0.8f), std::log(0.2f)};  // p = (0.8, 0.2)
  full.add(f0);
  full.add(f1);
  ASSERT_TRUE(full.complete());
  const FidelityStats fs = full.stats();
  EXPECT_NEAR(fs.answer_nll, (std::log(2.0) - std::log(0.8)) / 2, 1e-6);
  EXPECT_DOUBLE_EQ(fs.answer_token_acc, 0.5);  // row 0 predicts 0, the answer is 1
  EXPECT_DOUBLE_EQ(fs.kl_full, 0);
  EXPECT_DOUBLE_EQ(fs.top1_agree_full, 1);

  FidelityAccumulator pol(full);
  const float q0[] = {std::log(0.9f), std::log(0.1f)};
  const float q1[] = {std::log(0.3f), std::log(0.7f)};
  pol.add(0, q0);
  pol.add(1, q1);
  const FidelityStats ps = pol.stats();
  const double kl0 = 0.5 * std::log(0.5 / 0.9) + 0.5 * std::log(0.5 / 0.1);
  const double kl1 = 0.8 * std::log(0.8 / 0.3) + 0.2 * std::log(0.2 / 0.7);
  EXPECT_NEAR(ps.kl_full, (kl0 + kl1) / 2, 1e-6);
  EXPECT_DOUBLE_EQ(ps.top1_agree_full, 0.5);  // row 0 agrees (0 = 0), row 1 does not
  EXPECT_DOUBLE_EQ(ps.answer_token_acc, 0.0);
  EXPECT_NEAR(ps.answer_nll, -(std::log(0.1) + std::log(0.3)) / 2, 1e-6);

  // The same logits as full's: no divergence.
  FidelityAccumulator same(full);
  same.add(0, f0);
  same.add(1, f1);
  EXPECT_NEAR(same.stats().kl_full, 0.0, 1e-9);
  EXPECT_DOUBLE_EQ(same.stats().top1_agree_full, 1.0);
  EXPECT_NEAR(same.stats().answer_nll, fs.answer_nll, 1e-9);
}

TEST(Fidelity, MisuseIsAnError) {
  EXPECT_THROW(FidelityReference({}, 4), Error);
  EXPECT_THROW(FidelityReference({4}, 4), Error);
  FidelityReference full({1, 0}, 2);
  const float f[] = {0.0f, 1.0f};
  EXPECT_THROW(full.stats(), Error);                // incomplete
  EXPECT_THROW(FidelityAccumulator{full}, Error);  // incomplete reference
  full.add(f);
  full.add(f);
  EXPECT_THROW(full.add(f), Error);  // more rows than answer tokens
  FidelityAccumulator acc(full);
  EXPECT_THROW(acc.add(1, f), Error);  // out of order
  acc.add(0, f);
  EXPECT_THROW(acc.stats(), Error);  // one position missing
}

}  // namespace
}  // namespace kvtier::bench
