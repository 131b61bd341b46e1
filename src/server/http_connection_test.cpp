#include "server/http_connection.h"

#include <gtest/gtest.h>

namespace kvtier::server {
namespace {

TEST(HttpConnection, ConstantTimeEqual) {
  EXPECT_TRUE(constant_time_equal("s3cret", "s3cret"));
  EXPECT_TRUE(constant_time_equal("", ""));
  EXPECT_FALSE(constant_time_equal("s3cret", "s3creT"));
  EXPECT_FALSE(constant_time_equal("s3cret", "s3cre"));   // a prefix
  EXPECT_FALSE(constant_time_equal("s3cre", "s3cret"));
  EXPECT_FALSE(constant_time_equal("", "x"));
  EXPECT_FALSE(constant_time_equal(std::string("a\0b", 3), std::string("a\0c", 3)));
}

}  // namespace
}  // namespace kvtier::server
