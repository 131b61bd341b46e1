#include "ops/argmax/argmax.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace kvtier {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

TEST(ArgmaxRef, FirstOfTheLargest) {
  EXPECT_EQ(argmax_ref(std::vector<float>{1, 3, 2, 3}.data(), 4), 1);
  EXPECT_EQ(argmax_ref(std::vector<float>{-1, -0.5f, -2}.data(), 3), 1);
  EXPECT_EQ(argmax_ref(std::vector<float>{5}.data(), 1), 0);
}

TEST(ArgmaxRef, NanNeverWinsUnlessFirst) {
  EXPECT_EQ(argmax_ref(std::vector<float>{1, kNan, 2, kNan}.data(), 4), 2);
  EXPECT_EQ(argmax_ref(std::vector<float>{kNan, 1, 2}.data(), 3), 0);
}

TEST(ArgmaxRef, InfinitiesOrder) {
  EXPECT_EQ(argmax_ref(std::vector<float>{-INFINITY, -INFINITY, -INFINITY}.data(), 3), 0);
  EXPECT_EQ(argmax_ref(std::vector<float>{-INFINITY, -3, INFINITY, INFINITY}.data(), 4), 2);
}

}  // namespace
}  // namespace kvtier
