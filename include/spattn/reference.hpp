// spattn/reference.hpp — the CPU reference attention: fp64 accumulation, straight from the predicate.
#pragma once
#include <vector>

#include "spattn/pattern.hpp"
#include "spattn/tensor.hpp"

namespace spattn::cpu {

// The oracle. For every (b, h, q) it walks every key k and keeps those with pattern.contains(q, k); it
// shares no code with formats, plans or fast kernels. `patterns` holds one pattern for all heads or one per
// query head (per-head patterns). q/k/v may be any dtype and any strides; o must be f32 or f64 with shape
// [B, Lq, Hq, Dv]; lse (f32 or f64, [B, Hq, Lq]) may have a null data pointer. A fully masked row gives
// O = 0 and LSE = -inf.
void reference_attention(const std::vector<BoundPattern>& patterns, const Problem& problem,
                         const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& o, const TensorView& lse);

// The gradients of reference_attention: dq [B, Lq, Hq, D], dk [B, Lk, Hkv, D], dv [B, Lk, Hkv, Dv] (f32 or f64,
// overwritten) from dout [B, Lq, Hq, Dv] (any dtype). The softmax is recomputed in fp64 from q and k (no O or LSE
// taken); a fully masked row contributes nothing. Same oracle rules: every (q, k) tested by pattern.contains.
void reference_attention_backward(const std::vector<BoundPattern>& patterns, const Problem& problem,
                                  const TensorView& q, const TensorView& k, const TensorView& v,
                                  const TensorView& dout, const TensorView& dq, const TensorView& dk,
                                  const TensorView& dv);

}  // namespace spattn::cpu
