// cuda/common/fill.hpp — one value into every element of a device view (host code: g++ and nvcc alike).
#pragma once
#include <cuda_runtime.h>

#include "spattn/tensor.hpp"

namespace spattn::cuda {

// Writes `value` (rounded to the view's dtype: fp32, fp16, bf16 or fp64) to every element of `t`, any strides, on
// `stream`. An empty view (an extent of 0) launches nothing. Throws spattn::Error where the launch fails.
void fill(const TensorView& t, float value, cudaStream_t stream);

}  // namespace spattn::cuda
