// cuda/backward/tile_bwd.cuh — the tensor-core backward pass over a key-major tile plan (sm_90a, wgmma).
//
// FlashAttention-2/3's structure over the plan's tiles (plan/key_plan.hpp): one CTA per (key tile of BN keys,
// batch, kv head) keeps its K and V tile and its dK, dV accumulators on chip and walks the query tiles (64 rows)
// that visit the key tile, for every query head of its group (GQA: dK, dV summed over the group in registers):
//   S^T  = K Q^T            wgmma SS (K and Q K-major)          } each warpgroup: its 64 keys x the 64 queries
//   dP^T = V dO^T           wgmma SS                             }
//   P^T  = exp2(S^T scale log2 e - lse log2 e), masked (full / band / transposed bitmask entries)
//   dS^T = P^T (dP^T - delta)
//   dV  += P^T dO           wgmma RS (P from registers, dO MN-major)
//   dK  += dS^T Q           wgmma RS (Q MN-major)
//   dQ   = dS K             wgmma SS_TT (dS^T through shared memory, K MN-major): warpgroup w the columns
//                           [w D/2, (w+1) D/2), added to an fp32 accumulator in plan space by red.global.add.v2
// Q, dO, the rows' lse and delta come in by cp.async, double-buffered (the next step's while this one computes).
// Prep kernel: delta = rowsum(dO o O) and lse * log2 e (+inf where a row is padding or kept no key: P = 0) in plan
// space, the dQ accumulator zeroed. Finish kernels: dQ = scale * accumulator, at the rows' tokens
// (bwd_finish_grid_kernel for this file's row-major accumulator, bwd_finish_tile_kernel for the warp-specialized
// rows' order).
//
// Out-of-range keys need no mask in full tiles (a full tile has every key in range) and are masked in band tiles
// (kvalid) and bitmask tiles (no bit); padding query rows have lse +inf, so P = 0 there.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/mma_tile.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/tmap.hpp"
#include "cuda/common/work_order.cuh"
#include "plan/key_strips.hpp"  // plain constexpr: a query strip's slot -> token

