// cuda/common/launch.cuh — host-side kernel launch helpers (nvcc: they use <<<>>>).
#pragma once
#include <cuda_runtime.h>

#include <mutex>
#include <utility>
#include <vector>

namespace spattn::cuda {

// Launches `kernel`, with `pdl` as a programmatic dependent of the kernel before it in `stream` (sm_90+: it may
// start while that one finishes; it must call ptx::pdl_wait() before reading that kernel's output, see
// cuda/common/ptx.cuh). Where the runtime refuses the attribute, an ordinary launch. The caller checks the
// launch (SPATTN_LAUNCH_CHECK).
template <class... Params, class... Args>
void launch_pdl(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  if (!pdl) {
    kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
    return;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (cudaLaunchKernelEx(&cfg, kernel, args...) != cudaSuccess) {
    (void)cudaGetLastError();  // PDL refused (not a sticky error): an ordinary launch, checked by the caller
    kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
  }
}

namespace {
// Raises `kernel`'s dynamic shared-memory limit once per device. The record is per translation unit (internal
// linkage), not a static local of the launch template: those are STB_GNU_UNIQUE symbols, one per process, so a
// second libspattn loaded beside this one (another version, an A/B build) would find the flag set by the first
// library's kernel and launch its own without the raised limit.
inline cudaError_t raise_smem_limit(const void* kernel, int bytes) {
  static std::mutex mu;
  static std::vector<std::pair<const void*, int>> done;  // (kernel, device)
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& d : done)
    if (d.first == kernel && d.second == dev) return cudaSuccess;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess) done.push_back({kernel, dev});
  return e;
}
}  // namespace

}  // namespace spattn::cuda
