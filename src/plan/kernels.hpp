// plan/kernels.hpp — the kernel table: every attention kernel spattn can run, one row each.
//
// The one list of configurations. It drives
//   dispatch      the CUDA launch code instantiates exactly the GPU rows (src/cuda/fused/launch.cuh),
//   the planner   its tile-shape candidates and their measured costs (plan/gpu),
//   explain       the chosen row's name (Plan::kernel, Plan::last_kernel),
//   the tests     the GPU sweep runs every row (tests/gpu/fused_test.cpp).
// A plan stores the index of the row it chose; the row that actually ran is recorded at launch.
// Plain constexpr data, no includes beyond <cstdint> and spattn/engine.hpp: nvcc compiles it into the kernel files.
#pragma once
#include <cstdint>

#include "spattn/engine.hpp"

namespace spattn::plan {

enum class KernelKind : uint8_t {
  cpu_tiles,    // the CPU fused kernel (query tiles over key blocks and residue rows), per ISA
  sm80_mma,     // mma.sync, cp.async pipelined; any sm_80+ device (also forced on Hopper for tests)
  sm90_cp,      // sm_90a wgmma, cp.async loads (the permuted plans' row gathers; strides without a tensor map)
  sm90_tma,     // sm_90a warp-specialized: TMA producer warp, consumer warpgroups taking turns, persistent CTAs
  sm90_band,    // sm_90a band kernel: 64-row slabs over their own 64-key chunks (band-row plans)
  sm90_band_rmax,  // ... with running-max steps (rows keeping 1536 keys or more on average)
  cuda_unfused,    // SDDMM -> sparse softmax -> SpMM (BSR blocks on tensor cores + CSR on CUDA cores)
  cuda_scattered,  // compound plans' scattered parts: CSR rows, a warp a row, K/V rows gathered (parts_kernels.cu)
  sm90_bwd,        // the backward pass on sm_90a: key-major tiles (64 queries x 128 keys), wgmma, dQ by atomics
  sm90_bwd_ws,     // ... warp-specialized: a producer warp (TMA steps), a dQ warp (bulk reduce-add), 2 consumer WGs
  cuda_csr_bwd,    // the backward pass on CUDA cores over the pattern's CSR and its transpose (any GPU, dtype, D <= 256)
  cuda_scattered_bwd,  // a compound plan's CSR parts' backward: eight lanes a row, 16-byte gathers (scattered_backward.cu)
};

// dtypes a row accepts (bits of spattn::DType's values: f32 1, f16 2, bf16 4).
inline constexpr uint8_t kF32 = 1, kF16 = 2, kBF16 = 4;

struct KernelConfig {
  const char* name;
  Engine engine;
  KernelKind kind;
  int block_m, block_n;  // query rows x keys of a tile (0: not tiled so)
  int head_dim;          // 0: any the engine takes
  uint8_t dtypes;
  // Planner costs (fused GPU rows): a visited full tile's cost per score, relative to 64x128 at head dim 64 and
  // to 128x128 TMA at 128 (dense L=16384 on an H100, bench/LOG.md: D=64 64x128 305-350 TFLOP/s, 128x128 TMA 373,
  // 192x128 TMA 437, 128x128 cp.async 309-328, 64x64 296; D=128 128x128 TMA 520, cp.async ~430, 64x64 ~260),
  // a partial (band or bitmask) tile's over a full one's, and a work item's (a query tile with key tiles to
  // visit) in full tiles: the TMA rows' per-item fill, drain and epilogue, which short items (band rows: about 6
  // tiles) pay and long ones (random 5%: 128) do not. Fitted at L=16384: the TMA rows' partial 1.6 and item 0 of
  // before (local(256), longformer) became 1.2 and 1.6, which keeps those choices and prices random(820)'s 128
  // bitmask tiles an item at 0.78x the 64x128 cp.async row's, as measured (5.57 vs 7.14 ms, bench/LOG.md).
  // The 64x64 cp.async row at D=128 (two CTAs an SM since de3c4f6; dense 231 TFLOP/s against the 128x128 cp.async
  // row's 425) takes its partial tiles at 1.0: mapped neighborhoods at L=4096 ran 1.24x (na2d) and 1.23x (na3d)
  // faster on it than on 128x128, where 1.1 kept 128x128; below 1.0 the 1-D window na1d and local|random(4) would
  // move off the TMA row unmeasured.
  double full_cost, partial_cost;
  double item_cost = 0;
};

// Predicted cost in score units of visiting full and partial tiles of block_m x block_n scores in `items` work
// items on row c (the planner's price of a candidate, FusedAttention::predicted_cost).
constexpr double predicted_cost(const KernelConfig& c, double full, double partial, double items, double tile_scores) {
  return (full + partial * c.partial_cost + items * c.item_cost) * tile_scores * c.full_cost;
}

inline constexpr KernelConfig kKernels[] = {
    {"cpu_fused", Engine::cpu_fused, KernelKind::cpu_tiles, 0, 0, 0, kF32 | kF16 | kBF16, 0, 0},
    // sm_80 mma.sync (kernels_sm80.cu); same shapes and costs as the sm_90a cp.async rows
    {"sm80_64x128_d64", Engine::cuda_fused, KernelKind::sm80_mma, 64, 128, 64, kF16 | kBF16, 1.0, 1.1},
    {"sm80_128x128_d64", Engine::cuda_fused, KernelKind::sm80_mma, 128, 128, 64, kF16 | kBF16, 1.1, 1.1},
    {"sm80_64x64_d64", Engine::cuda_fused, KernelKind::sm80_mma, 64, 64, 64, kF16 | kBF16, 1.18, 1.1},
    {"sm80_128x128_d128", Engine::cuda_fused, KernelKind::sm80_mma, 128, 128, 128, kF16 | kBF16, 1.2, 1.1},
    {"sm80_64x64_d128", Engine::cuda_fused, KernelKind::sm80_mma, 64, 64, 128, kF16 | kBF16, 2.0, 1.1},
    // sm_90a wgmma with cp.async loads (kernels_sm90.cu); the planner's candidates, in this order (ties keep
    // the earlier shape)
    {"sm90_cp_64x128_d64", Engine::cuda_fused, KernelKind::sm90_cp, 64, 128, 64, kF16 | kBF16, 1.0, 1.1},
    {"sm90_cp_128x128_d64", Engine::cuda_fused, KernelKind::sm90_cp, 128, 128, 64, kF16 | kBF16, 1.1, 1.1},
    {"sm90_cp_64x64_d64", Engine::cuda_fused, KernelKind::sm90_cp, 64, 64, 64, kF16 | kBF16, 1.18, 1.1},
    {"sm90_cp_128x128_d128", Engine::cuda_fused, KernelKind::sm90_cp, 128, 128, 128, kF16 | kBF16, 1.2, 1.1},
    {"sm90_cp_64x64_d128", Engine::cuda_fused, KernelKind::sm90_cp, 64, 64, 128, kF16 | kBF16, 2.0, 1.0},
    // sm_90a warp-specialized TMA kernels (no permutation)
    {"sm90_tma_128x128_d64", Engine::cuda_fused, KernelKind::sm90_tma, 128, 128, 64, kF16 | kBF16, 0.82, 1.2, 1.6},
    {"sm90_tma_192x128_d64", Engine::cuda_fused, KernelKind::sm90_tma, 192, 128, 64, kF16 | kBF16, 0.70, 1.2, 1.6},
    {"sm90_tma_128x128_d128", Engine::cuda_fused, KernelKind::sm90_tma, 128, 128, 128, kF16 | kBF16, 1.0, 1.2, 1.6},
    // sm_90a band kernels: work items of 64-row slabs (three at D=64, two at D=128) over 64-key chunks; band plans
    // are built for them directly (choose_block_plan), so their costs price nothing
    {"sm90_band_d64", Engine::cuda_fused, KernelKind::sm90_band, 192, 128, 64, kF16 | kBF16, 0.70, 1.0},
    {"sm90_band_rmax_d64", Engine::cuda_fused, KernelKind::sm90_band_rmax, 192, 128, 64, kF16 | kBF16, 0.70, 1.0},
    {"sm90_band_d128", Engine::cuda_fused, KernelKind::sm90_band, 128, 128, 128, kF16 | kBF16, 1.0, 1.0},
    {"cuda_unfused", Engine::cuda_unfused, KernelKind::cuda_unfused, 0, 0, 0, kF32 | kF16 | kBF16, 0, 0},
    {"cuda_scattered", Engine::cuda_fused, KernelKind::cuda_scattered, 0, 0, 0, kF16 | kBF16, 0, 0},
    // the backward pass (Plan::backward on a GPU; src/cuda/backward)
    // (the first row of a head dim is the default; tile_bwd.cuh: 128 keys two warpgroups, 64 keys one)
    {"sm90_bwd_64x128_d64", Engine::cuda_fused, KernelKind::sm90_bwd, 64, 128, 64, kF16 | kBF16, 0, 0},
    {"sm90_bwd_64x64_d64", Engine::cuda_fused, KernelKind::sm90_bwd, 64, 64, 64, kF16 | kBF16, 0, 0},
    {"sm90_bwd_64x128_d128", Engine::cuda_fused, KernelKind::sm90_bwd, 64, 128, 128, kF16 | kBF16, 0, 0},
    // query strips only (issue 39's neighborhood backward, opt-in: plan/key_plan.hpp, key_major_strips;
    // bwd_strips_only): one warpgroup, dQ in two 64-column halves, 255 registers without spills
    {"sm90_bwd_64x64_d128", Engine::cuda_fused, KernelKind::sm90_bwd, 64, 64, 128, kF16 | kBF16, 0, 0},
    // warp-specialized: identity plans with tensor maps (else the 64x128 row of the head dim runs, and is
    // reported); the planner's row where steps come by TMA (choose_backward_row). Head dim 64: 128 queries a step,
    // two of the plan's 64-query entries (tile_bwd_ws2.cuh); 128: 64 queries a step (tile_bwd_ws.cuh)
    {"sm90_bwd_ws_128x128_d64", Engine::cuda_fused, KernelKind::sm90_bwd_ws, 128, 128, 64, kF16 | kBF16, 0, 0},
    {"sm90_bwd_ws_64x128_d128", Engine::cuda_fused, KernelKind::sm90_bwd_ws, 64, 128, 128, kF16 | kBF16, 0, 0},
    {"cuda_csr_bwd", Engine::cuda_fused, KernelKind::cuda_csr_bwd, 0, 0, 0, kF32 | kF16 | kBF16, 0, 0},
    {"cuda_scattered_bwd", Engine::cuda_fused, KernelKind::cuda_scattered_bwd, 0, 0, 0, kF16 | kBF16, 0, 0},
};
inline constexpr int kNumKernels = int(sizeof(kKernels) / sizeof(kKernels[0]));

// Residue permutations each tiler takes (Analysis::residue): the GPU kernels gather rows through the map in
// their loads (plan_token: any stride whose plan space fits 31 bits, checked at upload), each group padded to whole
// tiles, so large strides waste tiles: the cost model prices the padding against the unpermuted candidates (issue
// 42: stride(256) at L = 16384 is 256 groups of 64 tokens, one 64x64 tile each). Was 16 (a cap of the planner, not
// of the kernels).
inline constexpr int64_t kMaxGpuPermutation = 4096;
inline constexpr int64_t kMaxCpuPermutation = 4096;
// The tile backward takes the same groups (kMaxGpuPermutation). Session 23 capped them at 16 after
// BackwardGpu.StridedPastSixteen failed on an H200, but the test had thrown at its first case before any backward
// ran groups past 16: plan::backward_parts dropped sparse_strided's affine part, and the CSR pass refused the empty
// CSR it got ("a CSR of 1 offsets and 0 keys for 4099 rows", session 24).

// Compound plans (plan/parts.hpp): a random term goes to the scattered part where it keeps at most Lk / this many
// keys a row on average (a 128 x 128 tile then holds about 256 kept scores or fewer: there gathering its keys'
// rows costs less than computing the tile); columns and rows terms leave the tiles where they hold at most
// 1 / kPartsMaxFraction of the keys (rows).
inline constexpr int64_t kScatteredMaxFill = 64;
inline constexpr int64_t kPartsMaxFraction = 8;

// Random rows drawn on the GPU (cuda/fused/random_rows.hpp: a random(r) plan's tile bitmasks, a scattered part's
// CSR): a row's keys are a bitmap in shared memory while Floyd's sampling runs, so up to this many keys (128 KiB a
// row); longer rows are drawn on the host. A plan takes device-drawn tile bitmasks only where its tiles all hold kept
// keys but for at most kDrawnEmptyTiles of them expected (it visits every tile).
inline constexpr int64_t kDrawMaxKeys = int64_t(1) << 20;
inline constexpr double kDrawnEmptyTiles = 0.01;
// The rows the device draws: random(r) over q_len x k_len with 1 <= r < k_len <= kDrawMaxKeys (r >= k_len keeps every
// key), q_len < 2^31. The planner's rules (drawn_masks_apply, the split's drawn parts) and the draw launches check this.
constexpr bool device_draws_random(int64_t r, int64_t q_len, int64_t k_len) {
  return r >= 1 && r < k_len && k_len <= kDrawMaxKeys && q_len >= 0 && q_len < (int64_t(1) << 31);
}

// The backward's tiles (sm90_bwd rows, 64 queries a step) at head dim 64: 128 keys a CTA (two warpgroups), but 64
// (one warpgroup, two CTAs an SM) for residue-permuted plans, whose steps load by cp.async rather than TMA. H100,
// L=16384, TMA steps: local 1.09 vs 1.13 ms, bigbird 1.50 vs 1.67, causal 8.2 vs 9.4 (before TMA), longformer 1.31
// vs 1.29; cp.async steps: dilated 1.29 vs 1.25. The warp-specialized rows (sm90_bwd_ws) replace the 128-key ones
// where steps come by TMA: local 0.975 -> 0.902 ms (D=128 1.673 -> 1.394), causal 8.149 -> 7.102 (D=128 14.64 ->
// 10.61), longformer 1.197 -> 1.095 (D=128 2.047 -> 1.729). At head dim 64 its steps take 128 queries
// (sm90_bwd_ws_128x128_d64, which replaced the 64-query-step row there): H200, B=2 H=16 L=16384, local 0.841 ->
// 0.762 ms, causal 7.545 -> 6.311.

// The band kernel's work items (src/cuda/fused/fused_fwd_band.cuh), as a plan's tile height: three 64-row slabs at
// head dim 64, two at 128 (0: no band kernel at that head dim). Its plans' tiles are that many rows by 128 keys.
constexpr int band_block_m(int64_t head_dim) { return head_dim == 64 ? 192 : head_dim == 128 ? 128 : 0; }

// The band kernel runs a slab's later steps against the running maximum where the slabs average this many
// 64-key chunks or more (H100: causal +4% at L=16384, +2% at 4096; local(256), 9 chunks, -1.3 to -2.5%).
inline constexpr int kRunningMaxChunks = 24;

constexpr bool is_gpu_fused(KernelKind k) {
  return k == KernelKind::sm80_mma || k == KernelKind::sm90_cp || k == KernelKind::sm90_tma ||
         k == KernelKind::sm90_band || k == KernelKind::sm90_band_rmax;
}
constexpr bool is_sm90(KernelKind k) { return is_gpu_fused(k) && k != KernelKind::sm80_mma; }
constexpr bool is_tile_bwd(KernelKind k) { return k == KernelKind::sm90_bwd || k == KernelKind::sm90_bwd_ws; }
// The tile backward rows that run query strips only (sm90_bwd_64x64_d128: its row-major and residue instantiations
// would spill; none is compiled): no planner choice, no forced backward_kernel, no run-time lists take them.
constexpr bool bwd_strips_only(const KernelConfig& c) {
  return c.kind == KernelKind::sm90_bwd && c.block_n == 64 && c.head_dim == 128;
}
constexpr bool is_band(KernelKind k) { return k == KernelKind::sm90_band || k == KernelKind::sm90_band_rmax; }

// The row of (kind, tile, head dim); -1 where the table has none.
constexpr int find_kernel(KernelKind kind, int block_m, int block_n, int head_dim) {
  for (int i = 0; i < kNumKernels; ++i) {
    const KernelConfig& c = kKernels[i];
    if (c.kind == kind && c.block_m == block_m && c.block_n == block_n && (c.head_dim == 0 || c.head_dim == head_dim))
      return i;
  }
  return -1;
}
// The first row of `kind` at `head_dim` (a backward kind's row of the head dim); -1 where the table has none.
constexpr int first_kernel(KernelKind kind, int head_dim) {
  for (int i = 0; i < kNumKernels; ++i)
    if (kKernels[i].kind == kind && kKernels[i].head_dim == head_dim) return i;
  return -1;
}
// The row named `name`; -1 where none is.
int find_kernel(const char* name);
const char* kind_name(KernelKind kind);

}  // namespace spattn::plan
