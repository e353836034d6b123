// tests/launch_decision_test.cpp — the GPU planner's launch decisions (plan/gpu/launch.hpp) against those the code
// before issue 43 made (tests/golden/launch_decisions.txt, written at 5a2779a by tests/golden/dump_old_decisions.cpp,
// which restated the engine's choices of then: see the commit that added it). For every case of
// launch_decision_cases.hpp (patterns x head dims 64 / 128 x compute capability 8.0 / 9.0 x forced kernels, shapes,
// tile maps and compound modes): the same tile plan (shape, counts, a hash of its arrays), kernel-table row, band
// split, refusal, compound parts, and backward row and plan. CPU only: the decision is plain data. Meant changes
// since, each rewritten through SPATTN_GOLDEN_OUT and stated in its commit: the backward's plans at head dim 128 of
// dilated(256, 2), dilated(100, 3) and the dilated neighborhood, now grouped by residue (issue 42: choose_block_plan
// prices a forced shape no forward row has; it kept the identity); the head-dim-64 backward row
// (sm90_bwd_ws_128x128_d64 for sm90_bwd_ws_64x128_d64).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include "launch_decision_cases.hpp"
#include "plan/gpu/launch.hpp"
#include "plan/key_plan.hpp"

namespace {

using namespace spattn;
using namespace spattn::plan;

std::string text(const LaunchDecision& d) {
  return decision_test::tiles_text(d.tiles, d.kernel_row, [&](int bh) {
    const SplitChoice s = d.split_for(bh, 132, 132);
    return std::tuple<int, int, int>{s.first, s.parts, s.slabs};
  });
}

std::string decide(const decision_test::Case& c) {
  const BoundPattern pat = parse(c.spec).bind(c.len, c.len);
  const Analysis an = analyze(pat);
  PlanOptions o;
  o.kernel = c.kernel;
  o.tile_map = c.tile_map;
  o.block_m = c.block_m, o.block_n = c.block_n;
  o.compound = c.compound;
  PatternDecision d;
  try {
    d = decide_pattern(pat, an, c.head_dim, GpuTarget{c.cc, 132}, o);
  } catch (const Error& e) {
    const std::string m = e.what(), key = "the planner's choice is ";
    const size_t at = m.find(key);
    if (m.find("cannot run pattern") == std::string::npos || at == std::string::npos) return "error";
    return "refused (the planner's choice is " + m.substr(at + key.size(), m.find(" (", at) - at - key.size()) + ")";
  }
  std::ostringstream s;
  if (d.compound()) {
    s << "compound";
    for (size_t i = 0; i < d.split.parts.size(); ++i) {
      const Part& p = d.split.parts[i];
      s << " | " << part_kind_name(p.kind) << " [" << p.terms << "] nnz " << p.nnz;
      if (p.kind == PartKind::scattered)
        s << " drawn " << p.drawn.r << " " << p.drawn_lo << ".." << p.drawn_hi;
      else
        s << " " << text(*d.launches[i]);
    }
  } else {
    s << text(*d.launches[0]);
  }
  if (c.cc == 90 && c.kernel.empty() && c.tile_map == -1 && c.block_m == 0) {
    const int brow = backward_row(backward_choice("", c.head_dim), an, c.head_dim);
    s << " || backward " << (brow >= 0 ? kKernels[brow].name : "none");
    if (brow >= 0)
      s << " " << decision_test::tiles_text(backward_tiles(pat, an, c.head_dim, brow), -1,
                                            [](int) { return std::tuple<int, int, int>{}; });
  }
  return s.str();
}

TEST(LaunchDecision, SameAsBeforeTheMove) {
  std::ifstream in(SPATTN_GOLDEN_DIR "/launch_decisions.txt");
  ASSERT_TRUE(in) << "cannot read " SPATTN_GOLDEN_DIR "/launch_decisions.txt";
  std::map<std::string, std::string> golden;
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find(" => ");
    ASSERT_NE(at, std::string::npos) << line;
    golden[line.substr(0, at)] = line.substr(at + 4);
  }
  const std::vector<decision_test::Case> cases = decision_test::cases();
  EXPECT_EQ(cases.size(), golden.size());
  // SPATTN_GOLDEN_OUT=FILE writes this code's decisions there, one line a case as in the golden file, to replace it
  // where a change of decision is meant (diff it against the golden file: only the meant lines may differ).
  if (const char* out = std::getenv("SPATTN_GOLDEN_OUT")) {
    std::ofstream f(out);
    for (const decision_test::Case& c : cases) f << decision_test::name(c) << " => " << decide(c) << "\n";
    ASSERT_TRUE(f) << "cannot write " << out;
  }
  int refused = 0, compound = 0, band = 0;
  for (const decision_test::Case& c : cases) {
    const std::string name = decision_test::name(c);
    const auto it = golden.find(name);
    ASSERT_NE(it, golden.end()) << "no golden decision for " << name;
    const std::string got = decide(c);
    EXPECT_EQ(got, it->second) << name;
    refused += got.starts_with("refused");
    compound += got.starts_with("compound");
    band += got.find("row sm90_band") != std::string::npos;
  }
  // The cases reach each kind of outcome (a table of errors only would pass vacuously).
  EXPECT_GT(refused, 0);
  EXPECT_GT(compound, 0);
  EXPECT_GT(band, 0);
}

