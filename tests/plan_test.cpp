// The fused kernel's tile plan (src/plan/gpu) on the CPU: built on several threads it is the same
// plan as built on one, and it accounts for every kept score.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "plan/analysis.hpp"
#include "plan/gpu/block_plan.hpp"
#include "plan/gpu/launch.hpp"
#include "plan/kernels.hpp"
#include "plan/key_plan.hpp"
#include "plan/parts.hpp"
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

TEST(BlockPlan, ShiftedWindowRows) {
  // 1-D neighborhoods keep W keys a row, the window shifted inside the keys at either end (PATTERNS.md): not one
  // diagonal band, but a band with two clamps (Analysis::window; BlockPlan::band_shifted), which the band kernel runs.
  struct C {
    std::string spec;
    int64_t lq, lk;
    bool window;
    int32_t lo, hi;
  };
  const std::vector<C> cases = {
      {"neighborhood(kernel=257)", 16384, 16384, true, -128, 128},  // the suite's na1d
      {"neighborhood(kernel=257)", 1000, 1000, true, -128, 128},
      {"neighborhood(kernel=8)", 300, 300, true, -4, 3},  // even kernel: K/2 before the query, K/2 - 1 after
      {"neighborhood(kernel=257)", 258, 258, true, -128, 128},  // two unclamped rows... none: 258 - 257 = 1
      {"neighborhood(kernel=9, causal=1)", 500, 500, false, 0, 0},  // a plain band (Analysis::band)
      {"neighborhood(kernel=5, dilation=3)", 301, 301, false, 0, 0},  // strided rows: the residue permutation's
      {"neighborhood(kernel=257) | global(0:4)", 1000, 1000, false, 0, 0},
      {"local(100)", 1000, 1000, false, 0, 0},  // band rows
      {"neighborhood(kernel=300)", 300, 300, false, 0, 0},  // every row every key: dense, a band
  };
  for (const C& c : cases) {
    SCOPED_TRACE(c.spec + " L=" + std::to_string(c.lq));
    const auto b = spattn::parse(c.spec).bind(c.lq, c.lk);
    const auto an = spattn::plan::analyze(b);
    if (c.lq == 258) {  // rows 0-128 keep keys 0-256, 129-257 keys 1-257: no row is an unclamped window
      EXPECT_FALSE(an.window.ok);
      continue;
    }
    EXPECT_EQ(an.window.ok, c.window);
    EXPECT_FALSE(an.window.ok && an.band.ok) << "a window only where the rows are no plain band";
    if (!c.window || !an.window.ok) continue;
    EXPECT_EQ(an.window.lo, c.lo);
    EXPECT_EQ(an.window.hi, c.hi);
    EXPECT_NE(an.describe().find("window rows"), std::string::npos) << an.describe();
    // The plan's rows (band_first ... band_last) are the pattern's, everywhere.
    const auto p = spattn::plan::build_block_plan(b, 192, 128, 1, &an);
    EXPECT_TRUE(p.band && p.band_shifted && p.band_lo == c.lo && p.band_hi == c.hi) << p.describe();
    int64_t mismatches = 0;
    for (int64_t q = 0; q < c.lq; q += (q < 300 || q > c.lq - 300 ? 1 : 37))
      for (int64_t k = 0; k < c.lk; ++k) mismatches += b.contains(q, k) != (k >= p.band_first(q) && k <= p.band_last(q));
    EXPECT_EQ(mismatches, 0);
    // The planner gives window rows the band kernel's 192x128 plan on sm_90a at head dim 64, as it does band rows.
    const auto chosen = spattn::plan::choose_block_plan(b, an, 64, 0, 0, -1, true);
    EXPECT_TRUE(chosen.band && chosen.band_shifted && chosen.block_m == 192) << chosen.describe();
    EXPECT_TRUE(spattn::plan::band_kernel_runs(chosen, 64, -1)) << chosen.describe();
  }
  // Plain bands keep their meaning: band_first / band_last are the clipped band.
  const auto loc = spattn::parse("local(10)").bind(100);
  const auto lp = spattn::plan::build_block_plan(loc, 192, 128, 1);
  EXPECT_TRUE(lp.band && !lp.band_shifted);
  EXPECT_EQ(lp.band_first(3), 0);
  EXPECT_EQ(lp.band_last(95), 99);
  EXPECT_EQ(lp.band_first(50), 40);
}

