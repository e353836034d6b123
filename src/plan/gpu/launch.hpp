// plan/gpu/launch.hpp — the GPU planner's one output: what the fused engine launches for a pattern, and why.
//
// The engine (src/cuda/fused) asks the planner once per distinct pattern (decide_pattern) and gets a plain-data
// decision: for one tile list, or for each part of a compound split (plan/parts.hpp), the tile plan (block_plan.hpp),
// the kernel-table row that runs it (kernels.hpp), the band / split / persistent / running-max policy and the reasons
// explain() prints. The engine uploads the plans, checks the tensors once a call and launches; it decides nothing,
// but for what only the tensors show at launch: strides that admit no tensor map send a TMA or band row to the row of
// the tile shape that loads without one (FusedFwd::to_params).
//
// The backward's choice (src/cuda/backward) is made here too, from the same analysis: backward_choice reads
// PlanOptions::backward_kernel, backward_row picks the row, backward_tiles builds its plan.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "plan/analysis.hpp"
#include "plan/gpu/block_plan.hpp"
#include "plan/kernels.hpp"
#include "plan/parts.hpp"
#include "spattn/plan.hpp"

namespace spattn::plan {

// The device as the planner sees it.
struct GpuTarget {
  int cc = 0;   // compute capability, major * 10 + minor
  int sms = 0;  // streaming multiprocessors (the band kernel's split; a persistent grid's size)
  bool sm90a() const { return cc == 90; }
};

// The fused engine's planning options (PlanOptions' GPU fields; tests set them directly).
struct FusedOptions {
  int block_m = 0, block_n = 0;  // 0: chosen by the planner (64x64, 64x128, 128x128, 192x128)
  int perm_d = -1;               // -1: chosen (residue grouping for dilated/strided rows); 1: none
  int tile_map = -1;             // neighborhood patterns of 2-3 axes: -1 chosen, 0 never, 1 always a tile map
                                 // (multi-dimensional tiles, plan/tile_map.hpp; cp.async / mma.sync kernels),
                                 // 2 key strips (64x64 tiles, plan/gpu/block_plan.hpp)
  bool force_sm80 = false;       // run the mma.sync kernel on Hopper too (tests)
  bool tma = true;               // sm_90a: the warp-specialized TMA kernel where it applies (128/192-row
                                 // tiles, no permutation, strides a tensor map accepts); false: cp.async kernels
  int persistent = -1;           // TMA kernel: 1 one CTA per SM drawing work items, 0 one item a CTA, -1 chosen
  int band = -1;                 // band-row patterns (local, sliding windows, causal) at head dim 64 on sm_90a:
                                 // -1 chosen, 1 the band kernel (64-row slabs over 64-key chunks), 0 never
  int split = -1;                // band kernel: -1 chosen: where the items are fewer than the SMs, every item
                                 // in parts over its keys (merged by the last part); where the last partial
                                 // wave's items fit in one wave as single 64-row slabs (and are not the list's
                                 // cheap items), those items as slabs; 0 never, 1 the last items (up to one per
                                 // SM) as slabs, 2-4 the last items (up to one part per SM) in that many parts
  int device_draw = -1;          // random(r) patterns whose every tile holds kept keys (block_plan.hpp,
                                 // drawn_masks_apply): -1 their bitmasks drawn on the device at upload
                                 // (cuda/fused/random_rows.hpp), 0 drawn on the host and copied
  int running_max = -1;          // band kernel: -1 chosen (rows keeping 1536 keys or more on average), 1 the
                                 // exponentials of a row's later 128-key steps against its running maximum
                                 // (rescaled only when the maximum rises; a step whose exponentials overflow runs
                                 // again exactly), 0 every step's exact row maximum first
};

// The engine of a plan (PlanOptions::engine; automatic: the CPU engine on the CPU, on a GPU the fused engine where its
// kernels take the problem, else the unfused one), with why in *why. Throws Error where the engine asked for cannot run
// the problem on that device.
Engine choose_engine(const Problem& problem, const Device& device, Engine asked, std::string* why);

// PlanOptions::kernel as the planner reads it: a row (by name) or a kind of the fused GPU rows.
struct KernelFilter {
  std::string name;  // as given; "" none
  int row = -1;      // the row named, where a row was
  int kind = -1;     // the KernelKind forced (the row's), -1 none
  // Whether the planner's row `r` is the one asked for.
  bool admits(int r) const {
    return r >= 0 && (row < 0 || r == row) && (kind < 0 || int(kKernels[r].kind) == kind);
  }
};

// The FusedOptions of PlanOptions, with what PlanOptions::kernel forces (its shape, kind, and the planner's switches
// that kind needs) and the filter it sets. Throws Error where the kernel is no fused GPU kernel's name or kind.
FusedOptions fused_options(const PlanOptions& options, KernelFilter* filter);

// The band kernel's split of a launch's work items (FusedParams::split_first, split_k, split_slabs): items from
// `first` on run as `parts` parts over their keys, or (slabs) as their 64-row slabs.
struct SplitChoice {
  int first = 0, parts = 1, slabs = 0;
};

// One tile list's launch.
struct LaunchDecision {
  BlockPlan tiles;
  int kernel_row = -1;       // plan/kernels.hpp
  int persistent = 1;        // TMA and band rows: 1 one CTA per SM drawing work items, 0 one item a CTA
  int split = -1;            // band rows: the split rule (FusedOptions::split), applied per launch (split_for)
  bool running_max = false;  // band rows: the running-max steps (the row is sm90_band_rmax)
  std::string why;           // the reasons for the row and its policy (explain)
  double analysis_ms = 0;    // the pattern's analysis where the planner made it (none given)
  // The split of a launch of batch x heads = bh on `sms` SMs with workspace for `cap` parts (band rows only).
  SplitChoice split_for(int64_t bh, int sms, int cap) const;
};

// The whole forward of one pattern: one tile list (split not compound: launches[0]), or each part of a compound split
// (launches[i] for split.parts[i]; none for a scattered part, which runs on the CSR kernel).
struct PatternDecision {
  Split split;
  std::vector<std::optional<LaunchDecision>> launches;
  bool compound() const { return split.compound(); }
};

// Decides one pattern's forward on `target` (PlanOptions: the fused fields, kernel, compound). Throws Error where the
// options cannot be met (a forced kernel the planner cannot give this pattern, a tile map that does not fit).
PatternDecision decide_pattern(const BoundPattern& pattern, const Analysis& analysis, int64_t head_dim,
                               const GpuTarget& target, const PlanOptions& options);

// One tile list: the plan of least predicted cost among the rows `target` offers (choose_block_plan), its row and
// policy. analysis: analyze(pattern) where the caller has it, else made here. filter: PlanOptions::kernel's.
LaunchDecision decide_tiles(const BoundPattern& pattern, const Analysis* analysis, int64_t head_dim,
                            const GpuTarget& target, const FusedOptions& options, const KernelFilter& filter = {});

// The kernel-table row that runs `plan` on a device of compute capability `cc` at `head_dim` with FusedOptions'
// forcing fields (force_sm80, tma, band, running_max); -1 where the table has none. why: the reasons.
int choose_kernel(const BlockPlan& plan, int64_t head_dim, int cc, const FusedOptions& options, std::string* why = nullptr);

// The band kernel's split for work items of `plan` x bh on a persistent grid of `sms` CTAs (FusedOptions::split:
// `split`), with at most `cap` parts (the workspace).
SplitChoice choose_split(const BlockPlan& plan, int64_t bh, int sms, int split, int cap);

// The head sections of a launch's work order (FusedParams::head_section, BwdParams::head_section; the kernels'
// section_item): its work items (a tile of the plan x a batch-and-head unit) run section by section, a section being
// that many consecutive units with all their tiles (tiles in the plan's order, units fastest), so that what a
// section's tiles share (the forward's K and V of a head, the backward's Q, dO and dQ accumulator) stays in L2 while
// they run, as FlashAttention-3's tile scheduler does. Heads fastest over every unit instead kept 65-74% of L2 hits
// on causal D = 128 against FA4's 91-95%, with 3.5-5.5x its DRAM traffic (bench/LOG.md). `group` consecutive units
// share `group_bytes` (the q heads of a kv head; 1 where units are kv heads); sections hold whole groups, as many as
// fit in 5/8 of the L2 (`l2_bytes`), at least one. 0: one section of every unit (`units` of them), and where the
// plan's lists (`shape`, list_shape) say sections do not pay:
//  - uneven lists (imbalance above 8): the sections' order delays long lists that the plan's order over every unit
//    starts first (global rows and columns: longformer's backward 0.77x, bigbird's forward 0.72x, sink columns'
//    backward 0.59x with sections);
//  - lists that reach less than a third of the other axis (windows, neighborhoods: what a unit's tiles share is
//    small and stays in L2 anyway; na2d 96x96 forward 0.96x, local(left=4096) L 16384 GQA 0.96x with sections);
// measured kept: causal D = 128 forward 1.06x, a block mask's backward 1.19x and forward 1.03x (bench/LOG.md).
// Reach is measured within a residue group where a plan is grouped by residue (perm_d > 1: its lists keep to their
// group) and section_groups asks for it (the backward): such a plan's tiles run most work first over every group, so
// a causal group's tiles (stride(64) & causal, sparse_strided's affine part) run apart and, without sections, read
// their group's K and V from DRAM at each tile:
// stride(64) & causal at L = 65536, D = 64 visits 72 key tiles of 128 a group where 8 are its keys, 4.8 GB of K and V
// for 32 heads, which at 4.2 TB/s is the 1.2 ms it measured (the backward 1.01-1.74x with sections, bench/LOG.md).
struct ListShape {
  double imbalance = 1;  // the longest list over the mean
  // mean over non-empty lists of (last - first + 1) other-axis tiles / the tiles of a residue group (the other axis's
  // tiles where `groups` is 1), at most 1
  double reach = 1;
  int groups = 1;  // the residue groups the other axis is in (a plan's perm_d)
};
int head_section(int64_t group_bytes, int64_t units, int group, int64_t l2_bytes, const ListShape& shape);
// The shape of a plan's lists: offsets [tiles + 1] into entries, whose kt is a tile of the other axis (of
// `other_tiles`, in `groups` residue groups of other_tiles / groups). {1, 1} where there are no entries (lists
// written on the device: not known here).
ListShape list_shape(const std::vector<int64_t>& offsets, const std::vector<TileEntry>& entries, int64_t other_tiles,
                     int groups = 1);
// The residue groups a plan's lists are measured in for head sections (list_shape's `groups`): the backward's
// key-major lists within a residue group (its perm_d), the forward's against the whole axis (1). Measured in one
// process (bench/LOG.md, session 26): sections on residue-grouped backward plans, with their coarser groups, 1.03-1.74x
// (sparse_strided(512) D = 128 1.74x, stride(64) & causal L = 65536 D = 64 1.26x); on the forward plans 0.94-0.96x
// for sparse_strided's affine parts and within 2% for stride(64) & causal and dilated(64, 32).
inline int section_groups(bool backward, int perm_d) { return backward ? perm_d : 1; }

// What runs a compound split's parts on `target` with `options` (plan/parts.hpp, SplitTarget).
SplitTarget split_target(int64_t head_dim, const GpuTarget& target, const FusedOptions& options);

// Whether the sm_90a band kernel runs this plan: band rows (shifted or not, or with a key prefix of at most
// kBandPrefixMax keys), no permutation, band_block_m(head_dim) x 128 tiles, Lq + Lk < 2^30.
inline bool band_kernel_applies(const BlockPlan& plan, int64_t head_dim) {
  return plan.band && !plan.mapped() && plan.block_m == band_block_m(head_dim) && plan.block_n == 128 &&
         plan.perm_d == 1 &&
         plan.band_prefix <= kBandPrefixMax && !(plan.band_prefix > 0 && plan.band_shifted) &&
         plan.q_len + plan.k_len < (int64_t(1) << 30);  // its 32-bit band arithmetic
}
// Whether it runs, given FusedOptions::band (1 where it applies, 0 never, -1 chosen: every band plan but dense
// rows, where no row is trimmed and the turn-taking TMA kernel measured 2-3% faster; bench/LOG.md, band kernel v14).
inline bool band_kernel_runs(const BlockPlan& plan, int64_t head_dim, int option) {
  const bool dense_rows = (plan.band_lo <= -(plan.q_len - 1) && plan.band_hi >= plan.k_len - 1) ||
                          (plan.band_shifted && int64_t(plan.band_hi) - plan.band_lo + 1 >= plan.k_len);
  return band_kernel_applies(plan, head_dim) && (option == 1 || (option == -1 && !dense_rows));
}

// The backward's kernel as PlanOptions::backward_kernel asks: "" chosen, a tile row or kind, or the CSR pass.
struct BackwardChoice {
  std::string kernel;            // as given
  int row = -1;                  // a forced sm90_bwd / sm90_bwd_ws row
  bool csr = false;              // cuda_csr_bwd forced
  bool warp_specialized = true;  // chosen rows may be the warp-specialized one (not where "sm90_bwd" is asked)
  bool query_strips = false;     // "sm90_bwd_strips": a neighborhood's backward on query strips (key_major_strips)
                                 // on the 64-key sm90_bwd row of the head dim; an Error where they do not fit
};
// What a pattern's grid says of query strips: none (no neighborhood grid), a grid of another shape, two axes longer
// than 1 (the shape they are chosen for).
enum class QueryStripsGrid { none, other, two_d };
QueryStripsGrid query_strips_grid(const BoundPattern& pattern);
// The neighborhood backward on query strips (issue 39; plan/key_plan.hpp, key_major_strips): asked for 2-D
// neighborhoods (a grid of two axes longer than 1) where no kernel is forced (H200: na2d 96x96 K=7 D=64 backward
// 1.52x, 112x112 K=9 D=128 1.64x the row-major tile plan's; in one process the row-major plan 1.167x slower on 96x96
// K=7; bench/LOG.md), forced by backward_kernel "sm90_bwd_strips"; any other backward_kernel ("sm90_bwd",
// "sm90_bwd_ws", a row of them, "cuda_csr_bwd") runs that kernel's row-major plan instead. Where the strips are asked
// but do not fit, the chosen row runs (with the reason in explain); forced, that is an Error. `grid` is
// query_strips_grid's, decided once a pattern.
bool query_strips_asked(const BackwardChoice& choice, QueryStripsGrid grid);
// Its kernel-table row: the 64-key sm90_bwd row of the head dim (query strips are 64-query steps over 64-key boxes);
// -1 where the table has none (why says so).
int query_strips_row(int64_t head_dim, std::string* why = nullptr);
// Throws Error where `kernel` is no GPU backward kernel, or a row of another head dim.
BackwardChoice backward_choice(const std::string& kernel, int64_t head_dim);
// The tile row of a pattern's backward (the forced one, else choose_backward_row on its analysis).
int backward_row(const BackwardChoice& choice, const Analysis& analysis, int64_t head_dim);
// Its plan: 64 query rows by the row's keys, residue permutation chosen as for the forward, no tile map.
BlockPlan backward_tiles(const BoundPattern& pattern, const Analysis& analysis, int64_t head_dim, int row);


// The backward of a compound plan by parts (issue 39): each part of the forward's split differentiated against the
// merged LSE and delta = rowsum(dO * O), the parts' dQ, dK, dV summed (the first part writes, the others add). The
// tiles part on the tile backward (its own tile plan); the affine part (issue 42) on the tile backward too, its own
// plan grouped by residue, dQ, dK and dV added to the tiles part's; the columns part on the tile backward over its keys gathered
// into a small dense K/V (dQ added, its dK/dV added to the columns' rows once), or on the CSR pass where it comes first
// or the tile kernel cannot run the tensors; the scattered part on the CSR pass over just that part's kept scores, in
// the full key space (its CSR and the transpose built once, at the first backward).
struct BackwardPart {
  PartKind kind = PartKind::tiles;
  std::string terms;
  int64_t nnz = 0;
  // tiles, affine: the part's pattern over (Lq, Lk); columns: over (Lq, columns.size()), compact key j standing for key
  // columns[j] (Part::pattern, Part::columns).
  BoundPattern pattern;
  std::vector<int32_t> columns;
  std::optional<Analysis> analysis;  // tiles, affine: analyze(pattern) where the split made it
  std::vector<int64_t> offsets;      // scattered: row q keeps keys cols[offsets[q] .. offsets[q + 1]), increasing
  std::vector<int32_t> cols;
  bool tile_kernel() const { return kind != PartKind::scattered; }  // on the tile backward where it can
};
// The part's kept scores as a CSR in the full key space (row q: keys cols[offsets[q] .. offsets[q + 1]), increasing):
// what the CSR pass runs.
void backward_part_csr(const BackwardPart& part, std::vector<int64_t>& offsets, std::vector<int32_t>& cols);
struct BackwardParts {
  std::vector<BackwardPart> parts;  // empty: the whole pattern as one tile list (or one CSR pass), as before
  std::string why;                  // why by parts, or why not
  bool by_parts() const { return !parts.empty(); }
  std::string describe() const;
};
// From the forward's split (split_pattern with the options' compound mode and split_target, the scattered part's CSR
// on the host): by parts where it is compound and has no rows part (a rows part replaces its rows' output, so the
// tiles part's scores in those rows would have to be dropped: the whole pattern runs instead), and neither kernel is
// forced (PlanOptions::kernel, backward_kernel). Whole is also the cheaper backward there: the forward splits dense
// rows off because its band kernel cannot take them, but the key-major tile backward takes them as one more query
// tile of each key tile (longformer(256, 32), L = 16384: 1 step of ~12 a key tile, ~8%), where a rows part of its own
// (issue 39's split over keys: dQ of the few rows over every key, dK/dV reduced once) repeats that step's work in
// its own launch plus a dK/dV read-add-write of the whole key range (2 x 64 MB each way at B = 2, H = 16, D = 64).
// Patterns the forward runs as one tile list (bigbird(64, 3, 2, 3): one 64x64 plan) run so here too.
BackwardParts backward_parts(const BoundPattern& pattern, const Analysis& analysis, int64_t head_dim,
                             const GpuTarget& target, const PlanOptions& options);

}  // namespace spattn::plan
