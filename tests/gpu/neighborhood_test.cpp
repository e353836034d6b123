// Neighborhood patterns on the fused GPU engine (issue 23) against the fp64 reference engine, with outputs poisoned
// first (an unwritten row or a padding row written over a real one fails). Mapped plans (query and key tiles as
// boxes of the token grid, key rows' tokens computed from each key box's geometry, Q rows gathered through the
// plan's map, O and LSE stored at the mapped tokens): 1-D (forced map: residue groups, and row-major order), 2-D and
// 3-D grids, dilation with groups of unequal size, causal axes, sides off the box sizes, D 64 and 128, bf16 and
// fp16, GQA, every cp.async tile shape and the mma.sync kernel, a union with other terms (one tile list, and a
// compound plan whose tiles part is mapped); key strips (tile_map 2) on the 64x64 cp.async and mma.sync kernels. 1-D windows shifted at the ends on the band kernel and the others.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda/fused/strip_masks.hpp"
#include "gpu/plan_run.hpp"
#include "gpu/require_gpu.hpp"
#include "plan/gpu/block_plan.hpp"
#include "plan/kernels.hpp"
#include "plan/key_strips.hpp"
#include "plan/tile_map.hpp"
#include "spattn/device.hpp"
#include "spattn/plan.hpp"

