// dist/exec.cpp — DistRank (spattn/distributed.hpp): one rank's forward and backward over a Communicator.
//
// Exchange buffers are token-major, [T, B, H, D] in memory, seen as [B, T, H, D] views (TensorView strides): the
// tokens a peer sends are then one contiguous message, whatever the batch. Two rounds a pass:
//   forward   1: K/V of the fetched ranges, queries of global rows   -> the local part runs meanwhile (overlap)
//             2: partial results of others' global rows back to their owners, merged there
//   backward  1: as forward, plus o, dout and lse of global rows
//             2: dK/dV of fetched keys back to their owners, dQ partials of global rows back, added there
// Overlap: on the CPU the local part runs between posting the exchange and waiting on it; on a GPU it runs on a
// side stream (an event orders it after the caller's stream, another orders the merge after it) while the caller's
// stream packs, exchanges (NCCL enqueues on it) and runs the remote part.
// GPU ranks: bf16 / fp16 (the merge is the compound plans' kernel, cuda/fused/parts_kernels.hpp launch_merge);
// plans built without global rows shipped (DistOptions::distribute_rows false: those rows then fetch every key).
#include <cstring>
#include <optional>
#include <sstream>

#include "dist/ranges.hpp"
#include "plan/merge.hpp"
#include "spattn/config.hpp"
#include "spattn/distributed.hpp"

#if SPATTN_HAVE_CUDA
#include "cuda/common/check.hpp"
#include "cuda/common/fill.hpp"
#include "cuda/common/pool.hpp"
#include "cuda/fused/parts_kernels.hpp"
#endif

namespace spattn::dist {

namespace {

// A [B, T, H, D] view of token-major storage [T, B, H, D].
TensorView token_major(void* data, DType t, int64_t B, int64_t T, int64_t H, int64_t D) {
  if (B == 1) return TensorView::contiguous(data, t, {B, T, H, D});  // the same addresses, the engines' usual strides
  return TensorView{data, t, {B, T, H, D}, {H * D, B * H * D, D, 1}};
}
// A [B, H, T, 1] LSE view of token-major storage [T, B, H].
TensorView token_major_lse(void* data, DType t, int64_t B, int64_t T, int64_t H) {
  return TensorView{data, t, {B, H, T, 1}, {H, 1, B * H, 1}};
}

// What a token of an exchange buffer holds: H x D elements of one dtype a batch element, or an LSE (H a batch element).
struct Row {
  DType dtype;
  int64_t H, D;
  bool lse = false;
};

// An exchange buffer (host or device memory) and its token-major view.
struct Buf {
  std::shared_ptr<char> mem;
  int64_t nbytes = 0;
  TensorView view;
  char* data() const { return mem.get(); }
  int64_t size() const { return nbytes; }
};

// dst (+)= src element by element on the host: views of one shape, any dtypes and strides.
void host_move(const TensorView& dst, const TensorView& src, bool add) {
  const size_t es = size_t(dtype_size(src.dtype));
  const bool raw = !add && src.dtype == dst.dtype && src.stride[3] == 1 && dst.stride[3] == 1;
  for (int64_t a = 0; a < src.shape[0]; ++a)
    for (int64_t b = 0; b < src.shape[1]; ++b)
      for (int64_t c = 0; c < src.shape[2]; ++c) {
        if (raw) {
          std::memcpy(static_cast<char*>(dst.data) + size_t(dst.offset(a, b, c, 0)) * es,
                      static_cast<const char*>(src.data) + size_t(src.offset(a, b, c, 0)) * es, size_t(src.shape[3]) * es);
          continue;
        }
        for (int64_t d = 0; d < src.shape[3]; ++d)
          dst.store(a, b, c, d, (add ? dst.load(a, b, c, d) : 0.0) + src.load(a, b, c, d));
      }
}

// (o, lse) row li <- merge with (o2, lse2) row si: the merge primitive of compound plans (plan/merge.hpp).
void merge_row(const TensorView& o, const TensorView& lse, int64_t li, const TensorView& o2, const TensorView& lse2,
               int64_t si) {
  for (int64_t b = 0; b < o.shape[0]; ++b)
    for (int64_t h = 0; h < o.shape[2]; ++h) {
      const plan::MergeWeights w = plan::merge_weights(float(lse.load(b, h, li, 0)), float(lse2.load(b, h, si, 0)));
      if (w.wb == 0.f && w.wa == 1.f) continue;  // the part kept nothing: the row stays
      for (int64_t d = 0; d < o.shape[3]; ++d)
        o.store(b, li, h, d, double(w.wa * float(o.load(b, li, h, d)) + w.wb * float(o2.load(b, si, h, d))));
      lse.store(b, h, li, 0, double(w.lse));
    }
}

// Windows of the plan's patterns (one, or one per head; heads sharing a pattern share its window).
std::vector<BoundPattern> windows(const std::vector<BoundPattern>& patterns, const IndexRanges& rows,
                                  const IndexRanges& keys, const IndexRanges& skip = {}) {
  std::vector<BoundPattern> out;
  std::vector<std::pair<std::string, size_t>> made;
  for (const BoundPattern& p : patterns) {
    auto it = std::find_if(made.begin(), made.end(), [&](const auto& m) { return m.first == p.spec(); });
    if (it != made.end()) {
      out.push_back(out[it->second]);
      continue;
    }
    made.push_back({p.spec(), out.size()});
    out.push_back(BoundPattern::window(p, rows, keys, skip));
  }
  return out;
}

}  // namespace

void merge_into(const TensorView& o, const TensorView& lse, const TensorView& o2, const TensorView& lse2) {
  const int64_t B = o.shape[0], L = o.shape[1], H = o.shape[2];
  Problem::check_view(o2, "o2", o.shape);
  Problem::check_view(lse, "lse", {B, H, L, 1});
  Problem::check_view(lse2, "lse2", {B, H, L, 1});
  for (int64_t i = 0; i < L; ++i) merge_row(o, lse, i, o2, lse2, i);
}

struct DistRank::Impl {
  Problem problem;  // the whole sequence
  RankPlan rp;
  int world = 0;
  Device device;
  bool cuda = false;
  int64_t n = 0, f = 0, g = 0;          // own tokens, fetched keys, received global-row queries
  std::vector<int64_t> fetched_at, rows_at;  // [world + 1]: first index of each source's keys / rows
  detail::LocalIndex local_index;
  std::optional<Plan> local, remote, rows;
  // Halo mode (DistOptions::halo): the key buffer holds the keys of key_range in global order (its own and the
  // fetched ones, e.g. [halo | own | halo]), and each own range of rows runs one plan against it (`whole`: one part
  // for a contiguous shard, two for zig-zag); else the local and remote parts. key_slices[s]: where source s's message
  // lands in the key buffer (split mode: the fetched keys by source; halo mode: its place, or, for a source sending
  // several ranges, a staging slot past key_range, scattered to their places after the exchange: `staged`).
  struct RowsPart {
    int64_t li, len;  // local rows
    IndexRange keys;  // their place in the key buffer (an own range)
    Plan plan;
  };
  std::vector<RowsPart> whole;
  IndexRange key_range{0, 0};
  std::vector<IndexRange> key_slices;  // [world]
  struct Staged {
    int64_t from, to, len;  // staging slot, place, tokens
  };
  std::vector<Staged> staged;
  int64_t key_tokens = 0;
#if SPATTN_HAVE_CUDA
  cudaStream_t side = nullptr;  // the local part's stream
  cudaEvent_t inputs_ready = nullptr, local_done = nullptr;
#endif

