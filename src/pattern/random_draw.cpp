// pattern/random_draw.cpp — random's rows: see random_draw.hpp.
#include "pattern/random_draw.hpp"

#include <algorithm>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "pattern/random_hash.hpp"

namespace spattn::detail {

#if defined(__x86_64__) && defined(__GNUC__)
bool have_avx512() {  // 64-bit multiplies and conversions (DQ)
  static const bool v = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  return v;
}
bool have_vbmi2() {  // byte compress
  static const bool v = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vbmi2");
  return v;
}
#endif

// Floyd's draws (PATTERNS.md): t[i] = h(seed, q, j) mod (j + 1) for j = lo + i, i < n. With a = mix(mix(seed)
// + q) fixed for the row, h = mix(a + j). They are independent of one another (only their insertion into the
// row's set is sequential); j + 1 <= Lk < 2^31, so t fits in 32 bits.
void random_draws_scalar(uint64_t a, int64_t lo, int64_t i0, int64_t n, uint32_t* t) {
  for (int64_t i = i0; i < n; ++i) {
    const uint64_t j = uint64_t(lo + i);
    t[i] = detail::random_draw(a, j);
  }
}
#if defined(__x86_64__) && defined(__GNUC__)
// x ^ (x >> n), eight lanes. Zero-masked forms (all lanes kept) here and below because GCC 12 warns on the
// plain ones' undefined source operand.
__attribute__((target("avx512f"))) inline __m512i xorshift(__m512i x, unsigned n) {
  return _mm512_xor_si512(x, _mm512_maskz_srli_epi64(0xFF, x, n));
}
// x mod d in eight lanes, exact, for d in [2, 2^31) (AVX-512 has no integer division). Two rounds of a
// double-precision quotient, rounded to nearest whatever MXCSR says. Round 1: x and 1/d are within 2^-53
// relative, so their product is within 3 * 2^-53 * x / d < 3 * 2^10 of x / d (x / d < 2^63), and
// r = x - trunc(.) * d, exact mod 2^64, is a signed value below 2^43 in magnitude (exact in a double).
// Round 2: r - round(r / d) * d lies in (-d, d) (the rounding error is far below 1); one correction each side
// makes it the remainder in [0, d).
__attribute__((target("avx512f,avx512dq"))) inline __m512i mod_avx512(__m512i x, __m512i d) {
  constexpr int kRn = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512d inv = _mm512_maskz_div_round_pd(0xFF, _mm512_set1_pd(1.0), _mm512_cvt_roundepi64_pd(d, kRn), kRn);
  const __m512d p1 = _mm512_maskz_mul_round_pd(0xFF, _mm512_cvt_roundepu64_pd(x, kRn), inv, kRn);
  __m512i r = _mm512_sub_epi64(x, _mm512_mullo_epi64(_mm512_cvtt_roundpd_epu64(p1, _MM_FROUND_NO_EXC), d));
  const __m512d p2 = _mm512_maskz_mul_round_pd(0xFF, _mm512_cvt_roundepi64_pd(r, kRn), inv, kRn);
  r = _mm512_sub_epi64(r, _mm512_mullo_epi64(_mm512_cvt_roundpd_epi64(p2, kRn), d));
  r = _mm512_mask_add_epi64(r, _mm512_cmplt_epi64_mask(r, _mm512_setzero_si512()), r, d);
  return _mm512_mask_sub_epi64(r, _mm512_cmpge_epi64_mask(r, d), r, d);
}
// mix64 (pattern/random_hash.hpp) in eight lanes.
__attribute__((target("avx512f,avx512dq"))) inline __m512i mix_avx512(__m512i x) {
  x = _mm512_mullo_epi64(xorshift(x, 30), _mm512_set1_epi64(int64_t(kMix1)));
  x = _mm512_mullo_epi64(xorshift(x, 27), _mm512_set1_epi64(int64_t(kMix2)));
  return xorshift(x, 31);
}
// Eight draws at a time.
__attribute__((target("avx512f,avx512dq"))) void random_draws_avx512(uint64_t a, int64_t lo, int64_t n, uint32_t* t) {
  const __m512i va = _mm512_set1_epi64(int64_t(a)), step = _mm512_set1_epi64(8), one = _mm512_set1_epi64(1);
  __m512i j = _mm512_add_epi64(_mm512_set1_epi64(lo), _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512i r = mod_avx512(mix_avx512(_mm512_add_epi64(va, j)), _mm512_add_epi64(j, one));
    j = _mm512_add_epi64(j, step);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(t + i), _mm512_maskz_cvtepi64_epi32(0xFF, r));
  }
  random_draws_scalar(a, lo, i, n, t);
}
// The n draws (j = lo + i, i < n) of eight rows q0 .. q0 + 7 at once, draw i of row q0 + l at t[8 i + l]: a lane a row,
// whose divisor j + 1 is the same in every lane (a few draws a row: one row's fill few lanes, and its scalar
// remainders are 64-bit divisions, 40 ns of local(256) | random(4)'s row).
__attribute__((target("avx512f,avx512dq"))) void random_draws_rows_avx512(uint64_t seed, int64_t q0, int64_t lo, int64_t n,
                                                                         uint32_t* t) {
  const __m512i q = _mm512_add_epi64(_mm512_set1_epi64(q0), _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
  const __m512i a = mix_avx512(_mm512_add_epi64(_mm512_set1_epi64(int64_t(detail::mix64(seed))), q));  // random_row_key
  for (int64_t i = 0; i < n; ++i) {
    const __m512i j = _mm512_set1_epi64(lo + i);
    const __m512i r = mod_avx512(mix_avx512(_mm512_add_epi64(a, j)), _mm512_set1_epi64(lo + i + 1));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(t + 8 * i), _mm512_maskz_cvtepi64_epi32(0xFF, r));
  }
}
#endif
void random_draws(uint64_t a, int64_t lo, int64_t n, uint32_t* t) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (have_avx512()) return random_draws_avx512(a, lo, n, t);
#endif
  random_draws_scalar(a, lo, 0, n, t);
}