// A forced kind filters the planner's candidates: the shape it picks is of that kind's rows, and a pattern whose
// cheapest candidate is of another kind gets the kind's first shape, not a refusal.
TEST(LaunchDecision, ForcedKindFiltersCandidates) {
  const BoundPattern pat = parse("bigbird(64, 1, 2, 3, seed=0)").bind(4096, 4096);
  const Analysis an = analyze(pat);
  PlanOptions chosen;
  const PatternDecision free = decide_pattern(pat, an, 64, GpuTarget{90, 132}, chosen);
  ASSERT_FALSE(free.compound());
  EXPECT_NE(kKernels[free.launches[0]->kernel_row].kind, KernelKind::sm90_tma) << free.launches[0]->why;
  PlanOptions tma;
  tma.kernel = "sm90_tma";
  const PatternDecision forced = decide_pattern(pat, an, 64, GpuTarget{90, 132}, tma);
  EXPECT_EQ(kKernels[forced.launches[0]->kernel_row].kind, KernelKind::sm90_tma);
  EXPECT_NE(forced.launches[0]->why.find("asked for"), std::string::npos) << forced.launches[0]->why;
}

// Issue 42 on an sm_90a target: sparse_strided's strided term runs as an affine part grouped by residue (its stride)
// beside the band part, stride and dilated terms alone as one list grouped past stride 16; the GPU tests' cases
// (PlanGpu.AffinePartsAtAnyStrideMatchReference, explain's reasons) and the bench's (L 16384 and 65536, D 64 and 128).
TEST(LaunchDecision, AffinePartsAtAnyStride) {
  struct C {
    const char* spec;
    int64_t L, D;
    int compound;
    bool affine;
    int perm;
  } const cases[] = {
      // Groups of at most 32 tokens grouped coarser (choose_block_plan, coarser_groups; issue 42): 2 or 4 residues
      // of the lattice a group, bitmask tiles, half or a quarter of the items.
      {"sparse_strided(256)", 4099, 64, -1, true, 128},
      {"sparse_strided(128)", 3001, 128, 1, true, 64},
      {"sparse_strided(512)", 9001, 64, 1, true, 256},
      {"local(left=300, right=0) | (stride(256) & causal)", 4099, 128, 1, true, 128},
      {"stride(64) & causal", 5000, 128, -1, false, 64},
      {"dilated(64, 32)", 4097, 64, -1, false, 32},
      {"dilated(9, 100) & causal", 3333, 64, -1, false, 100},
      {"sparse_strided(128)", 16384, 64, -1, true, 128},
      {"sparse_strided(256)", 16384, 128, -1, true, 256},
      {"sparse_strided(512)", 16384, 64, -1, true, 256},  // 512 groups of 32 -> 256 of 64
      {"sparse_strided(128)", 65536, 128, -1, true, 128},
      {"sparse_strided(256)", 65536, 64, -1, true, 256},
      {"sparse_strided(512)", 65536, 128, -1, true, 512},
  };
  for (const C& c : cases) {
    SCOPED_TRACE(std::string(c.spec) + " at " + std::to_string(c.L) + ", D " + std::to_string(c.D));
    const BoundPattern pat = parse(c.spec).bind(c.L, c.L);
    PlanOptions o;
    o.compound = c.compound;
    const PatternDecision d = decide_pattern(pat, analyze(pat), c.D, GpuTarget{90, 132}, o);
    ASSERT_EQ(d.split.parts.size(), c.affine ? 2u : 1u) << d.split.describe();
    const size_t i = c.affine ? 1 : 0;
    if (c.affine) {
      EXPECT_EQ(d.split.parts[1].kind, PartKind::affine);
      EXPECT_TRUE(d.launches[0]->tiles.band) << "the band part on the band kernel: " << d.launches[0]->why;
    }
    EXPECT_EQ(d.launches[i]->tiles.perm_d, c.perm) << d.launches[i]->tiles.describe();
    EXPECT_NE(d.launches[i]->why.find("residue permutation " + std::to_string(c.perm) + " "), std::string::npos)
        << d.launches[i]->why;
  }
}

