// `spattn bench --plan-time`: the host side of make_plan for the fused GPU engine, stage by stage, on the CPU (no GPU
// needed). It runs the planner's decision for an sm_90a device with default options (plan/gpu/launch.hpp,
// decide_pattern: analysis, the compound split, each tile part's analysis, block plan choice and build, the kernel
// rows) and the backward's first call's plan (backward_tiles, turned key-major), and prints each stage's median over
// --reps runs. What it leaves out: the uploads and the device allocations (Plan::explain on the GPU prints those) and
// random rows the device draws (cuda/fused/random_rows.hpp: "drawn").
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "plan/analysis.hpp"
#include "plan/gpu/block_plan.hpp"
#include "plan/gpu/launch.hpp"
#include "plan/kernels.hpp"
#include "plan/key_plan.hpp"
#include "plan/parts.hpp"
#include "spattn/pattern.hpp"
#include "spattn/plan.hpp"
#include "common/args.hpp"
#include "bench/bench.hpp"

namespace spattn::bench {
using common::Args;
namespace {

const char* kPlanTimeUsage =
    "usage: spattn bench --plan-time [--pattern SPEC] [--len L] [--dim D] [--reps N] [--gpu]\n"
    "The fused GPU engine's planning on the host, stage by stage (median of --reps runs, default 7), for the suite\n"
    "at --len (default 16384) or one pattern: analysis, split (the compound parts, band kernel assumed: sm_90a),\n"
    "the parts' analyses, the forward's block plan choice and build (sm_90a rows; 'choose' prices the tile shapes,\n"
    "'build' builds the chosen one), the backward's key-major plan (built at the first backward call), and the\n"
    "forward's total (analysis to block plans; uploads and random rows drawn on the device, marked 'drawn', not\n"
    "included). SPATTN_PLAN_THREADS caps the threads.\n"
    "--gpu: make_plan itself on CUDA device 0 instead (the fused engine; batch 2, 16 heads, bf16), in process:\n"
    "Plan::plan_ms of the first plan of each pattern (its device blocks may come from cudaMalloc) and the median of\n"
    "the next --reps (each plan destroyed before the next: blocks from the device pool), the first's stage line and\n"
    "that of a run at the median.\n";

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// One run's stage times (ms).
struct Stages {
  double analyse = 0, split = 0, part_analyses = 0, choose = 0, build = 0, backward = 0;
  double forward() const { return analyse + split + part_analyses + choose + build; }
};

// What the fused engine's make_plan runs on the host for one pattern (plan::decide_pattern, the planner's decision
// on an sm_90a device with default options) and its first backward call (plan::backward_tiles, turned key-major).
// `kernels`: the chosen plans' rows and shapes, for the report.
Stages plan_once(const BoundPattern& pat, int64_t dim, std::string* kernels) {
  Stages s;
  auto t0 = std::chrono::steady_clock::now();
  const plan::Analysis an = plan::analyze(pat);
  s.analyse = since(t0);
  const plan::PatternDecision d = plan::decide_pattern(pat, an, dim, plan::GpuTarget{90, 132}, PlanOptions{});
  s.split = d.split.ms;
  kernels->clear();
  for (size_t i = 0; i < d.split.parts.size(); ++i) {
    const plan::Part& part = d.split.parts[i];
    if (!d.launches[i]) {  // a scattered part: a CSR kernel, its rows the split's (or the device's)
      *kernels += (kernels->empty() ? "" : " + ") + std::string(part.drawn.r > 0 ? "scattered csr drawn" : "scattered csr");
      continue;
    }
    const plan::LaunchDecision& l = *d.launches[i];
    const plan::BlockPlan& bp = l.tiles;
    s.part_analyses += l.analysis_ms;
    s.choose += bp.choice_ms;
    s.build += bp.build_ms - bp.choice_ms;
    *kernels += (kernels->empty() ? "" : " + ") + std::string(plan::part_kind_name(part.kind)) + " " +
                std::to_string(bp.block_m) + "x" + std::to_string(bp.block_n) +
                (bp.perm_d > 1 ? "/" + std::to_string(bp.perm_d) : "") + (bp.mapped() ? " mapped" : "") +
                (bp.band ? " band" : "") + (bp.masks_drawn() ? " drawn" : "");
  }
  t0 = std::chrono::steady_clock::now();
  const int row = plan::backward_row(plan::backward_choice("", dim), an, dim);
  if (row >= 0) {
    const plan::BlockPlan bp = plan::backward_tiles(pat, an, dim, row);
    const plan::KeyMajorPlan km = plan::key_major(bp);
    s.backward = since(t0);
    if (km.k_tiles != bp.k_tiles) throw Error("plan time: the key-major plan lost key tiles");
  }
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

// --gpu: make_plan on CUDA device 0, timed by the plan itself (Plan::plan_ms).
void gpu_plan_times(const std::vector<BenchCase>& cases, int64_t L, int64_t dim, int64_t reps) {
  Problem pr;
  pr.batch = 2;
  pr.q_heads = pr.kv_heads = 16;
  pr.q_len = pr.kv_len = L;
  pr.head_dim = dim;
  pr.dtype = DType::bf16;
  std::printf("make_plan on cuda:0, L=%lld, D=%lld, B=2, H=16, bf16, %d plan threads (ms; Plan::plan_ms)\n",
              (long long)L, (long long)dim, plan::plan_thread_cap());
  std::printf("%-10s %9s %9s  %s\n", "pattern", "first", "median", "kernel; the first plan's stages and a median run's");
  for (const BenchCase& c : cases) {
    const Pattern pat = Pattern::parse(c.spec);
    std::vector<std::pair<double, std::string>> runs;  // plan_ms and its stage line
    std::string kernel;
    for (int64_t r = 0; r <= reps; ++r) {
      const Plan plan = make_plan(pat, pr, Device::cuda(0));
      if (r == 0) kernel = plan.kernel();
      const std::string ex = plan.explain();
      const size_t at = ex.find("plan time by stage: ");
      runs.emplace_back(plan.plan_ms(), at == std::string::npos ? "" : ex.substr(at + 20, ex.find('\n', at) - at - 20));
    }
    const auto first = runs[0];
    runs.erase(runs.begin());
    std::vector<double> ms;
    for (const auto& r : runs) ms.push_back(r.first);
    std::sort(runs.begin(), runs.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    const std::string& mid = runs.empty() ? first.second : runs[(runs.size() - 1) / 2].second;
    std::printf("%-10s %9.3f %9.3f  %s; first: %s\n%-10s %9s %9s  median run: %s\n", c.name.c_str(), first.first, median(ms),
                kernel.c_str(), first.second.c_str(), "", "", "", mid.c_str());
  }
}

int bench_plan_main(int argc, char** argv) {
  Args a(argc, argv, 2, {"pattern", "len", "dim", "reps"}, {"plan-time", "help", "gpu"});
  if (a.has("help")) {
    std::printf("%s", kPlanTimeUsage);
    return 0;
  }
  const int64_t L = a.integer("len", 16384), dim = a.integer("dim", 64), reps = a.integer("reps", 7);
  if (L < 1 || reps < 1) throw Error("--len and --reps must be at least 1");
  std::vector<BenchCase> cases;
  if (a.has("pattern")) {
    cases = {{"custom", a.str("pattern")}};
  } else {
    cases = standard_suite(L);
    cases.push_back({"bandrand", "local(256) | random(4, seed=1)"});
    cases.push_back({"sprandom", "random(" + std::to_string(std::max<int64_t>(1, (L * 81 + 8192) / 16384)) + ", seed=0)"});
  }
  if (a.has("gpu")) {
    gpu_plan_times(cases, L, dim, reps);
    return 0;
  }
  std::printf("plan time, L=%lld, D=%lld, %d plan threads, median of %lld runs (ms)\n", (long long)L, (long long)dim,
              plan::plan_thread_cap(), (long long)reps);
  std::printf("%-10s %8s %8s %8s %8s %8s %9s %9s  %s\n", "pattern", "analyse", "split", "parts", "choose", "build",
              "forward", "backward", "plans");
  for (const BenchCase& c : cases) {
    const BoundPattern pat = Pattern::parse(c.spec).bind(L, L);
    std::vector<Stages> runs;
    std::string kernels;
    for (int64_t r = 0; r < reps; ++r) runs.push_back(plan_once(pat, dim, &kernels));
    auto med = [&](double Stages::*f) {
      std::vector<double> v;
      for (const Stages& s : runs) v.push_back(s.*f);
      return median(v);
    };
    std::vector<double> fwd;
    for (const Stages& s : runs) fwd.push_back(s.forward());
    std::printf("%-10s %8.3f %8.3f %8.3f %8.3f %8.3f %9.3f %9.3f  %s\n", c.name.c_str(), med(&Stages::analyse),
                med(&Stages::split), med(&Stages::part_analyses), med(&Stages::choose), med(&Stages::build), median(fwd),
                med(&Stages::backward), kernels.c_str());
  }
  return 0;
}

}  // namespace spattn::bench
