// plan/gpu/block_plan.hpp — the tile plan of the fused block-sparse attention kernel (src/cuda/fused), and its builders
//
// For every query tile (block_m rows) the plan lists the key tiles (block_n keys) that hold at least one
// kept (q, k), each tagged:
//   full     every in-range (q, k) of the tile is kept: the kernel runs it unmasked;
//   band     kept iff lo <= kp - qp <= hi (positions in plan space): an in-kernel predicate, no memory
//            (causal and sliding-window diagonals, the edges of local bands, dilated bands after permutation);
//   bitmask  anything else: block_m x block_n bits, row-major (bit r * block_n + c is (q0 + r, k0 + c)); entries
//            with the same bits may share one (a key prefix's tiles that no row's band reaches).
//
// Plan space. With perm_d == 1 plan positions are token indices. With perm_d = d > 1 (dilated and strided
// patterns) tokens are regrouped by residue: token t sits in group g = t % d at position j = t / d, and each
// group is padded to `q_group` (`k_group`) positions, a multiple of the tile sizes, so that a tile never
// straddles two groups. dilated(w, d) becomes local(w) inside each group: every visited tile is dense
// (KERNELS.md section 1/2: permute so that affine rows become dense tiles). The kernel gathers rows through
// this map in its loads (cp.async takes one row address per 16-byte chunk anyway), so no tensor is permuted.
//
// Mapped plan space (neighborhood patterns of 2 or 3 axes, plan/tile_map.hpp): plan positions are tokens in
// tile-major order, query tiles boxes of tokens (8x16, 4x4x8, ...) and key tiles boxes too, through a general map
// (q_map / k_map: plan position -> token, -1 for padding) that the kernels gather rows through, one index a row.
// Padding may sit anywhere in a tile, so mapped plans have full and bitmask entries only (no band entries) and run
// on the cp.async and mma.sync kernels only (the TMA and band kernels load affine rows by tensor maps).
//
// Key strips (tile_map 2; 64x64 tiles, grids of at most two axes longer than 1): query tiles are the boxes of a query
// tiling as above, but each query box gets key tiles of its own: strips of its window union U (the bounding box, in
// the query's dilation group, of every key its rows keep). With U of H x W group coordinates (W <= 64 along the
// grid's last used axis), a strip holds R = 64 / W rows of U: strip t's slot r < count is the key at group
// coordinates (U.x0 + t R + r / W, U.y0 + r % W), slots past count are padding (plan/key_strips.hpp, strip_token: one
// formula for the kernels, the plan's k_map and the tests). A 20 x 20 union (8x8 box, 13x13 windows) takes 7 strips
// of 3 rows (448 slots) where 8x8 key boxes take 9 (576). Every strip entry is a bitmask.
//
// Built in O(runs + touched tiles + partial-tile bits) from BoundPattern::row(), never from contains() (mapped:
// plus O(L) for the maps).
#pragma once
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/alloc.hpp"
#include "plan/analysis.hpp"
#include "plan/kernels.hpp"
#include "plan/key_strips.hpp"
#include "plan/tile_map.hpp"
#include "spattn/pattern.hpp"

