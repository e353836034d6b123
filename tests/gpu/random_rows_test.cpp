// tests/gpu/random_rows_test.cpp — random(r) rows drawn on the device (cuda/fused/random_rows.hpp) against the rows the
// pattern gives on the host (BoundPattern::row_keys, PATTERNS.md's sampling): tile bitmasks (every word written,
// padding rows and keys zero) and CSR, ragged lengths, every tile shape, r from 1 to Lk - 1, and rows too long for 32
// bitmaps in a CTA (fewer rows a CTA, then one, past 48 KiB of shared memory); the compound plan's drawn scattered part.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/fused/random_rows.hpp"
#include "gpu/plan_run.hpp"
#include "gpu/require_gpu.hpp"
#include "spattn/pattern.hpp"
#include "spattn/plan.hpp"

namespace {

using spattn::cuda::fused::launch_random_counts;
using spattn::cuda::fused::launch_random_csr;
using spattn::cuda::fused::launch_random_offsets;
using spattn::cuda::fused::launch_random_tile_masks;

struct Dev {
  void* p = nullptr;
  explicit Dev(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes ? bytes : 1), cudaSuccess); }
  ~Dev() { cudaFree(p); }
};

struct C {
  int64_t r, q_len, k_len;
  uint64_t seed;
  int bm, bn;
};
const C kCases[] = {
    {51, 1023, 1023, 0, 192, 128}, {5, 100, 777, 7, 64, 64},      {1, 130, 2, 3, 128, 128},
    {63, 300, 64, 9, 64, 128},     {700, 257, 1000, 1, 128, 64},  {999, 65, 1000, 2, 192, 128},
    {10, 70, 100000, 11, 64, 128},  // 1563 words a row: 4 rows a CTA
    {3, 5, 600000, 12, 192, 64},    // 9375 words: one row a CTA, 75 KiB of shared memory
};

TEST(RandomRows, TileMasksMatchHostRows) {
  REQUIRE_GPU();
  for (const C& c : kCases) {
    SCOPED_TRACE("random(" + std::to_string(c.r) + ", seed=" + std::to_string(c.seed) + ") " + std::to_string(c.q_len) +
                 "x" + std::to_string(c.k_len) + " tiles " + std::to_string(c.bm) + "x" + std::to_string(c.bn));
    const auto pat = spattn::parse("random(" + std::to_string(c.r) + ", seed=" + std::to_string(c.seed) + ")").bind(c.q_len, c.k_len);
    const int64_t qt = (c.q_len + c.bm - 1) / c.bm, kt = (c.k_len + c.bn - 1) / c.bn, rw = c.bn / 64;
    const int64_t tile_words = c.bm * rw, n = qt * kt * tile_words;
    std::vector<uint64_t> want(static_cast<size_t>(n), 0), got(static_cast<size_t>(n));
    std::vector<int64_t> keys;
    for (int64_t q = 0; q < c.q_len; ++q) {
      pat.row_keys(q, keys);
      ASSERT_EQ(int64_t(keys.size()), c.r);
      for (int64_t k : keys)
        want[size_t(((q / c.bm) * kt + k / c.bn) * tile_words + (q % c.bm) * rw + (k % c.bn) / 64)] |= uint64_t(1) << (k % 64);
    }
    Dev d(size_t(n) * 8);
    ASSERT_EQ(cudaMemset(d.p, 0xAB, size_t(n) * 8), cudaSuccess);  // poison: an unwritten word differs
    ASSERT_EQ(launch_random_tile_masks(c.r, c.seed, c.q_len, c.k_len, c.bm, c.bn, static_cast<unsigned long long*>(d.p), nullptr), 0);
    ASSERT_EQ(cudaMemcpy(got.data(), d.p, size_t(n) * 8, cudaMemcpyDeviceToHost), cudaSuccess);
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; ++i)
      if (got[size_t(i)] != want[size_t(i)] && bad++ == 0) first = i;
    EXPECT_EQ(bad, 0) << "words differ, the first at " << first;
  }
}

