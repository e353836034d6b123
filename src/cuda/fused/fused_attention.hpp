// cuda/fused/fused_attention.hpp — the fused GPU backend of spattn::Plan (include/spattn/plan.hpp): the fused
// block-sparse flash-attention forward.
//
//   spattn::FusedAttention attn(bound, /*head_dim=*/64);       // builds the tile plan, uploads it once
//   if (auto st = attn.can_implement(problem, q, k, v, o, lse); !st.ok) ... st.reason ...
//   attn.run(problem, q, k, v, o, lse, stream);                // relaunchable, graph-capturable
//
// One FusedAttention may run any number of times on one stream (or in one graph); runs on two streams at once
// need two objects (the sm_90a kernel keeps a work counter with the plan, reset by each run).
//
// Tensors are device pointers in TensorViews ([B, L, H, D], head dim contiguous); bf16 or fp16; head dim
// 64 or 128; GQA (Hq % Hkv == 0); lse [B, Hq, Lq] (shape {B, Hq, Lq, 1}) fp32 natural log, optional.
// The kernel that runs is a row of the kernel table (plan/kernels.hpp), chosen once at construction
// (kernel_row()); a run falls back from it only where the tensors' strides admit no tensor map, and records the
// row it launched (last_kernel_row()).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "plan/analysis.hpp"
#include "spattn/pattern.hpp"
#include "spattn/tensor.hpp"

namespace spattn {

struct FusedOptions {
  int block_m = 0, block_n = 0;  // 0: chosen by the planner (64x64, 64x128, 128x128, 192x128)
  int perm_d = -1;               // -1: chosen (residue grouping for dilated/strided rows); 1: none
  int tile_map = -1;             // neighborhood patterns of 2-3 axes: -1 chosen, 0 never, 1 always a tile map
                                 // (multi-dimensional tiles, plan/tile_map.hpp; cp.async / mma.sync kernels),
                                 // 2 key strips (64x64 tiles, plan/gpu/block_plan.hpp)
  bool force_sm80 = false;       // run the mma.sync kernel on Hopper too (tests)
  bool tma = true;               // sm_90a: the warp-specialized TMA kernel where it applies (128/192-row
                                 // tiles, no permutation, strides a tensor map accepts); false: cp.async kernels
  int persistent = -1;           // TMA kernel: 1 one CTA per SM drawing work items, 0 one item a CTA, -1 chosen
  int band = -1;                 // band-row patterns (local, sliding windows, causal) at head dim 64 on sm_90a:
                                 // -1 chosen, 1 the band kernel (64-row slabs over 64-key chunks), 0 never
  int split = -1;                // band kernel: -1 chosen: where the items are fewer than the SMs, every item
                                 // in parts over its keys (merged by the last part); where the last partial
                                 // wave's items fit in one wave as single 64-row slabs (and are not the list's
                                 // cheap items), those items as slabs; 0 never, 1 the last items (up to one per
                                 // SM) as slabs, 2-4 the last items (up to one part per SM) in that many parts
  int device_draw = -1;          // random(r) patterns whose every tile holds kept keys (block_plan.hpp,
                                 // drawn_masks_apply): -1 their bitmasks drawn on the device at upload
                                 // (cuda/fused/random_rows.hpp), 0 drawn on the host and copied
  int running_max = -1;          // band kernel: -1 chosen (rows keeping 1536 keys or more on average), 1 the
                                 // exponentials of a row's later 128-key steps against its running maximum
                                 // (rescaled only when the maximum rises; a step whose exponentials overflow runs
                                 // again exactly), 0 every step's exact row maximum first
};

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

struct FusedStatus {
  bool ok = true;
  std::string reason;
};

class FusedAttention {
 public:
  // Builds the plan on the host and uploads it to the current CUDA device. Throws Error. `analysis`:
  // plan::analyze(pattern) where the caller has it (make_plan), else computed here.
  FusedAttention(const BoundPattern& pattern, int64_t head_dim, const FusedOptions& options = {},
                 const plan::Analysis* analysis = nullptr);
  ~FusedAttention();
  FusedAttention(FusedAttention&&) noexcept;
  FusedAttention& operator=(FusedAttention&&) noexcept;

  FusedStatus can_implement(const Problem& problem, const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& o, const TensorView& lse) const;
  size_t workspace_size(const Problem&) const { return 0; }
  // Enqueues the forward on `stream` (a cudaStream_t, null for the default stream). Throws Error when
  // can_implement fails or the launch fails.
  void run(const Problem& problem, const TensorView& q, const TensorView& k, const TensorView& v,
           const TensorView& o, const TensorView& lse, void* stream = nullptr) const;

  std::string explain() const;  // tile shape, permutation, visited/full/band/bitmask tiles, waste
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

}  // namespace spattn
