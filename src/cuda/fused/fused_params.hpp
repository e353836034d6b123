// cuda/fused/fused_params.hpp — what the fused block-sparse attention kernel receives (plain data, no CUDA
// headers, so host code of other layers can fill it).
#pragma once
#include <cstdint>

#include "cuda/common/tmap.hpp"  // TensorMapBytes
#include "cuda/fused/key_boxes.hpp"

namespace spattn::cuda::fused {

struct FusedParams {
  const void* q;  // [B, Lq, Hq, D]   (head dim contiguous; other strides free)
  const void* k;  // [B, Lk, Hkv, D]
  const void* v;  // [B, Lk, Hkv, D]
  void* o;        // [B, Lq, Hq, D]
  float* lse;     // [B, Hq, Lq] natural log, may be null
  int64_t q_sb, q_sl, q_sh;  // strides in elements
  int64_t k_sb, k_sl, k_sh;
  int64_t v_sb, v_sl, v_sh;
  int64_t o_sb, o_sl, o_sh;
  int64_t lse_sb, lse_sh;
  int batch, q_heads, group;  // group = Hq / Hkv
  int q_len, k_len;
  int perm_d, q_group, k_group;  // plan space (see plan/gpu/block_plan.hpp)
  // Mapped plan space (plan/gpu/block_plan.hpp; cp.async and mma.sync kernels only): plan position -> token, -1 for
  // padding ([q_tiles * BM], [k_tiles * BN], DevicePlan-owned). Null: the affine perm_d layout above. The kernels
  // read q_map (the Q tile, the epilogue's tokens); their key rows come from kb (below) and the entries.
  const int32_t* q_map;
  const int32_t* k_map;
  float scale_log2;              // softmax scale * log2(e)
  float scale;                   // softmax scale
  const int64_t* row_offsets;    // [q_tiles + 1]
  const int4* entries;           // TileEntry {kt, mask, lo, hi}
  const unsigned long long* masks;
  const int32_t* order;          // [q_tiles]
  int q_tiles;
  // Tensor maps of q, k, v ({D, L, H, B}, 64-element x rows boxes, 128-byte swizzle) for the warp-specialized
  // TMA kernel (LaunchParams::ws); unset otherwise.
  TensorMapBytes tmap_q, tmap_k, tmap_v;
  // The band kernel's output map (o's {D, L, H, B}, boxes of 64 x 64 rows, 128-byte swizzle): slabs are stored
  // from shared memory by bulk tensor copies. Also the TMA kernel's, for its epilogue (LaunchParams::o_map).
  TensorMapBytes tmap_o;
  int* work_counter;  // the TMA kernels' work-item counter and count of finished CTAs (DevicePlan-owned, zeroed
                      // once; each persistent launch leaves them zero: work_counter_done in fused_fwd.cuh)
  int persistent;     // TMA kernel: 1 = one CTA per SM drawing items from work_counter, 0 = one item a CTA
  int band_lo, band_hi;  // band kernel (LaunchParams::band): row q keeps band_lo <= k - q <= band_hi, k < Lk
  // Band kernel, split work items (FusedFwd::to_params): items from split_first on are each run as split_k parts
  // (contiguous ranges of the item's key chunks); part u = w - split_first writes its unnormalized O, row max and
  // row sum to split_ws (split_floats(D) a thread), and the last part of an item to arrive (split_count, per item and
  // warp, zero at launch; the merger zeroes it again) merges them and stores. split_k 1: no split.
  // split_slabs 1: the parts are the item's 64-row slabs instead (split_k = its slabs, part c runs slab c alone and
  // stores it; no workspace, no merge).
  int split_first, split_k, split_slabs;
  float* split_ws;
  int* split_count;
  // Builds with SPATTN_TRACE only (else null): the band kernel appends an event per (work item, consumer
  // warpgroup): trace[0] counts them, event i is trace[4 + 4i ...]: {item | c << 32 | smid << 40 | split slot
  // 13 & 0xffff << 48, start (after the item's Q tile), before the store, after the store} in globaltimer ns.
  unsigned long long* trace;
  // (Fields added after the kernels' measured versions go here, so that those kernels' parameter offsets, and with
  // them their code, stay as they were.)
  int band_shifted;  // band kernel: rows keep the W = band_hi - band_lo + 1 keys from clamp(q + band_lo, 0, Lk - W) on
  // Mapped plans' key boxes (key_boxes.hpp; set by FusedFwd::to_params): the kernels compute their key rows' tokens
  // from them and each entry's last two words instead of reading k_map.
  KeyBoxes kb;
  // Band kernel: every row also keeps the keys [0, band_prefix) (BlockPlan::band_prefix; 0: none); its chunks are
  // steps of every slab before the band's, whose chunks then start past them.
  int band_prefix;
  // Mapped plans with key strips (BlockPlan::key_strips; 64x64 tiles): 1 where each entry's last two words are a
  // strip's base token and strip_pack(W, count) (key_boxes.hpp) rather than a key box's; the token strides of one
  // step of the strips' outer and inner (last used) grid axes in a dilation group.
  int strips;
  int strip_sx, strip_sy;
  // The work order's head sections (plan::head_section; section_item in cuda/common/work_order.cuh): 0 none.
  int head_section;
  // cp.async and mma.sync kernels (FusedAttention::run's merge_out; issue 42): 1 where o and lse already hold another
  // part's rows over disjoint keys (a compound plan's band part): the epilogue merges this launch's rows into them
  // through the LSE (plan/merge.hpp) instead of writing them, and query tiles with no entry write nothing; 0 writes.
  int merge_out;
};

// Floats a consumer thread of the band kernel writes per split part at head dim d: its d / 2 O accumulators, 2 row
// maxima and 2 row sums; at most 12 consumer warps an item (three consumer warpgroups at d = 64, two at 128).
constexpr int split_floats(int d) { return d / 2 + 4; }
inline constexpr int kSplitWarps = 12;
// A split part's floats in the workspace: split_floats(d) a thread of each consumer warp of a band item of block_m
// rows (fused_fwd_band.cuh, split_merge: part u's warp w at (u * warps + w) * 32 * split_floats(d)).
constexpr int split_part_floats(int block_m, int d) { return block_m / 64 * 4 * 32 * split_floats(d); }
// Events a SPATTN_TRACE build records at most (FusedParams::trace); later ones are counted and dropped.
inline constexpr unsigned kTraceEvents = 1u << 20;

// TileEntry.kt as uploaded (DevicePlan): bits 0-27 the key tile, bits 28-29 `half` for 64x128 plans: 0 the
// whole tile, 1 (2) every kept key of this partial tile lies in keys 0-63 (64-127), so the sm_90a kernel
// loads and multiplies only that half. Other plans upload kt unchanged.
inline constexpr int kKtMask = (1 << 28) - 1;
inline constexpr int kHalfShift = 28;

// One launch: the kernel parameters plus the row of the kernel table (plan/kernels.hpp) that runs them.
struct LaunchParams {
  FusedParams kernel;
  int kernel_row = -1;  // plan::kKernels index: its kind, tile shape and head dim select the instantiation
  bool bf16 = true;
  unsigned grid = 0;
  // The TMA and band kernels: kernel.tmap_o holds o's map (boxes of 64 x 64 rows; FusedFwd::to_params). The TMA
  // kernel stores O through it; without it only 192-row tiles run on the TMA kernel (launch_ws: the threads' stores).
  bool o_map = false;
};

// Defined in kernels_sm90.cu / kernels_sm80.cu (CUDA files that include no C++20 header). Return
// cudaErrorInvalidConfiguration (as int) when no instantiation matches, else the launch's error code.
int launch_sm90(const LaunchParams& p, void* stream);
int launch_sm80(const LaunchParams& p, void* stream);

}  // namespace spattn::cuda::fused
