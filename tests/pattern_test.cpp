// Guards the pattern language: every atom and preset against a brute-force reading of PATTERNS.md on
// awkward sizes; row enumeration against the predicate; unions / intersections; every error path.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <set>
#include <thread>

#include "spattn/pattern.hpp"

using namespace spattn;
using Pred = std::function<bool(int64_t q, int64_t k, int64_t Lq, int64_t Lk)>;

namespace {

const int64_t kSizes[] = {1, 7, 113, 799};

// PATTERNS.md's hash and random row, transcribed literally: Floyd's sampling into a std::set.
uint64_t spec_mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}
uint64_t spec_h(uint64_t seed, uint64_t q, uint64_t k) { return spec_mix(spec_mix(spec_mix(seed) + q) + k); }
std::set<int64_t> floyd_random(int64_t r, uint64_t seed, int64_t q, int64_t Lk) {
  std::set<int64_t> S;
  if (r >= Lk) {
    for (int64_t k = 0; k < Lk; ++k) S.insert(k);
    return S;
  }
  for (int64_t j = Lk - r; j <= Lk - 1; ++j) {
    const uint64_t t = spec_h(seed, uint64_t(q), uint64_t(j)) % uint64_t(j + 1);
    if (S.count(int64_t(t))) {
      S.insert(j);
    } else {
      S.insert(int64_t(t));
    }
  }
  return S;
}
// The predicate of blocked(block, random(r, seed=seed)) (block 1: random itself), remembering the last row
// asked (check_against asks key by key).
Pred random_pred(int64_t r, uint64_t seed, int64_t block = 1) {
  struct Last {
    int64_t bq = -1, nb = -1;
    std::set<int64_t> keys;
  };
  auto last = std::make_shared<Last>();
  return [=](int64_t q, int64_t k, int64_t, int64_t Lk) {
    const int64_t bq = q / block, nb = (Lk + block - 1) / block;
    if (last->bq != bq || last->nb != nb) *last = {bq, nb, floyd_random(r, seed, bq, nb)};
    return last->keys.count(k / block) > 0;
  };
}

// Brute force neighborhood window on one axis: the set of coordinates, straight from the definition.
std::set<int64_t> na_window(int64_t i, int64_t n, int64_t K, int64_t d, bool causal) {
  const int64_t g = i % d, p = i / d;
  int64_t ng = 0;
  while (g + ng * d < n) ++ng;
  std::set<int64_t> w;
  if (causal) {
    for (int64_t t = std::max<int64_t>(0, p - K + 1); t <= p; ++t) w.insert(g + t * d);
  } else {
    const int64_t s = std::clamp<int64_t>(p - K / 2, 0, ng - K);
    for (int64_t t = s; t < s + K; ++t) w.insert(g + t * d);
  }
  return w;
}

// Checks a bound pattern against a predicate on every (q, k), and row() / row_keys() against contains().
void check_against(const std::string& spec, int64_t Lq, int64_t Lk, const Pred& want) {
  SCOPED_TRACE(spec + " at " + std::to_string(Lq) + "x" + std::to_string(Lk));
  const BoundPattern p = Pattern::parse(spec).bind(Lq, Lk);
  std::vector<int64_t> keys;
  int64_t total = 0;
  for (int64_t q = 0; q < Lq; ++q) {
    std::vector<int64_t> expect;
    for (int64_t k = 0; k < Lk; ++k) {
      const bool w = want(q, k, Lq, Lk);
      ASSERT_EQ(p.contains(q, k), w) << "contains(" << q << ", " << k << ")";
      if (w) expect.push_back(k);
    }
    p.row_keys(q, keys);
    ASSERT_EQ(keys, expect) << "row " << q;
    ASSERT_EQ(p.row_nnz(q), int64_t(expect.size())) << "row " << q;
    // Row runs: disjoint, ordered by start, intervals neither overlapping nor touching.
    const RowRuns runs = p.row(q);
    for (size_t i = 0; i < runs.size(); ++i) {
      ASSERT_GE(runs[i].count, 1);
      ASSERT_GE(runs[i].stride, 1);
      if (i) ASSERT_LT(runs[i - 1].start, runs[i].start);
    }
    int64_t prev_end = -2;
    for (const Run& r : runs)
      if (r.stride == 1) {
        ASSERT_GT(r.start, prev_end) << "intervals touch or overlap in row " << q;
        prev_end = r.end();
      }
    total += int64_t(expect.size());
  }
  EXPECT_EQ(p.nnz(), total);
}

