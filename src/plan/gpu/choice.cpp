// plan/gpu/choice.cpp — choose_block_plan: the tile shape, permutation and tile map of least predicted cost among
// the kernel table's fused GPU rows (cost.hpp), and the plan built with them; where the device draws the bitmasks.
#include <chrono>
#include <cmath>

#include "plan/gpu/cost.hpp"

namespace spattn::plan {

using namespace gpu;

namespace {
// Residue groups of at most 32 tokens leave a 64-row tile half padding or more (sparse_strided(512)'s affine part at
// L = 16384: 512 groups of 32, one 64x64 tile each, 12% of it kept). A coarser grouping, d / 2^j for the least j
// whose groups hold more than 32 tokens, puts 2^j of them in one group (token t at position t / (d / 2^j)): its tiles
// are not bands but bitmasks, and there are about 2^-j as many (the pattern's keys of a row stay in its group, since
// d / 2^j divides d). A candidate more of the forward's (issue 42); 0 where none applies.
int coarser_groups(int d, int64_t lq) {
  if (d < 2 || ceil_div(lq, d) > 32) return 0;
  for (int c = d; c % 2 == 0;) {
    c /= 2;
    if (ceil_div(lq, c) > 32) return c;
  }
  return 0;
}

// The cheapest candidate (ties: the earlier) of the shape of `kind`'s first row at `head_dim`; `otherwise` where
// none has it.
size_t cheapest_of_kind(const std::vector<Candidate>& cands, KernelKind kind, int64_t head_dim, size_t otherwise) {
  const KernelConfig* first = nullptr;
  for (const KernelConfig& r : kKernels)
    if (r.kind == kind && r.head_dim == head_dim) {
      first = &r;
      break;
    }
  size_t best = cands.size();
  for (size_t i = 0; first && i < cands.size(); ++i)
    if (cands[i].block_m == first->block_m && cands[i].block_n == first->block_n &&
        (best == cands.size() || cands[i].cost < cands[best].cost))
      best = i;
  return best < cands.size() ? best : otherwise;
}
}  // namespace

bool drawn_masks_apply(const BoundPattern& pat, int bm, int bn) {
  const auto rs = pat.random_spec();
  const int64_t lq = pat.q_len(), lk = pat.k_len();
  if (!rs || lq == 0 || !device_draws_random(rs->r, lq, lk)) return false;
  // A row keeps none of w given keys with probability C(Lk - w, r) / C(Lk, r) <= (1 - w / Lk)^r, its rows drawn
  // independently: a tile of h rows by w keys is empty with probability at most (1 - w / Lk)^(r h). Summed over the
  // tiles (whole ones, and the last row and column of narrower ones).
  const int64_t qt = ceil_div(lq, bm), kt = ceil_div(lk, bn), h_last = lq - (qt - 1) * bm, w_last = lk - (kt - 1) * bn;
  auto empty = [&](int64_t h, int64_t w) { return std::exp(double(rs->r) * double(h) * std::log1p(-double(w) / double(lk))); };
  const double expected = double(qt - 1) * double(kt - 1) * empty(bm, bn) + double(qt - 1) * empty(bm, w_last) +
                          double(kt - 1) * empty(h_last, bn) + empty(h_last, w_last);
  return expected <= kDrawnEmptyTiles;
}

BlockPlan choose_block_plan(const BoundPattern& pat, const Analysis& an, int64_t head_dim, int block_m, int block_n,
                            int perm_d, bool tma, int tile_map, bool device_draw, int only_kind) {
  const auto t0 = std::chrono::steady_clock::now();
  if (tile_map < -1 || tile_map > 2)
    throw Error("block plan: tile_map must be -1 (chosen), 0 (never), 1 (always) or 2 (key strips), got " +
                std::to_string(tile_map));
  const bool forced = block_m > 0 && block_n > 0;
  if (tile_map == 2 && forced && (block_m != 64 || block_n != 64))
    throw Error("block plan: tile_map 2 (key strips) runs 64x64 tiles only, got " + std::to_string(block_m) + "x" +
                std::to_string(block_n));
  std::vector<Candidate> mapped;
  std::string strip_why = "no 64x64 kernel at this head dim";
  if (tile_map != 0 && perm_d < 1) {
    mapped = tile_map == 2 ? mapped_candidates(an, head_dim, 64, 64, true)
                           : mapped_candidates(an, head_dim, block_m, block_n, tile_map == 1);
    if (tile_map != 1) add_strip_candidates(pat, mapped, &strip_why, device_draw);
    if (tile_map == 2) std::erase_if(mapped, [](const Candidate& c) { return !c.strip; });
  }
  if (tile_map >= 1 && (perm_d >= 1 || mapped.empty()))
    throw Error("block plan: tile_map " + std::to_string(tile_map) +
                (tile_map == 1 ? " (multi-dimensional tiles)" : " (key strips)") + " for '" + pat.spec() + "' at head dim " +
                std::to_string(head_dim) + (forced ? ", tiles " + std::to_string(block_m) + "x" + std::to_string(block_n) : "") +
                ": " + (perm_d >= 1 ? "a permutation is forced (perm_d " + std::to_string(perm_d) + ")"
                        : !an.grid ? std::string("the pattern has no neighborhood grid")
                        : tile_map == 2 && grid_axes_used(*an.grid) > 0 ? strip_why
                                   : std::string("no box of the tile sizes fits its grid")));
  std::vector<int> perms;
  if (perm_d >= 1) {
    perms = {perm_d};
  } else {
    const int d = an.permutation(kMaxGpuPermutation);
    perms = {1};
    if (d > 1) perms.push_back(d);
    // Not where a shape is forced (the backward's plans, backward_tiles: their kernels' items differ; tests).
    if (const int c = coarser_groups(d, pat.q_len()); c > 1 && !forced)
      perms.push_back(c);
  }
  // Band rows on the TMA kernel's device: the band kernel multiplies 64-row slabs over 64-key chunks, so the tile's
  // height costs no area there, and 192-row items (128 at head dim 128) share each chunk among three (two) consumer
  // warpgroups (bench/LOG.md).
  const int band_bm = band_block_m(head_dim);
  const bool band_plan = block_m <= 0 && tma && band_bm > 0 && perm_d <= 1 && tile_map < 1 &&
                         (an.band.ok || an.window.ok || (an.sinks.ok && an.prefix <= kBandPrefixMax)) &&
                         find_kernel(KernelKind::sm90_band, band_bm, 128, int(head_dim)) >= 0;
  int bm = band_plan ? band_bm : 192, bn = 128, bd = 1;
  std::shared_ptr<const Maps> maps;
  std::shared_ptr<BlockPlan> strip;
  std::vector<BlockPlan::PricedShape> choice;
  if (!band_plan) {
    std::vector<Candidate> cands;
    if (tile_map < 1)
      for (int d : perms)
        for (const Candidate& c : candidates(head_dim, d, tma))
          if (!forced || (c.block_m == block_m && c.block_n == block_n)) cands.push_back(c);
    for (Candidate& c : mapped) cands.push_back(std::move(c));
    if (forced) bm = block_m, bn = block_n, bd = perms[0];  // also where no row has the shape (can_implement says so)
    if (forced && cands.empty() && perms.size() > 1 && tile_map < 1) {
      // A shape no forward row has (the backward's 64x128 tiles at head dim 128): its permutations priced by the
      // head dim's first cp.async row, the same for each, so that the tiles each visits decide (before, the
      // identity always: stride(64) & causal's backward at D = 128 kept 1.5% of its visited scores).
      const std::vector<Candidate> stand_in = candidates(head_dim, 1, false);
      if (!stand_in.empty())
        for (int d : perms) cands.push_back({block_m, block_n, d, stand_in.front().row, nullptr, nullptr});
    }
    if (cands.empty() && !forced)
      throw Error("block plan: the kernel table has no fused GPU kernel at head dim " + std::to_string(head_dim));
    if (cands.size() > 1) {
      estimate_costs(pat, an, cands, device_draw);
      for (const Candidate& c : cands)
        choice.push_back({candidate_name(c), c.cost / double(std::max<int64_t>(an.nnz, 1)), c.kept});
    }
    if (!cands.empty()) {
      size_t best = 0;
      for (size_t i = 1; i < cands.size(); ++i)  // in order: ties keep the earlier candidate
        if (cands[i].cost < cands[best].cost) best = i;
      if (only_kind >= 0 && !forced && int(cands[best].row->kind) != only_kind)
        best = cheapest_of_kind(cands, KernelKind(only_kind), head_dim, best);
      bm = cands[best].block_m, bn = cands[best].block_n, bd = cands[best].d, maps = cands[best].maps;
      strip = cands[best].strip;
    }
  }
  const double choice_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const bool drawn = device_draw && !strip && !maps && bd == 1 && drawn_masks_apply(pat, bm, bn);
  BlockPlan p = strip ? std::move(*strip) : build_plan(pat, bm, bn, bd, &an, maps.get(), drawn);
  p.choice = std::move(choice);
  p.choice_ms = choice_ms;
  p.build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return p;
}

}  // namespace spattn::plan
