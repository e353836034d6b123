// The tilers' shortcuts give the plans that their general paths give (SPATTN_PLAN_GENERAL=1 turns the shortcuts
// off). CPU (all-residue tiles): same tiles, key blocks, row masks, residue lists, key passes and work items
// (FusedPlan::fingerprint). GPU (estimates from shared rows, one-pass bitmasks): the same predicted cost of
// every shape, to the bit, and the same block plan, entry by entry and mask by mask.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "cpu/fused_plan.hpp"
#include "plan/analysis.hpp"
#include "plan/gpu/block_plan.hpp"
#include "plan/parts.hpp"
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
      {"random(1020, seed=1)", 1030, 1030},  // 99%: full tiles to the last rows (samples that never settle)
      {"random(60, seed=4)", 1000, 1500},    // 4%, ragged key tiles: samples settle late
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
      // Band rows in residue groups by the spec (Analysis::groups: analysis, builds and prices in closed form):
      // ragged and unequal lengths, groups of unequal size, bands wider than a group, intersections with bands,
      // dilations past the permutations the GPU takes.
      {"dilated(256, 2)", 3001, 3001},
      {"dilated(100, 3)", 1000, 1500},
      {"dilated(100, 3)", 1500, 1000},
      {"dilated(5, 4) & causal", 2000, 2000},
      {"dilated(300, 7)", 500, 500},
      {"dilated(16, 16)", 4096, 4096},
      {"local(300) & dilated(64, 5)", 3000, 2999},
      {"dilated(1, 2)", 777, 777},
      {"dilated(40, 20)", 2000, 2000},
      {"dilated(3, 9) & local(left=0, right=30)", 100, 130},
      // stride(s) in closed form too (issue 42), past the stride 16 the GPU planner once capped: causal, ragged groups.
      {"stride(64) & causal", 3001, 3001},
      {"stride(100) & causal", 1000, 1500},
      {"stride(300)", 2500, 2300},
      {"sparse_fixed(128)", 4096, 4096},
      {"neighborhood(dims=(64,64), kernel=13)", 4096, 4096},
      // A lone neighborhood atom's analysis in closed form (products of its axes' windows): dilation, causal axes,
      // whole-axis windows (dense rows), 3-D, one used axis of a 2-D grid (one interval a row: the walk decides).
      {"neighborhood(dims=(37,41), kernel=(5,7), dilation=(2,3))", 1517, 1517},
      {"neighborhood(dims=(30,33), kernel=(7,33), causal=(1,0))", 990, 990},
      {"neighborhood(dims=(6,20,22), kernel=(3,5,7))", 2640, 2640},
      {"neighborhood(dims=(16,40), kernel=(3,40))", 640, 640},
      {"neighborhood(dims=(1,300), kernel=(1,9))", 300, 300},
      {"causal", 2048, 2048},
      {"dense", 1000, 1000},
      // Band rows by the spec (analysis and block plans in closed form): ragged and unequal lengths, bands wider
      // than the keys, one-sided and one-key bands, intersections and unions of bands.
      {"local(256)", 1000, 3001},
      {"local(100)", 3001, 777},
      {"local(5000)", 1000, 1000},
      {"local(left=300, right=0)", 2049, 2047},
      {"local(left=0, right=130)", 1500, 1100},
      {"local(left=0, right=0)", 700, 900},
      {"causal", 3000, 1000},
      {"causal", 333, 4097},
      {"dense", 191, 4000},
      {"local(50) & causal", 1025, 1025},
      {"causal | local(3)", 800, 500},
      {"local(left=64, right=0) | local(left=0, right=200)", 1000, 1300},
      {"local(1)", 1, 1},
      // Band rows with a key prefix (Analysis::sinks; longformer's tiles part): prefix tiles from their rows' bits.
      {"local(256) | global_cols(0:32)", 4096, 4096},
      {"local(left=100, right=0) | global_cols(0:4)", 3001, 3001},
      {"local(64) | global_cols(0:130)", 2000, 2100},
      {"local(10) | global_cols(0:3)", 1000, 700},
      {"local(left=5, right=300) | global_cols(0:64)", 777, 3001},
      {"causal | global_cols(0:40)", 1000, 1000},
      // ... and with dense rows (global(0:g), global_rows(0:r): longformer's analysis in closed form).
      {"longformer(256, 32)", 16384, 16384},
      {"longformer(100, 7)", 3001, 2999},
      {"local(left=100, right=0) | global(0:4)", 2000, 2000},
      {"global(0:64) | local(10)", 1000, 700},
      {"global_rows(0:8) | global_cols(0:16) | local(32)", 1500, 1500},
      {"global_rows(0:8) | local(32)", 1000, 1000},
      {"local(900) | global(0:4)", 1000, 1000},
      {"global(0:3) | local(1)", 40, 40},
      // Rows alike by blocks (BoundPattern::row_block): blocks off the tile sizes, ragged, unions of two blocks.
      {"blocked(48, local(1) | random(2, seed=3))", 1000, 1000},
      {"blocked(64, causal) | blocked(32, local(1))", 777, 900},
      {"blocked(128, local(1) | global(0:1))", 3000, 3000},
      {"sparse_fixed(100, 3)", 3001, 3001},
      {"block_diag(70) | summary(64)", 1000, 1100},
      // ... by their block rows (Analysis::blocks; counts alone where rows have strided runs: sparse_fixed's summary
      // columns): block_diag (sparse_fixed's tiles part) off the tile sizes, Lq != Lk, Lk short of the last blocks
      // (empty rows), a last block of one row, blocks of two rows; two spans a row ([0, g) apart from the block: the
      // walk's sinks check decides; not from key 0: no sinks rows); sparse_fixed tiny, ragged, Lq != Lk.
      {"block_diag(128)", 4096, 4096},
      {"block_diag(100)", 3001, 2999},
      {"block_diag(100)", 1000, 150},
      {"block_diag(64)", 65, 100},
      {"block_diag(50)", 101, 150},
      {"block_diag(50)", 51, 100},
      {"block_diag(2)", 999, 1000},
      {"block_diag(64)", 64, 64},
      {"block_diag(3)", 10, 2},
      {"block_diag(64) | global_cols(0:10)", 1000, 1000},
      {"block_diag(64) | global_cols(3:10)", 1000, 1000},
      {"sparse_fixed(128)", 1000, 1000},
      {"sparse_fixed(100, 3)", 3001, 2000},
      {"sparse_fixed(64)", 100, 3001},
      {"sparse_fixed(16, 4)", 50, 50},
      {"sparse_fixed(128)", 64, 64},
      // Blocked rows by their block rows (Analysis::blocks: analysis, prices and builds from the block rows): bigbird
      // at its bench size, ragged lengths, blocks of 32, 64, 128 and off the tile sizes, Lq != Lk, a last block of one
      // row (tiles of one valid row: band entries), blocks of one row, global rows, unions and intersections inside.
      {"bigbird(64, 1, 2, 3, seed=0)", 16384, 16384},
      {"bigbird(64, 1, 2, 3, seed=0)", 3001, 3001},
      {"bigbird(32, 1, 2, 3, seed=1)", 2000, 2000},
      {"bigbird(128, 2, 1, 2, seed=2)", 3000, 2500},
      {"bigbird(64, 1, 2, 3)", 1000, 3001},
      {"bigbird(64, 1, 2, 3)", 3001, 1000},
      {"bigbird(64, 1, 2, 3)", 1025, 1090},
      {"bigbird(100, 1, 1, 2, seed=4)", 2049, 2049},
      {"blocked(1, local(2) | random(3))", 500, 600},
      {"blocked(16, local(3) | random(2, seed=9))", 1000, 1000},
      {"blocked(64, (local(2) | random(4, seed=7)) & causal)", 2000, 2000},
      {"blocked(32, (causal & local(3)) | global_rows(3) | global_cols(5) | random(2))", 1500, 1300},
      {"blocked(128, local(1) | global(0:1) | random(1))", 4097, 4097},
      // ... and strided inner rows (counts alone), rows of one or two spans (by the block rows where the walk would
      // find no band, window or sinks rows, else by the walk).
      {"blocked(32, local(1) | stride(9))", 1000, 1000},
      {"blocked(64, local(1))", 1000, 1000},
      {"blocked(64, local(1))", 1025, 900},
      {"blocked(64, dense)", 1000, 777},
      {"blocked(64, local(1) | global_cols(0:1))", 2000, 2000},
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

