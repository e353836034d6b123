// tsvd/matmul.hpp — the CPU TSVD matmul with its inner product chosen (internal; tests run both).
#pragma once
#include <cstdint>

#include "spattn/tsvd.hpp"

namespace spattn::tsvd {

// Y (M x N) = X (M x K) TSVD(W): per task (a block of X's rows, a tile column j) Y_blk = sum_i (X_blk,i A_ij) B_ij.
// blas: the two products through sgemm (when the build has LAPACK, else Error), otherwise through loops.
void matmul_cpu(const TsvdFactors& f, const float* x, int64_t m, float* y, int threads, bool blas);

}  // namespace spattn::tsvd
