// One error style for the whole library: throw kvtier::Error with a message that
// names the file, tensor or value and what was expected. Tools and the server
// catch it at their boundary and turn it into an exit code or an HTTP status.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace kvtier {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A request that is well-formed but exceeds a configured limit (context longer
// than the host budget, too many tokens...). The server maps it to 4xx/503.
class LimitError : public Error {
 public:
  using Error::Error;
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace kvtier

#define KVT_CHECK(cond, ...)                 \
  do {                                       \
    if (!(cond)) ::kvtier::fail(__VA_ARGS__); \
  } while (0)
