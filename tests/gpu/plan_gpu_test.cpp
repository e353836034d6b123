// spattn::Plan on a CUDA device: every engine against the reference engine (fresh random inputs), per-head
// patterns, a forced kernel that ran, a refused kernel, a tensor that does not match the plan's problem.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu/plan_run.hpp"
#include "gpu/require_gpu.hpp"
#include "plan/kernels.hpp"
#include "spattn/device.hpp"
#include "spattn/plan.hpp"
#include "spattn/reference.hpp"

namespace {

using spattn::DType;
using spattn::TensorView;
using spattn::test::Buf;
using spattn::test::for_each_index;
using spattn::test::problem;
using spattn::test::run_vs_reference;

TEST(PlanGpu, EnginesMatchReference) {
  REQUIRE_GPU();
  struct C {
    const char* spec;
    DType dt;
    int64_t D;
    spattn::Engine engine;
    spattn::Engine want;
  } const cases[] = {
      {"local(100) | global(0:8)", DType::bf16, 64, spattn::Engine::automatic, spattn::Engine::cuda_fused},
      {"causal", DType::f16, 128, spattn::Engine::automatic, spattn::Engine::cuda_fused},
      {"bigbird(32, 1, 1, 2, seed=3)", DType::bf16, 64, spattn::Engine::cuda_unfused, spattn::Engine::cuda_unfused},
      {"dilated(40, 3)", DType::f32, 32, spattn::Engine::automatic, spattn::Engine::cuda_unfused},
  };
  for (const C& c : cases) {
    SCOPED_TRACE(c.spec);
    spattn::PlanOptions o;
    o.engine = c.engine;
    const std::vector<spattn::Pattern> pats{spattn::parse(c.spec)};
    const spattn::Plan plan = spattn::make_plan(pats, problem(2, 4, 2, 777, c.D, c.dt), spattn::Device::cuda(0), o);
    EXPECT_EQ(plan.engine(), c.want) << plan.explain();
    EXPECT_EQ(plan.last_kernel(), "");
    const double rel = run_vs_reference(plan, pats, c.dt, 7);
    EXPECT_LE(rel, c.dt == DType::f32 ? 1e-4 : 1e-2) << plan.explain();
    EXPECT_EQ(plan.last_kernel(), plan.kernel()) << "contiguous tensors run the chosen kernel";
  }
}

// Compound plans: every part kind (tiles, columns over gathered keys, scattered rows, owned dense rows), merged
// through the LSE, against the reference; GQA, D 64 and 128, bf16 and fp16, lengths off the tile sizes.
TEST(PlanGpu, CompoundMatchesReference) {
  REQUIRE_GPU();
  struct C {
    const char* spec;
    int64_t D;
    DType dt;
    int compound;
    const char* parts;  // the kinds explain must list, in order
  } const cases[] = {
      {"longformer(64, 8)", 64, DType::bf16, 1, "tiles columns rows"},
      {"sparse_fixed(64)", 64, DType::bf16, -1, "tiles columns"},
      {"sparse_fixed(50, 3)", 128, DType::f16, -1, "tiles columns"},
      {"local(64) | random(4, seed=3)", 64, DType::bf16, -1, "tiles scattered"},
      {"local(left=90, right=0) | random(3) & causal", 128, DType::bf16, -1, "tiles scattered"},
      {"random(9, seed=2)", 64, DType::f16, -1, "scattered"},
      {"random(5) | summary(128) | global_rows(3:9)", 64, DType::bf16, 1, "columns scattered rows"},
      {"global_cols(0:4) | random(3)", 128, DType::bf16, 1, "columns scattered"},
      {"dilated(20, 3) | global(0:5) | random(2)", 64, DType::bf16, 1, "tiles columns scattered rows"},
  };
  for (const C& c : cases) {
    SCOPED_TRACE(c.spec);
    spattn::PlanOptions o;
    o.compound = c.compound;
    const std::vector<spattn::Pattern> pats{spattn::parse(c.spec)};
    const spattn::Plan plan = spattn::make_plan(pats, problem(2, 4, 2, 777, c.D, c.dt), spattn::Device::cuda(0), o);
    const std::string ex = plan.explain();
    ASSERT_NE(ex.find("compound plan"), std::string::npos) << ex;
    size_t at = 0;
    for (std::string kind : {"tiles", "columns", "scattered", "rows"}) {
      if (std::string(" ") .append(c.parts).append(" ").find(" " + kind + " ") == std::string::npos) continue;
      const size_t f = ex.find("\n  " + kind + " [", at);
      ASSERT_NE(f, std::string::npos) << kind << " part missing or out of order:\n" << ex;
      at = f;
    }
    double lse_err = 0;
    const double rel = run_vs_reference(plan, pats, c.dt, 11, &lse_err);
    EXPECT_LE(rel, 1e-2) << ex;
    EXPECT_LE(lse_err, 2e-2) << ex;
  }
}

// Band rows with a key prefix (Analysis::sinks: local | global_cols(0:G), attention sinks) on the band kernel,
// which runs the prefix's chunks first in every slab; and longformer-like specs split into that tiles part and a
// rows part of dense rows on the band kernel's split over keys, written over the tiles part's rows. Awkward
// lengths, G off the chunk size, the band overlapping the prefix, Lq != Lk, GQA, fp16, a split over keys and
// slab splits of the prefix plans, and head dim 128 (the band kernel's 128-row items). Such rows are never empty
// (every row keeps the prefix).
TEST(PlanGpu, BandRowsWithKeyPrefix) {
  REQUIRE_GPU();
  const bool sm90a = on_sm90a();
  struct C {
    const char* spec;
    int64_t B, H, HK, Lq, Lk, D;
    DType dt;
    int split;            // PlanOptions::split
    const char* kernel;   // Plan::last_kernel on sm_90a (the first part's)
    const char* parts;    // "" one tile list; else the part kinds explain lists, in order
    const char* rows_kernel;  // the rows part's kernel (explain), where there is one
  } const cases[] = {
      {"local(100) | global_cols(0:32)", 2, 4, 2, 777, 777, 64, DType::bf16, -1, "sm90_band_d64", "", ""},
      {"local(50) | global_cols(0:70)", 1, 4, 4, 1000, 1000, 64, DType::f16, -1, "sm90_band_d64", "", ""},
      {"local(left=200, right=0) | global_cols(0:4)", 2, 4, 1, 913, 913, 64, DType::bf16, -1, "sm90_band_d64", "", ""},
      {"local(left=3000, right=0) | global_cols(0:4)", 1, 2, 2, 4099, 4099, 64, DType::bf16, -1, "sm90_band_d64", "", ""},
      {"local(40) | global_cols(0:100)", 2, 2, 2, 333, 200, 64, DType::bf16, -1, "sm90_band_d64", "", ""},
      {"local(30) | global_cols(0:9)", 1, 1, 1, 250, 700, 64, DType::bf16, -1, "sm90_band_d64", "", ""},
      {"local(100) | global_cols(0:32)", 1, 2, 2, 1100, 1100, 64, DType::bf16, 1, "sm90_band_d64", "", ""},
      {"local(100) | global_cols(0:32)", 1, 2, 2, 1100, 1100, 64, DType::bf16, 3, "sm90_band_d64", "", ""},
      {"longformer(100, 20)", 2, 4, 2, 1000, 1000, 64, DType::bf16, -1, "sm90_band_d64", "tiles rows", "sm90_band_d64"},
      {"longformer(256, 32)", 1, 4, 4, 4100, 4100, 64, DType::f16, -1, "sm90_band_d64", "tiles rows", "sm90_band_rmax_d64"},
      {"local(left=64, right=0) | global(0:4)", 2, 4, 2, 900, 900, 64, DType::bf16, -1, "sm90_band_d64", "tiles rows", "sm90_band_d64"},
      {"local(64) | global_rows(0:8)", 1, 3, 1, 1000, 1000, 64, DType::bf16, -1, "sm90_band_d64", "tiles rows", "sm90_band_d64"},
      {"local(70) | global_cols(0:20) | global_rows(0:13)", 1, 2, 2, 600, 900, 64, DType::bf16, -1, "sm90_band_d64", "tiles rows", "sm90_band_d64"},
      {"longformer(100, 20)", 2, 4, 2, 1000, 1000, 128, DType::bf16, -1, "sm90_band_d128", "tiles rows", "sm90_band_d128"},
      {"local(50) | global_cols(0:70)", 1, 4, 4, 1000, 1000, 128, DType::f16, -1, "sm90_band_d128", "", ""},
      {"local(left=3000, right=0) | global_cols(0:4)", 1, 2, 2, 4099, 4099, 128, DType::bf16, -1, "sm90_band_d128", "", ""},
      {"local(100) | global_cols(0:32)", 1, 2, 2, 1100, 1100, 128, DType::bf16, 3, "sm90_band_d128", "", ""},
      {"longformer(256, 32)", 1, 4, 4, 4100, 4100, 128, DType::f16, -1, "sm90_band_d128", "tiles rows", "sm90_band_d128"},
  };
  for (const C& c : cases) {
    SCOPED_TRACE(std::string(c.spec) + " " + std::to_string(c.Lq) + "x" + std::to_string(c.Lk) + " D=" +
                 std::to_string(c.D) + " split " + std::to_string(c.split));
    spattn::PlanOptions o;
    o.split = c.split;
    const std::vector<spattn::Pattern> pats{spattn::parse(c.spec)};
    spattn::Problem pr = problem(c.B, c.H, c.HK, c.Lq, c.D, c.dt);
    pr.kv_len = c.Lk;
    const spattn::Plan plan = spattn::make_plan(pats, pr, spattn::Device::cuda(0), o);
    const std::string ex = plan.explain();
    double lse_err = 0;
    const double rel = run_vs_reference(plan, pats, c.dt, 17, &lse_err);
    EXPECT_LE(rel, 1e-2) << ex;
    EXPECT_LE(lse_err, 2e-2) << ex;
    if (!sm90a) continue;
    if (*c.kernel) EXPECT_EQ(plan.last_kernel(), c.kernel) << ex;
    if (!*c.parts) {
      EXPECT_EQ(ex.find("compound plan"), std::string::npos) << ex;
      EXPECT_NE(ex.find("key prefix"), std::string::npos) << ex;
      continue;
    }
    ASSERT_NE(ex.find("compound plan"), std::string::npos) << ex;
    const size_t t = ex.find("\n  tiles ["), r = ex.find("\n  rows [");
    ASSERT_NE(t, std::string::npos) << ex;
    ASSERT_NE(r, std::string::npos) << ex;
    EXPECT_LT(t, r) << "the rows part runs after the tiles part (it replaces their rows)";
    EXPECT_NE(ex.find(std::string("kernel ") + c.rows_kernel, r), std::string::npos) << ex;
  }
  if (!sm90a) return;
  // The running-max band kernel has no key-prefix instantiation: forced, make_plan refuses it.
  spattn::PlanOptions o;
  o.kernel = "sm90_band_rmax";
  EXPECT_THROW(spattn::make_plan({spattn::parse("local(100) | global_cols(0:32)")}, problem(1, 2, 2, 1000, 64, DType::bf16),
                                 spattn::Device::cuda(0), o),
               spattn::Error);
  // compound = 0: longformer as one tile list (the route before the split), still correct.
  o = {};
  o.compound = 0;
  const std::vector<spattn::Pattern> lf{spattn::parse("longformer(100, 20)")};
  const spattn::Plan whole = spattn::make_plan(lf, problem(2, 4, 2, 1000, 64, DType::bf16), spattn::Device::cuda(0), o);
  EXPECT_EQ(whole.explain().find("compound plan"), std::string::npos) << whole.explain();
  EXPECT_LE(run_vs_reference(whole, lf, DType::bf16, 5), 1e-2) << whole.explain();
}

// Small prefix-band and longformer-split plans for compute-sanitizer (scripts/gpu_check.d/longformer.sh): the band
// kernel with a prefix of two chunks, whole and split over keys, and the tiles + rows split.
TEST(PlanGpu, BandRowsWithKeyPrefixSmall) {
  REQUIRE_GPU();
  struct C {
    const char* spec;
    int64_t L;
    int split;
  } const cases[] = {{"local(40) | global_cols(0:70)", 300, -1}, {"local(40) | global_cols(0:70)", 300, 3},
                     {"longformer(40, 8)", 400, -1}};
  for (const C& c : cases) {
    SCOPED_TRACE(c.spec);
    spattn::PlanOptions o;
    o.split = c.split;
    const std::vector<spattn::Pattern> pats{spattn::parse(c.spec)};
    const spattn::Plan plan = spattn::make_plan(pats, problem(1, 2, 1, c.L, 64, DType::bf16), spattn::Device::cuda(0), o);
    double lse_err = 0;
    EXPECT_LE(run_vs_reference(plan, pats, DType::bf16, 3, &lse_err), 1e-2) << plan.explain();
    EXPECT_LE(lse_err, 2e-2) << plan.explain();
  }
}

// The device pool (cuda/common/pool.hpp): a plan built again after the first is destroyed takes its blocks from the
// cache (no cudaMalloc, explain says so) and, on the stale memory, still matches the reference (counters zeroed by
// the upload); release_cached_device_memory() gives the cache back.
TEST(PlanGpu, DevicePoolReusesBlocks) {
  REQUIRE_GPU();
  const std::vector<spattn::Pattern> pats{spattn::parse("local(100) | global_cols(0:4)")};
  const auto pr = problem(2, 4, 2, 777, 64, DType::bf16);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round);
    const spattn::Plan plan = spattn::make_plan(pats, pr, spattn::Device::cuda(0));
    if (round == 1) EXPECT_NE(plan.explain().find(" 0 cudaMalloc"), std::string::npos) << plan.explain();
    EXPECT_LE(run_vs_reference(plan, pats, DType::bf16, 11 + round), 1e-2) << plan.explain();
  }
  EXPECT_GT(spattn::release_cached_device_memory(), 0u);
  EXPECT_EQ(spattn::release_cached_device_memory(), 0u);
}

