// Guards the pattern language: every atom and preset against a brute-force reading of PATTERNS.md on
// awkward sizes; row enumeration against the predicate; unions / intersections; every error path.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <set>

#include "spattn/pattern.hpp"

using namespace spattn;
using Pred = std::function<bool(int64_t q, int64_t k, int64_t Lq, int64_t Lk)>;

namespace {

const int64_t kSizes[] = {1, 7, 113, 799};

// Brute force: the r keys of row q with the smallest (hash, k).
std::set<int64_t> brute_random(int64_t r, uint64_t seed, int64_t q, int64_t Lk) {
  std::vector<std::pair<uint64_t, int64_t>> h;
  for (int64_t k = 0; k < Lk; ++k) h.push_back({random_hash(seed, q, k), k});
  std::sort(h.begin(), h.end());
  std::set<int64_t> s;
  for (int64_t i = 0; i < std::min<int64_t>(r, Lk); ++i) s.insert(h[size_t(i)].second);
  return s;
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
      {"global(0, 3:5)", [in](int64_t q, int64_t k, int64_t, int64_t) { return in(q, {{0, 1}, {3, 5}}) || in(k, {{0, 1}, {3, 5}}); }, 5},
      {"global_rows(1:3)", [in](int64_t q, int64_t, int64_t, int64_t) { return in(q, {{1, 3}}); }, 3},
      {"global_cols(2, 6)", [in](int64_t, int64_t k, int64_t, int64_t) { return in(k, {{2, 3}, {6, 7}}); }, 7},
      {"random(3, seed=7)", [](int64_t q, int64_t k, int64_t, int64_t Lk) { return brute_random(3, 7, q, Lk).count(k) > 0; }},
      {"random(40)", [](int64_t q, int64_t k, int64_t, int64_t Lk) { return brute_random(40, 0, q, Lk).count(k) > 0; }},
      {"blocked(4, local(1))", [](int64_t q, int64_t k, int64_t, int64_t) { return std::abs(q / 4 - k / 4) <= 1; }},
      {"blocked(3, stride(2))", [](int64_t q, int64_t k, int64_t, int64_t) { return (q / 3 - k / 3) % 2 == 0; }},
  };
}

}  // namespace

TEST(PatternAtoms, MatchBruteForceOnAwkwardSizes) {
  for (const AtomCase& c : atom_cases()) {
    for (int64_t L : kSizes) {
      if (L < c.min_len) continue;
      if (c.spec.rfind("random", 0) == 0 && L > 113) continue;  // brute force is O(L^2 log L) per row
      check_against(c.spec, L, L, c.pred);
    }
  }
}

TEST(PatternAtoms, RandomRowsAtSuiteSizes) {
  // At suite sizes the row's keys are selected among hashes below a bound (not among all Lk): same keys as the
  // brute force, for short and long rows, and for r near Lk (where the bound covers everything).
  struct C {
    int64_t r, L;
    uint64_t seed;
  };
  for (const C& c : {C{205, 4096, 0}, C{820, 16384, 0}, C{1, 5000, 9}, C{4000, 4099, 2}, C{3, 70000, 1}}) {
    const auto b = spattn::parse("random(" + std::to_string(c.r) + ", seed=" + std::to_string(c.seed) + ")").bind(c.L);
    for (int64_t q : {int64_t(0), int64_t(1), c.L / 3, c.L - 1}) {
      const auto want = brute_random(c.r, c.seed, q, c.L);
      std::set<int64_t> got;
      for (const auto& run : b.row(q))
        for (int64_t i = 0; i < run.count; ++i) got.insert(run.start + i * run.stride);
      EXPECT_EQ(got, want) << "random(" << c.r << ") L=" << c.L << " row " << q;
    }
  }
}

TEST(PatternAtoms, BlockedRandomUsesTheBlockGrid) {
  for (int64_t L : {7, 113, 200}) {
    const int64_t nb = (L + 7) / 8;
    check_against("blocked(8, random(2, seed=3))", L, L, [nb](int64_t q, int64_t k, int64_t, int64_t) {
      return brute_random(2, 3, q / 8, nb).count(k / 8) > 0;
    });
  }
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
        return std::abs(bq - bk) <= 1 || bq < 2 || bk < 2 || brute_random(1, 5, bq, nb).count(bk) > 0;
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
  check_against("random(9, seed=1) & local(20) | summary(16, 2) & (causal)", 113, 113, [](int64_t q, int64_t k, int64_t, int64_t Lk) {
    return (brute_random(9, 1, q, Lk).count(k) && std::abs(q - k) <= 20) || (k % 16 >= 14 && k <= q);
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