// The set bits of bitmap b (words 64-bit words) as increasing indices written to out; clears b. Returns how
// many.
int64_t bitmap_keys_scalar(uint64_t* b, int64_t words, int32_t* out) {
  int64_t n = 0;
  for (int64_t w = 0; w < words; ++w) {
    for (uint64_t x = b[w]; x; x &= x - 1) out[n++] = int32_t(w * 64 + __builtin_ctzll(x));
    b[w] = 0;
  }
  return n;
}
#if defined(__x86_64__) && defined(__GNUC__)
// A word's set bit positions compressed as bytes and widened 16 at a time: no branch per bit, nor per word
// while words hold at most 16 keys (up to 64 entries written). Word x is word w of the bitmap; returns its keys.
__attribute__((target("avx512f,avx512bw,avx512vbmi2"))) inline int word_keys_avx512(uint64_t x, int64_t w, int32_t* out) {
  const __m512i iota = _mm512_set_epi8(63, 62, 61, 60, 59, 58, 57, 56, 55, 54, 53, 52, 51, 50, 49, 48, 47, 46, 45, 44, 43,
                                       42, 41, 40, 39, 38, 37, 36, 35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22,
                                       21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i base = _mm512_set1_epi32(int32_t(w * 64));
  const __m512i pos = _mm512_maskz_compress_epi8(x, iota);
  const int c = __builtin_popcountll(x);
  _mm512_storeu_si512(out, _mm512_add_epi32(base, _mm512_maskz_cvtepu8_epi32(0xFFFF, _mm512_maskz_extracti32x4_epi32(0xF, pos, 0))));
  if (c > 16) {
    _mm512_storeu_si512(out + 16, _mm512_add_epi32(base, _mm512_maskz_cvtepu8_epi32(0xFFFF, _mm512_maskz_extracti32x4_epi32(0xF, pos, 1))));
    _mm512_storeu_si512(out + 32, _mm512_add_epi32(base, _mm512_maskz_cvtepu8_epi32(0xFFFF, _mm512_maskz_extracti32x4_epi32(0xF, pos, 2))));
    _mm512_storeu_si512(out + 48, _mm512_add_epi32(base, _mm512_maskz_cvtepu8_epi32(0xFFFF, _mm512_maskz_extracti32x4_epi32(0xF, pos, 3))));
  }
  return c;
}
__attribute__((target("avx512f,avx512bw,avx512vbmi2"))) int64_t bitmap_keys_avx512(uint64_t* b, int64_t words, int32_t* out) {
  int64_t n = 0;
  for (int64_t w = 0; w < words; ++w) {
    n += word_keys_avx512(b[w], w, out + n);
    b[w] = 0;
  }
  return n;
}
// Sparse bitmaps (more words than keys: most words empty): eight words tested at a time, the nonzero ones taken.
__attribute__((target("avx512f,avx512bw,avx512vbmi2"))) int64_t bitmap_keys_sparse_avx512(uint64_t* b, int64_t words,
                                                                                         int32_t* out) {
  int64_t n = 0;
  for (int64_t g = 0; g < words; g += 8) {
    const __mmask8 valid = words - g >= 8 ? __mmask8(0xFF) : __mmask8((1u << (words - g)) - 1);
    const __m512i v = _mm512_maskz_loadu_epi64(valid, b + g);
    for (unsigned m = _mm512_test_epi64_mask(v, v); m; m &= m - 1) {
      const int64_t w = g + __builtin_ctz(m);
      n += word_keys_avx512(b[w], w, out + n);
      b[w] = 0;
    }
  }
  return n;
}
#endif
// sparse: most words are expected empty (fewer keys than words).
int64_t bitmap_keys(uint64_t* b, int64_t words, int32_t* out, bool sparse) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (have_vbmi2()) return sparse ? bitmap_keys_sparse_avx512(b, words, out) : bitmap_keys_avx512(b, words, out);
#endif
  return bitmap_keys_scalar(b, words, out);
}

