// plan/kernels.cpp — name lookups in the kernel table (plan/kernels.hpp).
#include "plan/kernels.hpp"

#include <cstring>

namespace spattn::plan {

int find_kernel(const char* name) {
  for (int i = 0; i < kNumKernels; ++i)
    if (std::strcmp(kKernels[i].name, name) == 0) return i;
  return -1;
}

const char* kind_name(KernelKind kind) {
  switch (kind) {
    case KernelKind::cpu_tiles: return "cpu_fused";
    case KernelKind::sm80_mma: return "sm80";
    case KernelKind::sm90_cp: return "sm90_cp";
    case KernelKind::sm90_tma: return "sm90_tma";
    case KernelKind::sm90_band: return "sm90_band";
    case KernelKind::sm90_band_rmax: return "sm90_band_rmax";
    case KernelKind::cuda_unfused: return "cuda_unfused";
    case KernelKind::cuda_scattered: return "cuda_scattered";
    case KernelKind::sm90_bwd: return "sm90_bwd";
    case KernelKind::sm90_bwd_ws: return "sm90_bwd_ws";
    case KernelKind::cuda_csr_bwd: return "cuda_csr_bwd";
    case KernelKind::cuda_scattered_bwd: return "cuda_scattered_bwd";
  }
  return "?";
}

}  // namespace spattn::plan