namespace spattn::cuda::bwd {

struct BwdParams {
  const void *q, *k, *v, *o, *dout;  // [B, L, H, D], head dim contiguous
  void *dq, *dk, *dv;
  int64_t q_sb, q_sl, q_sh, k_sb, k_sl, k_sh, v_sb, v_sl, v_sh, o_sb, o_sl, o_sh, do_sb, do_sl, do_sh;
  int64_t dq_sb, dq_sl, dq_sh, dk_sb, dk_sl, dk_sh, dv_sb, dv_sl, dv_sh;
  const float* lse;  // [B, Hq, Lq] (strides lse_sb, lse_sh; query axis contiguous)
  int64_t lse_sb, lse_sh;
  float* dq_acc;     // [B * Hq, QP, D] fp32, plan space
  float* lse2;       // [B * Hq, QP]: lse * log2 e, +inf for padding / empty rows
  float* delta;      // [B * Hq, QP]
  int batch, q_heads, kv_heads, group;
  int q_len, k_len, perm_d, q_group, k_group;
  int qp;  // plan-space query positions: q_tiles * 64
  int head_dim;
  float scale, scale_log2;
  const int64_t* col_offsets;
  const int4* entries;  // {query tile, mask, lo, hi}
  int dq_accumulate;    // finish: dq += scale * accumulator (a later part of a compound plan), else dq =
  int dkv_accumulate;   // epilogue: dk, dv += the tile's (a later tile part: the affine part), else written; key
                        // tiles without entries then add nothing and return at once
  const unsigned long long* masks;
  const int32_t* order;
  int k_tiles;
  // The TMA variant (tile_bwd_kernel<Tr, true>: identity plans whose q and dout admit tensor maps): q's and dout's
  // maps ({D, L, H, B}, boxes of 64 elements x 64 rows, 128-byte swizzle).
  TensorMapBytes tmap_q, tmap_do;
  // The warp-specialized kernels' shared-memory epilogue (SmemEpilogue traits): dk's and dv's
  // maps ({D, Lk, Hk, B}, the same boxes), their stores clipped at k_len.
  TensorMapBytes tmap_dk, tmap_dv;
  // Query strips (tile_bwd_kernel<Tr, false, true>; plan/key_plan.hpp, key_major_strips): key row r of key tile kt is
  // token k_map[kt * BN + r] (-1: padding); a step's query row r is slot r of its entry's strip, token
  // strip_token(e.z, e.w, r, strip_sx, strip_sy) (-1: padding); lse2, delta and the dQ accumulator are in token order
  // (perm_d 1, qp the query length rounded up to whole 64-row tiles). Null where the plan has no strips.
  const int32_t* k_map;
  int strip_sx, strip_sy;
  // The grid's head sections (plan::head_section; section_item in cuda/common/work_order.cuh): 0 none.
  int head_section;
  // The persistent D = 64 grid's item counter (tile_bwd_ws2.cuh, Ws2Items; zeroed before its launch); else unused.
  int* work_counter;
  // dQ's first writes (the D = 128 warp-specialized row on the persistent grid; tile_bwd_ws.cuh, ws_write_dq):
  // dq_owner[query tile] is the key tile whose step stores the tile's accumulator (a bulk copy, no add) and then sets
  // dq_ready[(b Hq + h) qp / 64 + query tile] (gpu scope; prep zeroes the flags and leaves the accumulator); every
  // other step waits for the flag, then adds. The owner is the tile's first key tile in the grid's item order, so a
  // step waits only on an item taken before its own. dq_rev: the items walk their entries last first (where the
  // owners' tiles sit at their ends). Null dq_owner: prep zeroes the accumulator and every step adds.
  const int32_t* dq_owner;
  int* dq_ready;
  int dq_rev;
};

// BN = 128 keys a CTA: two warpgroups (64 keys each), dQ's columns split between them (a CTA barrier between dS
// and dQ); BN = 64: one warpgroup, dQ over its own keys, two CTAs an SM (each dQ element gets twice the atomics).
template <int BN_, int D_, bool kBf16_>
struct BwdTraits {
  static constexpr int BM = 64, BN = BN_, D = D_, kThreads = 2 * BN;
  static constexpr int kMinBlocks = BN == 64 ? 2 : 1;
  static constexpr bool kBf16 = kBf16_;
  static constexpr int kKV = BN * D * 2;  // a K or V tile
  static constexpr int kQ = BM * D * 2;   // a Q or dO tile
  static constexpr int kDS = BN * BM * 2;
  static constexpr int kOffV = kKV, kOffStage = 2 * kKV;  // stage s: Q at kOffStage + 2 s kQ, dO after it
  static constexpr int kOffDS = kOffStage + 4 * kQ;
  static constexpr int kOffRows = kOffDS + kDS;  // stage s: lse2 at + 2 s BM * 4, delta after it
  static constexpr int kOffBar = kOffRows + 4 * BM * 4;  // the TMA variant's two stages' mbarriers
  static constexpr int kStepBytes = 2 * kQ + 2 * BM * 4;  // Q, dO, lse2, delta of a step
  static constexpr int kSmemBytes = kOffBar + 16 + 1024;
  using Elem = typename std::conditional<kBf16, __nv_bfloat16, __half>::type;
};

inline constexpr int kFullEntry = -1;  // plan::kFull

namespace detail {
using namespace ::spattn::cuda::ptx;
using mma::desc_lo;
using mma::desc_of_lo;
using mma::load_rows;
using mma::pack2;
using mma::unpack2;
using mma::plan_token;
using mma::sw_off;

__device__ __forceinline__ float2 ld_shared_f2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ void red_add_v2(float* addr, float a, float b) {
  SPATTN_SM90A_ONLY(asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(addr), "f"(a), "f"(b) : "memory"));
}
// 4 bytes from global to shared memory; src_bytes 0: zero-filled, the source never read.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
// Query strips: ROWS rows of a [.., L, .., D] tensor gathered into a swizzled tile (sw_off) by cp.async, row r from
// token tok(r); a token outside [0, len) (padding: -1) is zero-filled, never read.
template <int ROWS, int D, int NT, class Tok>
__device__ __forceinline__ void gather_rows(uint32_t sdst, const char* gbase, int64_t row_stride_bytes, int len, int tid,
                                            Tok&& tok) {
  constexpr int CH = D / 8;
  static_assert((ROWS * CH) % NT == 0 && NT % CH == 0, "tile copy splits evenly");
#pragma unroll
  for (int j = 0; j < ROWS * CH / NT; ++j) {
    const int row = tid / CH + j * (NT / CH), ch = tid % CH;
    const int t = tok(row);
    const bool ok = unsigned(t) < unsigned(len);
    cp_async16(sdst + sw_off<ROWS>(row, ch), gbase + (ok ? int64_t(t) * row_stride_bytes + ch * 16 : 0), ok ? 16 : 0);
  }
}
// Slot r of a query strip (an entry's z, w words: base token, strip_pack(W, count)): its token, -1 for padding.
__device__ __forceinline__ int strip_slot(const int4& e, int r, int sx, int sy) {
  return ::spattn::plan::strip_token(e.z, e.w, r, sx, sy);
}


// ---- a step's pieces, shared by tile_bwd_kernel and the warp-specialized tile_bwd_ws_kernel (tile_bwd_ws.cuh).
// Tr: BM, BN, D, kBf16, Elem. A warpgroup owns 64 keys of the key tile (its thread's rows kr0, kr0 + 8) and
// sees the step's 64 queries.

// A wgmma operand: the descriptor of the tile at its address + 16 off bytes (at(off)). DescLo: off added to the low
// word before the constant high word is set (UIADD3 + UMOV a wgmma: ptxas rewrites a wgmma's descriptor registers
// every time). Desc64 (the warp-specialized kernels): off added to the whole 64-bit descriptor (one UIADD3.64,
// CUTLASS's descriptor iterators' way), built once where the caller hoists it. The same bits: lo + off never carries
// out of the low word (a shared-window offset >> 4 is below 2^14).
struct DescLo {
  uint32_t lo;
  __device__ __forceinline__ uint64_t at(uint32_t off) const { return desc_of_lo(lo + off); }
};
struct Desc64 {
  uint64_t d;
  __device__ __forceinline__ uint64_t at(uint32_t off) const { return d + off; }
  __device__ __forceinline__ Desc64 operator+(uint32_t off) const { return {d + off}; }
};
// The operand at shared address addr, leading-byte offset lbo. Desc64's descriptor is opaque to the compiler: knowing
// the address's alignment, it would otherwise OR the offsets into the low word (and re-set the high word again).
template <bool k64>
__device__ __forceinline__ auto operand(uint32_t addr, uint32_t lbo) {
  if constexpr (k64) {
    uint64_t d = desc_of_lo(desc_lo(addr, lbo));
    asm("" : "+l"(d));
    return Desc64{d};
  } else {
    return DescLo{desc_lo(addr, lbo)};
  }
}

// acc = A B^T, this warpgroup's 64 keys x the step's queries: A (K or V rows of the warpgroup, in a BN-row tile), B
// (Q or dO, K-major), both leading-byte offset 16: S^T or dP^T. Issue only (the caller fences and commits).
template <class Tr, class O>
__device__ __forceinline__ void mma_keys_queries(float (&acc)[Tr::BM / 2], const O& a, const O& b) {
#pragma unroll
  for (int kk = 0; kk < Tr::D / 16; ++kk)
    ::spattn::cuda::wgmma::Op<Tr::BM, Tr::kBf16>::ss(acc, a.at((kk / 4) * Tr::BN * 8 + (kk % 4) * 2),
                                                     b.at((kk / 4) * Tr::BM * 8 + (kk % 4) * 2), kk > 0 ? 1 : 0);
}
template <class Tr>
__device__ __forceinline__ void mma_keys_queries(float (&acc)[Tr::BM / 2], uint32_t s_a, uint32_t s_b) {
  mma_keys_queries<Tr>(acc, operand<false>(s_a, 16), operand<false>(s_b, 16));
}

// Partial tiles: S^T = -inf where entry `e` does not keep the score. Band (e.y == -2): kept iff
// e.z <= kp - qp <= e.w; bitmask (e.y >= 0): mw, this thread's rows' words of the transposed mask. In two parts:
// StepMask (four words a thread: the band's first column and width of each row, or the mask words) needs only the
// entry, so it is built before the step's wgmma; apply_mask after it (the entry itself is no longer live then).
struct StepMask {
  int kind;     // -1 full, -2 band, else bitmask
  uint32_t a[4];  // band: first[hh], width[hh] at 2 hh, 2 hh + 1; bitmask: mw[hh]'s low, high words
};
// kBandBits (the warp-specialized kernels): a band row's kept columns [a, z] as a mask word instead (bits a ... z:
// kind 0, a bitmask tile to apply_mask), whose test is one bit a score (a predicate from R2P, a select) where the
// band's is a subtraction, a compare and a select.
template <int BM, bool kBandBits = false>
__device__ __forceinline__ StepMask step_mask(const int4& e, int k0, int kr0, int q0, int kvalid,
                                              const unsigned long long (&mw)[2]) {
  StepMask m;
  m.kind = e.y;
  const int cb = 2 * (threadIdx.x & 3);
  static_assert(!kBandBits || BM == 64, "one mask word a row");
  if (kBandBits && e.y == -2) {
    m.kind = 0;
    // Row kr's a = max(a0 + kr, 0), z = min(z0 + kr, 63) with the entry's (warp-uniform) a0 = k0 - q0 - e.w and
    // z0 = k0 - q0 - e.z, clamped to [-256, 256] in 64 bits first: as kr < 256, a clamped a0 or z0 leaves each row
    // as it was (a 0, or past 63: empty; z 63, or negative: empty), and the rows' arithmetic is 32-bit.
    const int64_t d = int64_t(k0) - q0;
    const int a0 = int(min(max(d - e.w, int64_t(-256)), int64_t(256)));
    const int z0 = int(min(max(d - e.z, int64_t(-256)), int64_t(256)));
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int kr = kr0 + 8 * hh;
      const int a = max(a0 + kr, 0), z = kr < kvalid ? min(z0 + kr, BM - 1) : -1;
      // 0 <= a <= z <= 63 where the row keeps any column
      const unsigned long long w = z >= a ? (~0ull >> (63 - z)) & (~0ull << a) : 0ull;
      m.a[2 * hh] = uint32_t(w), m.a[2 * hh + 1] = uint32_t(w >> 32);
    }
  } else if (e.y == -2) {
    // Row hh (key kp = k0 + kr) keeps the query columns [a, z] (none past kvalid keys); a score's test is one
    // subtraction and one unsigned compare (as the forward's band mask).
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int64_t d0 = int64_t(k0 + kr0 + 8 * hh) - q0;
      const int a = int(max(d0 - e.w, int64_t(0))), z = kr0 + 8 * hh < kvalid ? int(min(d0 - e.z, int64_t(BM - 1))) : -1;
      m.a[2 * hh] = z >= a ? unsigned(a - cb) : 0x40000000u;
      m.a[2 * hh + 1] = z >= a ? unsigned(z - a) : 0u;
    }
  } else {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) m.a[2 * hh] = uint32_t(mw[hh]), m.a[2 * hh + 1] = uint32_t(mw[hh] >> 32);
  }
  return m;
}
// kBandBits: m from step_mask<BM, true> (no band kind left).
template <int BM, bool kBandBits = false>
__device__ __forceinline__ void apply_mask(float (&s)[BM / 2], const StepMask& m) {
  if (!kBandBits && m.kind == -2) {
    mma::mask_fragment(s, [&](int c, int hh) { return unsigned(c) - m.a[2 * hh] > m.a[2 * hh + 1]; });
  } else if (m.kind >= 0) {
    static_assert(BM == 64, "one mask word a row");
    const int cb = 2 * (threadIdx.x & 3);
    const unsigned long long w[2][1] = {{m.a[0] | (uint64_t(m.a[1]) << 32)}, {m.a[2] | (uint64_t(m.a[3]) << 32)}};
    mma::tile_mask_bits<BM>(s, w, cb);
  }
}
template <class Tr, bool kBandBits = false>
__device__ __forceinline__ void mask_step(float (&s)[Tr::BM / 2], const int4& e, int k0, int kr0, int q0, int kvalid,
                                          const unsigned long long (&mw)[2]) {
  apply_mask<Tr::BM, kBandBits>(s, step_mask<Tr::BM, kBandBits>(e, k0, kr0, q0, kvalid, mw));
}

