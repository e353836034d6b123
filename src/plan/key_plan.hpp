// plan/key_plan.hpp — a BlockPlan turned key-major, for the backward pass's dK/dV kernel (src/cuda/backward).
//
// The forward walks, per query tile, the key tiles it visits (BlockPlan::entries). The backward's key-major pass
// walks, per key tile, the query tiles that visit it: the same entries transposed once at plan time (O(entries)),
// each keeping its kind (full, band with the same lo/hi, bitmask), and the bitmasks transposed so that a key's
// bits over the tile's queries are one word (block_m == 64: bit r of word c is (q0 + r, k0 + c)).
#pragma once
#include <cstdint>
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
};

// Requires plan.block_m == 64 (one 64-bit word per key of a transposed mask).
KeyMajorPlan key_major(const BlockPlan& plan);

// The backward's row of the kernel table for a pattern of analysis `analysis` (analyze(pattern)) at `head_dim`
// (plan/kernels.hpp): the warp-specialized sm90_bwd_ws row where the plan has no residue permutation (its steps come
// by TMA, 128 queries a step at head dim 64; tensors without a tensor map run the sm90_bwd 128-key row), the 64-key
// sm90_bwd row for residue permutations; -1 where none. warp_specialized false: sm90_bwd rows only
// (`backward_kernel=sm90_bwd`, the A/B).
int choose_backward_row(const Analysis& analysis, int64_t head_dim, bool warp_specialized = true);

}  // namespace spattn::plan