void expect_same(const spattn::plan::BlockPlan& a, const spattn::plan::BlockPlan& b) {
  EXPECT_EQ(a.block_m, b.block_m);
  EXPECT_EQ(a.block_n, b.block_n);
  EXPECT_EQ(a.perm_d, b.perm_d);
  EXPECT_EQ(a.q_tiles, b.q_tiles);
  EXPECT_EQ(a.k_tiles, b.k_tiles);
  EXPECT_EQ(a.nnz, b.nnz);
  EXPECT_EQ(a.n_full, b.n_full);
  EXPECT_EQ(a.n_band, b.n_band);
  EXPECT_EQ(a.n_bitmask, b.n_bitmask);
  EXPECT_EQ(a.band, b.band);
  EXPECT_EQ(a.band_lo, b.band_lo);
  EXPECT_EQ(a.band_hi, b.band_hi);
  EXPECT_EQ(a.row_offsets, b.row_offsets);
  EXPECT_EQ(a.order, b.order);
  // Entry by entry; a bitmask by its bits (plans may share one among entries: a key prefix's tiles).
  ASSERT_EQ(a.entries.size(), b.entries.size());
  const size_t words = size_t(a.words_per_mask());
  for (size_t i = 0; i < a.entries.size(); ++i) {
    const auto &x = a.entries[i], &y = b.entries[i];
    ASSERT_TRUE(x.kt == y.kt && (x.mask < 0 ? x.mask == y.mask : y.mask >= 0) && x.lo == y.lo && x.hi == y.hi)
        << "entry " << i;
    if (x.mask >= 0)
      ASSERT_TRUE(std::equal(a.masks.begin() + ptrdiff_t(size_t(x.mask) * words), a.masks.begin() + ptrdiff_t(size_t(x.mask + 1) * words),
                             b.masks.begin() + ptrdiff_t(size_t(y.mask) * words)))
          << "entry " << i << "'s bitmask";
  }
}

