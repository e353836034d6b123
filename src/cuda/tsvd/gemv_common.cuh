// cuda/tsvd/gemv_common.cuh — what the two M = 1 kernels share (kernels.cu's tsvd_gemv, which loads the factors with
// 16-byte loads, and wgmma.cu's tsvd_gemv_bulk, which keeps tile rows in flight by bulk copies): the threads' roles,
// the y += p B step on 16-byte vectors, and the end: y_j from the threads' partial sums to Y, or to the split's slot
// with the fixup by the column's last CTA.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/tsvd/kernels.hpp"

namespace spattn::cuda::tsvd::gemv {

// p = x_i A_ij: G threads a rank row (a power of two <= 32, G x rp <= 2 x threads), thread gl of row gq over the
// row's 16-byte vectors gl, gl + G, ... (vk of them). y_j += p B_ij: thread (pn, cn) over B's vector column cn
// (vn a row) and rank rows pn, pn + qph, ...; threads with pn >= qph idle.
struct Roles {
  int G, vk, gq, gl, vn, qph, cn, pn;
};
__device__ __forceinline__ Roles roles(const Params& p, int tid) {
  int G = 1;
  while (G < 32 && 2 * G * p.rp <= kGemvThreads) G *= 2;
  const int vn = p.tile_n / 8;
  return Roles{G, p.tile_k / 8, tid / G, tid % G, vn, kGemvThreads / vn, tid % vn, tid / vn};
}

// The G threads of rank row q add their sums of x_i A_ij's row; the first writes p[q].
__device__ __forceinline__ void rank_row_done(float acc, const Roles& t, float* ps, int q) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2)
    if (o < t.G) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (t.gl == 0) ps[q] = acc;
}

template <bool kBf16>
__device__ __forceinline__ float2 to_float2(uint32_t w) {
  if constexpr (kBf16) return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
  else return __half22float2(*reinterpret_cast<const __half2*>(&w));
}
template <bool kBf16>
__device__ __forceinline__ uint16_t to16(float f) {
  if constexpr (kBf16) return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  else return __half_as_ushort(__float2half_rn(f));
}
// acc[e] += v[e] s over the 8 16-bit values of v.
template <bool kBf16>
__device__ __forceinline__ void fma8(float (&acc)[8], uint4 v, float s) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 f = to_float2<kBf16>(w[e]);
    acc[2 * e] = fmaf(f.x, s, acc[2 * e]);
    acc[2 * e + 1] = fmaf(f.y, s, acc[2 * e + 1]);
  }
}

// The end of CTA (j, s): the threads' sums through `red` (qph x tile_n floats of shared memory) to y_j; with
// p.splits > 1 to slot s, the column's last CTA to arrive adding the slots in split order (deterministic) and
// resetting its counter for the next launch. Every thread of the CTA calls it.
template <bool kBf16>
__device__ __forceinline__ void finish(const Params& p, const Roles& t, const float (&yacc)[8], float* red, int j, int s) {
  __shared__ int s_last;
  const int tid = threadIdx.x;
  auto* Y = static_cast<uint16_t*>(p.y);
  __syncthreads();  // red may alias what the last tile row read
  if (t.pn < t.qph)
#pragma unroll
    for (int e = 0; e < 8; ++e) red[t.pn * p.tile_n + t.cn * 8 + e] = yacc[e];
  __syncthreads();
  const int n0 = j * p.tile_n;
  auto column_sum = [&](int c) {
    float sum = 0.f;
    for (int r = 0; r < t.qph; ++r) sum += red[r * p.tile_n + c];
    return sum;
  };
  if (p.splits == 1) {
    for (int c = tid; c < p.tile_n; c += kGemvThreads) Y[n0 + c] = to16<kBf16>(column_sum(c));
    return;
  }
  for (int c = tid; c < p.tile_n; c += kGemvThreads) p.partial[size_t(s) * p.n + n0 + c] = column_sum(c);
  __threadfence();
  __syncthreads();
  if (tid == 0) s_last = atomicAdd(&p.counters[j], 1) == p.splits - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  for (int c = tid; c < p.tile_n; c += kGemvThreads) {
    float sum = 0.f;
    for (int s2 = 0; s2 < p.splits; ++s2) sum += __ldcg(&p.partial[size_t(s2) * p.n + n0 + c]);
    Y[n0 + c] = to16<kBf16>(sum);
  }
  if (tid == 0) p.counters[j] = 0;
}

}  // namespace spattn::cuda::tsvd::gemv
