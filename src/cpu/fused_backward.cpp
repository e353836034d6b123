// cpu/fused_backward.cpp — FusedPlan::backward: FlashAttention-2's backward on the CPU, over the forward's tiles.
//
// P is recomputed tile by tile from Q, K and the forward's LSE, with delta = rowsum(dO * O) computed once per row;
// per (query tile, key block) the kernel (fused_bwd_kernels.inc) forms S, dP = dO V^T, P and dS, and adds
// dV += P^T dO, dK += scale dS^T Q, dQ += scale dS K. It reads the forward's plan as is (the tiler of fused.cpp:
// the same query tiles, key blocks, row masks and residue rows), so every pattern the forward runs, the backward
// runs, with the same waste.
//
// Work. A query row's dQ belongs to its tile; a key's dK / dV rows are added to by every tile that keeps the key, in
// every query head of its kv group (GQA). So a task is a (batch, kv head) group: it runs all tiles of the group's
// query heads in the thread's fp32 accumulator (only the range of keys they keep), then writes dK / dV once. Where
// groups would leave threads idle (fewer than the threads, or not a multiple of them), each group is cut into
// slices of about equal cost, each with its own partial dK / dV, added in slice order at the end (so the result
// depends on the thread count, not on the scheduling).
//
// Phases, in one parallel region: (1) pack K and V (and Q, dO where they cannot be read in place) to fp32 rows
// padded to whole vectors; delta and the LSE in base 2 per query row; (2) the tasks, most expensive first; (3) the
// slices' partials added and dQ converted where the caller's is fp64. Groups whose fp32 gradients are not all finite
// (a NaN or infinity among the inputs they read reaches them: the kernels compute masked entries too, so more
// often than in the reference, never less), or with a row whose LSE is past what fp32 recomputes P from, are then
// recomputed in fp64 (cpu/backward.hpp): PATTERNS.md's semantics for non-finite values, as the forward's row redo.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <numeric>
#include <sstream>

#include "common/parallel.hpp"
#include "cpu/backward.hpp"
#include "cpu/fused_internal.hpp"