// An analysis by the shortcuts (f) and by the row walk (g): the same counts and rows found.
void expect_same(const spattn::plan::Analysis& f, const spattn::plan::Analysis& g) {
  EXPECT_EQ(f.nnz, g.nnz);
  EXPECT_EQ(f.empty_rows, g.empty_rows);
  EXPECT_EQ(f.dense_rows, g.dense_rows);
  EXPECT_EQ(f.min_row, g.min_row);
  EXPECT_EQ(f.max_row, g.max_row);
  for (auto [x, y] : {std::pair{f.band, g.band}, std::pair{f.window, g.window}, std::pair{f.sinks, g.sinks}}) {
    EXPECT_EQ(x.ok, y.ok);
    EXPECT_EQ(x.lo, y.lo);
    EXPECT_EQ(x.hi, y.hi);
  }
  EXPECT_EQ(f.prefix, g.prefix);
  EXPECT_EQ(f.residue, g.residue);
}

// The analysis of b by its shortcuts and by the row walk (SPATTN_PLAN_GENERAL=1), and its nnz the pattern's.
void expect_same_analysis(const spattn::BoundPattern& b) {
  set_general(true);
  const auto g = spattn::plan::analyze(b);
  set_general(false);
  const auto f = spattn::plan::analyze(b);
  expect_same(f, g);
  EXPECT_EQ(f.nnz, b.nnz());
}