namespace spattn::plan {

struct TileEntry {
  int32_t kt;    // key tile index (plan space)
  int32_t mask;  // kFull, kBand, or the index of the tile's bitmask
  int32_t lo;    // band: kept iff lo <= kp - qp <= hi (plan-space positions)
  int32_t hi;
};
inline constexpr int32_t kFull = -1;
inline constexpr int32_t kBand = -2;

// One key tile of a strip plan (BlockPlan::strips): slot r < count holds token base + (r / width) * strip_sx +
// (r % width) * strip_sy (plan/key_strips.hpp, strip_token), slots past count are padding.
struct KeyStrip {
  int32_t base = 0;   // the token of slot 0
  int32_t width = 0;  // W: group coordinates of the last used axis a strip row holds (1 ... 64)
  int32_t count = 0;  // slots that hold tokens: rows of U in this strip x W (1 ... 64)
};

// The bitmasks' words: left uninitialised where the vector is sized without a value (resize(n)), in huge pages where
// large (a random plan's are tens of MB, written right after they are sized).
using MaskWords = std::vector<uint64_t, common::HugeUninitAllocator<uint64_t>>;

struct BlockPlan {
  int block_m = 0, block_n = 0;
  int64_t q_len = 0, k_len = 0;   // token lengths
  int perm_d = 1;                 // 1: identity; d > 1: residue groups (see above)
  int64_t q_group = 0, k_group = 0;  // padded group length in plan space (== length when perm_d == 1)
  int64_t q_tiles = 0, k_tiles = 0;  // plan-space tiles: perm_d * q_group / block_m, ...
  std::vector<int64_t> row_offsets;  // [q_tiles + 1] into entries
  std::vector<TileEntry> entries;    // per query tile, ascending kt
  MaskWords masks;                   // [nbitmask * words_per_mask()]
  std::vector<int32_t> order;        // query tiles, most work first (longest-processing-time order)
  int64_t nnz = 0;                   // kept (q, k) pairs (per head)
  // Band rows (perm_d 1 only; Analysis::band): every row q keeps exactly the keys k with
  // band_lo <= k - q <= band_hi and 0 <= k < Lk; or where band_shifted (Analysis::window: 1-D neighborhoods), the
  // W = band_hi - band_lo + 1 keys from clamp(q + band_lo, 0, Lk - W) on (windows shifted inside [0, Lk) at the
  // ends). Either way band_first(q) ... band_last(q). The sm_90a band kernel runs such plans by 64-row slabs.
  // band_prefix > 0 (Analysis::sinks: local(w) | global_cols(0:G), windows with attention sinks): every row also
  // keeps the keys [0, band_prefix); the band kernel visits the prefix's 64-key chunks (band_prefix_chunks()) in
  // every slab before its band chunks, which then start past them (each key visited once). The entries are the
  // pattern's own, as for any plan.
  bool band = false, band_shifted = false;
  int32_t band_lo = 0, band_hi = 0;
  int32_t band_prefix = 0;
  int64_t band_prefix_chunks() const { return (int64_t(band_prefix) + 63) / 64; }
  int64_t band_first(int64_t q) const {
    const int64_t f = std::max<int64_t>(0, q + band_lo);
    return band_shifted ? std::min<int64_t>(f, k_len - (int64_t(band_hi) - band_lo + 1)) : f;
  }
  int64_t band_last(int64_t q) const {
    const int64_t l = std::min<int64_t>(k_len - 1, q + band_hi);
    return band_shifted ? std::max<int64_t>(l, int64_t(band_hi) - band_lo) : l;
  }
  int64_t n_full = 0, n_band = 0, n_bitmask = 0;
  // Mapped plan space (see above; perm_d is 1, q_group / k_group the maps' lengths): empty maps where unmapped.
  std::vector<int32_t> q_map, k_map;
  GridTiling q_tiling, k_tiling;  // the boxes of query and key tiles (mapped plans; strip plans: k_tiling is q_tiling)
  // Key strips (see above): one record per key tile (entry.kt indexes it; k_tiles == strips.size()); k_map then holds
  // each strip's 64 slots' tokens (-1: padding), so k_token works as for key boxes (a token may sit in several strips,
  // of different query tiles). strip_sx / strip_sy: the token strides of one step of the outer / last used axis in a
  // dilation group (GridTiling::token_stride).
  bool strip_keys = false;
  std::vector<KeyStrip> strips;
  int32_t strip_sx = 0, strip_sy = 0;
  // Bitmasks drawn on the device (choose_block_plan's device_draw; plan::kDrawMaxKeys): where drawn.r > 0 the pattern is
  // random(drawn.r, seed=drawn.seed), every (query tile, key tile) is an entry, in order, a bitmask (entry i's mask is
  // i), and `masks` is empty: the uploader draws them (cuda/fused/random_rows.hpp) instead of copying them.
  struct Drawn {
    int64_t r = 0;
    uint64_t seed = 0;
  } drawn;
  // Strip plans of a lone neighborhood atom (build_strip_plan's device_masks): the bitmasks are the device's too, and
  // grid_windows holds each axis's windows (the 3 right-aligned axes of q_tiling in order, each coordinate x < dims[a]
  // of axis a a triple start, stride, count of the key coordinates it keeps): bit (r, s) of a strip entry is set iff
  // query row r and key slot s are tokens and on every axis the key's coordinate is start + i stride, 0 <= i < count,
  // of the query's coordinate's window (cuda/fused/strip_masks.hpp). k_map is then empty (k_token: the strips').
  std::vector<int32_t> grid_windows;
  bool masks_drawn() const { return drawn.r > 0 || !grid_windows.empty(); }
  // choose_block_plan's candidates, each with its predicted cost per kept score and sampled kept fraction, for explain
  // (empty: built directly); describe() writes them out (written as text here, cold after the backward's plan, they
  // were 4 us of sparse_fixed's two choices, 0.016 -> 0.012 ms).
  struct PricedShape {
    std::string name;
    double cost = 0, kept = 0;
  };
  std::vector<PricedShape> choice;
  double build_ms = 0;            // choosing (choice_ms) and building
  double choice_ms = 0;           // choose_block_plan's pricing of the candidate shapes