struct AtomCase {
  std::string spec;
  Pred pred;
  int64_t min_len = 1;  // the spec is valid from this length on
};

std::vector<AtomCase> atom_cases() {
  auto in = [](int64_t x, std::initializer_list<std::pair<int64_t, int64_t>> ranges) {
    for (auto& r : ranges)
      if (x >= r.first && x < r.second) return true;
    return false;
  };
  return {
      {"dense", [](int64_t, int64_t, int64_t, int64_t) { return true; }},
      {"causal", [](int64_t q, int64_t k, int64_t, int64_t) { return k <= q; }},
      {"local(0)", [](int64_t q, int64_t k, int64_t, int64_t) { return q == k; }},
      {"local(5)", [](int64_t q, int64_t k, int64_t, int64_t) { return std::abs(q - k) <= 5; }},
      {"local(left=3, right=0)", [](int64_t q, int64_t k, int64_t, int64_t) { return q - 3 <= k && k <= q; }},
      {"local(left=0,right=9)", [](int64_t q, int64_t k, int64_t, int64_t) { return q <= k && k <= q + 9; }},
      {"local(right=2, left=7)", [](int64_t q, int64_t k, int64_t, int64_t) { return q - 7 <= k && k <= q + 2; }},
      {"dilated(3, 4)", [](int64_t q, int64_t k, int64_t, int64_t) { return std::abs(q - k) <= 12 && (q - k) % 4 == 0; }},
      {"dilated(0, 2)", [](int64_t q, int64_t k, int64_t, int64_t) { return q == k; }},
      {"stride(6)", [](int64_t q, int64_t k, int64_t, int64_t) { return (q - k) % 6 == 0; }},
      {"block_diag(16)", [](int64_t q, int64_t k, int64_t, int64_t) { return q / 16 == k / 16; }},
      {"summary(8)", [](int64_t, int64_t k, int64_t, int64_t) { return k % 8 >= 7; }},
      {"summary(8, c=3)", [](int64_t, int64_t k, int64_t, int64_t) { return k % 8 >= 5; }},
      {"summary(5, 9)", [](int64_t, int64_t, int64_t, int64_t) { return true; }},
      {"summary(4, 0)", [](int64_t, int64_t, int64_t, int64_t) { return false; }},
      // A block size near 2^63 (its block count overflowed: UBSan in the sanitizer build, via cli_oracle).
      {"summary(9223372036854775807, c=2)", [](int64_t, int64_t, int64_t, int64_t) { return false; }},
      {"global(0, 3:5)", [in](int64_t q, int64_t k, int64_t, int64_t) { return in(q, {{0, 1}, {3, 5}}) || in(k, {{0, 1}, {3, 5}}); }, 5},
      {"global_rows(1:3)", [in](int64_t q, int64_t, int64_t, int64_t) { return in(q, {{1, 3}}); }, 3},
      {"global_cols(2, 6)", [in](int64_t, int64_t k, int64_t, int64_t) { return in(k, {{2, 3}, {6, 7}}); }, 7},
      {"random(3, seed=7)", random_pred(3, 7)},
      {"random(40)", random_pred(40, 0)},
      {"random(1, seed=9223372036854775807)", random_pred(1, 9223372036854775807ull)},
      {"random(112, seed=-1)", random_pred(112, ~0ull)},  // r = Lk - 1 at 113, r >= Lk below
      {"blocked(4, local(1))", [](int64_t q, int64_t k, int64_t, int64_t) { return std::abs(q / 4 - k / 4) <= 1; }},
      {"blocked(3, stride(2))", [](int64_t q, int64_t k, int64_t, int64_t) { return (q / 3 - k / 3) % 2 == 0; }},
  };
}

}  // namespace

