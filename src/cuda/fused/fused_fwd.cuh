// cuda/fused/fused_fwd.cuh — the fused block-sparse flash-attention forward kernel.
//
// One CTA computes one query tile (BM rows) of one (batch, head). It walks the tile's key-tile list from the
// plan (plan/gpu/block_plan.hpp): full tiles unmasked, band tiles with an in-kernel predicate, other partial
// tiles with a BM x BN bitmask read from global memory; online softmax in base 2; P stays in registers.
//
// Data path: K/V tiles are gathered row by row with cp.async (16 B per thread per copy) into a
// kStages-deep ring in shared memory, in the 128-byte-swizzled layout that both wgmma (descriptors) and
// ldmatrix read; rows come through the plan's row map (identity, or residue groups for dilated patterns),
// so no tensor is permuted in memory. Each warp owns 16 query rows (a warpgroup owns 64).
//   Sm90 (sm_90a): S = Q K^T by wgmma with both operands in shared memory, O += P V by wgmma with P from
//                  registers and V read N-major (transposed) through its descriptor.
//   Sm80:          mma.sync m16n8k16 with ldmatrix(.trans) from the same shared-memory layout.
// Both share the accumulator layout (thread holds rows lane/4 and lane/4 + 8 of its warp's 16, columns
// 8j + 2(lane%4) + {0,1}), so masking, softmax and the epilogue are one code.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/common/mma_tile.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/work_order.cuh"
#include "cuda/fused/fused_params.hpp"
#include "plan/merge.hpp"

namespace spattn::cuda::fused {

// kMapped_: the instantiation for mapped plans (FusedParams::q_map / k_map set: multi-dimensional tiles), whose
// loads gather each row through the map; the affine instantiations keep their code (the map's index registers
// cost the 64x64 kernel 128 -> 164 registers in one instantiation for both).
// kGathered_: the affine instantiation for plans grouped by residue (perm_d > 1) run four CTAs an SM (the 64x64 one
// at D = 64 on sm_90a; issue 42: their items are short, 1-3 tiles, and wait on their gathered Q and first K/V, which
// a fourth CTA overlaps; launch_row). The code is the affine instantiation's.
template <int BM_, int BN_, int D_, bool kBf16_, bool kSm90_, bool kMapped_ = false, bool kGathered_ = false>
struct Traits {
  static constexpr int BM = BM_, BN = BN_, D = D_;
  static constexpr bool kBf16 = kBf16_, kSm90 = kSm90_, kMapped = kMapped_, kGathered = kGathered_;
  static_assert(!(kMapped && kGathered), "a plan is mapped or grouped by residue, not both");
  static_assert(BM == 64 || BM == 128, "query tile is 64 or 128 rows");
  static_assert(BN == 64 || BN == 128, "key tile is 64 or 128 keys");
  static_assert(D == 64 || D == 128, "head dim is 64 or 128");
  static constexpr int kWarps = BM / 16;
  static constexpr int kThreads = kWarps * 32;
  // One-warpgroup CTAs (BM = 64) are meant to run 2-4 per SM, so that one CTA's softmax overlaps another's
  // wgmma: 2 stages where a stage is 32 KB or more (D=64 64x128: 72 KB a CTA, 3 per SM). The two-warpgroup
  // 128x128 CTA runs alone on its SM (219-226 registers a thread): 3 stages at D=64, 2 at D=128 (64 KB a stage).
  //
  // Decoupled (sm_90a, 128 rows): the two warpgroups do not meet at a CTA barrier per key tile. Warpgroup 0
  // gathers the K/V tiles; each stage has a `full` mbarrier (cp.async arrivals) and an `empty` one (both
  // warpgroups arrive after their PV wgmma), and a named-barrier turn orders the S = QK^T issue between the
  // warpgroups, so one warpgroup's softmax runs while the other's wgmma does (FA3's ping-pong). Tiles are
  // issued S-2 ahead: 4 stages at D=64 (144 KB), 3 at D=128 (224 KB).
  static constexpr bool kDecoupled = kSm90 && BM == 128;
  // Decoupled and software-pipelined inside each warpgroup (FA3): S_i = QK_i^T is issued together with
  // O += P_{i-1} V_{i-1}, so softmax_i runs while PV_{i-1} is on the tensor cores.
  static constexpr bool kPipelined = kDecoupled;
  static constexpr int kStages = kDecoupled ? (D == 64 ? 4 : 3) : (BN == 128 && (BM == 64 || D == 128)) ? 2 : 3;
  static constexpr int kQBytes = BM * D * 2;
  static constexpr int kTileBytes = BN * D * 2;
  static constexpr int kBarOffset = kQBytes + kStages * 2 * kTileBytes;               // mbarriers after the tiles
  // CTAs an SM, set by the launch bounds (registers) and the shared memory asked for (228 KB an SM, 1 KB of it
  // reserved a CTA; the tiles plus the mbarriers where the stages use them, no alignment slack: smem_cp is declared
  // 1024-aligned): the mapped 64x64 CTA four at D=64 on sm_90a (4 x 57 KB, 117 registers: na2d +11%, na3d +9%; the
  // unmapped one measured 6.5% slower so on bigbird, and the mma.sync one would spill at 128 registers), the other
  // one-warpgroup CTAs three at D=64 and two at D=128 (the 64x64 one's 112 KB of tiles exactly). The request is raised
  // where the tiles alone would let one CTA more onto the SM.
  static constexpr int kMinBlocks = BM == 128 ? 1 : (D == 64 ? (BN == 64 && kSm90 && (kMapped || kGathered) ? 4 : 3) : 2);
  static constexpr int kSmemNeed = kBarOffset + (kDecoupled ? 2 * kStages * 8 : 0);
  static constexpr int kSmemBytes = std::max(kSmemNeed, 228 * 1024 / (kMinBlocks + 1) - 1024 + 16);
  static_assert(kMinBlocks * (kSmemBytes + 1024) <= 228 * 1024 && (kMinBlocks + 1) * (kSmemBytes + 1024) > 228 * 1024,
                "kMinBlocks CTAs an SM");
  using Elem = typename std::conditional<kBf16, __nv_bfloat16, __half>::type;
};

namespace detail {
using namespace ::spattn::cuda::ptx;  // the PTX wrappers by their plain names, here and in the kernels' bodies
using namespace ::spattn::cuda::mma;  // the tile helpers shared with the backward and TSVD (cuda/common/mma_tile.cuh)

// The persistent TMA kernels' work-item counter (FusedParams::work_counter) resets itself: every CTA's producer
// calls this once, after the draw that ended its walk; the last one zeroes the counter and this count (ints 0
// and 1), so that the next launch on the stream starts from zero without a memset before it. Every draw of this
// launch has returned by then (a producer counts itself out only after its last draw's result).
__device__ __forceinline__ void work_counter_done(int* counter) {
  if (atomicAdd(counter + 1, 1) == int(gridDim.x) - 1) {
    atomicExch(counter, 0);
    atomicExch(counter + 1, 0);
  }
}
// Warpgroups 0 ... n - 1 taking turns, in that order, at their wgmma issue: warpgroup i waits on named barrier
// base + i and hands over on the next one's (each barrier meets two warpgroups: 256 threads). start() before the
// first turn lets warpgroup 0 go first; finish() after the last absorbs the last hand-over, so every barrier
// phase completes. Every warpgroup must take the same number of turns.
struct Turns {
  int base, n, me;
  __device__ __forceinline__ void start() const {
    if (me == n - 1) named_arrive(base, 256);
  }
  __device__ __forceinline__ void wait() const { named_sync(base + me, 256); }
  __device__ __forceinline__ void pass() const { named_arrive(base + (me + 1) % n, 256); }
  __device__ __forceinline__ void finish() const {
    if (me == 0) named_sync(base, 256);
  }
};
// Mapped plans: the tokens of this thread's rows of a ROWS-row tile (-1: padding), read from a map (FusedParams::q_map:
// plan positions p0..., each row's CH threads read the same index) or computed from a key box's geometry
// (key_boxes.hpp), and their copy into a swizzled tile with the fast path's fixed shared-memory strides (padding
// zero-filled). K and V tiles share one set of tokens.
template <int ROWS, int D, int NT>
struct MappedRows {
  static constexpr int CH = D / 8, J = ROWS * CH / NT;
  static_assert((ROWS * CH) % NT == 0, "tile copy splits evenly");
  static_assert((NT / CH) % 8 == 0, "each thread keeps its swizzle phase from copy to copy");
  int tok[J];
  __device__ __forceinline__ MappedRows(const int32_t* map, int p0, int tid) {
#pragma unroll
    for (int j = 0; j < J; ++j) tok[j] = __ldg(map + p0 + tid / CH + j * (NT / CH));
  }
  // A key box's rows from its geometry (key_boxes.hpp), with no load: the box's base token and limits (its entry's
  // last two words, DevicePlan), from box row 64 on where `upper` (a half-width entry's upper half). The thread's
  // rows r0 + j * NT/CH (r0 = tid / CH < NT/CH, a power of two, as are the sides) split into bit fields that do not
  // overlap, so a row's token offset and packed offsets are r0's plus those of row j * NT/CH (off8, pack8).
  __device__ __forceinline__ MappedRows(const KeyBoxes& kb, int base, int lim, bool upper, int tid) {
    static_assert(NT / CH >= 8 && (NT / CH) % 8 == 0 && (J - 1) * (NT / CH) < 128, "rows 8i, i < 16 (off8)");
    const BoxRow r0 = box_row(kb, tid / CH);
    int t = base + r0.off, l = lim - r0.pack;
    if (upper) t += kb.off8[8], l -= kb.pack8[8];
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int i = j * (NT / CH) / 8;
      tok[j] = ((l - kb.pack8[i]) & kBoxInside) == kBoxInside ? t + kb.off8[i] : -1;
    }
  }
  // A key strip's rows (key_boxes.hpp, strip_token; BlockPlan::strips): slot r < count is token base + (r / W) sx +
  // (r % W) sy, padding from count on; r / W by strip_inv's multiply and shift (packed: strip_pack(W, count)).
  struct Strip {};
  __device__ __forceinline__ MappedRows(Strip, int base, int packed, int sx, int sy, int tid) {
    static_assert(ROWS == 64, "key strips are 64-key tiles");
#pragma unroll
    for (int j = 0; j < J; ++j) tok[j] = strip_token(base, packed, tid / CH + j * (NT / CH), sx, sy);
  }
  // A row's address is one 32 x 32 -> 64-bit multiply-add (the host keeps a mapped plan's token strides below 2^31
  // bytes: FusedFwd's checks); a padding row reads nothing (source size 0) from the thread's own chunk of token 0.
  __device__ __forceinline__ void copy(uint32_t sdst, const char* gbase, int64_t row_stride_bytes, int len, int tid) const {
    const int ch = tid % CH, rs = int(row_stride_bytes);
    const char* base = gbase + ch * 16;
    const uint32_t dst = sdst + sw_off<ROWS>(tid / CH, ch);
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const bool ok = unsigned(tok[j]) < unsigned(len);
      cp_async16(dst + j * (NT / CH) * 128, base + mul_wide_u32(ok ? tok[j] : 0, rs), ok ? 16 : 0);
    }
  }
};