TEST(PlanGpu, PerHeadPatterns) {
  REQUIRE_GPU();
  const std::vector<spattn::Pattern> pats{spattn::parse("local(30)"), spattn::parse("causal"), spattn::parse("local(30)"),
                                          spattn::parse("global(0:4) | local(5)")};
  const spattn::Plan plan = spattn::make_plan(pats, problem(2, 4, 2, 500, 64, DType::bf16), spattn::Device::cuda(0));
  EXPECT_EQ(plan.engine(), spattn::Engine::cuda_fused);
  EXPECT_LE(run_vs_reference(plan, pats, DType::bf16, 11), 1e-2) << plan.explain();
}

TEST(PlanGpu, ForcedKernelRunsOrIsRefused) {
  REQUIRE_GPU();
  const std::vector<spattn::Pattern> pats{spattn::parse("local(64)")};
  const auto pr = problem(1, 2, 2, 1000, 64, DType::bf16);
  spattn::PlanOptions o;
  o.kernel = "sm80";
  const spattn::Plan p80 = spattn::make_plan(pats, pr, spattn::Device::cuda(0), o);
  EXPECT_LE(run_vs_reference(p80, pats, DType::bf16, 3), 1e-2);
  EXPECT_EQ(p80.last_kernel().rfind("sm80_", 0), 0u) << p80.last_kernel();
  o.kernel = "sm90_band";
  try {
    spattn::make_plan({spattn::parse("longformer(64, 4)")}, pr, spattn::Device::cuda(0), o);
    ADD_FAILURE() << "the band kernel cannot run longformer; make_plan must refuse it";
  } catch (const spattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("sm90_band"), std::string::npos) << e.what();
  }
  o.kernel = "no_such_kernel";
  EXPECT_THROW(spattn::make_plan(pats, pr, spattn::Device::cuda(0), o), spattn::Error);
}