TEST(RandomRows, CsrMatchesHostRows) {
  REQUIRE_GPU();
  for (const C& c : kCases) {
    SCOPED_TRACE("random(" + std::to_string(c.r) + ") " + std::to_string(c.q_len) + "x" + std::to_string(c.k_len));
    const auto pat = spattn::parse("random(" + std::to_string(c.r) + ", seed=" + std::to_string(c.seed) + ")").bind(c.q_len, c.k_len);
    Dev doff(size_t(c.q_len + 1) * 8), dcols(size_t(c.q_len * c.r) * 4);
    ASSERT_EQ(cudaMemset(doff.p, 0xAB, size_t(c.q_len + 1) * 8), cudaSuccess);
    ASSERT_EQ(launch_random_csr(c.r, c.seed, c.q_len, c.k_len, 1, 0, false, static_cast<int64_t*>(doff.p),
                                static_cast<int32_t*>(dcols.p), c.q_len * c.r, nullptr),
              0);
    std::vector<int64_t> off(size_t(c.q_len + 1));
    std::vector<int32_t> cols(size_t(c.q_len * c.r));
    ASSERT_EQ(cudaMemcpy(off.data(), doff.p, off.size() * 8, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(cols.data(), dcols.p, cols.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<int64_t> keys;
    int64_t bad_rows = 0;
    for (int64_t q = 0; q <= c.q_len; ++q) ASSERT_EQ(off[size_t(q)], q * c.r) << "offset of row " << q;
    for (int64_t q = 0; q < c.q_len; ++q) {
      pat.row_keys(q, keys);
      bool same = int64_t(keys.size()) == c.r;
      for (int64_t i = 0; same && i < c.r; ++i) same = keys[size_t(i)] == cols[size_t(q * c.r + i)];
      bad_rows += !same;
    }
    EXPECT_EQ(bad_rows, 0);
  }
}

// Rows less a band (a scattered part beside band rows): counts, then the keys at offsets made from them.
TEST(RandomRows, CsrLessABandMatchesHostRows) {
  REQUIRE_GPU();
  struct B {
    C c;
    int64_t lo, hi;
  } const cases[] = {{kCases[0], -64, 64}, {kCases[1], -700, 0}, {kCases[4], -3, 500}, {kCases[5], 0, 0},
                     {kCases[6], -50000, 50000}, {kCases[2], -1, 1}};
  for (const B& b : cases) {
    const C& c = b.c;
    SCOPED_TRACE("random(" + std::to_string(c.r) + ") " + std::to_string(c.q_len) + "x" + std::to_string(c.k_len) +
                 " less [" + std::to_string(b.lo) + ", " + std::to_string(b.hi) + "]");
    const auto pat = spattn::parse("random(" + std::to_string(c.r) + ", seed=" + std::to_string(c.seed) + ")").bind(c.q_len, c.k_len);
    std::vector<int64_t> off(size_t(c.q_len + 1), 0), keys;
    std::vector<int32_t> want;
    for (int64_t q = 0; q < c.q_len; ++q) {
      pat.row_keys(q, keys);
      for (int64_t k : keys)
        if (k - q < b.lo || k - q > b.hi) want.push_back(int32_t(k));
      off[size_t(q + 1)] = int64_t(want.size());
    }
    Dev dn(size_t(c.q_len) * 4), doff(off.size() * 8), dcols(want.size() * 4 + 4);
    ASSERT_EQ(launch_random_counts(c.r, c.seed, c.q_len, c.k_len, b.lo, b.hi, static_cast<int32_t*>(dn.p), nullptr), 0);
    std::vector<int32_t> n(size_t(c.q_len));
    ASSERT_EQ(cudaMemcpy(n.data(), dn.p, n.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    int64_t bad = 0;
    for (int64_t q = 0; q < c.q_len; ++q) bad += n[size_t(q)] != off[size_t(q + 1)] - off[size_t(q)];
    EXPECT_EQ(bad, 0) << "rows counted wrong";
    // The offsets from the counts, made on the device (poisoned first), are the host's.
    ASSERT_EQ(cudaMemset(doff.p, 0xAB, off.size() * 8), cudaSuccess);
    ASSERT_EQ(launch_random_offsets(static_cast<int32_t*>(dn.p), c.q_len, static_cast<int64_t*>(doff.p), nullptr), 0);
    std::vector<int64_t> got_off(off.size());
    ASSERT_EQ(cudaMemcpy(got_off.data(), doff.p, off.size() * 8, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_TRUE(got_off == off) << "offsets differ";
    ASSERT_EQ(launch_random_csr(c.r, c.seed, c.q_len, c.k_len, b.lo, b.hi, true, static_cast<int64_t*>(doff.p),
                                static_cast<int32_t*>(dcols.p), int64_t(want.size()), nullptr),
              0);
    std::vector<int32_t> got(want.size());
    ASSERT_EQ(cudaMemcpy(got.data(), dcols.p, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_TRUE(got == want) << "keys differ";
    // Offsets past the keys the buffer holds (counts other than the draws'): those rows are left alone.
    const int64_t half = int64_t(want.size()) / 2;
    ASSERT_EQ(cudaMemset(dcols.p, 0xCD, want.size() * 4), cudaSuccess);
    ASSERT_EQ(launch_random_csr(c.r, c.seed, c.q_len, c.k_len, b.lo, b.hi, true, static_cast<int64_t*>(doff.p),
                                static_cast<int32_t*>(dcols.p), half, nullptr),
              0);
    ASSERT_EQ(cudaMemcpy(got.data(), dcols.p, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    int64_t past = 0;
    for (size_t i = size_t(half); i < got.size(); ++i) past += got[i] != int32_t(0xCDCDCDCD);
    EXPECT_EQ(past, 0) << "keys written past cols_len";
  }
}

// The offsets from counts over several of the scan's blocks (16384 rows each), lengths off them, and none.
TEST(RandomRows, OffsetsFromCountsOverBlocks) {
  REQUIRE_GPU();
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(16384), int64_t(40001)}) {
    std::vector<int32_t> counts(static_cast<size_t>(n));
    std::vector<int64_t> want(size_t(n) + 1, 0);
    for (int64_t q = 0; q < n; ++q) {
      counts[size_t(q)] = int32_t((q * 2654435761u) % 1000);
      want[size_t(q) + 1] = want[size_t(q)] + counts[size_t(q)];
    }
    Dev dc(counts.size() * 4), doff(want.size() * 8);
    ASSERT_EQ(cudaMemcpy(dc.p, counts.data(), counts.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(doff.p, 0xAB, want.size() * 8), cudaSuccess);
    ASSERT_EQ(launch_random_offsets(static_cast<int32_t*>(dc.p), n, static_cast<int64_t*>(doff.p), nullptr), 0);
    std::vector<int64_t> got(want.size());
    ASSERT_EQ(cudaMemcpy(got.data(), doff.p, got.size() * 8, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_TRUE(got == want) << n << " rows";
  }
}

TEST(RandomRows, RefusesWhatItCannotDraw) {
  REQUIRE_GPU();
  Dev d(1024);
  auto* m = static_cast<unsigned long long*>(d.p);
  EXPECT_NE(launch_random_tile_masks(0, 0, 10, 10, 64, 64, m, nullptr), 0) << "r = 0";
  EXPECT_NE(launch_random_tile_masks(10, 0, 10, 10, 64, 64, m, nullptr), 0) << "r = Lk";
  EXPECT_NE(launch_random_tile_masks(1, 0, 10, (int64_t(1) << 20) + 1, 64, 64, m, nullptr), 0) << "Lk past kDrawMaxKeys";
  EXPECT_NE(launch_random_tile_masks(1, 0, 10, 10, 96, 64, m, nullptr), 0) << "a tile height of no kernel";
  EXPECT_NE(launch_random_csr(3, 0, 10, 10, 1, 0, false, nullptr, nullptr, 30, nullptr), 0) << "no offsets";
  EXPECT_NE(launch_random_csr(3, 0, 10, 10, -1, 1, false, reinterpret_cast<int64_t*>(m), reinterpret_cast<int32_t*>(m), 30, nullptr), 0)
      << "rows less a band need their offsets";
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a refusal launches nothing";
}

// sparse random alone is a compound plan of one scattered part whose CSR the device draws; beside band rows, the
// part less the band; against the reference.
TEST(RandomRows, DrawnScatteredPartMatchesReference) {
  REQUIRE_GPU();
  for (const char* spec : {"random(9, seed=2)", "random(20, seed=4)", "local(64) | random(4, seed=3)",
                           "local(left=30, right=0) | random(5, seed=1)", "causal | random(3)"}) {
    SCOPED_TRACE(spec);
    const std::vector<spattn::Pattern> pats{spattn::parse(spec)};
    const spattn::Plan plan =
        spattn::make_plan(pats, spattn::test::problem(2, 4, 2, 1777, 64, spattn::DType::bf16), spattn::Device::cuda(0));
    const std::string ex = plan.explain();
    ASSERT_NE(ex.find("CSR drawn on the device"), std::string::npos) << ex;
    double lse_err = 0;
    EXPECT_LE(spattn::test::run_vs_reference(plan, pats, spattn::DType::bf16, 5, &lse_err), 1e-2) << ex;
    EXPECT_LE(lse_err, 2e-2) << ex;
  }
}

}  // namespace