  Impl(const DistPlan& plan, int rank, Device dev, const PlanOptions& options)
      : problem(plan.problem()), rp(plan.rank(rank)), world(plan.world()), device(dev),
        cuda(dev.kind == Device::Kind::cuda), local_index(rp.owned) {
    if (cuda) {
#if SPATTN_HAVE_CUDA
      if (problem.dtype != DType::bf16 && problem.dtype != DType::f16)
        throw Error("distributed attention on " + dev.str() + ": dtype " + std::string(dtype_name(problem.dtype)) +
                    " (GPU ranks take bf16 and fp16: the merge kernel's)");
      for (int r = 0; r < world; ++r)
        if (!plan.rank(r).skipped.empty())
          throw Error("distributed attention on " + dev.str() + ": rank " + std::to_string(r) +
                      " ships global rows (its queries to every rank), which GPU ranks do not do yet; build the "
                      "DistPlan with DistOptions::distribute_rows = false (those rows then fetch every key)");
      if (problem.dv() % 8 != 0)
        throw Error("distributed attention on " + dev.str() + ": value dim " + std::to_string(problem.dv()) +
                    " (GPU ranks merge rows of 8-element words: a multiple of 8)");
#else
      throw Error("distributed attention on " + dev.str() + ": this build of spattn has no CUDA support");
#endif
    }
    n = total_size(rp.owned);
    f = total_size(rp.fetched);
    g = total_size(rp.row_queries);
    fetched_at.assign(size_t(world) + 1, 0);
    rows_at.assign(size_t(world) + 1, 0);
    for (int s = 0; s < world; ++s) {
      fetched_at[size_t(s) + 1] = fetched_at[size_t(s)] + total_size(rp.recv_keys[size_t(s)]);
      rows_at[size_t(s) + 1] = rows_at[size_t(s)] + total_size(rp.recv_rows[size_t(s)]);
    }
    const std::vector<BoundPattern>& pats = plan.patterns();
    auto piece = [&](int64_t lq, int64_t lk) {
      Problem p = problem;
      p.q_len = lq;
      p.kv_len = lk;
      return p;
    };
    // Halo mode where the own and the fetched keys make one range.
    IndexRanges all = rp.fetched;
    all.insert(all.end(), rp.owned.begin(), rp.owned.end());
    all = detail::normalized(all);
    if (plan.options().halo && n > 0 && f > 0 && rp.skipped.empty() && all.size() == 1) {
      key_range = all[0];
      const int64_t A = key_range.size();
      key_tokens = A;
      for (int s = 0; s < world; ++s) {
        const IndexRanges& rk = rp.recv_keys[size_t(s)];
        if (rk.size() <= 1) {
          key_slices.push_back(rk.empty() ? IndexRange{0, 0} : IndexRange{rk[0].begin - key_range.begin, rk[0].end - key_range.begin});
          continue;
        }
        key_slices.push_back({key_tokens, key_tokens + total_size(rk)});
        for (const IndexRange& x : rk) {
          staged.push_back({key_tokens, x.begin - key_range.begin, x.size()});
          key_tokens += x.size();
        }
      }
      int64_t li = 0;
      for (const IndexRange& x : rp.owned) {
        if (x.size() == 0) continue;
        whole.push_back({li, x.size(), {x.begin - key_range.begin, x.end - key_range.begin},
                         make_plan(windows(pats, {x}, {key_range}), piece(x.size(), A), dev, options)});
        li += x.size();
      }
    } else {
      key_tokens = f;
      for (int s = 0; s < world; ++s) key_slices.push_back({fetched_at[size_t(s)], fetched_at[size_t(s) + 1]});
      if (n > 0) local.emplace(make_plan(windows(pats, rp.owned, rp.owned), piece(n, n), dev, options));
      if (n > 0 && f > 0)
        remote.emplace(make_plan(windows(pats, rp.owned, rp.fetched, rp.skipped), piece(n, f), dev, options));
    }
    if (g > 0 && n > 0) rows.emplace(make_plan(windows(pats, rp.row_queries, rp.owned), piece(g, n), dev, options));
#if SPATTN_HAVE_CUDA
    if (cuda) {
      SPATTN_CUDA_CHECK(cudaSetDevice(dev.index));
      SPATTN_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
      SPATTN_CUDA_CHECK(cudaEventCreateWithFlags(&inputs_ready, cudaEventDisableTiming));
      SPATTN_CUDA_CHECK(cudaEventCreateWithFlags(&local_done, cudaEventDisableTiming));
    }
#endif
  }
  ~Impl() {
#if SPATTN_HAVE_CUDA
    if (side) cudaStreamDestroy(side);
    if (inputs_ready) cudaEventDestroy(inputs_ready);
    if (local_done) cudaEventDestroy(local_done);
#endif
  }