TEST(PatternAtoms, MatchBruteForceOnAwkwardSizes) {
  for (const AtomCase& c : atom_cases()) {
    for (int64_t L : kSizes) {
      if (L < c.min_len) continue;
      check_against(c.spec, L, L, c.pred);
    }
  }
}

TEST(PatternAtoms, RandomRowsAreFloydsSample) {
  // Row keys, row_nnz and contains() against the literal transcription, row by row: suite sizes, r = 1,
  // r = Lk - 1, r >= Lk, r = 0, both sides of the library's switch from a hash set to a bitmap (one key in 256:
  // Lk = 70000 is 1094 words of 64 keys, a bitmap from r = 274), keys near 2^31 (the largest divisors j + 1),
  // cross lengths, seeds at the ends of the range, bitmaps of more words than keys.
  struct C {
    int64_t r, Lq, Lk;
    uint64_t seed;
    int64_t rows;  // rows checked, spread over [0, Lq)
  };
  const int64_t kMaxK = 2147483647;
  const C cases[] = {{205, 4096, 4096, 0, 64},     {820, 16384, 16384, 0, 32},   {1, 5000, 5000, 9, 200},
                     {4000, 4099, 4099, 2, 16},     {4098, 4099, 4099, 3, 16},    {4099, 50, 4099, 3, 4},
                     {5000, 30, 4099, 1, 3},        {3, 70000, 70000, 1, 64},     {273, 40, 70000, 5, 40},
                     {274, 40, 70000, 5, 40},       {1, 2, 2, 4, 2},              {1, 1, 2, 7, 1},
                     {0, 10, 10, 1, 10},            {2, 300, 7, ~0ull, 300},      {6, 300, 7, 1ull << 63, 300},
                     {1000, 8, kMaxK, 11, 8},       {3, 4, kMaxK, ~0ull, 4},      {64, 6, kMaxK - 1000, 12345, 6},
                     {31, 100, 32, 77, 100},        {63, 7, 64, 78, 7},           {65, 7, 66, 79, 7},
                     // bitmaps of more words than keys (scanned eight words at a time): sparse random, a ragged group
                     {81, 16384, 16384, 0, 32},     {7, 50, 1700, 4, 50},
                     // the most draws kept in the sorted keys (8), nearly every key drawn twice; the fewest in a set
                     {8, 40, 9, 5, 40},             {9, 40, 10, 6, 40}};
  std::vector<int64_t> keys;
  for (const C& c : cases) {
    const std::string spec = "random(" + std::to_string(c.r) + ", seed=" + std::to_string(int64_t(c.seed)) + ")";
    SCOPED_TRACE(spec + " at " + std::to_string(c.Lq) + "x" + std::to_string(c.Lk));
    const auto b = Pattern::parse(spec).bind(c.Lq, c.Lk);
    for (int64_t i = 0; i < c.rows; ++i) {
      const int64_t q = c.rows >= c.Lq ? i : (i * (c.Lq - 1)) / std::max<int64_t>(1, c.rows - 1);
      const auto want = floyd_random(c.r, c.seed, q, c.Lk);
      ASSERT_EQ(int64_t(want.size()), std::min(c.r, c.Lk)) << "the transcription itself, row " << q;
      b.row_keys(q, keys);
      ASSERT_EQ(keys, std::vector<int64_t>(want.begin(), want.end())) << "row " << q;  // distinct, increasing
      EXPECT_EQ(b.row_nnz(q), int64_t(want.size()));
      // Every key of short rows; else the kept keys and their neighbours.
      if (c.Lk <= 5000) {
        for (int64_t k = 0; k < c.Lk; ++k) ASSERT_EQ(b.contains(q, k), want.count(k) > 0) << "row " << q << " key " << k;
      } else {
        for (int64_t k : want)
          for (int64_t n : {k - 1, k, k + 1})
            if (n >= 0 && n < c.Lk) ASSERT_EQ(b.contains(q, n), want.count(n) > 0) << "row " << q << " key " << n;
      }
    }
    if (c.Lk <= 70000) EXPECT_EQ(b.nnz(), c.Lq * std::min(c.r, c.Lk));
  }
}

