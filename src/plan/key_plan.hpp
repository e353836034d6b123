// plan/key_plan.hpp — a BlockPlan turned key-major, for the backward pass's dK/dV kernel (src/cuda/backward).
//
// The forward walks, per query tile, the key tiles it visits (BlockPlan::entries). The backward's key-major pass
// walks, per key tile, the query tiles that visit it: the same entries transposed once at plan time (O(entries)),
// each keeping its kind (full, band with the same lo/hi, bitmask), and the bitmasks transposed so that a key's
// bits over the tile's queries are one word (block_m == 64: bit r of word c is (q0 + r, k0 + c)).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "plan/analysis.hpp"
#include "plan/gpu/block_plan.hpp"

namespace spattn::plan {

struct KeyMajorPlan {
  int block_m = 0, block_n = 0;
  int64_t q_tiles = 0, k_tiles = 0;
  std::vector<int64_t> col_offsets;  // [k_tiles + 1] into entries
  std::vector<TileEntry> entries;    // per key tile, ascending query tile; TileEntry::kt holds the query tile
  std::vector<uint64_t> masks;       // [nbitmask * block_n]: word c of mask i = keys c's bits over the queries
  std::vector<int32_t> order;        // key tiles, most entries first
  // Query strips (key_major_strips; issue 39, a neighborhood's backward on the forward's strips): key tiles are
  // 64-token boxes of the grid, key row r of tile kt token k_map[kt * 64 + r] (-1: padding), and an entry's query
  // "tile" (TileEntry::kt) is a strip of 64 query slots, its lo / hi words the strip's base token and
  // strip_pack(W, count): slot r holds query strip_token(lo, hi, r, strip_sx, strip_sy) (plan/key_strips.hpp), -1 from
  // count on. Every entry is a bitmask (word c: key c's bits over the 64 slots). q_tiles counts the strips.
  bool query_strips = false;
  std::vector<int32_t> k_map;
  int32_t strip_sx = 0, strip_sy = 0;
  int64_t nnz = 0;
  std::string key_boxes;  // query strips: the key boxes ("4x16 boxes of a 96x96 grid")
  // Kept scores over the visited ones (entries x block_m x block_n); nnz must be set (query strips; else 0).
  double kept_fraction() const {
    return entries.empty() ? 0.0 : double(nnz) / (double(entries.size()) * block_m * block_n);
  }
};

// Requires plan.block_m == 64 (one 64-bit word per key of a transposed mask).
KeyMajorPlan key_major(const BlockPlan& plan);

// The key-major plan of a neighborhood pattern (self attention on its grid, BoundPattern::neighborhood_grid) over
// query strips: the forward's key strips (plan/gpu/block_plan.hpp, build_strip_plan) of the transposed pattern (key k
// keeps the queries that keep k), so a key box's CTA walks strips of the queries whose windows reach it, as dense as
// the forward's strips are (kept fraction ~ the forward's strip plan's, ~2.6x the row-major key-major plan's on na2d
// 96x96 K=7). Every 64-token box shape of the grid (tile_boxes) is tried; the plan of fewest entries is kept. Empty,
// with the reason in *why, where the pattern has no grid on its lengths or the strips do not fit (a grid of three
// axes longer than 1; reverse windows past 64 coordinates of the last axis). O(nnz + the strip builds).
std::optional<KeyMajorPlan> key_major_strips(const BoundPattern& pattern, std::string* why = nullptr);

// The most entries a key tile of a plan with dQ owners (dq_owners) has: what owners save, prep's zeroing of the
// accumulator, is a share of the backward that shrinks as the lists grow. Owners against zeroing (H200, bf16, D 128,
// one process, backward time): neighborhood(kernel=257) (6 entries a key tile) 0.947, local(256) (10) 0.977-0.984,
// local(256) GQA 32/4 0.946, local(1024) (33) 0.993, local(left=4096, right=0) GQA (58) 1.009; a 3-D neighborhood's
// lists (31 entries in several runs) 1.086 (bench/LOG.md).
inline constexpr int64_t kOwnerMaxEntries = 16;

// dQ's first writers of a key-major plan walked by a grid in plan.order (the backward's tile kernel: a key tile's
// items in that order, batch and head fastest): owner[query tile] = the key tile, of those whose entries name the query
// tile, that comes first in plan.order. Its step stores the tile's dQ and the others add to it after (BwdParams::
// dq_owner), so the accumulator needs no zeroing and a step waits only on a key tile taken before its own. *reverse:
// whether the key tiles walk their entries last first, the direction in which fewer of the other key tiles' steps
// come at or before the owner's step of their query tile (counted from each walk's start: a band's owner stores its
// tiles first walking backward). Empty where a query tile has no entry (its dQ would be left unwritten), the plan is
// over query strips, a key tile's query tiles are not one run or more than kOwnerMaxEntries, or more than 1/8 of the
// other steps would wait in both directions (causal and dense plans: one key tile owns every query tile, and the
// others would keep step with it); any_waits: owners wherever every query tile has a key (tests of the waits).
// O(entries).
std::vector<int32_t> dq_owners(const KeyMajorPlan& plan, bool* reverse, bool any_waits = false);

// The backward's row of the kernel table for a pattern of analysis `analysis` (analyze(pattern)) at `head_dim`
// (plan/kernels.hpp): the warp-specialized sm90_bwd_ws row where the plan has no residue permutation (its steps come
// by TMA, 128 queries a step at head dim 64; tensors without a tensor map run the sm90_bwd 128-key row), the 64-key
// sm90_bwd row for residue permutations; -1 where none. warp_specialized false: sm90_bwd rows only
// (`backward_kernel=sm90_bwd`, the A/B).
int choose_backward_row(const Analysis& analysis, int64_t head_dim, bool warp_specialized = true);

}  // namespace spattn::plan
