// cuda/common/patterns_backward.hpp — the GPU backward as the forward engines' backends see it
// (cuda/fused/backend.cpp and cuda/unfused/backend.cpp both run it). Declared here, below the engine folders, so
// that neither includes cuda/backward, which defines it (csr_backward.cu) with its two passes (tile_backward.hpp,
// csr_backward.hpp): the contract lives in the lower layer and the implementation above it, as plan/backend.hpp
// does for the engines.
#pragma once
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "plan/backend.hpp"
#include "plan/gpu/launch.hpp"
#include "spattn/pattern.hpp"
#include "spattn/tensor.hpp"

namespace spattn::cuda {

class CsrBackward;   // cuda/backward/csr_backward.hpp
class TileBackward;  // cuda/backward/tile_backward.hpp
struct PartsBackward;  // csr_backward.cu: a compound plan's backward by parts

// The backward of a plan's patterns (one for all heads, or one per query head: `of_head`), built lazily at the first
// call (forward-only users pay nothing). Each call runs the tensor-core tile kernel (tile_backward.hpp) where it can
// run the tensors on this device, else the CUDA-core CSR pass; `kernel` forces one ("sm90_bwd" or a row name of
// that kind, "sm90_bwd_ws" (its row of the head dim) or a row name of that kind, "cuda_csr_bwd"; "" chosen; a
// forced tile kernel that cannot run the tensors is an Error with the reason). Per-head patterns run head by head
// on views. With `options` (the fused engine's), a pattern whose forward is a compound split runs its backward by parts
// where plan::backward_parts says so (the first part writes the gradients, the others add to them).
class PatternsBackward {
 public:
  // planned: the plan's distinct patterns, their analyses and which one each query head uses (plan/backend.hpp).
  PatternsBackward(const plan::Planned& planned, Problem problem, std::string kernel,
                   const PlanOptions* options = nullptr);
  ~PatternsBackward();
  void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o, const TensorView& lse,
           const TensorView& dout, const TensorView& dq, const TensorView& dk, const TensorView& dv, void* stream) const;
  int last_kernel_row() const { return last_row_.load(); }  // plan/kernels.hpp row of the last run, -1 before one
  // The last run's kernel: the row's name, "parts(row+row+...)" where a pattern ran by parts, or
  // "sm90_bwd_strips(row)" where it ran on query strips (issue 39: plan::query_strips_asked); "" before a run.
  std::string last_kernel() const;
  // What the backward runs: each pattern's parts and kernels where it was built (at the first run), else what it
  // will decide.
  std::string explain() const;

 private:
  void run_one(size_t i, const Problem& p, const TensorView& q, const TensorView& k, const TensorView& v,
               const TensorView& o, const TensorView& lse, const TensorView& dout, const TensorView& dq,
               const TensorView& dk, const TensorView& dv, int64_t delta_offset, void* stream) const;
  // Builds pattern i's parts (plan::backward_parts) at its first run; false where it runs whole.
  bool parts_ready(size_t i) const;
  // Pattern i's backward on query strips, built at its first run where asked (plan::query_strips_asked); null where
  // they do not fit (strips_why_[i] says why; an Error instead where backward_kernel forced them).
  TileBackward* strips_ready(size_t i, const Problem& p) const;
  void run_parts(size_t i, const Problem& p, const TensorView& q, const TensorView& k, const TensorView& v,
                 const TensorView& o, const TensorView& lse, const TensorView& dout, const TensorView& dq,
                 const TensorView& dk, const TensorView& dv, int64_t delta_offset, void* stream) const;
  std::vector<BoundPattern> patterns_;
  std::vector<plan::Analysis> analyses_;
  std::vector<int> of_head_;
  Problem problem_;
  std::string kernel_;
  plan::BackwardChoice choice_;  // the kernel asked for (plan/gpu/launch.hpp: backward_choice, backward_row)
  mutable std::mutex mu_;
  mutable std::vector<std::unique_ptr<CsrBackward>> csr_;
  mutable std::vector<std::unique_ptr<TileBackward>> tile_;
  mutable std::vector<std::unique_ptr<TileBackward>> strips_;  // query strips, where asked and they fit
  mutable std::vector<std::string> strips_why_;                 // why not, where asked and they do not
  std::vector<plan::QueryStripsGrid> strips_grid_;              // plan::query_strips_grid of each pattern
  mutable std::atomic<bool> last_strips_{false};                // the last run ran on query strips
  mutable float* delta_ = nullptr;  // the CSR pass's scratch, allocated at its first run
  mutable std::atomic<int> last_row_{-1};
  std::optional<PlanOptions> options_;                    // by parts where given
  mutable std::vector<std::unique_ptr<PartsBackward>> parts_;  // per pattern, at its first run
  mutable std::vector<bool> parts_decided_;
  mutable std::string last_parts_;  // "parts(...)" of the last run by parts, else ""
};

}  // namespace spattn::cuda
