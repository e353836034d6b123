// cuda/common/tmap.hpp — TMA tensor maps (sm_90): their bytes as plain data, and their encoding for a [B, L, H, D]
// view. Shared by the fused forward, the tile backward and the TSVD matmul; no CUDA header, so that the kernels'
// parameter structs that hold a map stay plain data.
#pragma once
#include "spattn/tensor.hpp"

namespace spattn::cuda {

// The bytes of a CUtensorMap (128, 64-byte aligned).
struct alignas(64) TensorMapBytes {
  unsigned char bytes[128];
};

// The tensor map of a [B, L, H, D] bf16 / fp16 view ({D, L, H, B}; boxes of 64 elements x `rows`, 128-byte swizzle,
// rows past L zero-filled). False where the driver refuses it (strides, alignment) or has no entry point.
bool encode_tmap(TensorMapBytes& out, const TensorView& t, int rows);

}  // namespace spattn::cuda
