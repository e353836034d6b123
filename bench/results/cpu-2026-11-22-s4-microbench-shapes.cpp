// Session s4 microbenchmark (bench/results/README.md): 512-byte K+V records of a 683 KiB key pass (L2), rows of
// 68 sorted random keys; ticks (TSC) per record for several loop shapes (see the mode comments).
// Build: g++ -O2 -std=c++17 -mavx512f -mavx512vl cpu-2026-11-22-s4-microbench-shapes.cpp; run pinned: taskset -c 0 ./a.out
// gather of 512 B records (K 4 lines + V 4 lines) from an L2-resident pass, with increasing compute per record
#include <immintrin.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <random>
#include <x86intrin.h>
// 2^x as the kernel's exp2v: clamp, round-to-nearest split, degree-7 polynomial, exponent bits.
static inline __m512 exp2_poly(__m512 x0) {
  const __m512 x = _mm512_min_ps(_mm512_max_ps(x0, _mm512_set1_ps(-125.f)), _mm512_set1_ps(128.f));
  const __m512 magic = _mm512_set1_ps(12582912.f);
  const __m512 t = _mm512_add_ps(x, magic);
  const __m512 f = _mm512_sub_ps(x, _mm512_sub_ps(t, magic));
  __m512 e = _mm512_set1_ps(1.5252733804059840e-5f);
  e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(1.5403530393381608e-4f));
  e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(1.3333558146428443e-3f));
  e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(9.6181291076284772e-3f));
  e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(5.5504108664821580e-2f));
  e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(2.4022650695910071e-1f));
  e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(6.9314718055994531e-1f));
  e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(1.0f));
  return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(e), _mm512_slli_epi32(_mm512_sub_epi32(_mm512_castps_si512(t), _mm512_castps_si512(magic)), 23)));
}
template <int mode> double run() {
  const int NK = 1366, rows = 256, per = 68;
  float* buf; posix_memalign((void**)&buf, 2 << 20, size_t(NK) * 512 + (2 << 20));
  for (size_t i = 0; i < size_t(NK) * 128; ++i) buf[i] = float(i % 7) * 0.01f;
  std::mt19937 rng(1);
  std::vector<int> keys(size_t(rows) * per + 64);
  for (int r = 0; r < rows; ++r) { std::vector<int> k(per); for (auto& x : k) x = rng() % NK; std::sort(k.begin(), k.end()); std::copy(k.begin(), k.end(), keys.begin() + r * per); }
  __m512 q0 = _mm512_set1_ps(0.1f), q1 = _mm512_set1_ps(0.2f), q2 = _mm512_set1_ps(0.3f), q3 = _mm512_set1_ps(0.4f);
  __m512 o0 = _mm512_setzero_ps(), o1 = o0, o2 = o0, o3 = o0, acc = o0;
  double best = 1e30;
  const int n = rows * per;
  for (int rep = 0; rep < 30; ++rep) {
    unsigned long long t0 = __rdtsc();
    if constexpr (mode == 40 || mode == 41) {  // record by record: dot, allsum, exp2, lazy check, PV
      const __m512 mref = _mm512_set1_ps(0.f);
      __m512 lsum = _mm512_setzero_ps();
      for (int j = 0; j < n; ++j) {
        const float* p = buf + size_t(keys[j]) * 128;
        _mm_prefetch((const char*)(buf + size_t(keys[j + 16]) * 128), _MM_HINT_T0);
        __m512 d = _mm512_mul_ps(q0, _mm512_load_ps(p));
        d = _mm512_fmadd_ps(q1, _mm512_load_ps(p + 16), d);
        d = _mm512_fmadd_ps(q2, _mm512_load_ps(p + 32), d);
        d = _mm512_fmadd_ps(q3, _mm512_load_ps(p + 48), d);
        d = _mm512_add_ps(d, _mm512_shuffle_f32x4(d, d, 0x4e));
        d = _mm512_add_ps(d, _mm512_shuffle_f32x4(d, d, 0xb1));
        d = _mm512_add_ps(d, _mm512_shuffle_ps(d, d, 0x4e));
        d = _mm512_add_ps(d, _mm512_shuffle_ps(d, d, 0xb1));
        if constexpr (mode == 41) {
          if (_mm512_cmp_ps_mask(d, _mm512_set1_ps(1e30f), _CMP_GT_OQ)) o0 = _mm512_mul_ps(o0, d);  // never taken
        }
        const __m512 pv = exp2_poly(_mm512_sub_ps(d, mref));
        lsum = _mm512_add_ps(lsum, pv);
        o0 = _mm512_fmadd_ps(pv, _mm512_load_ps(p + 64), o0);
        o1 = _mm512_fmadd_ps(pv, _mm512_load_ps(p + 80), o1);
        o2 = _mm512_fmadd_ps(pv, _mm512_load_ps(p + 96), o2);
        o3 = _mm512_fmadd_ps(pv, _mm512_load_ps(p + 112), o3);
      }
      acc = _mm512_add_ps(acc, lsum);
    } else if constexpr (mode >= 10) {  // groups of G = mode - 10 keys: G dots, then the G keys' PV
      constexpr int G = mode - 10;
      for (int j0 = 0; j0 + G <= n; j0 += G) {
        __m512 d[G];
        for (int g = 0; g < G; ++g) {
          const float* p = buf + size_t(keys[j0 + g]) * 128;
          _mm_prefetch((const char*)(buf + size_t(keys[j0 + g + 16]) * 128), _MM_HINT_T0);
          __m512 x = _mm512_mul_ps(q0, _mm512_load_ps(p));
          x = _mm512_fmadd_ps(q1, _mm512_load_ps(p + 16), x);
          x = _mm512_fmadd_ps(q2, _mm512_load_ps(p + 32), x);
          d[g] = _mm512_fmadd_ps(q3, _mm512_load_ps(p + 48), x);
        }
        for (int g = 0; g < G; ++g) {
          const float* p = buf + size_t(keys[j0 + g]) * 128 + 64;
          const __m512 pv = _mm512_shuffle_f32x4(d[g], d[g], 0);
          acc = _mm512_add_ps(acc, d[g]);
          o0 = _mm512_fmadd_ps(pv, _mm512_load_ps(p), o0);
          o1 = _mm512_fmadd_ps(pv, _mm512_load_ps(p + 16), o1);
          o2 = _mm512_fmadd_ps(pv, _mm512_load_ps(p + 32), o2);
          o3 = _mm512_fmadd_ps(pv, _mm512_load_ps(p + 48), o3);
        }
      }
    } else if constexpr (mode >= 3) {
      alignas(64) float sb[128 + 16];
      for (int r = 0; r < rows; ++r) {
        const int* kb = keys.data() + r * per;
        auto dotchunk = [&](int pos) {
          __m512 part[16];
          for (int jj = 0; jj < 16; ++jj) {
            if (pos + 16 < per) _mm_prefetch((const char*)(buf + size_t(kb[pos + 16 + jj]) * 128), _MM_HINT_T0);
            if constexpr (mode >= 5) _mm_prefetch((const char*)(buf + size_t(kb[pos + jj]) * 128 + 64), _MM_HINT_T0);
            if constexpr (mode == 7) _mm_prefetch((const char*)(buf + size_t(kb[pos + jj]) * 128 + 96), _MM_HINT_T0);
            const float* p = buf + size_t(kb[pos + jj]) * 128;
            __m512 d = _mm512_mul_ps(q0, _mm512_load_ps(p));
            d = _mm512_fmadd_ps(q1, _mm512_load_ps(p + 16), d);
            d = _mm512_fmadd_ps(q2, _mm512_load_ps(p + 32), d);
            part[jj] = _mm512_fmadd_ps(q3, _mm512_load_ps(p + 48), d);
          }
          // transpose-add (simple: 4 levels via reduce per lane is too slow; use pairwise shuffles)
          for (int bs = 16; bs > 1; bs /= 2)
            for (int i = 0; i < bs / 2; ++i) {
              __m512 x = part[2 * i], y = part[2 * i + 1];
              __m512 lo, hi;
              if (bs == 16) { lo = _mm512_shuffle_f32x4(x, y, 0x44); hi = _mm512_shuffle_f32x4(x, y, 0xee); }
              else if (bs == 8) { lo = _mm512_shuffle_f32x4(x, y, 0x88); hi = _mm512_shuffle_f32x4(x, y, 0xdd); }
              else if (bs == 4) { lo = _mm512_shuffle_ps(x, y, 0x44); hi = _mm512_shuffle_ps(x, y, 0xee); }
              else { lo = _mm512_shuffle_ps(x, y, 0x88); hi = _mm512_shuffle_ps(x, y, 0xdd); }
              part[i] = _mm512_add_ps(lo, hi);
            }
          return part[0];
        };
        auto pvkey = [&](int j) {
          const float* p = buf + size_t(kb[j]) * 128 + 64;
          const __m512 pv = _mm512_set1_ps(sb[j] * 1e-3f);
          o0 = _mm512_fmadd_ps(pv, _mm512_load_ps(p), o0);
          o1 = _mm512_fmadd_ps(pv, _mm512_load_ps(p + 16), o1);
          o2 = _mm512_fmadd_ps(pv, _mm512_load_ps(p + 32), o2);
          o3 = _mm512_fmadd_ps(pv, _mm512_load_ps(p + 48), o3);
        };
        if constexpr (mode == 8 || mode == 9) {  // pipe without V prefetch: chunk c's dots -> sb; chunk c-1's PV
          int prev = -1;
          for (int pos = 0; pos < per; pos += 16) {
            __m512 sc = dotchunk(pos);
            if constexpr (mode == 9) sc = _mm512_max_ps(sc, _mm512_set1_ps(-1e30f));
            _mm512_store_ps(sb + pos, sc);
            if (prev >= 0) for (int j = prev; j < prev + 16; ++j) pvkey(j);
            prev = pos;
          }
          for (int j = prev; j < per; ++j) pvkey(j);
        } else if constexpr (mode == 5 || mode == 7) {  // pipe: chunk c's dots (V_c prefetched), then chunk c-1's PV
          int prev = -1;
          for (int pos = 0; pos < per; pos += 16) {
            _mm512_store_ps(sb + pos, dotchunk(pos));
            if (prev >= 0) for (int j = prev; j < prev + 16; ++j) pvkey(j);
            prev = pos;
          }
          for (int j = prev; j < per; ++j) pvkey(j);
        } else if constexpr (mode == 30 || mode == 31 || mode == 32) {  // chunk c's dots, then chunk c's PV with p broadcast from the register
          for (int pos = 0; pos < per; pos += 16) {
            __m512 sc = _mm512_mul_ps(dotchunk(pos), _mm512_set1_ps(1e-3f));
            if constexpr (mode >= 31) {  // lazy check (never taken) and exp2 of the chunk
              if (_mm512_cmp_ps_mask(sc, _mm512_set1_ps(1e30f), _CMP_GT_OQ)) o0 = _mm512_mul_ps(o0, sc);
              sc = exp2_poly(sc);
              acc = _mm512_add_ps(acc, sc);
            }
            if constexpr (mode == 32) {  // V of the next chunk's keys: first line
              if (pos + 16 < per) for (int jj = 0; jj < 16; ++jj) _mm_prefetch((const char*)(buf + size_t(kb[pos + 16 + jj]) * 128 + 64), _MM_HINT_T0);
            }
            for (int j = pos; j < std::min(per, pos + 16); ++j) {
              const float* p = buf + size_t(kb[j]) * 128 + 64;
              const __m512 pv = _mm512_permutexvar_ps(_mm512_set1_epi32(j - pos), sc);
              o0 = _mm512_fmadd_ps(pv, _mm512_load_ps(p), o0);
              o1 = _mm512_fmadd_ps(pv, _mm512_load_ps(p + 16), o1);
              o2 = _mm512_fmadd_ps(pv, _mm512_load_ps(p + 32), o2);
              o3 = _mm512_fmadd_ps(pv, _mm512_load_ps(p + 48), o3);
            }
          }
        } else if constexpr (mode == 3 || mode == 6) {  // chunk c's dots, then chunk c's PV
          for (int pos = 0; pos < per; pos += 16) {
            _mm512_store_ps(sb + pos, dotchunk(pos));
            for (int j = pos; j < std::min(per, pos + 16); ++j) pvkey(j);
          }
        } else {  // mode 4: all dots of the row, then all PV (with V prefetch 16 ahead)
          for (int pos = 0; pos < per; pos += 16) _mm512_store_ps(sb + pos, dotchunk(pos));
          for (int j = 0; j < 16; ++j) _mm_prefetch((const char*)(buf + size_t(kb[j]) * 128 + 64), _MM_HINT_T0);
          for (int j = 0; j < per; ++j) {
            if (j + 16 < per) _mm_prefetch((const char*)(buf + size_t(kb[j + 16]) * 128 + 64), _MM_HINT_T0);
            pvkey(j);
          }
        }
      }
    } else
    for (int j = 0; j < n; ++j) {
      const float* p = buf + size_t(keys[j]) * 128;
      _mm_prefetch((const char*)(buf + size_t(keys[j + 16]) * 128), _MM_HINT_T0);
      if constexpr (mode == 0) {  // loads only
        __m512 s = _mm512_load_ps(p);
        for (int l = 1; l < 8; ++l) s = _mm512_add_ps(s, _mm512_load_ps(p + l * 16));
        acc = _mm512_add_ps(acc, s);
      } else {  // dot with K (4 FMA) -> scalar-ish p via reduce, then p * V (4 FMA)
        __m512 d = _mm512_mul_ps(q0, _mm512_load_ps(p));
        d = _mm512_fmadd_ps(q1, _mm512_load_ps(p + 16), d);
        d = _mm512_fmadd_ps(q2, _mm512_load_ps(p + 32), d);
        d = _mm512_fmadd_ps(q3, _mm512_load_ps(p + 48), d);
        __m512 pv;
        if constexpr (mode == 1) pv = _mm512_set1_ps(0.5f); else pv = _mm512_shuffle_f32x4(d, d, 0);  // mode 2: p depends on the dot product
        acc = _mm512_add_ps(acc, d);
        o0 = _mm512_fmadd_ps(pv, _mm512_load_ps(p + 64), o0);
        o1 = _mm512_fmadd_ps(pv, _mm512_load_ps(p + 80), o1);
        o2 = _mm512_fmadd_ps(pv, _mm512_load_ps(p + 96), o2);
        o3 = _mm512_fmadd_ps(pv, _mm512_load_ps(p + 112), o3);
      }
    }
    unsigned long long t1 = __rdtsc();
    best = std::min(best, double(t1 - t0) / n);
  }
  acc = _mm512_add_ps(acc, _mm512_add_ps(_mm512_add_ps(o0, o1), _mm512_add_ps(o2, o3)));
  printf("mode %d: %.2f ticks/record %f\n", mode, best, _mm512_reduce_add_ps(acc));
  free(buf);
  return best;
}
int main() { for (int r = 0; r < 2; ++r) { run<2>(); run<11>(); run<12>(); run<14>(); run<18>(); run<26>(); run<3>(); run<30>(); run<31>(); run<32>(); run<4>(); run<8>(); run<5>(); run<40>(); } }