TEST(PlanPaths, AnalysisShortcutsGiveTheSameAnalysis) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.spec + " " + std::to_string(c.lq) + "x" + std::to_string(c.lk));
    const auto b = spattn::parse(c.spec).bind(c.lq, c.lk);
    expect_same_analysis(b);
    if (const auto band = b.band()) {  // the spec's band is the rows'
      for (int64_t q : {int64_t(0), c.lq / 3, c.lq / 2, c.lq - 1}) {
        const int64_t s = std::max<int64_t>(0, q + band->first), e = std::min(c.lk - 1, q + band->second);
        const auto runs = b.row(q);
        if (s > e) {
          EXPECT_TRUE(runs.empty()) << "row " << q;
        } else {
          ASSERT_EQ(runs.size(), 1u) << "row " << q;
          EXPECT_EQ(runs[0].start, s) << "row " << q;
          EXPECT_EQ(runs[0].last(), e) << "row " << q;
        }
      }
    }
  }
}

// Band rows united with random rows (BoundPattern::band_random: counted by the random rows' keys outside the band):
// the suite's bandrand, causal and sliding windows, ragged lengths, r near Lk and past it (the walk), tiny lengths,
// bands covering every key (rows that never fail the walk's checks: the walk decides), specs that are not such unions.
TEST(PlanPaths, BandRandomRowsGiveTheWalksAnalysis) {
  for (const Case& c : std::vector<Case>{{"local(256) | random(4, seed=1)", 16384, 16384},
                                         {"local(256) | random(4, seed=1)", 3001, 1000},
                                         {"local(256) | random(4, seed=1)", 1000, 3001},
                                         {"causal | random(3)", 2000, 2000},
                                         {"random(5, seed=2) | causal", 1000, 3000},
                                         {"causal | random(5, seed=2)", 3000, 1000},
                                         {"local(left=100, right=0) | random(2, seed=7)", 2049, 2049},
                                         {"local(left=0, right=50) | random(8)", 777, 900},
                                         {"local(10) | causal | random(6)", 1500, 1500},
                                         {"local(64) | random(9, seed=3)", 1000, 1000},
                                         {"local(16) | random(200, seed=2)", 1000, 1000},
                                         {"causal | random(500)", 700, 1500},
                                         {"local(1) | random(1000, seed=8)", 300, 1200},
                                         {"local(3) | random(99)", 100, 100},
                                         {"local(1) | random(127, seed=4)", 300, 128},
                                         {"causal | random(1000)", 500, 1001},
                                         {"local(2) | random(50)", 40, 40},
                                         {"local(2) | random(40)", 41, 41},
                                         {"local(1) | random(1)", 1, 1},
                                         {"local(1) | random(1)", 2, 2},
                                         {"local(1) | random(1, seed=5)", 3, 5},
                                         {"local(1) | random(2)", 5, 3},
                                         {"local(2) | random(3)", 1, 7},
                                         {"local(left=3, right=0) | random(1)", 10, 10},
                                         {"local(5) | random(1, seed=3)", 64, 64},
                                         {"local(1000) | random(4)", 500, 500},
                                         {"local(left=0, right=0) | random(1)", 9, 9},
                                         {"dilated(8, 2) | random(3)", 500, 500},
                                         {"local(8) | random(3) | random(2)", 500, 500},
                                         {"local(8) | global_cols(0:4) | random(3)", 500, 500}}) {
    SCOPED_TRACE(c.spec + " " + std::to_string(c.lq) + "x" + std::to_string(c.lk));
    const auto b = spattn::parse(c.spec).bind(c.lq, c.lk);
    expect_same_analysis(b);
    // The split beside it (the device draws the random part: its nnz from the analysis's, less the band part's).
    const auto an = spattn::plan::analyze(b);
    set_general(true);
    const auto g = spattn::plan::split_pattern(b, an, -1, spattn::plan::SplitTarget{true, true});
    set_general(false);
    const auto f = spattn::plan::split_pattern(b, an, -1, spattn::plan::SplitTarget{true, true});
    ASSERT_EQ(f.parts.size(), g.parts.size());
    int64_t nnz = 0;
    for (size_t i = 0; i < f.parts.size(); ++i) {
      EXPECT_EQ(f.parts[i].kind, g.parts[i].kind);
      EXPECT_EQ(f.parts[i].nnz, g.parts[i].nnz);
      EXPECT_EQ(f.parts[i].terms, g.parts[i].terms);
      EXPECT_EQ(f.parts[i].drawn_lo, g.parts[i].drawn_lo);
      EXPECT_EQ(f.parts[i].drawn_hi, g.parts[i].drawn_hi);
      if (f.parts[i].analysis) EXPECT_EQ(f.parts[i].analysis->nnz, f.parts[i].nnz);
      nnz += f.parts[i].nnz;
    }
    EXPECT_EQ(nnz, b.nnz());
  }
}

