// cuda/fused/fused_attention.hpp — the fused GPU backend of spattn::Plan (include/spattn/plan.hpp): the fused
// block-sparse flash-attention forward.
//
//   cuda::fused::FusedAttention attn(bound, /*head_dim=*/64);  // plans (plan::decide_tiles), uploads once
//   if (auto st = attn.can_implement(problem, q, k, v, o, lse); !st.ok) ... st.reason ...
//   attn.run(problem, q, k, v, o, lse, stream);                // relaunchable, graph-capturable
//
// One FusedAttention may run any number of times on one stream (or in one graph); runs on two streams at once
// need two objects (the sm_90a kernel keeps a work counter with the plan, reset by each run).
//
// Tensors are device pointers in TensorViews ([B, L, H, D], head dim contiguous); bf16 or fp16; head dim
// 64 or 128; GQA (Hq % Hkv == 0); lse [B, Hq, Lq] (shape {B, Hq, Lq, 1}) fp32 natural log, optional.
// The views' shapes are those of the problem: the caller has checked them (Plan::forward does, once a call);
// can_implement checks what this layer knows (the problem against the plan, strides, alignment, device).
// The kernel that runs is a row of the kernel table (plan/kernels.hpp), chosen by the planner (plan/gpu/launch.hpp:
// a LaunchDecision, kernel_row()); a run falls back from it only where the tensors' strides admit no tensor map, and
// records the row it launched (last_kernel_row()).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.hpp"
#include "plan/analysis.hpp"
#include "plan/gpu/launch.hpp"
#include "spattn/pattern.hpp"
#include "spattn/tensor.hpp"

namespace spattn::cuda::fused {

// Where a plan's host time went (ms): the compound split, analyses of patterns the caller gave none for, pricing the
// tile shapes, building the chosen tile plans, device allocations and uploads (Plan::explain on the GPU prints it).
struct PlanTimes {
  double split = 0, analysis = 0, choose = 0, build = 0, upload = 0;
  PlanTimes& operator+=(const PlanTimes& o) {
    split += o.split, analysis += o.analysis, choose += o.choose, build += o.build, upload += o.upload;
    return *this;
  }
  double total() const { return split + analysis + choose + build + upload; }
};

class FusedAttention {
 public:
  // Uploads the planner's decision to the current CUDA device. Throws Error.
  explicit FusedAttention(plan::LaunchDecision decision);
  // Plans for the current device (plan::decide_tiles) and uploads. `analysis`: plan::analyze(pattern) where the
  // caller has it, else computed by the planner.
  FusedAttention(const BoundPattern& pattern, int64_t head_dim, const plan::FusedOptions& options = {},
                 const plan::Analysis* analysis = nullptr);
  ~FusedAttention();
  FusedAttention(FusedAttention&&) noexcept;
  FusedAttention& operator=(FusedAttention&&) noexcept;

  common::Status can_implement(const Problem& problem, const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& o, const TensorView& lse) const;
  size_t workspace_size(const Problem&) const { return 0; }
  // Enqueues the forward on `stream` (a cudaStream_t, null for the default stream). Throws Error when
  // can_implement fails or the launch fails. merge_out (a compound plan's later part, issue 42): o and lse (not null)
  // hold another part's rows over disjoint keys, and this forward's rows are merged into them through the LSE in the
  // kernel's epilogue (FusedParams::merge_out) instead of written: only where merges_out() (else Error).
  void run(const Problem& problem, const TensorView& q, const TensorView& k, const TensorView& v,
           const TensorView& o, const TensorView& lse, void* stream = nullptr, bool merge_out = false) const;
  // Whether run may merge its rows into o and lse (merge_out): the plan's row is a cp.async or mma.sync one, whose
  // epilogue can (the TMA and band kernels' cannot).
  bool merges_out() const;

  std::string explain() const;  // the row and why, tile shape, permutation, visited/full/band/bitmask tiles, waste
  int kernel_row() const;       // the kernel-table row the plan chose (plan/kernels.hpp)
  int last_kernel_row() const;  // the row the last run launched (-1 before the first run)
  std::string kernel_name() const;  // kKernels[kernel_row()].name
  const PlanTimes& plan_times() const;  // host build + upload, by stage
  // The planner's cost model for the chosen row: visited tile area (partial tiles at the row's partial cost)
  // times the row's cost per score, over the kept scores; 1.0 = a dense 64x128 tile's cost per score.
  double predicted_cost() const;
  int64_t nnz() const;          // kept (q, k) per head
  int block_m() const;
  int block_n() const;
  int perm_d() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace spattn::cuda::fused