// Gathers ROWS rows (plan positions p0...) of a [.., L, .., D] tensor into a swizzled tile; rows whose token
// is out of range are zero-filled (never read from memory). kMapped: a mapped plan's rows through `map`; else the
// affine perm_d layout (mma::load_rows).
template <int ROWS, int D, int NT, bool kMapped = false>
__device__ __forceinline__ void load_tile(uint32_t sdst, const char* gbase, int64_t row_stride_bytes, int p0, int len,
                                          int perm_d, int group, int tid, const int32_t* map = nullptr) {
  if constexpr (kMapped)
    MappedRows<ROWS, D, NT>(map, p0, tid).copy(sdst, gbase, row_stride_bytes, len, tid);
  else
    load_rows<ROWS, D, NT>(sdst, gbase, row_stride_bytes, p0, len, perm_d, group, tid);
}

}  // namespace detail

namespace detail {
// ---- one key tile of a 64-row warpgroup (sm_90a paths): S issue, mask, online softmax, P, PV issue ----
// Accumulator layout (see the file comment): the thread holds rows r0, r0 + 8 of its warpgroup's tile and
// columns 8j + cb + {0, 1}. r0 counts rows from the CTA tile's first row q0.

// The bitmask words of this thread's two rows (a bitmask entry: e.y >= 0).
template <int BM, int BN>
__device__ __forceinline__ void tile_mask_words(const FusedParams& p, const int4& e, int r0,
                                                unsigned long long (&mw)[2][BN / 64]) {
  if (e.y >= 0) {
    const unsigned long long* mp = p.masks + int64_t(e.y) * (BM * BN / 64);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int w = 0; w < BN / 64; ++w) mw[hh][w] = __ldg(mp + (r0 + 8 * hh) * (BN / 64) + w);
  }
}
// S = Q K^T for this warpgroup's 64 rows; s_q_wg: its Q rows, s_k: the key tile (both SW128 K-major).
template <int BM, int BN, int D, bool kBf16>
__device__ __forceinline__ void tile_issue_s(float (&s)[BN / 2], uint32_t s_q_wg, uint32_t s_k) {
  const uint32_t q_lo = desc_lo(s_q_wg, 16), k_lo = desc_lo(s_k, 16);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {  // byte offsets (kk / 4) * rows * 128 + (kk % 4) * 32, >> 4
    const uint32_t qa = q_lo + (kk / 4) * BM * 8 + (kk % 4) * 2;
    const uint32_t ka = k_lo + (kk / 4) * BN * 8 + (kk % 4) * 2;
    wgmma::Op<BN, kBf16>::ss(s, desc_of_lo(qa), desc_of_lo(ka), kk > 0 ? 1 : 0);
  }
}
// O += P V with P from registers, V N-major through its descriptor.
template <int BN, int D, bool kBf16>
__device__ __forceinline__ void tile_issue_pv(float (&o)[D / 2], uint32_t (&pa)[BN / 16][4], uint32_t s_v) {
  const uint32_t v_lo = desc_lo(s_v, BN * 128);
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) wgmma::Op<D, kBf16>::rs_tb(o, pa[kk], desc_of_lo(v_lo + kk * 128), 1);
}
__device__ __forceinline__ int tile_kvalid(const FusedParams& p, int k0) {
  return keys_valid(k0, p.k_len, p.perm_d, p.k_group);
}
// Band mask of a BN-wide S tile: kept iff lo <= kp - qp <= hi and column < kvalid. d0 = k0 - q0 - r0w is
// kp - qp at (the warp's first row r0w, column 0). Each of the thread's two rows keeps one column interval;
// with its bounds taken relative to the thread's first column, a score's test is one subtraction from a
// compile-time constant, one unsigned compare and a select (no per-score arithmetic on the positions).
// I: the integer type of the bound arithmetic: int64_t where lo / hi may be +-2^30 (plan entries' bounds that
// never bind), int where the caller keeps |lo|, |hi|, |d0| well inside 32 bits (the band kernel).
// a_cap, z_floor (shifted window rows, the band kernel): a row's first kept column is at most a_cap (<= BN), its
// last at least z_floor (>= -1); the defaults never bind.
template <int BN, class I = int64_t>
__device__ __forceinline__ void tile_mask_band(float (&s)[BN / 2], int d0, int lo, int hi, int kvalid, int lane,
                                               int a_cap = BN, int z_floor = -1) {
  const int rr = lane >> 2, cb = 2 * (lane & 3);
  unsigned first[2], width[2];  // kept iff (8j + ee) - first <= width (unsigned), per row hh
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const I row = rr + 8 * hh;
    const int a = int(max(min(I(lo) - d0 + row, I(a_cap)), I(0))) - cb;               // first kept column - cb
    const int z = int(min(max(I(hi) - d0 + row, I(z_floor)), I(kvalid) - 1)) - cb;    // last kept column - cb
    first[hh] = z >= a ? unsigned(a) : 0x40000000u;  // empty row: nothing kept
    width[hh] = z >= a ? unsigned(z - a) : 0u;
  }
  mask_fragment(s, [&](int c, int hh) { return unsigned(c) - first[hh] > width[hh]; });
}
// Band entries (e.y == -2: kept iff e.z <= kp - qp <= e.w, keys < kvalid) and bitmask entries (e.y >= 0).
template <int BN>
__device__ __forceinline__ void tile_mask(const FusedParams& p, float (&s)[BN / 2], const int4& e,
                                          const unsigned long long (&mw)[2][BN / 64], int q0, int r0, int cb) {
  if (e.y == -2) {
    const int k0 = (e.x & kKtMask) * BN;
    tile_mask_band<BN>(s, k0 - q0 - (r0 & ~15), e.z, e.w, tile_kvalid(p, k0), (threadIdx.x & 31));
  } else if (e.y >= 0) {
    tile_mask_bits<BN>(s, mw, cb);
  }
}
// Row hh of a BN-wide tile: p = 2^(s sl2 - ms) in place; returns the row's sum of them over this thread's columns
// (kP independent partial sums, combined at the end).
template <int BN, int kP>
__device__ __forceinline__ float row_exp2(float (&s)[BN / 2], int hh, float sl2, float ms) {
  float rsp[kP];
#pragma unroll
  for (int i = 0; i < kP; ++i) rsp[i] = 0.f;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int ee = 0; ee < 2; ++ee) {
      const float pv = ex2_ftz(fmaf(s[4 * j + 2 * hh + ee], sl2, -ms));
      s[4 * j + 2 * hh + ee] = pv;
      rsp[j % kP] += pv;
    }