  // ---- memory: host or the rank's device ----
  // GPU exchange buffers and scratch come from a list the rank keeps: a call takes buffers from it (what it lacks
  // from the library's device pool, cuda/common/pool.hpp) and gives them all back at its start, so calls enqueue
  // without a runtime allocation or the pool's free (whose device synchronisation would serialise them); a buffer
  // reused by the next call is reused in stream order.
  // Hence one call at a time per rank, on one stream.
  struct Pooled {
    std::shared_ptr<char> mem;
    int64_t capacity = 0;
    bool used = false;
  };
  mutable std::vector<Pooled> pool;
  void release_pool() const {
    for (Pooled& p : pool) p.used = false;
  }
  std::shared_ptr<char> device_bytes(int64_t bytes) const {
    for (Pooled& p : pool)
      if (!p.used && p.capacity >= bytes) {
        p.used = true;
        return p.mem;
      }
#if SPATTN_HAVE_CUDA
    void* ptr = cuda::pool_alloc(size_t(bytes), "a rank's exchange buffer");  // the library's device pool
    pool.push_back({std::shared_ptr<char>(static_cast<char*>(ptr), [](char* q) { cuda::pool_free(q); }), bytes, true});
    return pool.back().mem;
#else
    throw Error("device buffer in a build without CUDA");
#endif
  }
  Buf buf(DType t, int64_t B, int64_t T, int64_t H, int64_t D, bool lse = false) const {
    Buf b;
    b.nbytes = checked_bytes("exchange buffer", {T, B, H, D}, dtype_size(t));
    if (b.nbytes > 0)
      b.mem = cuda ? device_bytes(b.nbytes) : std::shared_ptr<char>(new char[size_t(b.nbytes)], std::default_delete<char[]>());
    b.view = lse ? token_major_lse(b.data(), t, B, T, H) : token_major(b.data(), t, B, T, H, D);
    return b;
  }
  Buf buf(const Row& r, int64_t B, int64_t T) const { return buf(r.dtype, B, T, r.H, r.lse ? 1 : r.D, r.lse); }
  // A contiguous [B, L, H, D] (or lse [B, H, L, 1]) scratch tensor.
  Buf scratch(DType t, std::array<int64_t, 4> shape) const {
    Buf b = buf(t, shape[0], shape[1], shape[2], shape[3]);
    b.view = TensorView::contiguous(b.data(), t, shape);
    return b;
  }
  // dst (+)= src (views of one shape; on the GPU of one dtype).
  void move(const TensorView& dst, const TensorView& src, bool add, Stream stream) const {
    if (!cuda) return host_move(dst, src, add);
#if SPATTN_HAVE_CUDA
    cuda::copy(dst, src, add, static_cast<cudaStream_t>(stream));
#else
    (void)stream;
#endif
  }
  // (o, lse) <- merge with (o2, lse2) on every row (o2 and lse2 contiguous scratch on the GPU).
  void merge(const TensorView& o, const TensorView& lse, const TensorView& o2, const TensorView& lse2, Stream stream) const {
    if (!cuda) return merge_into(o, lse, o2, lse2);
#if SPATTN_HAVE_CUDA
    const cuda::fused::RowTensor ot{o.data, o.stride[0], o.stride[1], o.stride[2]};
    const int e = cuda::fused::launch_merge(ot, static_cast<float*>(lse.data), lse.stride[0], lse.stride[1], o2.data,
                                            static_cast<const float*>(lse2.data), int(o.shape[0]), int(o.shape[1]),
                                            int(o.shape[2]), int(o.shape[3]), o.dtype == DType::bf16, stream);
    SPATTN_CUDA_CHECK(cudaError_t(e));
#else
    (void)stream;
#endif
  }
  // At the start of a call (GPU): the rank's device current, and an event after what the caller's stream has
  // enqueued so far (the inputs), for the local part to wait on — recorded before the exchange is enqueued on the
  // same stream, so that the local part does not wait for the exchange.
  void begin_call(Stream stream) const {
#if SPATTN_HAVE_CUDA
    if (cuda) {
      SPATTN_CUDA_CHECK(cudaSetDevice(device.index));
      SPATTN_CUDA_CHECK(cudaEventRecord(inputs_ready, static_cast<cudaStream_t>(stream)));
    }
#endif
    (void)stream;
  }
  // The local part on the side stream, after the inputs (GPU); or here (CPU).
  template <class F>
  void run_local(F&& fn, Stream stream) const {
#if SPATTN_HAVE_CUDA
    if (cuda) {
      SPATTN_CUDA_CHECK(cudaStreamWaitEvent(side, inputs_ready, 0));
      fn(static_cast<Stream>(side));
      SPATTN_CUDA_CHECK(cudaEventRecord(local_done, side));
      return;
    }
#endif
    fn(stream);
  }
  // The caller's stream waits for the local part (GPU).
  void join_local(Stream stream) const {
#if SPATTN_HAVE_CUDA
    if (cuda) SPATTN_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), local_done, 0));
