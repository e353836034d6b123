// common/parallel.hpp — the library's worker threads (internal): parallel_for over a process-wide pool of kept
// threads (the CPU attention kernels, the GPU tile planner), spin_until for short waits.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace spattn::common {

// std::thread::hardware_concurrency() (at least 1), asked once: glibc reads it from /sys on every call (an open, a read
// and a close: 3-4 us, a sixth of a dilated plan's host time).
inline int hardware_threads() {
  static const int n = int(std::max(1u, std::thread::hardware_concurrency()));
  return n;
}

inline void cpu_pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Spins up to ~50 us for cond(); true if it came (then the caller sleeps on a futex: a spinning thread can
// hold the CPU that the thread it waits for needs).
template <class Cond>
inline bool spin_until(Cond&& cond) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (cond()) return true;
      cpu_pause();
    }
    if (std::chrono::steady_clock::now() > until) return cond();
  }
}

// Worker threads kept for the process: parallel_for wakes them instead of creating threads. Created per
// region, a thread was at times started on its creator's CPU (Linux places a new thread by recent load, and
// the previous region's thread had just run on the other CPU) and joined the work late; measured on the
// 2-core machine (random(205), L = 4096, H = 4, 2 threads), such calls ran at one-thread speed (37-48 ms
// against 21-25). A woken thread goes to an idle CPU. Workers spin for a short while after a region (the
// next is often right behind), then sleep on a futex. Never destroyed (threads blocked in a futex wait end
// with the process; no join at static destruction).
class WorkerPool {
 public:
  static WorkerPool& get() {
    static WorkerPool& pool = *new WorkerPool;
    return pool;
  }
  // Runs body(t) for t in [0, n), t = 0 on the caller; body must not throw. false (nothing run) when the pool
  // is in use (a concurrent caller, a nested region) or the process forked since it was made.
  template <class Body>
  bool run(int n, Body& body) {
    std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
    if (!lock.owns_lock() || getpid() != pid_) return false;
    const uint64_t prev = state_.load(std::memory_order_relaxed);
    try {
      while (int(workers_.size()) < n - 1) {
        const int t = int(workers_.size()) + 1;
        workers_.emplace_back([this, t, prev] { loop(t, prev); });
      }
    } catch (...) {
      return false;  // no thread: the caller runs alone (parallel_for's fallback)
    }
    ctx_ = &body;
    call_ = [](void* c, int t) { (*static_cast<Body*>(c))(t); };
    pending_.store(n - 1, std::memory_order_relaxed);
    // The region's number and thread count in one word: a worker left out of a region reads nothing else.
    state_.store(((prev >> 32) + 1) << 32 | uint64_t(n), std::memory_order_release);
    state_.notify_all();
    body(0);
    for (int v; (v = pending_.load(std::memory_order_acquire)) != 0;) {
      if (!spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; })) pending_.wait(v, std::memory_order_acquire);
    }
    return true;
  }

 private:
  WorkerPool() : pid_(getpid()) {}
  void loop(int t, uint64_t seen) {
    for (;;) {
      if (!spin_until([&] { return state_.load(std::memory_order_acquire) != seen; })) state_.wait(seen, std::memory_order_acquire);
      const uint64_t s = state_.load(std::memory_order_acquire);
      if (s == seen) continue;
      seen = s;
      if (t >= int(s & 0xffffffffu)) continue;
      call_(ctx_, t);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
  }
  std::mutex busy_;
  const pid_t pid_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> state_{0};  // region number << 32 | its thread count
  std::atomic<int> pending_{0};     // workers of the current region not done
  void* ctx_ = nullptr;
  void (*call_)(void*, int) = nullptr;
};

// A reusable barrier for the n threads of one region in which each runs one item (parallel_for(n, n, ...)):
// phases of a region (pack, compute, reduce) without a region each (a region's wake-up cost 1.1-2.4 ms of a
// 21-26 ms forward call, fused.cpp). Waiters spin, then sleep on a futex.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    const uint32_t gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      count_.store(0, std::memory_order_relaxed);
      gen_.store(gen + 1, std::memory_order_release);
      gen_.notify_all();
      return;
    }
    while (gen_.load(std::memory_order_acquire) == gen)
      if (!spin_until([&] { return gen_.load(std::memory_order_acquire) != gen; })) gen_.wait(gen, std::memory_order_acquire);
  }

 private:
  const int n_;
  std::atomic<int> count_{0};
  std::atomic<uint32_t> gen_{0};
};

// Runs fn(item, thread) for item in [0, n) on `threads` threads, items taken in order.
template <class Fn>
void parallel_for(int64_t n, int threads, Fn&& fn) {
  if (n <= 0) return;
  threads = int(std::max<int64_t>(1, std::min<int64_t>(threads, n)));
  if (threads == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  auto worker = [&](int t) {
    try {
      for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) {
        if (failed.load(std::memory_order_relaxed)) break;
        fn(i, t);
      }
    } catch (...) {
      if (!failed.exchange(true)) error = std::current_exception();
    }
  };
  if (!WorkerPool::get().run(threads, worker)) {
    std::vector<std::thread> pool;
    pool.reserve(size_t(threads - 1));
    for (int t = 1; t < threads; ++t) pool.emplace_back(worker, t);
    worker(0);
    for (auto& th : pool) th.join();
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace spattn::common