// kP: P^T = exp2(S^T scale log2 e - lse2) in place of S^T (0 where masked: -inf); kDS: dS^T = P^T (dP^T - delta)
// in place of dP^T. rows_s: the step's lse2 row in shared memory, delta's after it. Both in one loop (tile_bwd_kernel)
// or one at a time (the warp-specialized kernel: P^T while dP^T's wgmma runs).
// kImm: the thread's address rows_s + 4 cb made opaque to the compiler first, so each load is that register plus an
// immediate (LDS [R + 32 j]); else the compiler ORs 32 j into the (disjoint) lane bits, one LOP3 a load, every step.
template <int BM, bool kP, bool kDS, bool kImm = false>
__device__ __forceinline__ void probs_dscores(float (&s)[BM / 2], float (&dp)[BM / 2], uint32_t rows_s, float sl2) {
  const int cb = 2 * (threadIdx.x & 3);
  uint32_t base = rows_s + 4 * cb;
  if constexpr (kImm) asm("" : "+r"(base));
#pragma unroll
  for (int j = 0; j < BM / 8; ++j) {
    float2 l2, dl;
    if constexpr (kP) l2 = ld_shared_f2(kImm ? base + 32 * j : rows_s + 4 * (8 * j + cb));
    if constexpr (kDS) dl = ld_shared_f2(kImm ? base + BM * 4 + 32 * j : rows_s + BM * 4 + 4 * (8 * j + cb));
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int ee = 0; ee < 2; ++ee) {
        const int idx = 4 * j + 2 * hh + ee;
        if constexpr (kP) s[idx] = ex2_ftz(fmaf(s[idx], sl2, -(ee ? l2.y : l2.x)));
        if constexpr (kDS) dp[idx] = s[idx] * (dp[idx] - (ee ? dl.y : dl.x));
      }
  }
}

// P^T and dS^T (s, dp) to 16-bit A fragments pa, da (unchanged until the group completes), then dV += P^T dO,
// dK += dS^T Q issued as one wgmma group (RS, B operands MN-major at the step's dO and Q).
// d_do, d_q: the operands of dO and Q at leading-byte offset BM 128 (operand<k64>(s_do, Tr::BM * 128)).
template <class Tr, class O>
__device__ __forceinline__ void issue_dkv(const float (&s)[Tr::BM / 2], const float (&dp)[Tr::BM / 2],
                                          uint32_t (&pa)[Tr::BM / 16][4], uint32_t (&da)[Tr::BM / 16][4],
                                          float (&dv)[Tr::D / 2], float (&dk)[Tr::D / 2], const O& d_do,
                                          const O& d_q) {
  using Op = ::spattn::cuda::wgmma::Op<Tr::D, Tr::kBf16>;
  mma::tile_to_p<Tr::BM, Tr::kBf16>(s, pa);
  mma::tile_to_p<Tr::BM, Tr::kBf16>(dp, da);
  fence_regs(dv);
  fence_regs(dk);
  fence_regs(pa);
  fence_regs(da);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Tr::BM / 16; ++kk) Op::rs_tb(dv, pa[kk], d_do.at(kk * 128), 1);
#pragma unroll
  for (int kk = 0; kk < Tr::BM / 16; ++kk) Op::rs_tb(dk, da[kk], d_q.at(kk * 128), 1);
  wgmma_commit();
}
template <class Tr>
__device__ __forceinline__ void issue_dkv(const float (&s)[Tr::BM / 2], const float (&dp)[Tr::BM / 2],
                                          uint32_t (&pa)[Tr::BM / 16][4], uint32_t (&da)[Tr::BM / 16][4],
                                          float (&dv)[Tr::D / 2], float (&dk)[Tr::D / 2], uint32_t s_do, uint32_t s_q) {
  issue_dkv<Tr>(s, dp, pa, da, dv, dk, operand<false>(s_do, Tr::BM * 128), operand<false>(s_q, Tr::BM * 128));
}

// dS^T to shared memory at s_ds (keys x queries, queries contiguous: the MN-major A of dQ = dS K).
template <class Tr>
__device__ __forceinline__ void store_ds(uint32_t s_ds, const uint32_t (&da)[Tr::BM / 16][4], int kr0) {
  const int cb = 2 * (threadIdx.x & 3);
#pragma unroll
  for (int kk = 0; kk < Tr::BM / 16; ++kk)
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int j = 2 * kk + (x >> 1), hh = x & 1;  // tile_to_p: word x of kk holds (8j + cb, row + 8 hh)
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(s_ds + sw_off<Tr::BN>(kr0 + 8 * hh, j) + 2 * cb), "r"(da[kk][x]));
    }
}

// store_ds by stmatrix (the warp-specialized kernels): word x of da[kk] is 8x8 matrix x of a stmatrix.x4 (rows
// kr0 - lane / 4 + 8 (x & 1), 16-byte chunk 2 kk + (x >> 1)), so a step's 16 st.shared.b32 and their swizzled
// addresses become 4 stmatrix. Lane l gives row l & 7 of matrix l >> 3: key row kb + 8 ((l >> 3) & 1) + (l & 7)
// (kb: the warp's first), chunk (2 kk + (l >> 4)) ^ (l & 7) = ((l >> 4) ^ (l & 7)) ^ 2 kk: the address of kk = 0
// XOR 32 kk (within the row's 128 bytes; s_ds 1024-aligned, so the XOR may follow the add).
template <class Tr>
__device__ __forceinline__ uint32_t stsm_ds_lane_off(int kr0) {
  const int lane = threadIdx.x & 31, kb = kr0 - (lane >> 2);
  const int row = kb + 8 * ((lane >> 3) & 1) + (lane & 7);
  return sw_off<Tr::BN>(row, lane >> 4);
}
template <class Tr>
__device__ __forceinline__ void store_ds_stsm(uint32_t s_ds, const uint32_t (&da)[Tr::BM / 16][4], uint32_t lane_off) {
  const uint32_t a = s_ds + lane_off;
#pragma unroll
  for (int kk = 0; kk < Tr::BM / 16; ++kk) stmatrix_x4(a ^ uint32_t(kk << 5), da[kk][0], da[kk][1], da[kk][2], da[kk][3]);
}

