// plan/backend.hpp — the contract between spattn::Plan (src/api/plan.cpp) and the engines that run it.
//
// make_plan binds the patterns, analyses each distinct one once, and hands the engine's factory a Planned:
// the distinct patterns with their analyses and which one each query head uses. Each engine (src/cpu,
// src/cuda/fused, src/cuda/unfused) implements Backend; the factories of an engine a build lacks throw Error.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "plan/analysis.hpp"
#include "spattn/plan.hpp"

namespace spattn::plan {

struct Planned {
  std::vector<BoundPattern> patterns;  // distinct patterns (by spec)
  std::vector<Analysis> analyses;      // analyze(patterns[i])
  std::vector<int> of_head;            // [Hq]: index into patterns
  bool per_head() const { return patterns.size() > 1; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  // Views already checked against the problem's shapes by Plan::forward.
  virtual void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                       const TensorView& lse, Stream stream) const = 0;
  // dq, dk, dv from dout (views checked by Plan::backward).
  virtual void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                        const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, Stream stream) const = 0;
  virtual std::string kernel() const = 0;       // the chosen kernel-table row (its name)
  virtual std::string last_kernel() const = 0;  // the row the last forward launched, "" before one
  virtual std::string explain() const = 0;      // tiles, waste, predicted cost, build time
  virtual std::string last_backward_kernel() const { return ""; }  // the row the last backward launched
};

std::unique_ptr<Backend> make_cpu_backend(const Planned& p, const Problem& problem, const PlanOptions& options);
std::unique_ptr<Backend> make_reference_backend(const Planned& p, const Problem& problem);
std::unique_ptr<Backend> make_cuda_fused_backend(const Planned& p, const Problem& problem, int device,
                                                 const PlanOptions& options);
std::unique_ptr<Backend> make_cuda_unfused_backend(const Planned& p, const Problem& problem, int device,
                                                   const PlanOptions& options);

}  // namespace spattn::plan