// The test sweep follows the kernel table: every fused GPU row this device runs, forced by name through
// PlanOptions::kernel, matches the reference and is the row that ran.
TEST(PlanGpu, EveryKernelTableRow) {
  REQUIRE_GPU();
  const bool sm90a = on_sm90a();
  int ran = 0;
  for (const auto& row : spattn::plan::kKernels) {
    if (!spattn::plan::is_gpu_fused(row.kind)) continue;
    SCOPED_TRACE(row.name);
    if (spattn::plan::is_sm90(row.kind) && !sm90a) continue;
    // Band rows need band-row patterns; the others a mix of full, band and bitmask tiles.
    const std::vector<spattn::Pattern> pats{
        spattn::parse(spattn::plan::is_band(row.kind) ? "local(150)" : "local(150) | global(0:9) | random(3, seed=1)")};
    spattn::PlanOptions o;
    o.kernel = row.name;
    for (DType dt : {DType::bf16, DType::f16}) {
      const spattn::Plan plan = spattn::make_plan(pats, problem(1, 2, 1, 700, row.head_dim, dt), spattn::Device::cuda(0), o);
      EXPECT_LE(run_vs_reference(plan, pats, dt, 5), 1e-2) << plan.explain();
      EXPECT_EQ(plan.last_kernel(), row.name);
    }
    ++ran;
  }
  EXPECT_GE(ran, 5);
}

