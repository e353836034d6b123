// spattn::Plan on a CUDA device: every engine against the reference engine (fresh random inputs), per-head
// patterns, a forced kernel that ran, a refused kernel, a tensor that does not match the plan's problem.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
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
  int dev = 0, major = 0, minor = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  int ran = 0;
  for (const auto& row : spattn::plan::kKernels) {
    if (!spattn::plan::is_gpu_fused(row.kind)) continue;
    SCOPED_TRACE(row.name);
    if (spattn::plan::is_sm90(row.kind) && !(major == 9 && minor == 0)) continue;
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

}  // namespace