// dQ (the step's queries x NQ columns of K at s_kcols, MN-major) = dS K over the tile's BN keys (dS^T at s_ds),
// waited for with every earlier group of the warpgroup (issue_dkv's: dv, dk final for the step).
// d_ds, d_kcols: operands at leading-byte offset BN 128.
template <class Tr, int NQ, class O>
__device__ __forceinline__ void mma_dq_wait(float (&dq)[NQ / 2], const O& d_ds, const O& d_kcols,
                                            float (&dv)[Tr::D / 2], float (&dk)[Tr::D / 2]) {
  fence_regs(dq);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Tr::BN / 16; ++kk)
    ::spattn::cuda::wgmma::Op<NQ, Tr::kBf16>::ss_tt(dq, d_ds.at(kk * 128), d_kcols.at(kk * 128), kk > 0 ? 1 : 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(dq);
  fence_regs(dv);
  fence_regs(dk);
}
template <class Tr, int NQ>
__device__ __forceinline__ void mma_dq_wait(float (&dq)[NQ / 2], uint32_t s_ds, uint32_t s_kcols,
                                            float (&dv)[Tr::D / 2], float (&dk)[Tr::D / 2]) {
  mma_dq_wait<Tr, NQ>(dq, operand<false>(s_ds, Tr::BN * 128), operand<false>(s_kcols, Tr::BN * 128), dv, dk);
}

// The warp-specialized step's tail in FA3's / FA4's order (after P^T, dS^T in s, dp): dV += P^T dO as one wgmma
// group, store_ds() (dS^T's stores, the proxy fence and the consumers' barrier), then dQ = dS K and dK += dS^T Q as two
// more groups; returns with dV and dQ complete and dK's group still running (the caller stages dQ under it, then waits
// for it: wgmma_wait<0>, fence_regs(dk), fence_regs(da)). o: the step's operands (tile_bwd_ws.cuh, StepOperands: dobm,
// qbm, ds, kcols). Issuing dV and dK as one group before the barrier and waiting for all three after dQ (session 26's
// step) left the tensor pipe idle while dQ was staged: this order ran the D = 128 backward 1.06-1.16x faster in one
// process (causal 2.720 -> 2.375 ms, H200) and the D = 64 one 0.99-1.10x (bench/LOG.md).
template <class Tr, class Ops, class F>
__device__ __forceinline__ void dv_ds_dq_dk(const float (&s)[Tr::BM / 2], const float (&dp)[Tr::BM / 2],
                                            uint32_t (&pa)[Tr::BM / 16][4], uint32_t (&da)[Tr::BM / 16][4],
                                            float (&dv)[Tr::D / 2], float (&dk)[Tr::D / 2], float (&dq)[Tr::kDQ / 2],
                                            const Ops& o, F&& store_ds) {
  using OpD = ::spattn::cuda::wgmma::Op<Tr::D, Tr::kBf16>;
  using OpQ = ::spattn::cuda::wgmma::Op<Tr::kDQ, Tr::kBf16>;
  mma::tile_to_p<Tr::BM, Tr::kBf16>(s, pa);
  mma::tile_to_p<Tr::BM, Tr::kBf16>(dp, da);
  fence_regs(dv);
  fence_regs(pa);
  fence_regs(da);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Tr::BM / 16; ++kk) OpD::rs_tb(dv, pa[kk], o.dobm.at(kk * 128), 1);
  wgmma_commit();
  store_ds();
  fence_regs(dq);
  fence_regs(dk);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Tr::BN / 16; ++kk) OpQ::ss_tt(dq, o.ds.at(kk * 128), o.kcols.at(kk * 128), kk > 0 ? 1 : 0);
  wgmma_commit();
#pragma unroll
  for (int kk = 0; kk < Tr::BM / 16; ++kk) OpD::rs_tb(dk, da[kk], o.qbm.at(kk * 128), 1);
  wgmma_commit();
  wgmma_wait<1>();  // dV and dQ
  fence_regs(dq);
  fence_regs(dv);
  fence_regs(pa);
}

// A step's Q, dO (tensor maps), lse2 and delta rows (bulk copies) into a stage, completing on `bar` (one thread).
template <class Tr>
__device__ __forceinline__ void tma_step(const BwdParams& p, uint32_t s_q, uint32_t s_do, uint32_t s_rows,
                                         uint32_t bar, int b, int h, int q0) {
  mbar_expect_tx(bar, Tr::kStepBytes);
#pragma unroll
  for (int c = 0; c < Tr::D / 64; ++c) {
    tma_load_4d(s_q + c * Tr::BM * 128, &p.tmap_q, bar, 64 * c, q0, h, b);
    tma_load_4d(s_do + c * Tr::BM * 128, &p.tmap_do, bar, 64 * c, q0, h, b);
  }
  const int64_t row = (int64_t(b) * p.q_heads + h) * p.qp + q0;
  bulk_load(s_rows, p.lse2 + row, Tr::BM * 4, bar);
  bulk_load(s_rows + Tr::BM * 4, p.delta + row, Tr::BM * 4, bar);
}

// Epilogue: dK (times the softmax scale) and dV of this thread's two key rows at their tokens; added to what dk and
// dv hold where p.dkv_accumulate (a key row is one CTA's: no race). kMap: the rows' tokens from p.k_map (query strips).
template <class Tr, bool kMap = false>
__device__ __forceinline__ void store_dkdv(const BwdParams& p, const float (&dk)[Tr::D / 2], const float (&dv)[Tr::D / 2],
                                           int b, int hk, int k0, int kr0) {
  using Elem = typename Tr::Elem;
  const int cb = 2 * (threadIdx.x & 3);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int tok = kMap ? __ldg(p.k_map + k0 + kr0 + 8 * hh) : plan_token(k0 + kr0 + 8 * hh, p.perm_d, p.k_group);
    if (unsigned(tok) >= unsigned(p.k_len)) continue;  // padding (-1 where kMap) or past the keys
    Elem* krow = static_cast<Elem*>(p.dk) + int64_t(b) * p.dk_sb + int64_t(tok) * p.dk_sl + int64_t(hk) * p.dk_sh;
    Elem* vrow = static_cast<Elem*>(p.dv) + int64_t(b) * p.dv_sb + int64_t(tok) * p.dv_sl + int64_t(hk) * p.dv_sh;
#pragma unroll
    for (int j = 0; j < Tr::D / 8; ++j) {
      uint32_t* kw = reinterpret_cast<uint32_t*>(krow + 8 * j + cb);
      uint32_t* vw = reinterpret_cast<uint32_t*>(vrow + 8 * j + cb);
      float2 k2 = make_float2(dk[4 * j + 2 * hh] * p.scale, dk[4 * j + 2 * hh + 1] * p.scale);
      float2 v2 = make_float2(dv[4 * j + 2 * hh], dv[4 * j + 2 * hh + 1]);
      if (p.dkv_accumulate) {
        const float2 ko = unpack2<Tr::kBf16>(*kw), vo = unpack2<Tr::kBf16>(*vw);
        k2.x += ko.x, k2.y += ko.y, v2.x += vo.x, v2.y += vo.y;
      }
      *kw = pack2<Tr::kBf16>(k2.x, k2.y);
      *vw = pack2<Tr::kBf16>(v2.x, v2.y);
    }
  }
}

// The warp-specialized kernels' epilogue through shared memory (1.01-1.07x the backward in one process against each
// thread's own stores, session 27; bench/LOG.md): traits SmemEpilogue<Tr> select it. Identity plans without
// dkv_accumulate only (the host runs the plain traits otherwise): a key row r of the tile is token k0 + r. After the
// loop every wgmma of both consumer warpgroups is done (each waited for its dQ group before the CTA-wide consumer
// barrier below), so the K and V tiles (2 x 128 x D x 2 bytes, loaded by the consumers themselves, never by the
// producer) hold dK and dV: bf16 / fp16 by stmatrix into 64-row x 64-column boxes with the tensor maps' 128-byte
// swizzle (sw_off<64>), then one thread of each warpgroup stores its 64 rows by TMA (tmap_dk, tmap_dv; rows past k_len
// dropped by the map). Each thread's 2 D / 8 four-byte stores of half sectors become 2 D / 16 stmatrix and 2 D / 64
// bulk tensor stores a warpgroup. The persistent grid (tile_bwd_ws2.cuh) stages dK and dV elsewhere, its K and V
// tiles then already loading the next item's: in a dS^T buffer at D = 64, in the dQ staging buffers at D = 128.
template <class Base>
struct SmemEpilogue : Base {
  static constexpr bool kSmemEpi = true;
};
template <class Tr>
inline constexpr bool kSmemEpiOf = requires { requires Tr::kSmemEpi; };

