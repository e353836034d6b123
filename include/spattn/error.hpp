// spattn/error.hpp — the one exception type of the library.
#pragma once
#include <stdexcept>
#include <string>

namespace spattn {

// Every user-facing failure (malformed spec, wrong shapes, unsupported dtype, bad indices, CUDA errors)
// is reported as spattn::Error with a message that names the offending value.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace spattn