#pragma unroll
  for (int w = kP / 2; w >= 1; w /= 2)
#pragma unroll
    for (int i = 0; i < w; ++i) rsp[i] += rsp[i + w];
  return rsp[0];
}
// Row hh's maximum over a BN-wide tile (the 4 threads holding the row), as kP chains combined at the end.
template <int BN, int kP>
__device__ __forceinline__ float tile_row_max(const float (&s)[BN / 2], int hh) {
  float mxp[kP];
#pragma unroll
  for (int i = 0; i < kP; ++i) mxp[i] = -INFINITY;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) mxp[j % kP] = fmaxf(mxp[j % kP], fmaxf(s[4 * j + 2 * hh], s[4 * j + 2 * hh + 1]));
#pragma unroll
  for (int w = kP / 2; w >= 1; w /= 2)
#pragma unroll
    for (int i = 0; i < w; ++i) mxp[i] = fmaxf(mxp[i], mxp[i + w]);
  float mx = mxp[0];
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  return fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
}
// Row hh's step given its new maximum m_new (the running one with this tile's): exponentials in place, alpha, the
// running max and sum updated.
template <int BN, int kP>
__device__ __forceinline__ void row_softmax(float (&s)[BN / 2], int hh, float m_new, float& row_max, float& row_sum,
                                            float sl2, float& alpha) {
  const float m_use = m_new == -INFINITY ? 0.f : m_new;
  alpha = ex2_ftz((row_max - m_use) * sl2);
  row_max = m_new;
  row_sum = row_sum * alpha + row_exp2<BN, kP>(s, hh, sl2, m_use * sl2);
}
// Online softmax of one tile (base 2): exponentials in place, running max/sum updated, O's rescale factors
// returned in alpha. A row with no key yet keeps max -inf and contributes nothing. kP (a power of 2): the row's
// max and sum as kP independent chains, combined at the end (shorter dependency chains, another summation order).
template <int BN, int kP = 1>
__device__ __forceinline__ void tile_softmax(float (&s)[BN / 2], float (&row_max)[2], float (&row_sum)[2], float sl2,
                                             float (&alpha)[2]) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
    row_softmax<BN, kP>(s, hh, fmaxf(row_max[hh], tile_row_max<BN, kP>(s, hh)), row_max[hh], row_sum[hh], sl2,
                        alpha[hh]);
}
// The lazy rescale (FlashAttention-4; pipelined_tiles' kLazy, KERNELS.md section 6): a row's running max moves
// only where some row of the warp would rise past it by more than kLazyLog2 log2 units (its exponentials then
// stay <= 2^8, far from fp32's range and from P's bf16/fp16 range: P is scaled by 2^-m for the stale m and O and
// the row sum carry the same factor, which the epilogue's division cancels, so the result is exact).
inline constexpr float kLazyLog2 = 8.f;
// The lazy rescale's test: the rows' maxima with this tile's (m_new), and whether any row of the warp moves its own.
template <int BN, int kP>
__device__ __forceinline__ bool lazy_vote(const float (&s)[BN / 2], const float (&row_max)[2], float sl2,
                                          float (&m_new)[2]) {
  bool grow = false;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    m_new[hh] = fmaxf(row_max[hh], tile_row_max<BN, kP>(s, hh));
    grow |= !(row_max[hh] != -INFINITY && (m_new[hh] - row_max[hh]) * sl2 <= kLazyLog2);
  }
  return __any_sync(0xffffffffu, grow);
}
// tile_softmax with FlashAttention-4's lazy rescale (pipelined_tiles' kLazy), P_i packed into pa: where every row of
// the warp has a finite maximum and its tile maximum exceeds it by at most kLazyLog2 / sl2 (p <= 2^kLazyLog2), the
// maxima stay, alpha is 1 and the function returns false (no rescale of O needed); otherwise the exact step (returns
// true). As a row's maximum rarely moves, the exponentials are taken against the stale maxima straight from S, summed
// and packed, with the tile's row maxima, their growth test and the warp's vote beside them rather than ahead of them.
// Where the vote finds growth (a row's first tiles, or scores that jump) those values are dropped and the step is taken
// again with the new maxima. Either way the values are bit for bit those of the step this one replaced, which took the
// maxima and the vote first (the same maxima, offsets, summation chains and packs). The branch on the vote ends the
// basic block, so the wait for PV_{i-1} that follows stays behind the exponentials. Against that step (P packed after
// the vote, then a trap branch as the block boundary): 0.927-0.973 of the forward's time on the six D=128 TMA cases
// (H200, bf16, one process; bench/LOG.md, session 28).
template <int BN, int kP, bool kBf16>
__device__ __forceinline__ bool tile_softmax_lazy(float (&s)[BN / 2], float (&row_max)[2], float (&row_sum)[2],
                                                  float sl2, float (&alpha)[2], uint32_t (&pa)[BN / 16][4]) {
  float ms[2], rsp[2 * kP];  // offsets against the stale maxima; row hh's chains at rsp[hh kP + i]
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    ms[hh] = (row_max[hh] == -INFINITY ? 0.f : row_max[hh]) * sl2;
#pragma unroll
    for (int i = 0; i < kP; ++i) rsp[hh * kP + i] = 0.f;
  }
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {  // row_exp2's chains and order; tile_to_p's words
      const float p0 = ex2_ftz(fmaf(s[4 * j + 2 * hh], sl2, -ms[hh]));
      const float p1 = ex2_ftz(fmaf(s[4 * j + 2 * hh + 1], sl2, -ms[hh]));
      rsp[hh * kP + j % kP] += p0;
      rsp[hh * kP + j % kP] += p1;
      pa[j / 2][2 * (j % 2) + hh] = pack2<kBf16>(p0, p1);
    }
  float m_new[2];
  const bool rescale = lazy_vote<BN, kP>(s, row_max, sl2, m_new);
  // The speculative values exist before the branch (the compiler would otherwise sink them into the path that keeps
  // them, behind the vote).
  fence_regs(rsp);
  fence_regs(pa);
  if (rescale) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) row_softmax<BN, kP>(s, hh, m_new[hh], row_max[hh], row_sum[hh], sl2, alpha[hh]);
    tile_to_p<BN, kBf16>(s, pa);
    return true;
  }
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
    for (int w = kP / 2; w >= 1; w /= 2)
