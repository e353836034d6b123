// cuda/fused/backend.cpp — the fused GPU engine behind spattn::Plan: one FusedAttention per distinct pattern;
// per-head patterns run head by head through views of the caller's tensors (no copies).
#include <cuda_runtime.h>

#include <atomic>
#include <optional>
#include <sstream>

#include "cuda/common/patterns_backward.hpp"
#include "cuda/fused/compound.hpp"
#include "cuda/fused/fused_attention.hpp"
#include "cuda/fused/fused_fwd.hpp"
#include "cuda/common/check.hpp"
#include "cuda/common/device.hpp"
#include "cuda/common/empty_backend.hpp"
#include "cuda/common/pool.hpp"
#include "plan/backend.hpp"
#include "plan/gpu/launch.hpp"
#include "plan/kernels.hpp"

namespace spattn::plan {

namespace {

using cuda::DeviceScope;

// One distinct pattern's forward: one tile list (FusedAttention) or a compound plan (parts merged through the LSE).
struct PatternRun {
  std::optional<cuda::fused::FusedAttention> fused;
  std::optional<cuda::fused::CompoundAttention> compound;

  void run(const Problem& pr, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
           const TensorView& lse, Stream stream) const {
    if (fused) return fused->run(pr, q, k, v, o, lse, stream);
    compound->run(pr, q, k, v, o, lse, stream);
  }
  int kernel_row() const { return fused ? fused->kernel_row() : compound->kernel_row(); }
  const cuda::fused::PlanTimes& plan_times() const { return fused ? fused->plan_times() : compound->plan_times(); }
  int last_kernel_row() const { return fused ? fused->last_kernel_row() : compound->last_kernel_row(); }
  std::string explain() const {
    if (compound) return compound->explain();
    std::ostringstream s;
    s << fused->explain() << "; predicted cost " << fused->predicted_cost() << " per kept score (kernel-table units)";
    return s.str();
  }
};

class CudaFusedBackend final : public Backend {
 public:
  CudaFusedBackend(const Planned& p, const Problem& problem, int device, const PlanOptions& o)
      : problem_(problem), device_(device), of_head_(p.of_head), bwd_(p, problem, o.backward_kernel, &o) {
    for (const Analysis& a : p.analyses) analysis_ms_ += a.ms;
    const cuda::PoolStats pool0 = cuda::pool_stats();
    DeviceScope scope(device);
    const cuda::DeviceInfo& info = cuda::device_info(device);
    const plan::GpuTarget target{info.cc, info.sms};
    Problem one = problem;  // what each pattern's plan runs: all heads, or one head of per-head patterns
    if (p.per_head()) one.q_heads = one.kv_heads = 1;
    for (size_t i = 0; i < p.patterns.size(); ++i) {
      // The planner's decision (plan/gpu/launch.hpp), uploaded.
      plan::PatternDecision d = plan::decide_pattern(p.patterns[i], p.analyses[i], problem.head_dim, target, o);
      PatternRun r;
      if (d.compound())
        r.compound.emplace(std::move(d), one);
      else
        r.fused.emplace(std::move(*d.launches[0]));
      attn_.push_back(std::move(r));
    }
    const cuda::PoolStats pool1 = cuda::pool_stats();
    pool_hits_ = pool1.hits - pool0.hits;
    pool_mallocs_ = pool1.mallocs - pool0.mallocs;
  }

  void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView& lse, Stream stream) const override {
    DeviceScope scope(device_);
    if (attn_.size() == 1) return attn_[0].run(problem_, q, k, v, o, lse, stream);
    // Per-head patterns: each query head through its pattern's plan, on views of one head.
    Problem one = problem_;
    one.q_heads = one.kv_heads = 1;
    const int64_t group = problem_.q_heads / problem_.kv_heads;
    for (int64_t h = 0; h < problem_.q_heads; ++h)
      attn_[size_t(of_head_[size_t(h)])].run(one, q.narrow(2, h), k.narrow(2, h / group),
                                             v.narrow(2, h / group), o.narrow(2, h), lse.narrow(1, h),
                                             stream);
  }
  void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, Stream stream) const override {
    DeviceScope scope(device_);
    bwd_.run(q, k, v, o, lse, dout, dq, dk, dv, stream);
  }
  std::string kernel() const override {
    const int row = attn_[0].kernel_row();
    return row >= 0 ? kKernels[row].name : "none";
  }
  std::string last_kernel() const override {
    const int row = attn_[0].last_kernel_row();
    return row >= 0 ? kKernels[row].name : "";
  }
  std::string last_backward_kernel() const override { return bwd_.last_kernel(); }
  std::string explain() const override {
    std::ostringstream s;
    for (size_t i = 0; i < attn_.size(); ++i) s << (i ? "\n" : "") << attn_[i].explain();
    cuda::fused::PlanTimes t;
    for (const PatternRun& r : attn_) t += r.plan_times();
    s << "\nplan time by stage: analysis " << analysis_ms_ << " ms (make_plan), split " << t.split
      << " ms, the parts' analyses " << t.analysis << " ms, choosing tile shapes " << t.choose << " ms, building tile plans "
      << t.build << " ms, allocations and uploads " << t.upload << " ms (device memory: " << pool_hits_
      << " blocks from the pool's cache, " << pool_mallocs_
      << " cudaMalloc; process-wide counts while this plan was built); the backward's plan is built at the first "
         "backward call";
    DeviceScope scope(device_);
    s << "\n" << bwd_.explain();
    return s.str();
  }

 private:
  Problem problem_;
  int device_;
  std::vector<int> of_head_;
  std::vector<PatternRun> attn_;
  double analysis_ms_ = 0;  // make_plan's analyses of the distinct patterns
  size_t pool_hits_ = 0, pool_mallocs_ = 0;  // the device pool's requests served from its cache, its cudaMallocs
  cuda::PatternsBackward bwd_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_fused_backend(const Planned& p, const Problem& problem, int device,
                                                 const PlanOptions& options) {
  if (cuda::empty_problem(problem)) {
    // Nothing to run, but the options are checked as for any problem (a misspelt kernel is refused either way).
    plan::KernelFilter filter;
    plan::fused_options(options, &filter);
    const cuda::PatternsBackward backward_check(p, problem, options.backward_kernel);
    return cuda::make_empty_backend(problem, device, "cuda_fused");
  }
  return std::make_unique<CudaFusedBackend>(p, problem, device, options);
}

}  // namespace spattn::plan
