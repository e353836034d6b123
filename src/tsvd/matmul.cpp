// The CPU TSVD matmul: the tiles of the factors through sgemm (or loops), tasks on the library's worker pool.
#include "tsvd/matmul.hpp"

#include <cstring>
#include <thread>
#include <vector>

#include "common/parallel.hpp"
#include "tsvd/blas.hpp"

namespace spattn {
namespace tsvd {
namespace {

// Rows of X per task: P (64 x r) and the Y block stay in L2 while the tile row loop runs; M = 1 gives one task
// per tile column.
constexpr int64_t kRowsPerTask = 64;

// C (m x n, ldc) += A (m x k, lda) B (k x n, row-major, ldb = n): row by row, axpy over B's rows (vectorised).
void gemm_loops(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    float* ci = c + i * ldc;
    for (int64_t q = 0; q < k; ++q) {
      const float s = a[i * lda + q];
      const float* bq = b + q * n;
      for (int64_t col = 0; col < n; ++col) ci[col] += s * bq[col];
    }
  }
}

}  // namespace

void matmul_cpu(const TsvdFactors& f, const float* x, int64_t m, float* y, int threads, bool blas) {
  if (m < 0) throw Error("TSVD matmul: M = " + std::to_string(m) + " must not be negative");
#if !SPATTN_HAVE_LAPACK
  if (blas) throw Error("TSVD matmul: this build has no BLAS (configured without LAPACK)");
#endif
  const int64_t tr = f.tile_rows(), tc = f.tile_cols(), mb = (m + kRowsPerTask - 1) / kRowsPerTask;
  const int64_t rmax = f.max_rank();
  if (threads <= 0) threads = common::hardware_threads();
  common::parallel_for(mb * tc, threads, [&](int64_t task, int) {
    const int64_t j = task % tc, m0 = (task / tc) * kRowsPerTask, rows = std::min(kRowsPerTask, m - m0);
    const int64_t tn = f.cols_of(j);
    float* yb = y + m0 * f.n + j * f.tile_n;  // rows x tn, ld N
    for (int64_t p = 0; p < rows; ++p) std::memset(yb + p * f.n, 0, size_t(tn) * sizeof(float));
    thread_local std::vector<float> pbuf;
    pbuf.resize(size_t(rows * rmax));
    for (int64_t i = 0; i < tr; ++i) {
      const int64_t tk = f.rows_of(i), r = f.rank(i, j);
      const float* xb = x + m0 * f.k + i * f.tile_k;  // rows x tk, ld K
      if (blas) {
        sgemm_rowmajor(int(rows), int(r), int(tk), xb, int(f.k), f.a_block(i, j), int(r), 0.f, pbuf.data(), int(r));
        sgemm_rowmajor(int(rows), int(tn), int(r), pbuf.data(), int(r), f.b_block(i, j), int(tn), 1.f, yb, int(f.n));
      } else {
        std::fill(pbuf.begin(), pbuf.begin() + rows * r, 0.f);
        gemm_loops(rows, r, tk, xb, f.k, f.a_block(i, j), pbuf.data(), r);
        gemm_loops(rows, tn, r, pbuf.data(), r, f.b_block(i, j), yb, f.n);
      }
    }
  });
}

}  // namespace tsvd

void tsvd_matmul(const TsvdFactors& f, const float* x, int64_t m, float* y, int threads) {
  tsvd::matmul_cpu(f, x, m, y, threads, SPATTN_HAVE_LAPACK);
}

}  // namespace spattn
