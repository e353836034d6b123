// cuda/tsvd/kernels.hpp — the TSVD matmul kernels' parameters and launchers (host side; kernels.cu).
//
// Device layout of the factors (built by TsvdGpu from TsvdFactors): one rank r for every tile, padded with zeros
// to rp (a multiple of 16, the mma k-step); tiles row-major (t = i * tile_cols + j):
//   a: [tile_rows][tile_cols][rp][tile_k]     (A_ij^T = (U_r S_r)^T: K contiguous, the K-major B operand of P = X A)
//   b: [tile_rows][tile_cols][rp][tile_n]     (B_ij = V_r^T: N contiguous, the N-major B operand of Y += P B)
// X is M x K and Y is M x N, row-major, bf16 or fp16; accumulation in fp32.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/tmap.hpp"         // TensorMapBytes
#include "cuda/tsvd/smem_layout.hpp"     // the CTA tiles (kBM, kWgBM, ...) and shared-memory layouts

namespace spattn::cuda::tsvd {


struct Params {
  const void* x = nullptr;
  const void* a = nullptr;
  const void* b = nullptr;
  void* y = nullptr;
  float* partial = nullptr;  // fixup slots: mma [grid][2][kBM * kBN]; gemv [splits][N]
  int* counters = nullptr;   // arrivals per output tile (mma) / tile column (gemv); zero between launches
  int m = 0, k = 0, n = 0, tile_k = 0, tile_n = 0, rp = 0;
  int tile_cols = 0, kt = 0;  // tile columns of the factors; K tile rows
  // mma: output tiles m_tiles x n_tiles (of kBM x kBN); the (tile, tile row) iterations, `total`, are split evenly
  // over `grid` CTAs (grid == tiles: one CTA per tile; fewer: stream-K). gemv: `grid` = tile_cols * splits.
  int m_tiles = 0, n_tiles = 0, splits = 1;
  long long total = 0;
  int grid = 0;
};

// Fused tensor-core TSVD matmul (mma.sync m16n8k16): per (output tile, tile row i), P = X_i A_ij stays in
// registers, then Y += P B_ij. Needs tile_k % kBK == 0, tile_n % kBN == 0, rp in {16, 32, 64, 128}.
void launch_mma(const Params& p, bool bf16, cudaStream_t stream);
size_t mma_smem_bytes(int rp);
int mma_ctas_per_sm(int rp, bool bf16);  // occupancy (for the stream-K grid)
// M = 1: one CTA per (tile column, split of its tile rows), A_ij and B_ij streamed once with 16-byte loads.
// Needs tile_k % 8 == 0, tile_n % 8 == 0, tile_n <= 2048, rp <= 256.
void launch_gemv(const Params& p, bool bf16, cudaStream_t stream);
// M = 1 on sm_90a (wgmma.cu): the same split of the tile rows, each CTA keeping gemv_smem's ring of tile rows (x_i,
// A_ij^T, B_ij by bulk copies) in flight. Needs gemv_bulk_fits.
bool gemv_bulk_fits(int tile_k, int tile_n, int rp);
void launch_gemv_bulk(const Params& p, bool bf16, cudaStream_t stream);

// ---- Hopper (sm_90a): warp-specialized wgmma kernel (wgmma.cu) ----
// CTA: one producer warpgroup (one thread issues the TMA copies) and two consumer warpgroups of 64 rows each;
// output tile kWgBM x BN (BN = 256 where tile_n % 256 == 0 and rp <= 64, else 128; BN divides tile_n). Per tile
// row i: P = X_i A_ij by SS wgmma (m64 n rp k16) over K-chunks of 64, P rounded to 16 bits in registers, then
// Y += P B_ij by RS wgmma (m64 n BN k16). With splits > 1 the kt tile rows of an output tile are split over
// `splits` CTAs (fp32 slots, the last to arrive adds them in split order).
struct WgParams {
  TensorMapBytes tmap_x;  // X: {K, M}, boxes 64 x kWgBM, 128-byte swizzle, rows past M zero-filled
  TensorMapBytes tmap_a;  // a: {tile_k, tiles * rp}, boxes 64 x rp
  TensorMapBytes tmap_b;  // b: {tile_n, tiles * rp}, boxes 64 x rp
  Params p;               // m_tiles x n_tiles output tiles of kWgBM x bn; grid = tiles * splits
  int bn = 0;
};
// Which BN the wgmma kernel uses for these factors (0: it cannot run them: tile_k % 64, tile_n % 128, rp not in
// {16, 32, 64, 128}).
int wgmma_bn(int tile_k, int tile_n, int rp);
size_t wgmma_smem_bytes(int rp, int bn);
void launch_wgmma(const WgParams& w, bool bf16, cudaStream_t stream);

}  // namespace spattn::cuda::tsvd
