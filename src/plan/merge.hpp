// plan/merge.hpp — the one merge primitive of partial attentions (KERNELS.md section 3), for host and device code.
//
// Two partial results of one query row over disjoint key sets, each normalised with its own log-sum-exp,
// (o_a, lse_a) and (o_b, lse_b), give the row over the union:
//   lse = log(exp(lse_a) + exp(lse_b)),   o = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b.
// An empty part (lse = -inf) weighs nothing, so that -inf - -inf never appears; two empty parts give an empty row
// (o = 0, lse = -inf); a NaN lse poisons the row. Compound plans (plan/parts.hpp) merge every part through this.
#pragma once
#include <cmath>

#if defined(__CUDACC__)
#define SPATTN_HOST_DEVICE __host__ __device__
#else
#define SPATTN_HOST_DEVICE
#endif

namespace spattn::plan {

struct MergeWeights {
  float wa, wb, lse;
};

SPATTN_HOST_DEVICE inline MergeWeights merge_weights(float lse_a, float lse_b) {
  if (lse_a != lse_a || lse_b != lse_b) return {NAN, NAN, NAN};
  if (lse_b == -INFINITY) return {lse_a == -INFINITY ? 0.f : 1.f, 0.f, lse_a};
  if (lse_a == -INFINITY) return {0.f, 1.f, lse_b};
  const float m = fmaxf(lse_a, lse_b);
  const float ea = expf(lse_a - m), eb = expf(lse_b - m), s = ea + eb;
  return {ea / s, eb / s, m + logf(s)};
}

}  // namespace spattn::plan