// random_rows_keys (rows counted by their keys, plan::analyze's band | random rows): every row's keys, drawn eight rows
// at a time for a few draws a row (rows past a multiple of eight, ranges starting anywhere), one at a time for more.
TEST(PatternAtoms, RandomRowsKeysAreTheRows) {
  struct C {
    int64_t r, Lq, Lk;
    uint64_t seed;
  };
  for (const C& c : {C{4, 100, 16384, 1}, C{1, 19, 2, 3}, C{3, 13, 4, 0}, C{8, 40, 9, 5}, C{7, 33, 1700, ~0ull},
                     C{9, 17, 10, 6}, C{81, 20, 16384, 0}, C{300, 9, 3000, 5}, C{2, 5, 2147483647, 1ull << 63}}) {
    const auto b = Pattern::parse("random(" + std::to_string(c.r) + ", seed=" + std::to_string(int64_t(c.seed)) + ")")
                       .bind(c.Lq, c.Lk);
    std::vector<int32_t> keys;
    std::vector<int64_t> row;
    for (auto [q0, q1] : {std::pair<int64_t, int64_t>{0, c.Lq}, {3, c.Lq - 2}, {5, 5}}) {
      SCOPED_TRACE("random(" + std::to_string(c.r) + ") at " + std::to_string(c.Lq) + "x" + std::to_string(c.Lk) +
                   ", rows " + std::to_string(q0) + ":" + std::to_string(q1));
      random_rows_keys(c.seed, c.r, q0, q1, c.Lk, keys);
      ASSERT_EQ(int64_t(keys.size()), (q1 - q0) * c.r);
      for (int64_t q = q0; q < q1; ++q) {
        std::vector<int64_t> got(keys.begin() + (q - q0) * c.r, keys.begin() + (q - q0 + 1) * c.r);
        std::sort(got.begin(), got.end());
        b.row_keys(q, row);
        ASSERT_EQ(got, row) << "row " << q;
        const auto want = floyd_random(c.r, c.seed, q, c.Lk);
        ASSERT_EQ(got, std::vector<int64_t>(want.begin(), want.end())) << "row " << q;
      }
    }
  }
  std::vector<int32_t> keys;
  EXPECT_THROW(random_rows_keys(0, 5, 0, 1, 5, keys), Error);  // r >= Lk: every key, no draws
  EXPECT_THROW(random_rows_keys(0, 0, 0, 1, 5, keys), Error);
  EXPECT_THROW(random_rows_keys(0, 2, 3, 1, 5, keys), Error);
}

TEST(PatternAtoms, RandomRowsAreTheSameOnEveryThread) {
  // The per-thread scratch and row cache: rows drawn on two threads at once, interleaved with contains() on
  // other rows and with a second random atom, match the transcription.
  const auto b = Pattern::parse("random(300, seed=5) | random(2, seed=6) & causal").bind(3000);
  std::vector<std::vector<int64_t>> got(2);
  auto work = [&](int t) {
    std::vector<int64_t> keys;
    for (int64_t q = t; q < 3000; q += 2) {
      b.row_keys(q, keys);
      got[size_t(t)].insert(got[size_t(t)].end(), keys.begin(), keys.end());
      got[size_t(t)].push_back(-1);
      (void)b.contains(2999 - q, q);
    }
  };
  std::thread other(work, 1);
  work(0);
  other.join();
  for (int t = 0; t < 2; ++t) {
    std::vector<int64_t> want;
    for (int64_t q = t; q < 3000; q += 2) {
      std::set<int64_t> s = floyd_random(300, 5, q, 3000);
      for (int64_t k : floyd_random(2, 6, q, 3000))
        if (k <= q) s.insert(k);
      want.insert(want.end(), s.begin(), s.end());
      want.push_back(-1);
    }
    EXPECT_EQ(got[size_t(t)], want) << "thread " << t;
  }
}

