// spattn/distributed.hpp — context-parallel sparse attention: the sequence sharded over W ranks (GPUs, or ranks
// simulated in one process), each fetching only the keys its rows' pattern reaches.
//
//   spattn::dist::DistPlan plan({spattn::parse("local(4096)")}, problem,           // problem: the whole sequence
//                               spattn::dist::ShardLayout::contiguous(problem.q_len, W));
//   std::cout << plan.explain();                 // per rank: its tokens, the key ranges it fetches from whom, bytes
//   spattn::dist::DistRank rank(plan, r, spattn::Device::cpu());      // rank r's plans (ordinary spattn::Plans)
//   rank.forward(comm, q, k, v, o, lse);         // rank r's shard: q [B, n_r, Hq, D], k/v [B, n_r, Hkv, D], ...
//
// What a rank computes (exact; the same LSE merge as compound plans, plan/merge.hpp):
//   local   its query rows against its own keys;
//   remote  its query rows against the keys it fetched from the others (a halo for a band pattern, the global
//           columns once, the blocks a scattered term touches), merged into the local result through the LSE;
//   rows    the rows of global_rows terms (which keep every key) are not answered by fetching every key: their
//           queries go to every rank, each computes them against its own keys, and the partial results come back
//           to the owner to be merged (the remote part skips them).
// The sub-problems are windows of the pattern (BoundPattern::window): no index lists, any engine.
//
// Tensors of a rank hold its tokens in the order of ShardLayout::owned[rank] (for zig-zag: chunk r, then chunk
// 2W-1-r). Backward: dQ on the rank; dK/dV of fetched keys computed by the borrower, sent back and added at the
// owner; the global rows' dQ partials the same way. The backward fetches K/V again (no state kept between calls).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "spattn/pattern.hpp"
#include "spattn/plan.hpp"
#include "spattn/tensor.hpp"

namespace spattn::dist {

// Which tokens (queries, keys and values) each rank owns, as ranges of [0, len); a rank's tensors hold them in
// the order of its ranges.
struct ShardLayout {
  int64_t len = 0;
  std::vector<IndexRanges> owned;  // [world]

  int world() const { return int(owned.size()); }
  int64_t tokens(int rank) const { return total_size(owned.at(size_t(rank))); }
  // Rank r owns [r L / W, (r + 1) L / W). Throws Error naming W when W < 1 or W > L.
  static ShardLayout contiguous(int64_t len, int world);
  // 2W chunks of [0, L) (sizes differing by at most one); rank r owns chunks r and 2W - 1 - r: under a causal
  // pattern every rank then keeps about the same number of scores. Throws Error naming W when W < 1 or 2W > L.
  static ShardLayout zigzag(int64_t len, int world);
  // Any ranges; throws Error naming the first token covered twice or not at all, or a range outside [0, len).
  static ShardLayout from_ranges(int64_t len, std::vector<IndexRanges> owned);
  // "contiguous" or "zigzag" (Error naming the text otherwise).
  static ShardLayout parse(std::string_view name, int64_t len, int world);
};

struct DistOptions {
  // Fetched key ranges rounded out to multiples of key_block (clipped to [0, L), own keys dropped): fewer, larger
  // messages for scattered terms. 1: exactly the keys the pattern needs.
  int64_t key_block = 1;
  // Rows of global_rows terms computed where their keys are (their queries shipped) instead of fetching every key.
  bool distribute_rows = true;
  // Where a rank's tokens are one range and its fetched keys extend it to one range (a band over contiguous shards:
  // the halo), one plan over [halo | own | halo] instead of a local and a remote part and their merge; a band stays a
  // band there (BoundPattern::window), which the GPU planner runs on its band kernel. The exchange no longer overlaps
  // the attention (a halo is a small share of a band's work).
  bool halo = true;
};

// One rank's share of the work and of the exchange. Token ranges are global indices, each list increasing.
struct RankPlan {
  int rank = 0;
  IndexRanges owned;                   // its tokens, in its tensors' order
  std::vector<IndexRanges> recv_keys;  // [world]: the keys it fetches from each rank (empty for itself)
  std::vector<IndexRanges> send_keys;  // [world]: its keys each rank fetches
  std::vector<IndexRanges> recv_rows;  // [world]: global rows of each owner whose queries it receives
  std::vector<IndexRanges> send_rows;  // [world]: its global rows each rank receives (the same for every peer)
  IndexRanges fetched;                 // the keys of recv_keys in rank order: the remote part's keys
  IndexRanges row_queries;             // the rows of recv_rows in rank order: the rows part's queries
  IndexRanges skipped;                 // its own global rows: the remote part skips them
  int64_t boundary_keys = 0;  // distinct keys of other ranks that its rows keep (outside skipped rows): the need
  int64_t fetched_keys = 0;   // keys it receives (boundary_keys rounded to key blocks)
  int64_t recv_bytes = 0, send_bytes = 0;  // forward, all messages (K/V, queries, partial results)
  int64_t kv_recv_bytes = 0;               // of which K/V
  int64_t boundary_bytes = 0;              // boundary_keys x batch x Hkv x (D + Dv) x dtype size
  int64_t nnz_local = 0, nnz_remote = 0, nnz_rows = 0;  // kept scores per head of its three parts (head 0's pattern)
};

class DistPlan {
 public:
  // patterns: one for every head or one per query head, bound to the problem's lengths (q_len == kv_len: the
  // whole sequence). Throws Error naming the value on bad input (lengths, a layout of another length).
  DistPlan(const std::vector<Pattern>& patterns, const Problem& problem, ShardLayout layout, DistOptions options = {});

