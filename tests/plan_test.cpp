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
    const auto p = spattn::plan::choose_block_plan(b, 64, 0, 0, -1, tma);
    EXPECT_TRUE((p.block_m == 64 && (p.block_n == 64 || p.block_n == 128)) || (p.block_m == 128 && p.block_n == 128) ||
                (tma && p.block_m == 192 && p.block_n == 128))
        << p.describe();
    if (!tma) EXPECT_NE(p.block_m, 192) << "192-row tiles exist only in the TMA kernel";
  }
}

}  // namespace
