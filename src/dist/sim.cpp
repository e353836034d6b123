// dist/sim.cpp — SimWorld (spattn/distributed.hpp): W ranks in one process, on threads; a send copies its bytes
// into the receiver's mailbox at once (so a rank never waits for a send), a receive is filled at wait().
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>

#include "dist/threads.hpp"
#include "spattn/config.hpp"
#include "spattn/distributed.hpp"

#if SPATTN_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda/common/check.hpp"
#endif

namespace spattn::dist {

struct SimWorld::State {
  int world = 0;
  Device memory;
  std::mutex mu;
  std::condition_variable cv;
  bool failed = false;
  std::vector<std::deque<std::vector<char>>> box;  // [src * world + dst]: messages in flight, in order
  std::vector<std::unique_ptr<Communicator>> comms;
};

namespace {

// Copies bytes between the host and the ranks' memory (host, or a device: cudaMemcpyDefault).
void copy_bytes(const Device& memory, void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  if (memory.kind == Device::Kind::cpu) {
    std::memcpy(dst, src, size_t(bytes));
    return;
  }
#if SPATTN_HAVE_CUDA
  SPATTN_CUDA_CHECK(cudaSetDevice(memory.index));
  SPATTN_CUDA_CHECK(cudaMemcpy(dst, src, size_t(bytes), cudaMemcpyDefault));
#else
  throw Error("simulated world on " + memory.str() + ": this build of spattn has no CUDA support");
#endif
}

class SimComm final : public Communicator {
 public:
  SimComm(SimWorld::State& s, int rank) : s_(s), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_.world; }
  void group_start() override {}
  void group_end() override {}
  void send(const void* data, int64_t bytes, int peer) override {
    check_peer(peer);
    std::vector<char> msg(static_cast<size_t>(bytes));
    copy_bytes(s_.memory, msg.data(), data, bytes);
    {
      std::lock_guard<std::mutex> lock(s_.mu);
      s_.box[size_t(rank_ * s_.world + peer)].push_back(std::move(msg));
    }
    s_.cv.notify_all();
    sent_ += bytes;
  }
  void recv(void* data, int64_t bytes, int peer) override {
    check_peer(peer);
    pending_.push_back({data, bytes, peer});
  }
  void wait() override {
    std::unique_lock<std::mutex> lock(s_.mu);
    for (const Pending& p : pending_) {
      auto& q = s_.box[size_t(p.peer * s_.world + rank_)];
      s_.cv.wait(lock, [&] { return s_.failed || !q.empty(); });
      if (s_.failed) throw Error("simulated rank " + std::to_string(rank_) + ": another rank failed");
      std::vector<char> msg = std::move(q.front());
      q.pop_front();
      if (int64_t(msg.size()) != p.bytes)
        throw Error("simulated rank " + std::to_string(rank_) + ": a message of " + std::to_string(msg.size()) +
                    " bytes from rank " + std::to_string(p.peer) + " where " + std::to_string(p.bytes) +
                    " were expected");
      copy_bytes(s_.memory, p.data, msg.data(), p.bytes);
      received_ += p.bytes;
    }
    pending_.clear();
    lock.unlock();
#if SPATTN_HAVE_CUDA
    // A copy from pageable host memory may return before it lands; the rank's next kernels read it.
    if (s_.memory.kind == Device::Kind::cuda) SPATTN_CUDA_CHECK(cudaDeviceSynchronize());
#endif
  }

 private:
  struct Pending {
    void* data;
    int64_t bytes;
    int peer;
  };
  void check_peer(int peer) const {
    if (peer < 0 || peer >= s_.world || peer == rank_)
      throw Error("simulated rank " + std::to_string(rank_) + ": peer " + std::to_string(peer) + " is not another rank of " +
                  std::to_string(s_.world));
  }
  SimWorld::State& s_;
  int rank_;
  std::vector<Pending> pending_;
};

}  // namespace

SimWorld::SimWorld(int world, Device memory) : state_(std::make_unique<State>()) {
  if (world < 1) throw Error("simulated world: size W = " + std::to_string(world) + " must be >= 1");
  state_->world = world;
  state_->memory = memory;
  state_->box.resize(size_t(world) * size_t(world));
  for (int r = 0; r < world; ++r) state_->comms.push_back(std::make_unique<SimComm>(*state_, r));
}
SimWorld::~SimWorld() = default;

int SimWorld::size() const { return state_->world; }

Communicator& SimWorld::comm(int rank) {
  if (rank < 0 || rank >= state_->world)
    throw Error("simulated world: rank " + std::to_string(rank) + " is not in [0, " + std::to_string(state_->world) + ")");
  return *state_->comms[size_t(rank)];
}

void SimWorld::run(const std::function<void(int, Communicator&)>& fn) {
  {  // a fresh start after a run that failed: no stale messages, no failure flag
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->failed = false;
    for (auto& q : state_->box) q.clear();
  }
  const std::vector<std::exception_ptr> errors = detail::run_on_threads(
      state_->world, [&](int r) { fn(r, comm(r)); },
      [&] {
        {
          std::lock_guard<std::mutex> lock(state_->mu);
          state_->failed = true;
        }
        state_->cv.notify_all();
      });
  // The first rank that failed by itself (not "another rank failed"): its error names the cause.
  std::exception_ptr first;
  for (const std::exception_ptr& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const Error& err) {
      if (std::string(err.what()).find("another rank failed") == std::string::npos) std::rethrow_exception(e);
    } catch (...) {
      std::rethrow_exception(e);
    }
    if (!first) first = e;
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace spattn::dist