// Plan::backward: tests/gpu/backward_gpu_test.cpp.

TEST(PlanGpu, RefusesTensorsOfAnotherProblem) {
  REQUIRE_GPU();
  const spattn::Plan plan =
      spattn::make_plan(spattn::parse("local(8)"), problem(1, 2, 2, 256, 64, DType::bf16), spattn::Device::cuda(0));
  Buf b(size_t(2) * 512 * 2 * 64 * 2);
  const TensorView good = TensorView::contiguous(b.p, DType::bf16, {1, 256, 2, 64});
  const TensorView longer = TensorView::contiguous(b.p, DType::bf16, {1, 512, 2, 64});
  try {
    plan.forward(longer, good, good, good, TensorView{});
    ADD_FAILURE() << "a q of 512 tokens for a plan of 256 must be refused";
  } catch (const spattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("q: dimension 1 is 512, expected 256"), std::string::npos) << e.what();
  }
  EXPECT_THROW(spattn::make_plan(spattn::parse("local(8)"), problem(1, 2, 2, 256, 64, DType::bf16),
                                 spattn::Device::cuda(99)),
               spattn::Error);
}

// Issue 42: affine terms at any stride. The strided term of sparse_strided(s) split from its band (the affine part,
// grouped by residue: explain names the part and its kernel's residue permutation) and merged through the LSE; stride
// and dilated terms alone grouped past stride 16. Lengths that leave residue groups unequal, D 64 and 128, bf16 and
// fp16, chosen and forced (compound 1) splits. The planner's choices here are checked on the CPU too
// (LaunchDecision.AffinePartsAtAnyStride): groups of about 16 tokens or more, where the cost model groups by residue.
TEST(PlanGpu, AffinePartsAtAnyStrideMatchReference) {
  REQUIRE_GPU();
  struct C {
    const char* spec;
    int64_t L, D;
    DType dt;
    int compound;
    bool affine;  // an affine part; else one tile list
    int perm;     // the residue permutation explain must name (the affine part's, or the one list's)
  } const cases[] = {
      // Groups of 32 tokens or fewer grouped coarser (issue 42: two or four residues a group, bitmask tiles; the
      // permutation named is that of the coarser groups).
      {"sparse_strided(256)", 4099, 64, DType::bf16, -1, true, 128},   // groups of 16 and 17 tokens, paired
      {"sparse_strided(128)", 3001, 128, DType::f16, 1, true, 64},
      {"sparse_strided(512)", 9001, 64, DType::bf16, 1, true, 256},    // groups of 17 and 18, paired
      {"local(left=300, right=0) | (stride(256) & causal)", 4099, 128, DType::bf16, 1, true, 128},
      {"stride(64) & causal", 5000, 128, DType::bf16, -1, false, 64},
      {"dilated(64, 32)", 4097, 64, DType::bf16, -1, false, 32},
      {"dilated(9, 100) & causal", 3333, 64, DType::f16, -1, false, 100},
  };
  for (const C& c : cases) {
    SCOPED_TRACE(std::string(c.spec) + " at " + std::to_string(c.L) + ", D " + std::to_string(c.D));
    spattn::PlanOptions o;
    o.compound = c.compound;
    const std::vector<spattn::Pattern> pats{spattn::parse(c.spec)};
    const spattn::Plan plan = spattn::make_plan(pats, problem(1, 4, 2, c.L, c.D, c.dt), spattn::Device::cuda(0), o);
    const std::string ex = plan.explain();
    EXPECT_EQ(ex.find("\n  affine [") != std::string::npos, c.affine) << ex;
    if (on_sm90a())  // the sm_90a rows' reasons (elsewhere the mma.sync rows, which gather the same way)
      EXPECT_NE(ex.find("residue permutation " + std::to_string(c.perm) + " "), std::string::npos) << ex;
    double lse_err = 0;
    EXPECT_LE(run_vs_reference(plan, pats, c.dt, 13, &lse_err), 1e-2) << ex;
    EXPECT_LE(lse_err, 2e-2) << ex;
    // In head sections (read at each launch; residue-grouped plans run in sections at the suite's lengths,
    // plan::list_shape): one section a kv group here, every item once (outputs poisoned first).
    ::setenv("SPATTN_HEAD_SECTION", "1", 1);
    EXPECT_LE(run_vs_reference(plan, pats, c.dt, 14), 1e-2) << ex << " (in head sections)";
    ::unsetenv("SPATTN_HEAD_SECTION");
  }
}

