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
#include "plan/kernels.hpp"
#include "plan/parts.hpp"

namespace spattn::plan {

namespace {

using cuda::DeviceScope;

// The FusedOptions that force PlanOptions::kernel (a row name or a kind name), and the kind/row it must give.
FusedOptions fused_options(const PlanOptions& o, int* want_row, int* want_kind) {
  FusedOptions f;
  f.block_m = o.block_m;
  f.block_n = o.block_n;
  f.perm_d = o.perm_d;
  f.tile_map = o.tile_map;
  f.persistent = o.persistent;
  f.split = o.split;
  *want_row = -1;
  *want_kind = -1;
  if (o.kernel.empty()) return f;
  KernelKind kind{};
  const int row = find_kernel(o.kernel.c_str());
  if (row >= 0) {
    kind = kKernels[row].kind;
    if (!is_band(kind) && !o.block_m) f.block_m = kKernels[row].block_m, f.block_n = kKernels[row].block_n;
    *want_row = row;
  } else {
    bool found = false;
    for (KernelKind k : {KernelKind::sm80_mma, KernelKind::sm90_cp, KernelKind::sm90_tma, KernelKind::sm90_band,
                         KernelKind::sm90_band_rmax})
      if (o.kernel == kind_name(k)) kind = k, found = true;
    if (!found) throw Error("kernel '" + o.kernel + "' is not a fused GPU kernel: give a kind (sm80, sm90_cp, sm90_tma, " +
                            "sm90_band, sm90_band_rmax) or a kernel's name such as sm90_tma_128x128_d64");
  }
  if (!is_gpu_fused(kind)) throw Error("kernel '" + o.kernel + "' is not a fused GPU kernel");
  *want_kind = int(kind);
  f.force_sm80 = kind == KernelKind::sm80_mma;
  f.tma = kind != KernelKind::sm90_cp;
  if (kind == KernelKind::sm90_tma || is_band(kind)) f.tile_map = 0;  // they load affine rows (no tile map)
  f.band = is_band(kind) ? 1 : 0;
  f.running_max = kind == KernelKind::sm90_band_rmax ? 1 : 0;
  return f;
}

// One distinct pattern's forward: one tile list (FusedAttention) or a compound plan (parts merged through the LSE).
struct PatternRun {
  std::optional<FusedAttention> fused;
  std::optional<cuda::fused::CompoundAttention> compound;

  void run(const Problem& pr, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
           const TensorView& lse, Stream stream) const {
    if (fused) return fused->run(pr, q, k, v, o, lse, stream);
    compound->run(pr, q, k, v, o, lse, stream);
  }
  int kernel_row() const { return fused ? fused->kernel_row() : compound->kernel_row(); }
  const PlanTimes& plan_times() const { return fused ? fused->plan_times() : compound->plan_times(); }
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
      : problem_(problem), device_(device), of_head_(p.of_head), bwd_(p, problem, o.backward_kernel) {
    for (const Analysis& a : p.analyses) analysis_ms_ += a.ms;
    const cuda::PoolStats pool0 = cuda::pool_stats();
    DeviceScope scope(device);
    int want_row = -1, want_kind = -1;
    const FusedOptions f = fused_options(o, &want_row, &want_kind);
    // Whether a tiles part of band rows runs on the band kernel (fused_fwd.cpp, choose_kernel; block_plan.hpp,
    // choose_block_plan's band plans): the compound split's rule for dense rows beside band rows.
    plan::SplitTarget target;
    target.band_kernel = plan::band_block_m(problem.head_dim) > 0 && cuda::device_info(device).sm90a() && f.tma &&
                         !f.force_sm80 && f.band != 0 && f.block_m <= 0 && f.perm_d <= 1 && f.tile_map < 1;
    target.device_draw = f.device_draw != 0;
    Problem one = problem;  // what each pattern's plan runs: all heads, or one head of per-head patterns
    if (p.per_head()) one.q_heads = one.kv_heads = 1;
    for (size_t i = 0; i < p.patterns.size(); ++i) {
      PatternRun r;
      // A forced kernel runs the pattern as one tile list.
      plan::Split split = split_pattern(p.patterns[i], p.analyses[i], o.kernel.empty() ? o.compound : 0, target);
      if (split.compound())
        r.compound.emplace(std::move(split), one, f);
      else
        r.fused.emplace(p.patterns[i], problem.head_dim, f, &p.analyses[i]);
      if (want_kind >= 0 && want_row < 0 && !o.block_m && r.fused && r.kernel_row() >= 0 &&
          int(kKernels[r.kernel_row()].kind) != want_kind && !is_band(KernelKind(want_kind))) {
        // A kind forced (sm90_tma, sm90_cp, sm80) whose shapes the planner did not pick: plan with the kind's first
        // row of this head dim instead (the table lists each kind's rows best first).
        for (int k = 0; k < kNumKernels; ++k)
          if (int(kKernels[k].kind) == want_kind && kKernels[k].head_dim == problem.head_dim) {
            FusedOptions g = f;
            g.block_m = kKernels[k].block_m, g.block_n = kKernels[k].block_n;
            r.fused.reset();
            r.fused.emplace(p.patterns[i], problem.head_dim, g, &p.analyses[i]);
            break;
          }
      }
      const int row = r.kernel_row();
      const bool ok = row >= 0 && (want_row < 0 || row == want_row) && (want_kind < 0 || int(kKernels[row].kind) == want_kind);
      if (!ok)
        throw Error("kernel '" + o.kernel + "' cannot run pattern '" + p.patterns[i].spec() + "' at head dim " +
                    std::to_string(problem.head_dim) + " on this device: the planner's choice is " +
                    (row >= 0 ? kKernels[row].name : "none") + " (" + r.explain() + ")");
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
  std::string last_backward_kernel() const override {
    const int row = bwd_.last_kernel_row();
    return row >= 0 ? kKernels[row].name : "";
  }
  std::string explain() const override {
    std::ostringstream s;
    for (size_t i = 0; i < attn_.size(); ++i) s << (i ? "\n" : "") << attn_[i].explain();
    PlanTimes t;
    for (const PatternRun& r : attn_) t += r.plan_times();
    s << "\nplan time by stage: analysis " << analysis_ms_ << " ms (make_plan), split " << t.split
      << " ms, the parts' analyses " << t.analysis << " ms, choosing tile shapes " << t.choose << " ms, building tile plans "
      << t.build << " ms, allocations and uploads " << t.upload << " ms (device memory: " << pool_hits_
      << " blocks from the pool's cache, " << pool_mallocs_
      << " cudaMalloc; process-wide counts while this plan was built); the backward's plan is built at the first "
         "backward call";
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
    int row = -1, kind = -1;
    fused_options(options, &row, &kind);
    const cuda::PatternsBackward backward_check(p, problem, options.backward_kernel);
    return cuda::make_empty_backend(problem, device, "cuda_fused");
  }
  return std::make_unique<CudaFusedBackend>(p, problem, device, options);
}

}  // namespace spattn::plan
