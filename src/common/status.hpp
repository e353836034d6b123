// common/status.hpp — the outcome of a check that may refuse: ok, or the reason it did not pass (never an abort).
// The one status type of the library: the kernels' host handles return it from can_implement (cuda/fused,
// cuda/unfused), and FusedAttention::can_implement passes it on. Errors that stop a call are spattn::Error.
#pragma once
#include <string>
#include <utility>

namespace spattn::common {

struct Status {
  bool ok = true;
  std::string reason;  // empty where ok
  explicit operator bool() const { return ok; }
  static Status success() { return {}; }
  static Status fail(std::string why) { return {false, std::move(why)}; }
};

}  // namespace spattn::common