// Box x (x = ((tensor 0 dK / 1 dV) 2 + warpgroup) D / 64 + 64-column block) at s_stage + 8192 x.
template <class Tr>
__device__ __forceinline__ void store_dkdv_smem(const BwdParams& p, const float (&dk)[Tr::D / 2],
                                                const float (&dv)[Tr::D / 2], int b, int hk, int k0, int kr0,
                                                uint32_t s_stage) {
  constexpr int D = Tr::D, NB = D / 64;
  static_assert(D % 64 == 0 && Tr::BN == 128 && Tr::kConsumerThreads == 256, "two warpgroups of 64 keys");
  const int lane = threadIdx.x & 31, wg = kr0 >> 6, rw = kr0 & 63;
  // stmatrix: lane l gives row (l & 7) of matrix l >> 3 (matrix x of kk: rows + 8 (x & 1), chunk 2 kk + (x >> 1),
  // tile_to_p's word order), in the warpgroup's 64 rows.
  const int row = rw - (lane >> 2) + 8 * ((lane >> 3) & 1) + (lane & 7);
  const uint32_t bk = s_stage + uint32_t(wg * NB) * 8192u, bv = bk + uint32_t(2 * NB) * 8192u;
  named_sync(1, Tr::kConsumerThreads);  // both warpgroups' wgmmas done with K (dQ reads all its rows) and V
  const float sc = p.scale;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t off = sw_off<64>(row, 2 * kk + (lane >> 4));
    stmatrix_x4(bk + off, pack2<Tr::kBf16>(dk[8 * kk] * sc, dk[8 * kk + 1] * sc),
                pack2<Tr::kBf16>(dk[8 * kk + 2] * sc, dk[8 * kk + 3] * sc),
                pack2<Tr::kBf16>(dk[8 * kk + 4] * sc, dk[8 * kk + 5] * sc),
                pack2<Tr::kBf16>(dk[8 * kk + 6] * sc, dk[8 * kk + 7] * sc));
    stmatrix_x4(bv + off, pack2<Tr::kBf16>(dv[8 * kk], dv[8 * kk + 1]),
                pack2<Tr::kBf16>(dv[8 * kk + 2], dv[8 * kk + 3]),
                pack2<Tr::kBf16>(dv[8 * kk + 4], dv[8 * kk + 5]),
                pack2<Tr::kBf16>(dv[8 * kk + 6], dv[8 * kk + 7]));
  }
  fence_proxy_async();  // the generic stores visible to the bulk copies
  if (wg == 0)  // the warpgroup's boxes complete (barrier ids as constants: ptxas then reserves 4, not all 16)
    named_sync(2, 128);
  else
    named_sync(3, 128);
  const int r0 = k0 + 64 * wg;
  if ((threadIdx.x & 127) == 0 && r0 < p.k_len) {
#pragma unroll
    for (int c = 0; c < NB; ++c) {
      tma_store_4d(&p.tmap_dk, bk + uint32_t(c) * 8192u, 64 * c, r0, hk, b);
      tma_store_4d(&p.tmap_dv, bv + uint32_t(c) * 8192u, 64 * c, r0, hk, b);
    }
    bulk_commit();
    bulk_wait_all<true>();  // the boxes read before the CTA (and its shared memory) ends, or the buffer is reused
  }
}
// The warp-specialized kernels' epilogue: store_dkdv, or store_dkdv_smem (s_stage: the K tile, V's after it; the
// persistent grid's: a dS^T buffer at D = 64, the dQ buffers at D = 128) where Tr is SmemEpilogue's.
template <class Tr>
__device__ __forceinline__ void store_dkdv_ws(const BwdParams& p, const float (&dk)[Tr::D / 2],
                                              const float (&dv)[Tr::D / 2], int b, int hk, int k0, int kr0,
                                              uint32_t s_stage) {
  if constexpr (kSmemEpiOf<Tr>)
    store_dkdv_smem<Tr>(p, dk, dv, b, hk, k0, kr0, s_stage);
  else
    store_dkdv<Tr>(p, dk, dv, b, hk, k0, kr0);
}

// A work item (a key tile, batch and kv head; a CTA an item, or the persistent grid's CTAs taking several; key tiles
// in the plan's order, most entries first, within head sections): its steps are the key tile's entries for each query
// head of the kv head's group, n = ne * group.
struct KeyTileWork {
  int b, hk, k0, ne, n;
  int64_t e0;  // the key tile's first entry
};
// Item `item` of the grid's (the persistent grid's items are the one-CTA-an-item grid's CTAs, in that order).
template <int BN>
__device__ __forceinline__ KeyTileWork key_tile_work(const BwdParams& p, int item) {
  const WorkItem it = section_item(item, p.k_tiles, p.batch * p.kv_heads, p.head_section, p.order);
  const int kt = it.tile, bhk = it.unit;
  KeyTileWork w;
  w.b = bhk / p.kv_heads, w.hk = bhk % p.kv_heads;
  w.k0 = kt * BN;
  w.e0 = p.col_offsets[kt];
  w.ne = int(p.col_offsets[kt + 1] - w.e0);
  w.n = w.ne * p.group;
  return w;
}
template <int BN>
__device__ __forceinline__ KeyTileWork key_tile_work(const BwdParams& p) {
  return key_tile_work<BN>(p, int(blockIdx.x));
}
// Step i's entry of item w (64 queries a step): the item's query heads in turn, each over the key tile's entries,
// last first where p.dq_rev.
__device__ __forceinline__ int64_t step_entry(const BwdParams& p, const KeyTileWork& w, int i) {
  const int j = i % w.ne;
  return w.e0 + (p.dq_rev ? w.ne - 1 - j : j);
}

// 8 2-byte elements at p as four words: one 16-byte load (kVec: p 16-byte aligned) or four 4-byte loads.
template <bool kVec>
__device__ __forceinline__ void load8(const void* p, uint32_t (&u)[4]) {
  if constexpr (kVec) {
    const uint4 w = *static_cast<const uint4*>(p);
    u[0] = w.x, u[1] = w.y, u[2] = w.z, u[3] = w.w;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) u[e] = static_cast<const uint32_t*>(p)[e];
  }
}

