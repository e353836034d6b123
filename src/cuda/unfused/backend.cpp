// cuda/unfused/backend.cpp — the unfused GPU engine behind spattn::Plan: SDDMM -> sparse softmax -> SpMM
// (unfused::UnfusedPlan), its attention workspace owned by the backend.
#include <cuda_runtime.h>

#include <atomic>

#include "cuda/common/patterns_backward.hpp"
#include "cuda/common/check.hpp"
#include "cuda/common/device.hpp"
#include "cuda/common/empty_backend.hpp"
#include "plan/backend.hpp"
#include "plan/kernels.hpp"
#include "cuda/unfused/unfused.hpp"

namespace spattn::plan {
namespace {

using cuda::DeviceScope;

void check_options(const Planned& p, const PlanOptions& o) {
  if (p.per_head())
    throw Error("engine cuda_unfused takes one pattern for all heads, got " + std::to_string(p.patterns.size()) +
                " distinct per-head patterns (use cuda_fused or the CPU)");
  if (!o.kernel.empty() && o.kernel != "cuda_unfused")
    throw Error("kernel '" + o.kernel + "' is not the unfused GPU engine's (cuda_unfused)");
}

class CudaUnfusedBackend final : public Backend {
 public:
  CudaUnfusedBackend(const Planned& p, const Problem& problem, int device, const PlanOptions& o)
      : problem_(problem), device_(device), bwd_(p, problem, o.backward_kernel) {
    check_options(p, o);
    DeviceScope scope(device);
    plan_ = std::make_unique<unfused::UnfusedPlan>(unfused::UnfusedPlan::build(p.patterns[0], problem));
    const int64_t bytes = plan_->attention_workspace_size(false);
    if (bytes > 0) SPATTN_CUDA_CHECK(cudaMalloc(&workspace_, size_t(bytes)));
  }
  ~CudaUnfusedBackend() override { cudaFree(workspace_); }

  void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView& lse, Stream stream) const override {
    const Problem& pr = problem_;
    if (lse.data && (lse.dtype != DType::f32 || lse.stride[0] != pr.q_heads * pr.q_len || lse.stride[1] != pr.q_len ||
                     lse.stride[2] != 1))
      throw Error("engine cuda_unfused: lse must be contiguous fp32 [B, Hq, Lq]");
    DeviceScope scope(device_);
    plan_->attention(q, k, v, o, static_cast<float*>(lse.data), {}, workspace_, stream);
    ran_ = true;
  }
  void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, Stream stream) const override {
    DeviceScope scope(device_);
    bwd_.run(q, k, v, o, lse, dout, dq, dk, dv, stream);
  }
  std::string kernel() const override { return "cuda_unfused"; }
  std::string last_kernel() const override { return ran_ ? "cuda_unfused" : ""; }
  std::string last_backward_kernel() const override {
    const int row = bwd_.last_kernel_row();
    return row >= 0 ? kKernels[row].name : "";
  }
  std::string explain() const override { return "cuda unfused (SDDMM -> softmax -> SpMM): " + plan_->explain(); }

 private:
  Problem problem_;
  int device_;
  std::unique_ptr<unfused::UnfusedPlan> plan_;
  void* workspace_ = nullptr;
  mutable bool ran_ = false;
  cuda::PatternsBackward bwd_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_unfused_backend(const Planned& p, const Problem& problem, int device,
                                                   const PlanOptions& options) {
  if (cuda::empty_problem(problem)) {  // nothing to run; the options checked as for any problem
    check_options(p, options);
    const cuda::PatternsBackward backward_check(p, problem, options.backward_kernel);
    return cuda::make_empty_backend(problem, device, "cuda_unfused");
  }
  return std::make_unique<CudaUnfusedBackend>(p, problem, device, options);
}

}  // namespace spattn::plan
