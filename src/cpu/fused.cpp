// cpu/fused.cpp — the fused CPU sparse attention: planning, input preparation, threads, ISA dispatch.
//
// Plan (once per pattern and shape). Query rows are cut into tiles of M rows (M = 32 with AVX-512). For a
// tile, the rows' key runs (BoundPattern::row, O(runs)) become coverage events; a sweep gives key segments
// with the number c of tile rows that keep them. Segments kept by at least kDenseShare of the rows are
// "dense": all rows of the tile visit them through small GEMMs (QK^T, PV) in blocks of NB keys — full blocks
// with no mask, the rest with one uint32 row mask per key. The others are "residue": each row visits its own
// keys there, W at a time (gathered dot products), continuing the same online softmax. A band (local,
// longformer, causal, bigbird, fixed) is almost all dense; random is all residue; neighborhood is a mix.
//
// Dilated / strided rows (every run strided by a common d) are planned in d residue groups: token t sits in
// group t % d at position t / d, so dilated(w, d) is local(w) inside each group and its tiles are dense. The
// kernels read rows through index lists, so nothing is permuted in memory.
//
// Run. Work items are (batch, head, tile), ordered by predicted cost (a global row is ~16x a local one),
// taken dynamically by the threads. Inputs that are fp32 with unit inner stride and rows of a whole number
// of vectors are read in place; the rest are converted / padded once per call.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <numeric>
#include <sstream>
#include <thread>
#include <type_traits>
#include <utility>

#include <stdlib.h>
#ifdef SPATTN_FUSED_PROF
#include <sched.h>

#include <cstdio>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "cpu/fused_kernel.hpp"
#include "common/parallel.hpp"
#include "cpu/fused_internal.hpp"
#include "cpu/fused_plan.hpp"
#include "cpu/softmax_row.hpp"
#include "plan/analysis.hpp"
#include "plan/kernels.hpp"

