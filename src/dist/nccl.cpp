// dist/nccl.cpp — the NCCL communicator (spattn/distributed.hpp make_nccl_communicator), built where SPATTN_NCCL is
// on; elsewhere make_nccl_communicator throws Error saying so.
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

#else

std::unique_ptr<Communicator> make_nccl_communicator(void*, Stream) {
  throw Error("make_nccl_communicator: this build of spattn has no NCCL (configure with CUDA on and SPATTN_NCCL=ON)");
}
bool have_nccl() { return false; }

#endif

}  // namespace spattn::dist
