// cpu/backward.hpp — the CPU engine's backward pass (Plan::backward on Device::cpu()).
#pragma once
#include <vector>

#include "spattn/pattern.hpp"
#include "spattn/tensor.hpp"

namespace spattn::cpu {

// dq [B, Lq, Hq, D], dk [B, Lk, Hkv, D], dv [B, Lk, Hkv, Dv] (f32 or f64, overwritten) of softmax(scale q k^T on
// the pattern) v, from dout [B, Lq, Hq, Dv]; q/k/v/dout fp32, fp64, fp16 or bf16, any strides. Each row's kept keys
// come from BoundPattern::row (cost O(nnz * D) a head, never Lq x Lk); the softmax is recomputed in fp64 from q and
// k, so neither O nor the LSE is needed. Work: one task per (batch, kv head) on `threads` workers (0: all), each
// owning its dk / dv rows and the dq rows of the query heads that share the kv head (no atomics).
void attention_backward(const std::vector<BoundPattern>& patterns, const Problem& problem, const TensorView& q,
                        const TensorView& k, const TensorView& v, const TensorView& dout, const TensorView& dq,
                        const TensorView& dk, const TensorView& dv, int threads);

}  // namespace spattn::cpu