namespace spattn::cpu {

using common::parallel_for;

namespace fused {
namespace {

// A segment goes dense when at least this share of the tile's rows keep it. Per useful score, a row-mask
// dense block costs M / c units and a residue key about kResidueCost units (gather + transpose-add), so
// dense wins when c / M > 1 / kResidueCost.
constexpr double kResidueCost = 2.5;
constexpr double kDenseShare = 1.0 / kResidueCost;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

const KernelSet* kernel_set(Isa isa) {
  switch (isa) {
    case Isa::avx512: return &avx512::kernels();
    case Isa::avx2: return &avx2::kernels();
    case Isa::generic: return &generic::kernels();
    case Isa::automatic: break;
  }
  return nullptr;
}

bool cpu_has(Isa isa) {
  if (isa == Isa::generic) return true;
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (isa == Isa::avx512)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
  if (isa == Isa::avx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  return false;
}

// What one build task makes: tiles with their blocks and residue rows, offsets local to the part.
struct PlanPart {
  std::vector<TileInfo> tiles;
  std::vector<KeyBlock> blocks;
  std::vector<int64_t> res_off;
  std::vector<int32_t> res_cnt;
  KeyStore store;
  int64_t dense_scores = 0, masked_scores = 0, residue_nnz = 0, residue_runs = 0;
};

// Plan space: with d > 1, group g = t % d holds tokens g, g + d, ...; key plan position g * gk + t / d.
struct Space {
  int64_t d, lq, lk, gk;
  int64_t key_token(int64_t p) const { return d == 1 ? p : (p / gk) + (p % gk) * d; }
  int64_t key_pos(int64_t t) const { return d == 1 ? t : (t % d) * gk + t / d; }
};

struct Interval {
  int64_t a, b;
};

// Builds tiles into a PlanPart (local offsets).
class TileBuilder {
 public:
  // scattered: take the shortcut for tiles of scattered rows (scattered_tile); false: the sweep for every tile
  // (tests check that both give one plan).
  TileBuilder(const BoundPattern& pat, const Space& sp, int M, int NB, int W, bool scattered)
      : pat_(pat), sp_(sp), M_(M), NB_(NB), W_(W), scattered_(scattered) {}

  // tiles_left: this tile and those the task builds after it (scattered_tile's reservation).
  void build(const int32_t* q, int rows, int64_t q_off, int64_t tiles_left, PlanPart& out) {
    // Row intervals in plan space (each row's sorted by start; they never overlap: a row has no key twice).
    if (row_iv_.size() < size_t(rows)) row_iv_.resize(size_t(rows)), row_nnz_.resize(size_t(rows));
    int64_t nint = 0, nnz = 0;
    for (int r = 0; r < rows; ++r) {
      pat_.row(q[r], runs_);
      auto& iv = row_iv_[size_t(r)];
      int64_t n = 0;
      // Rows of intervals without a permutation (most): the runs are the intervals, in order.
      bool plain = sp_.d == 1;
      if (plain) {
        iv.resize(runs_.size());
        for (size_t i = 0; i < runs_.size() && plain; ++i) {
          const Run& run = runs_[i];
          plain = run.stride == 1;
          iv[i] = {run.start, run.start + run.count};
          n += run.count;
        }
      }
      if (!plain) {
        iv.clear();
        for (const Run& run : runs_) add_run(run, iv);
        if (!std::is_sorted(iv.begin(), iv.end(), [](const Interval& x, const Interval& y) { return x.a < y.a; }))
          std::sort(iv.begin(), iv.end(), [](const Interval& x, const Interval& y) { return x.a < y.a; });
        n = 0;
        for (const Interval& x : iv) n += x.b - x.a;
      }
      row_nnz_[size_t(r)] = n;
      nint += int64_t(iv.size());
      nnz += n;
    }
    if (scattered_ && scattered_tile(rows, q_off, nint, nnz, tiles_left, out)) return;
    events_.clear();
    for (int r = 0; r < rows; ++r)
      for (const Interval& x : row_iv_[size_t(r)]) {
        events_.push_back({x.a, +1});
        events_.push_back({x.b, -1});
      }
    std::sort(events_.begin(), events_.end(), [](const Ev& x, const Ev& y) { return x.pos < y.pos; });
    // Sweep: segments with their coverage.
    full_.clear();
    partial_.clear();
    residue_.clear();
    const int dense_min = std::max(1, int(std::ceil(kDenseShare * rows)));
    // Two candidates: every covered key dense (masked where partial), or the low-coverage keys as residue.
    // Residue pays per row (whole vectors of keys, the row's setup), so a few edge keys per row (the ends of a
    // band) are cheaper dense; many (neighborhood, random) are cheaper as residue.
    int64_t covered = 0, low_keys = 0;
    double low_nnz = 0;
    {
      int c = 0;
      for (size_t i = 0; i < events_.size();) {
        const int64_t pos = events_[i].pos;
        for (; i < events_.size() && events_[i].pos == pos; ++i) c += events_[i].delta;
        if (c <= 0 || i == events_.size()) continue;
        const int64_t w = events_[i].pos - pos;
        covered += w;
        if (c < dense_min) low_keys += w, low_nnz += double(w) * c;
      }
    }
    const double all_dense = double(covered) * M_;
    const double split = double(covered - low_keys) * M_ +
                         (low_keys ? kResidueCost * (low_nnz + rows * 0.5 * W_) + rows * 2.0 * W_ : 0.0);
    const int threshold = split < all_dense ? dense_min : 1;
    int cov = 0;
    for (size_t i = 0; i < events_.size();) {
      const int64_t pos = events_[i].pos;
      for (; i < events_.size() && events_[i].pos == pos; ++i) cov += events_[i].delta;
      if (cov <= 0 || i == events_.size()) continue;
      const int64_t next = events_[i].pos;
      if (cov >= threshold) {
        auto& dst = cov == rows ? full_ : partial_;
        for (int64_t p = pos; p < next; ++p) dst.push_back(p);
      } else if (!residue_.empty() && residue_.back().b == pos) {
        residue_.back().b = next;
      } else {
        residue_.push_back({pos, next});
      }
    }
    TileInfo tile{q_off, rows, 0, int64_t(out.blocks.size()), 0, -1, 0.0};
    // Dense blocks: full keys first (no mask), then partial keys (row masks).
    emit_blocks(full_, nullptr, out);
    if (!partial_.empty()) {
      pmask_.assign(partial_.size(), 0u);
      for (int r = 0; r < rows; ++r)
        for (const Interval& x : row_iv_[size_t(r)]) {
          auto lo = std::lower_bound(partial_.begin(), partial_.end(), x.a);
          auto hi = std::lower_bound(lo, partial_.end(), x.b);
          for (auto it = lo; it != hi; ++it) pmask_[size_t(it - partial_.begin())] |= 1u << r;
        }
      emit_blocks(partial_, pmask_.data(), out);
      out.masked_scores += int64_t(partial_.size()) * M_;
    }
    tile.blk_end = int64_t(out.blocks.size());
    const int64_t dense_keys = int64_t(full_.size() + partial_.size());
    out.dense_scores += dense_keys * M_;
    // Residue keys per row (explicit: scattered keys are what this part is for).
    int64_t res_nnz = 0;
    if (!residue_.empty()) {
      tile.res = int64_t(out.res_off.size());
      for (int r = 0; r < rows; ++r) {
        const int64_t start = int64_t(out.store.res_keys.size());
        out.res_off.push_back(start);
        for (const Interval& x : row_iv_[size_t(r)]) {
          auto it = std::upper_bound(residue_.begin(), residue_.end(), x.a,
                                     [](int64_t v, const Interval& s) { return v < s.b; });
          for (; it != residue_.end() && it->a < x.b; ++it) {
            const int64_t a = std::max(x.a, it->a), b = std::min(x.b, it->b);
            if (a >= b) continue;
            ++out.residue_runs;
            for (int64_t p = a; p < b; ++p) out.store.res_keys.push_back(int32_t(sp_.key_token(p)));
          }
        }
        const int64_t n = int64_t(out.store.res_keys.size()) - start;
        out.res_cnt.push_back(int32_t(n));
        res_nnz += n;
        // Pad to whole vectors plus one (the kernel reads a chunk, and prefetches one, past a pass's end).
        while (n > 0 && int64_t(out.store.res_keys.size() - start) % W_ != 0) out.store.res_keys.push_back(out.store.res_keys.back());
        for (int i = 0; n > 0 && i < W_; ++i) out.store.res_keys.push_back(out.store.res_keys.back());
      }
    }
    out.residue_nnz += res_nnz;
    tile.cost = double(dense_keys) * M_ + kResidueCost * double(res_nnz) + 64.0 * rows;
    out.tiles.push_back(tile);
  }

 private:
  struct Ev {
    int64_t pos;
    int delta;
  };

  // Rows of short intervals (random: 820 keys in ~780 intervals) mostly make tiles that are all residue: no key
  // is kept by dense_min rows, and the split candidate beats all-dense. Such a tile's plan is known without the
  // sweep (whose event sort was most of a random plan's time): one count per key finds the tile's covered keys
  // and whether any reaches dense_min; the residue segments are then the connected parts of the union of the
  // rows' intervals, each row interval lies in one of them (one residue run), and each row's residue is its own
  // keys in order. Returns false (nothing emitted) where the tile is not all residue or its intervals are long
  // (the sweep costs O(intervals log intervals), the count O(keys)); the sweep then plans it, as it would have.
  bool scattered_tile(int rows, int64_t q_off, int64_t nint, int64_t nnz, int64_t tiles_left, PlanPart& out) {
    constexpr int64_t kMaxMeanInterval = 8;
    if (nnz == 0 || nnz > nint * kMaxMeanInterval) return false;
    const int dense_min = std::max(1, int(std::ceil(kDenseShare * rows)));
    const int64_t nkeys = sp_.d * sp_.gk;  // plan-space key positions
    if (cnt_.empty()) cnt_.assign(size_t(nkeys), 0);
    // The lists are written as the keys are counted, padded as build() pads (whole vectors plus one), and
    // dropped if the tile is not all residue.
    int64_t total = 0;
    for (int r = 0; r < rows; ++r) {
      const int64_t n = row_nnz_[size_t(r)];
      total += n > 0 ? ceil_div(n, W_) * W_ + W_ : 0;
    }
    auto& rk = out.store.res_keys;
    int64_t at0 = int64_t(rk.size());
    if (int64_t(rk.capacity()) < at0 + total) rk.reserve(size_t(std::max(at0 + total, 2 * int64_t(rk.capacity()))));
    rk.resize(size_t(at0 + total));
    int32_t* keys = rk.data();
    uint8_t* cnt = cnt_.data();
    int64_t at = at0, covered = 0;
    uint8_t cmax = 0;
    auto count_and_list = [&](auto permuted) {
      for (int r = 0; r < rows; ++r) {
        const int64_t start = at;
        for (const Interval& x : row_iv_[size_t(r)]) {
          for (int64_t p = x.a; p < x.b; ++p) {
            const uint8_t c = ++cnt[p];
            covered += c == 1;
            cmax = std::max(cmax, c);
            keys[at++] = int32_t(permuted ? sp_.key_token(p) : p);
          }
        }
        if (at > start) {
          const int64_t end = start + ceil_div(at - start, W_) * W_ + W_;
          for (const int32_t last = keys[at - 1]; at < end; ++at) keys[at] = last;
        }
      }
    };
    if (sp_.d == 1) count_and_list(std::false_type{});
    else count_and_list(std::true_type{});
    if (nkeys <= 8 * nnz) {
      std::memset(cnt, 0, size_t(nkeys));
    } else {
      for (int r = 0; r < rows; ++r)
        for (const Interval& x : row_iv_[size_t(r)]) std::memset(cnt + x.a, 0, size_t(x.b - x.a));
    }
    // The sweep's choice (build(), below) where every covered key is below dense_min: low_keys = covered,
    // low_nnz = nnz (integers, exact in a double).
    const int64_t low_keys = covered;
    const double low_nnz = double(nnz);
    const double all_dense = double(covered) * M_;
    const double split = double(covered - low_keys) * M_ +
                         (low_keys ? kResidueCost * (low_nnz + rows * 0.5 * W_) + rows * 2.0 * W_ : 0.0);
    if (cmax >= dense_min || !(split < all_dense)) {
      rk.resize(size_t(at0));  // nothing of the tile stays
      return false;
    }
    TileInfo tile{q_off, rows, 0, int64_t(out.blocks.size()), int64_t(out.blocks.size()), int64_t(out.res_off.size()), 0.0};
    for (int r = 0; r < rows; ++r) {
      const int64_t n = row_nnz_[size_t(r)];
      out.res_off.push_back(at0);
      out.res_cnt.push_back(int32_t(n));
      out.residue_runs += int64_t(row_iv_[size_t(r)].size());
      at0 += n > 0 ? ceil_div(n, W_) * W_ + W_ : 0;
    }
    out.residue_nnz += nnz;
    tile.cost = kResidueCost * double(nnz) + 64.0 * rows;  // build()'s, with no dense key
    out.tiles.push_back(tile);
    // The task's first such tile reserves room for the rest at its rate (growing by doubling, the lists were
    // copied and their pages touched about twice).
    if (!reserved_) rk.reserve(size_t(at0 + (total + total / 32) * (tiles_left - 1))), reserved_ = true;
    return true;
  }

  void add_run(const Run& run, std::vector<Interval>& iv) const {
    const int64_t d = sp_.d;
    if (d == 1 && run.stride == 1) {
      iv.push_back({run.start, run.start + run.count});
    } else if (d > 1 && run.stride % d == 0) {
      const int64_t base = sp_.key_pos(run.start), s = run.stride / d;
      if (s == 1) {
        iv.push_back({base, base + run.count});
      } else {
        for (int64_t i = 0; i < run.count; ++i) iv.push_back({base + i * s, base + i * s + 1});
      }
    } else {
      for (int64_t i = 0; i < run.count; ++i) {
        const int64_t p = sp_.key_pos(run.start + i * run.stride);
        if (!iv.empty() && iv.back().b == p) iv.back().b = p + 1;
        else iv.push_back({p, p + 1});
      }
    }
  }

  // Cuts `pos` into blocks of at most NB keys (sizes as even as possible).
  void emit_blocks(const std::vector<int64_t>& pos, const uint32_t* mask, PlanPart& out) const {
    const int64_t n = int64_t(pos.size());
    if (n == 0) return;
    const int64_t nblk = ceil_div(n, NB_);
    const int64_t per = ceil_div(n, nblk);
    for (int64_t i = 0; i < n; i += per) {
      const int64_t cnt = std::min(per, n - i);
      KeyBlock b{int32_t(cnt), -1, int64_t(out.store.keys.size())};
      for (int64_t j = 0; j < cnt; ++j) out.store.keys.push_back(int32_t(sp_.key_token(pos[size_t(i + j)])));
      if (mask) {
        b.mask = int32_t(out.store.masks.size());
        out.store.masks.insert(out.store.masks.end(), mask + i, mask + i + cnt);
      }
      out.blocks.push_back(b);
    }
  }

  const BoundPattern& pat_;
  Space sp_;
  int M_, NB_, W_;
  bool scattered_, reserved_ = false;
  RowRuns runs_;
  std::vector<int64_t> row_nnz_;
  std::vector<uint8_t> cnt_;  // [plan-space keys] tile rows keeping each key (scattered_tile), zero between tiles
  std::vector<std::vector<Interval>> row_iv_;
  std::vector<Ev> events_;
  std::vector<int64_t> full_, partial_;
  std::vector<Interval> residue_;
  std::vector<uint32_t> pmask_;
};

// Keys per residue pass: the K + V rows of one pass about 768 KiB (of a 1 MiB L2); 0: one pass. Measured
// (random(205), L = 4096, D = 64, one core): 256 KiB 42 ms, 512 KiB 33-36 ms, 768 KiB 29-33 ms, 1 MiB 33 ms,
// no passes 35 ms.
int32_t choose_key_pass(int64_t lk, int64_t row_floats) {
  const int64_t pass = std::max<int64_t>(256, (int64_t(768) << 10) / (row_floats * 4));
  return lk > pass * 3 / 2 ? int32_t(pass) : 0;
}

// A neighborhood grid of 2 or 3 axes (analysis.grid) runs boxes of M tokens as query tiles (plan/tile_map.hpp: the
// box whose windows cover the fewest keys per query, key "boxes" of one key) instead of runs of consecutive tokens:
// for a 13 x 13 window and M = 32, the union of a tile's keys goes from 13 x 44 = 572 (1 x 32) to 16 x 20 = 320
// (4 x 8). Dilation groups are boxed apart, so a box's queries share their windows' lattice.
PatternPlan build_pattern_plan(const BoundPattern& pat, const plan::Analysis& an, const KernelSet& ks,
                               int64_t row_floats, int threads, int& perm_out) {
  const int64_t lq = pat.q_len(), lk = pat.k_len();
  const int M = ks.tile_rows;
  const int d = lk > 0 && lq > 0 ? an.permutation(plan::kMaxCpuPermutation) : 1;
  perm_out = d;
  const Space sp{d, lq, lk, ceil_div(lk, d)};
  // Query order: group by residue, tiles of M rows inside a group (or grid boxes).
  std::vector<int32_t> qidx;
  std::vector<std::pair<int64_t, int32_t>> tile_rows;  // (q_off, rows)
  qidx.reserve(size_t(lq));
  plan::BoxChoice box;
  if (lq > 0 && lk > 0 && an.grid && plan::grid_axes_used(*an.grid) >= 2) box = plan::best_boxes(*an.grid, M, 1, 1.0);
  std::string boxes;
  if (box.ok) {
    const plan::GridTiling tiling = plan::GridTiling::of(*an.grid, box.q);
    boxes = tiling.describe();
    const std::vector<int32_t> map = tiling.map();
    for (size_t p0 = 0; p0 < map.size(); p0 += size_t(M)) {  // a box's tokens, padding dropped
      const int64_t start = int64_t(qidx.size());
      for (size_t p = p0; p < p0 + size_t(M); ++p)
        if (map[p] >= 0) qidx.push_back(map[p]);
      tile_rows.push_back({start, int32_t(int64_t(qidx.size()) - start)});  // every box holds a token
    }
  }
  for (int64_t g = 0; g < d && !box.ok; ++g) {
    const int64_t start = int64_t(qidx.size());
    for (int64_t t = g; t < lq; t += d) qidx.push_back(int32_t(t));
    const int64_t n = int64_t(qidx.size()) - start;
    for (int64_t i = 0; i < n; i += M) tile_rows.push_back({start + i, int32_t(std::min<int64_t>(M, n - i))});
  }
  const int64_t ntiles = int64_t(tile_rows.size());
  // Work items: groups of kMaxGroup consecutive tiles. Residue-heavy plans need them for the key passes; for
  // all, the kernel prefetches the next tile's Q rows during this tile's blocks (Q is read once: without it,
  // loading Q was 13% of sparse_fixed(128) at L = 4096, H = 4; groups of 8 against 4 fewer first tiles with a
  // cold Q).
  const int g = kMaxGroup;
  const int64_t ngroups = ceil_div(ntiles, g);
  // Build in runs of whole groups, one part per run (a group's tiles share one KeyStore), then concatenate the
  // small arrays; the parts' key stores stay where they are.
  const int64_t nparts = std::min<int64_t>(ngroups, int64_t(threads) * 4);
  std::vector<PlanPart> parts(size_t(std::max<int64_t>(nparts, 1)));
  const bool scattered = !plan::general_paths_only();
  parallel_for(nparts, threads, [&](int64_t c, int) {
    TileBuilder tb(pat, sp, M, ks.block_keys, ks.width, scattered);
    const int64_t t0 = c * ngroups / nparts * g, t1 = std::min(ntiles, (c + 1) * ngroups / nparts * g);
    for (int64_t t = t0; t < t1; ++t)
      tb.build(qidx.data() + tile_rows[size_t(t)].first, tile_rows[size_t(t)].second, tile_rows[size_t(t)].first,
               t1 - t, parts[size_t(c)]);
  });
  PatternPlan plan;
  plan.qidx = std::move(qidx);
  int64_t nmasks = 0;
  for (PlanPart& p : parts) {
    const int64_t blk0 = int64_t(plan.blocks.size()), roff0 = int64_t(plan.res_off.size());
    const int32_t store = int32_t(plan.stores.size());
    for (TileInfo t : p.tiles) {
      t.store = store;
      t.blk_begin += blk0;
      t.blk_end += blk0;
      if (t.res >= 0) t.res += roff0;
      plan.tiles.push_back(t);
    }
    plan.blocks.insert(plan.blocks.end(), p.blocks.begin(), p.blocks.end());
    plan.res_off.insert(plan.res_off.end(), p.res_off.begin(), p.res_off.end());
    plan.res_cnt.insert(plan.res_cnt.end(), p.res_cnt.begin(), p.res_cnt.end());
    nmasks += int64_t(p.store.masks.size());
    plan.stores.push_back(std::move(p.store));
    plan.residue_runs += p.residue_runs;
    plan.dense_scores += p.dense_scores;
    plan.masked_scores += p.masked_scores;
    plan.residue_nnz += p.residue_nnz;
  }
  if (nmasks > int64_t(std::numeric_limits<int32_t>::max()))
    throw Error("pattern '" + pat.spec() + "' needs too many row masks for the fused CPU plan");
  plan.perm = d;
  if (box.ok) plan.boxes = boxes, plan.tile_box = box.q;
  plan.residue_heavy = kResidueCost * double(plan.residue_nnz) > double(plan.dense_scores);
  for (int64_t t = 0; t < ntiles; t += g) plan.group.push_back(int32_t(t));
  plan.group.push_back(int32_t(ntiles));
  if (g > 1) plan.key_pass = choose_key_pass(lk, row_floats);
  if (plan.key_pass > 0) {
    const int32_t W = ks.width;
    plan.npass = int32_t(ceil_div(lk, plan.key_pass));
    int64_t npass_ends = 0;
    for (const TileInfo& t : plan.tiles) {
      plan.res_pass_off.push_back(t.res < 0 ? -1 : npass_ends);
      if (t.res >= 0) npass_ends += int64_t(t.rows) * plan.npass;
    }
    plan.res_pass.resize(size_t(npass_ends));
    // Each residue row's pass ends, tiles in parallel (a scan of every residue key).
    parallel_for(ngroups, threads, [&](int64_t gi, int) {
      for (int64_t ti = gi * g; ti < std::min(ntiles, (gi + 1) * g); ++ti) {
        const TileInfo& t = plan.tiles[size_t(ti)];
        if (t.res < 0) continue;
        int32_t* out = plan.res_pass.data() + plan.res_pass_off[size_t(ti)];
        for (int r = 0; r < t.rows; ++r) {
          const int32_t* keys = plan.stores[size_t(t.store)].res_keys.data() + plan.res_off[size_t(t.res + r)];
          const int32_t n = plan.res_cnt[size_t(t.res + r)];
          // A pass ends at the multiple of the vector width nearest to its bound, so every pass but the row's
          // last visits whole chunks (a partial chunk pays the whole chunk's dot products); a few keys per row
          // and pass are visited one pass early or late.
          int32_t e = 0, prev = 0;
          for (int32_t p = 0; p < plan.npass; ++p) {
            const int64_t bound = int64_t(p + 1) * plan.key_pass;
            if (d == 1) e = int32_t(std::lower_bound(keys + e, keys + n, bound) - keys);  // ascending: a search
            else while (e < n && keys[e] < bound) ++e;
            const int32_t end = p + 1 == plan.npass ? n : std::clamp((e + W / 2) / W * W, prev, n);
            *out++ = end;
            prev = end;
          }
        }
      }
    });
  }
  for (size_t i = 0; i < plan.tiles.size(); ++i) {
    const TileInfo& t = plan.tiles[i];
    const bool passes = plan.key_pass > 0 && plan.res_pass_off[i] >= 0;
    plan.refs.push_back(TileRef{plan.qidx.data() + t.q_off, t.rows, plan.blocks.data() + t.blk_begin, t.blk_end - t.blk_begin,
                                t.res >= 0 ? plan.res_off.data() + t.res : nullptr,
                                t.res >= 0 ? plan.res_cnt.data() + t.res : nullptr,
                                passes ? plan.res_pass.data() + plan.res_pass_off[i] : nullptr});
  }
  return plan;
}

// fp32 copy of a [B, L, H, D] view: rows of `ld` floats at dst + ((b * H + h) * L + l) * ld (head_major) or
// dst + ((b * L + l) * H + h) * ld, the D values then zeros up to `width`.
void pack_f32(const TensorView& t, float* dst, bool head_major, int64_t ld, int64_t width, int threads) {
  const int64_t B = t.shape[0], L = t.shape[1], H = t.shape[2];
  parallel_for(B * H, threads, [&](int64_t bh, int) {
    const int64_t b = bh / H, h = bh % H;
    for (int64_t l = 0; l < L; ++l)
      convert_row(t, b, l, h, head_major ? dst + ((b * H + h) * L + l) * ld : dst + ((b * L + l) * H + h) * ld, width);
  });
}

// Per calling thread, the packed K/V of the last call's size (reused by the next call).
AlignedFloats& kv_pack_buffer() {
  thread_local AlignedFloats buf{{}, 0, nullptr, true};
  return buf;
}

// Row t of (b, h) in fp64 from its keys, written to o (and lse): the rows the kernel hands back (TileArgs::redo).
void exact_row(const BoundPattern& pat, const Problem& p, const TensorView& q, const TensorView& k,
               const TensorView& v, const TensorView& o, const TensorView& lse, int64_t b, int64_t h, int64_t t) {
  thread_local std::vector<int64_t> keys;
  thread_local std::vector<double> s, qrow, acc;
  const int64_t D = p.head_dim, Dv = p.dv(), hk = h / (p.q_heads / p.kv_heads);
  const double scale = p.softmax_scale();
  pat.row_keys(t, keys);
  qrow.resize(size_t(D));
  for (int64_t d = 0; d < D; ++d) qrow[size_t(d)] = q.load(b, t, h, d);
  s.resize(keys.size());
  for (size_t j = 0; j < keys.size(); ++j) {
    double dot = 0;
    for (int64_t d = 0; d < D; ++d) dot += qrow[size_t(d)] * k.load(b, keys[j], hk, d);
    s[j] = dot * scale;
  }
  const double l = softmax_row(s);
  acc.assign(size_t(Dv), 0.0);
  for (size_t j = 0; j < keys.size(); ++j)
    for (int64_t d = 0; d < Dv; ++d) acc[size_t(d)] += s[j] * v.load(b, keys[j], hk, d);
  for (int64_t d = 0; d < Dv; ++d) o.store(b, t, h, d, acc[size_t(d)]);
  if (lse.data) lse.store(b, h, t, 0, l);
}

}  // namespace

int resolve_threads(int threads) {
  if (threads > 0) return threads;
  if (threads < 0) throw Error("threads must be >= 0 (0: all hardware threads), got " + std::to_string(threads));
  return common::hardware_threads();
}

void convert_row(const TensorView& t, int64_t b, int64_t l, int64_t h, float* out, int64_t width) {
  const int64_t D = t.shape[3];
  const int64_t off = t.offset(b, l, h, 0);
  const int64_t inc = t.stride[3];
  switch (t.dtype) {
    case DType::f32: {
      const float* s = static_cast<const float*>(t.data) + off;
      if (inc == 1) std::memcpy(out, s, size_t(D) * sizeof(float));
      else for (int64_t d = 0; d < D; ++d) out[d] = s[d * inc];
      break;
    }
    case DType::f64: {
      const double* s = static_cast<const double*>(t.data) + off;
      for (int64_t d = 0; d < D; ++d) out[d] = float(s[d * inc]);
      break;
    }
    case DType::f16: {
      const uint16_t* s = static_cast<const uint16_t*>(t.data) + off;
      for (int64_t d = 0; d < D; ++d) out[d] = half_to_float(s[d * inc]);
      break;
    }
    case DType::bf16: {
      const uint16_t* s = static_cast<const uint16_t*>(t.data) + off;
      for (int64_t d = 0; d < D; ++d) out[d] = bf16_to_float(s[d * inc]);
      break;
    }
  }
  for (int64_t d = D; d < width; ++d) out[d] = 0.f;
}

void pack_kv_rows(const TensorView& k, const TensorView& v, float* dst, int64_t DP, int64_t DVP, int64_t b,
                  int64_t l0, int64_t l1) {
  const int64_t HK = k.shape[2], Lk = k.shape[1], ld = DP + DVP;
  for (int64_t l = l0; l < l1; ++l)
    for (int64_t h = 0; h < HK; ++h) {
      float* row = dst + ((b * HK + h) * Lk + l) * ld;
      convert_row(k, b, l, h, row, DP);
      convert_row(v, b, l, h, row + DP, DVP);
    }
}

AlignedFloats& scratch_buffer() {
  thread_local AlignedFloats buf;
  return buf;
}

}  // namespace fused

// ---- public API ---------------------------------------------------------------------------------------------
const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::automatic: return "auto";
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    case Isa::generic: return "generic";
  }
  return "?";
}

