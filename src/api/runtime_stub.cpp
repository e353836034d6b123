// device_to_host (plan/runtime_mask.hpp) for builds without CUDA (the CUDA build defines it in
// src/cuda/runtime/host_copy.cpp).
#include "spattn/config.hpp"

#if !SPATTN_HAVE_CUDA
#include "plan/runtime_mask.hpp"

namespace spattn::plan {
void device_to_host(void*, const void*, int64_t, int, Stream) {
  throw Error("this build of spattn has no CUDA support (configured with SPATTN_CUDA=OFF or no nvcc found)");
}
}  // namespace spattn::plan
#endif