  bool mapped() const { return !q_map.empty(); }
  bool key_strips() const { return strip_keys; }  // mapped, key tiles are per-entry strips
  int64_t words_per_mask() const { return int64_t(block_m) * block_n / 64; }
  int64_t nentries() const { return int64_t(entries.size()); }
  // Visited tile area over nnz: 1.0 means no computed score is wasted; kept_fraction() is its inverse.
  double waste() const { return nnz ? double(nentries()) * block_m * block_n / double(nnz) : 0.0; }
  double kept_fraction() const { return nentries() ? double(nnz) / (double(nentries()) * block_m * block_n) : 0.0; }
  // Plan-space position -> token (or a value >= len for padding).
  int64_t q_token(int64_t p) const { return mapped() ? mapped_token(q_map, p, q_len) : token(p, q_group); }
  int64_t k_token(int64_t p) const {
    if (strip_keys && k_map.empty()) {
      const KeyStrip& s = strips[size_t(p / 64)];
      const int t = strip_token(s.base, strip_pack(s.width, s.count), int(p % 64), strip_sx, strip_sy);
      return t < 0 ? k_len : t;
    }
    return mapped() ? mapped_token(k_map, p, k_len) : token(p, k_group);
  }
  int64_t token(int64_t p, int64_t group) const {
    if (perm_d == 1) return p;
    const int64_t g = p / group, j = p - g * group;
    return g + j * perm_d;
  }
  static int64_t mapped_token(const std::vector<int32_t>& map, int64_t p, int64_t len) {
    return map[size_t(p)] < 0 ? len : map[size_t(p)];
  }
  std::string describe() const;
};

// Which 64-key halves of entry `i` (of query tile `qt`) can hold kept keys: bit 0 keys 0-63, bit 1 keys
// 64-127 (block_n == 128); 1 for block_n == 64. Full tiles: 3. Partial tiles whose kept keys all lie in one
// half let the 64x128 kernel load and multiply that half only (bench: local/dilated band edges).
int entry_halves(const BlockPlan& plan, int64_t qt, int64_t i);

// Builds the plan for given tile sizes (64, 128 or 192 query rows; 64 or 128 keys) and permutation (1: none).
// `analysis`: analyze(pattern) where the caller has it (its band rows), else computed here.
BlockPlan build_block_plan(const BoundPattern& pattern, int block_m, int block_n, int perm_d = 1,
                           const Analysis* analysis = nullptr);
// A mapped plan: query tiles are the boxes of q_tiling, key tiles those of k_tiling (tilings of the pattern's
// token grid, GridTiling::of; boxes of 64 or 128 tokens: the tile sizes). Throws Error naming what does not fit.
BlockPlan build_block_plan(const BoundPattern& pattern, const GridTiling& q_tiling, const GridTiling& k_tiling);

// A strip plan (see above; tile_map 2) with query tiles the boxes of q_tiling (64 tokens) over a grid whose keys are
// its queries' (self attention on the grid). Empty, with the reason in *why, where strips do not fit: a grid of three
// axes longer than 1, a query box whose keys leave its dilation group or span more than 64 coordinates of the last
// used axis. O(rows' runs + kept keys + strips x 64).
// device_masks: for a lone neighborhood atom whose windows stay in their dilation groups, the bitmasks are left to the
// device (BlockPlan::grid_windows) and the strips come from the axes' windows: O(grid axes + boxes x box sides + strips).
std::optional<BlockPlan> build_strip_plan(const BoundPattern& pattern, const GridTiling& q_tiling, std::string* why = nullptr,
                                          bool device_masks = false);

// The longest key prefix (BlockPlan::band_prefix) the band kernel takes: each of its 64-key chunks is a 64-key
// step of every slab, not paired into 128-key steps, so only a few (attention sinks, longformer's global columns).
inline constexpr int32_t kBandPrefixMax = 128;

// Chooses the tile shape and permutation with the least predicted cost among the fused GPU rows of the kernel
// table (plan/kernels.hpp: their shapes and costs) and returns the plan built with them. block_m / block_n > 0
// force a shape, perm_d >= 1 a permutation (and no tile map). tma: the sm_90a TMA rows are available (sm_90a
// device, TMA allowed), which adds 192x128 tiles and prices 128x128 lower; with band rows (analysis.band) there
// the plan is band_block_m(head_dim) x 128 for the band kernel. tile_map: where the pattern has a neighborhood grid of 2
// or 3 axes (analysis.grid), mapped candidates too, one per cp.async shape with the query and key boxes of least
// cost (tile_map.hpp, best_boxes): -1 chosen by cost against the others, 0 never, 1 only those, for grids of one
// axis too (Error where the pattern has no grid, no box fits it, or a permutation is forced); 2 key strips only (64x64
// tiles, query boxes of the 64x64 mapped candidate; Error where they do not fit, saying why). Chosen (-1), the strip
// candidate (64x64 rows only) is priced exactly from its built plan: every strip a partial tile. device_draw: where the
// pattern is one random atom and the chosen tiles are unpermuted and unmapped, with every tile expected to hold kept
// keys (drawn_masks_apply), the plan's bitmasks are left to the device (BlockPlan::drawn): O(tiles) here; and a strip
// plan's of a lone neighborhood atom (build_strip_plan's device_masks, BlockPlan::grid_windows). only_kind (a
// KernelKind, sm90_tma or sm90_cp; -1 none): PlanOptions::kernel's kind as a filter of the candidates where no shape is
// forced: where the cheapest candidate's row is of another kind, the cheapest of the shape of the kind's first row at
// this head dim (the table lists each kind's rows best first).
BlockPlan choose_block_plan(const BoundPattern& pattern, const Analysis& analysis, int64_t head_dim, int block_m = 0,
                            int block_n = 0, int perm_d = -1, bool tma = false, int tile_map = -1,
                            bool device_draw = false, int only_kind = -1);

// Whether a plan of block_m x block_n unpermuted, unmapped tiles may leave its bitmasks to the device (BlockPlan::drawn):
// the pattern is random(r) with device_draws_random (plan/kernels.hpp), and the tiles it leaves empty, expected over its
// random rows, are at most kDrawnEmptyTiles (every tile is visited).
bool drawn_masks_apply(const BoundPattern& pattern, int block_m, int block_n);

// The predicted cost of each tile shape that choose_block_plan weighs when nothing is forced (before the band
// kernel's rule), in its order: for tests and explain. kept: the sampled fraction of visited scores kept.
struct ShapeCost {
  int block_m, block_n, perm_d;
  double cost;
  double kept = 0;
  bool mapped = false;  // a tile map (boxes q_box / k_box of the grid)
  bool strips = false;  // mapped with key strips (k_box unused)
  TileBox q_box, k_box;
};
std::vector<ShapeCost> block_shape_costs(const BoundPattern& pattern, const Analysis& analysis, int64_t head_dim,
                                         bool tma = false, int tile_map = -1);

}  // namespace spattn::plan