namespace {

using spattn::DType;
using spattn::test::problem;
using spattn::test::run_vs_reference;

struct Case {
  const char* what;  // the failure it guards against
  const char* spec;
  int64_t L, B, H, HK, D;
  DType dt;
  int tile_map = -1;           // PlanOptions::tile_map (-1: the planner must choose the map itself)
  const char* kernel = "";     // PlanOptions::kernel
  int block_m = 0, block_n = 0;
  int compound = -1;           // PlanOptions::compound
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << c.what << " [" << c.spec << " L" << c.L << " B" << c.B << " H" << c.H << "/" << c.HK << " D" << c.D << " "
            << spattn::dtype_name(c.dt) << " tile_map " << c.tile_map << (c.kernel[0] ? " kernel " : "") << c.kernel
            << (c.block_m ? " " + std::to_string(c.block_m) + "x" + std::to_string(c.block_n) : "")
            << (c.compound >= 0 ? " compound " + std::to_string(c.compound) : "") << "]";
}

constexpr DType bf = DType::bf16, fp = DType::f16;
const Case kCases[] = {
    {"2-D chosen map, 13x13 windows", "neighborhood(dims=(48, 48), kernel=13)", 2304, 2, 2, 2, 64, bf},
    {"2-D sides off the boxes (padding rows and keys), GQA", "neighborhood(dims=(37, 41), kernel=7)", 1517, 1, 4, 2, 64, bf, 1},
    {"2-D dilation, unequal groups, D128 fp16", "neighborhood(dims=(45, 51), kernel=(5, 7), dilation=(2, 3))", 2295, 1, 2, 2, 128,
     fp, 1},
    {"2-D causal axis 0, GQA 4:1 fp16", "neighborhood(dims=(30, 34), kernel=(5, 9), causal=(1, 0))", 1020, 2, 4, 1, 64, fp, 1},
    {"2-D causal axis 1", "neighborhood(dims=(33, 30), kernel=7, causal=(0, 1))", 990, 1, 2, 2, 128, bf, 1},
    {"2-D grid narrower than a box side", "neighborhood(dims=(3, 17), kernel=3)", 51, 1, 2, 2, 64, bf, 1},
    {"3-D", "neighborhood(dims=(6, 20, 22), kernel=(3, 5, 7))", 2640, 1, 2, 2, 128, bf, 1},
    {"3-D causal first axis, dilation", "neighborhood(dims=(8, 16, 18), kernel=(3, 3, 5), dilation=(1, 2, 2), causal=(1, 0, 0))",
     2304, 1, 2, 1, 64, bf, 1},
    {"3-D suite-like (causal 7x7x7), fp16", "neighborhood(dims=(8, 16, 16), kernel=7, causal=(1, 0, 0))", 2048, 1, 2, 2, 64, fp},
    {"1-D forced map: residue groups of unequal size", "neighborhood(kernel=9, dilation=3)", 1001, 1, 2, 2, 64, fp, 1},
    {"1-D forced map: row-major order, padded to whole tiles", "neighborhood(kernel=33)", 700, 1, 2, 2, 128, bf, 1},
    {"union with global rows and columns: one tile list, the grid guides the boxes",
     "neighborhood(dims=(40, 40), kernel=7) | global(0:4)", 1600, 1, 2, 2, 64, bf, 1},
    {"union as a compound plan: the tiles part mapped, merged with the others", "neighborhood(dims=(40, 40), kernel=7) | global(0:4)",
     1600, 2, 4, 2, 64, fp, 1, "", 0, 0, 1},
    // Every cp.async shape's mapped instantiation (64x128 with half-width entries), and the mma.sync kernel.
    {"forced 64x128 tiles", "neighborhood(dims=(40, 36), kernel=(7, 5))", 1440, 1, 2, 2, 64, bf, 1, "", 64, 128},
    {"forced 128x128 tiles", "neighborhood(dims=(40, 36), kernel=(7, 5))", 1440, 1, 2, 2, 64, fp, 1, "", 128, 128},
    {"forced 64x64 tiles", "neighborhood(dims=(40, 36), kernel=(7, 5))", 1440, 1, 2, 2, 64, bf, 1, "", 64, 64},
    {"forced 128x128 tiles D128", "neighborhood(dims=(40, 36), kernel=(7, 5))", 1440, 1, 2, 1, 128, bf, 1, "", 128, 128},
    {"forced 64x64 tiles D128", "neighborhood(dims=(40, 36), kernel=(7, 5))", 1440, 1, 2, 2, 128, fp, 1, "", 64, 64},
    {"sm80 kernel, mapped", "neighborhood(dims=(40, 36), kernel=(7, 5), dilation=(2, 1))", 1440, 1, 2, 2, 64, bf, 1, "sm80"},
    {"sm80 kernel, mapped D128", "neighborhood(dims=(20, 18, 4), kernel=3)", 1440, 1, 2, 2, 128, fp, 1, "sm80"},
    // Key strips (tile_map 2: each query box's keys as strips of its window union, 64x64 tiles; key rows' tokens from
    // each entry's base and strip_pack, key_boxes.hpp): chosen for na2d-like grids, forced elsewhere.
    {"strips chosen, 13x13 windows (na2d-like)", "neighborhood(dims=(64, 64), kernel=13)", 4096, 1, 2, 2, 64, bf, 2},
    {"strips, sides off the boxes, clamped windows, GQA", "neighborhood(dims=(37, 41), kernel=7)", 1517, 1, 4, 2, 64, bf, 2},
    {"strips D128 fp16, 13x13", "neighborhood(dims=(40, 48), kernel=13)", 1920, 1, 2, 2, 128, fp, 2},
    {"strips, dilation 2 with unequal groups", "neighborhood(dims=(45, 51), kernel=(5, 7), dilation=2)", 2295, 1, 2, 1, 64, fp, 2},
    {"strips, causal axis 0, D128", "neighborhood(dims=(30, 34), kernel=(5, 9), causal=(1, 0))", 1020, 2, 2, 2, 128, bf, 2},
    {"strips, 7x9 grid (one strip set covers it)", "neighborhood(dims=(7, 9), kernel=(7, 5))", 63, 1, 2, 2, 64, bf, 2},
    {"strips, union with global rows (wide unions)", "neighborhood(dims=(20, 30), kernel=5) | global(0:3)", 600, 1, 2, 2, 64, bf, 2, "", 0, 0, 0},
    {"strips on the sm80 kernel", "neighborhood(dims=(40, 36), kernel=(7, 5), dilation=(2, 1))", 1440, 1, 2, 2, 64, bf, 2, "sm80"},
    {"strips on the sm80 kernel D128", "neighborhood(dims=(33, 30), kernel=9)", 990, 1, 2, 2, 128, fp, 2, "sm80"},
};

class NeighborhoodGpu : public ::testing::TestWithParam<Case> {};
INSTANTIATE_TEST_SUITE_P(Mapped, NeighborhoodGpu, ::testing::ValuesIn(kCases));

TEST_P(NeighborhoodGpu, MatchesReference) {
  REQUIRE_GPU();
  const Case& c = GetParam();
  SCOPED_TRACE(::testing::PrintToString(c));
  spattn::PlanOptions o;
  o.tile_map = c.tile_map;
  o.kernel = c.kernel;
  o.block_m = c.block_m, o.block_n = c.block_n;
  o.compound = c.compound;
  const std::vector<spattn::Pattern> pats{spattn::parse(c.spec)};
  const spattn::Plan plan = spattn::make_plan(pats, problem(c.B, c.H, c.HK, c.L, c.D, c.dt), spattn::Device::cuda(0), o);
  const std::string ex = plan.explain();
  EXPECT_NE(ex.find("tile map: query tiles"), std::string::npos) << "the plan must be mapped: " << ex;
  double lse_err = 0;
  const double rel = run_vs_reference(plan, pats, c.dt, 17, &lse_err);
  EXPECT_LE(rel, 1e-2) << ex;
  EXPECT_LE(lse_err, 2e-2) << ex;
  const std::string ran = plan.last_kernel();
  EXPECT_TRUE(ran.rfind("sm90_cp_", 0) == 0 || ran.rfind("sm80_", 0) == 0) << "mapped plans run the cp.async or mma.sync kernels: " << ran;
  if (c.kernel[0]) EXPECT_EQ(ran.rfind(std::string(c.kernel) + "_", 0), 0u) << ran;
  if (c.block_m) EXPECT_NE(ran.find(std::to_string(c.block_m) + "x" + std::to_string(c.block_n)), std::string::npos) << ran;
  if (c.tile_map == 2) {
    EXPECT_NE(ex.find("key tiles strips of each query box's window union"), std::string::npos) << "the plan must use strips: " << ex;
    const bool lone = spattn::parse(c.spec).bind(c.L).neighborhood_grid()->exact;  // one atom: masks from its windows
    EXPECT_EQ(ex.find("bitmasks computed on the device from the grid's windows") != std::string::npos, lone) << ex;
    EXPECT_NE(ran.find("64x64"), std::string::npos) << "strip plans run the 64x64 kernels: " << ran;
  }
  std::printf("  %s: rel err %.2e, lse err %.2e, %s\n", c.what, rel, lse_err, ran.c_str());
}

// 1-D neighborhoods (issue 23): rows that keep W keys from clamp(q - K/2, 0, L - W) on (windows shifted inside the
// keys at the ends) are band rows with two clamps (Analysis::window): on sm_90a (head dims 64 and 128) the band
// kernel's shifted instantiation runs them (chosen; forced variants: running-max steps, split items, slabs, one item a CTA),
// and the other kernels run the same plan through its per-tile entries (TMA, cp.async, mma.sync).
struct WindowCase {
  const char* what;
  const char* spec;
  int64_t L, B, H, HK;
  DType dt;
  const char* kernel = "";  // PlanOptions::kernel ("": chosen, the band kernel on sm_90a)
  int split = -1, persistent = -1;
  bool union_ = false;  // a union: a compound plan whose parts run on their own kernels (no kernel expected)
  int64_t D = 64;
  const char* chosen = "sm90_band";  // the kernel a chosen plan (kernel "") runs on sm_90a
};
std::ostream& operator<<(std::ostream& os, const WindowCase& c) {
  return os << c.what << " [" << c.spec << " L" << c.L << " B" << c.B << " H" << c.H << "/" << c.HK << " "
            << spattn::dtype_name(c.dt) << (c.kernel[0] ? " kernel " : "") << c.kernel << " split " << c.split
            << " persistent " << c.persistent << " D" << c.D << "]";
}
const WindowCase kWindowCases[] = {
    {"na1d chosen: clamped first and last 128 rows, tails", "neighborhood(kernel=257)", 4099, 1, 2, 2, bf},
    {"even kernel, GQA fp16", "neighborhood(kernel=64)", 2000, 2, 4, 1, fp},
    {"window almost the whole sequence (most rows clamped)", "neighborhood(kernel=257)", 300, 1, 2, 2, bf},
    {"narrow window (one or two chunks a slab)", "neighborhood(kernel=5)", 1000, 1, 2, 2, fp},
    {"long rows, running-max steps", "neighborhood(kernel=1601)", 3001, 1, 2, 2, bf, "sm90_band_rmax"},
    {"split items: 3 parts", "neighborhood(kernel=257)", 2000, 1, 4, 2, bf, "sm90_band", 3},
    {"split items: slabs", "neighborhood(kernel=129)", 4099, 2, 8, 4, fp, "sm90_band", 1},
    {"one item a CTA", "neighborhood(kernel=257)", 2000, 2, 4, 4, bf, "sm90_band", -1, 0},
    {"the TMA kernel: per-tile entries", "neighborhood(kernel=257)", 2000, 1, 2, 2, bf, "sm90_tma"},
    {"the cp.async kernel", "neighborhood(kernel=99)", 1500, 1, 2, 2, fp, "sm90_cp"},
    {"the mma.sync kernel", "neighborhood(kernel=99)", 1500, 1, 2, 2, bf, "sm80"},
    {"a union with global tokens: the window part of a compound plan", "neighborhood(kernel=257) | global(0:4)", 2000,
     1, 2, 2, bf, "", -1, -1, true},
    {"D128 na1d chosen: clamped rows, tails", "neighborhood(kernel=257)", 4099, 1, 2, 2, bf, "", -1, -1, false, 128},
    {"D128 even kernel, GQA fp16", "neighborhood(kernel=64)", 2000, 2, 4, 1, fp, "", -1, -1, false, 128},
    {"D128 window almost the whole sequence", "neighborhood(kernel=257)", 300, 1, 2, 2, bf, "", -1, -1, false, 128},
    {"D128 narrow window", "neighborhood(kernel=5)", 1000, 1, 2, 2, fp, "", -1, -1, false, 128},
    {"D128 long rows, forced (plain steps)", "neighborhood(kernel=1601)", 3001, 1, 2, 2, bf, "sm90_band", -1, -1, false, 128},
    {"D128 long rows chosen: the TMA kernel", "neighborhood(kernel=1601)", 3001, 1, 2, 2, bf, "", -1, -1, false, 128,
     "sm90_tma"},
    {"D128 split items: 3 parts", "neighborhood(kernel=257)", 2000, 1, 4, 2, bf, "sm90_band", 3, -1, false, 128},
    {"D128 split items: slabs", "neighborhood(kernel=129)", 4099, 2, 8, 4, fp, "sm90_band", 1, -1, false, 128},
    {"D128 one item a CTA", "neighborhood(kernel=257)", 2000, 2, 4, 4, bf, "sm90_band", -1, 0, false, 128},
    {"D128 the TMA kernel: per-tile entries", "neighborhood(kernel=257)", 2000, 1, 2, 2, bf, "sm90_tma", -1, -1, false, 128},
};

class NeighborhoodWindowGpu : public ::testing::TestWithParam<WindowCase> {};
INSTANTIATE_TEST_SUITE_P(Windows, NeighborhoodWindowGpu, ::testing::ValuesIn(kWindowCases));

TEST_P(NeighborhoodWindowGpu, MatchesReference) {
  REQUIRE_GPU();
  const WindowCase& c = GetParam();
  SCOPED_TRACE(::testing::PrintToString(c));
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  const bool sm90 = major == 9;
  if (!sm90 && c.kernel[0] && std::string(c.kernel) != "sm80") GTEST_SKIP() << c.kernel << " needs an sm_90a GPU";
  spattn::PlanOptions o;
  o.kernel = c.kernel;
  o.split = c.split;
  o.persistent = c.persistent;
  const std::vector<spattn::Pattern> pats{spattn::parse(c.spec)};
  const spattn::Plan plan = spattn::make_plan(pats, problem(c.B, c.H, c.HK, c.L, c.D, c.dt), spattn::Device::cuda(0), o);
  const std::string ex = plan.explain();
  double lse_err = 0;
  const double rel = run_vs_reference(plan, pats, c.dt, 29, &lse_err);
  EXPECT_LE(rel, 1e-2) << ex;
  EXPECT_LE(lse_err, 2e-2) << ex;
  const std::string ran = plan.last_kernel();
  const std::string want = c.kernel[0] ? c.kernel : c.chosen;
  if (sm90 && !c.union_ && want.rfind("sm90_band", 0) == 0) {
    EXPECT_EQ(ran.rfind(want, 0), 0u) << ran << "; " << ex;
    EXPECT_NE(ex.find("shifted inside the keys"), std::string::npos) << "the plan's rows are shifted windows: " << ex;
  } else if (sm90 && !c.union_ && !c.kernel[0]) {
    EXPECT_EQ(ran.rfind(want + "_", 0), 0u) << ran << "; " << ex;
  } else if (c.kernel[0]) {
    EXPECT_EQ(ran.rfind(std::string(c.kernel) + "_", 0), 0u) << ran;
  }
  std::printf("  %s: rel err %.2e, lse err %.2e, %s\n", c.what, rel, lse_err, ran.c_str());
}

// Small mapped plans for compute-sanitizer (scripts/gpu_check.d/neighborhood.sh): padding rows and keys in most
// tiles, both head dims, a half-width 64x128 plan (its upper halves' rows from key box row 64 on); and a shifted-
// window plan on the band kernel (sm_90a).
TEST(NeighborhoodGpuSmall, MappedPlansForSanitizers) {
  REQUIRE_GPU();
  {
    const std::vector<spattn::Pattern> pats{spattn::parse("neighborhood(kernel=65)")};
    const spattn::Plan plan = spattn::make_plan(pats, problem(1, 2, 2, 777, 64, bf), spattn::Device::cuda(0));
    EXPECT_LE(run_vs_reference(plan, pats, bf, 5), 1e-2) << plan.explain();
  }
  for (auto [spec, L, D, bm, bn] : {std::tuple{"neighborhood(dims=(11, 13), kernel=(5, 3), dilation=(2, 1))", 143, 64, 64, 128},
                                    std::tuple{"neighborhood(dims=(5, 6, 7), kernel=3, causal=(1, 0, 0))", 210, 128, 0, 0}}) {
    SCOPED_TRACE(spec);
    spattn::PlanOptions o;
    o.tile_map = 1;
    o.block_m = bm, o.block_n = bn;
    const std::vector<spattn::Pattern> pats{spattn::parse(spec)};
    const spattn::Plan plan = spattn::make_plan(pats, problem(1, 2, 1, L, D, bf), spattn::Device::cuda(0), o);
    EXPECT_LE(run_vs_reference(plan, pats, bf, 5), 1e-2) << plan.explain();
  }
}

// A strip plan's bitmasks computed on the device from its grid's windows (cuda/fused/strip_masks.hpp) are, word for word,
// those the host builds from the rows, every word written (the buffer is poisoned first): 2-D and 3-D grids with
// two axes used, dilation with unequal groups, causal axes, clamped windows, grids off the box sides, the suite's na2d.
TEST(NeighborhoodGpuSmall, StripMasksOnTheDeviceAreTheRows) {
  REQUIRE_GPU();
  for (auto [spec, L] : {std::pair{"neighborhood(dims=(37, 41), kernel=7)", 1517}, {"neighborhood(dims=(45, 51), kernel=13, dilation=2)", 2295},
                         {"neighborhood(dims=(23, 29), kernel=(5, 3), dilation=(2, 3))", 667},
                         {"neighborhood(dims=(30, 33), kernel=7, causal=(1, 0))", 990},
                         {"neighborhood(dims=(19, 45), kernel=4, causal=1, dilation=(1, 2))", 855},
                         {"neighborhood(dims=(9, 1, 30), kernel=(3, 1, 7))", 270}, {"neighborhood(dims=(7, 9), kernel=(7, 5))", 63},
                         {"neighborhood(dims=(128, 128), kernel=13)", 16384}}) {
    SCOPED_TRACE(spec);
    const spattn::BoundPattern pat = spattn::parse(spec).bind(L);
    const auto grid = pat.neighborhood_grid();
    int checked = 0;
    for (const spattn::plan::TileBox& box : spattn::plan::tile_boxes(*grid, 64)) {
      const spattn::plan::GridTiling qt = spattn::plan::GridTiling::of(*grid, box);
      const auto h = spattn::plan::build_strip_plan(pat, qt), d = spattn::plan::build_strip_plan(pat, qt, nullptr, true);
      if (!h) continue;
      ASSERT_TRUE(d && d->masks_drawn()) << box.str(3);
      std::vector<int32_t> up;  // entries as the upload makes them: kt, mask, base, strip_pack(W, count)
      for (const spattn::plan::TileEntry& e : d->entries) {
        const spattn::plan::KeyStrip& st = d->strips[size_t(e.kt)];
        up.insert(up.end(), {e.kt, e.mask, st.base, spattn::plan::strip_pack(st.width, st.count)});
      }
      const size_t words = size_t(d->nentries()) * 64;
      int64_t* ro = nullptr;
      int32_t *en = nullptr, *qm = nullptr, *win = nullptr;
      unsigned long long* m = nullptr;
      ASSERT_EQ(cudaMalloc(&ro, d->row_offsets.size() * 8), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&en, up.size() * 4 + 16), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&qm, d->q_map.size() * 4), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&win, d->grid_windows.size() * 4), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&m, words * 8 + 8), cudaSuccess);
      cudaMemcpy(ro, d->row_offsets.data(), d->row_offsets.size() * 8, cudaMemcpyHostToDevice);
      cudaMemcpy(en, up.data(), up.size() * 4, cudaMemcpyHostToDevice);
      cudaMemcpy(qm, d->q_map.data(), d->q_map.size() * 4, cudaMemcpyHostToDevice);
      cudaMemcpy(win, d->grid_windows.data(), d->grid_windows.size() * 4, cudaMemcpyHostToDevice);
      cudaMemset(m, 0xA5, words * 8 + 8);
      ASSERT_EQ(spattn::cuda::fused::launch_grid_strip_masks(d->q_tiles, d->nentries(), ro, en, qm, win, d->q_tiling.dims.data(), d->strip_sx,
                                                             d->strip_sy, m, nullptr),
                0);
      std::vector<unsigned long long> got(words + 1);
      ASSERT_EQ(cudaMemcpy(got.data(), m, (words + 1) * 8, cudaMemcpyDeviceToHost), cudaSuccess);
      for (void* p : {static_cast<void*>(ro), static_cast<void*>(en), static_cast<void*>(qm), static_cast<void*>(win), static_cast<void*>(m)})
        cudaFree(p);
      ASSERT_EQ(h->masks.size(), words);
      int64_t bad = 0;
      for (size_t i = 0; i < words; ++i) bad += got[i] != h->masks[i];
      EXPECT_EQ(bad, 0) << box.str(3) << ": device words that differ from the host's, of " << words;
      EXPECT_EQ(got[words], 0xA5A5A5A5A5A5A5A5ull) << "a word past the masks written";
      ++checked;
    }
    EXPECT_GT(checked, 0);
  }
}