TEST(BlockPlan, BandRowsWithKeyPrefix) {
  // Band rows united with keys [0, G) that every row keeps (longformer's local | global_cols, attention sinks):
  // Analysis::sinks and BlockPlan::band_prefix, which the band kernel runs (the prefix's chunks first in each slab).
  struct C {
    std::string spec;
    int64_t lq, lk;
    bool sinks;
    int32_t lo, hi, prefix;
  };
  const std::vector<C> cases = {
      {"local(256) | global_cols(0:32)", 16384, 16384, true, -256, 256, 32},  // the rest of longformer(256, 32)
      {"local(left=100, right=0) | global_cols(0:4)", 1000, 1000, true, -100, 0, 4},  // causal window, 4 sinks
      {"local(20) | global_cols(0:50)", 300, 300, true, -20, 20, 50},  // G not a multiple of 64
      {"local(40) | global_cols(0:70)", 333, 200, true, -40, 40, 70},  // Lq != Lk, the band overlapping the prefix
      {"local(left=30, right=0) | global_cols(0)", 500, 500, true, -30, 0, 1},
      {"local(8) | global_cols(0:200)", 1000, 1000, true, -8, 8, 200},  // found; too long for the band kernel
      {"local(300) | global_cols(0:32)", 300, 300, false, 0, 0, 0},  // every row keeps every key: band rows
      {"local(20) | global_cols(5:9)", 300, 300, false, 0, 0, 0},  // columns not at key 0
      {"local(20) | global_cols(0:4, 100)", 300, 300, false, 0, 0, 0},
      {"longformer(20, 4)", 300, 300, false, 0, 0, 0},  // the global rows keep every key
      {"local(left=20, right=0) | global_cols(0:4) | global_rows(7)", 300, 300, false, 0, 0, 0},
      {"dilated(4, 3) | global_cols(0:2)", 300, 300, false, 0, 0, 0},
  };
  for (const C& c : cases) {
    SCOPED_TRACE(c.spec + " at " + std::to_string(c.lq) + "x" + std::to_string(c.lk));
    const auto b = spattn::parse(c.spec).bind(c.lq, c.lk);
    const auto an = spattn::plan::analyze(b);
    EXPECT_EQ(an.sinks.ok, c.sinks) << an.describe();
    EXPECT_FALSE(an.sinks.ok && (an.band.ok || an.window.ok));
    if (!c.sinks || !an.sinks.ok) continue;
    EXPECT_EQ(an.sinks.lo, c.lo);
    EXPECT_EQ(an.sinks.hi, c.hi);
    EXPECT_EQ(an.prefix, c.prefix);
    EXPECT_NE(an.describe().find("key prefix"), std::string::npos) << an.describe();
    const auto p = spattn::plan::build_block_plan(b, 192, 128, 1, &an);
    EXPECT_TRUE(p.band && !p.band_shifted && p.band_prefix == c.prefix) << p.describe();
    // The plan's rows (the prefix and band_first ... band_last) are the pattern's, everywhere.
    int64_t mismatches = 0;
    for (int64_t q = 0; q < c.lq; q += (q < 400 || q > c.lq - 400 ? 1 : 37))
      for (int64_t k = 0; k < c.lk; ++k)
        mismatches += b.contains(q, k) != (k < p.band_prefix || (k >= p.band_first(q) && k <= p.band_last(q)));
    EXPECT_EQ(mismatches, 0);
    const auto chosen = spattn::plan::choose_block_plan(b, an, 64, 0, 0, -1, true);
    const bool runs = c.prefix <= spattn::plan::kBandPrefixMax;
    EXPECT_EQ(chosen.block_m == 192 && chosen.band_prefix == c.prefix, runs) << chosen.describe();
    EXPECT_EQ(spattn::plan::band_kernel_runs(chosen, 64, -1), runs) << chosen.describe();
    // Head dim 128: the band kernel's 128-row items.
    const auto chosen128 = spattn::plan::choose_block_plan(b, an, 128, 0, 0, -1, true);
    EXPECT_EQ(chosen128.block_m == 128 && chosen128.band_prefix == c.prefix, runs) << chosen128.describe();
    EXPECT_EQ(spattn::plan::band_kernel_runs(chosen128, 128, -1), runs) << chosen128.describe();
    EXPECT_FALSE(spattn::plan::band_kernel_runs(chosen128, 64, -1)) << "a 128-row plan at head dim 64";
  }
}

}  // namespace

