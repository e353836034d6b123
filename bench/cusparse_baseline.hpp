// The cuSPARSE anchor of `spattn bench --device cuda`: SDDMM and SpMM (CSR) through the cuSPARSE C API, on
// the same inputs as ours, batched over B * H (head-major copies made once, outside the timed calls, so
// cuSPARSE gets the layout it asks for). Part of the spattn_bench library, which links cuSPARSE (libspattn does not).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "spattn/format.hpp"
#include "spattn/tensor.hpp"

struct CUstream_st;

namespace spattn::bench {

class CusparseBaseline {
 public:
  // q, k, v: device [B, L, H, D] contiguous, dtype bf16/f16/f32. Tries the input dtype first (mixed
  // precision, fp32 compute); where cuSPARSE refuses it, falls back to fp32 copies (reported by dtype()).
  CusparseBaseline(const Csr& csr, const Problem& problem, const void* q, const void* k, const void* v);
  ~CusparseBaseline();
  CusparseBaseline(const CusparseBaseline&) = delete;
  CusparseBaseline& operator=(const CusparseBaseline&) = delete;

  void sddmm(CUstream_st* stream);  // S = Q K^T on the CSR pattern (fp32 values)
  void spmm(CUstream_st* stream);   // O = P V with P the CSR values (P: S's values cast to the input dtype)
  std::string sddmm_dtype() const;
  std::string spmm_dtype() const;
  std::string mode() const;  // "batched" or "per-head loop"

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace spattn::bench
