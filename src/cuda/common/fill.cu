// cuda/common/fill.cu — see fill.hpp.
#include "cuda/common/fill.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

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
template <class T>
__device__ float widen(T x) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(x);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(x);
  else return float(x);
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

// dst (+)= src over the same shape (v: dst's extents and strides, s: src's strides).
template <class T>
__global__ void copy_kernel(T* dst, int64_t n, Strided v, const T* src, Strided s, bool add) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % v.n3, c = (i / v.n3) % v.n2, b = (i / (v.n3 * v.n2)) % v.n1, a = i / (v.n3 * v.n2 * v.n1);
    const T x = src[a * s.s0 + b * s.s1 + c * s.s2 + d * s.s3];
    T& o = dst[a * v.s0 + b * v.s1 + c * v.s2 + d * v.s3];
    if constexpr (std::is_same_v<T, double>) {
      o = add ? o + x : x;
    } else {
      o = add ? to<T>(widen(o) + widen(x)) : x;
    }
  }
}

Strided strided(const TensorView& t) {
  return {t.shape[1], t.shape[2], t.shape[3], t.stride[0], t.stride[1], t.stride[2], t.stride[3]};
}

constexpr int kThreads = 256;
unsigned blocks_for(int64_t n) { return unsigned(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096)); }

template <class T>
void launch(const TensorView& t, int64_t n, float value, cudaStream_t stream) {
  fill_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<T*>(t.data), n, strided(t), value);
  SPATTN_LAUNCH_CHECK("fill_kernel");
}

template <class T>
void launch_copy(const TensorView& dst, const TensorView& src, int64_t n, bool add, cudaStream_t stream) {
  copy_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<T*>(dst.data), n, strided(dst),
                                                          static_cast<const T*>(src.data), strided(src), add);
  SPATTN_LAUNCH_CHECK("copy_kernel");
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

void copy(const TensorView& dst, const TensorView& src, bool add, cudaStream_t stream) {
  if (dst.shape != src.shape || dst.dtype != src.dtype)
    throw Error("device copy: the views differ in shape or dtype (" + std::string(dtype_name(dst.dtype)) + " <- " +
                std::string(dtype_name(src.dtype)) + ", " + std::to_string(dst.shape[1]) + " <- " +
                std::to_string(src.shape[1]) + " rows)");
  const int64_t n = dst.shape[0] * dst.shape[1] * dst.shape[2] * dst.shape[3];
  if (n <= 0) return;
  if (!dst.data || !src.data) throw Error("device copy: a view of " + std::to_string(n) + " elements has no data pointer");
  switch (dst.dtype) {
    case DType::f32: return launch_copy<float>(dst, src, n, add, stream);
    case DType::f16: return launch_copy<__half>(dst, src, n, add, stream);
    case DType::bf16: return launch_copy<__nv_bfloat16>(dst, src, n, add, stream);
    case DType::f64: return launch_copy<double>(dst, src, n, add, stream);
  }
  throw Error("device copy: unknown dtype");
}

}  // namespace spattn::cuda
