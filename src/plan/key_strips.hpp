// plan/key_strips.hpp — a key strip's slot -> token arithmetic (plain constexpr, no header: shared by the plan
// builder's k_map, the GPU kernels through cuda/fused/key_boxes.hpp, and the CPU tests).
#pragma once

namespace spattn::plan {

// Key strips (plan/gpu/block_plan.hpp, BlockPlan::strips): slot r (< 64) of a strip of width W (1 ... 64) and `count` token
// slots holds token base + (r / W) * sx + (r % W) * sy, padding from slot count on. DevicePlan uploads each strip
// entry with the base token and strip_pack(W, count) as its last two words; the kernels divide by W as
// (r * strip_inv(W)) >> kStripShift, exact for every r < 64 and W <= 64 (error r * (inv - 4096 / W) / 4096 < r / 4096
// < 1 / W, below the distance 1 / W from r / W to the next integer; tests/tile_map_test.cpp checks all of them).
inline constexpr int kStripShift = 12;
inline constexpr int strip_inv(int w) { return ((1 << kStripShift) + w - 1) / w; }
// W in bits 0-6, count in bits 7-13, strip_inv(W) (<= 4096) in bits 14-26.
inline constexpr int strip_pack(int w, int count) { return w | count << 7 | strip_inv(w) << 14; }
inline constexpr int strip_div(int r, int packed) { return (r * (packed >> 14)) >> kStripShift; }  // r / W
// Slot r's token, -1 for padding.
inline constexpr int strip_token(int base, int packed, int r, int sx, int sy) {
  const int x = strip_div(r, packed);
  return r < ((packed >> 7) & 127) ? base + x * sx + (r - x * (packed & 127)) * sy : -1;
}

}  // namespace spattn::plan
