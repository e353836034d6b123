// list_gpus() for builds without CUDA (the CUDA build defines it in src/cuda/common/device.cpp).
#include "spattn/config.hpp"
#include "spattn/device.hpp"

#if !SPATTN_HAVE_CUDA
namespace spattn {
std::vector<GpuInfo> list_gpus(std::string* why_none) {
  if (why_none) *why_none = "this build of spattn has no CUDA support (configured with SPATTN_CUDA=OFF or no nvcc found)";
  return {};
}
}  // namespace spattn
#endif
