// The neighborhood backward on query strips (issue 39; plan/key_plan.hpp, key_major_strips), on the CPU: the key-major
// plan covers exactly the pattern's kept pairs (each kept (q, k) by one entry's bitmask, never a padding slot or key),
// its key boxes are a bijection on the keys, its entries carry their strips' geometry (plan/key_strips.hpp), and its
// kept fraction of visited scores is the forward's strips' rather than the row-major key-major plan's. Chosen for 2-D
// neighborhoods, forced by backward_kernel "sm90_bwd_strips"; another backward_kernel runs the row-major plan.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "grid_spec.hpp"
#include "plan/analysis.hpp"
#include "plan/gpu/block_plan.hpp"
#include "plan/gpu/launch.hpp"
#include "plan/kernels.hpp"
#include "plan/key_plan.hpp"
#include "plan/key_strips.hpp"
#include "spattn/error.hpp"
#include "spattn/pattern.hpp"

namespace {

using spattn::BoundPattern;
using spattn::plan::KeyMajorPlan;

BoundPattern bind(const std::string& spec) { return spattn::test::bind_grid_spec(spec); }

// Every kept (q, k) lies in exactly one entry's bitmask, no bit sits on a padding slot or key or on a pair the pattern
// drops, every key token is in exactly one key-tile row, and the entries' words are their strips'.
void expect_covers(const BoundPattern& pat, const KeyMajorPlan& km) {
  const int64_t lq = pat.q_len(), lk = pat.k_len();
  ASSERT_TRUE(km.query_strips);
  ASSERT_EQ(km.block_m, 64);
  ASSERT_EQ(km.block_n, 64);
  ASSERT_EQ(int64_t(km.k_map.size()), km.k_tiles * 64);
  ASSERT_EQ(int64_t(km.col_offsets.size()), km.k_tiles + 1);
  ASSERT_EQ(km.col_offsets.back(), int64_t(km.entries.size()));
  ASSERT_EQ(km.masks.size(), km.entries.size() * 64);
  std::vector<int> key_seen(size_t(lk), 0);
  for (int32_t t : km.k_map) {
    ASSERT_TRUE(t >= -1 && t < lk) << t;
    if (t >= 0) ++key_seen[size_t(t)];
  }
  for (int64_t k = 0; k < lk; ++k) ASSERT_EQ(key_seen[size_t(k)], 1) << "key " << k << " in key-tile rows";
  std::vector<uint8_t> kept(size_t(lq * lk), 0);
  int64_t wrong = 0, padding = 0, strips_seen = 0;
  std::vector<char> strip_used(size_t(km.q_tiles), 0);
  for (int64_t kt = 0; kt < km.k_tiles; ++kt)
    for (int64_t i = km.col_offsets[size_t(kt)]; i < km.col_offsets[size_t(kt) + 1]; ++i) {
      const spattn::plan::TileEntry& e = km.entries[size_t(i)];
      ASSERT_TRUE(e.kt >= 0 && e.kt < km.q_tiles);
      ASSERT_GE(e.mask, 0) << "every query-strip entry is a bitmask";
      strips_seen += !strip_used[size_t(e.kt)];
      strip_used[size_t(e.kt)] = 1;
      const int packed = e.hi, count = (packed >> 7) & 127, width = packed & 127;
      ASSERT_TRUE(width >= 1 && width <= 64 && count >= 1 && count <= 64) << packed;
      for (int c = 0; c < 64; ++c) {
        const int64_t k = km.k_map[size_t(kt * 64 + c)];
        const uint64_t w = km.masks[size_t(e.mask) * 64 + size_t(c)];
        for (int r = 0; r < 64; ++r) {
          if (!((w >> r) & 1)) continue;
          const int q = spattn::plan::strip_token(e.lo, packed, r, km.strip_sx, km.strip_sy);
          if (q < 0 || k < 0 || q >= lq) {
            ++padding;
            continue;
          }
          wrong += !pat.contains(q, k);
          ++kept[size_t(q * lk + k)];
        }
      }
    }
  EXPECT_EQ(wrong, 0) << "pairs kept that the pattern drops";
  EXPECT_EQ(padding, 0) << "bits on padding slots or keys";
  EXPECT_EQ(strips_seen, km.q_tiles) << "every strip is some entry's";
  spattn::test::expect_kept_once(pat, kept, km.nnz);
  // Key tiles in order of most entries first.
  ASSERT_EQ(int64_t(km.order.size()), km.k_tiles);
  for (size_t i = 1; i < km.order.size(); ++i)
    EXPECT_GE(km.col_offsets[size_t(km.order[i - 1]) + 1] - km.col_offsets[size_t(km.order[i - 1])],
              km.col_offsets[size_t(km.order[i]) + 1] - km.col_offsets[size_t(km.order[i])]);
}

TEST(BackwardStrips, CoverExactlyThePatternsPairs) {
  const char* specs[] = {
      "neighborhood(dims=(1, 40), kernel=(1, 7))",
      "neighborhood(dims=(2, 50), kernel=(1, 5), dilation=(1, 3))",
      "neighborhood(dims=(37, 41), kernel=7)",
      "neighborhood(dims=(40, 48), kernel=13)",
      "neighborhood(dims=(23, 29), kernel=(5, 3), dilation=(2, 3))",
      "neighborhood(dims=(30, 33), kernel=5, causal=(1, 0))",
      "neighborhood(dims=(30, 33), kernel=(3, 7), causal=(0, 1))",
      "neighborhood(dims=(19, 45), kernel=4, causal=1, dilation=(1, 2))",
      "neighborhood(dims=(9, 200), kernel=(3, 11))",
      "neighborhood(dims=(3, 17), kernel=3)",
      "neighborhood(dims=(1, 9, 11), kernel=(1, 3, 3))",
      "neighborhood(dims=(20, 30), kernel=5) & causal",
      "neighborhood(dims=(48, 48), kernel=7)",
      "neighborhood(dims=(20, 30), kernel=5) | global(0:3)",
  };
  for (const char* spec : specs) {
    SCOPED_TRACE(spec);
    const BoundPattern pat = bind(spec);
    std::string why;
    const auto km = spattn::plan::key_major_strips(pat, &why);
    ASSERT_TRUE(km.has_value()) << why;
    expect_covers(pat, *km);
  }
}

TEST(BackwardStrips, RefusedWhereStripsDoNotFit) {
  struct Case {
    const char* spec;
    const char* why;
  } cases[] = {
      {"neighborhood(dims=(5, 9, 11), kernel=3)", "three axes"},
      {"local(16)@300", "no neighborhood grid"},
      {"neighborhood(dims=(20, 100), kernel=5) | global(0:3)", "64 coordinates"},
      {"neighborhood(kernel=7)@300", "64 coordinates"},  // a 1-D window: a band (the band rows' backward)
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    std::string why;
    EXPECT_FALSE(spattn::plan::key_major_strips(bind(c.spec), &why).has_value());
    EXPECT_NE(why.find(c.why), std::string::npos) << why;
  }
}

// The kept fraction of visited scores: the forward's strips', not the row-major key-major plan's (printed, with the
// forward's chosen plan's; na2d 96x96 K=7: row-major 0.064, forward strips 0.167).
TEST(BackwardStrips, KeptFractionNearTheForwards) {
  struct Case {
    const char* spec;
    int64_t head_dim;
    double min_gain;  // over the row-major key-major plan's kept fraction
  } cases[] = {
      {"neighborhood(dims=(96, 96), kernel=7)", 64, 2.0},
      {"neighborhood(dims=(112, 112), kernel=9)", 128, 2.0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    const BoundPattern pat = bind(c.spec);
    const spattn::plan::Analysis an = spattn::plan::analyze(pat);
    const int row = spattn::plan::backward_row(spattn::plan::backward_choice("", c.head_dim), an, c.head_dim);
    const spattn::plan::BlockPlan rowmajor = spattn::plan::backward_tiles(pat, an, c.head_dim, row);
    const spattn::plan::BlockPlan fwd = spattn::plan::choose_block_plan(pat, an, c.head_dim, 0, 0, -1, true, -1);
    std::string why;
    const auto km = spattn::plan::key_major_strips(pat, &why);
    ASSERT_TRUE(km.has_value()) << why;
    std::printf("%s D=%lld: kept fraction of visited scores: backward row-major %.4f (%s), backward query strips %.4f "
                "(%lld entries, %s), forward %.4f (%s)\n",
                c.spec, (long long)c.head_dim, rowmajor.kept_fraction(), spattn::plan::kKernels[row].name,
                km->kept_fraction(), (long long)km->entries.size(), km->key_boxes.c_str(), fwd.kept_fraction(),
                fwd.key_strips() ? "key strips" : fwd.mapped() ? "tile map" : "row-major");
    EXPECT_GE(km->kept_fraction(), c.min_gain * rowmajor.kept_fraction());
    EXPECT_GE(km->kept_fraction(), 0.8 * fwd.kept_fraction());
  }
}

// Asked for 2-D neighborhoods where no kernel is forced; backward_kernel "sm90_bwd_strips" forces it on the 64x64
// sm90_bwd row of the head dim; any other backward kernel forced (the row-major tile plan, or the CSR pass) never
// asks for them.
TEST(BackwardStrips, WhereAsked) {
  using spattn::plan::query_strips_asked;
  const auto grid = [](const char* spec, int64_t len) {
    return spattn::plan::query_strips_grid(spattn::parse(spec).bind(len));
  };
  const auto na2d = grid("neighborhood(dims=(32, 32), kernel=7)", 1024);
  const auto na2d_causal = grid("neighborhood(dims=(20, 30), kernel=5) & causal", 600);
  const auto na1d = grid("neighborhood(kernel=7)", 300);
  const auto na3d = grid("neighborhood(dims=(8, 8, 16), kernel=3)", 1024);
  const auto band = grid("local(64)", 1024);
  const auto chosen = spattn::plan::backward_choice("", 64);
  EXPECT_TRUE(query_strips_asked(chosen, na2d));
  EXPECT_TRUE(query_strips_asked(chosen, na2d_causal));
  EXPECT_FALSE(query_strips_asked(chosen, na1d));  // a band: the tile rows
  EXPECT_FALSE(query_strips_asked(chosen, na3d));
  EXPECT_FALSE(query_strips_asked(chosen, band));
  const auto forced = spattn::plan::backward_choice("sm90_bwd_strips", 64);
  EXPECT_TRUE(query_strips_asked(forced, na2d));
  EXPECT_TRUE(query_strips_asked(forced, band));  // forced: run, or an Error where they do not fit
  EXPECT_EQ(forced.row, spattn::plan::find_kernel("sm90_bwd_64x64_d64"));
  EXPECT_EQ(spattn::plan::backward_choice("sm90_bwd_strips", 128).row, spattn::plan::find_kernel("sm90_bwd_64x64_d128"));
  // The D = 128 row runs query strips only: neither forced by name nor chosen.
  EXPECT_THROW(spattn::plan::backward_choice("sm90_bwd_64x64_d128", 128), spattn::Error);
  EXPECT_THROW(spattn::plan::backward_choice("sm90_bwd_strips", 96), spattn::Error);
  for (const char* spec : {"dilated(64, 2)", "local(64)", "neighborhood(dims=(32, 32), kernel=7)"}) {
    const spattn::plan::Analysis an = spattn::plan::analyze(spattn::parse(spec).bind(1024));
    for (const char* kernel : {"", "sm90_bwd"}) {
      const int row = spattn::plan::backward_row(spattn::plan::backward_choice(kernel, 128), an, 128);
      EXPECT_FALSE(spattn::plan::bwd_strips_only(spattn::plan::kKernels[row])) << spec << " " << kernel;
    }
  }
  // The row-major tile plan of a 2-D neighborhood: its row (or kind) forced.
  for (const char* kernel : {"sm90_bwd", "sm90_bwd_ws", "sm90_bwd_ws_128x128_d64", "sm90_bwd_64x128_d64", "cuda_csr_bwd"})
    for (const auto g : {na2d, na2d_causal})
      EXPECT_FALSE(query_strips_asked(spattn::plan::backward_choice(kernel, 64), g)) << kernel;
}

}  // namespace