TEST(PatternAtoms, BlockedRandomUsesTheBlockGrid) {
  // The rule runs on the block grid: q, k and Lk counted in blocks (a ragged last block included).
  for (int64_t L : {7, 113, 200}) check_against("blocked(8, random(2, seed=3))", L, L, random_pred(2, 3, 8));
  check_against("blocked(5, random(12, seed=4))", 300, 300, random_pred(12, 4, 5));  // 60 blocks
  check_against("blocked(5, random(59, seed=4))", 298, 298, random_pred(59, 4, 5));  // r = blocks - 1
  check_against("blocked(5, random(60, seed=4))", 298, 298, random_pred(60, 4, 5));  // r = blocks: every key
  check_against("blocked(3, random(1, seed=-5))", 40, 301, random_pred(1, uint64_t(-5), 3));
  check_against("blocked(4, random(3))", 301, 17, random_pred(3, 0, 4));
}

TEST(PatternAtoms, Document) {
  const std::vector<int64_t> segs{3, 50, 1, 59};
  check_against("document(3, 50, 1, 59)", 113, 113, [&](int64_t q, int64_t k, int64_t, int64_t) {
    int64_t s = 0, sq = -1, sk = -1;
    for (size_t i = 0; i < segs.size(); s += segs[i], ++i) {
      if (q >= s && q < s + segs[i]) sq = int64_t(i);
      if (k >= s && k < s + segs[i]) sk = int64_t(i);
    }
    return sq == sk;
  });
}

TEST(PatternAtoms, NeighborhoodOneTwoThreeD) {
  struct C {
    std::string spec;
    std::vector<int64_t> n, K, d;
    std::vector<bool> c;
  };
  const std::vector<C> cases{
      {"neighborhood(kernel=5)", {113}, {5}, {1}, {false}},
      {"neighborhood(kernel=5, dilation=3)", {113}, {5}, {3}, {false}},
      {"neighborhood(kernel=7, causal=1)", {113}, {7}, {1}, {true}},
      {"neighborhood(kernel=4, dilation=2, causal=1)", {799}, {4}, {2}, {true}},
      {"neighborhood(dims=(17,47), kernel=(3,5))", {17, 47}, {3, 5}, {1, 1}, {false, false}},
      {"neighborhood(dims=(17,47), kernel=3, dilation=(2,3), causal=(0,1))", {17, 47}, {3, 3}, {2, 3}, {false, true}},
      {"neighborhood(dims=(9,10,8), kernel=(3,3,2), dilation=(1,2,3))", {9, 10, 8}, {3, 3, 2}, {1, 2, 3}, {false, false, false}},
      {"neighborhood(dims=(6,7,5), kernel=(2,3,3), causal=(1,0,1))", {6, 7, 5}, {2, 3, 3}, {1, 1, 1}, {true, false, true}},
      // Windows spanning a whole last-axis line (consecutive lines' runs touch) and windows of one key a line.
      {"neighborhood(dims=(6,5), kernel=(3,5))", {6, 5}, {3, 5}, {1, 1}, {false, false}},
      {"neighborhood(dims=(4,3,4), kernel=(2,3,4))", {4, 3, 4}, {2, 3, 4}, {1, 1, 1}, {false, false, false}},
      {"neighborhood(dims=(8,6), kernel=(3,1), dilation=(1,2))", {8, 6}, {3, 1}, {1, 2}, {false, false}},
      {"neighborhood(dims=(8,6), kernel=(3,3), dilation=(1,2))", {8, 6}, {3, 3}, {1, 2}, {false, false}},
  };
  for (const C& c : cases) {
    int64_t L = 1;
    for (int64_t x : c.n) L *= x;
    const size_t nax = c.n.size();
    check_against(c.spec, L, L, [&](int64_t q, int64_t k, int64_t, int64_t) {
      int64_t cq[3], ck[3], qq = q, kk = k;
      for (int ax = int(nax) - 1; ax >= 0; --ax) {
        cq[ax] = qq % c.n[size_t(ax)];
        qq /= c.n[size_t(ax)];
        ck[ax] = kk % c.n[size_t(ax)];
        kk /= c.n[size_t(ax)];
      }
      for (size_t ax = 0; ax < nax; ++ax)
        if (!na_window(cq[ax], c.n[ax], c.K[ax], c.d[ax], c.c[ax]).count(ck[ax])) return false;
      return true;
    });
  }
}

