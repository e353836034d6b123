// cuda/fused/fused_attention.cu — spattn::FusedAttention (include/spattn/fused.hpp) over FusedFwd.
#include "spattn/fused.hpp"

#include <chrono>
#include <sstream>

#include "cuda/common/device.hpp"
#include "cuda/fused/fused_fwd.hpp"

namespace spattn {

using cuda::fused::DevicePlan;
using cuda::fused::FusedFwd;

struct FusedAttention::Impl {
  std::unique_ptr<DevicePlan> plan;
  FusedOptions options;
  double plan_ms = 0;

  FusedFwd::Arguments args(const Problem& problem, const TensorView& q, const TensorView& k, const TensorView& v,
                           const TensorView& o, const TensorView& lse) const {
    return {problem, q, k, v, o, lse, options.force_sm80, !options.tma, options.persistent, options.band, options.split,
            options.running_max};
  }
};

FusedAttention::FusedAttention(const BoundPattern& pattern, int64_t head_dim, const FusedOptions& options)
    : impl_(std::make_unique<Impl>()) {
  const auto t0 = std::chrono::steady_clock::now();
  impl_->options = options;
  // The warp-specialized TMA kernel (and its 192-row tiles) exists on compute capability 9.0 (sm_90a).
  const bool sm90 = cuda::device_info(cuda::current_device()).sm90a();
  impl_->plan = std::make_unique<DevicePlan>(plan::choose_block_plan(
      pattern, head_dim, options.block_m, options.block_n, options.perm_d, sm90 && options.tma && !options.force_sm80));
  impl_->plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
FusedAttention::~FusedAttention() = default;
FusedAttention::FusedAttention(FusedAttention&&) noexcept = default;
FusedAttention& FusedAttention::operator=(FusedAttention&&) noexcept = default;

FusedStatus FusedAttention::can_implement(const Problem& problem, const TensorView& q, const TensorView& k,
                                          const TensorView& v, const TensorView& o, const TensorView& lse) const {
  const auto st = FusedFwd::can_implement(impl_->args(problem, q, k, v, o, lse), *impl_->plan);
  return {st.ok, st.reason};
}

void FusedAttention::run(const Problem& problem, const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& o, const TensorView& lse, void* stream) const {
  FusedFwd::Params params;
  const auto st = FusedFwd::can_implement(impl_->args(problem, q, k, v, o, lse), *impl_->plan, &params);
  if (!st.ok) throw Error(st.reason);
  FusedFwd::run(params, static_cast<cudaStream_t>(stream));
}

std::string FusedAttention::explain() const {
  std::ostringstream s;
  s << "fused block-sparse attention: " << impl_->plan->host().describe();
  if (impl_->plan->narrow_entries() > 0) s << ", " << impl_->plan->narrow_entries() << " half-width";
  s << "; plan " << impl_->plan_ms << " ms";
  return s.str();
}
std::string FusedAttention::kernel_name(const Problem& problem) const {
  FusedFwd::Params p;
  p.block_m = block_m();
  p.block_n = block_n();
  p.head_dim = int(problem.head_dim);
  p.bf16 = problem.dtype == DType::bf16;
  p.sm90 = !impl_->options.force_sm80 && cuda::device_info(impl_->plan->device()).sm90a();
  const auto& hp = impl_->plan->host();  // as FusedFwd::to_params decides (tensor maps permitting)
  p.ws = p.sm90 && impl_->options.tma && plan::tma_kernel_shape(hp.block_m, hp.block_n, hp.perm_d, problem.head_dim);
  p.band = p.ws && plan::band_kernel_runs(hp, problem.head_dim, impl_->options.band);
  p.band_running_max = p.band && FusedFwd::band_running_max(*impl_->plan, impl_->options.running_max);
  return FusedFwd::kernel_name(p);
}
double FusedAttention::plan_ms() const { return impl_->plan_ms; }
int64_t FusedAttention::nnz() const { return impl_->plan->host().nnz; }
int FusedAttention::block_m() const { return impl_->plan->host().block_m; }
int FusedAttention::block_n() const { return impl_->plan->host().block_n; }
int FusedAttention::perm_d() const { return impl_->plan->host().perm_d; }

}  // namespace spattn
