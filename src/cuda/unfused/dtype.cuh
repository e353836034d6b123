// cuda/unfused/dtype.cuh — the unfused kernels' element types: conversions to and from float, 16-byte packs.
// Their PTX wrappers (cp.async, ldmatrix, mma.sync) are cuda/common/ptx.cuh's: mma.sync m16n8k16 (bf16/f16 ->
// fp32) runs on sm_80 and sm_90a alike; these kernels move more bytes than they multiply (an SDDMM tile writes 4
// bytes per 128 flops), so wgmma would not change their time.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace spattn::unfused::detail {

// mma16816<kIsBf16<T>>: bf16 or fp16 inputs.
template <class T>
inline constexpr bool kIsBf16 = std::is_same_v<T, __nv_bfloat16>;

template <class T> struct Num;
template <> struct Num<__nv_bfloat16> {
  static __device__ __forceinline__ float to(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from(float x) { return __float2bfloat16_rn(x); }
};
template <> struct Num<__half> {
  static __device__ __forceinline__ float to(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from(float x) { return __float2half_rn(x); }
};
template <> struct Num<float> {
  static __device__ __forceinline__ float to(float x) { return x; }
  static __device__ __forceinline__ float from(float x) { return x; }
};

// 16 bytes of T unpacked to floats: 8 halves or 4 floats.
template <class T> struct Vec {
  static constexpr int N = 16 / int(sizeof(T));
};
template <class T>
__device__ __forceinline__ void unpack(const uint4& u, float (&f)[8]) {
  if constexpr (sizeof(T) == 4) {
    f[0] = __uint_as_float(u.x); f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z); f[3] = __uint_as_float(u.w);
  } else {
    const T* h = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = Num<T>::to(h[i]);
  }
}
template <class T>
__device__ __forceinline__ uint4 pack(const float (&f)[8]) {
  uint4 u;
  if constexpr (sizeof(T) == 4) {
    u.x = __float_as_uint(f[0]); u.y = __float_as_uint(f[1]);
    u.z = __float_as_uint(f[2]); u.w = __float_as_uint(f[3]);
  } else {
    T* h = reinterpret_cast<T*>(&u);
#pragma unroll
    for (int i = 0; i < 8; ++i) h[i] = Num<T>::from(f[i]);
  }
  return u;
}

}  // namespace spattn::unfused::detail