#pragma unroll
      for (int i = 0; i < w; ++i) rsp[hh * kP + i] += rsp[hh * kP + i + w];
    alpha[hh] = 1.f;
    row_sum[hh] += rsp[hh * kP];
  }
  return false;
}
// O *= alpha per row.
template <int D>
__device__ __forceinline__ void tile_rescale(float (&o)[D / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      o[4 * j + 2 * hh] *= alpha[hh];
      o[4 * j + 2 * hh + 1] *= alpha[hh];
    }
}
// Row hh's softmax denominator (the sum over the 4 threads holding the row) and its reciprocal (0 for a row that
// kept no key); with p.lse, lane 0 of the quad writes the row's LSE at token tok. Shared by the epilogues.
// A NaN or +inf score makes l NaN (fmaxf skips NaN in the row max, the exponential keeps it; +inf - +inf is NaN):
// LSE and 1 / l are then NaN, so the row's O and LSE are NaN (PATTERNS.md); only l == 0 is a row with no key.
// row_total: the row's sum over its quad of lanes (NaN where the maximum was lost); row_finish also writes the LSE.
__device__ __forceinline__ float row_total(const FusedParams& p, float row_sum, float row_max) {
  float l = row_sum;
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if (scaled_max_lost(row_max, p.scale_log2)) l = __int_as_float(0x7fffffff);  // O and LSE NaN (ptx.cuh)
  return l;
}
__device__ __forceinline__ float row_finish(const FusedParams& p, float row_sum, float row_max, int b, int h, int tok,
                                            bool write_lse) {
  const float l = row_total(p, row_sum, row_max);
  if (write_lse && p.lse != nullptr)
    p.lse[int64_t(b) * p.lse_sb + int64_t(h) * p.lse_sh + tok] = l == 0.f ? -INFINITY : row_max * p.scale + __logf(l);
  return l == 0.f ? 0.f : 1.f / l;
}
// FusedParams::merge_out: query row `pos`'s O row and LSE, which the epilogue reads to merge into, on their way to L2
// while the item's tiles run (sm_90+; 16-byte aligned rows only), so that the epilogue's read does not wait on DRAM.
template <int D, bool kMapped>
__device__ __forceinline__ void merge_prefetch(const FusedParams& p, int b, int h, int pos) {
  const int tok = kMapped ? __ldg(p.q_map + pos) : plan_token(pos, p.perm_d, p.q_group);
  if (kMapped ? unsigned(tok) >= unsigned(p.q_len) : tok >= p.q_len) return;
  const char* orow = static_cast<const char*>(p.o) + 2 * (int64_t(b) * p.o_sb + int64_t(tok) * p.o_sl + int64_t(h) * p.o_sh);
  if ((reinterpret_cast<uintptr_t>(orow) & 15) == 0) bulk_prefetch_l2(orow, 2 * D);
  const uintptr_t lp = reinterpret_cast<uintptr_t>(p.lse + int64_t(b) * p.lse_sb + int64_t(h) * p.lse_sh + tok);
  bulk_prefetch_l2(reinterpret_cast<const void*>(lp & ~uintptr_t(15)), 16);
}

