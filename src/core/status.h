// The library's error helpers over the public error types (kvtier/status.h):
// fail() formats a message and throws kvtier::Error; KVT_CHECK fails when its
// condition is false.
#pragma once
#include <fmt/format.h>

#include <string>
#include <utility>

#include "kvtier/status.h"

namespace kvtier {

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace kvtier

#define KVT_CHECK(cond, ...)                 \
  do {                                       \
    if (!(cond)) ::kvtier::fail(__VA_ARGS__); \
  } while (0)