// What the specs say of their bands and prefixes (the closed forms' inputs).
TEST(PlanPaths, BandSpecs) {
  auto spec = [](const char* s, int64_t l) { return spattn::parse(s).bind(l, l).band_spec(); };
  const auto lf = spec("longformer(256, 32)", 4096);
  ASSERT_TRUE(lf);
  EXPECT_EQ(lf->lo, -256);
  EXPECT_EQ(lf->hi, 256);
  EXPECT_EQ(lf->key_prefix, 32);
  EXPECT_EQ(lf->row_prefix, 32);
  const auto sinks = spec("local(left=100, right=0) | global_cols(0:4)", 4096);
  ASSERT_TRUE(sinks);
  EXPECT_EQ(sinks->key_prefix, 4);
  EXPECT_EQ(sinks->row_prefix, 0);
  EXPECT_TRUE(spattn::parse("causal").bind(100, 50).band());
  EXPECT_FALSE(spattn::parse("longformer(256, 32)").bind(4096, 4096).band());
  EXPECT_FALSE(spec("global_cols(0:4)", 64));
  EXPECT_FALSE(spec("local(2) | global_cols(1:4)", 64));
  EXPECT_FALSE(spec("dilated(4, 2)", 64));
  auto band_random = [](const char* s, int64_t l) { return spattn::parse(s).bind(l, l).band_random(); };
  const auto br = band_random("local(256) | random(4, seed=1)", 4096);
  ASSERT_TRUE(br);
  EXPECT_EQ(br->lo, -256);
  EXPECT_EQ(br->hi, 256);
  EXPECT_EQ(br->random.r, 4);
  EXPECT_EQ(br->random.seed, 1u);
  const auto br2 = band_random("random(7, seed=3) | causal | local(3)", 100);
  ASSERT_TRUE(br2);
  EXPECT_EQ(br2->lo, -100);
  EXPECT_EQ(br2->hi, 3);
  EXPECT_EQ(br2->random.r, 7);
  EXPECT_FALSE(band_random("random(3)", 64));
  EXPECT_FALSE(band_random("local(3)", 64));
  EXPECT_FALSE(band_random("local(8) | random(3) | random(2)", 64));
  EXPECT_FALSE(band_random("local(8) | global_cols(0:4) | random(3)", 64));
  EXPECT_FALSE(band_random("dilated(8, 2) | random(3)", 64));
  EXPECT_FALSE(band_random("local(8) | random(3) & causal", 64));
  auto dil = [](const char* s, int64_t l) { return spattn::parse(s).bind(l, l).dilated_band(); };
  auto expect_dil = [&](const char* s, int64_t l, int64_t lo, int64_t hi, int64_t d) {
    SCOPED_TRACE(s);
    const auto db = dil(s, l);
    ASSERT_TRUE(db);
    EXPECT_EQ(db->lo, lo);
    EXPECT_EQ(db->hi, hi);
    EXPECT_EQ(db->d, d);
  };
  expect_dil("dilated(4, 2)", 64, -4, 4, 2);
  expect_dil("dilated(10, 3) & causal & local(left=20, right=5)", 100, -6, 0, 3);  // m 3 in [-20, 0]: -6 .. 0
  expect_dil("local(left=7, right=5)", 100, -7, 5, 1);                           // a band: d 1
  EXPECT_FALSE(dil("dilated(4, 2) & dilated(4, 3)", 64));
  EXPECT_FALSE(dil("dilated(4, 2) | local(3)", 64));
  EXPECT_FALSE(spec("local(1) | local(left=0, right=5) & global_cols(0:3)", 64));
  const auto bb = spattn::parse("bigbird(64, 1, 2, 3, seed=0)").bind(1000, 3001).blocked();  // blocks 16 x 47
  ASSERT_TRUE(bb);
  EXPECT_EQ(bb->block, 64);
  EXPECT_EQ(bb->inner.q_len(), 16);
  EXPECT_EQ(bb->inner.k_len(), 47);
  EXPECT_EQ(bb->inner.spec(), "local(1) | global(0:2) | random(3, seed=0)");
  EXPECT_FALSE(spattn::parse("blocked(64, causal) | local(1)").bind(100, 100).blocked());
  EXPECT_FALSE(spattn::parse("local(1)").bind(100, 100).blocked());
  auto block = [](const char* s) { return spattn::parse(s).bind(1000, 1000).row_block(); };
  EXPECT_EQ(block("bigbird(64, 1, 2, 3, seed=0)"), 64);
  EXPECT_EQ(block("blocked(64, causal) | blocked(48, local(1))"), 16);
  EXPECT_EQ(block("blocked(64, causal) & blocked(32, local(1))"), 32);
  EXPECT_EQ(block("local(3) | blocked(8, causal)"), 1);
  EXPECT_EQ(block("random(5)"), 1);
  EXPECT_EQ(block("sparse_fixed(128)"), 128);  // summary: every row alike
  EXPECT_EQ(block("summary(8) | global_cols(3)"), 1000);
  EXPECT_EQ(block("global_rows(3) | dense"), 1);
}