// Epilogue: O / l and LSE of this thread's two rows; rows outside [0, Lq) (padding) are dropped. kMapped: a mapped
// plan (p.q_map: the rows' tokens), else the affine layout. kMerge (FusedParams::merge_out): o and lse hold another
// part's rows, merged with these through the LSE (KERNELS.md section 3, plan/merge.hpp) where the merge kernel once read
// this launch's rows back from a scratch copy (parts_kernels.cu, launch_merge; issue 42: two passes over O saved).
template <int D, class Elem, bool kBf16, bool kMapped = false, bool kMerge = false>
__device__ __forceinline__ void tile_store(const FusedParams& p, const float (&o)[D / 2], const float (&row_max)[2],
                                           const float (&row_sum)[2], int b, int h, int q0, int r0, int cb, int lane) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int pos = q0 + r0 + 8 * hh;
    const int tok = kMapped ? __ldg(p.q_map + pos) : plan_token(pos, p.perm_d, p.q_group);
    const bool in = kMapped ? unsigned(tok) < unsigned(p.q_len) : tok < p.q_len;  // padding: -1 (mapped) or >= Lq
    if constexpr (kMerge) {
      const float l = row_total(p, row_sum[hh], row_max[hh]);
      float* lp = p.lse + int64_t(b) * p.lse_sb + int64_t(h) * p.lse_sh + (in ? tok : 0);
      const float lse_a = in ? *lp : -INFINITY;
      __syncwarp();  // the quad's four lanes have read the row's LSE before its first lane writes it
      const plan::MergeWeights w = plan::merge_weights(lse_a, l == 0.f ? -INFINITY : row_max[hh] * p.scale + __logf(l));
      if ((lane & 3) == 0 && in) *lp = w.lse;
      if (in) {
        Elem* orow = static_cast<Elem*>(p.o) + int64_t(b) * p.o_sb + int64_t(tok) * p.o_sl + int64_t(h) * p.o_sh;
        const float wo = l == 0.f ? 0.f : w.wb / l;  // this part's O / l, weighed
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
          uint32_t* at = reinterpret_cast<uint32_t*>(orow + 8 * j + cb);
          const float2 a = unpack2<kBf16>(*at);
          *at = pack2<kBf16>(w.wa * a.x + wo * o[4 * j + 2 * hh], w.wa * a.y + wo * o[4 * j + 2 * hh + 1]);
        }
      }
      continue;
    }
    const float inv = row_finish(p, row_sum[hh], row_max[hh], b, h, tok, (lane & 3) == 0 && in);
    if (in) {
      Elem* orow = static_cast<Elem*>(p.o) + int64_t(b) * p.o_sb + int64_t(tok) * p.o_sl + int64_t(h) * p.o_sh;
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        const uint32_t v = pack2<kBf16>(o[4 * j + 2 * hh] * inv, o[4 * j + 2 * hh + 1] * inv);
        *reinterpret_cast<uint32_t*>(orow + 8 * j + cb) = v;
      }
    }
  }
}

// O / l of a consumer warpgroup's 64 rows as 16-bit values into shared memory at s_o, in the 128-byte swizzle of a
// tensor map's 64-row box (16-byte group j of row r at (j / 8) * PanelStride + r * 128 + ((j % 8) ^ (r & 7)) * 16:
// panels of 64 columns), for a bulk tensor copy to store (the band kernel's band_store, the TMA kernel's kTmaEpi).
// stmatrix x4 k: the 8x8 matrices (rows 0-7 | 8-15 of warp wq's 16) x (16-byte groups 2k | 2k + 1); lane l addresses
// row l & 7 of matrix l >> 3. From a base holding (r & 7) in bits 4-6, group 2k + (l >> 4) of the row is an XOR away.
template <int D, bool kBf16, int PanelStride>
__device__ __forceinline__ void stage_o_swizzled(uint32_t s_o, const float (&o)[D / 2], const float (&inv)[2], int wq,
                                                 int lane) {
  const int l7 = lane & 7, m = lane >> 3;
  const uint32_t base =
      (s_o + uint32_t((wq << 4) + ((m & 1) << 3) + l7) * 128 + uint32_t(l7 << 4)) ^ uint32_t((m >> 1) << 4);
#pragma unroll
  for (int k = 0; k < D / 16; ++k) {
    const int j0 = 2 * k, j1 = 2 * k + 1;
    stmatrix_x4((base ^ uint32_t((k & 3) << 5)) + uint32_t(k >> 2) * PanelStride,
                pack2<kBf16>(o[4 * j0] * inv[0], o[4 * j0 + 1] * inv[0]),
                pack2<kBf16>(o[4 * j0 + 2] * inv[1], o[4 * j0 + 3] * inv[1]),
                pack2<kBf16>(o[4 * j1] * inv[0], o[4 * j1 + 1] * inv[0]),
                pack2<kBf16>(o[4 * j1 + 2] * inv[1], o[4 * j1 + 3] * inv[1]));
  }
}

// The key-tile loop of one 64-row warpgroup on sm_90a, software-pipelined inside the warpgroup (FA3): S_i is
// issued together with O += P_{i-1} V_{i-1}, so softmax_i runs while PV_{i-1} is on the tensor cores; the S
// issues of the CTA's warpgroups take turns. Shared by the decoupled cp.async kernel and the TMA kernel, which
// differ only in the hooks:
//   entry(i)      tile i's plan entry (the caller may first issue loads ahead); entry0() the same for tile 0
//                 (the TMA kernel has it in the item's slot: a separate hook keeps it dead after tile 0)
//   wait_full(i)  until tile i's K and V are in shared memory
//   stage(i)      shared address of tile i's K tile (its V tile follows at + TileBytes)
//   release(i)    this thread is done with tile i's stage
//   turn_wait(), turn_pass()   the turn barriers around the S issue
//   after_last_s()             once every S of the tile list is done (before the last PV)
// kLazy (the TMA kernel at D=128; KERNELS.md section 6): a basic-block boundary between softmax_i and the wait for
// PV_{i-1} (tile_softmax_lazy's branch on its vote; ptxas otherwise hoists that wait, WARPGROUP.DEPBAR, ahead of the
// softmax, and PV_{i-1} never runs under it), the row max and sum in two chains, the lazy rescale (O rescaled on a
// warp-uniform branch) and tile i+1's plan entry loaded during tile i (its load otherwise stalls the warp ahead of the
// turn wait); and P_i packed to 16 bits inside softmax_i's basic block, into the second of two P buffers (PV_{i-1}
// still reads the first; the loop runs two tiles a trip so that the buffers alternate). ptxas then interleaves the 32
// F2FP packs with the MUFU.EX2 of that block (a warp's EX2 holds the quarter-rate pipe 8 cycles), where otherwise they
// ran back to back after the block boundary with nothing to hide under: causal D=128's profile put 7.5% more warp time
// than FlashAttention-4's in this tail.
template <int BM, int BN, int D, bool kBf16, int TileBytes, class Entry0, class Entry, class WaitFull, class Stage,
          class Release, class TurnWait, class TurnPass, class AfterLastS, bool kLazy = false>
