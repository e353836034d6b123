// cuda/common/tmap.cpp — encode_tmap (cuda/common/tmap.hpp).
#include "cuda/common/tmap.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace spattn::cuda {

namespace {
// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}
}  // namespace

bool encode_tmap(TensorMapBytes& out, const TensorView& t, int rows) {
  const auto fn = encode_fn();
  if (!fn) return false;
  static_assert(sizeof(CUtensorMap) == sizeof(TensorMapBytes), "CUtensorMap is 128 bytes");
  CUtensorMap m;
  const cuuint64_t dims[4] = {cuuint64_t(t.shape[3]), cuuint64_t(t.shape[1]), cuuint64_t(t.shape[2]),
                              cuuint64_t(t.shape[0])};
  const cuuint64_t strides[3] = {cuuint64_t(t.stride[1]) * 2, cuuint64_t(t.stride[2]) * 2, cuuint64_t(t.stride[0]) * 2};
  // The driver's rules for the base and the strides (16 bytes), checked here: a view that breaks them simply
  // has no tensor map, without a failing driver call (which compute-sanitizer reports).
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0 || strides[0] % 16 || strides[1] % 16 || strides[2] % 16)
    return false;
  const cuuint32_t box[4] = {64, cuuint32_t(rows), 1, 1};
  const cuuint32_t estr[4] = {1, 1, 1, 1};
  const CUresult r = fn(&m, t.dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
                        t.data, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return false;
  std::memcpy(out.bytes, &m, sizeof m);
  return true;
}

}  // namespace spattn::cuda
