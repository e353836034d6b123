// pattern/random_draw.hpp — random's rows (bound.cpp, RandomB): Floyd's draws, then the keys of the row's set, then
// its intervals. Each step has a scalar path and an AVX-512 one picked at run time; they give the same results. The
// vector steps write whole vectors: buffers they fill need kSlack entries past the last one.
#pragma once
#include <cstddef>
#include <cstdint>

#include "spattn/pattern.hpp"

namespace spattn::detail {

inline constexpr size_t kSlack = 64;

// Whether the CPU has AVX-512 F and DQ (the vector draws' 64-bit multiplies and conversions).
bool have_avx512();
// t[i] = h(seed, q, j) mod (j + 1) for j = lo + i, i < n (a = mix(mix(seed) + q), fixed for the row).
void random_draws(uint64_t a, int64_t lo, int64_t n, uint32_t* t);
#if defined(__x86_64__) && defined(__GNUC__)
// The n draws (j = lo + i) of eight rows q0 .. q0 + 7 at once, draw i of row q0 + l at t[8 i + l] (have_avx512() only).
__attribute__((target("avx512f,avx512dq"))) void random_draws_rows_avx512(uint64_t seed, int64_t q0, int64_t lo, int64_t n,
                                                                          uint32_t* t);
#endif
// The set bits of bitmap b (words 64-bit words) as increasing indices written to out; clears b. Returns how many.
// sparse: few bits set (the vector path skips zero words).
int64_t bitmap_keys(uint64_t* b, int64_t words, int32_t* out, bool sparse);
// Sorted distinct keys k[0, n) as maximal intervals [first[i], last[i]], in increasing order; returns how many.
// k[-1] must be writable too (the vector path puts sentinels at k[-1] and k[n]).
int64_t key_spans_scalar(int32_t* k, int64_t n, int32_t* first, int32_t* last);
int64_t key_spans(int32_t* k, int64_t n, int32_t* first, int32_t* last);
// Intervals [first[i], last[i]], i < n, as runs {first, 1, last - first + 1}.
void span_runs(const int32_t* first, const int32_t* last, int64_t n, Run* out);

}  // namespace spattn::detail
