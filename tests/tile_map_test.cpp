// Multi-dimensional tiles of neighborhood patterns (src/plan/tile_map.hpp) and the GPU tile plans built over them
// (plan/gpu/block_plan.hpp, mapped plan space), on the CPU: the maps are bijections on the tokens, a plan's entries
// cover exactly the pattern's kept pairs (each in one visited tile, kept by its entry's mask, padding never kept),
// the per-axis scores the box choice uses are the plan's own counts, and the planner picks mapped plans where
// they pay and says so; residue-grouped plans at any stride and the compound split's affine part (AffineParts).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "grid_spec.hpp"
#include "cuda/fused/key_boxes.hpp"  // plain arithmetic: the GPU kernels' key rows, checked here on the CPU
#include "plan/analysis.hpp"
#include "plan/gpu/block_plan.hpp"
#include "plan/gpu/launch.hpp"
#include "plan/key_plan.hpp"
#include "plan/parts.hpp"
#include "plan/tile_map.hpp"
#include "spattn/pattern.hpp"

namespace {

using spattn::BoundPattern;
using spattn::NeighborhoodGrid;
using spattn::plan::BlockPlan;
using spattn::plan::GridTiling;
using spattn::plan::TileBox;

BoundPattern bind(const std::string& spec) { return spattn::test::bind_grid_spec(spec); }

// Every plan position maps to a token or -1, every token appears once, every tile holds a token.
void expect_bijection(const std::vector<int32_t>& map, int64_t len, int tile, const char* what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(map.size() % size_t(tile), 0u);
  std::vector<int> seen(size_t(len), 0);
  for (int32_t t : map) {
    ASSERT_TRUE(t >= -1 && t < len) << t;
    if (t >= 0) ++seen[size_t(t)];
  }
  for (int64_t t = 0; t < len; ++t) ASSERT_EQ(seen[size_t(t)], 1) << "token " << t;
  for (size_t p0 = 0; p0 < map.size(); p0 += size_t(tile))
    EXPECT_TRUE(std::any_of(map.begin() + long(p0), map.begin() + long(p0 + size_t(tile)), [](int32_t t) { return t >= 0; }))
        << "tile at " << p0 << " holds only padding";
}

// The plan's entries keep exactly the pattern's pairs: each kept (q, k) lies in one visited tile whose entry keeps
// it, no entry keeps a pair the pattern drops or a padding position, full tiles hold no padding key, key tiles of
// a query tile ascend. Mapped plans have no band entries.
void expect_covers(const BoundPattern& pat, const BlockPlan& p) {
  SCOPED_TRACE(p.describe());
  const int64_t lq = pat.q_len(), lk = pat.k_len();
  if (p.key_strips()) {  // a token sits in the strips of several query tiles: each strip's slots are the strip's
    expect_bijection(p.q_map, lq, p.block_m, "q_map");
    ASSERT_EQ(p.k_tiles, int64_t(p.strips.size()));
    EXPECT_EQ(p.n_bitmask, p.nentries()) << "every strip entry is a bitmask";
    for (size_t kt = 0; kt < p.strips.size(); ++kt) {
      const spattn::plan::KeyStrip& s = p.strips[kt];
      ASSERT_TRUE(s.width >= 1 && s.width <= 64 && s.count >= 1 && s.count <= 64 && s.count % s.width == 0) << kt;
      std::vector<int32_t> toks;
      for (int r = 0; r < 64; ++r) {
        const int32_t t = p.k_map[kt * 64 + size_t(r)];
        EXPECT_EQ(t < 0, r >= s.count) << "strip " << kt << " slot " << r;
        if (t >= 0) toks.push_back(t);
        ASSERT_LT(t, lk);
      }
      std::sort(toks.begin(), toks.end());
      EXPECT_TRUE(std::adjacent_find(toks.begin(), toks.end()) == toks.end()) << "strip " << kt << " holds a token twice";
    }
  } else if (p.mapped()) {
    expect_bijection(p.q_map, lq, p.block_m, "q_map");
    expect_bijection(p.k_map, lk, p.block_n, "k_map");
    EXPECT_EQ(p.n_band, 0) << "mapped plans have no band entries";
    EXPECT_EQ(p.perm_d, 1);
    EXPECT_FALSE(p.band);
  }
  if (p.mapped()) {
    EXPECT_EQ(p.n_band, 0) << "mapped plans have no band entries";
    ASSERT_EQ(p.q_tiles * p.block_m, int64_t(p.q_map.size()));
    ASSERT_EQ(p.k_tiles * p.block_n, int64_t(p.k_map.size()));
  }
  std::vector<uint8_t> kept(size_t(lq * lk), 0);
  int64_t wrong = 0, padding_kept = 0, full_padding = 0;
  for (int64_t qt = 0; qt < p.q_tiles; ++qt) {
    int32_t prev = -1;
    for (int64_t i = p.row_offsets[size_t(qt)]; i < p.row_offsets[size_t(qt) + 1]; ++i) {
      const spattn::plan::TileEntry& e = p.entries[size_t(i)];
      EXPECT_GT(e.kt, prev) << "key tiles of query tile " << qt << " ascend";
      prev = e.kt;
      for (int r = 0; r < p.block_m; ++r) {
        const int64_t qp = qt * p.block_m + r, q = p.q_token(qp);
        for (int c = 0; c < p.block_n; ++c) {
          const int64_t kp = int64_t(e.kt) * p.block_n + c, k = p.k_token(kp);
          bool keep;
          if (e.mask == spattn::plan::kFull) {
            keep = true;
            full_padding += k >= lk;
          } else if (e.mask == spattn::plan::kBand) {
            keep = e.lo <= kp - qp && kp - qp <= e.hi;
          } else {
            const uint64_t* m = p.masks.data() + size_t(e.mask) * size_t(p.words_per_mask());
            const int64_t bit = int64_t(r) * p.block_n + c;
            keep = (m[bit / 64] >> (bit % 64)) & 1;
            padding_kept += keep && (q >= lq || k >= lk);  // the kernels load zeros there: never keep them
          }
          if (!keep || q >= lq || k >= lk) continue;
          wrong += !pat.contains(q, k);
          ++kept[size_t(q * lk + k)];
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0) << "pairs kept that the pattern drops";
  EXPECT_EQ(padding_kept, 0) << "bitmask bits on padding positions";
  EXPECT_EQ(full_padding, 0) << "full tiles holding padding keys";
  spattn::test::expect_kept_once(pat, kept, p.nnz);
}

const std::vector<std::string> kSpecs = {
    // 1-D (mapped only when forced through tilings: the planner's permutation covers them)
    "neighborhood(kernel=7)@300", "neighborhood(kernel=5, dilation=3)@301", "neighborhood(kernel=9, causal=1)@257",
    // 2-D: sides off the box sizes, windows at every edge, dilation with unequal groups, causal axes
    "neighborhood(dims=(37, 41), kernel=7)", "neighborhood(dims=(40, 48), kernel=13)",
    "neighborhood(dims=(23, 29), kernel=(5, 3), dilation=(2, 3))", "neighborhood(dims=(30, 33), kernel=5, causal=(1, 0))",
    "neighborhood(dims=(30, 33), kernel=(3, 7), causal=(0, 1))", "neighborhood(dims=(19, 45), kernel=4, causal=1, dilation=(1, 2))",
    "neighborhood(dims=(9, 200), kernel=(3, 11))", "neighborhood(dims=(3, 17), kernel=3)",
    // 3-D
    "neighborhood(dims=(5, 9, 11), kernel=3)", "neighborhood(dims=(6, 7, 9), kernel=(3, 3, 5), dilation=(1, 2, 1), causal=(1, 0, 0))",
    "neighborhood(dims=(4, 12, 16), kernel=(3, 5, 5), dilation=(1, 2, 3))", "neighborhood(dims=(8, 8, 8), kernel=(7, 3, 3), causal=(1, 0, 0))",
    // a union (the grid guides the boxes; the plan still keeps exactly the union's pairs)
    "neighborhood(dims=(20, 30), kernel=5) | global(0:3)", "neighborhood(dims=(20, 30), kernel=5) & causal",
};

TEST(TileMap, MapsAreBijectionsAndPlansCoverThePattern) {
  for (const std::string& spec : kSpecs) {
    SCOPED_TRACE(spec);
    const BoundPattern pat = bind(spec);
    const auto grid = pat.neighborhood_grid();
    ASSERT_TRUE(grid.has_value());
    for (auto [bm, bn] : {std::pair{64, 128}, std::pair{128, 128}, std::pair{64, 64}}) {
      const auto qb = spattn::plan::tile_boxes(*grid, bm), kb = spattn::plan::tile_boxes(*grid, bn);
      if (qb.empty() || kb.empty()) continue;
      // The best boxes, and the most elongated ones of each (first and last in tile_boxes' order).
      const auto best = spattn::plan::best_boxes(*grid, bm, bn, 1.1);
      ASSERT_TRUE(best.ok);
      {  // its scores (from the axes' windows computed once) are tiling_scores' (windows asked one by one)
        const auto s = spattn::plan::tiling_scores(*grid, best.q, best.k);
        EXPECT_EQ(best.scores.visited, s.visited);
        EXPECT_EQ(best.scores.full, s.full);
        EXPECT_EQ(best.scores.kept, s.kept);
      }
      for (auto [q, k] : {std::pair{best.q, best.k}, std::pair{qb.front(), kb.back()}, std::pair{qb.back(), kb.front()}}) {
        SCOPED_TRACE(q.str(3) + " / " + k.str(3));
        const GridTiling qt = GridTiling::of(*grid, q), ktl = GridTiling::of(*grid, k);
        const BlockPlan p = spattn::plan::build_block_plan(pat, qt, ktl);
        ASSERT_TRUE(p.mapped());
        expect_covers(pat, p);
        // The box choice's per-axis counts are the plan's own (exact for a lone neighborhood atom).
        if (grid->exact) {
          const auto s = spattn::plan::tiling_scores(*grid, q, k);
          EXPECT_DOUBLE_EQ(s.kept, double(p.nnz));
          EXPECT_DOUBLE_EQ(s.visited, double(p.nentries()) * bm * bn);
          EXPECT_DOUBLE_EQ(s.full, double(p.n_full) * bm * bn);
        }
      }
    }
  }
}

// The map without the map (GridTiling::boxes, what the GPU kernels compute their key rows' tokens from): every box
// position's token, computed as the kernels do (key_boxes.hpp: a thread's row r0 < step plus row j * step, the
// upper half of a 128-key box from row 64 on; steps 8, 16 and 32: the kernels' rows a thread apart), is the map's,
// and padding is padding.
TEST(TileMap, KeyBoxRowsComputedAsTheKernelsDoAreTheMap) {
  namespace f = spattn::cuda::fused;
  int64_t checked = 0;
  for (const std::string& spec : kSpecs) {
    SCOPED_TRACE(spec);
    const BoundPattern pat = bind(spec);
    const auto grid = *pat.neighborhood_grid();
    for (int64_t volume : {64, 128})
      for (const TileBox& box : spattn::plan::tile_boxes(grid, volume)) {
        SCOPED_TRACE(box.str(3));
        const GridTiling t = GridTiling::of(grid, box);
        const std::vector<int32_t> map = t.map();
        const std::vector<GridTiling::BoxRows> boxes = t.boxes();
        ASSERT_EQ(int64_t(boxes.size()) * volume, int64_t(map.size()));
        const int side[3] = {box.side[0], box.side[1], box.side[2]};
        const int64_t stride[3] = {t.token_stride(0), t.token_stride(1), t.token_stride(2)};
        const f::KeyBoxes p = f::key_boxes(side, stride);
        int64_t wrong = 0;
        for (size_t b = 0; b < boxes.size(); ++b) {
          const int base = int(boxes[b].base);
          const int lim = f::box_limits(boxes[b].extent[0], boxes[b].extent[1], boxes[b].extent[2]);
          for (int step : {8, 16, 32})
            for (int r = 0; r < volume; ++r) {
              const bool upper = volume == 128 && r >= 64 && step < 64;  // a half-width entry's rows 64 + ...
              const int rr = upper ? r - 64 : r, r0 = rr % step, i = (rr - r0) / 8;
              const f::BoxRow x = f::box_row(p, r0);
              int tok = base + x.off, l = lim - x.pack;
              if (upper) tok += p.off8[8], l -= p.pack8[8];
              const int got = ((l - p.pack8[i]) & f::kBoxInside) == f::kBoxInside ? tok + p.off8[i] : -1;
              wrong += got != map[b * size_t(volume) + size_t(r)];
              ++checked;
            }
        }
        EXPECT_EQ(wrong, 0) << "rows whose computed token is not the map's";
      }
  }
  EXPECT_GT(checked, 100000);
}

TEST(TileMap, ChosenPlansCoverThePattern) {
  for (const std::string& spec : kSpecs) {
    SCOPED_TRACE(spec);
    const BoundPattern pat = bind(spec);
    const auto an = spattn::plan::analyze(pat);
    for (int64_t hd : {64, 128})
      for (int tile_map : {-1, 1}) {
        const BlockPlan p = spattn::plan::choose_block_plan(pat, an, hd, 0, 0, -1, true, tile_map);
        if (tile_map == 1) EXPECT_TRUE(p.mapped());
        if (tile_map == -1 && spattn::plan::grid_axes_used(*an.grid) < 2) EXPECT_FALSE(p.mapped()) << "1-D: no map unless forced";
        expect_covers(pat, p);
      }
  }
}

TEST(TileMap, ThreadsBuildTheSamePlan) {
  const BoundPattern pat = bind("neighborhood(dims=(23, 29), kernel=(5, 3), dilation=(2, 3))");
  const auto grid = *pat.neighborhood_grid();
  const GridTiling q = GridTiling::of(grid, TileBox{{1, 8, 8}}), k = GridTiling::of(grid, TileBox{{1, 8, 16}});
  setenv("SPATTN_PLAN_THREADS", "1", 1);
  const BlockPlan one = spattn::plan::build_block_plan(pat, q, k);
  unsetenv("SPATTN_PLAN_THREADS");
  const BlockPlan many = spattn::plan::build_block_plan(pat, q, k);
  EXPECT_EQ(one.row_offsets, many.row_offsets);
  EXPECT_EQ(one.masks, many.masks);
  ASSERT_EQ(one.entries.size(), many.entries.size());
  for (size_t i = 0; i < one.entries.size(); ++i)
    EXPECT_TRUE(one.entries[i].kt == many.entries[i].kt && one.entries[i].mask == many.entries[i].mask) << i;
}

TEST(TileMap, MapOrder) {
  // 2-D, 5 x 6 grid, dilation (2, 1), 2 x 4 boxes: group 0 has rows 0, 2, 4 (3 rows, padded to 4), group 1 rows
  // 1, 3 (2); columns 0-5 padded to 8. Plan positions: group 0's boxes (2 x 2 of them), then group 1's (1 x 2).
  NeighborhoodGrid g;
  g.naxes = 2;
  g.dims = {5, 6, 1};
  g.dilation = {2, 1, 1};
  const GridTiling t = GridTiling::of(g, TileBox{{1, 2, 4}});
  EXPECT_EQ(t.length(), (4 + 2) * 8);
  const std::vector<int32_t> m = t.map();
  const std::vector<int32_t> want = {
      0, 1, 2, 3, 12, 13, 14, 15,       // group 0, box (0, 0): rows 0 and 2, columns 0-3
      4, 5, -1, -1, 16, 17, -1, -1,     // box (0, 1): columns 4-5 (6-7 padding)
      24, 25, 26, 27, -1, -1, -1, -1,   // box (1, 0): row 4 (the box's second row is padding)
      28, 29, -1, -1, -1, -1, -1, -1,   // box (1, 1)
      6, 7, 8, 9, 18, 19, 20, 21,       // group 1, box (0, 0): rows 1 and 3
      10, 11, -1, -1, 22, 23, -1, -1};  // box (0, 1)
  EXPECT_EQ(m, want);
  EXPECT_FALSE(t.identity());
  EXPECT_EQ(t.describe(), "2x4 boxes of a 5x6 grid, dilation 2x1");
  // Boxes of whole rows, no dilation, no padding: tile-major order is row-major order.
  g.dilation = {1, 1, 1};
  g.dims = {4, 32, 1};
  const GridTiling rows = GridTiling::of(g, TileBox{{1, 2, 32}});
  EXPECT_TRUE(rows.identity());
  std::vector<int32_t> iota(128);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(rows.map(), iota);
  EXPECT_FALSE(GridTiling::of(g, TileBox{{1, 4, 16}}).identity());
}

TEST(TileMap, GridOfTheSpec) {
  {
    const auto g = spattn::parse("neighborhood(dims=(6, 16), kernel=3, dilation=(2, 4))").bind(96).neighborhood_grid();
    ASSERT_TRUE(g);
    EXPECT_EQ(g->naxes, 2);
    EXPECT_EQ(g->dims[0], 6);
    EXPECT_EQ(g->dims[1], 16);
    EXPECT_EQ(g->dilation[1], 4);
    EXPECT_TRUE(g->exact);
  }
  {  // several atoms on one grid: the gcd of their dilations; not exact
    const auto g = spattn::parse("neighborhood(dims=(6, 16), kernel=3, dilation=(2, 4)) | neighborhood(dims=(6, 16), kernel=1, dilation=(3, 2))")
                       .bind(96)
                       .neighborhood_grid();
    ASSERT_TRUE(g);
    EXPECT_EQ(g->dilation[0], 1);
    EXPECT_EQ(g->dilation[1], 2);
    EXPECT_FALSE(g->exact);
  }
  EXPECT_EQ(spattn::parse("neighborhood(kernel=5)").bind(100).neighborhood_grid()->dims[0], 100) << "dims omitted: L";
  EXPECT_FALSE(spattn::parse("neighborhood(dims=(6, 8), kernel=3) | neighborhood(dims=(8, 6), kernel=3)").bind(48).neighborhood_grid())
      << "atoms on different grids";
  EXPECT_FALSE(spattn::parse("blocked(4, neighborhood(dims=(4, 4), kernel=3))").bind(64).neighborhood_grid())
      << "atoms inside blocked see blocks";
  EXPECT_FALSE(spattn::parse("local(5)").bind(64).neighborhood_grid());
  EXPECT_FALSE(BoundPattern::from_rows(2, 2, {0, 1, 2}, {0, 1}).neighborhood_grid());
  // The windows are the pattern's: for an exact grid, (q, k) is kept iff every axis window holds k's coordinate.
  const BoundPattern pat = bind("neighborhood(dims=(6, 7, 9), kernel=(3, 3, 5), dilation=(1, 2, 1), causal=(1, 0, 0))");
  const auto g = *pat.neighborhood_grid();
  int64_t mismatches = 0;
  for (int64_t q = 0; q < pat.q_len(); q += 5)
    for (int64_t k = 0; k < pat.k_len(); ++k) {
      const int64_t cq[3] = {q / 63, q / 9 % 7, q % 9}, ck[3] = {k / 63, k / 9 % 7, k % 9};
      bool in = true;
      for (int a = 0; a < 3; ++a) {
        const spattn::Run w = g.window(a, cq[a]);
        in = in && ck[a] >= w.start && ck[a] <= w.last() && (ck[a] - w.start) % w.stride == 0;
      }
      mismatches += in != pat.contains(q, k);
    }
  EXPECT_EQ(mismatches, 0);
  EXPECT_THROW(g.window(3, 0), spattn::Error);
}

TEST(TileMap, BadTilingsSayWhy) {
  const BoundPattern pat = bind("neighborhood(dims=(16, 16), kernel=3)");
  const auto g = *pat.neighborhood_grid();
  auto msg = [&](const GridTiling& q, const GridTiling& k) {
    try {
      spattn::plan::build_block_plan(pat, q, k);
    } catch (const spattn::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const GridTiling ok = GridTiling::of(g, TileBox{{1, 8, 8}});
  EXPECT_NE(msg(GridTiling::of(g, TileBox{{1, 4, 8}}), ok).find("query boxes must hold 64 or 128 tokens"), std::string::npos);
  NeighborhoodGrid other = g;
  other.dims = {16, 17, 1};
  EXPECT_NE(msg(ok, GridTiling::of(other, TileBox{{1, 8, 8}})).find("holds 272 tokens, the pattern's key length is 256"),
            std::string::npos);
  EXPECT_THROW(GridTiling::of(g, TileBox{{1, 0, 8}}), spattn::Error);
  const auto an = spattn::plan::analyze(spattn::parse("local(5)").bind(256));
  try {
    spattn::plan::choose_block_plan(spattn::parse("local(5)").bind(256), an, 64, 0, 0, -1, false, 1);
    ADD_FAILURE() << "tile_map 1 without a grid must be refused";
  } catch (const spattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no neighborhood grid"), std::string::npos) << e.what();
  }
  EXPECT_THROW(spattn::plan::choose_block_plan(pat, spattn::plan::analyze(pat), 64, 0, 0, 1, false, 1), spattn::Error)
      << "tile_map 1 with a forced permutation";
  EXPECT_THROW(spattn::plan::choose_block_plan(pat, spattn::plan::analyze(pat), 64, 0, 0, -1, false, 3), spattn::Error);
}

// The planner takes the tile map for 2-D and 3-D neighborhoods where it keeps more of the scores it visits, and
// says so (explain: the candidates, their costs and kept fractions); never for a pattern without a grid, and not
// when told not to. A key tile is full only where its box fits the intersection of the query box's windows
// (query side + key side - 1 <= window on every axis): with 13x13 windows and 64-token boxes none is, with 31x31
// a quarter are. Kept fractions (H100 suite shapes, head dim 64): na2d 0.10 -> 0.34, na2d_dil 0.096 -> 0.14, na3d
// 0.14 -> 0.26; a box of 64 queries covers at least (8 + 6)^2 keys of 7x7 windows, so 0.25 is the most there.
TEST(TileMap, PlannerChoosesMappedTilesAndSaysWhy) {
  struct C {
    const char* spec;
    int64_t L;
    double min_gain;      // kept fraction, mapped over row-major (or residue) tiles
    double min_full;      // full tiles' share of the visited ones
  } const cases[] = {{"neighborhood(dims=(128, 128), kernel=13)", 16384, 3.0, 0.0},
                     {"neighborhood(dims=(64, 64), kernel=7, dilation=2)", 4096, 1.3, 0.0},
                     {"neighborhood(dims=(16, 32, 32), kernel=7, causal=(1, 0, 0))", 16384, 1.6, 0.0},
                     {"neighborhood(dims=(96, 96), kernel=31)", 9216, 1.8, 0.2}};
  for (const C& c : cases) {
    SCOPED_TRACE(c.spec);
    const BoundPattern pat = spattn::parse(c.spec).bind(c.L);
    const auto an = spattn::plan::analyze(pat);
    const BlockPlan mapped = spattn::plan::choose_block_plan(pat, an, 64, 0, 0, -1, true);
    const BlockPlan plain = spattn::plan::choose_block_plan(pat, an, 64, 0, 0, -1, true, 0);
    ASSERT_TRUE(mapped.mapped()) << mapped.describe();
    EXPECT_FALSE(plain.mapped());
    std::printf("  %s\n    mapped: %s\n    plain:  %s\n", c.spec, mapped.describe().c_str(), plain.describe().c_str());
    EXPECT_GT(mapped.kept_fraction(), c.min_gain * plain.kept_fraction());
    EXPECT_GE(double(mapped.n_full), c.min_full * double(mapped.nentries()));
    const std::string ex = mapped.describe();
    for (const char* want : {"tile map: query tiles", "kept ", "chosen by predicted cost per kept score", " map "})
      EXPECT_NE(ex.find(want), std::string::npos) << want;
  }
  const BoundPattern loc = spattn::parse("local(100)").bind(2000);
  EXPECT_FALSE(spattn::plan::choose_block_plan(loc, spattn::plan::analyze(loc), 64).mapped());
  // A narrow grid: image rows of 41 tokens make a 64-token run nearly a box already, and boxes pad 37 x 41 to
  // 40 x 48: the row-major plan keeps more (0.15 against 0.10) than key boxes; key strips (14x14 unions in 4 strips of
  // 4 rows) keep more than either, and are chosen.
  const BoundPattern narrow = bind("neighborhood(dims=(37, 41), kernel=7)");
  const auto an_narrow = spattn::plan::analyze(narrow);
  EXPECT_TRUE(spattn::plan::choose_block_plan(narrow, an_narrow, 64).key_strips());
  EXPECT_FALSE(spattn::plan::choose_block_plan(narrow, an_narrow, 64, 0, 0, -1, true, 1).key_strips());
  EXPECT_FALSE(spattn::plan::choose_block_plan(narrow, an_narrow, 64, 64, 128).mapped())
      << "64x128 tiles: row-major beats key boxes (strips are 64x64 only)";
}

// Key strips (tile_map 2; plan/gpu/block_plan.hpp): each query box's key tiles are strips of its window union. For every
// query the tokens of the set bits of its entries are exactly its row's keys (BoundPattern::row), none twice, and the
// slots' tokens are the kernels' arithmetic (key_boxes.hpp, strip_token) — for grid sides off the box sides, windows
// clamped at the edges, dilation with unequal groups, causal axes, 13x13 and 7x7 windows, a 7x9 grid, every query box
// shape of 64 tokens.
const std::vector<std::string> kStripSpecs = {
    "neighborhood(dims=(37, 41), kernel=7)", "neighborhood(dims=(40, 48), kernel=13)", "neighborhood(dims=(7, 9), kernel=3)",
    "neighborhood(dims=(7, 9), kernel=(7, 5))", "neighborhood(dims=(45, 51), kernel=13, dilation=2)",
    "neighborhood(dims=(23, 29), kernel=(5, 3), dilation=(2, 3))", "neighborhood(dims=(30, 33), kernel=7, causal=(1, 0))",
    "neighborhood(dims=(30, 33), kernel=(3, 7), causal=(0, 1))", "neighborhood(dims=(19, 45), kernel=4, causal=1, dilation=(1, 2))",
    "neighborhood(dims=(33, 35), kernel=13, dilation=(2, 1))", "neighborhood(dims=(9, 1, 30), kernel=(3, 1, 7))",
    "neighborhood(dims=(20, 30), kernel=5) | global(0:3)", "neighborhood(dims=(20, 30), kernel=7) & causal",
};

void expect_rows_exact(const BoundPattern& pat, const BlockPlan& p) {
  spattn::RowRuns runs;
  int64_t bad = 0;
  for (int64_t qt = 0; qt < p.q_tiles; ++qt)
    for (int r = 0; r < 64; ++r) {
      const int64_t q = p.q_token(qt * 64 + r);
      if (q >= pat.q_len()) continue;
      std::vector<int64_t> got, want;
      for (int64_t i = p.row_offsets[size_t(qt)]; i < p.row_offsets[size_t(qt) + 1]; ++i) {
        const spattn::plan::TileEntry& e = p.entries[size_t(i)];
        const uint64_t w = p.masks[size_t(e.mask) * 64 + size_t(r)];
        for (int c = 0; c < 64; ++c)
          if ((w >> c) & 1) got.push_back(p.k_token(int64_t(e.kt) * 64 + c));
      }
      pat.row(q, runs);
      for (const spattn::Run& x : runs)
        for (int64_t j = 0; j < x.count; ++j) want.push_back(x.start + j * x.stride);
      std::sort(got.begin(), got.end());
      std::sort(want.begin(), want.end());
      bad += got != want;
    }
  EXPECT_EQ(bad, 0) << "queries whose strip bits are not their row's keys (or hold one twice)";
}

TEST(TileMap, StripPlansCoverThePatternExactly) {
  namespace f = spattn::cuda::fused;
  for (const std::string& spec : kStripSpecs) {
    SCOPED_TRACE(spec);
    const BoundPattern pat = bind(spec);
    const auto grid = pat.neighborhood_grid();
    ASSERT_TRUE(grid.has_value());
    int built = 0;
    for (const TileBox& box : spattn::plan::tile_boxes(*grid, 64)) {
      SCOPED_TRACE(box.str(3));
      std::string why;
      const std::optional<BlockPlan> p = spattn::plan::build_strip_plan(pat, GridTiling::of(*grid, box), &why);
      if (!p) {
        EXPECT_NE(why.find("key strips: "), std::string::npos) << why;
        continue;
      }
      ++built;
      ASSERT_TRUE(p->key_strips() && p->mapped());
      expect_covers(pat, *p);
      expect_rows_exact(pat, *p);
      for (size_t kt = 0; kt < p->strips.size(); ++kt) {  // the slots as the kernels compute them (key_boxes.hpp)
        const spattn::plan::KeyStrip& s = p->strips[kt];
        const int packed = f::strip_pack(s.width, s.count);
        for (int r = 0; r < 64; ++r)
          ASSERT_EQ(f::strip_token(s.base, packed, r, p->strip_sx, p->strip_sy), p->k_map[kt * 64 + size_t(r)]);
      }
    }
    EXPECT_GT(built, 0) << "no query box shape takes strips";
  }
}

// Strip plans with their bitmasks left to the device (build_strip_plan's device_masks: a lone neighborhood atom's strips
// from its axes' windows): the strips, entries, order and nnz of the plan built from the rows, and the bits that
// BlockPlan::grid_windows describes (the device's rule, cuda/fused/strip_masks.hpp, evaluated here) are its bitmasks;
// patterns other than one atom keep their bitmasks on the host; refusals say what the rows' path says.
TEST(TileMap, StripPlansWithDeviceMasksAreTheRowsPlans) {
  for (const std::string& spec : kStripSpecs) {
    SCOPED_TRACE(spec);
    const BoundPattern pat = bind(spec);
    const auto grid = pat.neighborhood_grid();
    ASSERT_TRUE(grid.has_value());
    int drawn = 0;
    for (const TileBox& box : spattn::plan::tile_boxes(*grid, 64)) {
      SCOPED_TRACE(box.str(3));
      const GridTiling qt = GridTiling::of(*grid, box);
      std::string why_host, why_dev;
      const std::optional<BlockPlan> h = spattn::plan::build_strip_plan(pat, qt, &why_host);
      const std::optional<BlockPlan> d = spattn::plan::build_strip_plan(pat, qt, &why_dev, true);
      ASSERT_EQ(h.has_value(), d.has_value()) << why_host << " / " << why_dev;
      if (!h) {
        EXPECT_EQ(why_host, why_dev);
        continue;
      }
      EXPECT_EQ(d->row_offsets, h->row_offsets);
      ASSERT_EQ(d->nentries(), h->nentries());
      for (int64_t i = 0; i < h->nentries(); ++i) {
        EXPECT_EQ(d->entries[size_t(i)].kt, h->entries[size_t(i)].kt);
        EXPECT_EQ(d->entries[size_t(i)].mask, h->entries[size_t(i)].mask);
      }
      ASSERT_EQ(d->strips.size(), h->strips.size());
      for (size_t i = 0; i < h->strips.size(); ++i) {
        EXPECT_EQ(d->strips[i].base, h->strips[i].base) << i;
        EXPECT_EQ(d->strips[i].width, h->strips[i].width) << i;
        EXPECT_EQ(d->strips[i].count, h->strips[i].count) << i;
      }
      EXPECT_EQ(d->order, h->order);
      EXPECT_EQ(d->nnz, h->nnz);
      EXPECT_EQ(d->q_map, h->q_map);
      EXPECT_EQ(d->k_tiles, h->k_tiles);
      EXPECT_EQ(d->n_bitmask, h->n_bitmask);
      if (!d->masks_drawn()) {
        EXPECT_FALSE(grid->exact) << "a lone atom's strip masks are the device's";
        EXPECT_EQ(d->masks, h->masks);
        continue;
      }
      ++drawn;
      EXPECT_TRUE(d->masks.empty());
      for (int64_t p = 0; p < h->k_tiles * 64; ++p) ASSERT_EQ(d->k_token(p), h->k_token(p)) << p;
      // The device's rule: on every right-aligned axis, the key's coordinate in the query's coordinate's window.
      const auto& dims = d->q_tiling.dims;
      ASSERT_EQ(d->grid_windows.size(), size_t(3 * (dims[0] + dims[1] + dims[2])));
      auto coords = [&](int64_t t, int64_t* c) {
        c[2] = t % dims[2], c[1] = (t / dims[2]) % dims[1], c[0] = t / (dims[2] * dims[1]);
      };
      int64_t bad = 0;
      for (int64_t qt = 0; qt < h->q_tiles; ++qt)
        for (int64_t i = h->row_offsets[size_t(qt)]; i < h->row_offsets[size_t(qt) + 1]; ++i)
          for (int r = 0; r < 64; ++r) {
            const int64_t q = h->q_token(qt * 64 + r);
            uint64_t word = 0;
            for (int s = 0; s < 64 && q < pat.q_len(); ++s) {
              const int64_t k = d->k_token(int64_t(h->entries[size_t(i)].kt) * 64 + s);
              if (k >= pat.k_len()) continue;
              int64_t cq[3], ck[3];
              coords(q, cq), coords(k, ck);
              bool in = true;
              for (int a = 0, off = 0; a < 3; off += int(dims[size_t(a)]), ++a) {
                const int32_t* w = &d->grid_windows[size_t(3 * (off + cq[a]))];
                const int64_t x = ck[a] - w[0];
                in = in && x >= 0 && x % w[1] == 0 && x / w[1] < w[2];
              }
              word |= uint64_t(in) << s;
            }
            bad += word != h->masks[size_t(h->entries[size_t(i)].mask) * 64 + size_t(r)];
          }
      EXPECT_EQ(bad, 0) << "words the windows give otherwise than the rows";
    }
    if (grid->exact) EXPECT_GT(drawn, 0) << "a lone atom's strip plans leave their masks to the device";
  }
}

// r / W as the kernels compute it, (r * strip_inv(W)) >> 12, for every slot r < 64 and width W <= 64; the packing.
TEST(TileMap, StripDivisionIsExact) {
  namespace f = spattn::cuda::fused;
  for (int w = 1; w <= 64; ++w)
    for (int count = w; count <= 64; count += w) {
      const int packed = f::strip_pack(w, count);
      EXPECT_EQ(packed & 127, w);
      EXPECT_EQ((packed >> 7) & 127, count);
      for (int r = 0; r < 64; ++r) {
        ASSERT_EQ(f::strip_div(r, packed), r / w) << "r " << r << " W " << w;
        ASSERT_EQ(f::strip_token(1000, packed, r, 100, 3), r < count ? 1000 + (r / w) * 100 + (r % w) * 3 : -1);
      }
    }
}

// The planner takes key strips for the H100 suite's na2d (128x128, 13x13 windows) at head dim 64 and 128: 7 strips of
// 3 rows (448 slots) per 8x8 query box where 8x8 key boxes take 9 (576); tile_map 2 forces them, and is refused,
// saying why, where they do not fit.
TEST(TileMap, PlannerChoosesStripsForNa2d) {
  const BoundPattern pat = spattn::parse("neighborhood(dims=(128, 128), kernel=13)").bind(16384);
  const auto an = spattn::plan::analyze(pat);
  for (int64_t hd : {64, 128}) {
    const BlockPlan chosen = spattn::plan::choose_block_plan(pat, an, hd, 0, 0, -1, true);
    const BlockPlan boxes = spattn::plan::choose_block_plan(pat, an, hd, 0, 0, -1, true, 1);
    std::printf("  na2d 128x128 K=13 D=%lld\n    chosen: %s\n    boxes:  %s\n", (long long)hd, chosen.describe().c_str(),
                boxes.describe().c_str());
    EXPECT_TRUE(chosen.key_strips()) << chosen.describe();
    EXPECT_FALSE(boxes.key_strips());
    EXPECT_NE(chosen.describe().find("map 8x8/strips"), std::string::npos);
    // 7 strips a query box, fewer at the grid's edges (windows shifted inside: unions of 14 to 19 rows)
    EXPECT_LE(chosen.k_tiles, 7 * 256);
    EXPECT_GE(chosen.k_tiles, 6 * 256);
    EXPECT_GT(chosen.kept_fraction(), 1.2 * boxes.kept_fraction());
    expect_covers(pat, chosen);
    const BlockPlan forced = spattn::plan::choose_block_plan(pat, an, hd, 0, 0, -1, true, 2);
    EXPECT_TRUE(forced.key_strips());
    EXPECT_EQ(forced.masks, chosen.masks);
    const auto costs = spattn::plan::block_shape_costs(pat, an, hd, true);
    EXPECT_TRUE(std::any_of(costs.begin(), costs.end(), [](const auto& c) { return c.strips; }));
  }
  auto refusal = [](const std::string& spec, int64_t len, int bm, int bn) {
    const BoundPattern p = spattn::parse(spec).bind(len);
    try {
      spattn::plan::choose_block_plan(p, spattn::plan::analyze(p), 64, bm, bn, -1, true, 2);
    } catch (const spattn::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(refusal("neighborhood(dims=(4, 8, 8), kernel=3)", 256, 0, 0).find("three axes longer than 1"), std::string::npos);
  EXPECT_NE(refusal("neighborhood(dims=(8, 100), kernel=(3, 71))", 800, 0, 0).find("more than 64 coordinates"), std::string::npos);
  EXPECT_NE(refusal("local(5)", 256, 0, 0).find("no neighborhood grid"), std::string::npos);
  EXPECT_NE(refusal("neighborhood(dims=(16, 16), kernel=3)", 256, 64, 128).find("64x64 tiles only"), std::string::npos);
}

}  // namespace

// Issue 42: residue-grouped plans at any stride (kMaxGpuPermutation; was 16). Forced at the stride and each tile shape,
// at lengths that leave the groups unequal (and rectangular), a plan keeps exactly the pattern's pairs; the compound
// split's affine part (the strided term less the band) planned by the planner's choice is grouped by residue and keeps
// exactly its own pairs.
namespace {
BoundPattern bind_rect(const char* spec, int64_t lq, int64_t lk) { return spattn::parse(spec).bind(lq, lk); }
}  // namespace

TEST(AffineParts, PermutedPlansAtAnyStrideCoverThePattern) {
  struct Case {
    const char* spec;
    int64_t lq, lk, d;
  };
  for (const Case& c : {Case{"stride(40) & causal", 1000, 1000, 40}, Case{"stride(100) & causal", 1234, 1234, 100},
                        Case{"stride(100) & causal", 777, 1301, 100}, Case{"dilated(5, 37)", 1111, 1111, 37},
                        Case{"stride(256) & causal", 4000, 4000, 256}, Case{"dilated(3, 300) & causal", 2500, 1900, 300}}) {
    SCOPED_TRACE(std::string(c.spec) + " at " + std::to_string(c.lq) + "x" + std::to_string(c.lk));
    const BoundPattern pat = bind_rect(c.spec, c.lq, c.lk);
    const auto an = spattn::plan::analyze(pat);
    EXPECT_EQ(an.residue, c.d);
    EXPECT_EQ(an.permutation(spattn::plan::kMaxGpuPermutation), c.d) << "grouped by residue past stride 16";
    for (auto [bm, bn] : {std::pair{64, 64}, {64, 128}, {128, 128}}) expect_covers(pat, spattn::plan::build_block_plan(pat, bm, bn, int(c.d), &an));
    // Chosen by cost: groups of 8 tokens padded to 64 (777 / 100, 2500 / 300) may stay unpermuted.
    expect_covers(pat, spattn::plan::choose_block_plan(pat, an, 64, 0, 0, -1, true));
  }
  // The cases: the cost model groups them by residue, at both head dims.
  for (auto [spec, len, d] : {std::tuple{"stride(64) & causal", int64_t(16384), 64}, {"stride(64) & causal", 65536, 64},
                              {"dilated(64, 32)", 16384, 32}, {"dilated(64, 32)", 65536, 32}})
    for (int64_t hd : {64, 128}) {
      const BoundPattern pat = spattn::parse(spec).bind(len);
      EXPECT_EQ(spattn::plan::choose_block_plan(pat, spattn::plan::analyze(pat), hd, 0, 0, -1, true).perm_d, d)
          << spec << " at " << len << ", D " << hd;
    }
}

TEST(AffineParts, SplitPartsPlannedByResidueCoverTheirPairs) {
  for (auto [spec, len] : {std::pair{"sparse_strided(100)", int64_t(3001)}, {"sparse_strided(64)", 2113},
                           {"local(left=300, right=0) | (stride(256) & causal)", 4097}}) {
    SCOPED_TRACE(std::string(spec) + " at " + std::to_string(len));
    const BoundPattern pat = spattn::parse(spec).bind(len);
    spattn::plan::SplitTarget t;
    t.band_kernel = t.affine = t.tma = true;
    const auto split = spattn::plan::split_pattern(pat, spattn::plan::analyze(pat), 1, t);
    ASSERT_EQ(split.parts.size(), 2u) << split.describe();
    ASSERT_EQ(split.parts[1].kind, spattn::plan::PartKind::affine);
    for (const auto& part : split.parts) {
      const BlockPlan p = spattn::plan::choose_block_plan(part.pattern, *part.analysis, 64, 0, 0, -1, true);
      if (part.kind == spattn::plan::PartKind::affine) EXPECT_GT(p.perm_d, 1) << p.describe();
      expect_covers(part.pattern, p);
    }
  }
}

// Residue groups of 32 tokens or fewer grouped coarser (issue 42; choose_block_plan's coarser_groups): d / 2^j, the
// least j whose groups hold more than 32 tokens, chosen by the cost model over d's half-empty tiles, its plans'
// bitmask tiles keeping exactly the pattern's pairs; not where a shape is forced (the backward's plans): d or the
// identity there, by cost.
TEST(AffineParts, CoarserGroupsWhereGroupsAreShort) {
  struct Case {
    const char* spec;
    int64_t lq, lk, d, coarse;
  };
  for (const Case& c : {Case{"stride(512) & causal", 9001, 9001, 512, 256}, Case{"dilated(5, 300) & causal", 2500, 2500, 300, 75},
                        Case{"stride(256) & causal", 4099, 4099, 256, 128}, Case{"stride(512) & causal", 16384, 16384, 512, 256}}) {
    SCOPED_TRACE(std::string(c.spec) + " at " + std::to_string(c.lq) + "x" + std::to_string(c.lk));
    const BoundPattern pat = bind_rect(c.spec, c.lq, c.lk);
    const auto an = spattn::plan::analyze(pat);
    ASSERT_EQ(an.permutation(spattn::plan::kMaxGpuPermutation), c.d);
    const BlockPlan p = spattn::plan::choose_block_plan(pat, an, 64, 0, 0, -1, true);
    EXPECT_EQ(p.perm_d, c.coarse) << p.describe();
    EXPECT_GT(p.n_bitmask, 0) << p.describe();
    expect_covers(pat, p);
    EXPECT_NE(spattn::plan::choose_block_plan(pat, an, 64, 64, 64, -1, true).perm_d, c.coarse) << "a forced shape";
  }
}

// The backward's plans of issue 42's cases, as an H200 makes them (plan::backward_parts, backward_row, backward_tiles;
// BackwardGpu.StridedPastSixteen runs the same cases on the device): sparse_strided by parts, its affine part (the
// part the backward once dropped) and the stride and dilated terms grouped by residue past 16 on the 64-query tiles
// of the backward's rows, at lengths that leave the groups unequal, each plan keeping exactly its pattern's pairs.
// Groups of at most half a key tile of tokens are coarser in the backward (backward_groups: `perm`):
// sparse_strided(256) at 4099 has groups of 16-17 tokens, 128 groups of 32-33 instead; at D = 128 (64x128 tiles)
// groups need more than 64.
TEST(AffineParts, BackwardPlansGroupByResiduePastSixteen) {
  const spattn::plan::GpuTarget h200{90, 132};
  struct Case {
    const char* spec;
    int64_t lq, lk, d;
    int compound, perm;
    bool by_parts;
  };
  for (Case c : {Case{"sparse_strided(256)", 4099, 4099, 64, -1, 128, true},
                 Case{"sparse_strided(128)", 3001, 3001, 128, -1, 32, true},
                 Case{"sparse_strided(100)", 2111, 2111, 64, 1, 50, true},
                 Case{"sparse_strided(512)", 9001, 9001, 128, -1, 128, true},
                 Case{"stride(64) & causal", 3001, 3001, 128, -1, 32, false},
                 Case{"stride(40) & causal", 1999, 1999, 64, -1, 40, false},
                 Case{"dilated(64, 32)", 2049, 2049, 64, -1, 32, false},
                 Case{"dilated(16, 17)", 1500, 1301, 64, -1, 17, false}}) {
    SCOPED_TRACE(std::string(c.spec) + " at " + std::to_string(c.lq) + "x" + std::to_string(c.lk) + ", D " +
                 std::to_string(c.d));
    const BoundPattern pat = bind_rect(c.spec, c.lq, c.lk);
    const auto an = spattn::plan::analyze(pat);
    spattn::PlanOptions o;
    o.compound = c.compound;
    const spattn::plan::BackwardParts bp = spattn::plan::backward_parts(pat, an, c.d, h200, o);
    ASSERT_EQ(bp.by_parts(), c.by_parts) << bp.describe();
    const spattn::plan::BackwardChoice chosen = spattn::plan::backward_choice("", c.d);
    auto plan_of = [&](const BoundPattern& p, const spattn::plan::Analysis& a) {
      return spattn::plan::backward_tiles(p, a, c.d, spattn::plan::backward_row(chosen, a, c.d));
    };
    if (!c.by_parts) {
      const BlockPlan p = plan_of(pat, an);
      EXPECT_EQ(p.perm_d, c.perm) << p.describe();
      expect_covers(pat, p);
      continue;
    }
    ASSERT_EQ(bp.parts.size(), 2u) << bp.describe();
    EXPECT_EQ(bp.parts[0].kind, spattn::plan::PartKind::tiles);
    ASSERT_EQ(bp.parts[1].kind, spattn::plan::PartKind::affine) << bp.describe();
    EXPECT_NE(bp.describe().find("grouped by residue; dQ, dK, dV added"), std::string::npos) << bp.describe();
    int64_t nnz = 0;
    for (const auto& part : bp.parts) {
      ASSERT_EQ(part.pattern.q_len(), c.lq);
      ASSERT_TRUE(part.analysis.has_value());
      const BlockPlan p = plan_of(part.pattern, *part.analysis);
      if (part.kind == spattn::plan::PartKind::affine) EXPECT_EQ(p.perm_d, c.perm) << p.describe();
      expect_covers(part.pattern, p);
      nnz += p.nnz;
    }
    EXPECT_EQ(nnz, an.nnz) << "the parts' pairs are the pattern's, once";
  }
}

// At stride 256 and L = 16384 each residue group holds 64 tokens, and stride(256) & causal less the diagonal (the
// affine part of sparse_strided(256)) is one 64x64 band tile a group: 256 tiles.
TEST(AffineParts, SparseStrided256IsOneCausalBlockAGroup) {
  const BoundPattern pat = spattn::parse("sparse_strided(256)").bind(16384);
  spattn::plan::SplitTarget t;
  t.band_kernel = t.affine = t.tma = true;
  const auto split = spattn::plan::split_pattern(pat, spattn::plan::analyze(pat), -1, t);
  ASSERT_EQ(split.parts.size(), 2u) << split.describe();
  const auto& ap = split.parts[1];
  const BlockPlan p = spattn::plan::choose_block_plan(ap.pattern, *ap.analysis, 64, 0, 0, -1, true);
  EXPECT_EQ(p.perm_d, 256);
  EXPECT_EQ(p.q_group, 64);
  EXPECT_EQ(p.block_m, 64);
  EXPECT_EQ(p.block_n, 64);
  EXPECT_EQ(p.nentries(), 256);
  EXPECT_EQ(p.n_band, 256);
  EXPECT_EQ(p.nnz, 256 * (64 * 63 / 2));
}
