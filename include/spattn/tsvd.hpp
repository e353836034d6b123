// spattn/tsvd.hpp — TSVD: tiled SVD compression of a weight matrix and the matmul through its factors
// (thesis chapter 4, papers/multigrain-and-tsvd-thesis.txt).
//
// W (K x N, fp32, row-major) is cut into tiles of tK x tN (the last tile row / column may be shorter: ragged
// edges). Tile (i, j) is replaced by its truncated SVD U_r S_r V_r^T, stored as two factors:
//   A_ij = U_r S_r   (tk_i x r_ij, row-major)     B_ij = V_r^T   (r_ij x tn_j, row-major)
// so that Y = X W is approximated by Y[:, cols_j] = sum_i (X[:, rows_i] A_ij) B_ij.
//
// TSVD-common (thesis 4.1.4, Fig. 4.6) shares A between tiles: W is split into its tile rows (horizontal strips
// of height tK), the strips of a group are laid side by side, and one SVD of that (tK x strips*N) matrix gives
// one U_r S_r shared by every tile of those strips, and per tile the r x tn_j slice of V_r^T. `common` is the
// number of such groups (the thesis's "U" count): 1 shares one A across the whole matrix (the thesis's U1),
// ceil(K / tK) gives one A per tile row. A shorter last strip is padded with zero rows and uses the first rows
// of its group's A.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "spattn/tensor.hpp"

namespace spattn {

// How to compress. Exactly one of rank, ratio, error is set (> 0).
struct TsvdOptions {
  int64_t tile_k = 256, tile_n = 256;  // capped at K and N
  int64_t rank = 0;   // this rank in every tile (capped at the tile's smaller side)
  double ratio = 0;   // compression ratio R: r = floor(tK tN / (R (tK + tN))), at least 1 (common: see compress)
  double error = 0;   // total relative Frobenius error target: ranks chosen per tile (plain TSVD only)
  int64_t common = 0; // TSVD-common with this many shared A (groups of tile rows); 0: plain TSVD
  int threads = 0;    // 0: all hardware threads
};

// The factors of one compressed matrix. Tiles are numbered row-major: t = i * tile_cols() + j.
struct TsvdFactors {
  int64_t k = 0, n = 0, tile_k = 0, tile_n = 0;
  int64_t common = 0;           // 0: plain TSVD; else the number of shared-A groups
  std::vector<int32_t> ranks;   // per tile (plain) or per group (common)
  std::vector<float> a;         // the A blocks one after another (plain: per tile tk_i x r; common: per group tK x r)
  std::vector<float> b;         // the B blocks, per tile r x tn_j

  int64_t tile_rows() const { return (k + tile_k - 1) / tile_k; }
  int64_t tile_cols() const { return (n + tile_n - 1) / tile_n; }
  int64_t rows_of(int64_t i) const { return std::min(tile_k, k - i * tile_k); }  // tk_i
  int64_t cols_of(int64_t j) const { return std::min(tile_n, n - j * tile_n); }  // tn_j
  int64_t group_of(int64_t i) const { return common ? i * common / tile_rows() : 0; }  // common: tile row -> group
  int32_t rank(int64_t i, int64_t j) const { return ranks[size_t(common ? group_of(i) : i * tile_cols() + j)]; }
  const float* a_block(int64_t i, int64_t j) const { return a.data() + a_offset_[size_t(common ? group_of(i) : i * tile_cols() + j)]; }
  const float* b_block(int64_t i, int64_t j) const { return b.data() + b_offset_[size_t(i * tile_cols() + j)]; }
  float* a_block(int64_t i, int64_t j) { return a.data() + a_offset_[size_t(common ? group_of(i) : i * tile_cols() + j)]; }
  float* b_block(int64_t i, int64_t j) { return b.data() + b_offset_[size_t(i * tile_cols() + j)]; }
  int64_t stored() const { return int64_t(a.size() + b.size()); }     // floats kept
  double compression() const { return double(k) * double(n) / double(stored()); }
  bool uniform_rank() const;    // every tile has the same rank
  int32_t max_rank() const;

  void check_shape() const;  // K, N, tile sizes, common: Error naming the bad field
  // Checks the shape fields and ranks (Error naming the field) and computes where each block starts; then
  // a_floats() and b_floats() are the sizes a and b must have. `allocate`: resizes a and b to them (zeros);
  // else checks that they have them.
  void layout(bool allocate);
  int64_t a_floats() const { return a_offset_.empty() ? 0 : a_offset_.back(); }
  int64_t b_floats() const { return b_offset_.empty() ? 0 : b_offset_.back(); }
  void check() const;  // the shape fields, the ranks and the sizes of a and b (Error naming what is wrong)
  std::string describe() const;  // one line: shape, tile, ranks, stored floats, ratio