// The backward's key-major plan is the forward plan's entries transposed: every (query tile, key tile) entry once,
// its kind and band bounds kept, each bitmask transposed bit for bit (key c's word, bit r = query row r).
TEST(KeyMajorPlan, TransposesEveryEntryAndMask) {
  for (const char* spec : {"local(40)", "causal", "longformer(40, 4)", "random(5, seed=3) | local(2)", "dilated(20, 3)",
                           "bigbird(16, 1, 1, 1, seed=1)"})
    for (int bn : {64, 128}) {
      SCOPED_TRACE(std::string(spec) + " bn " + std::to_string(bn));
      const spattn::BoundPattern pat = spattn::parse(spec).bind(300, 333);
      const spattn::plan::BlockPlan fp = spattn::plan::build_block_plan(pat, 64, bn);
      const spattn::plan::KeyMajorPlan km = spattn::plan::key_major(fp);
      ASSERT_EQ(km.entries.size(), fp.entries.size());
      ASSERT_EQ(int64_t(km.col_offsets.size()), fp.k_tiles + 1);
      int64_t found = 0;
      for (int64_t qt = 0; qt < fp.q_tiles; ++qt)
        for (int64_t i = fp.row_offsets[size_t(qt)]; i < fp.row_offsets[size_t(qt) + 1]; ++i) {
          const spattn::plan::TileEntry& e = fp.entries[size_t(i)];
          for (int64_t j = km.col_offsets[size_t(e.kt)]; j < km.col_offsets[size_t(e.kt) + 1]; ++j) {
            const spattn::plan::TileEntry& t = km.entries[size_t(j)];
            if (t.kt != qt) continue;
            ++found;
            EXPECT_EQ(t.mask < 0, e.mask < 0);
            if (e.mask == spattn::plan::kBand) EXPECT_TRUE(t.mask == e.mask && t.lo == e.lo && t.hi == e.hi);
            if (e.mask >= 0)
              for (int r = 0; r < 64; ++r)
                for (int c = 0; c < bn; ++c) {
                  const uint64_t fw = fp.masks[size_t(e.mask * fp.words_per_mask() + (r * bn + c) / 64)];
                  const uint64_t tw = km.masks[size_t(t.mask) * size_t(bn) + size_t(c)];
                  ASSERT_EQ((fw >> ((r * bn + c) % 64)) & 1, (tw >> r) & 1) << "row " << r << " key " << c;
                }
          }
        }
      EXPECT_EQ(found, int64_t(fp.entries.size()));
      ASSERT_EQ(int64_t(km.order.size()), fp.k_tiles);
      for (size_t i = 1; i < km.order.size(); ++i) {  // most entries first
        auto len = [&](int32_t kt) { return km.col_offsets[size_t(kt) + 1] - km.col_offsets[size_t(kt)]; };
        EXPECT_GE(len(km.order[i - 1]), len(km.order[i]));
      }
    }
  EXPECT_THROW(spattn::plan::key_major(spattn::plan::build_block_plan(spattn::parse("causal").bind(300), 128, 128)),
               spattn::Error);
}

