// plan/analysis.hpp — what is known about a bound pattern before any backend sees it.
//
// One analysis per (pattern, lengths), computed once by make_plan and handed to every backend's tiler:
// the CPU tile builder (src/cpu/fused.cpp) and the GPU tile planner (plan/gpu/block_plan.hpp) read their
// permutation, neighborhood grid and band rows from here instead of sampling the pattern themselves.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "spattn/pattern.hpp"

namespace spattn::plan {

// Every row q keeps exactly the keys k with lo <= k - q <= hi and 0 <= k < Lk, for one pair (lo, hi) (local,
// sliding windows, causal, dense; rows past the band's reach keep nothing). lo and hi are clamped to [-Lq, Lk],
// where they stop binding, so that q + lo and q + hi fit in 32 bits.
struct BandRows {
  bool ok = false;
  int32_t lo = 0, hi = 0;
};

// Rows alike by blocks of b rows (blocked(b, inner): bigbird; BoundPattern::row_block: block_diag) by block rows: block
// row i, the rows [i b, min((i + 1) b, Lq)), keeps the keys of spans[offsets[i], offsets[i + 1]), intervals
// [first, end) in increasing order and apart (blocked: whole key blocks, the last one clipped to Lk).
struct BlockRows {
  int64_t block = 1;
  std::vector<int64_t> offsets;                     // [ceil(Lq / b) + 1]
  std::vector<std::pair<int32_t, int32_t>> spans;  // keys [first, end)
  int64_t block_rows() const { return int64_t(offsets.size()) - 1; }
  int64_t keys(int64_t i) const {  // a row's of block row i
    int64_t n = 0;
    for (int64_t s = offsets[size_t(i)]; s < offsets[size_t(i) + 1]; ++s)
      n += spans[size_t(s)].second - spans[size_t(s)].first;
    return n;
  }
};

// Tokens of [0, len) in residue group g of stride d (g, g + d, g + 2d, ...): a permuted plan's groups (BlockPlan::perm_d).
inline int64_t residue_group_len(int64_t len, int64_t g, int64_t d) { return g < len ? (len - g + d - 1) / d : 0; }

struct Analysis {
  int64_t q_len = 0, k_len = 0;
  int64_t nnz = 0;                        // kept (q, k)
  int64_t empty_rows = 0, dense_rows = 0;  // rows keeping no key, every key
  int64_t min_row = 0, max_row = 0;       // keys a row keeps
  BandRows band;                          // every row one interval on a fixed diagonal band
  // Shifted window rows, where band is not ok: every row keeps W = hi - lo + 1 keys, from clamp(q + lo, 0, Lk - W) on
  // (1-D neighborhoods: NATTEN's windows, shifted inside the keys at either end so that every row keeps W; the band
  // kernel runs them as bands with two clamps). Some row is a window [q + lo, q + hi] inside the keys.
  BandRows window;
  // Band rows with a key prefix, where band and window are not ok: every row q keeps the keys [0, prefix) and the
  // band's clipped interval (k - q in [lo, hi], 0 <= k < Lk), and some row keeps the two apart (local(w) |
  // global_cols(0:G), sliding windows with attention sinks: local(left=w, right=0) | global_cols(0:4)). The band
  // kernel runs such rows with the prefix's 64-key chunks as extra steps of every slab (BlockPlan::band_prefix).
  BandRows sinks;
  int32_t prefix = 0;  // sinks: the prefix's keys
  // Band rows inside residue groups, by the spec (BoundPattern::dilated_band: dilated(w, d), alone or intersected
  // with bands), where residue is that d: row q keeps the keys k = q + m residue with lo <= m <= hi and 0 <= k < Lk.
  // Tokens regrouped by residue (BlockPlan::perm_d), each group's rows are band rows [lo, hi]: the GPU tiler builds
  // and prices such plans in closed form. Not set by the row walk (SPATTN_PLAN_GENERAL=1).
  BandRows groups;
  // Rows alike by blocks (BoundPattern::blocked; BoundPattern::row_block: block_diag, sparse_fixed's parts) with no
  // strided run, where the walk would find no band, window or sinks rows: their block rows, drawn once, from which the
  // analysis counts and the GPU tiler prices and builds its unpermuted, unmapped plans. Not set by the row walk
  // (SPATTN_PLAN_GENERAL=1).
  std::shared_ptr<const BlockRows> blocks;
  // Residue stride: the common stride (gcd) of the multi-key runs of a few sampled rows when all of them are
  // strided (dilated(w, d): d, stride(s): s); 1 when a sampled row has a multi-key interval or none is strided.
  // Tokens regrouped by residue mod this stride make such rows dense; each tiler caps what it can use
  // (kernel table: kMaxGpuPermutation, kMaxCpuPermutation).
  int64_t residue = 1;
  // The token grid of the spec's neighborhood atoms (BoundPattern::neighborhood_grid): the tilers' multi-
  // dimensional boxes (plan/tile_map.hpp) for the GPU plan's tile map and the CPU engine's query tiles.
  std::optional<NeighborhoodGrid> grid;
  double ms = 0;                          // time to analyse

  double density() const { return q_len && k_len ? double(nnz) / (double(q_len) * double(k_len)) : 0.0; }
  double mean_row() const { return q_len ? double(nnz) / double(q_len) : 0.0; }
  // Whether a permutation by residue applies for a tiler that takes strides up to max_d.
  int permutation(int64_t max_d) const { return residue >= 2 && residue <= max_d ? int(residue) : 1; }
  std::string describe() const;
};

// Walks every row once on up to plan_thread_cap() threads: the runs of rows while they can still be band rows, the
// key count (BoundPattern::row_nnz) after that; cost follows the runs, never rows x keys, and a random atom's rows
// are counted without being drawn. Band rows by the spec (BoundPattern::band: local, causal, dense, ...) walk no row:
// the same results in closed form, O(1); band rows united with one random atom (BoundPattern::band_random: local(w) |
// random(r)) are counted by each row's r drawn keys, O(r) a row, without its runs; rows alike by blocks (blocked,
// block_diag, sparse_fixed and its parts) by one row a block, where some row fails the band and sinks checks or their
// block rows rule out band, window and sinks rows.
Analysis analyze(const BoundPattern& pattern);

// The pattern's BSR blocks at sizes 16, 32, 64 and 128: stored, full, partial, fill and a histogram of the
// partial blocks' fill (for explain; builds each BSR, so O(blocks touched + partial-block bits)).
std::string block_histogram(const BoundPattern& pattern);

// The most threads planning uses: the hardware's and 32; SPATTN_PLAN_THREADS caps it (1: serial).
int plan_thread_cap();

// SPATTN_PLAN_GENERAL=1: the analysis and the tilers skip their shortcuts for common cases (the analysis's and the GPU
// builder's band rows in closed form; rows alike by blocks by their block rows; band | random rows by their random
// keys; the CPU tiler's all-residue tiles; the GPU tiler's estimates from rows shared among the shapes, its one-pass
// bitmasks of scattered query tiles, its counts of strided runs tile by tile, its builder's intervals counted and
// marked by their end tiles and partial tiles, and the strip plan's rows from an exact neighborhood grid's windows)
// and take their general paths everywhere; the plans are the same (tests/plan_paths_test.cpp checks it).
bool general_paths_only();

}  // namespace spattn::plan
