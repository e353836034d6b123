// plan/parts.hpp — a pattern split into parts, each run by the kernel that suits it, the parts' results merged
// exactly through their log-sum-exp (plan/merge.hpp). Multigrain's coarse/fine split, driven by the spec's terms.
//
// The union terms of the spec (BoundPattern::union_terms) are sorted by shape:
//   columns    global_cols / summary terms whose keys are few (at most Lk / kPartsMaxFraction) and spread over
//              more 128-key tiles than twice the key tiles the other terms visit a row: their keys are gathered
//              once into a small K/V and run as a dense part over them (sparse_fixed's summaries; not
//              longformer's global columns, which fill one tile);
//   rows       global_rows terms (and global's rows) covering one contiguous range: run as dense rows against
//              every key; such rows keep every key, so this part alone gives their output and the other parts'
//              values there are replaced, not merged. In mode 1; and chosen where the engine has the band kernel
//              (SplitTarget::band_kernel), the rows are at most Lq / kPartsMaxFraction, and every other term
//              together is band rows, or band rows with a key prefix (Analysis::sinks: longformer's local |
//              global_cols(0:G)): then the tiles part (all the other terms) runs on the band kernel and the rows on
//              the band kernel's split over keys (dense rows, FusedOptions::band 1), instead of all of it as one
//              tile list on the one-warpgroup kernels;
//   scattered  random terms keeping at most Lk / kScatteredMaxFill keys a row on average (below about 256 kept
//              scores a 128 x 128 tile, where a tile costs more than gathering its keys): a CSR part for the
//              fine-grained kernel;
//   affine     a dilated term (stride(s), dilated(w, d), with causal or bands: BoundPattern::dilated_band, d >= 2)
//              united with band rows (sparse_strided(s) = local(left=s-1, right=0) | (stride(s) & causal)), where
//              the terms are tiles only: the term less the offsets the band keeps (one interval of multiples of d:
//              BoundPattern::dilated_offsets) runs as its own tile part, which the planner groups by residue
//              (BlockPlan::perm_d = d: a group's rows are band rows; on the GPU d / 2^j where d's groups hold 32
//              tokens or fewer, plan/gpu/choice.cpp), and the band rows stay the tiles part. Chosen
//              (mode -1) where SplitTarget::affine and the cost model (block_shape_costs) prices the two parts'
//              best shapes below kAffineSplitGain of the union's, or where SplitTarget::affine_cpu (the CPU
//              engine) and the groups hold kCpuAffineMinGroup tokens or more; in mode 1 always;
//   tiles      every other term (and the above where they are too large): one pattern for the tile kernels.
// Parts are disjoint where they merge: the columns part drops what the tiles part keeps, the scattered part what
// the tiles and columns parts keep; rows of the rows part are dropped from the columns and scattered parts.
// Their union is the pattern exactly (tests/parts_test.cpp checks both on every test pattern).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "plan/analysis.hpp"
#include "spattn/pattern.hpp"

namespace spattn::plan {

enum class PartKind { tiles, columns, rows, scattered, affine };
const char* part_kind_name(PartKind k);

struct Part {
  PartKind kind = PartKind::tiles;
  // tiles, affine: over (Lq, Lk). columns: over (Lq, columns.size()), compact key j standing for key columns[j].
  // rows: dense over (row_end - row_begin, Lk). scattered: the CSR below as an explicit pattern over (Lq, Lk).
  BoundPattern pattern;
  std::vector<int32_t> columns;        // columns: the gathered keys, increasing
  int64_t row_begin = 0, row_end = 0;  // rows: the query rows this part owns
  std::vector<int64_t> offsets;        // scattered: row q keeps cols[offsets[q] .. offsets[q + 1])
  std::vector<int32_t> cols;
  // scattered, where drawn.r > 0 (SplitTarget::device_draw): the part is random(drawn.r, seed=drawn.seed) less the tiles
  // part's band rows drawn_lo <= k - q <= drawn_hi (drawn_lo > drawn_hi: no tiles part, the atom itself), its CSR left
  // to the device (cuda/fused/random_rows.hpp), offsets and cols empty; nnz exact all the same (the pattern's less the
  // tiles part's, which it covers with this part).
  BoundPattern::RandomSpec drawn;
  int64_t drawn_lo = 1, drawn_hi = 0;
  int64_t nnz = 0;                     // kept scores of the part (per head)
  std::string terms;                   // the spec terms it runs
  // analyze(pattern) where the split made it (the tiles part beside a rows part: its rule reads the band rows of
  // the other terms), so that the part's planner does not analyse it again; else none.
  std::optional<Analysis> analysis;
};

// One line: kind, terms, kept scores, gathered keys or owned rows.
std::string describe(const Part& part);

struct Split {
  std::vector<Part> parts;  // in run order: tiles, affine, columns, scattered, rows
  double ms = 0;            // time to split
  // One tiles part over the whole pattern: nothing to merge.
  bool compound() const { return parts.size() != 1 || parts[0].kind != PartKind::tiles; }
  std::string describe() const;
};

// What runs the parts: band_kernel, whether the tiles part of band rows (with or without a key prefix) runs on the
// sm_90a band kernel (head dim 64 on an sm_90a device, TMA and the band kernel allowed), and a dense rows part on
// its split over keys.
struct SplitTarget {
  bool band_kernel = false;
  // A scattered part that is one random atom the device draws (device_draws_random), alone or beside a tiles part of
  // band rows (BoundPattern::band: local | random, the suite's bandrand) and nothing else (no columns part, no owned
  // rows): its CSR drawn by the device (Part::drawn), not here.
  bool device_draw = false;
  // The affine part (above) where the cost model prices it cheaper: the GPU planner's target (head_dim, tma: its
  // candidates, block_shape_costs). False: never in mode -1.
  bool affine = false;
  // The CPU engine's rule for the affine part in mode -1 instead of the GPU cost model (with affine): where its
  // residue groups hold at least kCpuAffineMinGroup tokens and Lq >= kCpuAffineMinLen.
  bool affine_cpu = false;
  int64_t head_dim = 64;
  bool tma = false;
};

// The affine part runs where its and the band part's predicted costs sum to at most this fraction of the union's:
// the rest pays the second launch and the LSE merge (the affine part's epilogue reads O and LSE back and writes them,
// FusedParams::merge_out; before issue 42's epilogue merge, a scratch O written, then one read of two outputs and
// one write), which the cost model does not price. Not measured yet (issue 42's bench: scripts/gpu_check.d/strided.sh).
inline constexpr double kAffineSplitGain = 0.8;

// The CPU engine's affine split (SplitTarget::affine_cpu), from its forward on one core (CPU time, fp32, H = 4, D = 64,
// session 24's 2-core VM): sparse_strided(s) split / whole at (s, L) = (64, 4096) 0.85, (128, 4096) 1.02,
// (128, 8192) 0.91, (256, 8192) 0.88, (256, 16384) 0.92, (512, 8192) 1.04, (512, 16384) 0.82; at D = 128, (256, 8192)
// 0.82. Groups of 16 tokens (512 at 8192) lose, and so did the one short case of 32 (128 at 4096).
inline constexpr int64_t kCpuAffineMinGroup = 32;
inline constexpr int64_t kCpuAffineMinLen = 8192;

// mode: -1 chosen by the rules above; 0 never (one tiles part); 1 every columns, rows and scattered term out of
// the tiles, whatever its size (tests).
Split split_pattern(const BoundPattern& pattern, const Analysis& analysis, int mode = -1, const SplitTarget& target = {});

}  // namespace spattn::plan