#endif
    (void)stream;
  }
  // Before sends read packed buffers: a communicator that is not ordered on the stream needs them finished.
  void before_send(const Communicator& comm, Stream stream) const {
#if SPATTN_HAVE_CUDA
    if (cuda && !comm.stream_ordered()) SPATTN_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
#endif
    (void)comm, (void)stream;
  }

  // Calls fn(local index, index in the concatenation, count) for the runs of consecutive local tokens of `ranges`.
  template <class F>
  void for_runs(const IndexRanges& ranges, F&& fn) const {
    int64_t at = 0;
    for (const IndexRange& r : ranges)
      for (int64_t gt = r.begin; gt < r.end;) {
        const auto [li, len] = local_index.run(gt, r.end);
        fn(li, at, len);
        at += len;
        gt += len;
      }
  }

  // Halo mode: own K/V into their places in the key buffers.
  void place_own(const Buf& kb, const Buf& vb, const TensorView& k, const TensorView& v, Stream stream) const {
    for (const RowsPart& p : whole) {
      move(kb.view.slice(1, p.keys.begin, p.keys.end), k.slice(1, p.li, p.li + p.len), false, stream);
      move(vb.view.slice(1, p.keys.begin, p.keys.end), v.slice(1, p.li, p.li + p.len), false, stream);
    }
  }
  // Halo mode: staged ranges to their places (to_place), or back to their staging slots (dK/dV to send).
  void scatter_staged(const Buf& b, bool to_place, Stream stream) const {
    for (const Staged& x : staged) {
      const TensorView slot = b.view.slice(1, x.from, x.from + x.len), place = b.view.slice(1, x.to, x.to + x.len);
      to_place ? move(place, slot, false, stream) : move(slot, place, false, stream);
    }
  }

  // [world]: its global rows, from each other rank (their partial results come back in that order).
  std::vector<IndexRanges> own_rows_from_each() const {
    std::vector<IndexRanges> out(static_cast<size_t>(world), rp.skipped);
    out[size_t(rp.rank)].clear();
    return out;
  }

  void check_comm(const Communicator& comm, Stream stream) const {
    if (comm.size() != world || comm.rank() != rp.rank)
      throw Error("distributed rank " + std::to_string(rp.rank) + " of " + std::to_string(world) +
                  ": the communicator is rank " + std::to_string(comm.rank()) + " of " + std::to_string(comm.size()));
    if (comm.stream_ordered() && (!cuda || comm.stream() != stream))
      throw Error("distributed rank " + std::to_string(rp.rank) +
                  ": the communicator enqueues on its own stream; pass that stream to forward / backward (and a GPU "
                  "device to the rank)");
  }

  // Packs the tokens of `ranges` (owned) of t into a token-major buffer of t's dtype.
  Buf pack(const TensorView& t, const IndexRanges& ranges, Stream stream) const {
    Buf b = buf(t.dtype, t.shape[0], total_size(ranges), t.shape[2], t.shape[3]);
    for_runs(ranges, [&](int64_t li, int64_t at, int64_t len) {
      move(b.view.slice(1, at, at + len), t.slice(1, li, li + len), false, stream);
    });
    return b;
  }
  Buf pack_lse(const TensorView& lse, const IndexRanges& ranges) const {  // host only (global rows)
    Buf b = buf(DType::f32, lse.shape[0], total_size(ranges), lse.shape[1], 1, true);
    for_runs(ranges, [&](int64_t li, int64_t at, int64_t len) {
      host_move(b.view.slice(2, at, at + len), lse.slice(2, li, li + len), false);
    });
    return b;
  }

  // Round 1 posted: every peer's K/V ranges (and global-row tensors `row_src`, packed once, the same to every
  // peer) sent; into kf/vf and the row buffers, received. Returns the send buffers (alive until wait).
  std::vector<Buf> post_round1(Communicator& comm, const TensorView& k, const TensorView& v, Buf& kf, Buf& vf,
                               const std::vector<const TensorView*>& row_src, std::vector<Buf>& row_dst,
                               const TensorView* lse_src, Buf* lse_dst, Stream stream) const {
    const int r = rp.rank;
    std::vector<Buf> keep;
    const int64_t B = problem.batch;
    kf = buf(k.dtype, B, key_tokens, problem.kv_heads, problem.head_dim);
    vf = buf(v.dtype, B, key_tokens, problem.kv_heads, problem.dv());
    for (const TensorView* t : row_src) row_dst.push_back(buf(t->dtype, B, g, t->shape[2], t->shape[3]));
    if (lse_dst) *lse_dst = buf(DType::f32, B, g, problem.q_heads, 1, true);
    std::vector<Buf> rows_out;
    if (!rp.skipped.empty()) {
      for (const TensorView* t : row_src) rows_out.push_back(pack(*t, rp.skipped, stream));
      if (lse_src) rows_out.push_back(pack_lse(*lse_src, rp.skipped));
    }
    std::vector<std::vector<Buf>> kv_out(static_cast<size_t>(world));
    for (int s = 0; s < world; ++s)
      if (s != r && !rp.send_keys[size_t(s)].empty())
        for (const TensorView* t : {&k, &v}) kv_out[size_t(s)].push_back(pack(*t, rp.send_keys[size_t(s)], stream));
    before_send(comm, stream);
    comm.group_start();
    for (int s = 0; s < world; ++s) {
      if (s == r) continue;
      for (Buf& b : kv_out[size_t(s)]) comm.send(b.data(), b.size(), s);
      for (Buf& b : rows_out) comm.send(b.data(), b.size(), s);
      const int64_t t0 = key_slices[size_t(s)].begin, nt = key_slices[size_t(s)].size();
      if (nt > 0)
        for (Buf* b : {&kf, &vf}) comm.recv(b->data() + t0 * (b->size() / key_tokens), b->size() / key_tokens * nt, s);
      const int64_t r0 = rows_at[size_t(s)], nr = rows_at[size_t(s) + 1] - r0;
      if (nr > 0) {
        std::vector<Buf*> dsts;
        for (Buf& b : row_dst) dsts.push_back(&b);
        if (lse_dst) dsts.push_back(lse_dst);
        for (Buf* b : dsts) {
          const int64_t per = b->size() / g;
          comm.recv(b->data() + r0 * per, per * nr, s);
        }
      }
    }
    comm.group_end();
    for (auto& v2 : kv_out)
      for (Buf& b : v2) keep.push_back(std::move(b));
    for (Buf& b : rows_out) keep.push_back(std::move(b));
    return keep;
  }

  // (first token, tokens) of each peer's slice of a buffer laid out by peer at the offsets `at` ([world + 1]).
  std::vector<IndexRange> slices_at(const std::vector<int64_t>& at) const {
    std::vector<IndexRange> out;
    for (int s = 0; s < world; ++s) out.push_back({at[size_t(s)], at[size_t(s) + 1]});
    return out;
  }

  // Round 2: the slices `out_slices[s]` (token ranges) of the token-major buffers `out` (each of `out_tokens` tokens)
  // sent to each peer; each peer's results for `in_ranges_of[s]` received and handed to `use(s, bufs)`.
  void exchange_back(Communicator& comm, std::vector<Buf*> out, const std::vector<IndexRange>& out_slices,
                     int64_t out_tokens, const std::vector<IndexRanges>& in_ranges_of, const std::vector<Row>& in_rows,
                     const std::function<void(int, std::vector<Buf>&)>& use, Stream stream) const {
    const int r = rp.rank;
    std::vector<std::vector<Buf>> in(static_cast<size_t>(world));
    before_send(comm, stream);
    comm.group_start();
    for (int s = 0; s < world; ++s) {
      if (s == r) continue;
      const int64_t t0 = out_slices[size_t(s)].begin, nt = out_slices[size_t(s)].size();
      if (nt > 0)
        for (Buf* b : out) {
          const int64_t per = b->size() / out_tokens;
          comm.send(b->data() + t0 * per, per * nt, s);
        }
      const int64_t ni = total_size(in_ranges_of[size_t(s)]);
      if (ni > 0)
        for (const Row& row : in_rows) {
          in[size_t(s)].push_back(buf(row, problem.batch, ni));
          comm.recv(in[size_t(s)].back().data(), in[size_t(s)].back().size(), s);
        }
    }
    comm.group_end();
    comm.wait();
    for (int s = 0; s < world; ++s)
      if (!in[size_t(s)].empty()) use(s, in[size_t(s)]);
  }

  void forward(Communicator& comm, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView& lse, Stream stream) const {
    check_comm(comm, stream);
    release_pool();
    const Problem& p = problem;
    const int64_t B = p.batch, Hq = p.q_heads, Dv = p.dv();
    Problem::check_view(q, "q", {B, n, Hq, p.head_dim});
    Problem::check_view(k, "k", {B, n, p.kv_heads, p.head_dim});
    Problem::check_view(v, "v", {B, n, p.kv_heads, Dv});
    Problem::check_view(o, "o", {B, n, Hq, Dv});
    Problem::check_view(lse, "lse", {B, Hq, n, 1});
    if (n > 0 && !lse.data) throw Error("distributed forward: lse is required (the parts merge through it)");
    if (cuda && n > 1 && lse.stride[2] != 1)
      throw Error("distributed forward on " + device.str() + ": lse rows must be contiguous (stride " +
                  std::to_string(lse.stride[2]) + " along L)");
    begin_call(stream);
    Buf kf, vf;
    std::vector<Buf> qg;
    std::vector<Buf> keep = post_round1(comm, k, v, kf, vf, {&q}, qg, nullptr, nullptr, stream);
    if (!whole.empty()) {  // own K/V beside the fetched ones, then each own range of rows against them all
      place_own(kf, vf, k, v, stream);
      comm.wait();
      scatter_staged(kf, true, stream);
      scatter_staged(vf, true, stream);
      const TensorView K = kf.view.slice(1, 0, key_range.size()), V = vf.view.slice(1, 0, key_range.size());
      for (const RowsPart& r : whole)
        r.plan.forward(q.slice(1, r.li, r.li + r.len), K, V, o.slice(1, r.li, r.li + r.len),
                       lse.slice(2, r.li, r.li + r.len), stream);
    }
    if (local) run_local([&](Stream s) { local->forward(q, k, v, o, lse, s); }, stream);  // overlaps the exchange
    if (whole.empty()) comm.wait();
    if (remote) {
      // The part's own result (the CPU engine writes fp32, the GPU engines the problem's dtype), then the merge.
      Buf o2 = scratch(cuda ? o.dtype : DType::f32, {B, n, Hq, Dv}), l2 = scratch(DType::f32, {B, Hq, n, 1});
      remote->forward(q, kf.view, vf.view, o2.view, l2.view, stream);
      join_local(stream);
      merge(o, lse, o2.view, l2.view, stream);
    } else if (local) {
      join_local(stream);
    }
    if (cuda) return;  // (no global rows on GPU ranks: refused at construction)
    // Global rows: the partials this rank computed for others go back; its own rows' partials come in and merge.
    Buf og = buf(DType::f32, B, g, Hq, Dv), lg = buf(DType::f32, B, g, Hq, 1, true);
    if (rows) rows->forward(qg[0].view, k, v, og.view, lg.view);
    if (g > 0 && !rows) {  // a rank with no tokens answers with empty partials
      for (int64_t i = 0; i < g; ++i)
        for (int64_t b = 0; b < B; ++b)
          for (int64_t h = 0; h < Hq; ++h) {
            lg.view.store(b, h, i, 0, -INFINITY);
            for (int64_t d = 0; d < Dv; ++d) og.view.store(b, i, h, d, 0.0);
          }
    }
    exchange_back(comm, {&og, &lg}, slices_at(rows_at), g, own_rows_from_each(), {{DType::f32, Hq, Dv}, {DType::f32, Hq, 1, true}},
                  [&](int, std::vector<Buf>& in) {
                    for_runs(rp.skipped, [&](int64_t li, int64_t at, int64_t len) {
                      for (int64_t i = 0; i < len; ++i) merge_row(o, lse, li + i, in[0].view, in[1].view, at + i);
                    });
                  },
                  stream);
  }

  void backward(Communicator& comm, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, Stream stream) const {
    check_comm(comm, stream);
    release_pool();
    const Problem& p = problem;
    const int64_t B = p.batch, Hq = p.q_heads, Hkv = p.kv_heads, D = p.head_dim, Dv = p.dv();
    Problem piece = p;
    piece.q_len = piece.kv_len = n;
    piece.check_backward_views(q, k, v, dout, dq, dk, dv, !cuda);
    Problem::check_view(o, "o", {B, n, Hq, Dv});
    Problem::check_view(lse, "lse", {B, Hq, n, 1});
    if (n > 0 && (!o.data || !lse.data))
      throw Error("distributed backward: o and lse of the forward are required (every part's P uses the merged lse)");
    begin_call(stream);
    // Gradients of the parts: fp32 on the CPU engines, the problem's dtype on the GPU engines.
    const DType gt = cuda ? p.dtype : DType::f32;
    Buf kf, vf, lg;
    std::vector<Buf> rg;  // q, o, dout of global rows
    std::vector<Buf> keep = cuda ? post_round1(comm, k, v, kf, vf, {}, rg, nullptr, nullptr, stream)
                                 : post_round1(comm, k, v, kf, vf, {&q, &o, &dout}, rg, &lse, &lg, stream);
    if (local) run_local([&](Stream s) { local->backward(q, k, v, o, lse, dout, dq, dk, dv, s); }, stream);
    if (!whole.empty()) place_own(kf, vf, k, v, stream);
    comm.wait();
    // dK/dV of the key buffer (halo mode: own keys too, copied out below; else the fetched keys).
    Buf dkf = buf(gt, B, key_tokens, Hkv, D), dvf = buf(gt, B, key_tokens, Hkv, Dv);
    if (!whole.empty()) {
      scatter_staged(kf, true, stream);
      scatter_staged(vf, true, stream);
      const int64_t A = key_range.size();
      const TensorView K = kf.view.slice(1, 0, A), V = vf.view.slice(1, 0, A);
      const TensorView dK = dkf.view.slice(1, 0, A), dV = dvf.view.slice(1, 0, A);
      Buf dk2, dv2;  // a second part's dK/dV, added to the first's
      for (size_t i = 0; i < whole.size(); ++i) {
        const RowsPart& r = whole[i];
        if (i == 1) dk2 = scratch(gt, {B, A, Hkv, D}), dv2 = scratch(gt, {B, A, Hkv, Dv});
        r.plan.backward(q.slice(1, r.li, r.li + r.len), K, V, o.slice(1, r.li, r.li + r.len),
                        lse.slice(2, r.li, r.li + r.len), dout.slice(1, r.li, r.li + r.len),
                        dq.slice(1, r.li, r.li + r.len), i ? dk2.view : dK, i ? dv2.view : dV, stream);
        if (i) {
          move(dK, dk2.view, true, stream);
          move(dV, dv2.view, true, stream);
        }
      }
      for (const RowsPart& r : whole) {
        move(dk.slice(1, r.li, r.li + r.len), dkf.view.slice(1, r.keys.begin, r.keys.end), false, stream);
        move(dv.slice(1, r.li, r.li + r.len), dvf.view.slice(1, r.keys.begin, r.keys.end), false, stream);
      }
      scatter_staged(dkf, false, stream);
      scatter_staged(dvf, false, stream);
    }
    if (remote) {
      Buf dq2 = scratch(gt, {B, n, Hq, D});
      remote->backward(q, kf.view, vf.view, o, lse, dout, dq2.view, dkf.view, dvf.view, stream);
      join_local(stream);
      move(dq, dq2.view, true, stream);
    } else if (local) {
      join_local(stream);
    }
    Buf dqg = buf(gt, B, g, Hq, D);
    if (rows) {
      Buf dk2 = scratch(gt, {B, n, Hkv, D}), dv2 = scratch(gt, {B, n, Hkv, Dv});
      rows->backward(rg[0].view, k, v, rg[1].view, lg.view, rg[2].view, dqg.view, dk2.view, dv2.view);
      host_move(dk, dk2.view, true);
      host_move(dv, dv2.view, true);
    } else if (dqg.size() > 0) {
      std::memset(dqg.data(), 0, size_t(dqg.size()));  // (host: GPU ranks have no global rows)
    }
    // Round 2a: dK/dV of the keys this rank borrowed go back to their owners, who add them.
    exchange_back(comm, {&dkf, &dvf}, key_slices, key_tokens, rp.send_keys, {{gt, Hkv, D}, {gt, Hkv, Dv}},
                  [&](int s, std::vector<Buf>& in) {
                    for_runs(rp.send_keys[size_t(s)], [&](int64_t li, int64_t at, int64_t len) {
                      move(dk.slice(1, li, li + len), in[0].view.slice(1, at, at + len), true, stream);
                      move(dv.slice(1, li, li + len), in[1].view.slice(1, at, at + len), true, stream);
                    });
                  },
                  stream);
    if (cuda) return;
    // Round 2b: the dQ partials of others' global rows go back to their owners.
    exchange_back(comm, {&dqg}, slices_at(rows_at), g, own_rows_from_each(), {{DType::f32, Hq, D}},
                  [&](int, std::vector<Buf>& in) {
                    for_runs(rp.skipped, [&](int64_t li, int64_t at, int64_t len) {
                      host_move(dq.slice(1, li, li + len), in[0].view.slice(1, at, at + len), true);
                    });
                  },
                  stream);
  }
};

