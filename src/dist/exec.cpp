// dist/exec.cpp — DistRank (spattn/distributed.hpp): one rank's forward and backward over a Communicator.
//
// Exchange buffers are token-major, [T, B, H, D] in memory, seen as [B, T, H, D] views (TensorView strides): the
// tokens a peer sends are then one contiguous message, whatever the batch. Two rounds a pass:
//   forward   1: K/V of the fetched ranges, queries of global rows   -> local part runs meanwhile (overlap)
//             2: partial results of others' global rows back to their owners, merged there
//   backward  1: as forward, plus o, dout and lse of global rows
//             2: dK/dV of fetched keys back to their owners, dQ partials of global rows back, added there
// CPU tensors for now; on the GPU the same schedule needs device packing (cudaMemcpy2DAsync) and the merge kernel of
// compound plans (cuda/fused/parts_kernels.hpp launch_merge), with the local part on its own stream: not yet built.
#include <cstring>
#include <optional>
#include <sstream>

#include "dist/ranges.hpp"
#include "plan/merge.hpp"
#include "spattn/distributed.hpp"

namespace spattn::dist {

namespace {

// A [B, T, H, D] view of token-major storage.
TensorView token_major(void* data, DType t, int64_t B, int64_t T, int64_t H, int64_t D) {
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

// A buffer of token-major rows with its view.
struct Buf {
  std::vector<char> bytes;
  TensorView view;
  Buf() = default;
  Buf(DType t, int64_t B, int64_t T, int64_t H, int64_t D, bool lse = false)
      : bytes(size_t(checked_bytes("exchange buffer", {T, B, H, D}, dtype_size(t)))) {
    view = lse ? token_major_lse(bytes.data(), t, B, T, H) : token_major(bytes.data(), t, B, T, H, D);
  }
  Buf(const Row& r, int64_t B, int64_t T) : Buf(r.dtype, B, T, r.H, r.lse ? 1 : r.D, r.lse) {}
  int64_t size() const { return int64_t(bytes.size()); }
};

// dst token di <- src token si (every batch element and head), converting dtypes where they differ.
void copy_token(const TensorView& src, int64_t si, const TensorView& dst, int64_t di) {
  const int64_t B = src.shape[0], H = src.shape[2], D = src.shape[3];
  const size_t es = size_t(dtype_size(src.dtype));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      if (src.dtype == dst.dtype && src.stride[3] == 1 && dst.stride[3] == 1) {
        std::memcpy(static_cast<char*>(dst.data) + size_t(dst.offset(b, di, h, 0)) * es,
                    static_cast<const char*>(src.data) + size_t(src.offset(b, si, h, 0)) * es, size_t(D) * es);
      } else {
        for (int64_t d = 0; d < D; ++d) dst.store(b, di, h, d, src.load(b, si, h, d));
      }
    }
}
// dst token di += src token si.
void add_token(const TensorView& src, int64_t si, const TensorView& dst, int64_t di) {
  for (int64_t b = 0; b < src.shape[0]; ++b)
    for (int64_t h = 0; h < src.shape[2]; ++h)
      for (int64_t d = 0; d < src.shape[3]; ++d) dst.store(b, di, h, d, dst.load(b, di, h, d) + src.load(b, si, h, d));
}
// lse[b, h, li] of a [B, H, T, 1] view.
void copy_lse(const TensorView& src, int64_t si, const TensorView& dst, int64_t di) {
  for (int64_t b = 0; b < src.shape[0]; ++b)
    for (int64_t h = 0; h < src.shape[1]; ++h) dst.store(b, h, di, 0, src.load(b, h, si, 0));
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

// Calls fn(global token, index in the concatenation) for each token of `ranges` in order, from index `first`.
template <class F>
void for_tokens(const IndexRanges& ranges, int64_t first, F&& fn) {
  int64_t i = first;
  for (const IndexRange& r : ranges)
    for (int64_t g = r.begin; g < r.end; ++g) fn(g, i++);
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
  int64_t n = 0, f = 0, g = 0;          // own tokens, fetched keys, received global-row queries
  std::vector<int64_t> fetched_at, rows_at;  // [world + 1]: first index of each source's keys / rows
  detail::LocalIndex local_index;
  std::optional<Plan> local, remote, rows;

  Impl(const DistPlan& plan, int rank, Device dev, const PlanOptions& options)
      : problem(plan.problem()), rp(plan.rank(rank)), world(plan.world()), device(dev), local_index(rp.owned) {
    if (dev.kind != Device::Kind::cpu)
      throw Error("distributed attention on " + dev.str() +
                  ": not built yet (device exchange buffers and the GPU merge are the next step); use Device::cpu()");
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
    if (n > 0) local.emplace(make_plan(windows(pats, rp.owned, rp.owned), piece(n, n), dev, options));
    if (n > 0 && f > 0)
      remote.emplace(make_plan(windows(pats, rp.owned, rp.fetched, rp.skipped), piece(n, f), dev, options));
    if (g > 0 && n > 0) rows.emplace(make_plan(windows(pats, rp.row_queries, rp.owned), piece(g, n), dev, options));
  }

  // [world]: its global rows, from each other rank (their partial results come back in that order).
  std::vector<IndexRanges> own_rows_from_each() const {
    std::vector<IndexRanges> out(static_cast<size_t>(world), rp.skipped);
    out[size_t(rp.rank)].clear();
    return out;
  }

  void check_comm(const Communicator& comm) const {
    if (comm.size() != world || comm.rank() != rp.rank)
      throw Error("distributed rank " + std::to_string(rp.rank) + " of " + std::to_string(world) +
                  ": the communicator is rank " + std::to_string(comm.rank()) + " of " + std::to_string(comm.size()));
  }

  // Packs the tokens of `ranges` (owned) of t into a token-major buffer.
  Buf pack(const TensorView& t, const IndexRanges& ranges, DType dtype) const {
    Buf b(dtype, t.shape[0], total_size(ranges), t.shape[2], t.shape[3]);
    for_tokens(ranges, 0, [&](int64_t gt, int64_t i) { copy_token(t, local_index(gt), b.view, i); });
    return b;
  }
  Buf pack_lse(const TensorView& lse, const IndexRanges& ranges) const {
    Buf b(DType::f32, lse.shape[0], total_size(ranges), lse.shape[1], 1, true);
    for_tokens(ranges, 0, [&](int64_t gt, int64_t i) { copy_lse(lse, local_index(gt), b.view, i); });
    return b;
  }

  // Round 1 posted: every peer's K/V ranges (and global-row tensors `row_src`, packed once, the same to every
  // peer) sent; into kf/vf and the row buffers, received. Returns the send buffers (alive until wait).
  std::vector<Buf> post_round1(Communicator& comm, const TensorView& k, const TensorView& v, Buf& kf, Buf& vf,
                               const std::vector<const TensorView*>& row_src, std::vector<Buf>& row_dst,
                               const TensorView* lse_src, Buf* lse_dst) const {
    const int r = rp.rank;
    std::vector<Buf> keep;
    const int64_t B = problem.batch;
    kf = Buf(k.dtype, B, f, problem.kv_heads, problem.head_dim);
    vf = Buf(v.dtype, B, f, problem.kv_heads, problem.dv());
    for (const TensorView* t : row_src) row_dst.emplace_back(t->dtype, B, g, t->shape[2], t->shape[3]);
    if (lse_dst) *lse_dst = Buf(DType::f32, B, g, problem.q_heads, 1, true);
    std::vector<Buf> rows_out;
    if (!rp.skipped.empty()) {
      for (const TensorView* t : row_src) rows_out.push_back(pack(*t, rp.skipped, t->dtype));
      if (lse_src) rows_out.push_back(pack_lse(*lse_src, rp.skipped));
    }
    comm.group_start();
    for (int s = 0; s < world; ++s) {
      if (s == r) continue;
      if (!rp.send_keys[size_t(s)].empty()) {
        for (const TensorView* t : {&k, &v}) {
          keep.push_back(pack(*t, rp.send_keys[size_t(s)], t->dtype));
          comm.send(keep.back().bytes.data(), keep.back().size(), s);
        }
      }
      for (Buf& b : rows_out) comm.send(b.bytes.data(), b.size(), s);
      const int64_t t0 = fetched_at[size_t(s)], nt = fetched_at[size_t(s) + 1] - t0;
      if (nt > 0) {
        for (Buf* b : {&kf, &vf}) comm.recv(b->bytes.data() + t0 * (b->size() / f), b->size() / f * nt, s);
      }
      const int64_t r0 = rows_at[size_t(s)], nr = rows_at[size_t(s) + 1] - r0;
      if (nr > 0) {
        std::vector<Buf*> dsts;
        for (Buf& b : row_dst) dsts.push_back(&b);
        if (lse_dst) dsts.push_back(lse_dst);
        for (Buf* b : dsts) {
          const int64_t per = b->size() / g;
          comm.recv(b->bytes.data() + r0 * per, per * nr, s);
        }
      }
    }
    comm.group_end();
    for (Buf& b : rows_out) keep.push_back(std::move(b));
    return keep;
  }

  // Round 2: token-major results `out` (rows in the order of `out_ranges_of[s]`, concatenated over s at `out_at`)
  // sent to each peer; each peer's results for `in_ranges_of[s]` received and handed to `use(s, bufs)`.
  void exchange_back(Communicator& comm, std::vector<Buf*> out, const std::vector<int64_t>& out_at,
                     const std::vector<IndexRanges>& in_ranges_of, const std::vector<Row>& in_rows,
                     const std::function<void(int, std::vector<Buf>&)>& use) const {
    const int r = rp.rank;
    std::vector<std::vector<Buf>> in(static_cast<size_t>(world));
    comm.group_start();
    for (int s = 0; s < world; ++s) {
      if (s == r) continue;
      const int64_t t0 = out_at[size_t(s)], nt = out_at[size_t(s) + 1] - t0;
      if (nt > 0)
        for (Buf* b : out) {
          const int64_t per = b->size() / out_at[size_t(world)];
          comm.send(b->bytes.data() + t0 * per, per * nt, s);
        }
      const int64_t ni = total_size(in_ranges_of[size_t(s)]);
      if (ni > 0)
        for (const Row& row : in_rows) {
          in[size_t(s)].emplace_back(row, problem.batch, ni);
          comm.recv(in[size_t(s)].back().bytes.data(), in[size_t(s)].back().size(), s);
        }
    }
    comm.group_end();
    comm.wait();
    for (int s = 0; s < world; ++s)
      if (!in[size_t(s)].empty()) use(s, in[size_t(s)]);
  }

  void forward(Communicator& comm, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView& lse) const {
    check_comm(comm);
    const Problem& p = problem;
    const int64_t B = p.batch, Hq = p.q_heads, Dv = p.dv();
    Problem::check_view(q, "q", {B, n, Hq, p.head_dim});
    Problem::check_view(k, "k", {B, n, p.kv_heads, p.head_dim});
    Problem::check_view(v, "v", {B, n, p.kv_heads, Dv});
    Problem::check_view(o, "o", {B, n, Hq, Dv});
    Problem::check_view(lse, "lse", {B, Hq, n, 1});
    if (n > 0 && !lse.data) throw Error("distributed forward: lse is required (the parts merge through it)");
    Buf kf, vf;
    std::vector<Buf> qg;
    std::vector<Buf> keep = post_round1(comm, k, v, kf, vf, {&q}, qg, nullptr, nullptr);
    if (local) local->forward(q, k, v, o, lse);  // overlaps the exchange: no wait before it
    comm.wait();
    if (remote) {
      Buf o2(DType::f32, B, n, Hq, Dv), l2(DType::f32, B, n, Hq, 1, true);
      remote->forward(q, kf.view, vf.view, o2.view, l2.view);
      merge_into(o, lse, o2.view, l2.view);
    }
    // Global rows: the partials this rank computed for others go back; its own rows' partials come in and merge.
    Buf og(DType::f32, B, g, Hq, Dv), lg(DType::f32, B, g, Hq, 1, true);
    if (rows) rows->forward(qg[0].view, k, v, og.view, lg.view);
    if (g > 0 && !rows) {  // a rank with no tokens answers with empty partials
      for (int64_t i = 0; i < g; ++i)
        for (int64_t b = 0; b < B; ++b)
          for (int64_t h = 0; h < Hq; ++h) {
            lg.view.store(b, h, i, 0, -INFINITY);
            for (int64_t d = 0; d < Dv; ++d) og.view.store(b, i, h, d, 0.0);
          }
    }
    const std::vector<IndexRanges> in_of = own_rows_from_each();
    exchange_back(comm, {&og, &lg}, rows_at, in_of, {{DType::f32, Hq, Dv}, {DType::f32, Hq, 1, true}}, [&](int, std::vector<Buf>& in) {
      for_tokens(rp.skipped, 0, [&](int64_t gt, int64_t i) { merge_row(o, lse, local_index(gt), in[0].view, in[1].view, i); });
    });
  }

  void backward(Communicator& comm, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                const TensorView& dv) const {
    check_comm(comm);
    const Problem& p = problem;
    const int64_t B = p.batch, Hq = p.q_heads, Hkv = p.kv_heads, D = p.head_dim, Dv = p.dv();
    Problem piece = p;
    piece.q_len = piece.kv_len = n;
    piece.check_backward_views(q, k, v, dout, dq, dk, dv, true);
    Problem::check_view(o, "o", {B, n, Hq, Dv});
    Problem::check_view(lse, "lse", {B, Hq, n, 1});
    if (n > 0 && (!o.data || !lse.data))
      throw Error("distributed backward: o and lse of the forward are required (every part's P uses the merged lse)");
    Buf kf, vf, lg;
    std::vector<Buf> rg;  // q, o, dout of global rows
    std::vector<Buf> keep = post_round1(comm, k, v, kf, vf, {&q, &o, &dout}, rg, &lse, &lg);
    if (local) {
      local->backward(q, k, v, o, lse, dout, dq, dk, dv);
    } else {  // no tokens: nothing to write
    }
    comm.wait();
    Buf dkf(DType::f32, B, f, Hkv, D), dvf(DType::f32, B, f, Hkv, Dv);
    if (remote) {
      Buf dq2(DType::f32, B, n, Hq, D);
      remote->backward(q, kf.view, vf.view, o, lse, dout, dq2.view, dkf.view, dvf.view);
      for (int64_t i = 0; i < n; ++i) add_token(dq2.view, i, dq, i);
    }
    Buf dqg(DType::f32, B, g, Hq, D);
    if (rows) {
      Buf dk2(DType::f32, B, n, Hkv, D), dv2(DType::f32, B, n, Hkv, Dv);
      rows->backward(rg[0].view, k, v, rg[1].view, lg.view, rg[2].view, dqg.view, dk2.view, dv2.view);
      for (int64_t i = 0; i < n; ++i) {
        add_token(dk2.view, i, dk, i);
        add_token(dv2.view, i, dv, i);
      }
    } else {
      std::fill(dqg.bytes.begin(), dqg.bytes.end(), 0);
    }
    // Round 2a: dK/dV of the keys this rank borrowed go back to their owners, who add them.
    exchange_back(comm, {&dkf, &dvf}, fetched_at, rp.send_keys, {{DType::f32, Hkv, D}, {DType::f32, Hkv, Dv}}, [&](int s, std::vector<Buf>& in) {
      for_tokens(rp.send_keys[size_t(s)], 0, [&](int64_t gt, int64_t i) {
        add_token(in[0].view, i, dk, local_index(gt));
        add_token(in[1].view, i, dv, local_index(gt));
      });
    });
    // Round 2b: the dQ partials of others' global rows go back to their owners.
    const std::vector<IndexRanges> in_of = own_rows_from_each();
    exchange_back(comm, {&dqg}, rows_at, in_of, {{DType::f32, Hq, D}}, [&](int, std::vector<Buf>& in) {
      for_tokens(rp.skipped, 0, [&](int64_t gt, int64_t i) { add_token(in[0].view, i, dq, local_index(gt)); });
    });
  }
};

DistRank::DistRank(const DistPlan& plan, int rank, Device device, const PlanOptions& options)
    : impl_(std::make_unique<Impl>(plan, rank, device, options)) {}
DistRank::~DistRank() = default;
DistRank::DistRank(DistRank&&) noexcept = default;

int DistRank::rank() const { return impl_->rp.rank; }

void DistRank::forward(Communicator& comm, const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& o, const TensorView& lse, Stream) const {
  impl_->forward(comm, q, k, v, o, lse);
}

void DistRank::backward(Communicator& comm, const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& o, const TensorView& lse, const TensorView& dout, const TensorView& dq,
                        const TensorView& dk, const TensorView& dv, Stream) const {
  impl_->backward(comm, q, k, v, o, lse, dout, dq, dk, dv);
}

std::string DistRank::explain() const {
  std::ostringstream s;
  const Impl& im = *impl_;
  s << "rank " << im.rp.rank << " of " << im.world << ": " << im.n << " tokens, " << im.f << " fetched keys, " << im.g
    << " global-row queries answered";
  auto part = [&](const char* name, const std::optional<Plan>& p) {
    if (p) s << "\n  " << name << ": " << p->explain();
  };
  part("local", im.local);
  part("remote", im.remote);
  part("rows", im.rows);
  return s.str();
}

}  // namespace spattn::dist