Isa best_isa() {
  if (fused::cpu_has(Isa::avx512) && fused::avx512::kernels().run_tile) return Isa::avx512;
  if (fused::cpu_has(Isa::avx2) && fused::avx2::kernels().run_tile) return Isa::avx2;
  return Isa::generic;
}

FusedPlan::FusedPlan(const std::vector<BoundPattern>& patterns, const Problem& problem, const Options& options,
                     const std::vector<plan::Analysis>& analyses)
    : impl_(std::make_unique<Impl>()) {
  const auto t0 = std::chrono::steady_clock::now();
  problem.validate();
  const int64_t H = problem.q_heads;
  if (patterns.size() != 1 && int64_t(patterns.size()) != H)
    throw Error("expected 1 pattern or one per query head (" + std::to_string(H) + "), got " +
                std::to_string(patterns.size()));
  if (!analyses.empty() && analyses.size() != patterns.size())
    throw Error("expected one analysis per pattern (" + std::to_string(patterns.size()) + "), got " +
                std::to_string(analyses.size()));
  for (const BoundPattern& bp : patterns)
    if (bp.q_len() != problem.q_len || bp.k_len() != problem.kv_len)
      throw Error("pattern '" + bp.spec() + "' is bound to " + std::to_string(bp.q_len()) + " x " +
                  std::to_string(bp.k_len()) + " but the problem is " + std::to_string(problem.q_len) + " x " +
                  std::to_string(problem.kv_len));
  if (problem.q_len > std::numeric_limits<int32_t>::max() || problem.kv_len > std::numeric_limits<int32_t>::max())
    throw Error("the fused CPU attention supports lengths below 2^31, got " + std::to_string(problem.q_len) +
                " x " + std::to_string(problem.kv_len));
  Impl& im = *impl_;
  im.problem = problem;
  im.patterns = patterns;
  const Isa isa = options.isa == Isa::automatic ? best_isa() : options.isa;
  if (!fused::cpu_has(isa) || !fused::kernel_set(isa)->run_tile)
    throw Error(std::string("this CPU (or build) has no ") + isa_name(isa) + " support for the fused CPU attention");
  im.ks = fused::kernel_set(isa);
  const int threads = fused::resolve_threads(options.threads);
  // One plan per distinct spec.
  std::vector<std::string> specs;
  im.plan_of_head.assign(size_t(H), 0);
  for (int64_t h = 0; h < H; ++h) {
    const size_t pi = patterns.size() == 1 ? 0 : size_t(h);
    const BoundPattern& bp = patterns[pi];
    auto it = std::find(specs.begin(), specs.end(), bp.spec());
    if (it == specs.end()) {
      specs.push_back(bp.spec());
      int perm = 1;
      const int64_t W = im.ks->width;
      const int64_t row_floats = (problem.head_dim + W - 1) / W * W + (problem.dv() + W - 1) / W * W;
      const plan::Analysis an = analyses.empty() ? plan::analyze(bp) : analyses[pi];
      im.plans.push_back(fused::build_pattern_plan(bp, an, *im.ks, row_floats, threads, perm));
      im.stats.permutation = std::max(im.stats.permutation, perm);
      im.stats.nnz += an.nnz;
      it = specs.end() - 1;
    }
    im.plan_of_head[size_t(h)] = int(it - specs.begin());
  }
  for (size_t p = 0; p < im.plans.size(); ++p) {
    const auto& pl = im.plans[p];
    im.stats.tiles += int64_t(pl.tiles.size());
    im.stats.dense_scores += pl.dense_scores;
    im.stats.masked_scores += pl.masked_scores;
    im.stats.residue_nnz += pl.residue_nnz;
    if (!pl.boxes.empty()) im.stats.boxes = pl.boxes, im.stats.tile_box = pl.tile_box;
  }
  {
    struct Keyed {
      int bucket;
      Impl::Item item;
    };
    std::vector<Keyed> all;
    for (int64_t bh = 0; bh < problem.batch * H; ++bh) {
      const int p = im.plan_of_head[size_t(bh % H)];
      const auto& pl = im.plans[size_t(p)];
      for (size_t g = 0; g + 1 < pl.group.size(); ++g) {
        double cost = 0;
        for (int32_t t = pl.group[g]; t < pl.group[g + 1]; ++t) cost += pl.tiles[size_t(t)].cost;
        all.push_back({int(std::floor(2.0 * std::log2(std::max(1.0, cost)))), {int32_t(bh), int32_t(p), int32_t(g)}});
      }
    }
    std::stable_sort(all.begin(), all.end(), [](const Keyed& a, const Keyed& b) { return a.bucket > b.bucket; });
    im.items.reserve(all.size());
    for (const Keyed& k : all) im.items.push_back(k.item);
  }
  im.stats.tile_rows = im.ks->tile_rows;
  im.stats.isa = im.ks->name;
  im.stats.build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

FusedPlan::~FusedPlan() = default;
FusedPlan::FusedPlan(FusedPlan&&) noexcept = default;
FusedPlan& FusedPlan::operator=(FusedPlan&&) noexcept = default;

const Problem& FusedPlan::problem() const { return impl_->problem; }
const PlanStats& FusedPlan::stats() const { return impl_->stats; }

std::string FusedPlan::describe() const {
  const PlanStats& s = impl_->stats;
  std::ostringstream os;
  const double nnz = double(std::max<int64_t>(s.nnz, 1));
  os << "fused cpu plan: isa " << s.isa << ", " << s.tiles << " tiles of " << s.tile_rows << " rows";
  if (s.permutation > 1) os << ", residue groups d=" << s.permutation;
  if (!s.boxes.empty()) os << " (" << s.boxes << ")";
  os << "; dense scores " << s.dense_scores << " (" << s.masked_scores << " masked), residue " << s.residue_nnz
     << "; computed/nnz " << double(s.dense_scores + s.residue_nnz) / nnz << "; built in " << s.build_ms << " ms";
  return os.str();
}

uint64_t FusedPlan::fingerprint() const {
  const Impl& im = *impl_;
  uint64_t h = 0x9E3779B97F4A7C15ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 0x100000001B3ull + (h >> 29); };
  auto mixd = [&](double v) {
    uint64_t u;
    std::memcpy(&u, &v, sizeof u);
    mix(u);
  };
  const int64_t W = im.ks->width;
  mix(uint64_t(im.plans.size()));
  for (const fused::PatternPlan& pl : im.plans) {
    mix(uint64_t(pl.refs.size()));
    for (size_t t = 0; t < pl.refs.size(); ++t) {
      const fused::TileRef& r = pl.refs[t];
      const fused::KeyStore& st = pl.stores[size_t(pl.tiles[t].store)];
      mix(uint64_t(r.rows));
      for (int i = 0; i < r.rows; ++i) mix(uint64_t(r.qidx[i]));
      mix(uint64_t(r.nblocks));
      for (int64_t b = 0; b < r.nblocks; ++b) {
        const fused::KeyBlock& kb = r.blocks[b];
        mix(uint64_t(kb.n));
        mix(kb.mask < 0 ? 0 : 1);
        for (int32_t j = 0; j < kb.n; ++j) {
          mix(uint64_t(st.keys[size_t(kb.keys + j)]));
          if (kb.mask >= 0) mix(st.masks[size_t(kb.mask + j)]);
        }
      }
      mix(r.res_off ? 1 : 0);
      if (r.res_off) {
        for (int i = 0; i < r.rows; ++i) {
          const int32_t n = r.res_cnt[i];
          mix(uint64_t(n));
          const int64_t padded = n > 0 ? (n + W - 1) / W * W + W : 0;
          for (int64_t j = 0; j < padded; ++j) mix(uint64_t(st.res_keys[size_t(r.res_off[i] + j)]));
        }
      }
      mix(r.res_pass ? 1 : 0);
      if (r.res_pass)
        for (int64_t i = 0; i < int64_t(r.rows) * pl.npass; ++i) mix(uint64_t(r.res_pass[i]));
      mixd(pl.tiles[t].cost);
    }
    for (int32_t g : pl.group) mix(uint64_t(g));
    mix(uint64_t(pl.key_pass));
    mix(uint64_t(pl.npass));
    mix(uint64_t(pl.residue_runs));
    mix(pl.residue_heavy);
  }
  for (int p : im.plan_of_head) mix(uint64_t(p));
  for (const Impl::Item& it : im.items) mix(uint64_t(it.bh) << 40 ^ uint64_t(it.plan) << 20 ^ uint64_t(it.group));
  const PlanStats& s = im.stats;
  for (int64_t v : {s.tiles, int64_t(s.tile_rows), int64_t(s.permutation), int64_t(s.tile_box.side[0]),
                    int64_t(s.tile_box.side[1]), int64_t(s.tile_box.side[2]), s.nnz, s.dense_scores, s.masked_scores,
                    s.residue_nnz})
    mix(uint64_t(v));
  return h;
}

