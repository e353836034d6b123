// cuda/fused/launch.cuh — instantiation and launch of one kernel configuration (shared by the per-arch files).
#pragma once
#include <mutex>

#include "cuda/fused/fused_fwd.cuh"
#include "cuda/fused/fused_fwd_band.cuh"
#include "cuda/fused/fused_fwd_ws.cuh"
#include "cuda/fused/fused_params.hpp"

namespace spattn::cuda::fused {

enum class Kind { kCpAsync, kWs, kBand };

template <class Tr, Kind kKind = Kind::kCpAsync>
cudaError_t launch_one(const LaunchParams& p, cudaStream_t stream) {
  void (*kernel)(FusedParams) = nullptr;
  if constexpr (kKind == Kind::kWs) {
    kernel = fused_fwd_ws_kernel<Tr>;
  } else if constexpr (kKind == Kind::kBand) {
    kernel = fused_fwd_band_kernel<Tr>;
  } else {
    kernel = fused_fwd_kernel<Tr>;
  }
  // Raise the dynamic shared-memory limit once per process and device (kernel attributes are per device).
  static std::once_flag once[64];
  static cudaError_t attr_err[64] = {};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  std::call_once(once[dev & 63], [&] {
    attr_err[dev & 63] = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              Tr::kSmemBytes);
  });
  if (attr_err[dev & 63] != cudaSuccess) return attr_err[dev & 63];
  kernel<<<p.grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p.kernel);
  return cudaGetLastError();
}

// The configurations (one table: dispatch, the planner's shapes and the test sweep all follow it):
//   tiles 128x128 (two warpgroups), 64x128 (one; head dim 64 only: at 128 a stage is 64 KB) and 64x64 (one),
//   head dim 64 and 128, bf16 and fp16.
template <bool kSm90>
int launch_table(const LaunchParams& p, void* stream_) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  if constexpr (kSm90) {
    // The band kernel (band-row plans): 192 query rows, head dim 64; with or without running-max steps.
    if (p.band) {
      if (!p.ws || p.block_m != 192 || p.head_dim != 64) return int(cudaErrorInvalidConfiguration);
      if (p.band_running_max) {
        if (p.bf16) return int(launch_one<BandTraits<192, true, true>, Kind::kBand>(p, stream));
        return int(launch_one<BandTraits<192, false, true>, Kind::kBand>(p, stream));
      }
      if (p.bf16) return int(launch_one<BandTraits<192, true>, Kind::kBand>(p, stream));
      return int(launch_one<BandTraits<192, false>, Kind::kBand>(p, stream));
    }
    // Warp-specialized TMA kernels: 128x128 and 192x128 at head dim 64, 128x128 at 128.
#define SPATTN_FUSED_WS_CASE(BM, BN, D)                                                        \
    if (p.ws && p.block_m == BM && p.block_n == BN && p.head_dim == D) {                       \
      if (p.bf16) return int(launch_one<WsTraits<BM, BN, D, true>, Kind::kWs>(p, stream));     \
      return int(launch_one<WsTraits<BM, BN, D, false>, Kind::kWs>(p, stream));                \
    }
    SPATTN_FUSED_WS_CASE(128, 128, 64)
    SPATTN_FUSED_WS_CASE(192, 128, 64)
    SPATTN_FUSED_WS_CASE(128, 128, 128)
#undef SPATTN_FUSED_WS_CASE
    if (p.ws) return int(cudaErrorInvalidConfiguration);
  }
#define SPATTN_FUSED_CASE(BM, BN, D)                                            \
  if (p.block_m == BM && p.block_n == BN && p.head_dim == D) {                  \
    if (p.bf16) return int(launch_one<Traits<BM, BN, D, true, kSm90>>(p, stream));   \
    return int(launch_one<Traits<BM, BN, D, false, kSm90>>(p, stream));              \
  }
  SPATTN_FUSED_CASE(128, 128, 64)
  SPATTN_FUSED_CASE(64, 128, 64)
  SPATTN_FUSED_CASE(64, 64, 64)
  SPATTN_FUSED_CASE(128, 128, 128)
  SPATTN_FUSED_CASE(64, 64, 128)
#undef SPATTN_FUSED_CASE
  return int(cudaErrorInvalidConfiguration);
}

}  // namespace spattn::cuda::fused