// Head sections of a launch's work order (plan::head_section): whole groups of the kv head's q heads, as many as fit in
// 5/8 of the L2, at least one; none where one section holds every unit, where the lists are uneven (imbalance past
// 8) or reach less than a third of the other axis, or where the inputs say nothing (no L2, no bytes);
// SPATTN_HEAD_SECTION overrides (0 none, n groups).
TEST(LaunchDecision, HeadSections) {
  ::unsetenv("SPATTN_HEAD_SECTION");
  const int64_t l2 = 50 << 20, mb = 1 << 20;
  const ListShape even{2.0, 0.5}, uneven{9.0, 0.5}, near{1.0, 0.2};
  // causal D = 128, L = 8192, B x H = 32: a kv head's K and V are 4 MiB; 31.25 MiB take 7 of them.
  EXPECT_EQ(head_section(4 * mb, 32, 1, l2, even), 7);
  EXPECT_EQ(head_section(4 * mb, 32, 4, l2, even), 28);  // GQA 4: seven kv heads, 28 q heads
  EXPECT_EQ(head_section(64 * mb, 32, 1, l2, even), 1);  // past the L2: one unit a section
  EXPECT_EQ(head_section(64 * mb, 32, 8, l2, even), 8);  // ... one whole group
  EXPECT_EQ(head_section(mb, 16, 1, l2, even), 0);       // every unit fits: one section
  EXPECT_EQ(head_section(4 * mb, 32, 1, l2, uneven), 0);  // global rows
  EXPECT_EQ(head_section(4 * mb, 32, 1, l2, near), 0);    // windows
  EXPECT_EQ(head_section(4 * mb, 32, 1, l2, ListShape{}), 7);  // lists not known (run-time): as even, far
  EXPECT_EQ(head_section(4 * mb, 32, 1, 0, even), 0);
  EXPECT_EQ(head_section(0, 32, 1, l2, even), 0);
  ::setenv("SPATTN_HEAD_SECTION", "0", 1);
  EXPECT_EQ(head_section(4 * mb, 32, 1, l2, even), 0);
  ::setenv("SPATTN_HEAD_SECTION", "3", 1);
  EXPECT_EQ(head_section(4 * mb, 32, 2, l2, uneven), 6);
  ::unsetenv("SPATTN_HEAD_SECTION");
  const std::vector<TileEntry> e = {{0, kFull, 0, 0}, {1, kFull, 0, 0}, {3, kFull, 0, 0}, {2, kFull, 0, 0}};
  const ListShape s = list_shape({0, 2, 3, 4, 4}, e, 4);  // lists {0, 1}, {3}, {2}, {}
  EXPECT_DOUBLE_EQ(s.imbalance, 2.0);                       // 2 over a mean of 1
  EXPECT_DOUBLE_EQ(s.reach, (2.0 / 4 + 1.0 / 4 + 1.0 / 4) / 3);
  EXPECT_DOUBLE_EQ(list_shape({0}, {}, 4).reach, 1.0);
  EXPECT_DOUBLE_EQ(list_shape({0, 0, 0}, {}, 4).imbalance, 1.0);
  // Residue groups (perm_d 2: two groups of 2 tiles): reach within a group, at most 1.
  const ListShape g = list_shape({0, 2, 3, 4, 4}, e, 4, 2);
  EXPECT_EQ(g.groups, 2);
  EXPECT_DOUBLE_EQ(g.reach, (2.0 / 2 + 1.0 / 2 + 1.0 / 2) / 3);
  const std::vector<TileEntry> wide = {{0, kFull, 0, 0}, {3, kFull, 0, 0}};
  EXPECT_DOUBLE_EQ(list_shape({0, 2}, wide, 4, 2).reach, 1.0);
  // A causal residue group's lists reach far within it (reach measured within the group): sections.
  const ListShape grouped{1.6, 0.5, 64};
  EXPECT_EQ(head_section(4 * mb, 32, 1, l2, grouped), 7);
}