TEST(PatternPresets, ExpandToTheirDefinitions) {
  for (int64_t L : kSizes) {
    check_against("longformer(4, 2)", L, L, [](int64_t q, int64_t k, int64_t, int64_t) { return std::abs(q - k) <= 4 || q < 2 || k < 2; });
    check_against("sparse_fixed(8)", L, L, [](int64_t q, int64_t k, int64_t, int64_t) { return q / 8 == k / 8 || k % 8 >= 7; });
    check_against("sparse_fixed(8, 3)", L, L, [](int64_t q, int64_t k, int64_t, int64_t) { return q / 8 == k / 8 || k % 8 >= 5; });
    check_against("sparse_strided(5)", L, L,
                  [](int64_t q, int64_t k, int64_t, int64_t) { return (q - 4 <= k && k <= q) || ((q - k) % 5 == 0 && k <= q); });
    if (L <= 113) {
      const int64_t nb = (L + 3) / 4;
      check_against("bigbird(4, 1, 2, 1, seed=5)", L, L, [nb](int64_t q, int64_t k, int64_t, int64_t) {
        const int64_t bq = q / 4, bk = k / 4;
        return std::abs(bq - bk) <= 1 || bq < 2 || bk < 2 || floyd_random(1, 5, bq, nb).count(bk) > 0;
      });
    }
  }
}

TEST(PatternAlgebra, UnionsAndIntersections) {
  check_against("(local(3) | stride(7)) & causal", 113, 113,
                [](int64_t q, int64_t k, int64_t, int64_t) { return (std::abs(q - k) <= 3 || (q - k) % 7 == 0) && k <= q; });
  check_against("dilated(4, 3) | dilated(2, 2) | global_cols(5)", 113, 113, [](int64_t q, int64_t k, int64_t, int64_t) {
    return (std::abs(q - k) <= 12 && (q - k) % 3 == 0) || (std::abs(q - k) <= 4 && (q - k) % 2 == 0) || k == 5;
  });
  check_against("stride(3) & stride(4) | block_diag(10) & local(2)", 113, 113, [](int64_t q, int64_t k, int64_t, int64_t) {
    return ((q - k) % 3 == 0 && (q - k) % 4 == 0) || (q / 10 == k / 10 && std::abs(q - k) <= 2);
  });
  const Pred rnd = random_pred(9, 1);
  check_against("random(9, seed=1) & local(20) | summary(16, 2) & (causal)", 113, 113, [&](int64_t q, int64_t k, int64_t Lq, int64_t Lk) {
    return (rnd(q, k, Lq, Lk) && std::abs(q - k) <= 20) || (k % 16 >= 14 && k <= q);
  });
  // Cross attention (Lq != Lk).
  check_against("causal | local(left=0, right=2)", 7, 113, [](int64_t q, int64_t k, int64_t, int64_t) { return k <= q + 2; });
  check_against("dilated(5, 2) | stride(9)", 113, 7,
                [](int64_t q, int64_t k, int64_t, int64_t) { return (std::abs(q - k) <= 10 && (q - k) % 2 == 0) || (q - k) % 9 == 0; });
}

TEST(PatternRows, LocalRowIsOneRun) {
  const BoundPattern p = Pattern::parse("local(256)").bind(4096);
  EXPECT_EQ(p.row(1000), (RowRuns{{744, 1, 513}}));
  EXPECT_EQ(Pattern::parse("dilated(3, 5)").bind(100).row(50), (RowRuns{{35, 5, 7}}));
  EXPECT_EQ(Pattern::parse("longformer(2, 1)").bind(10).row(5), (RowRuns{{0, 1, 1}, {3, 1, 5}}));
}

TEST(PatternRows, NnzAbove2To31UsesSixtyFourBits) {
  const BoundPattern p = Pattern::parse("dense").bind(50000);
  EXPECT_EQ(p.nnz(), int64_t(50000) * 50000);
}

TEST(PatternHash, MatchesTheSpecFormula) {
  // mix(0) == 0 and the chain of PATTERNS.md, evaluated by hand for small inputs.
  EXPECT_EQ(random_mix(0), 0u);
  uint64_t x = 1;
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  EXPECT_EQ(random_mix(1), x);
  EXPECT_EQ(random_hash(3, 4, 5), random_mix(random_mix(random_mix(3) + 4) + 5));
  for (uint64_t v : {uint64_t(1), uint64_t(12345), ~uint64_t(0)}) EXPECT_EQ(random_mix(v), spec_mix(v));
}

