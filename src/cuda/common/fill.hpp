// cuda/common/fill.hpp — element-wise writes of device views: one value into every element, or another view copied or
// added (host code: g++ and nvcc alike).
#pragma once
#include <cuda_runtime.h>

#include "spattn/tensor.hpp"

namespace spattn::cuda {

// Writes `value` (rounded to the view's dtype: fp32, fp16, bf16 or fp64) to every element of `t`, any strides, on
// `stream`. An empty view (an extent of 0) launches nothing. Throws spattn::Error where the launch fails.
void fill(const TensorView& t, float value, cudaStream_t stream);

// dst = src, or dst += src where `add` (accumulated in fp32, fp64 for fp64 views), element by element over any
// strides, on `stream`: the token ranges that context-parallel ranks exchange (src/dist) packed and their gradients
// added. Throws spattn::Error where the views differ in shape or dtype or the launch fails; an empty view launches
// nothing.
void copy(const TensorView& dst, const TensorView& src, bool add, cudaStream_t stream);

}  // namespace spattn::cuda
