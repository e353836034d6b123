// cuda/tsvd/smem_layout.hpp — the TSVD kernels' CTA tiles and shared-memory layouts, as constexpr functions of the
// padded rank (and the wgmma kernel's Y tile width). Plain C++: the kernels (kernels.cu, wgmma.cu) take their buffer
// offsets and sizes from here, the host sizes its dynamic shared memory from here, and tests/tsvd_layout_test.cpp
// checks every load's extent against these layouts on the CPU (the mma.sync kernel once placed its B buffers after
// a kBK-row A region while the host counted RP rows: past the allocation for RP 16 and 32, over A for RP 128).
#pragma once
#include <cstddef>

#if defined(__CUDACC__)
#define SPATTN_TSVD_HD __host__ __device__
#else
#define SPATTN_TSVD_HD
#endif

namespace spattn::cuda::tsvd {

// The tensor-core (mma.sync) kernel's CTA tile: BM rows of X / Y, BN columns of Y (inside one tile column), K-chunks
// of BK.
constexpr int kBM = 64, kBN = 128, kBK = 64, kMmaThreads = 128;
constexpr int kGemvThreads = 256;
// The Hopper wgmma kernel: kWgBM rows a CTA, K-chunks of 64, a kWgStages ring, 3 warpgroups.
constexpr int kWgBM = 128, kWgBK = 64, kWgStages = 4, kWgThreads = 384;
// Shared memory a CTA may have on sm_90 (227 KiB) and on sm_80 (163 KiB).
constexpr size_t kSmemSm90 = 232448, kSmemSm80 = 166912;

// ---- mma.sync kernel: three double-buffered regions, in 16-bit elements; rows padded by 8 elements (16 bytes)
// against ldmatrix bank conflicts.
//   xs [2][kBM][kXS]   X_i's K-chunk (kBM x kBK)
//   as [2][RP][kAS]    A_ij^T's K-chunk (RP x kBK)
//   bs [2][RP][kBS]    B_ij's columns nsub ... nsub + kBN (RP x kBN)
constexpr int kXS = kBK + 8, kAS = kBK + 8, kBS = kBN + 8;
struct MmaSmem {
  int x_off, a_off, b_off, end;  // element offsets of xs, as, bs; end = elements in all
};
SPATTN_TSVD_HD constexpr MmaSmem mma_smem(int rp) {
  const int x = 0, a = x + 2 * kBM * kXS, b = a + 2 * rp * kAS, end = b + 2 * rp * kBS;
  return MmaSmem{x, a, b, end};
}
// The element each cp.async of the kernel's loads writes (16 bytes from there): chunk vector v (0 <= v < the load's
// vector count) of buffer buf.
SPATTN_TSVD_HD constexpr int mma_x_vectors() { return kBM * kBK / 8; }
SPATTN_TSVD_HD constexpr int mma_a_vectors(int rp) { return rp * kBK / 8; }
SPATTN_TSVD_HD constexpr int mma_b_vectors(int rp) { return rp * kBN / 8; }
SPATTN_TSVD_HD constexpr int mma_x_elem(int rp, int buf, int v) {
  return mma_smem(rp).x_off + (buf * kBM + v / (kBK / 8)) * kXS + (v % (kBK / 8)) * 8;
}
SPATTN_TSVD_HD constexpr int mma_a_elem(int rp, int buf, int v) {
  return mma_smem(rp).a_off + (buf * rp + v / (kBK / 8)) * kAS + (v % (kBK / 8)) * 8;
}
SPATTN_TSVD_HD constexpr int mma_b_elem(int rp, int buf, int v) {
  return mma_smem(rp).b_off + (buf * rp + v / (kBN / 8)) * kBS + (v % (kBN / 8)) * 8;
}
// The 16-byte rows ldmatrix reads (lane's address, 8 elements from there): P = X A's X fragment (warp, k-step ks),
// its A^T fragment (k-step ks, rank pair np), Y += P B's B fragment (rank step kk, column pair np).
SPATTN_TSVD_HD constexpr int mma_ldx_elem(int rp, int buf, int warp, int ks, int lane) {
  return mma_smem(rp).x_off + buf * kBM * kXS + (warp * 16 + (lane & 15)) * kXS + ks * 16 + (lane >> 4) * 8;
}
SPATTN_TSVD_HD constexpr int mma_lda_elem(int rp, int buf, int np, int ks, int lane) {
  return mma_smem(rp).a_off + buf * rp * kAS + (np * 16 + ((lane >> 4) << 3) + (lane & 7)) * kAS + ks * 16 +
         ((lane >> 3) & 1) * 8;
}
SPATTN_TSVD_HD constexpr int mma_ldb_elem(int rp, int buf, int kk, int np, int lane) {
  return mma_smem(rp).b_off + buf * rp * kBS + (kk * 16 + (lane & 15)) * kBS + np * 16 + (lane >> 4) * 8;
}
SPATTN_TSVD_HD constexpr size_t mma_smem_bytes_for(int rp) { return size_t(mma_smem(rp).end) * 2; }

// ---- wgmma kernel, in bytes from the 1024-aligned base (the 128-byte swizzle's alignment):
//   stage s (s < kWgStages) at s * stage: X chunk (kWgBM rows x 128 bytes), then A_ij^T chunk (rp rows x 128 bytes)
//   B buffers 0, 1 at b_off + bb * b_bytes: bn / 64 column blocks of rp rows x 128 bytes (block c at c * rp * 128)
//   mbarriers at bar_off: full[S], empty[S], bfull[2], bempty[2] (8 bytes each)
//   bytes = bar_off + barriers + 1024 (the slack for aligning the dynamic shared memory's base up to 1024)
struct WgSmem {
  int x_bytes, a_bytes, stage, b_block, b_bytes, b_off, bar_off, bars, bytes;
};
SPATTN_TSVD_HD constexpr WgSmem wg_smem(int rp, int bn) {
  const int x = kWgBM * kWgBK * 2, a = rp * kWgBK * 2, stage = x + a, blk = rp * 128, b = rp * bn * 2;
  const int b_off = kWgStages * stage, bar_off = b_off + 2 * b, bars = 2 * kWgStages + 4;
  return WgSmem{x, a, stage, blk, b, b_off, bar_off, bars, bar_off + bars * 8 + 1024};
}

// ---- Hopper M = 1 kernel (tsvd_gemv_bulk), in bytes: a ring of `stages` tile rows, each x_i (tile_k 16-bit
// elements), then A_ij^T (rp x tile_k), then B_ij (rp x tile_n), every part 16-byte aligned (bulk copies); then
// p (rp floats), the column sums' reduction (kGemvThreads x 8 floats) and one mbarrier a stage. Two CTAs an SM where
// two stages fit half an SM's shared memory (kGemvStageBudget), else one CTA with the whole of it; as many stages
// as fit, 2 to 8 (stages 0: not even two fit, the kernel cannot run these factors).
constexpr int kGemvStageBudget = 112 * 1024;
struct GemvSmem {
  int x_bytes, a_bytes, b_bytes, stage, stages, ctas_per_sm, p_off, red_off, bar_off, bytes;
};
SPATTN_TSVD_HD constexpr GemvSmem gemv_smem(int tile_k, int tile_n, int rp) {
  const int x = (tile_k * 2 + 15) / 16 * 16, a = rp * tile_k * 2, b = rp * tile_n * 2, stage = x + a + b;
  const int fixed = (rp * 4 + 15) / 16 * 16 + kGemvThreads * 32 + 64;
  int ctas = 2, stages = (kGemvStageBudget - fixed) / stage;
  if (stages < 2) ctas = 1, stages = (int(kSmemSm90) - 1024 - fixed) / stage;
  stages = stages < 2 ? 0 : stages > 8 ? 8 : stages;
  const int p_off = stages * stage, red_off = p_off + (rp * 4 + 15) / 16 * 16, bar_off = red_off + kGemvThreads * 32;
  return GemvSmem{x, a, b, stage, stages, ctas, p_off, red_off, bar_off, bar_off + stages * 8};
}

}  // namespace spattn::cuda::tsvd