// dQ's first writers (plan::dq_owners): each query tile's owner is, of the key tiles whose entries name it, the first
// in the grid's order (so a step waits only on an item taken before its own); bands walk their lists last first, where
// the owners' stores come first; plans where most steps would wait (causal, dense: one key tile owns every query tile),
// wide or broken lists (local(1024), a 3-D neighborhood) and plans with a query tile that keeps no key have none.
TEST(KeyMajorPlan, DqOwnersFirstInOrder) {
  struct Case {
    const char* spec;
    int64_t lq, lk;
    bool owned, reverse;
  };
  const Case cases[] = {
      {"local(100)", 4099, 4099, true, true},
      {"local(256)", 16384, 16384, true, true},
      {"neighborhood(kernel=257)", 16384, 16384, true, true},
      {"local(left=200, right=0)", 650, 650, true, true},
      {"local(24)", 190, 190, false, false},  // two key tiles: the second's steps would wait for the first's
      {"local(30)", 150, 411, false, false},
      {"causal", 1000, 1000, false, false},
      {"local(1024)", 16384, 16384, false, false},  // 33 entries a key tile
      {"neighborhood(dims=(16,32,32), kernel=7, causal=(1,0,0))", 16384, 16384, false, false},  // runs in 3 planes
      {"dense", 1000, 1000, false, false},
      {"causal & global_cols(100:180)", 333, 333, false, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    const spattn::plan::KeyMajorPlan km =
        spattn::plan::key_major(spattn::plan::build_block_plan(spattn::parse(c.spec).bind(c.lq, c.lk), 64, 128));
    bool rev = !c.reverse;
    const std::vector<int32_t> owner = spattn::plan::dq_owners(km, &rev);
    EXPECT_EQ(!owner.empty(), c.owned);
    EXPECT_EQ(rev, c.reverse);
    if (owner.empty()) continue;
    ASSERT_EQ(int64_t(owner.size()), km.q_tiles);
    std::vector<int64_t> rank(size_t(km.k_tiles));
    for (size_t r = 0; r < km.order.size(); ++r) rank[size_t(km.order[r])] = int64_t(r);
    std::vector<int> named(size_t(km.q_tiles), 0);
    for (int64_t kt = 0; kt < km.k_tiles; ++kt)
      for (int64_t e = km.col_offsets[size_t(kt)]; e < km.col_offsets[size_t(kt) + 1]; ++e) {
        const int32_t q = km.entries[size_t(e)].kt;
        named[size_t(q)] += owner[size_t(q)] == kt;
        EXPECT_LE(rank[size_t(owner[size_t(q)])], rank[size_t(kt)]) << "query tile " << q << " key tile " << kt;
      }
    for (int64_t q = 0; q < km.q_tiles; ++q) EXPECT_EQ(named[size_t(q)], 1) << "query tile " << q;
  }
  // any_waits: owners wherever every query tile has a key, the first in order
  for (const char* spec : {"causal", "dense"}) {
    SCOPED_TRACE(spec);
    const spattn::plan::KeyMajorPlan km =
        spattn::plan::key_major(spattn::plan::build_block_plan(spattn::parse(spec).bind(1000), 64, 128));
    const std::vector<int32_t> owner = spattn::plan::dq_owners(km, nullptr, true);
    ASSERT_EQ(int64_t(owner.size()), km.q_tiles);
    for (const int32_t o : owner) EXPECT_EQ(o, km.order[0]) << "the first key tile in order names every query tile";
  }
  EXPECT_TRUE(spattn::plan::dq_owners(spattn::plan::key_major(spattn::plan::build_block_plan(
                                          spattn::parse("causal & global_cols(100:180)").bind(333), 64, 128)),
                                      nullptr, true)
                  .empty());
  // an order that is not a permutation of the key tiles (an owner no item would run): refused, naming the tile
  spattn::plan::KeyMajorPlan km =
      spattn::plan::key_major(spattn::plan::build_block_plan(spattn::parse("local(100)").bind(4099), 64, 128));
  const std::vector<int32_t> order = km.order;
  km.order.pop_back();
  EXPECT_THROW(spattn::plan::dq_owners(km, nullptr), spattn::Error);
  km.order = order;
  km.order[1] = km.order[0];
  EXPECT_THROW(spattn::plan::dq_owners(km, nullptr), spattn::Error);
  km.order[1] = int32_t(km.k_tiles);
  EXPECT_THROW(spattn::plan::dq_owners(km, nullptr), spattn::Error);
  km.order = order;
  EXPECT_FALSE(spattn::plan::dq_owners(km, nullptr).empty());
}

// Wide (128-key) warp-specialized backward tiles, narrow (64) sm90_bwd ones for residue-permuted plans (cp.async
// steps) where the head dim has them (64; at 128 the warp-specialized row).
TEST(KeyMajorPlan, ChoosesTheBackwardRow) {
  using spattn::plan::kKernels;
  const int causal = spattn::plan::choose_backward_row(spattn::plan::analyze(spattn::parse("causal").bind(16384)), 64);
  const int local = spattn::plan::choose_backward_row(spattn::plan::analyze(spattn::parse("dilated(256, 2)").bind(16384)), 64);
  ASSERT_GE(causal, 0);
  ASSERT_GE(local, 0);
  EXPECT_EQ(kKernels[causal].block_n, 128);
  EXPECT_EQ(kKernels[causal].kind, spattn::plan::KernelKind::sm90_bwd_ws);
  EXPECT_EQ(kKernels[local].block_n, 64);
  EXPECT_EQ(kKernels[local].kind, spattn::plan::KernelKind::sm90_bwd);
  const int d128 = spattn::plan::choose_backward_row(spattn::plan::analyze(spattn::parse("local(256)").bind(16384)), 128);
  ASSERT_GE(d128, 0);
  EXPECT_EQ(kKernels[d128].head_dim, 128);
  EXPECT_EQ(kKernels[d128].kind, spattn::plan::KernelKind::sm90_bwd_ws);
  const int dil128 = spattn::plan::choose_backward_row(spattn::plan::analyze(spattn::parse("dilated(256, 2)").bind(16384)), 128);
  ASSERT_GE(dil128, 0);
  EXPECT_EQ(kKernels[dil128].head_dim, 128);
  EXPECT_EQ(kKernels[dil128].kind, spattn::plan::KernelKind::sm90_bwd_ws);
  const int plain = spattn::plan::choose_backward_row(spattn::plan::analyze(spattn::parse("causal").bind(16384)), 64, false);
  ASSERT_GE(plain, 0);
  EXPECT_EQ(kKernels[plain].kind, spattn::plan::KernelKind::sm90_bwd);
  EXPECT_EQ(kKernels[plain].block_n, 128);
  EXPECT_EQ(spattn::plan::choose_backward_row(spattn::plan::analyze(spattn::parse("causal").bind(64)), 96), -1);
  // Head dim 64: the warp-specialized row steps by 128 queries (tile_bwd_ws2.cuh), chosen and as 'sm90_bwd_ws'; the
  // 64-query-step row is the D = 128 one only. Its tile plan stays of 64-query entries (backward_tiles).
  const int ws2 = spattn::plan::find_kernel("sm90_bwd_ws_128x128_d64");
  ASSERT_GE(ws2, 0);
  EXPECT_EQ(causal, ws2);
  EXPECT_EQ(kKernels[d128].block_m, 64);
  EXPECT_EQ(spattn::plan::find_kernel("sm90_bwd_ws_64x128_d64"), -1);
  EXPECT_EQ(spattn::plan::backward_choice("sm90_bwd_ws", 64).row, ws2);
  EXPECT_EQ(spattn::plan::backward_choice("sm90_bwd_ws", 128).row, d128);
  EXPECT_EQ(spattn::plan::backward_choice("sm90_bwd_ws_128x128_d64", 64).row, ws2);
  EXPECT_THROW(spattn::plan::backward_choice("sm90_bwd_ws_128x128_d64", 128), spattn::Error);
  const spattn::BoundPattern lp = spattn::parse("local(256)").bind(4096);
  const spattn::plan::Analysis la = spattn::plan::analyze(lp);
  EXPECT_EQ(spattn::plan::backward_row(spattn::plan::backward_choice("", 64), la, 64), ws2);
  const spattn::plan::BlockPlan bp = spattn::plan::backward_tiles(lp, la, 64, ws2);
  EXPECT_EQ(bp.block_m, 64);
  EXPECT_EQ(bp.block_n, 128);
}

// Zero lengths: the GPU planner gives an empty plan (no entries, nnz 0) for every tile shape, permutation and
// choice, the key-major plan and the compound split likewise. They threw "block plan: empty lengths", so make_plan
// failed on the GPU engines for an empty problem.
// Bitmasks left to the device (BlockPlan::drawn, choose_block_plan's device_draw): where they apply, the plan has the
// host plan's shape and nnz and visits every tile, each a bitmask, in order; where they do not (sparse rows leaving
// tiles empty, unions, r >= Lk, rows past kDrawMaxKeys), the host builds them. The split's scattered part likewise.
TEST(BlockPlan, DrawnMasks) {
  using namespace spattn::plan;
  const auto pat = spattn::parse("random(51, seed=0)").bind(1023, 1023);
  const Analysis an = analyze(pat);
  for (bool tma : {false, true})
    for (int64_t dim : {64, 128}) {
      SCOPED_TRACE(std::string(tma ? "tma" : "no tma") + " D=" + std::to_string(dim));
      const BlockPlan host = choose_block_plan(pat, an, dim, 0, 0, -1, tma);
      const BlockPlan dev = choose_block_plan(pat, an, dim, 0, 0, -1, tma, -1, true);
      EXPECT_FALSE(host.masks_drawn());
      ASSERT_TRUE(dev.masks_drawn()) << dev.describe();
      EXPECT_EQ(dev.drawn.r, 51);
      EXPECT_EQ(dev.block_m, host.block_m);
      EXPECT_EQ(dev.block_n, host.block_n);
      EXPECT_EQ(dev.nnz, host.nnz);
      EXPECT_TRUE(dev.masks.empty());
      EXPECT_EQ(dev.nentries(), dev.q_tiles * dev.k_tiles);
      EXPECT_EQ(host.nentries(), dev.nentries()) << "every tile holds kept keys here";
      EXPECT_EQ(dev.n_bitmask, dev.nentries());
      for (int64_t i = 0; i < dev.nentries(); ++i) {
        EXPECT_EQ(dev.entries[size_t(i)].mask, i);
        EXPECT_EQ(dev.entries[size_t(i)].kt, i % dev.k_tiles);
      }
      EXPECT_NE(dev.describe().find("drawn on the device"), std::string::npos);
    }
  const BlockPlan forced = choose_block_plan(pat, an, 64, 64, 128, -1, false, -1, true);
  ASSERT_TRUE(forced.masks_drawn());
  try {
    key_major(forced);
    ADD_FAILURE() << "a drawn plan has no host bitmasks to transpose";
  } catch (const spattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("drawn on the device"), std::string::npos) << e.what();
  }
  auto applies = [](const char* spec, int64_t lq, int64_t lk, int bm, int bn) {
    return drawn_masks_apply(spattn::parse(spec).bind(lq, lk), bm, bn);
  };
  EXPECT_TRUE(applies("random(820)", 16384, 16384, 192, 128));
  EXPECT_TRUE(applies("random(40, seed=9)", 1100, 333, 64, 128));
  EXPECT_FALSE(applies("random(2)", 16384, 16384, 192, 128)) << "sparse rows leave tiles empty";
  EXPECT_FALSE(applies("local(8) | random(51)", 1023, 1023, 64, 128)) << "not one random atom";
  EXPECT_FALSE(applies("random(1023)", 1023, 1023, 64, 128)) << "every key";
  EXPECT_FALSE(applies("random(5)", 4, kDrawMaxKeys + 1, 64, 128)) << "rows past kDrawMaxKeys";
  SplitTarget target;
  target.device_draw = true;
  const auto rnd = spattn::parse("random(9, seed=2)").bind(1000, 1000);
  const Split s = split_pattern(rnd, analyze(rnd), -1, target);
  ASSERT_EQ(s.parts.size(), 1u);
  EXPECT_EQ(s.parts[0].kind, PartKind::scattered);
  EXPECT_EQ(s.parts[0].drawn.r, 9);
  EXPECT_EQ(s.parts[0].nnz, 9000);
  EXPECT_TRUE(s.parts[0].cols.empty());
  // Beside band rows: the part less the band, its kept scores those the host's CSR holds.
  const auto band_rnd = spattn::parse("local(64) | random(4, seed=3)").bind(1000, 1000);
  const Split host = split_pattern(band_rnd, analyze(band_rnd), -1);
  const Split dev = split_pattern(band_rnd, analyze(band_rnd), -1, target);
  ASSERT_EQ(dev.parts.size(), 2u);
  ASSERT_EQ(host.parts.size(), 2u);
  EXPECT_EQ(dev.parts[1].kind, PartKind::scattered);
  EXPECT_EQ(dev.parts[1].drawn.r, 4);
  EXPECT_EQ(dev.parts[1].drawn_lo, -64);
  EXPECT_EQ(dev.parts[1].drawn_hi, 64);
  EXPECT_EQ(dev.parts[1].nnz, int64_t(host.parts[1].cols.size()));
  // Not beside columns or owned rows, nor for a random term inside an intersection.
  for (const char* spec : {"global_cols(0:4) | random(3)", "local(left=90, right=0) | random(3) & causal"}) {
    const auto pat = spattn::parse(spec).bind(1000, 1000);
    for (const Part& p : split_pattern(pat, analyze(pat), 1, target).parts) EXPECT_EQ(p.drawn.r, 0) << spec;
  }
}