 private:
  // Where each A block (per tile, or per group) and each B block starts; the last entry is the total.
  void offsets(std::vector<int64_t>& a_offset, std::vector<int64_t>& b_offset) const;
  std::vector<int64_t> a_offset_, b_offset_;
};

// Compresses W (K x N, row-major fp32). Throws Error naming a bad option or shape; Error when the build has no
// LAPACK. Each tile's SVD runs in fp64 (LAPACK dgesdd); the factors are rounded to fp32.
TsvdFactors tsvd_compress(const float* w, int64_t k, int64_t n, const TsvdOptions& options);
// The rank a ratio gives for a tK x tN tile: floor(tK tN / (R (tK + tN))), at least 1.
int64_t tsvd_rank_for_ratio(int64_t tile_k, int64_t tile_n, double ratio);

// Y (M x N) = X (M x K) * TSVD(W), fp32 row-major, through the same tiles. threads 0: all.
void tsvd_matmul(const TsvdFactors& f, const float* x, int64_t m, float* y, int threads = 0);
// W reconstructed from the factors (K x N).
std::vector<float> tsvd_reconstruct(const TsvdFactors& f);

// Relative Frobenius errors ||W - TSVD(W)|| / ||W||, per tile (row-major; a zero tile gives its absolute
// error) and in total, accumulated in fp64.
struct TsvdError {
  std::vector<double> tile;
  double total = 0;
};
TsvdError tsvd_error(const float* w, const TsvdFactors& f);

// The .tsvd file (little-endian): "SPTSVD\0\0", u32 version (1), u32 flags (bit 0: common), u32 dtype (0: f32),
// u32 reserved (0), i64 K, N, tile_k, tile_n, common, then i32 ranks[] (per tile, or per group when common),
// then the A blocks, then the B blocks (f32). The reader checks every field and the file's length, and names
// the bad field in its Error.
void tsvd_save(const TsvdFactors& f, const std::string& path);
TsvdFactors tsvd_load(const std::string& path);

// ---- GPU (CUDA builds; elsewhere these throw Error saying the build has no CUDA) ----
// The factors on one GPU in bf16 or fp16, laid out for the fused kernels (plain TSVD, one rank, K % tK == 0,
// N % tN == 0). Runs Y = X * TSVD(W) with X (M x K) and Y (M x N) row-major device arrays of that dtype,
// fp32 accumulation.
class TsvdGpu {
 public:
  TsvdGpu(const TsvdFactors& f, DType dtype, int device = 0);  // Error naming why the GPU cannot run these factors
  ~TsvdGpu();
  TsvdGpu(const TsvdGpu&) = delete;
  TsvdGpu& operator=(const TsvdGpu&) = delete;
  // kernel: "auto", "tile" (one CTA per output tile), "streamk" (the K tile rows split across CTAs with a fixup),
  // "gemv" (M = 1), "gemv_bulk" (M = 1, sm_90a: each CTA keeps several tile rows of factors in flight by bulk
  // copies), "wgmma" (sm_90a: TMA and wgmma, 128-row tiles, the tile rows split across CTAs when there are fewer
  // tiles than SMs); auto: gemv_bulk at M = 1 where a tile row fits its ring (else gemv), wgmma at M >= 128 where
  // it can run and its tiles fill half the SMs, else tile. `stream` is a
  // cudaStream_t. Relaunchable; no allocation after the first call of a shape.
  void matmul(const void* x, int64_t m, void* y, void* stream = nullptr, const std::string& kernel = "auto");
  std::string last_kernel() const;
  int64_t k() const;
  int64_t n() const;
  DType dtype() const;
  struct Impl;

 private:
  Impl* impl_;
};

// Compresses on the GPU with cuSOLVER (batched: gesvdjBatched for tiles up to 32 x 32, else
// gesvdaStridedBatched), with one rank in every tile (options.rank or options.ratio; plain TSVD, K % tK == 0,
// N % tN == 0). `w` is a host array. The factors come back to the host in fp32, as tsvd_compress gives them.
TsvdFactors tsvd_compress_gpu(const float* w, int64_t k, int64_t n, const TsvdOptions& options, int device = 0);

}  // namespace spattn
