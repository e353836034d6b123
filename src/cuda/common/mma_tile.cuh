// cuda/common/mma_tile.cuh — device helpers of the tensor-core tiles, shared by the fused forward (cuda/fused), the
// tile backward (cuda/backward) and the TSVD matmul (cuda/tsvd): the 128-byte-swizzled shared-memory layout and its
// affine row gather, wgmma descriptors and fragments (wgmma_ops.cuh: the ops), 16-bit packing, and the masks of an
// m64 accumulator fragment. The kernels' own loops, softmax and epilogues stay in their folders.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/ptx.cuh"
#include "cuda/common/wgmma_ops.cuh"

namespace spattn::cuda::mma {
using namespace ::spattn::cuda::ptx;

#ifdef SPATTN_WGMMA
inline constexpr bool kWgmmaAvailable = true;
#else
inline constexpr bool kWgmmaAvailable = false;
#endif

// Byte offset of 16-byte chunk `chunk` (8 elements) of row `row` in a ROWS x D tile stored as D/64 column
// blocks of ROWS x 128 B, 128-byte swizzle (chunk ^= row % 8): the canonical SW128 K-major layout of wgmma
// for Q and K, and its N-major layout for V.
template <int ROWS>
__device__ __forceinline__ uint32_t sw_off(int row, int chunk) {
  return uint32_t((chunk >> 3) * ROWS * 128 + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

// Token of plan-space position p (see BlockPlan::token).
__device__ __forceinline__ int plan_token(int p, int perm_d, int group) {
  if (perm_d == 1) return p;
  const int g = p / group;
  return g + (p - g * group) * perm_d;
}

// Gathers ROWS rows (plan positions p0... of the affine perm_d layout) of a [.., L, .., D] tensor into a swizzled
// tile (sw_off) with cp.async, NT threads; rows whose token is out of range are zero-filled (never read from memory).
template <int ROWS, int D, int NT>
__device__ __forceinline__ void load_rows(uint32_t sdst, const char* gbase, int64_t row_stride_bytes, int p0, int len,
                                          int perm_d, int group, int tid) {
  constexpr int CH = D / 8;
  static_assert((ROWS * CH) % NT == 0, "tile copy splits evenly");
  static_assert((NT / CH) % 8 == 0, "each thread keeps its swizzle phase from copy to copy");
  // A tile never straddles two residue groups (the plan pads groups to whole tiles), so its tokens are affine
  // in the row: t0 + row * perm_d.
  const int t0 = plan_token(p0, perm_d, group);
  if (t0 + (ROWS - 1) * perm_d < len) {
    // Fast path (every row in range): one address computed, then fixed strides; each thread copies rows
    // row0 + j * NT/CH, chunk ch, and its swizzled offset advances by a constant.
    const int row0 = tid / CH, ch = tid % CH;
    const int64_t rs = int64_t(perm_d) * row_stride_bytes;
    const char* src = gbase + int64_t(t0) * row_stride_bytes + row0 * rs + ch * 16;
    const int64_t step = int64_t(NT / CH) * rs;
    const uint32_t dst = sdst + sw_off<ROWS>(row0, ch);
#pragma unroll
    for (int j = 0; j < ROWS * CH / NT; ++j) cp_async16(dst + j * (NT / CH) * 128, src + j * step, 16);
    return;
  }
#pragma unroll
  for (int i = tid; i < ROWS * CH; i += NT) {
    const int row = i / CH, ch = i % CH;
    const int tok = plan_token(p0 + row, perm_d, group);
    const bool ok = tok < len;
    const char* src = gbase + (ok ? int64_t(tok) * row_stride_bytes + ch * 16 : 0);
    cp_async16(sdst + sw_off<ROWS>(row, ch), src, ok ? 16 : 0);
  }
}

template <bool kBf16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (kBf16) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}
// The inverse: a 32-bit word's two 16-bit values as floats.
template <bool kBf16>
__device__ __forceinline__ float2 unpack2(uint32_t w) {
  if constexpr (kBf16) return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
  else return __half22float2(*reinterpret_cast<const __half2*>(&w));
}

// ---- wgmma helpers (sm_90a) ----
// Shared-memory matrix descriptors (128-byte swizzle, SBO 1024 B = 8 rows x 128 B) in two halves: the low word
// holds the start address >> 4 and the LBO (16 B, unused, for K-major operands; for N-major V the distance
// between 64-wide column blocks), the high word is constant. A byte offset is added to the low word as
// offset >> 4 while the start stays below 2^18 (every shared address does; the field is 14 bits), so a loop
// advances a descriptor by one add instead of a mask, shift and or each time (the band kernel's step loop
// computes 12 a step: 727 -> 696 instructions, +2-4% on local and causal).
__device__ __forceinline__ uint32_t desc_lo(uint32_t addr, uint32_t lbo_bytes) {
  return ((addr & 0x3FFFF) >> 4) | ((lbo_bytes >> 4) << 16);
}
__device__ __forceinline__ uint64_t desc_of_lo(uint32_t lo) {
  return uint64_t(lo) | (uint64_t(64) << 32) | (uint64_t(1) << 62);
}

// Valid keys of a key tile starting at plan position k0 (the rest is padding or past Lk), for a plan of k_len keys
// in residue groups of k_group positions (perm_d groups; identity where perm_d is 1). The backward's too.
__device__ __forceinline__ int keys_valid(int k0, int k_len, int perm_d, int k_group) {
  if (perm_d == 1) return k_len - k0;
  const int g = k0 / k_group, j0 = k0 - g * k_group;
  const int ng = g < k_len ? (k_len - g + perm_d - 1) / perm_d : 0;
  return ng - j0;
}
// s = -inf where drop(c, hh): this thread's fragment of an m64 wgmma accumulator (N floats, rows r and r + 8 as hh =
// 0, 1; columns 8j + cb + ee, cb = 2 (lane & 3)), c = 8j + ee its column less cb (a compile-time constant once
// unrolled). The one loop of the masks: forward band tiles (with a key prefix too) and the backward's.
template <int N, class Drop>
__device__ __forceinline__ void mask_fragment(float (&s)[N], Drop drop) {
#pragma unroll
  for (int j = 0; j < N / 4; ++j)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int ee = 0; ee < 2; ++ee)
        if (drop(8 * j + ee, hh)) s[4 * j + 2 * hh + ee] = -INFINITY;
}
// Bitmask of a BN-wide S tile: column c of row hh is kept iff bit c % 64 of mw[hh][c / 64] is set. The words are
// shifted by the thread's first column cb once, so that each score's bit sits at a compile-time position (8j + ee):
// a test and a select a score instead of a 64-bit shift by a variable amount (c & 63) each.
template <int BN>
__device__ __forceinline__ void tile_mask_bits(float (&s)[BN / 2], const unsigned long long (&mw)[2][BN / 64], int cb) {
  uint32_t half[2][BN / 32];  // (word >> cb)'s 32-bit halves: bits 32i ... 32i + 31
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
#pragma unroll
    for (int w = 0; w < BN / 64; ++w) {
      const unsigned long long x = mw[hh][w] >> cb;  // cb + ee < 8 and 8j % 64 <= 56: no bit crosses a word
      half[hh][2 * w] = uint32_t(x);
      half[hh][2 * w + 1] = uint32_t(x >> 32);
    }
  mask_fragment(s, [&](int c, int hh) { return ((half[hh][c >> 5] >> (c & 31)) & 1u) == 0u; });
}
// P as wgmma A fragments (registers).
template <int BN, bool kBf16>
__device__ __forceinline__ void tile_to_p(const float (&s)[BN / 2], uint32_t (&pa)[BN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    pa[kk][0] = pack2<kBf16>(s[8 * kk + 0], s[8 * kk + 1]);
    pa[kk][1] = pack2<kBf16>(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = pack2<kBf16>(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = pack2<kBf16>(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

}  // namespace spattn::cuda::mma
