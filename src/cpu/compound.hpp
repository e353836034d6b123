// cpu/compound.hpp — a compound plan on the CPU (plan/parts.hpp): each part through the fused CPU kernel (the
// columns part over gathered keys, the rows part over the owned rows), merged through the LSE (plan/merge.hpp).
// The same parts and merge as the GPU's (cuda/fused/compound.hpp). Views as cpu::FusedPlan takes them. Run only
// where asked (PlanOptions::compound 1; measured slower than one tile plan: cpu/backend.cpp).
#pragma once
#include <vector>

#include "cpu/fused_plan.hpp"
#include "plan/parts.hpp"

namespace spattn::cpu {

class CompoundPlan {
 public:
  CompoundPlan(plan::Split split, const Problem& problem, const Options& options);
  void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o, const TensorView& lse,
           const Options& options) const;
  std::string describe() const;
  const PlanStats& stats() const { return plans_.front().stats(); }

 private:
  Problem problem_;
  std::vector<plan::Part> parts_;
  std::vector<FusedPlan> plans_;  // one per part
  double split_ms_ = 0;
};

}  // namespace spattn::cpu
