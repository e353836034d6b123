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

}  // namespace spattn::cpu
