// api/runtime_plan.hpp — the engine behind plans of run-time masks (make_plan(MaskLayout), spattn/runtime_mask.hpp).
#pragma once
#include <memory>

#include "plan/backend.hpp"
#include "spattn/runtime_mask.hpp"

namespace spattn::plan {

// A Backend whose forward / backward take the mask of the call; the mask-less ones throw Error saying so.
class RuntimeBackend : public Backend {
 public:
  virtual void forward_mask(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                            const TensorView& lse, const RuntimeMask& mask, Stream stream) const = 0;
  virtual void backward_mask(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                             const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                             const TensorView& dv, const RuntimeMask& mask, Stream stream) const = 0;
  virtual const MaskLayout& layout() const = 0;
};

// engine: cpu_fused, reference, cuda_fused or cuda_unfused (already chosen by make_plan).
std::unique_ptr<RuntimeBackend> make_runtime_backend(const MaskLayout& layout, const Problem& problem, Device device,
                                                     Engine engine, const PlanOptions& options);

}  // namespace spattn::plan
