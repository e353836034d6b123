// cuda/fused/random_rows.hpp — random(r, seed) rows drawn on the device, where the host would otherwise draw them and
// upload the result (a random(820) plan's bitmasks at L = 16384 are 34 MB, drawn in ~8 ms and uploaded in ~4): each
// row by PATTERNS.md's Floyd sampling (pattern/random_hash.hpp, the CPU rows' definition), one thread a row, its keys a
// bitmap in shared memory (so k_len <= plan::kDrawMaxKeys). Plain data, no CUDA header; defined in random_rows.cu.
// Every launch requires plan::device_draws_random(r, q_len, k_len) (else it returns cudaErrorInvalidValue, launching
// nothing) and leaves its result ready in stream order.
#pragma once
#include <cstdint>

namespace spattn::cuda::fused {

// The bitmasks of a plan that visits every tile (plan::BlockPlan::drawn): tile (qt, kt) of q_tiles x k_tiles, block_m x
// block_n bits row-major at masks + (qt * k_tiles + kt) * block_m * block_n / 64, bit (r, c) set iff row qt * block_m + r
// keeps key kt * block_n + c; rows past q_len and keys past k_len zero. Every word written.
int launch_random_tile_masks(int64_t r, uint64_t seed, int64_t q_len, int64_t k_len, int block_m, int block_n,
                             unsigned long long* masks, void* stream);

// The rows less a band (a scattered part beside a tiles part of band rows): row q keeps its keys k outside
// band_lo <= k - q <= band_hi (band_lo > band_hi: every key). counts[q] = how many (q < q_len).
int launch_random_counts(int64_t r, uint64_t seed, int64_t q_len, int64_t k_len, int64_t band_lo, int64_t band_hi,
                         int32_t* counts, void* stream);
// offsets[0] = 0 and offsets[q + 1] = offsets[q] + counts[q] for q < q_len (device arrays; one CTA: the offsets of the
// rows above, made here instead of on the host, which cost a copy each way and a wait: bandrand's draw was 0.27 ms).
int launch_random_offsets(const int32_t* counts, int64_t q_len, int64_t* offsets, void* stream);
// A CSR of those rows, keys increasing: offsets_given, row q's at cols[offsets[q] ..) (offsets from the counts above);
// else (no band: band_lo > band_hi) offsets[q] = q r (q <= q_len) written too, row q's at cols[q r .. (q + 1) r).
// cols holds cols_len keys: given offsets that pass it (counts other than the draws'), those rows are not written.
int launch_random_csr(int64_t r, uint64_t seed, int64_t q_len, int64_t k_len, int64_t band_lo, int64_t band_hi,
                      bool offsets_given, int64_t* offsets, int32_t* cols, int64_t cols_len, void* stream);

}  // namespace spattn::cuda::fused