// Rows alike by blocks take their block rows (Analysis::blocks) where the walk would find no band, window or sinks
// rows: block_diag and both parts of sparse_fixed at its bench size; not dense blocks (band rows) or rows [0, g) apart
// from a block (the walk's sinks check decides).
TEST(PlanPaths, RowsAlikeByBlocks) {
  auto blocks = [](const char* s, int64_t lq, int64_t lk) {
    return spattn::plan::analyze(spattn::parse(s).bind(lq, lk)).blocks != nullptr;
  };
  EXPECT_TRUE(blocks("block_diag(128)", 16384, 16384));
  EXPECT_TRUE(blocks("block_diag(100)", 3001, 2999));
  EXPECT_TRUE(blocks("block_diag(64) | global_cols(3:10)", 1000, 1000));
  EXPECT_FALSE(blocks("block_diag(64)", 64, 64));
  EXPECT_FALSE(blocks("block_diag(64) | global_cols(0:10)", 1000, 1000));
  EXPECT_FALSE(blocks("sparse_fixed(128)", 16384, 16384));  // a strided run (its summary columns): counts alone
  const auto b = spattn::parse("sparse_fixed(128)").bind(16384, 16384);
  for (const auto& part : spattn::plan::split_pattern(b, spattn::plan::analyze(b), -1).parts)
    EXPECT_TRUE(spattn::plan::analyze(part.pattern).blocks) << part.terms;
}

