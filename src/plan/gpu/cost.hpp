// plan/gpu/cost.hpp — the planner's candidates and their prices (internal to src/plan/gpu: cost.cpp prices them,
// choice.cpp chooses among them).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "plan/gpu/tiles.hpp"
#include "plan/kernels.hpp"

namespace spattn::plan::gpu {

// A candidate: a tile shape (and tile map) priced by its kernel-table row.
struct Candidate {
  int block_m, block_n, d;
  const KernelConfig* row;
  std::shared_ptr<const Maps> maps;  // a mapped candidate (d is 1)
  std::shared_ptr<BlockPlan> strip;  // a strip candidate (maps: its query boxes): its plan, built to price it
  bool priced = false;               // priced already: from its plan (strips) or in closed form (estimate_groups, ...)
  double cost = 0;
  double kept = 0;  // sampled: kept scores over the visited tiles' scores
};

// The shapes the fused GPU rows offer at `head_dim`, in table order, each priced by its TMA row where `tma`
// (sm_90a, no permutation) and one exists, else by its cp.async row; 192-row tiles exist only as TMA rows.
std::vector<Candidate> candidates(int64_t head_dim, int d, bool tma);

// The mapped candidates (a neighborhood grid of 2 or 3 axes): for each cp.async shape at `head_dim` (a forced
// shape: that one), the query and key boxes of least cost by the grid's windows (tile_map.hpp, best_boxes). forced
// (tile_map 1): grids of one axis too, and maps that are the identity.
std::vector<Candidate> mapped_candidates(const Analysis& an, int64_t head_dim, int block_m, int block_n, bool forced);

// Appends the strip candidates of the 64x64 mapped candidates among `mapped` (*why: why strips do not fit, where
// they do not). device_masks: their bitmasks left to the device where they can be (build_strip_plan).
void add_strip_candidates(const BoundPattern& pat, std::vector<Candidate>& mapped, std::string* why = nullptr,
                          bool device_masks = false);

// Prices every candidate not priced yet (Candidate::cost, kept). device_draw: random rows whose bitmasks the device
// draws are priced in closed form.
void estimate_costs(const BoundPattern& pat, const Analysis& an, std::vector<Candidate>& cands, bool device_draw = false);

// "128x128", "64x128 perm_d 2", "64x64 map 8x8/strips" (explain).
std::string candidate_name(const Candidate& c);

}  // namespace spattn::plan::gpu
