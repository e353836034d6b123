// tsvd/blas.hpp — the Fortran BLAS / LAPACK entry points TSVD uses (internal). Present when CMake found LAPACK
// (SPATTN_HAVE_LAPACK; a LAPACK brings its BLAS). Declared here rather than through lapacke.h / cblas.h, which
// not every LAPACK package installs; the trailing size_t arguments are gfortran's hidden string lengths.
#pragma once
#include <cstddef>

#include "spattn/config.hpp"

#if SPATTN_HAVE_LAPACK
extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c, const int* ldc,
            size_t, size_t);
void dgesdd_(const char* jobz, const int* m, const int* n, double* a, const int* lda, double* s, double* u, const int* ldu,
             double* vt, const int* ldvt, double* work, const int* lwork, int* iwork, int* info, size_t);
}
#endif

namespace spattn::tsvd {

// Row-major C (m x n) = A (m x k) B (k x n) + beta C, through column-major sgemm: C^T = B^T A^T.
inline void sgemm_rowmajor(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float beta, float* c,
                           int ldc) {
#if SPATTN_HAVE_LAPACK
  const float one = 1.f;
  sgemm_("N", "N", &n, &m, &k, &one, b, &ldb, a, &lda, &beta, c, &ldc, 1, 1);
#else
  (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb, (void)beta, (void)c, (void)ldc;
#endif
}

}  // namespace spattn::tsvd
