// cuda/fused/key_boxes.hpp — a mapped plan's key rows without the map (plain data and constexpr arithmetic, shared by
// the kernels, the host code that sets them up, and the CPU tests that check them against the map).
//
// Key tiles of a mapped plan are boxes of the token grid (plan/tile_map.hpp; sides powers of two, volume 64 or 128).
// Row r of a key box has offsets o2 = r & mask2, o1 = (r >> shift1) & mask1, o0 = r >> shift0 in it; its token is
// the box's base + o0 stride0 + o1 stride1 + o2 stride2 (GridTiling::boxes, token_stride), and it is padding unless
// o[a] < extent[a] on every axis. DevicePlan uploads each entry of a mapped plan with its key box's base and
// box_limits(extents) as the last two words (mapped plans have no band entries, whose words those are), so a tile's
// rows cost register arithmetic instead of one dependent load of the map a row.
//
// The padding test is one subtraction, an and and a compare: box_limits packs extent + 255 per axis in 10-bit
// fields, box_pack the offsets; an offset o < 128 leaves each field in [129, 383] (no borrow between fields) with
// bit 8 set iff o < extent, so a row is inside iff (limits - pack) & kBoxInside == kBoxInside.
#pragma once
#include <cstdint>

#include "plan/key_strips.hpp"  // plain constexpr arithmetic (no C++ library header)

namespace spattn::cuda::fused {

struct KeyBoxes {
  int shift0, shift1, mask1, mask2, stride0, stride1, stride2;
  // The token offset and packed offsets of rows 8i (i < 16): a thread's rows lie 8, 16 or 32 apart and split into bit
  // fields that do not overlap with its first row's (below 8, 16, 32), so a row's values are its first row's plus
  // one of these (constant operands in the kernels' row loops).
  int off8[16], pack8[16];
};

inline constexpr int kBoxInside = (1 << 8) | (1 << 18) | (1 << 28);
inline constexpr int box_limits(int extent0, int extent1, int extent2) {
  return ((extent0 + 255) << 20) | ((extent1 + 255) << 10) | (extent2 + 255);
}
inline constexpr int box_pack(int o0, int o1, int o2) { return (o0 << 20) | (o1 << 10) | o2; }

// Row r of a key box: its token offset from the box's base and its packed offsets.
struct BoxRow {
  int off, pack;
};
inline constexpr BoxRow box_row(const KeyBoxes& kb, int r) {
  const int o0 = r >> kb.shift0, o1 = (r >> kb.shift1) & kb.mask1, o2 = r & kb.mask2;
  return {o0 * kb.stride0 + o1 * kb.stride1 + o2 * kb.stride2, box_pack(o0, o1, o2)};
}

// The KeyBoxes of boxes with sides side[0..2] (powers of two, volume <= 128; right-aligned axes) whose offsets step
// tokens by stride[0..2] (GridTiling::token_stride).
inline constexpr KeyBoxes key_boxes(const int (&side)[3], const int64_t (&stride)[3]) {
  int lg[3] = {0, 0, 0};
  for (int a = 0; a < 3; ++a)
    while ((1 << lg[a]) < side[a]) ++lg[a];
  KeyBoxes kb{};
  kb.shift1 = lg[2];
  kb.shift0 = lg[1] + lg[2];
  kb.mask1 = side[1] - 1;
  kb.mask2 = side[2] - 1;
  kb.stride0 = int(stride[0]);
  kb.stride1 = int(stride[1]);
  kb.stride2 = int(stride[2]);
  for (int i = 0; i < 16; ++i) {
    const BoxRow r = box_row(kb, 8 * i);
    kb.off8[i] = r.off;
    kb.pack8[i] = r.pack;
  }
  return kb;
}

// Key strips (plan/gpu/block_plan.hpp, BlockPlan::strips): the slot -> token arithmetic lives in plan/key_strips.hpp (the
// plan builds its k_map with it, and plan/ may not include cuda/), shared here by name with the kernels and the tests.
using ::spattn::plan::kStripShift;
using ::spattn::plan::strip_div;
using ::spattn::plan::strip_inv;
using ::spattn::plan::strip_pack;
using ::spattn::plan::strip_token;

}  // namespace spattn::cuda::fused