namespace spattn::cpu {
namespace fused {
namespace {

constexpr int64_t kPackRows = 128;    // tokens a pack task (every head of them: the inputs read front to back)
constexpr int64_t kReduceRows = 256;  // keys a reduce task
constexpr int kMaxSplit = 64;
constexpr double kMaxPartialBytes = double(int64_t(1) << 29);  // the slices' dK / dV partials, at most (512 MiB)

bool finite_floats(const float* x, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    bad |= uint32_t((u & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

// n fp32 values into row (b, l, h) of an f32 or f64 view (src null: zeros). False if a value is not finite.
bool store_row(const TensorView& t, int64_t b, int64_t l, int64_t h, const float* src, int64_t n) {
  const int64_t off = t.offset(b, l, h, 0), inc = t.stride[3];
  if (t.dtype == DType::f32 && inc == 1) {
    float* d = static_cast<float*>(t.data) + off;
    if (src) std::memcpy(d, src, size_t(n) * sizeof(float));
    else std::memset(d, 0, size_t(n) * sizeof(float));
  } else if (t.dtype == DType::f32) {
    float* d = static_cast<float*>(t.data) + off;
    for (int64_t i = 0; i < n; ++i) d[i * inc] = src ? src[i] : 0.f;
  } else {
    double* d = static_cast<double*>(t.data) + off;
    for (int64_t i = 0; i < n; ++i) d[i * inc] = src ? double(src[i]) : 0.0;
  }
  return !src || finite_floats(src, n);
}

// The first and last key each tile of a pattern plan keeps (first > last: none).
std::vector<std::pair<int32_t, int32_t>> tile_key_ranges(const PatternPlan& pl) {
  std::vector<std::pair<int32_t, int32_t>> out(pl.refs.size(), {std::numeric_limits<int32_t>::max(), -1});
  for (size_t t = 0; t < pl.refs.size(); ++t) {
    const TileRef& r = pl.refs[t];
    const KeyStore& st = pl.stores[size_t(pl.tiles[t].store)];
    auto& [lo, hi] = out[t];
    for (int64_t b = 0; b < r.nblocks; ++b)
      for (int32_t j = 0; j < r.blocks[b].n; ++j) {
        const int32_t key = st.keys[size_t(r.blocks[b].keys + j)];
        lo = std::min(lo, key), hi = std::max(hi, key);
      }
    if (r.res_off)
      for (int i = 0; i < r.rows; ++i)
        for (int32_t j = 0; j < r.res_cnt[i]; ++j) {
          const int32_t key = st.res_keys[size_t(r.res_off[i] + j)];
          lo = std::min(lo, key), hi = std::max(hi, key);
        }
  }
  return out;
}

// The calling thread's buffers, kept across calls (growing only): allocated per call, their pages were faulted in
// on every call (sparse_fixed(128), L = 4096: ~15% of the backward in the kernel's page-fault and brk paths).
// The packed K/V and Q/dO on huge pages, as the forward's K/V (fused.cpp: rows read at scattered tokens).
struct BwdBuffers {
  AlignedFloats qd{{}, 0, nullptr, true}, kv{{}, 0, nullptr, true}, lse2, delta, o, lse, dq, partials;
};
BwdBuffers& bwd_buffers() {
  thread_local BwdBuffers b;
  return b;
}

// Slices per group: the count with the least predicted time (groups of equal cost, dynamic scheduling: G * S tasks
// on T threads take ceil(G S / T) / S group-times, and each slice adds ~2% for its partial's zeroing and reduction:
// measured, 4 groups on 2 threads ran fastest whole, 1 group 1.8-1.9x faster in 2 slices than whole, 2 to 8 slices
// within 4%). At most one slice per unit, and partials of at most kMaxPartialBytes (`slice_bytes`: one slice's, at
// most).
int choose_split(int64_t groups, int threads, int64_t units_per_group, double slice_bytes) {
  int best = 1;
  double best_t = std::numeric_limits<double>::infinity();
  for (int s = 1; s <= kMaxSplit && s <= std::max<int64_t>(units_per_group, 1) &&
                  (s == 1 || double(groups) * s * slice_bytes <= kMaxPartialBytes);
       ++s) {
    const double t = double((groups * s + threads - 1) / threads) / s * (1.0 + 0.02 * (s - 1));
    if (t < best_t - 1e-9) best_t = t, best = s;
  }
  return best;
}

// Units of work per kv head: (query head, tile) with its cost, cut into slices of about equal cost; the tasks (a
// batch element's kv head, a slice) most costly first.
struct Unit {
  int32_t h, tile;
};
struct Slice {
  int64_t begin, end;  // units
  int32_t key0, nkeys;  // the keys its tiles keep: [key0, key0 + nkeys)
  double cost;
  int64_t partial;  // offset of its partials (per batch element: + b * partial_per_b), S > 1
};
struct Task {
  int64_t g;
  int s;
};
struct BackwardWork {
  std::vector<std::vector<Unit>> units;  // [HK]
  int S = 1;                             // slices a kv head (`split`, or chosen where 0)
  std::vector<Slice> slices;             // [HK * S]
  int64_t partial_per_b = 0;             // the slices' dK / dV partials a batch element (S > 1)
  std::vector<Task> tasks;
};
// HK kv heads of `group` query heads each, G = B * HK groups, over the plans (and their tiles' key ranges) of the
// query heads; DP, DVP: a packed K and V row's floats.
BackwardWork slice_work(const std::vector<PatternPlan>& plans, const std::vector<int>& plan_of_head,
                        const std::vector<std::vector<std::pair<int32_t, int32_t>>>& tile_keys, int64_t HK,
                        int64_t group, int64_t G, int64_t Lk, int64_t DP, int64_t DVP, int split, int threads) {
  BackwardWork w;
  std::vector<std::vector<Unit>>& units = w.units;
  units.resize(static_cast<size_t>(HK));
  std::vector<std::vector<double>> unit_cost(static_cast<size_t>(HK));
  int64_t max_units = 0;
  for (int64_t hk = 0; hk < HK; ++hk) {
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      const PatternPlan& pl = plans[size_t(plan_of_head[size_t(h)])];
      for (size_t t = 0; t < pl.tiles.size(); ++t) {
        units[size_t(hk)].push_back({int32_t(h), int32_t(t)});
        unit_cost[size_t(hk)].push_back(pl.tiles[t].cost);
      }
    }
    max_units = std::max<int64_t>(max_units, int64_t(units[size_t(hk)].size()));
  }
  const int S = w.S = split > 0 ? split : choose_split(G, threads, max_units, double(Lk) * double(DP + DVP) * 4);
  std::vector<Slice>& slices = w.slices;
  slices.resize(size_t(HK * S));
  int64_t& partial_per_b = w.partial_per_b;
  for (int64_t hk = 0; hk < HK; ++hk) {
    const auto& uc = unit_cost[size_t(hk)];
    const double total = std::accumulate(uc.begin(), uc.end(), 0.0);
    int64_t u = 0;
    double done = 0;  // cost of the units in earlier slices
    for (int s = 0; s < S; ++s) {
      Slice& sl = slices[size_t(hk * S + s)];
      sl.begin = u;
      const double bound = total * (s + 1) / S;
      while (u < int64_t(uc.size()) && (s + 1 == S || done + 0.5 * uc[size_t(u)] <= bound)) done += uc[size_t(u++)];
      sl.end = u;
      int32_t lo = std::numeric_limits<int32_t>::max(), hi = -1;
      sl.cost = 0;
      for (int64_t i = sl.begin; i < sl.end; ++i) {
        const Unit& un = units[size_t(hk)][size_t(i)];
        const auto& r = tile_keys[size_t(plan_of_head[size_t(un.h)])][size_t(un.tile)];
        lo = std::min(lo, r.first), hi = std::max(hi, r.second);
        sl.cost += uc[size_t(i)];
      }
      sl.key0 = hi >= lo ? lo : 0;
      sl.nkeys = hi >= lo ? hi - lo + 1 : 0;
      sl.partial = partial_per_b;
      if (S > 1) partial_per_b += int64_t(sl.nkeys) * (DP + DVP);
    }
  }
  std::vector<Task>& tasks = w.tasks;
  for (int64_t g = 0; g < G; ++g)
    for (int s = 0; s < S; ++s) tasks.push_back({g, s});
  std::stable_sort(tasks.begin(), tasks.end(), [&](const Task& a, const Task& b) {
    return slices[size_t((a.g % HK) * S + a.s)].cost > slices[size_t((b.g % HK) * S + b.s)].cost;
  });
  return w;
}

// The backward's phases on `nthreads` threads, each phase's tasks drawn in order: the packing tasks, then (after a
// barrier) the tile tasks, then, where there are any, the reduce tasks; every thread's scratch holds
// `scratch_floats` first. A thread that throws (an allocation) still meets the barriers, doing no more work; the
// first error is rethrown after the region (parallel_for's own rethrow would come after the others had waited
// forever).
template <class Pack, class Run, class Reduce>
void run_phases(int nthreads, int64_t npack, int64_t ntasks, int64_t nreduce, int64_t scratch_floats, Pack&& pack,
                Run&& run, Reduce&& reduce) {
  std::atomic<int64_t> next_pack{0}, next_task{0}, next_reduce{0};
  common::Barrier barrier(nthreads);
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  auto guarded = [&](auto&& phase) {
    if (failed.load(std::memory_order_relaxed)) return;
    try {
      phase();
    } catch (...) {
      if (!failed.exchange(true)) error = std::current_exception();
    }
  };
  common::parallel_for(nthreads, nthreads, [&](int64_t, int) {
    guarded([&] {
      AlignedFloats& scr = scratch_buffer();
      if (scr.cap < scratch_floats + 16) scr.resize(scratch_floats);
      for (int64_t i; !failed && (i = next_pack.fetch_add(1, std::memory_order_relaxed)) < npack;) pack(i);
    });
    barrier.wait();
    guarded([&] {
      for (int64_t i; !failed && (i = next_task.fetch_add(1, std::memory_order_relaxed)) < ntasks;) run(i);
    });
    if (nreduce == 0) return;
    barrier.wait();
    guarded([&] {
      for (int64_t i; !failed && (i = next_reduce.fetch_add(1, std::memory_order_relaxed)) < nreduce;) reduce(i);
    });
  });
  if (error) std::rethrow_exception(error);
}

// A backward call's views against the problem (o and lse may be missing: then recomputed).
void check_backward_args(const Problem& p, const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& o, const TensorView& lse, const TensorView& dout, const TensorView& dq,
                         const TensorView& dk, const TensorView& dv) {
  p.check_backward_views(q, k, v, dout, dq, dk, dv, true);
  if (o.data) Problem::check_view(o, "o", {p.batch, p.q_len, p.q_heads, p.dv()});
  if (lse.data) {
    Problem::check_view(lse, "lse", {p.batch, p.q_heads, p.q_len, 1});
    if (lse.dtype != DType::f32 && lse.dtype != DType::f64)
      throw Error("fused CPU backward: lse must be fp32 or fp64, got " + std::string(dtype_name(lse.dtype)));
  }
}

// Every gradient 0 (a zero length: no kept score).
void zero_gradients(const Problem& p, const TensorView& dq, const TensorView& dk, const TensorView& dv, int threads) {
  const int64_t Lq = p.q_len, Lk = p.kv_len, L = std::max(Lq, Lk);
  common::parallel_for(p.batch * L, threads, [&](int64_t i, int) {
    const int64_t b = i / L, l = i % L;
    for (int64_t h = 0; l < Lq && h < p.q_heads; ++h) store_row(dq, b, l, h, nullptr, p.head_dim);
    for (int64_t h = 0; l < Lk && h < p.kv_heads; ++h)
      store_row(dk, b, l, h, nullptr, p.head_dim), store_row(dv, b, l, h, nullptr, p.dv());
  });
}

// Where the tiles add dQ: straight into the caller's fp32 view, or into fp32 rows (`rows`, [B][Lq][H][D]) converted
// at the end.
struct DqRows {
  float* p;
  int64_t sb, ld, sh, inc;
};
DqRows dq_rows(const TensorView& dq, AlignedFloats& rows, int64_t B, int64_t Lq, int64_t H, int64_t D) {
  if (dq.dtype == DType::f32) return {static_cast<float*>(dq.data), dq.stride[0], dq.stride[1], dq.stride[2], dq.stride[3]};
  rows.resize(B * Lq * H * D);
  return {rows.ptr, Lq * H * D, H * D, D, 1};
}

}  // namespace
}  // namespace fused

std::string BackwardStats::describe() const {
  std::ostringstream os;
  os << "cpu_fused_" << isa;
  if (split > 1) os << "; split " << split;
  if (exact_groups > 0) os << "; fp64 for " << exact_groups << " of " << groups << " groups";
  if (recomputed) os << "; forward recomputed";
  return os.str();
}

BackwardStats FusedPlan::backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                                  const TensorView& lse, const TensorView& dout, const TensorView& dq,
                                  const TensorView& dk, const TensorView& dv, const Options& options) const {
  using namespace fused;
  using common::parallel_for;
  const Impl& im = *impl_;
  const Problem& p = im.problem;
  const int64_t B = p.batch, Lq = p.q_len, Lk = p.kv_len, H = p.q_heads, HK = p.kv_heads, D = p.head_dim, Dv = p.dv();
  check_backward_args(p, q, k, v, o, lse, dout, dq, dk, dv);
  const bool given = o.data && lse.data;
  const KernelSet& ks = *im.ks;
  BackwardStats stats;
  stats.isa = ks.name;
  stats.groups = B * HK;
  const int threads = resolve_threads(options.threads);
  if (options.split < 0) throw Error("backward split must be >= 0 (0: chosen), got " + std::to_string(options.split));
  if (B == 0 || H == 0) return stats;
  if (Lq == 0 || Lk == 0) {  // no kept score: every gradient is 0
    zero_gradients(p, dq, dk, dv, threads);
    return stats;
  }
  std::call_once(im.bwd_once, [&] {
    for (const PatternPlan& pl : im.plans) im.tile_keys.push_back(tile_key_ranges(pl));
  });

  // O and the LSE: the caller's, or the forward's now.
  BwdBuffers& buf = bwd_buffers();
  TensorView ov = o, lv = lse;
  if (!given) {
    buf.o.resize(B * Lq * H * Dv);
    buf.lse.resize(B * H * Lq);
    ov = TensorView::contiguous(buf.o.ptr, DType::f32, {B, Lq, H, Dv});
    lv = TensorView::contiguous(buf.lse.ptr, DType::f32, {B, H, Lq, 1});
    run(q, k, v, ov, lv, options);
    stats.recomputed = true;
  }

  const int64_t W = ks.width;
  const int64_t DP = (D + W - 1) / W * W, DVP = (Dv + W - 1) / W * W, group = H / HK, G = B * HK;
  // K and V packed as the forward packs them (pack_kv_rows): a key's K row then its V row, [B][HK][Lk][DP + DVP].
  // The backward reads each K / V row in three products (the forward in two): packed beat in place ([B, L, H, D],
  // rows 1 KiB apart) on every suite pattern but one (L = 4096, H = 4, D = 64, alternated in one process: local
  // 14.6 vs 15.4 ms, causal 99.3 vs 108.3, na2d 18.5 vs 20.1, longformer, bigbird, dilated 4-6%; fixed 12.1 vs
  // 11.8). Q and dO, read once per tile, in place where fp32 with unit inner stride and rows of whole vectors
  // (packed the same way, no faster: local 30.3 vs 30.3 ms, fixed 13.1 vs 13.1), else packed: a query's Q row then
  // its dO row, [B][H][Lq][DP + DVP]. Per query row, lse2 and delta [B][H][Lq].
  const int64_t ld = DP + DVP;
  auto direct = [&](const TensorView& t, int64_t dim) { return t.dtype == DType::f32 && t.stride[3] == 1 && dim % W == 0; };
  const bool pack_qd = !direct(q, D) || !direct(dout, Dv);
  AlignedFloats &qdb = buf.qd, &kvb = buf.kv, &l2b = buf.lse2, &deltab = buf.delta;
  if (pack_qd) qdb.resize(B * H * Lq * ld);
  kvb.resize(B * HK * Lk * ld);
  l2b.resize(B * H * Lq), deltab.resize(B * H * Lq);
  std::unique_ptr<std::atomic<bool>[]> bad(new std::atomic<bool>[size_t(G)]);
  for (int64_t g = 0; g < G; ++g) bad[size_t(g)].store(false, std::memory_order_relaxed);

  const BackwardWork work = slice_work(im.plans, im.plan_of_head, im.tile_keys, HK, group, G, Lk, DP, DVP, options.split, threads);
  const std::vector<std::vector<Unit>>& units = work.units;
  const int S = work.S;
  const std::vector<Slice>& slices = work.slices;
  const int64_t partial_per_b = work.partial_per_b;
  const std::vector<Task>& tasks = work.tasks;
  stats.split = S;
  AlignedFloats& partials = buf.partials;
  if (S > 1) partials.resize(B * partial_per_b);

  const DqRows dqr = dq_rows(dq, buf.dq, B, Lq, H, D);
  float* const dqp = dqr.p;
  const int64_t dq_sb = dqr.sb, dq_ld = dqr.ld, dq_sh = dqr.sh, dq_inc = dqr.inc;

  const float qscale = float(p.softmax_scale() * 1.4426950408889634), scale = float(p.softmax_scale());
  const int64_t sfloats = ks.bwd_scratch_floats(D, Dv);
  const int64_t kv_tasks = B * ((Lk + kPackRows - 1) / kPackRows), q_tasks = B * ((Lq + kPackRows - 1) / kPackRows);
  const int64_t reduce_tasks = S > 1 ? G * ((Lk + kReduceRows - 1) / kReduceRows) : 0;
  const int64_t dq_tasks = dq.dtype != DType::f32 ? q_tasks : 0;
  const int nthreads = int(std::max<int64_t>(1, std::min<int64_t>(threads, std::max<int64_t>(int64_t(tasks.size()), kv_tasks + q_tasks))));

  // Packing (where asked) and each query row's lse2 and delta, tokens [l0, l0 + kPackRows) of a batch element.
  auto pack = [&](int64_t i) {
    if (i < kv_tasks) {
      const int64_t per_b = (Lk + kPackRows - 1) / kPackRows, l0 = (i % per_b) * kPackRows;
      return pack_kv_rows(k, v, kvb.ptr, DP, DVP, i / per_b, l0, std::min(Lk, l0 + kPackRows));
    }
    i -= kv_tasks;
    const int64_t per_b = (Lq + kPackRows - 1) / kPackRows, b = i / per_b, l0 = (i % per_b) * kPackRows;
    if (pack_qd) pack_kv_rows(q, dout, qdb.ptr, DP, DVP, b, l0, std::min(Lq, l0 + kPackRows));
    float* orow = scratch_buffer().ptr;  // an O row, then a dO row
    float* drow = orow + DVP;
    for (int64_t l = l0; l < std::min(Lq, l0 + kPackRows); ++l)
      for (int64_t h = 0; h < H; ++h) {
        convert_row(ov, b, l, h, orow, Dv);
        convert_row(dout, b, l, h, drow, Dv);
        float delta = 0;
        for (int64_t c = 0; c < Dv; ++c) delta += drow[c] * orow[c];
        const double ls = lv.load(b, h, l, 0) * 1.4426950408889634;
        const bool no_key = ls == -std::numeric_limits<double>::infinity();
        l2b.ptr[(b * H + h) * Lq + l] = no_key ? std::numeric_limits<float>::infinity() : float(ls);  // no key: P = 0
        deltab.ptr[(b * H + h) * Lq + l] = delta;
        // An LSE past 2^14 in magnitude (base 2) leaves P = exp2(s - lse2) a relative error of fp32's spacing there,
        // 2^-10 and more (scores of 3e5 gave P 2% off): such rows go to fp64, as do NaN and +inf.
        if (!(no_key || std::abs(ls) < 16384.0))
          bad[size_t(b * HK + h / group)].store(true, std::memory_order_relaxed);
      }
  };

  auto run_task = [&](const Task& task) {
    const int64_t g = task.g, b = g / HK, hk = g % HK;
    if (bad[size_t(g)].load(std::memory_order_relaxed)) return;
    const Slice& sl = slices[size_t(hk * S + task.s)];
    const int64_t nk = sl.nkeys;
    float* acc;
    if (S > 1) {
      acc = partials.ptr + b * partial_per_b + sl.partial;
    } else {
      thread_local AlignedFloats acc_buf;
      acc_buf.resize(nk * (DP + DVP));
      acc = acc_buf.ptr;
    }
    std::memset(acc, 0, size_t(nk * (DP + DVP)) * sizeof(float));
    int32_t nonfinite = 0;
    BwdTileArgs a{};
    a.D = D, a.Dv = Dv, a.DP = DP, a.DVP = DVP, a.qscale = qscale, a.scale = scale;
    a.k = kvb.ptr + g * Lk * ld, a.k_ld = ld;
    a.v = a.k + DP, a.v_ld = ld;
    a.gk = acc, a.gv = acc + nk * DP, a.key0 = sl.key0;
    a.dq_ld = dq_ld, a.dq_inc = dq_inc;
    a.scratch = scratch_buffer().ptr;
    a.nonfinite = &nonfinite;
    for (int64_t i = sl.begin; i < sl.end; ++i) {
      const Unit& u = units[size_t(hk)][size_t(i)];
      const int64_t bh = b * H + u.h;
      const PatternPlan& pl = im.plans[size_t(im.plan_of_head[size_t(u.h)])];
      const KeyStore& st = pl.stores[size_t(pl.tiles[size_t(u.tile)].store)];
      if (pack_qd) {
        a.q = qdb.ptr + bh * Lq * ld, a.q_ld = ld;
        a.dout = a.q + DP, a.dout_ld = ld;
      } else {
        a.q = static_cast<const float*>(q.data) + b * q.stride[0] + u.h * q.stride[2], a.q_ld = q.stride[1];
        a.dout = static_cast<const float*>(dout.data) + b * dout.stride[0] + u.h * dout.stride[2], a.dout_ld = dout.stride[1];
      }
      a.lse2 = l2b.ptr + bh * Lq, a.delta = deltab.ptr + bh * Lq;
      a.dq = dqp + b * dq_sb + u.h * dq_sh;
      a.tile = &pl.refs[size_t(u.tile)];
      a.keys = st.keys.data(), a.masks = st.masks.data(), a.res_keys = st.res_keys.data();
      ks.run_bwd_tile(a);
    }
    bool ok = nonfinite == 0;
    if (S == 1) {  // the group's dK / dV: its accumulator where its tiles keep keys, 0 elsewhere
      for (int64_t j = 0; j < Lk; ++j) {
        const bool in = j >= sl.key0 && j < sl.key0 + nk;
        ok &= store_row(dk, b, j, hk, in ? a.gk + (j - sl.key0) * DP : nullptr, D);
        ok &= store_row(dv, b, j, hk, in ? a.gv + (j - sl.key0) * DVP : nullptr, Dv);
      }
    }
    if (!ok) bad[size_t(g)].store(true, std::memory_order_relaxed);
  };

  // A split group's dK / dV rows [j0, j1): its slices' partials, added in slice order.
  auto reduce = [&](int64_t i) {
    const int64_t per_g = (Lk + kReduceRows - 1) / kReduceRows, g = i / per_g, b = g / HK, hk = g % HK;
    if (bad[size_t(g)].load(std::memory_order_relaxed)) return;
    float* row = scratch_buffer().ptr;
    const int64_t j0 = (i % per_g) * kReduceRows, j1 = std::min(Lk, j0 + kReduceRows);
    bool ok = true;
    for (int64_t j = j0; j < j1; ++j) {
      std::fill(row, row + DP + DVP, 0.f);
      bool any = false;
      for (int s = 0; s < S; ++s) {
        const Slice& sl = slices[size_t(hk * S + s)];
        if (j < sl.key0 || j >= sl.key0 + sl.nkeys) continue;
        const float* pk = partials.ptr + b * partial_per_b + sl.partial + (j - sl.key0) * DP;
        const float* pv = partials.ptr + b * partial_per_b + sl.partial + int64_t(sl.nkeys) * DP + (j - sl.key0) * DVP;
        for (int64_t c = 0; c < D; ++c) row[c] += pk[c];
        for (int64_t c = 0; c < Dv; ++c) row[DP + c] += pv[c];
        any = true;
      }
      ok &= store_row(dk, b, j, hk, any ? row : nullptr, D);
      ok &= store_row(dv, b, j, hk, any ? row + DP : nullptr, Dv);
    }
    if (!ok) bad[size_t(g)].store(true, std::memory_order_relaxed);
  };

  // fp64 dQ rows from the fp32 ones, tokens [l0, l0 + kPackRows) of a batch element.
  auto convert_dq = [&](int64_t i) {
    const int64_t per_b = (Lq + kPackRows - 1) / kPackRows, b = i / per_b, l0 = (i % per_b) * kPackRows;
    for (int64_t l = l0; l < std::min(Lq, l0 + kPackRows); ++l)
      for (int64_t h = 0; h < H; ++h) store_row(dq, b, l, h, dqp + b * dq_sb + l * dq_ld + h * dq_sh, D);
  };

  run_phases(nthreads, kv_tasks + q_tasks, int64_t(tasks.size()), reduce_tasks + dq_tasks, std::max(sfloats, 2 * DVP), pack,
             [&](int64_t i) { run_task(tasks[size_t(i)]); },
             [&](int64_t i) { i < reduce_tasks ? reduce(i) : convert_dq(i - reduce_tasks); });

  std::vector<int64_t> exact;
  for (int64_t g = 0; g < G; ++g)
    if (bad[size_t(g)].load(std::memory_order_relaxed)) exact.push_back(g);
  if (!exact.empty()) exact_backward(im.patterns, p, q, k, v, dout, dq, dk, dv, threads, exact);
  stats.exact_groups = int64_t(exact.size());
  return stats;
}

}  // namespace spattn::cpu