// Issue 42's forward: plans grouped by residue on the 64x64 cp.async row at D = 64 run four CTAs an SM
// (cuda/fused/fused_fwd.cuh, Traits::kGathered: a launch failure there shows here) and a compound plan's affine part
// merges into the band part's O and LSE in its epilogue (FusedParams::merge_out; on the 64-row and the two-warpgroup
// 128x128 kernels), against the reference (outputs poisoned with NaN first: a row the merge leaves unwritten fails).
// Residue groups unequal.
TEST(PlanGpu, StridedPlansMatchReference) {
  REQUIRE_GPU();
  struct C {
    const char* spec;
    int64_t L, D;
    DType dt;
  } const cases[] = {
      {"sparse_strided(256)", 4099, 64, DType::bf16},   // the affine part on 64x64 perm_d 128, merged
      {"dilated(64, 32)", 6001, 64, DType::f16},        // one list, 64x64 perm_d 32
      {"stride(64) & causal", 5001, 64, DType::bf16},   // 64x64 perm_d 64
      {"sparse_strided(128)", 3001, 128, DType::bf16},  // the affine part on 64x64 perm_d 128 (D = 128), merged
      {"sparse_strided(128)", 10001, 128, DType::f16},  // on 128x128 perm_d 128, merged by two warpgroups
      {"stride(64) & causal", 5000, 128, DType::f16},
  };
  for (const C& c : cases) {
    SCOPED_TRACE(std::string(c.spec) + " at " + std::to_string(c.L) + ", D " + std::to_string(c.D));
    const std::vector<spattn::Pattern> pats{spattn::parse(c.spec)};
    const spattn::Plan plan = spattn::make_plan(pats, problem(1, 4, 2, c.L, c.D, c.dt), spattn::Device::cuda(0));
    if (on_sm90a())
      EXPECT_NE(plan.explain().find(c.D == 64 ? "sm90_cp_64x64_d64" : "sm90_cp_"), std::string::npos) << plan.explain();
    double lse_err = 0;
    EXPECT_LE(run_vs_reference(plan, pats, c.dt, 17, &lse_err), 1e-2) << plan.explain();
    EXPECT_LE(lse_err, 2e-2) << plan.explain();
  }
}

