// cuda/fused/launch.cuh — instantiation and launch of one kernel configuration (shared by the per-arch files).
#pragma once
#include "cuda/common/launch.cuh"  // raise_smem_limit
#include "cuda/fused/fused_fwd.cuh"
#include "cuda/fused/fused_fwd_band.cuh"
#include "cuda/fused/fused_fwd_ws.cuh"
#include "cuda/fused/fused_params.hpp"
#include "plan/kernels.hpp"

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
  const cudaError_t e = raise_smem_limit(reinterpret_cast<const void*>(kernel), Tr::kSmemBytes);
  if (e != cudaSuccess) return e;
  kernel<<<p.grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p.kernel);
  return cudaGetLastError();
}

template <int BM, int BN, int D, bool kBf16>
int launch_ws(const LaunchParams& p, cudaStream_t stream) {
  // O by bulk tensor copies through o's map; where o has none (LaunchParams::o_map), 192-row tiles (no cp.async row)
  // store it by the threads, and 128-row plans do not come here (FusedFwd::to_params: the cp.async row).
  if constexpr (BM == 192) {
    if (!p.o_map) return int(launch_one<WsTraits<BM, BN, D, kBf16, false>, Kind::kWs>(p, stream));
  }
  if (!p.o_map) return int(cudaErrorInvalidConfiguration);
  return int(launch_one<WsTraits<BM, BN, D, kBf16>, Kind::kWs>(p, stream));
}

// One row of the kernel table (plan/kernels.hpp) in this architecture's file: the instantiation of row I, or
// cudaErrorInvalidConfiguration where the row belongs to the other file (or to no GPU kernel).
template <int I, bool kSm90>
int launch_row(const LaunchParams& p, cudaStream_t stream) {
  using plan::KernelKind;
  constexpr plan::KernelConfig c = plan::kKernels[I];
  if constexpr (kSm90 && c.kind == KernelKind::sm90_tma) {
    if (p.bf16) return launch_ws<c.block_m, c.block_n, c.head_dim, true>(p, stream);
    return launch_ws<c.block_m, c.block_n, c.head_dim, false>(p, stream);
  } else if constexpr (kSm90 && plan::is_band(c.kind)) {
    constexpr int BM = c.block_m, D = c.head_dim;
    static_assert(BM == plan::band_block_m(D) && c.block_n == 128, "the band kernel's items: plan::band_block_m");
    constexpr bool kRunningMax = c.kind == KernelKind::sm90_band_rmax;
    if (p.kernel.band_shifted) {  // shifted window rows (1-D neighborhoods): the instantiation with the clamps
      if (p.bf16) return int(launch_one<BandTraits<BM, D, true, kRunningMax, true>, Kind::kBand>(p, stream));
      return int(launch_one<BandTraits<BM, D, false, kRunningMax, true>, Kind::kBand>(p, stream));
    }
    if constexpr (!kRunningMax) {
      if (p.kernel.band_prefix > 0) {  // band rows with a key prefix: the instantiation that runs its chunks first
        if (p.bf16) return int(launch_one<BandTraits<BM, D, true, false, false, true>, Kind::kBand>(p, stream));
        return int(launch_one<BandTraits<BM, D, false, false, false, true>, Kind::kBand>(p, stream));
      }
    } else if (p.kernel.band_prefix > 0) {
      return int(cudaErrorInvalidConfiguration);  // no running-max instantiation with a key prefix
    }
    if (p.bf16) return int(launch_one<BandTraits<BM, D, true, kRunningMax>, Kind::kBand>(p, stream));
    return int(launch_one<BandTraits<BM, D, false, kRunningMax>, Kind::kBand>(p, stream));
  } else if constexpr ((kSm90 && c.kind == KernelKind::sm90_cp) || (!kSm90 && c.kind == KernelKind::sm80_mma)) {
    if (p.kernel.q_map != nullptr) {  // a mapped plan (tile map): the instantiation that gathers through the map
      if (p.bf16) return int(launch_one<Traits<c.block_m, c.block_n, c.head_dim, true, kSm90, true>>(p, stream));
      return int(launch_one<Traits<c.block_m, c.block_n, c.head_dim, false, kSm90, true>>(p, stream));
    }
    if constexpr (kSm90 && c.block_m == 64 && c.block_n == 64 && c.head_dim == 64) {
      // Grouped by residue: four CTAs an SM (Traits::kGathered).
      if (p.kernel.perm_d > 1) {
        if (p.bf16) return int(launch_one<Traits<64, 64, 64, true, true, false, true>>(p, stream));
        return int(launch_one<Traits<64, 64, 64, false, true, false, true>>(p, stream));
      }
    }
    if (p.bf16) return int(launch_one<Traits<c.block_m, c.block_n, c.head_dim, true, kSm90>>(p, stream));
    return int(launch_one<Traits<c.block_m, c.block_n, c.head_dim, false, kSm90>>(p, stream));
  } else {
    return int(cudaErrorInvalidConfiguration);
  }
}

template <bool kSm90, int... I>
int launch_rows(const LaunchParams& p, cudaStream_t stream, std::integer_sequence<int, I...>) {
  int e = int(cudaErrorInvalidConfiguration);
  (void)((p.kernel_row == I && (e = launch_row<I, kSm90>(p, stream), true)) || ...);
  return e;
}

// Launches the table row p.kernel (the rows of this architecture; others: cudaErrorInvalidConfiguration).
template <bool kSm90>
int launch_table(const LaunchParams& p, void* stream) {
  return launch_rows<kSm90>(p, static_cast<cudaStream_t>(stream), std::make_integer_sequence<int, plan::kNumKernels>{});
}

}  // namespace spattn::cuda::fused
