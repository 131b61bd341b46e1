// Public: the errors kvtier throws. Every failure is a kvtier::Error whose
// message names the file, tensor or value and what was expected; tools and the
// server catch it at their boundary and turn it into an exit code or an HTTP
// status.
#pragma once
#include <stdexcept>

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

// An allocation (host or GPU) that the machine could not satisfy.
class OutOfMemoryError : public LimitError {
 public:
  using LimitError::LimitError;
};

}  // namespace kvtier