TEST(BlockPlan, EmptyLengths) {
  for (auto [lq, lk] : {std::pair<int64_t, int64_t>{0, 0}, {0, 300}, {300, 0}})
    for (const char* spec : {"local(3)", "dilated(4, 3)", "causal", "dense", "longformer(8, 2)", "random(2, seed=1)",
                             "sparse_fixed(16)"}) {
      SCOPED_TRACE(std::string(spec) + " " + std::to_string(lq) + " x " + std::to_string(lk));
      const spattn::BoundPattern pat = spattn::parse(spec).bind(lq, lk);
      const spattn::plan::Analysis an = spattn::plan::analyze(pat);
      std::vector<spattn::plan::BlockPlan> plans;
      for (int bn : {64, 128})
        for (int d : {1, 3}) plans.push_back(spattn::plan::build_block_plan(pat, 64, bn, d, &an));
      for (bool tma : {false, true})
        for (int64_t dim : {64, 128}) plans.push_back(spattn::plan::choose_block_plan(pat, an, dim, 0, 0, -1, tma));
      for (const spattn::plan::BlockPlan& p : plans) {
        EXPECT_EQ(p.nnz, 0);
        EXPECT_EQ(p.nentries(), 0);
        EXPECT_EQ(p.q_len, lq);
        EXPECT_EQ(p.k_len, lk);
        EXPECT_EQ(int64_t(p.row_offsets.size()), p.q_tiles + 1);
        EXPECT_EQ(int64_t(p.order.size()), p.q_tiles);
        EXPECT_EQ(p.q_tiles == 0, lq == 0);
        EXPECT_FALSE(p.describe().empty());
        if (p.block_m == 64) {
          const spattn::plan::KeyMajorPlan km = spattn::plan::key_major(p);
          EXPECT_TRUE(km.entries.empty());
          EXPECT_EQ(int64_t(km.col_offsets.size()), km.k_tiles + 1);
        }
      }
      EXPECT_FALSE(spattn::plan::block_shape_costs(pat, an, 64, true).empty());
      for (int mode : {-1, 1}) EXPECT_FALSE(spattn::plan::split_pattern(pat, an, mode).compound());
    }
}
