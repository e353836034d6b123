// pattern/random_hash.hpp — the hash behind random(r, seed=x) (PATTERNS.md), for host and device code: the CPU rows
// (pattern/bound.cpp) and the rows drawn on the GPU (cuda/fused/random_rows.cu) share this one definition.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define SPATTN_RANDOM_HD __host__ __device__
#else
#define SPATTN_RANDOM_HD
#endif

namespace spattn::detail {

// PATTERNS.md's mix (splitmix64's finalizer).
inline constexpr uint64_t kMix1 = 0xBF58476D1CE4E5B9ull, kMix2 = 0x94D049BB133111EBull;
SPATTN_RANDOM_HD inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= kMix1;
  x ^= x >> 27;
  x *= kMix2;
  x ^= x >> 31;
  return x;
}
// h(seed, q, k) = mix(row_key + k) with row_key = mix(mix(seed) + q), fixed for a row.
SPATTN_RANDOM_HD inline uint64_t random_row_key(uint64_t seed, uint64_t q) { return mix64(mix64(seed) + q); }
// Floyd's draw for j (PATTERNS.md): h(seed, q, j) mod (j + 1); j + 1 <= Lk < 2^31, so it fits in 32 bits.
SPATTN_RANDOM_HD inline uint32_t random_draw(uint64_t row_key, uint64_t j) { return uint32_t(mix64(row_key + j) % (j + 1)); }

}  // namespace spattn::detail