// ---- errors: each names the offending text and its column ----
void expect_error(const std::string& spec, int64_t L, const std::string& needle, int64_t column) {
  SCOPED_TRACE(spec);
  try {
    Pattern::parse(spec).bind(L, L);
    FAIL() << "no error for " << spec;
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(needle), std::string::npos) << m;
    if (column > 0) EXPECT_NE(m.find("column " + std::to_string(column) + ":"), std::string::npos) << m;
  }
}

TEST(PatternErrors, NameTheTextAndColumn) {
  expect_error("lokal(3)", 10, "unknown pattern name 'lokal'", 1);
  expect_error("local(3) | foo", 10, "'foo'", 12);
  expect_error("local()", 10, "at least one argument", 7);
  expect_error("dilated(3)", 10, "missing argument 'd'", 1);
  expect_error("local(3, 4)", 10, "extra argument '4'", 10);
  expect_error("local(left=1, left=2, right=0)", 10, "given twice", 15);
  expect_error("summary(4, x=2)", 10, "unknown argument 'x'", 12);
  expect_error("local(99999999999999999999)", 10, "does not fit in a signed 64-bit integer", 7);
  expect_error("global(5:3)", 10, "ends before it starts", 10);
  expect_error("block_diag(0)", 10, "at least 1", 12);
  expect_error("stride(0)", 10, "at least 1", 8);
  expect_error("dilated(2, 0)", 10, "at least 1", 12);
  expect_error("neighborhood(kernel=0)", 10, "kernel size 0", 0);
  expect_error("local(-1)", 10, "must not be negative", 7);
  expect_error("random(-2)", 10, "must not be negative", 8);
  expect_error("global(3, 12)", 10, "index 12 in 'global(3, 12)' is out of range for length 10", 1);
  expect_error("global_rows(-1)", 10, "negative", 13);
  expect_error("local(3) local(4)", 10, "trailing text 'local(4)'", 10);
  expect_error("local(3))", 10, "trailing text ')'", 9);
  expect_error("(local(3)", 10, "expected ')'", 10);
  expect_error("local(3) |", 10, "expected a pattern", 11);
  expect_error("document(3, 4)", 10, "sum to 7 but the length is 10", 1);
  expect_error("document(3, 0, 7)", 10, "segment length 0", 13);
  expect_error("neighborhood(kernel=11)", 10, "does not fit", 1);
  expect_error("neighborhood(dims=(4,4), kernel=3, dilation=2)", 16, "does not fit", 1);
  expect_error("neighborhood(dims=(4,5), kernel=3)", 16, "hold 20 tokens", 1);
  expect_error("neighborhood(kernel=(3,3))", 16, "dims may be omitted only for 1-D", 14);
  expect_error("blocked(4, lokal(1))", 10, "unknown pattern name 'lokal'", 12);
  expect_error("causal(1)", 10, "takes no arguments", 8);
  expect_error("local(3) $", 10, "unexpected character '$'", 10);
  expect_error("", 10, "empty pattern spec", 1);
}

// Nesting is recursion (parser, bind, destruction): past the limit a spec is refused at the column where the
// limit is crossed, instead of overflowing the stack (15000 parentheses used to end in SIGSEGV).
// A message is valid UTF-8 whatever the spec holds: a non-ASCII character is quoted whole with its code point (one
// byte of it was quoted, an invalid UTF-8 string), a byte that starts no UTF-8 sequence as \xNN, in the quoted spec
// too (a long spec's excerpt may cut a character).
TEST(PatternErrors, MessagesAreValidUtf8) {
  auto valid = [](const std::string& m) {
    for (size_t i = 0; i < m.size();) {
      const auto b = static_cast<unsigned char>(m[i]);
      const size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
      if (n == 0 || i + n > m.size()) return false;
      for (size_t k = 1; k < n; ++k)
        if ((static_cast<unsigned char>(m[i + k]) >> 6) != 2) return false;
      i += n;
    }
    return true;
  };
  const std::string stray = "local(3) \xff x", cut = std::string(100, ' ') + "local(3) | \xe2\x88\xaa" + std::string(100, ' ');
  for (const std::string& spec : {std::string("local(3) \u222a causal"), stray, cut}) {
    try {
      Pattern::parse(spec);
      FAIL() << "accepted";
    } catch (const Error& e) {
      EXPECT_TRUE(valid(e.what())) << e.what();
    }
  }
  expect_error("local(3) \u222a causal", 10, "unexpected character '\u222a' (U+222A) (in \"local(3) \u222a causal\")", 10);
  expect_error(stray, 10, "unexpected character byte \\xFF (in \"local(3) \\xFF x\")", 10);
}

