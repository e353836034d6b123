// Session s4 microbenchmark: gather of records (argv: records in the pass, lines per record, prefetch distance
// in keys, lines prefetched) from L2; ticks per record. g++ -O2 -mavx512f -mavx512vl; e.g. ./a.out 1366 8 16 1
// L2 gather floor: records of 512 B (8 lines) in a buffer of NK records; rows of ~68 sorted random keys.
#include <immintrin.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <random>
#include <x86intrin.h>
int main(int argc, char** argv) {
  const int NK = argc > 1 ? atoi(argv[1]) : 1366;  // records in the pass
  const int lines = argc > 2 ? atoi(argv[2]) : 8;   // lines per record touched
  const int pfd = argc > 3 ? atoi(argv[3]) : 0;     // prefetch distance in keys (0 none)
  const int pfl = argc > 4 ? atoi(argv[4]) : 1;     // lines prefetched per key
  const int rows = 256, per = 68;
  const int order = argc > 5 ? atoi(argv[5]) : 0;  // 0 ascending, 1 descending, 2 K asc then V desc, 3 interleaved 0,4,1,5..
  int ord[8]; for (int l = 0; l < 8; ++l) ord[l] = order == 0 ? l : order == 1 ? 7 - l : order == 2 ? (l < 4 ? l : 11 - l) : (l % 2 ? 4 + l / 2 : l / 2);
  float* buf; posix_memalign((void**)&buf, 2 << 20, size_t(NK) * 512 + (2 << 20));
  for (size_t i = 0; i < size_t(NK) * 128; ++i) buf[i] = float(i % 7);
  std::mt19937 rng(1);
  std::vector<int> keys(size_t(rows) * per + 64);
  for (int r = 0; r < rows; ++r) {
    std::vector<int> k(per);
    for (auto& x : k) x = rng() % NK;
    std::sort(k.begin(), k.end());
    std::copy(k.begin(), k.end(), keys.begin() + r * per);
  }
  __m512 acc = _mm512_setzero_ps(), acc2 = acc;
  double best = 1e30;
  for (int rep = 0; rep < 30; ++rep) {
    unsigned long long t0 = __rdtsc();
    const int n = rows * per;
    for (int j = 0; j < n; ++j) {
      const float* p = buf + size_t(keys[j]) * 128;
      if (pfd) { const float* pp = buf + size_t(keys[j + pfd]) * 128; for (int l = 0; l < pfl; ++l) _mm_prefetch((const char*)(pp + l * 16), _MM_HINT_T0); }
      __m512 s = _mm512_load_ps(p + ord[0] * 16);
      for (int l = 1; l < lines; ++l) s = _mm512_add_ps(s, _mm512_load_ps(p + ord[l] * 16));
      acc = _mm512_add_ps(acc, s);
    }
    unsigned long long t1 = __rdtsc();
    best = std::min(best, double(t1 - t0) / n);
  }
  printf("order %d NK %d lines %d pfd %d pfl %d: %.2f ticks/key (%.1f B/tick) %f\n", order, NK, lines, pfd, pfl, best, lines * 64 / best, _mm512_reduce_add_ps(acc));
}