__device__ __forceinline__ void pipelined_tiles(const FusedParams& p, int n, uint32_t s_q_wg, int q0, int r0, int cb,
                                                float sl2, float (&o)[D / 2], float (&row_max)[2], float (&row_sum)[2],
                                                Entry0&& entry0, Entry&& entry, WaitFull&& wait_full, Stage&& stage, Release&& release,
                                                TurnWait&& turn_wait, TurnPass&& turn_pass, AfterLastS&& after_last_s,
                                                std::bool_constant<kLazy> = {}) {
  constexpr int MW = BN / 64;
  constexpr int kP = kLazy ? 2 : 1;
  float sacc[BN / 2];
  uint32_t pa[BN / 16][4];
  float alpha[2];
  unsigned long long mw[2][MW];
  int4 e_next;  // kLazy: tile i's entry, loaded during tile i - 1
  {  // tile 0: S only
    const int4 e = entry0();
    tile_mask_words<BM, BN>(p, e, r0, mw);
    wait_full(0);
    fence_regs(sacc);
    turn_wait();
    wgmma_fence();
    tile_issue_s<BM, BN, D, kBf16>(sacc, s_q_wg, stage(0));
    wgmma_commit();
    turn_pass();
    if constexpr (kLazy)
      if (n > 1) e_next = entry(1);
    wgmma_wait<0>();
    fence_regs(sacc);
    tile_mask<BN>(p, sacc, e, mw, q0, r0, cb);
    tile_softmax<BN, kP>(sacc, row_max, row_sum, sl2, alpha);
    tile_to_p<BN, kBf16>(sacc, pa);
  }
  // Tile i: S_i issued with PV_{i-1} (P_{i-1} in pin), softmax_i, P_i packed into pout (the same array as pin,
  // after the wait for PV_{i-1}; kLazy: the other buffer, before the block boundary, PV_{i-1} still running).
  auto step = [&](int i, uint32_t(&pin)[BN / 16][4], uint32_t(&pout)[BN / 16][4]) {
    int4 e;
    if constexpr (kLazy) {
      e = e_next;
    } else {
      e = entry(i);
    }
    tile_mask_words<BM, BN>(p, e, r0, mw);
    wait_full(i);
    fence_regs(sacc);
    fence_regs(o);
    fence_regs(pin);
    turn_wait();
    wgmma_fence();
    tile_issue_s<BM, BN, D, kBf16>(sacc, s_q_wg, stage(i));
    wgmma_commit();
    tile_issue_pv<BN, D, kBf16>(o, pin, stage(i - 1) + TileBytes);
    wgmma_commit();
    turn_pass();
    if constexpr (kLazy)
      if (i + 1 < n) e_next = entry(i + 1);
    wgmma_wait<1>();  // S_i done; PV_{i-1} may still run
    fence_regs(sacc);
    tile_mask<BN>(p, sacc, e, mw, q0, r0, cb);
    bool rescale = true;
    if constexpr (kLazy) {
      rescale = tile_softmax_lazy<BN, kP, kBf16>(sacc, row_max, row_sum, sl2, alpha, pout);  // P_i packed in there
    } else {
      tile_softmax<BN, kP>(sacc, row_max, row_sum, sl2, alpha);
    }
    wgmma_wait<0>();  // PV_{i-1} done: O and P free, stage i-1 released
    fence_regs(o);
    fence_regs(pin);
    release(i - 1);
    if (rescale) tile_rescale<D>(o, alpha);
    if constexpr (!kLazy) tile_to_p<BN, kBf16>(sacc, pout);
  };
  // The last PV, P_{n-1} in pl.
  auto last_pv = [&](uint32_t(&pl)[BN / 16][4]) {
    after_last_s();
    fence_regs(o);
    fence_regs(pl);
    wgmma_fence();
    tile_issue_pv<BN, D, kBf16>(o, pl, stage(n - 1) + TileBytes);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(o);
    release(n - 1);
  };
  if constexpr (kLazy) {
    // Two P buffers taking turns, two tiles a trip: no copy between them (a copy after the wait let ptxas merge
    // the buffers and serialize every wgmma, C7513).
    uint32_t pb[BN / 16][4];
    int i = 1;
    for (; i + 1 < n; i += 2) {
      step(i, pa, pb);
      step(i + 1, pb, pa);
    }
    if (i < n) {
      step(i, pa, pb);
      last_pv(pb);
    } else {
      last_pv(pa);
    }
  } else {
    for (int i = 1; i < n; ++i) step(i, pa, pa);
    last_pv(pa);
  }
}
}  // namespace detail

using mma::kWgmmaAvailable;

