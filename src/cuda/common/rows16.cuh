// cuda/common/rows16.cuh — 16-bit rows (bf16 / fp16) read and written 16 bytes at a time: the fine-grained kernels
// that gather whole K/V or Q/dO rows through L2 (fused/parts_kernels.cu's scattered part, backward/
// scattered_backward.cu). A lane holds W 16-byte words (8 elements each) of a row: fetched (the loads issued now,
// converted when used), converted to floats, both at once, and stored back from floats. Rows 16-byte aligned (the
// callers check pointers and strides).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace spattn::cuda::rows16 {

template <class T>
struct Pack;
template <>
struct Pack<__nv_bfloat16> {
  static __device__ float2 unpack(uint32_t u) { return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&u)); }
  static __device__ uint32_t pack(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};
template <>
struct Pack<__half> {
  static __device__ float2 unpack(uint32_t u) { return __half22float2(*reinterpret_cast<__half2*>(&u)); }
  static __device__ uint32_t pack(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

template <int W>
__device__ __forceinline__ void fetch(const char* p, uint4 (&w)[W]) {
#pragma unroll
  for (int i = 0; i < W; ++i) w[i] = __ldg(reinterpret_cast<const uint4*>(p) + i);
}
template <class T, int W>
__device__ __forceinline__ void to_float(const uint4 (&w)[W], float (&f)[W * 8]) {
#pragma unroll
  for (int i = 0; i < W; ++i) {
    const uint32_t x[4] = {w[i].x, w[i].y, w[i].z, w[i].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 t = Pack<T>::unpack(x[j]);
      f[i * 8 + 2 * j] = t.x;
      f[i * 8 + 2 * j + 1] = t.y;
    }
  }
}

template <class T, int E>
__device__ __forceinline__ void load_row(const void* p, float (&f)[E]) {
  uint4 w[E / 8];
  fetch<E / 8>(static_cast<const char*>(p), w);
  to_float<T, E / 8>(w, f);
}
template <class T, int E>
__device__ void store_row(void* p, const float (&f)[E]) {
  uint4* w = static_cast<uint4*>(p);
#pragma unroll
  for (int i = 0; i < E / 8; ++i)
    w[i] = make_uint4(Pack<T>::pack(f[i * 8], f[i * 8 + 1]), Pack<T>::pack(f[i * 8 + 2], f[i * 8 + 3]),
                      Pack<T>::pack(f[i * 8 + 4], f[i * 8 + 5]), Pack<T>::pack(f[i * 8 + 6], f[i * 8 + 7]));
}

}  // namespace spattn::cuda::rows16
