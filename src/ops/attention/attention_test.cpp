#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ops/attention/attention.h"

namespace kvtier {
namespace {

std::vector<float> randn(size_t n, std::mt19937& rng, float sd = 1.0f) {
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(std::isfinite(a[i])) << i;
    num = std::max(num, double(std::fabs(a[i] - b[i])));
    den = std::max(den, double(std::fabs(b[i])));
  }
  return num / den;
}

struct CausalCase {
  int n_head, n_kv_head, head_dim, n_q;
  int64_t n_kv;
};

class CausalTest : public ::testing::TestWithParam<CausalCase> {};

TEST_P(CausalTest, MatchesReference) {
  auto c = GetParam();
  std::mt19937 rng(c.n_q * 31 + int(c.n_kv));
  AttentionParams p{c.n_head, c.n_kv_head, c.head_dim, 1.0f / std::sqrt(float(c.head_dim))};
  auto q = randn(size_t(c.n_q) * c.n_head * c.head_dim, rng, 2.0f);
  auto k = randn(size_t(c.n_kv) * c.n_kv_head * c.head_dim, rng, 2.0f);
  auto v = randn(size_t(c.n_kv) * c.n_kv_head * c.head_dim, rng);
  std::vector<float> out(q.size(), NAN), ref(q.size());
  attention_causal(p, q.data(), c.n_q, k.data(), v.data(), c.n_kv, out.data());
  attention_causal_ref(p, q.data(), c.n_q, k.data(), v.data(), c.n_kv, ref.data());
  EXPECT_LT(max_rel(out, ref), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Grid, CausalTest,
                         ::testing::Values(CausalCase{9, 3, 64, 1, 1}, CausalCase{9, 3, 64, 1, 300},
                                           CausalCase{4, 4, 32, 5, 5}, CausalCase{8, 2, 128, 7, 100},
                                           CausalCase{9, 3, 64, 40, 40}, CausalCase{9, 3, 64, 300, 700},
                                           CausalCase{2, 1, 16, 513, 513}));

TEST(AttentionGathered, MatchesReferenceAndMergeIsExact) {
  std::mt19937 rng(7);
  const int n_head = 8, n_kv_head = 2, hd = 64;
  AttentionParams p{n_head, n_kv_head, hd, 0.125f};
  auto q = randn(size_t(n_head) * hd, rng, 2.0f);
  // kv head 0 has 50 rows, kv head 1 has 0 rows (an empty selection must be safe).
  std::vector<int64_t> indptr{0, 50, 50};
  auto k = randn(50 * hd, rng, 2.0f), v = randn(50 * hd, rng);
  std::vector<float> out(q.size(), NAN), ref(q.size()), lse(n_head), lse_ref(n_head);
  attention_gathered(p, q.data(), k.data(), v.data(), indptr.data(), out.data(), lse.data());
  attention_gathered_ref(p, q.data(), k.data(), v.data(), indptr.data(), ref.data(), lse_ref.data());
  EXPECT_LT(max_rel(out, ref), 1e-5);
  for (int h = 0; h < n_head; ++h) {
    if (h < 4) EXPECT_NEAR(lse[h], lse_ref[h], 1e-4);
    else EXPECT_TRUE(std::isinf(lse[h]) && lse[h] < 0);
  }
  // Split head 0's rows in two disjoint parts; merging must equal the whole.
  std::vector<int64_t> a_ptr{0, 20, 20}, b_ptr{0, 30, 30};
  std::vector<float> oa(q.size()), ob(q.size()), la(n_head), lb(n_head);
  attention_gathered(p, q.data(), k.data(), v.data(), a_ptr.data(), oa.data(), la.data());
  attention_gathered(p, q.data(), k.data() + 20 * hd, v.data() + 20 * hd, b_ptr.data(), ob.data(),
                     lb.data());
  merge_attention(n_head, hd, oa.data(), la.data(), ob.data(), lb.data());
  for (int i = 0; i < 4 * hd; ++i) EXPECT_NEAR(oa[i], ref[i], 1e-5) << i;
  for (int h = 0; h < 4; ++h) EXPECT_NEAR(la[h], lse_ref[h], 1e-4);
}

}  // namespace
}  // namespace kvtier