template <class Tr>
__device__ __forceinline__ void fused_fwd_body(const FusedParams& p) {
  using namespace detail;
  constexpr int BM = Tr::BM, BN = Tr::BN, D = Tr::D, NT = Tr::kThreads, S = Tr::kStages;
  constexpr bool kSm90 = Tr::kSm90, kBf16 = Tr::kBf16;
  // The tiles need 1024-byte alignment (128-byte swizzle atoms): the declaration asks for it (PTX .align 1024 on the
  // dynamic shared memory), so kSmemBytes has no slack to round the base up with.
  extern __shared__ __align__(1024) uint8_t smem_cp[];
  uint8_t* smem = smem_cp;
  const uint32_t s_q = smem_u32(smem);
  const uint32_t s_kv0 = s_q + Tr::kQBytes;  // stage s: K at s_kv0 + 2s*tile, V right after

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int bh_count = p.batch * p.q_heads;
  const WorkItem it = section_item(int(blockIdx.x), p.q_tiles, bh_count, p.head_section, p.order);
  const int qt = it.tile, bh = it.unit;
  const int b = bh / p.q_heads, h = bh % p.q_heads, hk = h / p.group;
  const int q0 = qt * BM;
  const int64_t e_begin = p.row_offsets[qt];
  const int n = int(p.row_offsets[qt + 1] - e_begin);
  if (p.merge_out) {
    if (n == 0) return;  // merged into another part's rows: nothing of this part here
    if (tid < BM) merge_prefetch<D, Tr::kMapped>(p, b, h, q0 + tid);
  }

  const char* qg = static_cast<const char*>(p.q) + 2 * (int64_t(b) * p.q_sb + int64_t(h) * p.q_sh);
  const char* kg = static_cast<const char*>(p.k) + 2 * (int64_t(b) * p.k_sb + int64_t(hk) * p.k_sh);
  const char* vg = static_cast<const char*>(p.v) + 2 * (int64_t(b) * p.v_sb + int64_t(hk) * p.v_sh);

  // Mapped plans: the K and V tiles (ROWS keys of key box e, from box row 64 where `upper`; V at sk + tile bytes) at
  // tokens computed from the box's geometry (entry words z, w), each its own cp.async group where `commit`.
  // 64x64 tiles: the entry is a key strip's where p.strips (base token, strip_pack; the host refuses strip plans for
  // other shapes), its rows computed so instead.
  auto load_kv_mapped = [&](auto rows_c, auto nt_c, uint32_t sk, const int4& e, bool upper, bool commit) {
    using Rows = MappedRows<decltype(rows_c)::value, D, decltype(nt_c)::value>;
    auto copy = [&](const Rows& rows) {
      rows.copy(sk, kg, p.k_sl * 2, p.k_len, tid);
      if (commit) cp_async_commit();
      rows.copy(sk + Tr::kTileBytes, vg, p.v_sl * 2, p.k_len, tid);
      if (commit) cp_async_commit();
    };
    if constexpr (BM == 64 && BN == 64) {
      if (p.strips) return copy(Rows(typename Rows::Strip{}, e.z, e.w, p.strip_sx, p.strip_sy, tid));
    }
    copy(Rows(p.kb, e.z, e.w, upper, tid));
  };
  using Rows64 = std::integral_constant<int, 64>;
  using RowsBN = std::integral_constant<int, BN>;
  auto load_kv = [&](int i, int stage) {
    // Mapped: the whole entry (its key box's geometry); else its key tile.
    const int4 em = Tr::kMapped ? __ldg(&p.entries[e_begin + i]) : int4{};
    const int x = Tr::kMapped ? em.x : __ldg(&p.entries[e_begin + i].x);
    const int kt = x & kKtMask;
    const uint32_t sk = s_kv0 + uint32_t(stage) * 2 * Tr::kTileBytes;
    if constexpr (kSm90 && BM == 64 && BN == 128) {
      const int half = int(unsigned(x) >> kHalfShift);
      if (half) {  // narrow entry: only the 64-key half with kept keys, at the start of the stage
        const int p0 = kt * BN + 64 * (half - 1);
        if constexpr (Tr::kMapped) return load_kv_mapped(Rows64{}, std::integral_constant<int, NT>{}, sk, em, half == 2, true);
        load_tile<64, D, NT>(sk, kg, p.k_sl * 2, p0, p.k_len, p.perm_d, p.k_group, tid);
        cp_async_commit();
        load_tile<64, D, NT>(sk + Tr::kTileBytes, vg, p.v_sl * 2, p0, p.k_len, p.perm_d, p.k_group, tid);
        cp_async_commit();
        return;
      }
    }
    if constexpr (Tr::kMapped) return load_kv_mapped(RowsBN{}, std::integral_constant<int, NT>{}, sk, em, false, true);
    load_tile<BN, D, NT>(sk, kg, p.k_sl * 2, kt * BN, p.k_len, p.perm_d, p.k_group, tid);
    cp_async_commit();
    load_tile<BN, D, NT>(sk + Tr::kTileBytes, vg, p.v_sl * 2, kt * BN, p.k_len, p.perm_d, p.k_group, tid);
    cp_async_commit();
  };

  constexpr bool kDecoupled = Tr::kDecoupled;
  const int wg = warp >> 2;
  static_assert(!kDecoupled || NT == 256, "the turns meet two warpgroups");
  const Turns turns{1, 2, wg};  // kDecoupled: the two warpgroups' S issue
  const uint32_t bar_full = s_q + Tr::kBarOffset, bar_empty = bar_full + 8 * S;  // + 8 * stage
  // Decoupled path: warpgroup 0 gathers tile j into stage j % S once both warpgroups released tile j - S.
  auto issue = [&](int j) {
    const int st = j % S;
    if (j >= S) mbar_wait(bar_empty + 8 * st, ((j / S) - 1) & 1);
    if constexpr (Tr::kMapped) {
      const int4 e = __ldg(&p.entries[e_begin + j]);
      load_kv_mapped(RowsBN{}, std::integral_constant<int, 128>{}, s_kv0 + uint32_t(st) * 2 * Tr::kTileBytes, e, false, false);
    } else {
      const int kt = __ldg(&p.entries[e_begin + j].x) & kKtMask;
      const uint32_t sk = s_kv0 + uint32_t(st) * 2 * Tr::kTileBytes;
      load_tile<BN, D, 128>(sk, kg, p.k_sl * 2, kt * BN, p.k_len, p.perm_d, p.k_group, tid);
      load_tile<BN, D, 128>(sk + Tr::kTileBytes, vg, p.v_sl * 2, kt * BN, p.k_len, p.perm_d, p.k_group, tid);
    }
    mbar_arrive_copies(bar_full + 8 * st);
  };

  if constexpr (kDecoupled) {
    if (tid == 0) {
      for (int s = 0; s < S; ++s) {
        mbar_init(bar_full + 8 * s, 128);  // warpgroup 0's copies
        mbar_init(bar_empty + 8 * s, NT);  // both warpgroups done with the stage
      }
    }
    __syncthreads();
    if (n > 0) load_tile<BM, D, NT, Tr::kMapped>(s_q, qg, p.q_sl * 2, q0, p.q_len, p.perm_d, p.q_group, tid, p.q_map);
    cp_async_commit();
    if (wg == 0)
      for (int j = 0; j < S - 2 && j < n; ++j) issue(j);
    cp_async_commit();
    cp_async_wait<1>();  // Q landed (tile copies may still fly)
    fence_proxy_async();
    __syncthreads();
    turns.start();  // warpgroup 0 takes the first S = QK^T turn
  } else {
    // Prologue: Q, then the first S-1 key tiles (empty groups keep the wait counts uniform).
    if (n > 0) load_tile<BM, D, NT, Tr::kMapped>(s_q, qg, p.q_sl * 2, q0, p.q_len, p.perm_d, p.q_group, tid, p.q_map);
    cp_async_commit();
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
      if (s < n) {
        load_kv(s, s);
      } else {
        cp_async_commit();
        cp_async_commit();
      }
    }
  }

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
  const float sl2 = p.scale_log2;
  const int r0 = warp * 16 + (lane >> 2);  // this thread's first row in the tile (second: r0 + 8)
  const int cb = 2 * (lane & 3);           // this thread's first column in each 8-wide block
  uint32_t qf[kSm90 ? 1 : D / 16][4];      // Sm80: Q fragments, loaded once
  constexpr int MW = BN / 64;

  if constexpr (Tr::kPipelined) {
    // Warpgroup 0 also issues the copies S - 2 tiles ahead; stages complete on `full` mbarriers.
    if (n > 0)
      pipelined_tiles<BM, BN, D, kBf16, Tr::kTileBytes>(
          p, n, s_q + wg * 64 * 128, q0, r0, cb, sl2, o, row_max, row_sum,
          [&] {
            if (wg == 0 && S - 2 < n) issue(S - 2);
            return __ldg(&p.entries[e_begin]);
          },
          [&](int i) {
            if (wg == 0 && i + S - 2 < n) issue(i + S - 2);
            return __ldg(&p.entries[e_begin + i]);
          },
          [&](int i) {
            mbar_wait(bar_full + 8 * (i % S), (i / S) & 1);
            fence_proxy_async();  // cp.async writes are generic-proxy writes; wgmma reads through the async proxy
          },
          [&](int i) { return s_kv0 + uint32_t(i % S) * 2 * Tr::kTileBytes; },
          [&](int i) { mbar_arrive(bar_empty + 8 * (i % S)); }, [&] { turns.wait(); },
          [&] { turns.pass(); }, [] {});
  } else
  for (int i = 0; i < n; ++i) {
    const int stage = i % S;
    const uint32_t s_k = s_kv0 + uint32_t(stage) * 2 * Tr::kTileBytes;
    const uint32_t s_v = s_k + Tr::kTileBytes;
    const int4 e = __ldg(&p.entries[e_begin + i]);
    // Bitmask words of this thread's two rows, fetched before the wait so their latency hides behind it.
    unsigned long long mw[2][MW];
    tile_mask_words<BM, BN>(p, e, r0, mw);

    // One barrier per key tile: wait for K_i and V_i together, so that after it the warpgroups of a CTA run
    // unsynchronised through S = QK^T, softmax and PV (one warpgroup's softmax overlaps the other's wgmma).
    if constexpr (kDecoupled) {
      if (wg == 0 && i + S - 2 < n) issue(i + S - 2);
      mbar_wait(bar_full + 8 * stage, (i / S) & 1);
      fence_proxy_async();
    } else {
      cp_async_wait<2 * S - 4>();  // Q, K_i and V_i landed (this thread's copies)
      fence_proxy_async();
      __syncthreads();  // everyone's copies visible; everyone done with tile i-1 (its stage is free)
      if (i + S - 1 < n) {
        load_kv(i + S - 1, (i + S - 1) % S);
      } else {
        cp_async_commit();
        cp_async_commit();
      }
    }

    // One key tile, BNX keys wide: the whole tile (BNX == BN), or (sm_90a, 64x128 tiles) the one 64-key half
    // that holds every kept key of a partial tile (`half` 1: keys 0-63, 2: keys 64-127; the plan marks such
    // entries, DevicePlan); only that half was loaded (at the start of the stage) and is multiplied.
    auto step = [&](auto bnx_c, const int half) {
      constexpr int BNX = decltype(bnx_c)::value;
      static_assert(BNX == BN || kSm90, "narrow tiles: wgmma path only");
      const int col0 = half ? 64 * (half - 1) : 0;  // first key of this step within the BN-wide tile
      // ---- S = Q K^T ----
      float s[BNX / 2];
      if constexpr (kSm90) {
        fence_regs(s);
        if constexpr (kDecoupled) turns.wait();  // my turn to issue
        wgmma_fence();
        tile_issue_s<BM, BNX, D, kBf16>(s, s_q + wg * 64 * 128, s_k);
        wgmma_commit();
        if constexpr (kDecoupled) turns.pass();  // the other warpgroup's turn
        wgmma_wait<0>();
        fence_regs(s);
      } else {
        if (i == 0) {
  #pragma unroll
          for (int kk = 0; kk < D / 16; ++kk) {
            const int mat = lane >> 3;
            ldmatrix_x4(qf[kk], s_q + sw_off<BM>(warp * 16 + (mat & 1) * 8 + (lane & 7), 2 * kk + (mat >> 1)));
          }
        }
  #pragma unroll
        for (int j = 0; j < BNX / 2; ++j) s[j] = 0.f;
  #pragma unroll
        for (int j2 = 0; j2 < BN / 16; ++j2)
  #pragma unroll
          for (int kk = 0; kk < D / 16; ++kk) {
            const int mat = lane >> 3;
            uint32_t bf[4];
            ldmatrix_x4(bf, s_k + sw_off<BN>((2 * j2 + (mat >> 1)) * 8 + (lane & 7), 2 * kk + (mat & 1)));
            mma16816<kBf16>(&s[(2 * j2) * 4], qf[kk], bf[0], bf[1]);
            mma16816<kBf16>(&s[(2 * j2 + 1) * 4], qf[kk], bf[2], bf[3]);
          }
      }

      // ---- mask partial tiles ----
      if (e.y == -2) {  // band: lo <= kp - qp <= hi, keys < kvalid
        const int k0 = (e.x & kKtMask) * BN + col0;
        tile_mask_band<BNX>(s, k0 - q0 - warp * 16, e.z, e.w, tile_kvalid(p, k0), lane);
      } else if (e.y >= 0) {
        if constexpr (BNX == BN) {
          tile_mask_bits<BN>(s, mw, cb);
        } else {  // the half's one word a row
          const unsigned long long hw[2][1] = {{half == 2 ? mw[0][MW - 1] : mw[0][0]}, {half == 2 ? mw[1][MW - 1] : mw[1][0]}};
          tile_mask_bits<64>(s, hw, cb);
        }
      }

      // ---- online softmax (base 2; a row with no key yet keeps max -inf and contributes nothing) ----
      float alpha[2];
      tile_softmax<BNX>(s, row_max, row_sum, sl2, alpha);
      tile_rescale<D>(o, alpha);
      uint32_t pa[BNX / 16][4];
      tile_to_p<BNX, kBf16>(s, pa);

      // ---- O += P V ----
      if constexpr (kSm90) {
        fence_regs(o);
        wgmma_fence();
        tile_issue_pv<BNX, D, kBf16>(o, pa, s_v);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(o);
        if constexpr (kDecoupled) mbar_arrive(bar_empty + 8 * stage);  // this thread is done with the stage
      } else {
  #pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
  #pragma unroll
          for (int n2 = 0; n2 < D / 16; ++n2) {
            const int mat = lane >> 3;
            uint32_t bf[4];
            ldmatrix_x4_trans(bf, s_v + sw_off<BN>(kk * 16 + (mat & 1) * 8 + (lane & 7), 2 * n2 + (mat >> 1)));
            mma16816<kBf16>(&o[(2 * n2) * 4], pa[kk], bf[0], bf[1]);
            mma16816<kBf16>(&o[(2 * n2 + 1) * 4], pa[kk], bf[2], bf[3]);
          }
      }
    };
    if constexpr (kSm90 && BM == 64 && BN == 128) {
      const int half = int(unsigned(e.x) >> kHalfShift);
      if (half) {
        step(std::integral_constant<int, 64>{}, half);
      } else {
        step(std::integral_constant<int, BN>{}, 0);
      }
    } else {
      step(std::integral_constant<int, BN>{}, 0);
    }
  }
  cp_async_wait<0>();
  if constexpr (kDecoupled) {
    turns.finish();  // absorb warpgroup 1's last turn hand-over
  }

  // ---- epilogue: O / l, LSE; rows outside [0, Lq) (padding) are dropped ----
  if (p.merge_out) {
    tile_store<D, typename Tr::Elem, kBf16, Tr::kMapped, true>(p, o, row_max, row_sum, b, h, q0, r0, cb, lane);
  } else {
    tile_store<D, typename Tr::Elem, kBf16, Tr::kMapped>(p, o, row_max, row_sum, b, h, q0, r0, cb, lane);
  }
}

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks) fused_fwd_kernel(const __grid_constant__ FusedParams p) {
#ifdef __CUDA_ARCH__
  // The Sm90 kernel has a body only in the sm_90a image; the Sm80 one everywhere (it also runs on Hopper).
  if constexpr (Tr::kSm90 && !kWgmmaAvailable) {
    __trap();
  } else {
    fused_fwd_body<Tr>(p);
  }
#endif
}

}  // namespace spattn::cuda::fused
