// cuda/fused/strip_masks.hpp — a strip plan's bitmasks computed on the device (plan::BlockPlan::grid_windows), where the
// host would otherwise walk every row and upload them (na2d 128x128 K=13 at L = 16384: 1668 strips, 854 KB, about 1.6 ms
// on one host thread). Plain data, no CUDA header; defined in strip_masks.cu. Leaves its result ready in stream order.
#pragma once
#include <cstdint>

namespace spattn::cuda::fused {

// For each query tile qt < q_tiles and each of its entries i in [row_offsets[qt], row_offsets[qt + 1]) (n in all; device
// arrays of the uploaded plan: entries as int4 {kt, mask, strip base token, strip_pack(W, count)}, q_map the plan's):
// word r of bitmask entries[i].mask (64 words at masks + mask * 64) gets bit s set iff q_map[qt * 64 + r] is a token q,
// slot s is a token k (plan/key_strips.hpp, strip_token with sx, sy), and on every axis a of the right-aligned grid
// `dims` k's coordinate is start + j stride, 0 <= j < count, of windows' triple for q's coordinate (axis a's triples
// follow axis a - 1's: BlockPlan::grid_windows). Every word of every entry's bitmask is written.
int launch_grid_strip_masks(int64_t q_tiles, int64_t n, const int64_t* row_offsets, const int32_t* entries,
                            const int32_t* q_map, const int32_t* windows, const int64_t* dims, int sx, int sy, unsigned long long* masks,
                            void* stream);

}  // namespace spattn::cuda::fused