  int world() const { return layout_.world(); }
  const Problem& problem() const { return problem_; }
  const ShardLayout& layout() const { return layout_; }
  const DistOptions& options() const { return options_; }
  const RankPlan& rank(int r) const;
  // The bound patterns (one, or one per query head).
  const std::vector<BoundPattern>& patterns() const { return patterns_; }
  int64_t kv_token_bytes() const;  // batch x Hkv x (D + Dv) x dtype size: one token's K and V
  int64_t q_token_bytes() const;   // batch x Hq x D x dtype size
  // Per rank: tokens, parts' scores, fetched ranges by source, bytes against the boundary volume; the totals.
  std::string explain() const;

 private:
  Problem problem_;
  ShardLayout layout_;
  DistOptions options_;
  std::vector<BoundPattern> patterns_;
  std::vector<RankPlan> ranks_;
};

// Point-to-point transport between ranks. Between group_start and group_end, sends and receives are posted; wait
// blocks (the host, or for NCCL the caller's stream) until every posted message has arrived. Messages between a
// pair of ranks match in the order posted.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void group_start() = 0;
  virtual void group_end() = 0;
  virtual void send(const void* data, int64_t bytes, int peer) = 0;
  virtual void recv(void* data, int64_t bytes, int peer) = 0;
  virtual void wait() = 0;
  // Whether sends and receives are enqueued on a CUDA stream (NCCL) rather than done by the host: then wait()
  // returns at once, work enqueued on stream() after it sees the data, and a GPU rank must run on that stream.
  virtual bool stream_ordered() const { return false; }
  virtual Stream stream() const { return nullptr; }
  // Bytes this communicator sent and received since it was made.
  int64_t bytes_sent() const { return sent_; }
  int64_t bytes_received() const { return received_; }

 protected:
  int64_t sent_ = 0, received_ = 0;
};

// W ranks in one process: sends copy into the peer's mailbox, receives wait for it. The ranks run on threads
// (run); a rank that throws wakes the others, which throw too. `memory`: where the ranks' buffers live; a CUDA
// device (several ranks simulated on one GPU) copies through cudaMemcpy and synchronises the device at wait().
class SimWorld {
 public:
  explicit SimWorld(int world, Device memory = Device::cpu());
  ~SimWorld();
  Communicator& comm(int rank);
  int size() const;
  // Runs fn(rank, comm) for every rank on its own thread; rethrows the first rank's Error.
  void run(const std::function<void(int rank, Communicator& comm)>& fn);

  struct State;

 private:
  std::unique_ptr<State> state_;
};

// A communicator over NCCL (ncclComm_t passed as void*, its rank and size read from it) on `stream`: group_start /
// group_end are ncclGroupStart / ncclGroupEnd, send / recv ncclSend / ncclRecv of bytes (device memory), wait makes
// `stream` wait for them. Throws Error in builds without NCCL (SPATTN_NCCL off).
std::unique_ptr<Communicator> make_nccl_communicator(void* nccl_comm, Stream stream);
bool have_nccl();  // whether this build has NCCL

// W ranks on GPUs 0 .. W-1 of this process (ncclCommInitAll), rank r's communicator enqueuing on streams[r] (a
// stream of device r). Throws Error in builds without NCCL.
class NcclWorld {
 public:
  explicit NcclWorld(const std::vector<Stream>& streams);
  ~NcclWorld();
  int size() const;
  Communicator& comm(int rank);
  // Runs fn(rank, comm) for every rank on its own thread, device `rank` current; rethrows the first rank's Error.
  void run(const std::function<void(int rank, Communicator& comm)>& fn);

  struct State;

 private:
  std::unique_ptr<State> state_;
};

// (o, lse) <- the LSE merge (plan/merge.hpp) of (o, lse) and (o2, lse2), two partial results of the same rows over
// disjoint keys: o, o2 [B, L, H, Dv], lse, lse2 [B, H, L, 1], CPU memory, any dtype and strides. The distributed
// parts' merge, for callers that run the parts themselves (the Python layer, spattn.distributed).
void merge_into(const TensorView& o, const TensorView& lse, const TensorView& o2, const TensorView& lse2);

// One rank's plans (ordinary spattn::Plans over windows of the pattern) and its forward and backward.
class DistRank {
 public:
  DistRank(const DistPlan& plan, int rank, Device device = Device::cpu(), const PlanOptions& options = {});
  ~DistRank();
  DistRank(DistRank&&) noexcept;

  int rank() const;
  // The rank's shard (n = its tokens): q [B, n, Hq, D], k [B, n, Hkv, D], v [B, n, Hkv, Dv], o [B, n, Hq, Dv],
  // lse [B, Hq, n, 1] (required). CPU device: as the CPU engines take them (o, lse fp32). GPU device: bf16 / fp16
  // device memory as the GPU engines take it (o in the problem's dtype, lse fp32), enqueued on `stream` (with NCCL,
  // the communicator's stream; with NCCL the call returns once enqueued); a plan that ships global rows is refused
  // (DistOptions::distribute_rows false). One call at a time per rank (GPU scratch is pooled by the rank). The GPU
  // path is compiled, not yet run (written on a machine without a GPU).
  void forward(Communicator& comm, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView& lse, Stream stream = nullptr) const;
  // dq, dk, dv (overwritten) of the rank's shard, from the forward's o and lse and dout [B, n, Hq, Dv].
  void backward(Communicator& comm, const TensorView& q, const TensorView& k, const TensorView& v,
                const TensorView& o, const TensorView& lse, const TensorView& dout, const TensorView& dq,
                const TensorView& dk, const TensorView& dv, Stream stream = nullptr) const;
  // The parts' plans.
  std::string explain() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace spattn::dist
