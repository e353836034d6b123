// cuda/fused/fused_fwd.hpp — host handle of the fused block-sparse attention forward kernel.
//
//   Arguments      what the caller gives (problem + tensor views)
//   can_implement  a Status with the reason, never aborts (the views' shapes: the caller's, checked once a call by
//                  Plan::forward)
//   workspace_size always 0: the plan is uploaded once (DevicePlan) and reused by every run
//   to_params/run  run(params, stream) is relaunchable and capturable in a CUDA graph (no allocation, no sync;
//                  the TMA kernels reset their work counters themselves at the end of each launch)
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "common/status.hpp"
#include "cuda/common/buffer.hpp"
#include "cuda/fused/fused_params.hpp"
#include "plan/gpu/block_plan.hpp"
#include "plan/gpu/launch.hpp"
#include "spattn/tensor.hpp"

namespace spattn::cuda::fused {

using common::Status;  // common/status.hpp

// A BlockPlan uploaded to the current CUDA device (its arrays in one block of the device pool), with the kernel-table row chosen to
// run it (plan/kernels.hpp; a run may fall back from it where the tensors' strides admit no tensor map:
// FusedFwd::to_params).
class DevicePlan {
 public:
  DevicePlan(plan::BlockPlan host, int kernel_row);
  ~DevicePlan();
  DevicePlan(const DevicePlan&) = delete;
  DevicePlan& operator=(const DevicePlan&) = delete;

  const plan::BlockPlan& host() const { return host_; }
  int kernel_row() const { return kernel_row_; }
  int device() const { return device_; }
  const int64_t* row_offsets() const { return row_offsets_; }
  const int4* entries() const { return entries_; }
  const unsigned long long* masks() const { return masks_; }
  const int32_t* order() const { return order_; }
  const int32_t* q_map() const { return q_map_; }  // mapped plans' maps (BlockPlan::q_map / k_map), else null
  const int32_t* k_map() const { return k_map_; }
  double upload_ms() const { return upload_ms_; }
  int64_t narrow_entries() const { return narrow_; }  // entries run as one 64-key half (64x128 plans)
  // plan::list_shape of the query tiles' lists (set_list_shape: where the lists are written on the device)
  const plan::ListShape& list_shape() const { return shape_; }
  void set_list_shape(const plan::ListShape& s) { shape_ = s; }
  // The TMA kernels' work-item counter: left zero by every launch (the kernels reset it), so runs of one plan on
  // one stream (or in one graph) may follow each other freely; concurrent runs on two streams need two plans.
  int* work_counter() const { return work_counter_; }
  // Ints at work_counter(), zeroed at upload and left zero by every launch (the kernels reset them): the item
  // counter, the count of CTAs done drawing, then the band kernel's split counters (kSplitWarps per part of the
  // workspace).
  size_t counter_ints() const { return 2 + size_t(split_cap_) * kSplitWarps; }
  // The band kernel's split workspace (plans the band kernel runs; else null): split_cap() parts, one per SM
  // (consumer warps x 32 x split_floats(D) floats each: 7.3 MB at D=64, 9.2 MB at D=128 on a 132-SM H100).
  float* split_ws() const { return split_ws_; }
  int split_cap() const { return split_cap_; }

 private:
  plan::BlockPlan host_;
  DeviceBuffer block_;  // every array below
  int kernel_row_ = -1;
  int device_ = 0;
  int64_t* row_offsets_ = nullptr;
  int4* entries_ = nullptr;
  unsigned long long* masks_ = nullptr;
  int32_t* order_ = nullptr;
  int32_t* q_map_ = nullptr;
  int32_t* k_map_ = nullptr;
  int* work_counter_ = nullptr;
  float* split_ws_ = nullptr;
  int split_cap_ = 0;
  double upload_ms_ = 0;
  int64_t narrow_ = 0;
  plan::ListShape shape_;
};

class FusedFwd {
 public:
  struct Arguments {
    Problem problem;
    TensorView q, k, v, o, lse;  // lse.data may be null
    // The planner's policy (plan::LaunchDecision): TMA and band kernels: 1 persistent CTAs, 0 one work item a CTA;
    // band kernel: the split rule (plan::FusedOptions::split: -1 chosen, 0 never, 1 the last items as slabs, 2-4 the
    // last items in that many parts over their keys), applied by plan::choose_split to the launch's items.
    int persistent = 1;
    int split = -1;
  };
  using Params = LaunchParams;

  // With `params`, also fills the launch parameters when the check passes (to_params: no second tensor-map
  // encoding for the caller that runs right after).
  static Status can_implement(const Arguments& args, const DevicePlan& plan, Params* params = nullptr);
  static size_t workspace_size(const Arguments&) { return 0; }
  // Requires can_implement(args, plan).
  static Params to_params(const Arguments& args, const DevicePlan& plan);
  // Launches on `stream`; throws spattn::Error on a launch error.
  static void run(const Params& params, cudaStream_t stream);
  // The kernel's name for a configuration (for explain and bench rows): its table row and dtype.
  static std::string kernel_name(const Params& params);
};

}  // namespace spattn::cuda::fused
