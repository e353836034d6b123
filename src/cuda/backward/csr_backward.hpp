// cuda/backward/csr_backward.hpp — the GPU backward pass over the pattern's kept entries (CSR and its transpose).
//
// Correctness first: CUDA cores, a warp per query row (dQ, and delta = rowsum(dO * O)) then a warp per key row
// (dK, dV, over the transposed pattern): no atomics, deterministic, O(nnz * D) a head. The probabilities are
// recomputed from the forward's LSE: P = exp(scale q.k - lse). Not yet the tensor-core kernel the backward issue
// asks for (bench/LOG.md has its speed against FlexAttention's backward).
#pragma once
#include <cstdint>
#include <atomic>
#include <memory>
#include <string>
#include <mutex>
#include <vector>

#include "cuda/backward/tile_backward.hpp"
#include "plan/backend.hpp"
#include "plan/gpu/launch.hpp"
#include "spattn/pattern.hpp"
#include "spattn/tensor.hpp"

namespace spattn::cuda {

class CsrBackward {
 public:
  // Builds the CSR of `pattern` and its transpose on the host and uploads both to the current device.
  explicit CsrBackward(const BoundPattern& pattern);
  ~CsrBackward();
  CsrBackward(const CsrBackward&) = delete;
  CsrBackward& operator=(const CsrBackward&) = delete;

  // q/k/v/o/dout device views [B, L, H, D] of one dtype (bf16, fp16 or f32; head dim contiguous), lse fp32
  // [B, Hq, Lq] from the forward (required; query axis contiguous; any batch and head strides), dq/dk/dv in that
  // dtype. `delta`: fp32 scratch [B, Hq, Lq] with batch and head strides delta_sb, delta_sh.
  void run(const Problem& problem, const TensorView& q, const TensorView& k, const TensorView& v,
           const TensorView& o, const TensorView& lse, const TensorView& dout, const TensorView& dq,
           const TensorView& dk, const TensorView& dv, float* delta, int64_t delta_sb, int64_t delta_sh,
           void* stream) const;

 private:
  int64_t q_len_ = 0, k_len_ = 0;
  int64_t* row_off_ = nullptr;  // [Lq + 1]
  int32_t* cols_ = nullptr;     // [nnz]
  int64_t* col_off_ = nullptr;  // [Lk + 1] (transpose)
  int32_t* rows_ = nullptr;     // [nnz]
};

}  // namespace spattn::cuda

namespace spattn::cuda {

// The backward of a plan's patterns (one for all heads, or one per query head: `of_head`), built lazily at the first
// call (forward-only users pay nothing). Each call runs the tensor-core tile kernel (tile_backward.hpp) where it can
// run the tensors on this device, else the CUDA-core CSR pass; `kernel` forces one ("sm90_bwd" or a row name of
// that kind, "sm90_bwd_ws" (its row of the head dim) or a row name of that kind, "cuda_csr_bwd"; "" chosen; a
// forced tile kernel that cannot run the tensors is an Error with the reason). Per-head patterns run head by head on views.
class PatternsBackward {
 public:
  // planned: the plan's distinct patterns, their analyses and which one each query head uses (plan/backend.hpp).
  PatternsBackward(const plan::Planned& planned, Problem problem, std::string kernel);
  ~PatternsBackward();
  void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o, const TensorView& lse,
           const TensorView& dout, const TensorView& dq, const TensorView& dk, const TensorView& dv, void* stream) const;
  int last_kernel_row() const { return last_row_.load(); }  // plan/kernels.hpp row of the last run, -1 before one

 private:
  void run_one(size_t i, const Problem& p, const TensorView& q, const TensorView& k, const TensorView& v,
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
  mutable float* delta_ = nullptr;  // the CSR pass's scratch, allocated at its first run
  mutable std::atomic<int> last_row_{-1};
};

}  // namespace spattn::cuda
