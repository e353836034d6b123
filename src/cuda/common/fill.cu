// cuda/common/fill.cu — see fill.hpp.
#include "cuda/common/fill.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "cuda/common/check.hpp"

namespace spattn::cuda {
namespace {

struct Strided {
  int64_t n1, n2, n3;      // extents of axes 1-3 (axis 0's follows from the element count)
  int64_t s0, s1, s2, s3;  // strides, in elements
};

template <class T>
__device__ T to(float x) {
  if constexpr (std::is_same_v<T, __half>) return __float2half_rn(x);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(x);
  else return T(x);
}

// Grid-stride over the n elements in row-major order of the view's axes.
template <class T>
__global__ void fill_kernel(T* p, int64_t n, Strided v, float value) {
  const T x = to<T>(value);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % v.n3, c = (i / v.n3) % v.n2, b = (i / (v.n3 * v.n2)) % v.n1, a = i / (v.n3 * v.n2 * v.n1);
    p[a * v.s0 + b * v.s1 + c * v.s2 + d * v.s3] = x;
  }
}

template <class T>
void launch(const TensorView& t, int64_t n, float value, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const unsigned blocks = unsigned(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096));
  const Strided v{t.shape[1], t.shape[2], t.shape[3], t.stride[0], t.stride[1], t.stride[2], t.stride[3]};
  fill_kernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<T*>(t.data), n, v, value);
  SPATTN_LAUNCH_CHECK("fill_kernel");
}

}  // namespace

void fill(const TensorView& t, float value, cudaStream_t stream) {
  const int64_t n = t.shape[0] * t.shape[1] * t.shape[2] * t.shape[3];
  if (n <= 0) return;
  if (!t.data) throw Error("fill: a view of " + std::to_string(n) + " elements has no data pointer");
  switch (t.dtype) {
    case DType::f32: return launch<float>(t, n, value, stream);
    case DType::f16: return launch<__half>(t, n, value, stream);
    case DType::bf16: return launch<__nv_bfloat16>(t, n, value, stream);
    case DType::f64: return launch<double>(t, n, value, stream);
  }
  throw Error("fill: unknown dtype");
}

}  // namespace spattn::cuda