// Sorted distinct keys k[0, n) as maximal intervals [first[i], last[i]], in increasing order; returns how many.
// k[-1] must be writable too (the vector path puts sentinels at k[-1] and k[n]).
int64_t key_spans_scalar(int32_t* k, int64_t n, int32_t* first, int32_t* last) {
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i == 0 || k[i] != k[i - 1] + 1) first[m++] = k[i];
    last[m - 1] = k[i];
  }
  return m;
}
#if defined(__x86_64__) && defined(__GNUC__)
// Sixteen keys at a time against their neighbours: starts and ends of intervals are compressed out, so there
// is no chain from key to key (up to k[n + 15] is read).
__attribute__((target("avx512f"))) int64_t key_spans_avx512(int32_t* k, int64_t n, int32_t* first, int32_t* last) {
  k[-1] = -2;  // neither continues the first key nor ...
  k[n] = -1;   // ... is continued by the last one
  const __m512i one = _mm512_set1_epi32(1);
  int64_t nf = 0, nl = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 valid = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    const __m512i x = _mm512_loadu_si512(k + i), prev = _mm512_loadu_si512(k + i - 1), next = _mm512_loadu_si512(k + i + 1);
    const __mmask16 s = _mm512_mask_cmpneq_epi32_mask(valid, x, _mm512_add_epi32(prev, one));
    const __mmask16 e = _mm512_mask_cmpneq_epi32_mask(valid, next, _mm512_add_epi32(x, one));
    _mm512_storeu_si512(first + nf, _mm512_maskz_compress_epi32(s, x));
    _mm512_storeu_si512(last + nl, _mm512_maskz_compress_epi32(e, x));
    nf += __builtin_popcount(s);
    nl += __builtin_popcount(e);
  }
  return nf;
}
#endif
int64_t key_spans(int32_t* k, int64_t n, int32_t* first, int32_t* last) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (have_avx512()) return key_spans_avx512(k, n, first, last);
#endif
  return key_spans_scalar(k, n, first, last);
}

// Intervals [first[i], last[i]], i < n, as runs {first, 1, last - first + 1}.
void span_runs_scalar(const int32_t* first, const int32_t* last, int64_t i0, int64_t n, Run* out) {
  for (int64_t i = i0; i < n; ++i) out[i] = {first[i], 1, last[i] - first[i] + 1};
}
#if defined(__x86_64__) && defined(__GNUC__)
// Eight runs (24 int64) at a time: starts and counts interleaved by two-source permutes, strides blended in.
__attribute__((target("avx512f"))) void span_runs_avx512(const int32_t* first, const int32_t* last, int64_t n, Run* out) {
  static_assert(sizeof(Run) == 3 * sizeof(int64_t));
  const __m512i one = _mm512_set1_epi64(1);
  // Lane sources: 0-7 the starts, 8-15 the counts; the strides (1) are blended in at the masked lanes.
  const __m512i p0 = _mm512_setr_epi64(0, 0, 8, 1, 1, 9, 2, 2), p1 = _mm512_setr_epi64(10, 3, 3, 11, 4, 4, 12, 5),
                p2 = _mm512_setr_epi64(5, 13, 6, 6, 14, 7, 7, 15);
  int64_t* o = reinterpret_cast<int64_t*>(out);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8, o += 24) {
    const __m512i f = _mm512_maskz_cvtepi32_epi64(0xFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(first + i)));
    const __m512i l = _mm512_maskz_cvtepi32_epi64(0xFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(last + i)));
    const __m512i c = _mm512_add_epi64(_mm512_sub_epi64(l, f), one);
    _mm512_storeu_si512(o, _mm512_mask_mov_epi64(_mm512_permutex2var_epi64(f, p0, c), 0x92, one));
    _mm512_storeu_si512(o + 8, _mm512_mask_mov_epi64(_mm512_permutex2var_epi64(f, p1, c), 0x24, one));
    _mm512_storeu_si512(o + 16, _mm512_mask_mov_epi64(_mm512_permutex2var_epi64(f, p2, c), 0x49, one));
  }
  span_runs_scalar(first, last, i, n, out);
}
#endif
void span_runs(const int32_t* first, const int32_t* last, int64_t n, Run* out) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (have_avx512()) return span_runs_avx512(first, last, n, out);
#endif
  span_runs_scalar(first, last, 0, n, out);
}

}  // namespace spattn::detail
