// cuda/fused/kernels_sm90.cu — the wgmma (sm_90a) instantiations.
#include "cuda/fused/launch.cuh"

namespace spattn::cuda::fused {
int launch_sm90(const LaunchParams& p, void* stream) { return launch_table<true>(p, stream); }
}  // namespace spattn::cuda::fused
