// examples/dist_nccl.cpp — the exchange of context-parallel attention over raw NCCL: one process, W GPUs
// (ncclCommInitAll), each rank holding its shard of K, sending the key ranges the distributed plan lists
// (spattn/distributed.hpp) and receiving its halo through spattn's NCCL communicator; every received key is checked
// against its global index. Built only with SPATTN_NCCL (CUDA on, NCCL found).
//
// NOT RUN where it was written: that machine had no GPU. Run on a host of 2 or 4 GPUs:
//   build/spattn_example_dist_nccl [W] [L] [pattern]        e.g.  4 1048576 'local(4096)'
// The attention itself on GPU ranks over NCCL (DistRank with Device::cuda, NcclWorld): `spattn dist-bench --device
// cuda --nccl --world W` (compiled, likewise not run here); the CPU path runs in tests/dist_test.cpp.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "spattn/distributed.hpp"

#define CHECK_CUDA(x)                                                                      \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                        \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

int main(int argc, char** argv) {
  using namespace spattn;
  int ngpu = 0;
  CHECK_CUDA(cudaGetDeviceCount(&ngpu));
  const int W = argc > 1 ? std::stoi(argv[1]) : ngpu;
  const int64_t L = argc > 2 ? std::stoll(argv[2]) : 1 << 20;
  const std::string spec = argc > 3 ? argv[3] : "local(4096)";
  if (W < 1 || W > ngpu) {
    std::fprintf(stderr, "need W in [1, %d] GPUs, got %d\n", ngpu, W);
    return 1;
  }
  try {
    // One token's key: Hkv x D fp32 values, here every one the token's global index (B = 1: a shard's tokens are
    // consecutive rows, a key range one contiguous message).
    const int64_t Hkv = 8, D = 128, row = Hkv * D;
    Problem pr{.batch = 1, .q_heads = Hkv, .kv_heads = Hkv, .q_len = L, .kv_len = L, .head_dim = D, .dtype = DType::f32};
    const dist::DistPlan plan({parse(spec)}, pr, dist::ShardLayout::contiguous(L, W));
    std::printf("%s\n", plan.explain().c_str());
    std::vector<ncclComm_t> comms(static_cast<size_t>(W));
    std::vector<int> devs(static_cast<size_t>(W));
    for (int r = 0; r < W; ++r) devs[size_t(r)] = r;
    if (ncclCommInitAll(comms.data(), W, devs.data()) != ncclSuccess) throw Error("ncclCommInitAll failed");
    std::vector<float*> shard(static_cast<size_t>(W)), fetched(static_cast<size_t>(W));
    std::vector<cudaStream_t> streams(static_cast<size_t>(W));
    std::vector<std::unique_ptr<dist::Communicator>> comm;
    for (int r = 0; r < W; ++r) {
      const dist::RankPlan& rp = plan.rank(r);
      CHECK_CUDA(cudaSetDevice(r));
      CHECK_CUDA(cudaStreamCreate(&streams[size_t(r)]));
      const int64_t n = total_size(rp.owned), f = std::max<int64_t>(1, rp.fetched_keys);
      std::vector<float> host(size_t(n * row));
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < row; ++j) host[size_t(i * row + j)] = float(rp.owned[0].begin + i);
      CHECK_CUDA(cudaMalloc(&shard[size_t(r)], size_t(n * row) * sizeof(float)));
      CHECK_CUDA(cudaMalloc(&fetched[size_t(r)], size_t(f * row) * sizeof(float)));
      CHECK_CUDA(cudaMemcpy(shard[size_t(r)], host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
      comm.push_back(dist::make_nccl_communicator(comms[size_t(r)], streams[size_t(r)]));
    }
    // Every rank's sends and receives in one NCCL group (one process drives all GPUs).
    cudaEvent_t t0, t1;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaEventCreate(&t0));
    CHECK_CUDA(cudaEventCreate(&t1));
    CHECK_CUDA(cudaEventRecord(t0, streams[0]));
    if (ncclGroupStart() != ncclSuccess) throw Error("ncclGroupStart failed");
    for (int r = 0; r < W; ++r) {
      const dist::RankPlan& rp = plan.rank(r);
      int64_t at = 0;
      for (int s = 0; s < W; ++s) {
        for (const IndexRange& x : rp.send_keys[size_t(s)])
          comm[size_t(r)]->send(shard[size_t(r)] + (x.begin - rp.owned[0].begin) * row, x.size() * row * 4, s);
        for (const IndexRange& x : rp.recv_keys[size_t(s)]) {
          comm[size_t(r)]->recv(fetched[size_t(r)] + at * row, x.size() * row * 4, s);
          at += x.size();
        }
      }
    }
    if (ncclGroupEnd() != ncclSuccess) throw Error("ncclGroupEnd failed");
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaEventRecord(t1, streams[0]));
    bool ok = true;
    for (int r = 0; r < W; ++r) {
      const dist::RankPlan& rp = plan.rank(r);
      CHECK_CUDA(cudaSetDevice(r));
      CHECK_CUDA(cudaStreamSynchronize(streams[size_t(r)]));
      std::vector<float> got(size_t(rp.fetched_keys * row));
      CHECK_CUDA(cudaMemcpy(got.data(), fetched[size_t(r)], got.size() * sizeof(float), cudaMemcpyDeviceToHost));
      int64_t i = 0;
      for (const IndexRange& x : rp.fetched)
        for (int64_t g = x.begin; g < x.end; ++g, ++i) ok = ok && got[size_t(i * row)] == float(g) && got[size_t(i * row + row - 1)] == float(g);
      std::printf("rank %d: received %lld bytes (boundary volume %lld)\n", r, (long long)comm[size_t(r)]->bytes_received(),
                  (long long)rp.boundary_bytes);
    }
    CHECK_CUDA(cudaSetDevice(0));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, t0, t1));
    std::printf("halo exchange: %.3f ms (rank 0's stream); keys received %s\n", ms, ok ? "correct" : "WRONG");
    for (int r = 0; r < W; ++r) {
      cudaSetDevice(r);
      cudaFree(shard[size_t(r)]);
      cudaFree(fetched[size_t(r)]);
      ncclCommDestroy(comms[size_t(r)]);
    }
    return ok ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