TEST(PatternErrors, DeepNestingIsRefusedNotACrash) {
  auto parens = [](int n) { return std::string(size_t(n), '(') + "dense" + std::string(size_t(n), ')'); };
  auto blocked = [](int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += "blocked(1, ";
    return s + "local(1)" + std::string(size_t(n), ')');
  };
  EXPECT_EQ(Pattern::parse(parens(200)).bind(4).nnz(), 16);
  EXPECT_EQ(Pattern::parse(blocked(200)).bind(4).nnz(), 10);
  expect_error(parens(201), 4, "nesting deeper than 200 levels", 201);
  expect_error(parens(15000), 4, "nesting deeper than 200 levels", 201);
  expect_error(blocked(201), 4, "nesting deeper than 200 levels", 1 + 200 * 11);
  expect_error(blocked(8000), 4, "nesting deeper than 200 levels", 1 + 200 * 11);
  // A long spec is quoted around the error, not whole.
  try {
    Pattern::parse(parens(15000));
  } catch (const Error& e) {
    EXPECT_LT(std::string(e.what()).size(), 300u) << e.what();
  }
}

// blocked(...) keeps a block row's runs per thread for the rows that share it: rows asked in any order, of two
// patterns in turn, are each their own pattern's.
TEST(Pattern, BlockedRowsFromTheCacheAreTheirOwn) {
  const BoundPattern a = Pattern::parse("blocked(4, local(1) | random(2, seed=1))").bind(64);
  const BoundPattern b = Pattern::parse("blocked(4, local(1) | random(2, seed=2))").bind(64);
  for (int64_t i = 0; i < 3 * 64; ++i) {
    const BoundPattern& p = i % 2 ? a : b;
    for (int64_t q : {(i * 37) % 64, ((i * 37) % 64) ^ 1}) {  // the second from the cache (same block row)
      std::vector<int64_t> keys, want;
      p.row_keys(q, keys);
      for (int64_t k = 0; k < 64; ++k)
        if (p.contains(q, k)) want.push_back(k);
      ASSERT_EQ(keys, want) << p.spec() << " row " << q;
    }
  }
}

// Rows as bits (BoundPattern::row_bits): random atoms keeping a key in 256 or more give their keys' bits, the rest
// (sparser random rows, any other pattern) none.
TEST(PatternRows, RowBitsAreTheRowsKeys) {
  struct C {
    const char* spec;
    int64_t lq, lk;
    bool bits;
  };
  for (const C& c : {C{"random(820, seed=0)", 300, 16384, true}, C{"random(100)", 50, 5000, true},
                     C{"random(5000)", 20, 4000, true}, C{"random(3)", 20, 10000, false}, C{"local(3)", 20, 100, false},
                     C{"local(3) | random(50)", 20, 1000, false}}) {
    SCOPED_TRACE(c.spec);
    const auto p = spattn::parse(c.spec).bind(c.lq, c.lk);
    std::vector<uint64_t> words(size_t((c.lk + 63) / 64));
    for (int64_t q = 0; q < c.lq; ++q) {
      ASSERT_EQ(p.row_bits(q, words.data()), c.bits);
      if (!c.bits) continue;
      std::vector<int64_t> keys, from_bits;
      p.row_keys(q, keys);
      for (int64_t k = 0; k < int64_t(words.size()) * 64; ++k)
        if ((words[size_t(k / 64)] >> (k % 64)) & 1) from_bits.push_back(k);
      ASSERT_EQ(from_bits, keys) << "row " << q;
    }
  }
}