// Rows of all keys or none by the spec (the split's owned rows): the rows the walk finds.
TEST(PlanPaths, DenseRowRangesAreTheRows) {
  for (const Case& c : std::vector<Case>{{"global_rows(0:32)", 4096, 4096}, {"global_rows(5, 10:20, 2990:3001)", 3001, 50},
                                         {"global_rows(0:4) | global_rows(2:9) | global_rows(9)", 100, 100},
                                         {"global_rows(4)", 5, 5}}) {
    SCOPED_TRACE(c.spec);
    const auto b = spattn::parse(c.spec).bind(c.lq, c.lk);
    const auto ranges = b.dense_row_ranges();
    ASSERT_TRUE(ranges);
    std::vector<char> in(size_t(c.lq), 0);
    for (auto [f, e] : *ranges)
      for (int64_t q = f; q < e; ++q) in[size_t(q)] = 1;
    for (int64_t q = 0; q < c.lq; ++q) EXPECT_EQ(b.row_nnz(q), in[size_t(q)] ? c.lk : 0) << "row " << q;
  }
  EXPECT_FALSE(spattn::parse("global(0:4)").bind(64, 64).dense_row_ranges());
  EXPECT_FALSE(spattn::parse("global_rows(0:4) | local(2)").bind(64, 64).dense_row_ranges());
  // The split's rows part from them, as from the walk.
  for (const char* spec : {"longformer(256, 32)", "local(64) | global_rows(100:120)", "causal | global_rows(0:8)"}) {
    SCOPED_TRACE(spec);
    const auto b = spattn::parse(spec).bind(4096, 4096);
    const auto an = spattn::plan::analyze(b);
    for (int mode : {-1, 1}) {
      set_general(true);
      const auto g = spattn::plan::split_pattern(b, an, mode, spattn::plan::SplitTarget{true});
      set_general(false);
      const auto f = spattn::plan::split_pattern(b, an, mode, spattn::plan::SplitTarget{true});
      ASSERT_EQ(f.parts.size(), g.parts.size());
      for (size_t i = 0; i < f.parts.size(); ++i) {
        EXPECT_EQ(f.parts[i].kind, g.parts[i].kind);
        EXPECT_EQ(f.parts[i].row_begin, g.parts[i].row_begin);
        EXPECT_EQ(f.parts[i].row_end, g.parts[i].row_end);
        EXPECT_EQ(f.parts[i].nnz, g.parts[i].nnz);
        EXPECT_EQ(f.parts[i].terms, g.parts[i].terms);
      }
    }
  }
}

// The compound split's parts (gathered columns less the tiles' keys, with owned rows: rows alike by blocks of the
// skipped rows' ends): the same analyses and block plans by either path.
TEST(PlanPaths, PartsGiveTheSamePlans) {
  // sparse_fixed at its bench size and at awkward ones (ragged, Lq != Lk, blocks off the tile sizes, tiny L).
  for (const Case& c : std::vector<Case>{{"sparse_fixed(128)", 4096, 4096}, {"sparse_fixed(100, 3)", 3001, 3001},
                                         {"dilated(6, 3) | summary(12, c=2) | global_rows(3:5)", 1000, 1000},
                                         {"block_diag(64) | summary(64) | global_rows(32:96)", 2000, 2000},
                                         {"sparse_fixed(128)", 16384, 16384}, {"sparse_fixed(100)", 3001, 2000},
                                         {"sparse_fixed(128)", 1000, 1000}, {"sparse_fixed(64, 2)", 130, 4097},
                                         {"sparse_fixed(16)", 40, 40}, {"sparse_fixed(128)", 200, 200}}) {
    const auto b = spattn::parse(c.spec).bind(c.lq, c.lk);
    for (const auto& part : spattn::plan::split_pattern(b, spattn::plan::analyze(b), 1).parts) {
      if (part.kind == spattn::plan::PartKind::scattered) continue;
      SCOPED_TRACE(c.spec + " " + std::to_string(c.lq) + "x" + std::to_string(c.lk) + " part " + part.terms);
      set_general(true);
      const auto ga = spattn::plan::analyze(part.pattern);
      set_general(false);
      const auto fa = spattn::plan::analyze(part.pattern);
      expect_same(fa, ga);
      for (auto [bm, bn] : std::vector<std::pair<int, int>>{{64, 64}, {64, 128}, {128, 128}, {192, 128}}) {
        SCOPED_TRACE(std::to_string(bm) + "x" + std::to_string(bn));
        set_general(true);
        const auto g = spattn::plan::build_block_plan(part.pattern, bm, bn, 1, &ga);
        set_general(false);
        expect_same(spattn::plan::build_block_plan(part.pattern, bm, bn, 1, &fa), g);
      }
      // The choice too (the sm_90a rows' shapes priced in closed form against the walk's samples).
      for (bool tma : {false, true}) {
        set_general(true);
        const auto gc = spattn::plan::block_shape_costs(part.pattern, ga, 64, tma);
        set_general(false);
        const auto fc = spattn::plan::block_shape_costs(part.pattern, fa, 64, tma);
        ASSERT_EQ(fc.size(), gc.size());
        for (size_t i = 0; i < fc.size(); ++i) {
          EXPECT_EQ(fc[i].cost, gc[i].cost) << "shape " << i;
          EXPECT_EQ(fc[i].kept, gc[i].kept) << "shape " << i;
        }
      }
    }
  }
}