// Prep's work for one thread: 8 columns [c, c + 8) of plan-space row w (token tok of batch b, head h): delta's
// partial sum over dO o O, reduced over the row's D / 8 threads (one warp), then lse2 and delta (column 0's thread)
// and the accumulator's 8 floats zeroed (two 16-byte stores). dO by one 16-byte load (16-byte aligned rows); O by one
// 16-byte load (kVec: its rows 16-byte aligned) or four 4-byte loads.
template <class Elem, bool kBf16, int D, bool kVec>
__device__ __forceinline__ void prep_row(const BwdParams& p, int64_t w, int b, int h, int tok, int c) {
  const bool real = tok < p.q_len;
  float s = 0.f;
  if (real) {
    const Elem* orow = static_cast<const Elem*>(p.o) + (b * p.o_sb + tok * p.o_sl + h * p.o_sh + c);
    uint32_t oo[4];
    load8<kVec>(orow, oo);
    const uint4 dw = *reinterpret_cast<const uint4*>(static_cast<const Elem*>(p.dout) +
                                                     (b * p.do_sb + tok * p.do_sl + h * p.do_sh + c));
    const uint32_t dd[4] = {dw.x, dw.y, dw.z, dw.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 a = unpack2<kBf16>(oo[e]), d = unpack2<kBf16>(dd[e]);
      s = fmaf(a.x, d.x, fmaf(a.y, d.y, s));
    }
  }
#pragma unroll
  for (int o = D / 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);  // within the row's threads
  if (c == 0) {
    float l2 = INFINITY;
    if (real) {
      const float l = p.lse[b * p.lse_sb + h * p.lse_sh + tok];
      l2 = l == -INFINITY ? INFINITY : l * 1.4426950408889634f;  // a row that kept no key: P = 0
    }
    p.lse2[w] = l2;
    p.delta[w] = s;
  }
  if (p.dq_ready) {  // the owners' steps store the accumulator: only the tile's flag cleared
    if (c == 0 && w % 64 == 0) p.dq_ready[w / 64] = 0;
  } else {
    float4* acc = reinterpret_cast<float4*>(p.dq_acc + w * D + c);
    acc[0] = acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// dq[.., c .. c + 8) of one row at drow = scale * (x, y) (the accumulator's 8 floats), + what dq holds where
// p.dq_accumulate; packed to Elem. kVec: drow 16-byte aligned, one 16-byte store (and load of the old dq), else four
// 4-byte ones. The arithmetic of both finish kernels (bwd_finish_grid_kernel, bwd_finish_tile_kernel).
template <class Elem, bool kBf16, bool kVec>
__device__ __forceinline__ void finish_store(const BwdParams& p, Elem* drow, const float4& x, const float4& y) {
  float g[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
  uint32_t u[4];
  if (p.dq_accumulate) {
    load8<kVec>(drow, u);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 old = unpack2<kBf16>(u[e]);
      g[2 * e] = fmaf(g[2 * e], p.scale, old.x), g[2 * e + 1] = fmaf(g[2 * e + 1], p.scale, old.y);
    }
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) g[e] *= p.scale;
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) u[e] = pack2<kBf16>(g[2 * e], g[2 * e + 1]);
  if constexpr (kVec) {
    *reinterpret_cast<uint4*>(drow) = make_uint4(u[0], u[1], u[2], u[3]);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) reinterpret_cast<uint32_t*>(drow)[e] = u[e];
  }
}

// The warp-specialized kernels' dQ accumulator order within a 64-row tile's 64 D floats: a consumer warpgroup's
// kDQ columns (bwd_finish_tile_kernel's kWs; D/2: tile_bwd_ws.cuh; D: tile_bwd_ws2.cuh, a warpgroup per 64 queries)
// are a contiguous block (one bulk reduce-add), in its threads' register order (thread t's float4 u at (128 u + t) 4:
// conflict-free st.shared.v4). Element (row r, column c) of the tile, with w = c / kDQ, cc = c % kDQ, is float
// w 64 kDQ + (128 (cc / 8) + t) 4 + 2 ((r % 16) / 8) + cc % 2, t = (r / 16) 32 + (r % 8) 4 + q, q = (cc % 8) / 2.
// bwd_finish_tile_kernel's shared copy of a tile's accumulator, in 16-byte units: unit u (of the chunk's 16 D) at
// ws_fin_swz(u). By that order, unit u holds column block u / 128 (8 columns c0 = 8 (u / 128): warpgroup w, block
// j of its kWs columns, c0 = w kWs + 8 j) and t = u % 128 = (r / 16) 32 + (r % 8) 4 + q: rows r (floats 0, 1) and
// r + 8 (2, 3), columns c0 + 2 q, + 1. The swizzle XORs the column block's low 3 bits into the unit's: a linear copy
// (8 consecutive units a quarter warp) stays a permutation of 8 units, and a read of one unit t by 8 threads of 8
// consecutive column blocks hits 8 different 16-byte bank groups.
__device__ __forceinline__ uint32_t ws_fin_swz(uint32_t u) { return u ^ ((u >> 7) & 7u); }
}  // namespace detail
using detail::SmemEpilogue;

// Prep: lse2, delta and the dQ accumulator zeroed, per plan-space query row; a thread per 8 elements of a row (D / 8
// threads a row, a row's threads in one warp; detail::prep_row). Grid: blockIdx.z the batch, blockIdx.y the query
// head, x over the head's plan-space rows, kPfRows<D> a CTA (256 threads): qp / kPfRows<D> CTAs exactly (qp is
// whole 64-row tiles), so every thread has a row. 32-bit index math; on the identity plan (perm_d 1) no division.
// kVec: O's rows 16-byte aligned (pointer and strides; the host decides per launch). (A warp a row with 2-byte
// loads ran at 1.4 TB/s: 197 us of local's 1.1 ms backward at L = 16384, H100.)
inline constexpr int kPfThreads = 256;
template <int D>
inline constexpr int kPfRows = kPfThreads / (D / 8);
template <class Elem, bool kBf16, int D, bool kVec>
__global__ void __launch_bounds__(kPfThreads) bwd_prep_grid_kernel(const BwdParams p) {
  constexpr int TPR = D / 8;
  const int b = int(blockIdx.z), h = int(blockIdx.y);
  const int pos = int(blockIdx.x) * kPfRows<D> + int(threadIdx.x / TPR);
  const int64_t w = int64_t(b * p.q_heads + h) * p.qp + pos;
  detail::prep_row<Elem, kBf16, D, kVec>(p, w, b, h, detail::plan_token(pos, p.perm_d, p.q_group),
                                         int(threadIdx.x % TPR) * 8);
}

// Finish of the row-major accumulator (the cp.async rows; bwd_finish_tile_kernel takes the warp-specialized orders):
// dq[b, tok, h, :] = scale * accumulator (detail::finish_store), a thread per 8 elements of a real row; the grid as
// bwd_prep_grid_kernel's. kVec: dq's rows 16-byte aligned.
template <class Elem, bool kBf16, int D, bool kVec>
__global__ void __launch_bounds__(kPfThreads) bwd_finish_grid_kernel(const BwdParams p) {
  constexpr int TPR = D / 8;
  const int b = int(blockIdx.z), h = int(blockIdx.y);
  const int pos = int(blockIdx.x) * kPfRows<D> + int(threadIdx.x / TPR);
  const int tok = detail::plan_token(pos, p.perm_d, p.q_group);
  if (tok >= p.q_len) return;
  const int64_t w = int64_t(b * p.q_heads + h) * p.qp + pos;
  const int c = int(threadIdx.x % TPR) * 8;
  const float4* acc = reinterpret_cast<const float4*>(p.dq_acc + w * D + c);
  detail::finish_store<Elem, kBf16, kVec>(
      p, static_cast<Elem*>(p.dq) + (b * p.dq_sb + tok * p.dq_sl + h * p.dq_sh + c), acc[0], acc[1]);
}

