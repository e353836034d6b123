// cuda/fused/kernels_sm80.cu — the mma.sync (sm_80, also runs on sm_90) instantiations.
#include "cuda/fused/launch.cuh"

namespace spattn::cuda::fused {
int launch_sm80(const LaunchParams& p, void* stream) { return launch_table<false>(p, stream); }
}  // namespace spattn::cuda::fused
