// cuda/backward/csr_backward.hpp — the GPU backward pass over the pattern's kept entries (CSR and its transpose).
//
// Correctness first: CUDA cores, a warp per query row (dQ, and delta = rowsum(dO * O)) then a warp per key row
// (dK, dV, over the transposed pattern): no atomics, deterministic, O(nnz * D) a head. The probabilities are
// recomputed from the forward's LSE: P = exp(scale q.k - lse). Not yet the tensor-core kernel the backward issue
// asks for (bench/LOG.md has its speed against FlexAttention's backward).
#pragma once
#include <cstdint>
#include <vector>

#include "spattn/pattern.hpp"
#include "spattn/tensor.hpp"

namespace spattn::cuda {

class CsrBackward {
 public:
  // Builds the CSR of `pattern` and its transpose on the host and uploads both to the current device.
  explicit CsrBackward(const BoundPattern& pattern);
  // The same over a given CSR of lengths q_len x k_len (row q keeps cols[offsets[q] .. offsets[q + 1]), keys
  // increasing in a row): a part of a compound plan (plan::BackwardPart).
  CsrBackward(int64_t q_len, int64_t k_len, const std::vector<int64_t>& offsets, const std::vector<int32_t>& cols);
  ~CsrBackward();
  CsrBackward(const CsrBackward&) = delete;
  CsrBackward& operator=(const CsrBackward&) = delete;

  // q/k/v/o/dout device views [B, L, H, D] of one dtype (bf16, fp16 or f32; head dim contiguous), lse fp32
  // [B, Hq, Lq] from the forward (required; query axis contiguous; any batch and head strides), dq/dk/dv in that
  // dtype. `delta`: fp32 scratch [B, Hq, Lq] with batch and head strides delta_sb, delta_sh. accumulate: dq, dk, dv
  // get this pattern's gradients added to what they hold (a later part of a compound plan), else written.
  // rows_kernels: the passes of scattered_backward.hpp (cuda_scattered_bwd: eight lanes a row, 16-byte gathers) where
  // they take the tensors (bf16 / fp16, head dim 64 or 128, 16-byte aligned rows); else this header's warp-a-row
  // passes (4.04x slower on local(256) | random(8)'s scattered part, H200; bench/LOG.md). Returns whether the rows
  // kernels ran.
  bool run(const Problem& problem, const TensorView& q, const TensorView& k, const TensorView& v,
           const TensorView& o, const TensorView& lse, const TensorView& dout, const TensorView& dq,
           const TensorView& dk, const TensorView& dv, float* delta, int64_t delta_sb, int64_t delta_sh,
           void* stream, bool accumulate = false, bool rows_kernels = false) const;

 private:
  void upload_csr(const std::vector<int64_t>& offsets, const std::vector<int32_t>& cols);
  int64_t q_len_ = 0, k_len_ = 0;
  int64_t* row_off_ = nullptr;  // [Lq + 1]
  int32_t* cols_ = nullptr;     // [nnz]
  int64_t* col_off_ = nullptr;  // [Lk + 1] (transpose)
  int32_t* rows_ = nullptr;     // [nnz]
  int32_t* key_order_ = nullptr;  // [Lk]: keys by their queries, most first (the rows kernels' dK/dV pass)
};

}  // namespace spattn::cuda
