// device_to_host and make_device_mask_runner (plan/runtime_mask.hpp) for builds without CUDA (the CUDA build defines
// them in src/cuda/runtime/).
#include "spattn/config.hpp"

#if !SPATTN_HAVE_CUDA
#include "plan/runtime_mask.hpp"

namespace spattn::plan {
void device_to_host(void*, const void*, int64_t, int, Stream) {
  throw Error("this build of spattn has no CUDA support (configured with SPATTN_CUDA=OFF or no nvcc found)");
}
std::unique_ptr<DeviceMaskRunner> make_device_mask_runner(const MaskLayout&, const Problem&, int, std::string* why) {
  if (why) *why = "this build of spattn has no CUDA support";
  return nullptr;
}
}  // namespace spattn::plan
#endif