void FusedPlan::run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                    const TensorView& lse, const Options& options) const {
  const Impl& im = *impl_;
  const Problem& p = im.problem;
  const int64_t B = p.batch, Lq = p.q_len, Lk = p.kv_len, H = p.q_heads, HK = p.kv_heads, D = p.head_dim, Dv = p.dv();
  Problem::check_view(q, "q", {B, Lq, H, D});
  Problem::check_view(k, "k", {B, Lk, HK, D});
  Problem::check_view(v, "v", {B, Lk, HK, Dv});
  Problem::check_view(o, "o", {B, Lq, H, Dv});
  if (o.dtype != DType::f32) throw Error(std::string("fused CPU attention writes fp32 output; o is ") + std::string(dtype_name(o.dtype)));
  if (lse.data) {
    Problem::check_view(lse, "lse", {B, H, Lq, 1});
    if (lse.dtype != DType::f32) throw Error(std::string("fused CPU attention writes fp32 lse; lse is ") + std::string(dtype_name(lse.dtype)));
  }
  if (q.dtype != k.dtype || q.dtype != v.dtype)
    throw Error(std::string("q, k and v must have one dtype; got ") + std::string(dtype_name(q.dtype)) + ", " +
                std::string(dtype_name(k.dtype)) + ", " + std::string(dtype_name(v.dtype)));
  for (const TensorView* t : {&q, &k, &v, &o})
    if (!t->data && t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3] > 0) throw Error("a tensor view has a null data pointer");
  if (B == 0 || Lq == 0 || H == 0) return;