DistRank::DistRank(const DistPlan& plan, int rank, Device device, const PlanOptions& options)
    : impl_(std::make_unique<Impl>(plan, rank, device, options)) {}
DistRank::~DistRank() = default;
DistRank::DistRank(DistRank&&) noexcept = default;

int DistRank::rank() const { return impl_->rp.rank; }

void DistRank::forward(Communicator& comm, const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& o, const TensorView& lse, Stream stream) const {
  impl_->forward(comm, q, k, v, o, lse, stream);
}

void DistRank::backward(Communicator& comm, const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& o, const TensorView& lse, const TensorView& dout, const TensorView& dq,
                        const TensorView& dk, const TensorView& dv, Stream stream) const {
  impl_->backward(comm, q, k, v, o, lse, dout, dq, dk, dv, stream);
}

std::string DistRank::explain() const {
  std::ostringstream s;
  const Impl& im = *impl_;
  s << "rank " << im.rp.rank << " of " << im.world << " on " << im.device.str() << ": " << im.n << " tokens, " << im.f
    << " fetched keys, " << im.g << " global-row queries answered";
  auto part = [&](const char* name, const std::optional<Plan>& p) {
    if (p) s << "\n  " << name << ": " << p->explain();
  };
  if (!im.whole.empty())
    s << "\n  halo: keys " << im.key_range.begin << ":" << im.key_range.end << " (own and fetched) in one buffer, "
      << im.whole.size() << " plan(s), one an own range of rows, no merge";
  for (const Impl::RowsPart& r : im.whole) s << "\n  rows " << r.li << ":" << r.li + r.len << ": " << r.plan.explain();
  part("local", im.local);
  part("remote", im.remote);
  part("rows", im.rows);
  return s.str();
}

}  // namespace spattn::dist
