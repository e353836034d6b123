// The tilers' shortcuts (the CPU tile builder's all-residue tiles, ...) give the plans that their general paths
// give (SPATTN_PLAN_GENERAL=1 turns the shortcuts off): same tiles, key blocks, row masks, residue lists, key
// passes and work items (FusedPlan::fingerprint).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "cpu/fused_plan.hpp"
#include "plan/analysis.hpp"
#include "spattn/pattern.hpp"

namespace {

struct Case {
  std::string spec;
  int64_t lq, lk;
};

// Random rows at several densities (all residue, mixed, dense), random with bands and global rows, the
// standard suite's shapes, permuted (dilated, stride) and 2-D (neighborhood) plans, ragged lengths.
const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"random(410)", 8192, 8192},           // 5%, as random(820) at 16384: every tile all residue
      {"random(820)", 4096, 4096},           // 20%: some keys kept by 40% of a tile's rows
      {"random(205, seed=0)", 4096, 4096},
      {"random(40)", 2048, 2048},
      {"random(1500, seed=2)", 2048, 2048},  // 73%: tiles with dense segments
      {"random(700, seed=5)", 2048, 2048},   // about where dense segments start
      {"random(100)", 3000, 5000},
      {"random(900)", 777, 1000},
      {"local(64) | random(100)", 4096, 4096},
      {"global(0:32) | random(300)", 2048, 2048},
      {"causal & random(700)", 2048, 2048},
      {"blocked(64, random(20))", 4096, 4096},
      {"local(256)", 4096, 4096},
      {"longformer(256, 32)", 4096, 4096},
      {"bigbird(64, 1, 2, 3, seed=0)", 4096, 4096},
      {"dilated(256, 2)", 4096, 4096},
      {"dilated(128, 3) | random(30)", 3001, 3001},
      {"stride(7)", 2048, 2048},
      {"sparse_fixed(128)", 4096, 4096},
      {"neighborhood(dims=(64,64), kernel=13)", 4096, 4096},
      {"causal", 2048, 2048},
      {"dense", 1000, 1000},
  };
  return c;
}

void set_general(bool on) {
  if (on) setenv("SPATTN_PLAN_GENERAL", "1", 1);
  else unsetenv("SPATTN_PLAN_GENERAL");
}

TEST(PlanPaths, CpuTilerShortcutsGiveTheSamePlan) {
  for (const Case& c : cases()) {
    const auto b = spattn::parse(c.spec).bind(c.lq, c.lk);
    for (auto isa : {spattn::cpu::Isa::automatic, spattn::cpu::Isa::generic}) {
      SCOPED_TRACE(c.spec + " " + std::to_string(c.lq) + "x" + std::to_string(c.lk) + " " + spattn::cpu::isa_name(isa));
      spattn::Problem p;
      p.q_len = c.lq;
      p.kv_len = c.lk;
      p.head_dim = 64;
      spattn::cpu::Options o;
      o.threads = 2;
      o.isa = isa;
      set_general(true);
      const spattn::cpu::FusedPlan general({b}, p, o);
      set_general(false);
      const spattn::cpu::FusedPlan fast({b}, p, o);
      EXPECT_EQ(fast.fingerprint(), general.fingerprint());
      EXPECT_EQ(fast.stats().residue_nnz, general.stats().residue_nnz);
      EXPECT_EQ(fast.stats().dense_scores, general.stats().dense_scores);
      EXPECT_EQ(fast.stats().masked_scores, general.stats().masked_scores);
    }
  }
}

}  // namespace
