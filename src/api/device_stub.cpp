// list_gpus() and the device queries of cuda/common/device.hpp for builds without CUDA (the CUDA build defines them in
// src/cuda/common/device.cpp).
#include "spattn/config.hpp"
#include "spattn/device.hpp"

#if !SPATTN_HAVE_CUDA
#include "cuda/common/device.hpp"

namespace spattn {
namespace cuda {
int device_count() { return 0; }
std::string device_name(int) { return "none"; }
}  // namespace cuda
std::vector<GpuInfo> list_gpus(std::string* why_none) {
  if (why_none) *why_none = "this build of spattn has no CUDA support (configured with SPATTN_CUDA=OFF or no nvcc found)";
  return {};
}
size_t release_cached_device_memory(int) { return 0; }
}  // namespace spattn
#endif

// The CUDA engines' factories for builds without CUDA: make_plan on a CUDA device says why it cannot.
#if !SPATTN_HAVE_CUDA
#include "plan/backend.hpp"

namespace spattn::plan {
std::unique_ptr<Backend> make_cuda_fused_backend(const Planned&, const Problem&, int, const PlanOptions&) {
  throw Error("this build of spattn has no CUDA support (configured with SPATTN_CUDA=OFF or no nvcc found)");
}
std::unique_ptr<Backend> make_cuda_unfused_backend(const Planned&, const Problem&, int, const PlanOptions&) {
  throw Error("this build of spattn has no CUDA support (configured with SPATTN_CUDA=OFF or no nvcc found)");
}
}  // namespace spattn::plan
#endif