// Finish for the warp-specialized accumulator orders (kWs != 0), a CTA (kFinThreads) per 64-row tile (grid: x the
// head's tiles, y the query head, z the batch): the tile's 64 D floats of accumulator copied linearly into shared
// memory (16-byte cp.async, every warp's reads whole 512-byte runs) through detail::ws_fin_swz, one barrier, then a
// thread per (row pair r, r + 8; 8-column block): four conflict-free 16-byte shared loads (units t .. t + 3 of its
// block, ws_fin_swz's comment), two rows of dq by finish_store (kVec: 16-byte stores; D / 8 threads of a warp on a
// row's D columns). Rows past q_len are skipped; on the identity plan a tile wholly past q_len returns at once.
// A thread per 8 columns of a row reading the same order by four 8-byte loads (the finish before session 28), at
// stride 64 bytes across a row's threads, ran at 1.97 TB/s, L1 95.7 % busy (local(1024), D = 128, L = 16384, H = 16,
// H200); against it this kernel took the whole D = 128 backward to 0.949-0.986 of its time (local(256) GQA 32/4
// 0.949), D = 64 1.00 (one process; bench/LOG.md, session 28).
inline constexpr int kFinThreads = 256;
template <class Elem, bool kBf16, int D, int kWs, bool kVec>
__global__ void __launch_bounds__(kFinThreads) bwd_finish_tile_kernel(const BwdParams p) {
  constexpr int NB = D / 8;            // 8-column blocks of a row
  constexpr int kUnits = 64 * D / 4;   // 16-byte units of a tile's accumulator
  constexpr int kItems = 32 * NB;      // (row pair, column block)
  static_assert(kWs > 0 && kWs % 8 == 0 && D % kWs == 0, "warpgroups of whole 8-column blocks");
  static_assert(NB % 8 == 0 && kUnits % kFinThreads == 0 && kItems % kFinThreads == 0, "the CTA's work splits evenly");
  __shared__ __align__(16) float4 s_acc[kUnits];
  const int b = int(blockIdx.z), h = int(blockIdx.y), pos0 = int(blockIdx.x) * 64;
  if (p.perm_d == 1 && pos0 >= p.q_len) return;  // CTA-uniform
  const int tid = int(threadIdx.x);
  const float4* src = reinterpret_cast<const float4*>(p.dq_acc) + (int64_t(b * p.q_heads + h) * p.qp + pos0) * (D / 4);
  const uint32_t s0 = detail::smem_u32(s_acc);
#pragma unroll
  for (int j = 0; j < kUnits / kFinThreads; ++j) {
    const uint32_t u = uint32_t(tid + j * kFinThreads);
    detail::cp_async16(s0 + 16 * detail::ws_fin_swz(u), src + u, 16);
  }
  detail::cp_async_commit();
  detail::cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kItems / kFinThreads; ++j) {
    const int i = tid + j * kFinThreads, blk = i % NB, pair = i / NB;
    const int r = (pair / 8) * 16 + pair % 8;  // and r + 8
    const uint32_t t = uint32_t(blk * 128 + (pair / 8) * 32 + (pair % 8) * 4);
    float4 f[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) f[q] = s_acc[detail::ws_fin_swz(t + q)];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int tok = detail::plan_token(pos0 + r + 8 * hh, p.perm_d, p.q_group);
      if (tok >= p.q_len) continue;
      const float4 x = hh ? make_float4(f[0].z, f[0].w, f[1].z, f[1].w) : make_float4(f[0].x, f[0].y, f[1].x, f[1].y);
      const float4 y = hh ? make_float4(f[2].z, f[2].w, f[3].z, f[3].w) : make_float4(f[2].x, f[2].y, f[3].x, f[3].y);
      detail::finish_store<Elem, kBf16, kVec>(
          p, static_cast<Elem*>(p.dq) + (b * p.dq_sb + tok * p.dq_sl + h * p.dq_sh + 8 * blk), x, y);
    }
  }
}

