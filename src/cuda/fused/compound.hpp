// cuda/fused/compound.hpp — a compound plan on the GPU (plan/parts.hpp): each part by its kernel, merged through
// the LSE (plan/merge.hpp).
//
//   tiles      FusedAttention over the part's pattern (band, TMA or cp.async tile kernels);
//   columns    the part's keys gathered into a small contiguous K/V, FusedAttention over the compact pattern;
//   scattered  the fine-grained CSR kernel (parts_kernels.cu: cuda_scattered), merging in its epilogue;
//   rows       FusedAttention of dense rows over views of the owned query rows, replacing what is there;
//   affine     FusedAttention over the part's pattern grouped by residue (cp.async / mma.sync tile kernels).
// The first part writes O and LSE; a later columns part writes scratch and one merge kernel folds it in; a later
// affine part merges in its kernel's epilogue (FusedParams::merge_out; as columns where its kernel cannot).
// Scratch (the LSE where the caller passes none, the columns part's K/V and partial O) is allocated once at
// construction for the problem given; runs are graph-capturable (no allocation, no sync). One object per stream.
#pragma once
#include <memory>
#include <string>

#include "cuda/fused/fused_attention.hpp"
#include "plan/gpu/launch.hpp"
#include "plan/parts.hpp"
#include "spattn/tensor.hpp"

namespace spattn::cuda::fused {

class CompoundAttention {
 public:
  // decision: the planner's (plan::decide_pattern, compound): each part's launch uploaded, its scratch allocated.
  CompoundAttention(plan::PatternDecision decision, const Problem& problem);
  ~CompoundAttention();
  CompoundAttention(CompoundAttention&&) noexcept;
  CompoundAttention& operator=(CompoundAttention&&) noexcept;

  // Views checked by the caller against `problem` (the one given at construction).
  void run(const Problem& problem, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
           const TensorView& lse, void* stream) const;
  std::string explain() const;
  int kernel_row() const;       // the first part's row (a tile row, or cuda_scattered)
  int last_kernel_row() const;  // the first part's row as the last run launched it (-1 before a run)
  const PlanTimes& plan_times() const;  // the split, the parts' plans and every upload

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace spattn::cuda::fused