// The cases the sections were measured on (bench/LOG.md) fall on the side of the gate they were measured to win on:
// the forward's (query-tile lists) and the backward's (key-major lists) plans.
TEST(LaunchDecision, HeadSectionCases) {
  const GpuTarget h200{90, 132};
  struct Case {
    const char* spec;
    int64_t len, dim;
    bool fwd, bwd;  // sections expected
  };
  const Case cases[] = {
      {"causal", 8192, 128, true, true},
      {"causal", 16384, 64, true, true},
      {"blocked(128, random(8) | local(0)) & causal", 32768, 128, true, true},
      {"dense", 8192, 128, true, true},
      {"local(left=4096, right=0)", 16384, 128, false, false},
      {"local(1024)", 32768, 128, false, false},
      {"local(256)", 16384, 64, false, false},
      {"neighborhood(dims=(96,96), kernel=7)", 9216, 64, false, false},
      {"longformer(256, 32)", 16384, 64, false, false},
      {"bigbird(64, 3, 2, 3)", 16384, 64, false, false},
      {"(local(left=2048, right=0) | global_cols(0:4)) & causal", 32768, 128, true, false},
      // Grouped by residue (issue 42): the backward's lists measured within a group (section_groups), where a
      // section keeps a group's Q, dO and dQ in L2 between its tiles (1.03-1.74x); the forward's against the whole
      // axis (its sections measured 0.94-1.02x).
      {"stride(64) & causal", 16384, 64, false, true},
      {"stride(64) & causal", 65536, 128, false, true},
      {"stride(128) & causal", 65536, 64, false, true},  // sparse_strided(128)'s affine part
      {"dilated(64, 32)", 16384, 64, false, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    const BoundPattern p = parse(c.spec).bind(c.len);
    const Analysis an = analyze(p);
    const LaunchDecision d = decide_tiles(p, &an, c.dim, h200, FusedOptions{});
    const ListShape f =
        list_shape(d.tiles.row_offsets, d.tiles.entries, d.tiles.k_tiles, section_groups(false, d.tiles.perm_d));
    EXPECT_EQ(head_section(4 << 20, 1024, 1, 50 << 20, f) > 0, c.fwd) << f.imbalance << " " << f.reach;
    const int row = backward_row(backward_choice("", c.dim), an, c.dim);
    const BlockPlan bp = backward_tiles(p, an, c.dim, row);
    const KeyMajorPlan km = key_major(bp);
    const ListShape b = list_shape(km.col_offsets, km.entries, km.q_tiles, section_groups(true, bp.perm_d));
    EXPECT_EQ(head_section(4 << 20, 1024, 1, 50 << 20, b) > 0, c.bwd) << b.imbalance << " " << b.reach;
  }
}

}  // namespace
