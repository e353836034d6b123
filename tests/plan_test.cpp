// The fused kernel's tile plan (src/plan/block_plan.cpp) on the CPU: built on several threads it is the same
// plan as built on one, and it accounts for every kept score.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "plan/block_plan.hpp"
#include "spattn/pattern.hpp"

namespace {

spattn::plan::BlockPlan build(const spattn::BoundPattern& b, int bm, int bn, int d, const char* threads) {
  if (threads) {
    setenv("SPATTN_PLAN_THREADS", threads, 1);
  } else {
    unsetenv("SPATTN_PLAN_THREADS");
  }
  auto p = spattn::plan::build_block_plan(b, bm, bn, d);
  unsetenv("SPATTN_PLAN_THREADS");
  return p;
}

TEST(BlockPlan, ThreadsBuildTheSamePlan) {
  struct C {
    std::string spec;
    int64_t L;
    int bm, bn, d;
  };
  const std::vector<C> cases = {
      {"random(51, seed=3) | local(40)", 4099, 64, 128, 1},   // bitmask tiles everywhere (mask indices rebased)
      {"random(51, seed=3) | local(40)", 4099, 192, 128, 1},
      {"longformer(256, 32)", 4099, 64, 128, 1},             // band, bitmask and full tiles
      {"bigbird(64, 1, 2, 3, seed=0)", 4096, 64, 64, 1},
      {"dilated(256, 2)", 4099, 64, 128, 2},                  // residue permutation
      {"document(700, 1500, 1899) & causal", 4099, 128, 128, 1},
      {"global_rows(0:10) & local(5)", 3000, 192, 128, 1},    // mostly empty query tiles
  };
  for (const C& c : cases) {
    SCOPED_TRACE(c.spec + " L=" + std::to_string(c.L) + " " + std::to_string(c.bm) + "x" + std::to_string(c.bn));
    const auto b = spattn::parse(c.spec).bind(c.L);
    const auto one = build(b, c.bm, c.bn, c.d, "1");
    const auto many = build(b, c.bm, c.bn, c.d, nullptr);
    EXPECT_EQ(one.nnz, b.nnz()) << "every kept score is in the plan";
    EXPECT_EQ(many.nnz, one.nnz);
    EXPECT_EQ(many.row_offsets, one.row_offsets);
    EXPECT_EQ(many.masks, one.masks);
    EXPECT_EQ(many.order, one.order);
    EXPECT_EQ(many.n_full, one.n_full);
    EXPECT_EQ(many.n_band, one.n_band);
    EXPECT_EQ(many.n_bitmask, one.n_bitmask);
    ASSERT_EQ(many.entries.size(), one.entries.size());
    for (size_t i = 0; i < one.entries.size(); ++i) {
      const auto &x = one.entries[i], &y = many.entries[i];
      ASSERT_TRUE(x.kt == y.kt && x.mask == y.mask && x.lo == y.lo && x.hi == y.hi) << "entry " << i;
    }
  }
}

TEST(BlockPlan, ChoosesOnlyKernelShapes) {
  const auto b = spattn::parse("causal").bind(2048);
  for (bool tma : {false, true}) {
    const auto p = spattn::plan::choose_block_plan(b, spattn::plan::analyze(b), 64, 0, 0, -1, tma);
    EXPECT_TRUE((p.block_m == 64 && (p.block_n == 64 || p.block_n == 128)) || (p.block_m == 128 && p.block_n == 128) ||
                (tma && p.block_m == 192 && p.block_n == 128))
        << p.describe();
    if (!tma) EXPECT_NE(p.block_m, 192) << "192-row tiles exist only in the TMA kernel";
  }
}

TEST(BlockPlan, BandRows) {
  // Which patterns the band kernel may run: every row one interval [q + lo, q + hi] clipped to [0, Lk).
  struct C {
    std::string spec;
    int64_t lq, lk;
    bool band;
    int32_t lo, hi;
  };
  const std::vector<C> cases = {
      {"local(256)", 4099, 4099, true, -256, 256},
      {"causal", 1023, 1023, true, -1022, 0},                      // the least k - q kept: never binds
      {"dense", 700, 700, true, -699, 699},
      {"local(left=300, right=40)", 300, 1000, true, -299, 40},    // cross attention (left never binds)
      {"local(left=40, right=300)", 1000, 300, true, -40, 299},    // rows past Lk + 40 keep nothing; hi as binds
      {"local(left=64, right=0) | local(3)", 999, 999, true, -64, 3},  // a union that is still one band
      {"longformer(256, 32)", 1023, 1023, false, 0, 0},
      {"local(20) & global_rows(100:300)", 1023, 1023, false, 0, 0},  // empty rows the band does not predict
      {"document(700, 1500, 1899) & causal", 4099, 4099, false, 0, 0},
      {"dilated(256, 2)", 1023, 1023, false, 0, 0},
      {"random(51, seed=0)", 1023, 1023, false, 0, 0},
      {"global_rows(0:10) & local(5)", 600, 600, false, 0, 0},
  };
  for (const C& c : cases) {
    SCOPED_TRACE(c.spec);
    const auto b = spattn::parse(c.spec).bind(c.lq, c.lk);
    const auto r = spattn::plan::analyze(b).band;
    EXPECT_EQ(r.ok, c.band);
    if (!c.band || !r.ok) continue;
    EXPECT_EQ(r.lo, c.lo);
    EXPECT_EQ(r.hi, c.hi);
    // The band's predicate is the pattern's, everywhere.
    int64_t mismatches = 0;
    for (int64_t q = 0; q < c.lq; q += 7)
      for (int64_t k = 0; k < c.lk; ++k)
        mismatches += b.contains(q, k) != (k - q >= r.lo && k - q <= r.hi);
    EXPECT_EQ(mismatches, 0);
    const auto p = spattn::plan::build_block_plan(b, 192, 128, 1);
    EXPECT_TRUE(p.band && p.band_lo == r.lo && p.band_hi == r.hi) << p.describe();
  }
  EXPECT_FALSE(spattn::plan::build_block_plan(spattn::parse("local(256)").bind(1023), 128, 128, 2).band)
      << "permuted plans are not band plans";
}

}  // namespace
