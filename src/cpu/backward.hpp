// cpu/backward.hpp — the exact (fp64) backward over each row's kept keys: the fused CPU backward's fallback.
#pragma once
#include <cstdint>
#include <vector>

#include "spattn/pattern.hpp"
#include "spattn/tensor.hpp"

namespace spattn::cpu {

// dq [B, Lq, Hq, D], dk [B, Lk, Hkv, D], dv [B, Lk, Hkv, Dv] (f32 or f64, overwritten) of softmax(scale q k^T on
// the pattern) v, from dout [B, Lq, Hq, Dv]; q/k/v/dout fp32, fp64, fp16 or bf16, any strides; for the
// (batch, kv head) groups listed (b * Hkv + hk; every group when empty): dk / dv of that kv head and dq of the
// query heads that share it. Each row's kept keys come from BoundPattern::row (O(nnz * D) a head, never Lq x Lk);
// the softmax is recomputed in fp64 from q and k, so neither O nor the LSE is needed, and a NaN or infinity
// propagates as in the reference backward (spattn/reference.hpp). FusedPlan::backward runs it for the groups its fp32
// kernels cannot finish: non-finite gradients (non-finite inputs, scores past fp32's range), or an LSE past 2^14
// (fused_backward.cpp). Work: one task per group on
// `threads` workers (0: all), each owning its rows (no atomics).
void exact_backward(const std::vector<BoundPattern>& patterns, const Problem& problem, const TensorView& q,
                    const TensorView& k, const TensorView& v, const TensorView& dout, const TensorView& dq,
                    const TensorView& dk, const TensorView& dv, int threads, const std::vector<int64_t>& groups = {});

}  // namespace spattn::cpu