// A forced TMA or band kernel plans without a tile map (those kernels load affine rows) and still computes the
// pattern; tile_map 1 with a pattern that has no grid is refused with the reason.
TEST(NeighborhoodGpuSmall, ForcedAffineKernelsAndRefusals) {
  REQUIRE_GPU();
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  const std::vector<spattn::Pattern> pats{spattn::parse("neighborhood(dims=(32, 32), kernel=9)")};
  if (major == 9) {
    spattn::PlanOptions o;
    o.kernel = "sm90_tma";
    const spattn::Plan plan = spattn::make_plan(pats, problem(1, 2, 2, 1024, 64, bf), spattn::Device::cuda(0), o);
    EXPECT_EQ(plan.explain().find("tile map"), std::string::npos) << plan.explain();
    EXPECT_LE(run_vs_reference(plan, pats, bf, 3), 1e-2);
    EXPECT_EQ(plan.last_kernel().rfind("sm90_tma_", 0), 0u) << plan.last_kernel();
  }
  spattn::PlanOptions o;
  o.tile_map = 1;
  try {
    spattn::make_plan(spattn::parse("local(20)"), problem(1, 2, 2, 512, 64, bf), spattn::Device::cuda(0), o);
    ADD_FAILURE() << "tile_map 1 without a neighborhood grid must be refused";
  } catch (const spattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no neighborhood grid"), std::string::npos) << e.what();
  }
}

}  // namespace
