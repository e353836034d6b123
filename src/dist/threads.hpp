// dist/threads.hpp — ranks of one process on threads (SimWorld, NcclWorld).
#pragma once
#include <exception>
#include <functional>
#include <thread>
#include <vector>

namespace spattn::dist::detail {

// Runs fn(r) for every r < world on its own thread and joins them; a rank that throws calls on_error() (to wake
// ranks waiting on it). Returns each rank's exception (null where fn returned).
inline std::vector<std::exception_ptr> run_on_threads(int world, const std::function<void(int)>& fn,
                                                      const std::function<void()>& on_error) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
        on_error();
      }
    });
  for (std::thread& t : threads) t.join();
  return errors;
}

}  // namespace spattn::dist::detail
