// dist/nccl.cpp — the NCCL communicator (spattn/distributed.hpp make_nccl_communicator), built where SPATTN_NCCL is
// on; elsewhere make_nccl_communicator throws Error saying so.
#include "dist/threads.hpp"
#include "spattn/config.hpp"
#include "spattn/distributed.hpp"

#if SPATTN_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace spattn::dist {

#if SPATTN_HAVE_NCCL

namespace {

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error(std::string("NCCL ") + what + ": " + ncclGetErrorString(r));
}

// Sends and receives run in the order posted on `stream`: a later kernel on the stream sees the received bytes,
// so wait() needs no host synchronisation (the local part, launched before it on another stream, overlaps).
class NcclComm final : public Communicator {
 public:
  NcclComm(ncclComm_t comm, cudaStream_t stream) : comm_(comm), stream_(stream) {
    check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    check(ncclCommCount(comm_, &size_), "ncclCommCount");
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void group_start() override { check(ncclGroupStart(), "ncclGroupStart"); }
  void group_end() override { check(ncclGroupEnd(), "ncclGroupEnd"); }
  void send(const void* data, int64_t bytes, int peer) override {
    check(ncclSend(data, size_t(bytes), ncclChar, peer, comm_, stream_), "ncclSend");
    sent_ += bytes;
  }
  void recv(void* data, int64_t bytes, int peer) override {
    check(ncclRecv(data, size_t(bytes), ncclChar, peer, comm_, stream_), "ncclRecv");
    received_ += bytes;
  }
  void wait() override {}  // stream order: work enqueued on stream_ after the group runs after the messages
  bool stream_ordered() const override { return true; }
  Stream stream() const override { return stream_; }

 private:
  ncclComm_t comm_;
  cudaStream_t stream_;
  int rank_ = 0, size_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(void* nccl_comm, Stream stream) {
  if (!nccl_comm) throw Error("make_nccl_communicator: the ncclComm_t is null");
  return std::make_unique<NcclComm>(static_cast<ncclComm_t>(nccl_comm), static_cast<cudaStream_t>(stream));
}
bool have_nccl() { return true; }

struct NcclWorld::State {
  std::vector<ncclComm_t> nccl;
  std::vector<std::unique_ptr<Communicator>> comms;
};

NcclWorld::NcclWorld(const std::vector<Stream>& streams) : state_(std::make_unique<State>()) {
  const int world = int(streams.size());
  if (world < 1) throw Error("NCCL world: size W = 0 must be >= 1");
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < world)
    throw Error("NCCL world: W = " + std::to_string(world) + " needs as many GPUs, this process sees " +
                std::to_string(devices));
  std::vector<int> devs(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) devs[size_t(r)] = r;
  state_->nccl.assign(size_t(world), nullptr);
  check(ncclCommInitAll(state_->nccl.data(), world, devs.data()), "ncclCommInitAll");
  for (int r = 0; r < world; ++r) state_->comms.push_back(make_nccl_communicator(state_->nccl[size_t(r)], streams[size_t(r)]));
}
NcclWorld::~NcclWorld() {
  for (ncclComm_t c : state_->nccl)
    if (c) ncclCommDestroy(c);
}
int NcclWorld::size() const { return int(state_->comms.size()); }
Communicator& NcclWorld::comm(int rank) {
  if (rank < 0 || rank >= size())
    throw Error("NCCL world: rank " + std::to_string(rank) + " is not in [0, " + std::to_string(size()) + ")");
  return *state_->comms[size_t(rank)];
}
void NcclWorld::run(const std::function<void(int, Communicator&)>& fn) {
  const std::vector<std::exception_ptr> errors = detail::run_on_threads(
      size(),
      [&](int r) {
        if (cudaSetDevice(r) != cudaSuccess) throw Error("NCCL world: cudaSetDevice(" + std::to_string(r) + ") failed");
        fn(r, comm(r));
      },
      [] {});
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

#else

std::unique_ptr<Communicator> make_nccl_communicator(void*, Stream) {
  throw Error("make_nccl_communicator: this build of spattn has no NCCL (configure with CUDA on and SPATTN_NCCL=ON)");
}
bool have_nccl() { return false; }

struct NcclWorld::State {};
NcclWorld::NcclWorld(const std::vector<Stream>&) {
  throw Error("NCCL world: this build of spattn has no NCCL (configure with CUDA on and SPATTN_NCCL=ON)");
}
NcclWorld::~NcclWorld() = default;
int NcclWorld::size() const { return 0; }
Communicator& NcclWorld::comm(int) { throw Error("NCCL world: this build of spattn has no NCCL"); }
void NcclWorld::run(const std::function<void(int, Communicator&)>&) {
  throw Error("NCCL world: this build of spattn has no NCCL");
}

#endif

}  // namespace spattn::dist
