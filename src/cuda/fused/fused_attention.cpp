// cuda/fused/fused_attention.cpp — spattn::cuda::fused::FusedAttention (cuda/fused/fused_attention.hpp) over FusedFwd.
#include "cuda/fused/fused_attention.hpp"

#include <atomic>
#include <chrono>
#include <sstream>

#include "cuda/common/device.hpp"
#include "cuda/fused/fused_fwd.hpp"
#include "plan/kernels.hpp"

namespace spattn::cuda::fused {

struct FusedAttention::Impl {
  std::unique_ptr<DevicePlan> plan;
  int persistent = 1, split = -1;  // the decision's policy (LaunchDecision)
  std::string why;
  PlanTimes times;
  mutable std::atomic<int> last_row{-1};

  FusedFwd::Arguments args(const Problem& problem, const TensorView& q, const TensorView& k, const TensorView& v,
                           const TensorView& o, const TensorView& lse) const {
    return {problem, q, k, v, o, lse, persistent, split};
  }
};

FusedAttention::FusedAttention(plan::LaunchDecision d) : impl_(std::make_unique<Impl>()) {
  const auto t0 = std::chrono::steady_clock::now();
  impl_->persistent = d.persistent;
  impl_->split = d.split;
  impl_->why = std::move(d.why);
  PlanTimes& t = impl_->times;
  t.analysis = d.analysis_ms;
  t.choose = d.tiles.choice_ms;
  t.build = d.tiles.build_ms - d.tiles.choice_ms;
  impl_->plan = std::make_unique<DevicePlan>(std::move(d.tiles), d.kernel_row);
  t.upload = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

FusedAttention::FusedAttention(const BoundPattern& pattern, int64_t head_dim, const plan::FusedOptions& options,
                               const plan::Analysis* analysis)
    : FusedAttention([&] {
        const DeviceInfo& info = device_info(current_device());
        return plan::decide_tiles(pattern, analysis, head_dim, {info.cc, info.sms}, options);
      }()) {}
FusedAttention::~FusedAttention() = default;
FusedAttention::FusedAttention(FusedAttention&&) noexcept = default;
FusedAttention& FusedAttention::operator=(FusedAttention&&) noexcept = default;

common::Status FusedAttention::can_implement(const Problem& problem, const TensorView& q, const TensorView& k,
                                             const TensorView& v, const TensorView& o, const TensorView& lse) const {
  return FusedFwd::can_implement(impl_->args(problem, q, k, v, o, lse), *impl_->plan);
}

void FusedAttention::run(const Problem& problem, const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& o, const TensorView& lse, void* stream, bool merge_out) const {
  FusedFwd::Params params;
  const auto st = FusedFwd::can_implement(impl_->args(problem, q, k, v, o, lse), *impl_->plan, &params);
  if (!st.ok) throw Error(st.reason);
  if (merge_out) {
    const plan::KernelKind kind = plan::kKernels[params.kernel_row].kind;
    if (kind != plan::KernelKind::sm90_cp && kind != plan::KernelKind::sm80_mma)
      throw Error(std::string("fused attention: merge_out needs a cp.async or mma.sync row, got ") +
                  plan::kKernels[params.kernel_row].name);
    if (lse.data == nullptr) throw Error("fused attention: merge_out needs the lse of the rows it merges into");
    params.kernel.merge_out = 1;
  }
  FusedFwd::run(params, static_cast<cudaStream_t>(stream));
  impl_->last_row.store(params.kernel_row, std::memory_order_relaxed);
}

std::string FusedAttention::explain() const {
  std::ostringstream s;
  s << "fused block-sparse attention, kernel " << kernel_name() << " (" << impl_->why << "): " << impl_->plan->host().describe();
  if (impl_->plan->narrow_entries() > 0) s << ", " << impl_->plan->narrow_entries() << " half-width";
  // launch_row (launch.cuh): residue-grouped 64x64 plans at D = 64 on the sm_90a cp.async row, four CTAs an SM.
  if (const int r = kernel_row(); r >= 0) {
    const plan::KernelConfig& row = plan::kKernels[r];
    if (row.kind == plan::KernelKind::sm90_cp && row.block_m == 64 && row.block_n == 64 && row.head_dim == 64 &&
        impl_->plan->host().perm_d > 1)
      s << ", four CTAs an SM";
  }
  const PlanTimes& t = impl_->times;
  s << "; plan " << t.total() << " ms (" << t.upload << " uploading)";
  return s.str();
}
int FusedAttention::kernel_row() const { return impl_->plan->kernel_row(); }
bool FusedAttention::merges_out() const {
  const plan::KernelKind kind = plan::kKernels[kernel_row()].kind;
  return kind == plan::KernelKind::sm90_cp || kind == plan::KernelKind::sm80_mma;
}
int FusedAttention::last_kernel_row() const { return impl_->last_row.load(std::memory_order_relaxed); }
std::string FusedAttention::kernel_name() const {
  const int row = kernel_row();
  return row >= 0 ? plan::kKernels[row].name : "none";
}
const PlanTimes& FusedAttention::plan_times() const { return impl_->times; }
double FusedAttention::predicted_cost() const {
  const plan::BlockPlan& hp = impl_->plan->host();
  const int row = kernel_row();
  if (row < 0 || hp.nnz == 0) return 0;
  int64_t items = 0;
  for (int64_t qt = 0; qt < hp.q_tiles; ++qt) items += hp.row_offsets[size_t(qt + 1)] > hp.row_offsets[size_t(qt)];
  return plan::predicted_cost(plan::kKernels[row], double(hp.n_full), double(hp.n_band + hp.n_bitmask), double(items),
                              double(hp.block_m) * hp.block_n) /
         double(hp.nnz);
}
int64_t FusedAttention::nnz() const { return impl_->plan->host().nnz; }
int FusedAttention::block_m() const { return impl_->plan->host().block_m; }
int FusedAttention::block_n() const { return impl_->plan->host().block_n; }
int FusedAttention::perm_d() const { return impl_->plan->host().perm_d; }

}  // namespace spattn::cuda::fused