// The affine part's epilogue merge (FusedParams::merge_out) on what the square, contiguous cases above leave out: Lq
// above Lk (sparse_strided(256)'s band keeps no key of rows past Lk + 255, the affine part's rows there merge into
// empty rows: lse -inf), Lq below Lk, [B, H, L, D] views, GQA, batch 2, an LSE whose head stride is padded past Lq
// (the padding, poisoned, must stay as it was: a write past a head's Lq rows lands there), per-head patterns (each
// head's compound plan on views of one head, the LSE a narrowed view), against the reference.
TEST(PlanGpu, StridedMergeOnViewsAndUnequalLengths) {
  REQUIRE_GPU();
  struct C {
    std::vector<const char*> specs;
    int64_t B, H, HK, Lq, Lk, D;
    DType dt;
    bool bhld;    // q, k, v, o as [B, H, L, D] memory viewed as [B, L, H, D]
    int64_t pad;  // LSE rows a head past Lq
  } const cases[] = {
      {{"sparse_strided(256)"}, 1, 4, 2, 4099, 3001, 64, DType::bf16, true, 5},
      {{"sparse_strided(128)"}, 2, 2, 1, 2000, 5000, 64, DType::f16, false, 3},
      {{"sparse_strided(128)"}, 1, 2, 2, 3001, 3001, 128, DType::bf16, true, 0},
      {{"sparse_strided(256)", "sparse_strided(512)"}, 2, 2, 2, 9001, 9001, 64, DType::bf16, false, 7},
  };
  for (const C& c : cases) {
    SCOPED_TRACE(std::string(c.specs[0]) + (c.specs.size() > 1 ? " (per head)" : "") + " at " + std::to_string(c.Lq) +
                 "x" + std::to_string(c.Lk) + ", D " + std::to_string(c.D));
    std::vector<spattn::Pattern> pats;
    for (const char* s : c.specs) pats.push_back(spattn::parse(s));
    spattn::Problem pr;
    pr.batch = c.B, pr.q_heads = c.H, pr.kv_heads = c.HK, pr.q_len = c.Lq, pr.kv_len = c.Lk, pr.head_dim = c.D;
    pr.dtype = c.dt;
    const spattn::Plan plan = spattn::make_plan(pats, pr, spattn::Device::cuda(0));
    const std::string ex = plan.explain();
    EXPECT_NE(ex.find("affine ["), std::string::npos) << ex;
    const int es = spattn::dtype_size(c.dt);
    const std::array<int64_t, 4> sq{c.B, c.Lq, c.H, c.D}, sk{c.B, c.Lk, c.HK, c.D};
    auto dev_view = [&](void* p, std::array<int64_t, 4> s) {
      if (!c.bhld) return TensorView::contiguous(p, c.dt, s);
      return TensorView{p, c.dt, {s[0], s[1], s[2], s[3]}, {s[1] * s[2] * s[3], s[3], s[1] * s[3], 1}};
    };
    std::mt19937 rng(23);
    std::normal_distribution<float> nd(0.f, 1.f);
    auto fill = [&](std::vector<uint8_t>& h, std::array<int64_t, 4> s) {
      h.resize(size_t(s[0] * s[1] * s[2] * s[3]) * es);
      const TensorView t = TensorView::contiguous(h.data(), c.dt, s);
      for_each_index(s, [&](int64_t a, int64_t b, int64_t x, int64_t d) { t.store(a, b, x, d, nd(rng)); });
      return t;
    };
    std::vector<uint8_t> hq, hk, hv;
    const TensorView tq = fill(hq, sq), tk = fill(hk, sk), tv = fill(hv, sk);
    Buf q(hq.size()), k(hk.size()), v(hv.size()), o(hq.size());
    auto upload = [&](const TensorView& host, const Buf& b, std::array<int64_t, 4> s) {
      const TensorView d = dev_view(b.p, s);
      std::vector<uint8_t> tmp(size_t(s[0] * s[1] * s[2] * s[3]) * es);
      const TensorView t{tmp.data(), c.dt, d.shape, d.stride};
      for_each_index(s, [&](int64_t a, int64_t l, int64_t x, int64_t e) { t.store(a, l, x, e, host.load(a, l, x, e)); });
      EXPECT_EQ(cudaMemcpy(b.p, tmp.data(), tmp.size(), cudaMemcpyHostToDevice), cudaSuccess);
    };
    upload(tq, q, sq), upload(tk, k, sk), upload(tv, v, sk);
    const int64_t ls = c.Lq + c.pad;  // the LSE's head stride
    const size_t nl = size_t(c.B * c.H * ls);
    Buf lse(nl * 4);
    const TensorView tl{lse.p, DType::f32, {c.B, c.H, c.Lq, 1}, {c.H * ls, ls, 1, 1}};
    std::vector<double> ro(size_t(c.B * c.Lq * c.H * c.D)), rl(size_t(c.B * c.H * c.Lq));
    spattn::PlanOptions ref;
    ref.engine = spattn::Engine::reference;
    spattn::make_plan(pats, pr, spattn::Device::cpu(), ref)
        .forward(tq, tk, tv, TensorView::contiguous(ro.data(), DType::f64, sq),
                 TensorView::contiguous(rl.data(), DType::f64, {c.B, c.H, c.Lq, 1}));
    // explain says what runs: the merge, and on sm_90a the 64x64 D = 64 affine part's four CTAs an SM.
    EXPECT_NE(ex.find("merged into the rows before it in its kernel's epilogue"), std::string::npos) << ex;
    if (on_sm90a() && c.D == 64) EXPECT_NE(ex.find("four CTAs an SM"), std::string::npos) << ex;
    EXPECT_EQ(cudaMemset(o.p, 0xFF, hq.size()), cudaSuccess);  // NaN poison: an unwritten row fails
    EXPECT_EQ(cudaMemset(lse.p, 0xFF, nl * 4), cudaSuccess);
    plan.forward(dev_view(q.p, sq), dev_view(k.p, sk), dev_view(v.p, sk), dev_view(o.p, sq), tl);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint8_t> ho(hq.size());
    std::vector<uint32_t> hl(nl);
    EXPECT_EQ(cudaMemcpy(ho.data(), o.p, ho.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(hl.data(), lse.p, nl * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    const TensorView got = dev_view(ho.data(), sq);
    double num = 0, den = 0, lse_err = 0;
    int64_t pad_written = 0;
    size_t i = 0;
    for_each_index(sq, [&](int64_t a, int64_t l, int64_t x, int64_t d) {
      const double e = got.load(a, l, x, d) - ro[i++];
      num += e * e, den += ro[i - 1] * ro[i - 1];
    });
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.H; ++h)
        for (int64_t r = 0; r < ls; ++r) {
          const uint32_t bits = hl[size_t((b * c.H + h) * ls + r)];
          if (r >= c.Lq) {
            pad_written += bits != 0xFFFFFFFFu;
            continue;
          }
          float g;
          std::memcpy(&g, &bits, 4);
          const double want = rl[size_t((b * c.H + h) * c.Lq + r)];
          lse_err = std::max(lse_err, std::isinf(want) ? (double(g) == want ? 0.0 : INFINITY)
                                      : std::isnan(g)  ? INFINITY
                                                       : std::fabs(g - want));
        }
    EXPECT_LE(std::isfinite(num) ? std::sqrt(num / std::max(den, 1e-30)) : INFINITY, 1e-2) << ex;
    EXPECT_LE(lse_err, 2e-2) << ex;
    EXPECT_EQ(pad_written, 0) << "LSE padding past Lq written";
  }
}

}  // namespace

// Zero lengths on every GPU engine (make_plan failed with "block plan: empty lengths"): no kernel of the engine runs;
// rows without keys give O = 0 and LSE = -inf, the backward zero gradients (outputs poisoned with NaN first, so an
// unwritten one fails); per-head patterns and a strided O too; a misspelt kernel is still refused.
TEST(PlanGpu, EmptyLengths) {
  REQUIRE_GPU();
  struct C {
    spattn::Engine engine;
    DType dt;
    int64_t D;
  } const cases[] = {{spattn::Engine::cuda_fused, DType::bf16, 64}, {spattn::Engine::cuda_fused, DType::f16, 128},
                     {spattn::Engine::cuda_unfused, DType::f32, 32}, {spattn::Engine::cuda_unfused, DType::bf16, 64}};
  for (const C& c : cases)
    for (auto [lq, lk] : {std::pair<int64_t, int64_t>{0, 0}, {0, 5}, {7, 0}, {300, 0}})
      for (int npat : {1, 3}) {
        if (npat > 1 && c.engine == spattn::Engine::cuda_unfused) continue;  // one pattern for all heads there
        SCOPED_TRACE(std::string(spattn::engine_name(c.engine)) + " " + std::string(spattn::dtype_name(c.dt)) + " " +
                     std::to_string(lq) + " x " + std::to_string(lk) + ", patterns " + std::to_string(npat));
        spattn::Problem pr = problem(2, 3, 3, 0, c.D, c.dt);
        pr.q_len = lq, pr.kv_len = lk;
        std::vector<spattn::Pattern> pats{spattn::parse("local(3)")};
        if (npat > 1) pats = {spattn::parse("local(3)"), spattn::parse("causal"), spattn::parse("random(2, seed=1)")};
        spattn::PlanOptions o;
        o.engine = c.engine;
        const spattn::Plan plan = spattn::make_plan(pats, pr, spattn::Device::cuda(0), o);
        EXPECT_NE(plan.explain().find("nothing to compute"), std::string::npos) << plan.explain();
        const int es = spattn::dtype_size(c.dt);
        const std::array<int64_t, 4> qs{2, lq, 3, c.D}, ks{2, lk, 3, c.D};
        const size_t nq = size_t(2 * lq * 3 * c.D), nk = size_t(2 * lk * 3 * c.D), nl = size_t(2 * 3 * lq);
        // O strided: [B, Lq, H, D] inside a buffer of twice the head dim.
        Buf q(nq * es + 1), k(nk * es + 1), v(nk * es + 1), out(2 * nq * es + 1), lse(nl * 4 + 1);
        Buf dq(nq * es + 1), dk(nk * es + 1), dv(nk * es + 1);
        ASSERT_EQ(cudaMemset(out.p, 0xFF, 2 * nq * es), cudaSuccess);
        ASSERT_EQ(cudaMemset(lse.p, 0xFF, nl * 4), cudaSuccess);
        ASSERT_EQ(cudaMemset(dq.p, 0xFF, nq * es), cudaSuccess);
        ASSERT_EQ(cudaMemset(dk.p, 0xFF, nk * es), cudaSuccess);
        ASSERT_EQ(cudaMemset(dv.p, 0xFF, nk * es), cudaSuccess);
        const TensorView tq = TensorView::contiguous(q.p, c.dt, qs), tk = TensorView::contiguous(k.p, c.dt, ks),
                         tv = TensorView::contiguous(v.p, c.dt, ks);
        TensorView to{out.p, c.dt, qs, {lq * 3 * 2 * c.D, 3 * 2 * c.D, 2 * c.D, 1}};
        const TensorView tl = TensorView::contiguous(lse.p, DType::f32, {2, 3, lq, 1});
        plan.forward(tq, tk, tv, to, tl);
        EXPECT_EQ(plan.last_kernel(), "none");
        plan.backward(tq, tk, tv, to, tl, to, TensorView::contiguous(dq.p, c.dt, qs), TensorView::contiguous(dk.p, c.dt, ks),
                      TensorView::contiguous(dv.p, c.dt, ks));
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<uint8_t> ho(2 * nq * es), hdq(nq * es), hdk(nk * es), hdv(nk * es);
        std::vector<float> hl(nl);
        ASSERT_EQ(cudaMemcpy(ho.data(), out.p, ho.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(hl.data(), lse.p, nl * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(hdq.data(), dq.p, hdq.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(hdk.data(), dk.p, hdk.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(hdv.data(), dv.p, hdv.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        to.data = ho.data();
        for (int64_t b = 0; b < 2; ++b)
          for (int64_t i = 0; i < lq; ++i)
            for (int64_t h = 0; h < 3; ++h)
              for (int64_t d = 0; d < c.D; ++d) ASSERT_EQ(to.load(b, i, h, d), 0.0) << b << " " << i << " " << h << " " << d;
        if (lq > 0) {  // the other half of each row of the buffer is not O's: left as it was
          const TensorView gap{ho.data() + c.D * es, c.dt, qs, to.stride};
          EXPECT_TRUE(std::isnan(gap.load(0, 0, 0, 0)) && std::isnan(gap.load(1, lq - 1, 2, c.D - 1)));
        }
        for (float x : hl) ASSERT_EQ(x, -INFINITY);
        for (auto* g : {&hdq, &hdk, &hdv}) {
          const TensorView t = TensorView::contiguous(g->data(), c.dt, {1, int64_t(g->size()) / es, 1, 1});
          for (int64_t i = 0; i < t.shape[1]; ++i) ASSERT_EQ(t.load(0, i, 0, 0), 0.0) << i;
        }
        EXPECT_EQ(plan.last_backward_kernel(), "none");
        o.kernel = "no_such_kernel";
        EXPECT_THROW(spattn::make_plan(pats, pr, spattn::Device::cuda(0), o), spattn::Error);
      }
}