#ifdef SPATTN_FUSED_PROF
  const auto prof_t0 = std::chrono::steady_clock::now();
  auto prof_ms = [&] { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - prof_t0).count(); };
  double prof_beg[8] = {}, prof_end[8] = {};
  int prof_items[8] = {}, prof_cpu[8] = {};
#endif
  const int threads = fused::resolve_threads(options.threads);
  const fused::KernelSet& ks = *im.ks;
  const int64_t W = ks.width;
  const int64_t DP = (D + W - 1) / W * W, DVP = (Dv + W - 1) / W * W;

  // Inputs as fp32: in place where possible, else one converted copy.
  auto direct = [&](const TensorView& t, int64_t dim) { return t.dtype == DType::f32 && t.stride[3] == 1 && dim % W == 0; };
  fused::AlignedFloats qbuf, kbuf, vbuf;
  const float* qp = static_cast<const float*>(q.data);
  int64_t q_sb = q.stride[0], q_ld = q.stride[1], q_sh = q.stride[2], q_inc = q.stride[3];
  if (q.dtype != DType::f32) {
    qbuf.resize(B * Lq * H * D);
    fused::pack_f32(q, qbuf.ptr, false, D, D, threads);
    qp = qbuf.ptr;
    q_sb = Lq * H * D, q_ld = H * D, q_sh = D, q_inc = 1;
  }
  const float* kp = static_cast<const float*>(k.data);
  int64_t k_sb = k.stride[0], k_ld = k.stride[1], k_sh = k.stride[2];
  const float* vp = static_cast<const float*>(v.data);
  int64_t v_sb = v.stride[0], v_ld = v.stride[1], v_sh = v.stride[2];
  // Pack when the residue (per-row gathers) is a real share of the work: measured at L = 4096, H = 4,
  // D = 64 on one core, random 53 -> 38 ms and na2d 28.6 -> 23.9 ms packed; pure dense plans (local,
  // causal, fixed) only pay the copy (fixed 12.8 -> 14.3 ms): their key blocks are read in order.
  bool pack_kv = false;
  fused::AlignedFloats& kv = fused::kv_pack_buffer();
  for (const auto& pl : im.plans) pack_kv |= fused::kResidueCost * double(pl.residue_nnz) * 4 > double(pl.dense_scores);
  int64_t pack_tasks = 0;  // > 0: K/V are packed at the start of the parallel region below
  constexpr int64_t kPackRows = 128;
  if (pack_kv && Lk > 0) {
    // Scattered keys: one contiguous [Lk][DP + DVP] buffer per KV head (a key's K and V rows adjacent). In
    // the [B, L, H, D] layout a head's rows sit H * D floats apart, which maps them onto a fraction of the
    // cache sets; packed, a key pass of K/V fits L2.
    const int64_t ld = DP + DVP;
    kv.resize(B * HK * Lk * ld);
    pack_tasks = B * ((Lk + kPackRows - 1) / kPackRows);
    kp = kv.ptr, vp = kv.ptr + DP;
    k_sb = v_sb = HK * Lk * ld, k_sh = v_sh = Lk * ld, k_ld = v_ld = ld;
  } else {
    if (!direct(k, D) && Lk > 0) {
      kbuf.resize(B * HK * Lk * DP);
      fused::pack_f32(k, kbuf.ptr, true, DP, DP, threads);
      kp = kbuf.ptr;
      k_sb = HK * Lk * DP, k_sh = Lk * DP, k_ld = DP;
    }
    if (!direct(v, Dv) && Lk > 0) {
      vbuf.resize(B * HK * Lk * DVP);
      fused::pack_f32(v, vbuf.ptr, true, DVP, DVP, threads);
      vp = vbuf.ptr;
      v_sb = HK * Lk * DVP, v_sh = Lk * DVP, v_ld = DVP;
    }
  }
  const int64_t group = H / HK;
  const float qscale = float(p.softmax_scale() * 1.4426950408889634);
  const int64_t nitems = int64_t(im.items.size());
  const int nthreads = int(std::min<int64_t>(threads, std::max<int64_t>(std::max(nitems, pack_tasks), 1)));
  const int64_t sfloats = ks.scratch_floats(D, Dv);
  float* op = static_cast<float*>(o.data);
  float* lp = static_cast<float*>(lse.data);
  // Residue rows address K / V through 32-bit row offsets where they fit (SPATTN_CPU_WIDE_OFFSETS=1 forces the
  // 64-bit addressing, for tests).
  const char* wide = std::getenv("SPATTN_CPU_WIDE_OFFSETS");
  const bool res_off32 = k_ld > 0 && v_ld > 0 && Lk * std::max(k_ld, v_ld) <= std::numeric_limits<int32_t>::max() &&
                         !(wide && *wide == '1');
  std::atomic<int64_t> next_item{0};
  auto run_item = [&](int64_t i, int64_t next) {
    fused::AlignedFloats& scr = fused::scratch_buffer();
    if (scr.cap < sfloats + 16) scr.resize(sfloats);
    const Impl::Item& it = im.items[size_t(i)];
    const int64_t b = it.bh / H, h = it.bh % H, hk = h / group;
    const fused::PatternPlan& pl = im.plans[size_t(it.plan)];
    const int32_t t0 = pl.group[size_t(it.group)], t1 = pl.group[size_t(it.group) + 1];
    fused::TileArgs a{};
    a.D = D, a.Dv = Dv, a.DP = DP, a.DVP = DVP, a.qscale = qscale;
    a.q = qp + b * q_sb + h * q_sh, a.q_ld = q_ld, a.q_inc = q_inc;
    a.k = Lk > 0 ? kp + b * k_sb + hk * k_sh : nullptr, a.k_ld = k_ld;
    a.v = Lk > 0 ? vp + b * v_sb + hk * v_sh : nullptr, a.v_ld = v_ld;
    a.o = op + b * o.stride[0] + h * o.stride[2], a.o_ld = o.stride[1], a.o_inc = o.stride[3];
    a.lse = lp ? lp + b * lse.stride[0] + h * lse.stride[1] : nullptr, a.lse_inc = lse.stride[2];
    a.tiles = pl.refs.data() + t0, a.ntiles = t1 - t0;
    a.key_pass = pl.key_pass, a.npass = pl.npass;
    const fused::KeyStore& store = pl.stores[size_t(pl.tiles[size_t(t0)].store)];  // one for the group's tiles
    a.keys = store.keys.data(), a.masks = store.masks.data(), a.res_keys = store.res_keys.data();
    a.res_prefetch = pl.residue_runs * 4 > pl.residue_nnz;  // runs shorter than 4 keys on average: scattered
    a.res_off32 = res_off32;
    a.scratch = scr.ptr;
    a.next_tile = nullptr, a.next_q = nullptr;
    if (next >= 0 && next < nitems) {
      const Impl::Item& nx = im.items[size_t(next)];
      const fused::PatternPlan& npl = im.plans[size_t(nx.plan)];
      a.next_tile = npl.refs.data() + npl.group[size_t(nx.group)];
      a.next_q = qp + (nx.bh / H) * q_sb + (nx.bh % H) * q_sh;
    }
    int32_t redo[fused::kMaxGroup * 32], nredo = 0;  // tile rows <= 32 (a row mask is one uint32)
    a.redo = redo, a.nredo = &nredo;
    ks.run_tile(a);
    for (int32_t r = 0; r < nredo; ++r)
      fused::exact_row(im.patterns.size() == 1 ? im.patterns[0] : im.patterns[size_t(h)], p, q, k, v, o, lse, b, h,
                       redo[r]);
  };
  // One parallel region: the K/V pack (token ranges taken dynamically), a barrier, then the work items,
  // taken dynamically, each thread claiming its next one before running the current (so the kernel can
  // prefetch that item's first Q rows). (Packing in its own regions, K then V, head by head, took 1.1-2.4 ms
  // of a 21-26 ms call.)
  std::atomic<int64_t> next_pack{0};
  common::Barrier packed(nthreads);
  parallel_for(nthreads, nthreads, [&](int64_t, [[maybe_unused]] int t) {
    if (pack_tasks > 0) {
      const int64_t per_b = (Lk + kPackRows - 1) / kPackRows;
      for (int64_t i; (i = next_pack.fetch_add(1, std::memory_order_relaxed)) < pack_tasks;) {
        const int64_t l0 = (i % per_b) * kPackRows;
        fused::pack_kv_rows(k, v, kv.ptr, DP, DVP, i / per_b, l0, std::min(Lk, l0 + kPackRows));
      }
      packed.wait();
    }
#ifdef SPATTN_FUSED_PROF
    if (t < 8) prof_beg[t] = prof_ms(), prof_cpu[t] = sched_getcpu();
#endif
    int64_t i = next_item.fetch_add(1, std::memory_order_relaxed);
    while (i < nitems) {
      const int64_t j = next_item.fetch_add(1, std::memory_order_relaxed);
      run_item(i, j);
#ifdef SPATTN_FUSED_PROF
      if (t < 8) ++prof_items[t];
#endif
      i = j;
    }
#ifdef SPATTN_FUSED_PROF
    if (t < 8) prof_end[t] = prof_ms();
#endif
  });
#ifdef SPATTN_FUSED_PROF  // per call: each thread's CPU, item span (ms from the call's start) and item count
  std::fprintf(stderr, "fused run:");
  for (int t = 0; t < std::min(nthreads, 8); ++t) std::fprintf(stderr, " | t%d cpu%d %.2f..%.2f (%d items)", t, prof_cpu[t], prof_beg[t], prof_end[t], prof_items[t]);
  std::fprintf(stderr, " | total %.2f\n", prof_ms());
#endif
}

void attention(const std::vector<BoundPattern>& patterns, const Problem& problem, const TensorView& q,
               const TensorView& k, const TensorView& v, const TensorView& o, const TensorView& lse,
               const Options& options) {
  FusedPlan(patterns, problem, options).run(q, k, v, o, lse, options);
}

}  // namespace spattn::cpu