// kTma: a step's Q, dO, lse and delta come by TMA (one thread issues them, completing on the stage's mbarrier):
// no cp.async issue work, and no fence.proxy.async at the top of each step (wgmma reads what the async proxy wrote).
// Else by cp.async through the plan's row map (residue groups too).
// kStrips: query strips (BwdParams::k_map; cp.async): key rows through k_map, a step's query rows, their lse2 and
// delta (4-byte copies) at its strip's tokens, dQ added at those tokens' accumulator rows; every entry a bitmask, which
// keeps no padding slot or key (their zero-filled rows, lse2 and delta then give P = 0, dS = 0).
template <class Tr, bool kTma, bool kStrips = false>
__device__ __forceinline__ void tile_bwd_body(const BwdParams& p) {
  static_assert(!(kTma && kStrips), "query strips load by cp.async");
  using namespace detail;
  constexpr int BM = Tr::BM, BN = Tr::BN, D = Tr::D, NT = Tr::kThreads;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t s_k = smem_u32(smem), s_v = s_k + Tr::kOffV, s_ds = s_k + Tr::kOffDS;
  auto s_q = [&](int st) { return s_k + Tr::kOffStage + uint32_t(st) * 2 * Tr::kQ; };
  auto s_do = [&](int st) { return s_q(st) + Tr::kQ; };
  const uint32_t s_rows = s_k + Tr::kOffRows;
  const uint32_t s_bar = s_k + Tr::kOffBar;  // + 8 * stage (kTma)

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  const KeyTileWork w = key_tile_work<BN>(p);
  if (w.n == 0 && p.dkv_accumulate) return;  // nothing to add
  const int b = w.b, hk = w.hk, k0 = w.k0, ne = w.ne, n = w.n;
  const int64_t e0 = w.e0;

  const char* kg = static_cast<const char*>(p.k) + 2 * (int64_t(b) * p.k_sb + int64_t(hk) * p.k_sh);
  const char* vg = static_cast<const char*>(p.v) + 2 * (int64_t(b) * p.v_sb + int64_t(hk) * p.v_sh);
  if constexpr (kTma) {
    if (tid == 0) {
      mbar_init(s_bar, 1);
      mbar_init(s_bar + 8, 1);
      fence_mbar_init();
    }
  }
  if constexpr (kStrips) {
    const int32_t* km = p.k_map + k0;
    gather_rows<BN, D, NT>(s_k, kg, p.k_sl * 2, p.k_len, tid, [&](int r) { return __ldg(km + r); });
    gather_rows<BN, D, NT>(s_v, vg, p.v_sl * 2, p.k_len, tid, [&](int r) { return __ldg(km + r); });
  } else {
    load_rows<BN, D, NT>(s_k, kg, p.k_sl * 2, k0, p.k_len, p.perm_d, p.k_group, tid);
    load_rows<BN, D, NT>(s_v, vg, p.v_sl * 2, k0, p.k_len, p.perm_d, p.k_group, tid);
  }
  cp_async_commit();
  if constexpr (kTma) __syncthreads();  // the mbarriers initialized before thread 0's first copy completes on one

  // Step i: query head hk * group + i / ne, entry i % ne.
  // Entries are read two steps ahead (e1: step i + 1's, whose tiles step i loads; e2: step i + 2's), so neither
  // the loads' addresses nor the masks wait on a global read.
  auto entry = [&](int i) { return i < n ? __ldg(&p.entries[e0 + i % ne]) : make_int4(0, kFullEntry, 0, 0); };
  int4 e1 = entry(0), e2 = entry(1);
  auto load_step = [&](int i, int st, const int4& e) {
    const int h = hk * p.group + i / ne;
    const int q0 = e.x * BM;
    if constexpr (kTma) {  // thread 0 only
      tma_step<Tr>(p, s_q(st), s_do(st), s_rows + uint32_t(st) * 2 * BM * 4, s_bar + 8 * st, b, h, q0);
      return;
    }
    const char* qg = static_cast<const char*>(p.q) + 2 * (int64_t(b) * p.q_sb + int64_t(h) * p.q_sh);
    const char* dg = static_cast<const char*>(p.dout) + 2 * (int64_t(b) * p.do_sb + int64_t(h) * p.do_sh);
    if constexpr (kStrips) {
      static_assert(NT == 2 * BM, "a thread per row of lse2 or delta");
      auto tok = [&](int r) { return strip_slot(e, r, p.strip_sx, p.strip_sy); };
      gather_rows<BM, D, NT>(s_q(st), qg, p.q_sl * 2, p.q_len, tid, tok);
      gather_rows<BM, D, NT>(s_do(st), dg, p.do_sl * 2, p.q_len, tid, tok);
      const int r = tid % BM, t = tok(r);
      const bool ok = unsigned(t) < unsigned(p.q_len);
      const float* src = (tid < BM ? p.lse2 : p.delta) + (int64_t(b) * p.q_heads + h) * p.qp + (ok ? t : 0);
      cp_async4(s_rows + uint32_t(st) * 2 * BM * 4 + (tid < BM ? 0 : BM * 4) + 4 * r, src, ok ? 4 : 0);
      cp_async_commit();
      return;
    }
    load_rows<BM, D, NT>(s_q(st), qg, p.q_sl * 2, q0, p.q_len, p.perm_d, p.q_group, tid);
    load_rows<BM, D, NT>(s_do(st), dg, p.do_sl * 2, q0, p.q_len, p.perm_d, p.q_group, tid);
    if (tid < 32) {  // 16 chunks of lse2, 16 of delta
      const float* src = (tid < 16 ? p.lse2 : p.delta) + (int64_t(b) * p.q_heads + h) * p.qp + q0 + 4 * (tid & 15);
      cp_async16(s_rows + uint32_t(st) * 2 * BM * 4 + (tid < 16 ? 0 : BM * 4) + 16 * (tid & 15), src, 16);
    }
    cp_async_commit();
  };
  if (n > 0 && (!kTma || tid == 0)) load_step(0, 0, e1);

  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  const int rw = (warp & 3) * 16 + (lane >> 2);  // this thread's first key row in its warpgroup's 64
  const int kr0 = wg * 64 + rw;                   // ... in the CTA's 128 (second: + 8)
  const int cb = 2 * (lane & 3);
  const float sl2 = p.scale_log2;
  const int kvalid = mma::keys_valid(k0, p.k_len, p.perm_d, p.k_group);

  constexpr int kDQ = BN == 64 ? D : D / 2;  // dQ columns of this warpgroup
  // Query strips at D = 128 (one warpgroup, dK and dV 128 registers): dQ in two 64-column halves, the first added at
  // once, the second after the next step's fence as below (all 128 columns at once spilled 148 bytes).
  constexpr int kHalves = kStrips && BN == 64 && D == 128 ? 2 : 1;
  constexpr int kDQR = kDQ / kHalves;  // dQ columns in registers
  float dq[kDQR / 2];
  float* dq_prev = nullptr;  // the previous step's dQ rows (this warpgroup's columns), added after this step's fence
  float* dq_rows[2] = {nullptr, nullptr};  // kStrips: the previous step's rows rw, rw + 8 (null: padding)
  // dQ's atomics (red.global.add.v2: this thread's two rows, two columns of each 8-column block). Issued after the
  // step's fence: fence.proxy.async waits for every outstanding memory access of the thread (MEMBAR.ALL.CTA in
  // the SASS), and red's round trip there had been the kernel's largest stall (ncu source counters, local).
  // c0: the registers' first column (the second half's where kHalves is 2).
  auto add_dq = [&](float* acc, int c0) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float* row = kStrips ? dq_rows[hh] : acc + int64_t(rw + 8 * hh) * D;
      if (kStrips && row == nullptr) continue;
#pragma unroll
      for (int j = 0; j < kDQR / 8; ++j) red_add_v2(row + c0 + 8 * j + cb, dq[4 * j + 2 * hh], dq[4 * j + 2 * hh + 1]);
    }
  };

  for (int i = 0; i < n; ++i) {
    const int st = i & 1;
    if constexpr (kTma) {
      if (i == 0) {  // K and V (cp.async)
        cp_async_wait<0>();
        fence_proxy_async();
      }
      mbar_wait(s_bar + 8 * st, (i >> 1) & 1);
      __syncthreads();  // everyone done with step i - 1 (its stage, s_ds); K and V visible
    } else {
      cp_async_wait<0>();
      fence_proxy_async();
      __syncthreads();  // this step's tiles visible to all; everyone done with step i - 1 (its stage, s_ds)
      if (dq_prev != nullptr) add_dq(dq_prev, (kHalves - 1) * kDQR);
    }
    const int4 e = e1;
    e1 = e2;
    e2 = entry(i + 2);
    if (i + 1 < n && (!kTma || tid == 0)) load_step(i + 1, st ^ 1, e1);
    const int h = hk * p.group + i / ne;
    const int q0 = e.x * BM;
    unsigned long long mw[2] = {0, 0};
    if (e.y >= 0) {
      mw[0] = __ldg(p.masks + int64_t(e.y) * BN + kr0);
      mw[1] = __ldg(p.masks + int64_t(e.y) * BN + kr0 + 8);
    }

    // ---- S^T = K Q^T, dP^T = V dO^T (this warpgroup's 64 keys x 64 queries) ----
    float s[BM / 2], dp[BM / 2];
    fence_regs(s);
    fence_regs(dp);
    wgmma_fence();
    mma_keys_queries<Tr>(s, s_k + wg * 64 * 128, s_q(st));
    mma_keys_queries<Tr>(dp, s_v + wg * 64 * 128, s_do(st));
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s);
    fence_regs(dp);

    // ---- mask (partial tiles: S^T = -inf where not kept), P^T, dS^T ----
    mask_step<Tr>(s, e, k0, kr0, q0, kvalid, mw);
    const uint32_t lse_s = s_rows + uint32_t(st) * 2 * BM * 4;  // ld.shared, not generic
    probs_dscores<BM, true, true>(s, dp, lse_s, sl2);

    // ---- dV += P^T dO, dK += dS^T Q (B operands MN-major) ----
    uint32_t pa[BM / 16][4], da[BM / 16][4];
    issue_dkv<Tr>(s, dp, pa, da, dv, dk, s_do(st), s_q(st));

    // ---- dS^T to shared memory (keys x queries, queries contiguous: the MN-major A of dQ = dS K) ----
    store_ds<Tr>(s_ds, da, kr0);
    fence_proxy_async();
    named_sync(1, NT);  // every warpgroup's dS^T stored
    // The TMA variant's only fence is the one above: the previous step's atomics go right after it, a step before
    // it comes again.
    if constexpr (kTma)
      if (dq_prev != nullptr) add_dq(dq_prev, (kHalves - 1) * kDQR);

    // ---- dQ (64 queries x this warpgroup's D/2 columns) = dS K ----
    // K MN-major: BN = 128, columns [wg D/2, ...): D = 128, the warpgroup's 64-column block; D = 64, 32 columns
    // in. BN = 64: every column.
    dq_prev = p.dq_acc + ((int64_t(b) * p.q_heads + h) * p.qp + q0) * D + wg * kDQ;
    if constexpr (kStrips)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int t = strip_slot(e, rw + 8 * hh, p.strip_sx, p.strip_sy);
        dq_rows[hh] = unsigned(t) < unsigned(p.q_len) ? p.dq_acc + ((int64_t(b) * p.q_heads + h) * p.qp + t) * D + wg * kDQ
                                                      : nullptr;
      }
    if constexpr (kHalves == 2) {  // K's first 64-column block (BN rows x 128 B), added now; then its second
      mma_dq_wait<Tr, kDQR>(dq, s_ds, s_k, dv, dk);
      add_dq(dq_prev, 0);
      mma_dq_wait<Tr, kDQR>(dq, s_ds, s_k + BN * 128, dv, dk);
    } else {
      mma_dq_wait<Tr, kDQ>(dq, s_ds, s_k + (BN == 64 ? 0 : D == 128 ? wg * BN * 128 : wg * 64), dv, dk);
    }
  }
  cp_async_wait<0>();
  if (dq_prev != nullptr) add_dq(dq_prev, (kHalves - 1) * kDQR);

  store_dkdv<Tr, kStrips>(p, dk, dv, b, hk, k0, kr0);
}

template <class Tr, bool kTma, bool kStrips = false>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks) tile_bwd_kernel(const __grid_constant__ BwdParams p) {
#ifdef __CUDA_ARCH__
  if constexpr (!mma::kWgmmaAvailable) {
    __trap();
  } else {
    tile_bwd_body<Tr, kTma, kStrips>(p);
  }
#endif
}

}  // namespace spattn::cuda::bwd