TEST(PlanPaths, GpuTilerShortcutsGiveTheSamePlan) {
  for (const Case& c : cases()) {
    const auto b = spattn::parse(c.spec).bind(c.lq, c.lk);
    const auto an = spattn::plan::analyze(b);
    for (int64_t head_dim : {64, 128})
      for (bool tma : {false, true}) {
        SCOPED_TRACE(c.spec + " " + std::to_string(c.lq) + "x" + std::to_string(c.lk) + " D" + std::to_string(head_dim) +
                     (tma ? " tma" : ""));
        set_general(true);
        const auto general_costs = spattn::plan::block_shape_costs(b, an, head_dim, tma);
        const auto general = spattn::plan::choose_block_plan(b, an, head_dim, 0, 0, -1, tma);
        set_general(false);
        const auto fast_costs = spattn::plan::block_shape_costs(b, an, head_dim, tma);
        const auto fast = spattn::plan::choose_block_plan(b, an, head_dim, 0, 0, -1, tma);
        ASSERT_EQ(fast_costs.size(), general_costs.size());
        for (size_t i = 0; i < fast_costs.size(); ++i) {
          EXPECT_EQ(fast_costs[i].block_m, general_costs[i].block_m);
          EXPECT_EQ(fast_costs[i].block_n, general_costs[i].block_n);
          EXPECT_EQ(fast_costs[i].perm_d, general_costs[i].perm_d);
          EXPECT_EQ(fast_costs[i].cost, general_costs[i].cost) << "shape " << i;  // exactly: same sums, same order
          EXPECT_EQ(fast_costs[i].kept, general_costs[i].kept) << "shape " << i;  // the samples' kept scores
        }
        expect_same(fast, general);
      }
    // Every shape, with and without the permutation, through the builder alone.
    std::vector<int> perms = {1};
    if (an.permutation(16) > 1) perms.push_back(an.permutation(16));
    for (int d : perms)
      for (auto [bm, bn] : std::vector<std::pair<int, int>>{{64, 64}, {64, 128}, {128, 128}, {192, 128}}) {
        SCOPED_TRACE(c.spec + " " + std::to_string(bm) + "x" + std::to_string(bn) + " d" + std::to_string(d));
        set_general(true);
        const auto general = spattn::plan::build_block_plan(b, bm, bn, d, &an);
        set_general(false);
        expect_same(spattn::plan::build_block_plan(b, bm, bn, d, &an), general);
      }
  }
}

}  // namespace
