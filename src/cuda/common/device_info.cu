// list_gpus(): the CUDA build path, exercised by `spattn info` on every machine (with or without a GPU).
#include <cuda_runtime.h>

#include "spattn/device.hpp"

namespace spattn {

std::vector<GpuInfo> list_gpus(std::string* why_none) {
  std::vector<GpuInfo> out;
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why_none) *why_none = std::string("CUDA runtime reports no usable GPU: ") + cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return out;
  }
  if (n == 0 && why_none) *why_none = "CUDA runtime reports 0 GPUs";
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out.push_back({i, p.name, p.major, p.minor, p.multiProcessorCount, int64_t(p.totalGlobalMem)});
  }
  return out;
}

}  // namespace spattn
