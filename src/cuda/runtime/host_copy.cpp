// cuda/runtime/host_copy.cpp — a run-time mask's tensors to the host (plan/runtime_mask.hpp, device_to_host): the
// checking mode and the host-materialised path of GPU plans. Waits for the stream.
#include "cuda/common/check.hpp"
#include "cuda/common/device.hpp"
#include "plan/runtime_mask.hpp"

namespace spattn::plan {

void device_to_host(void* dst, const void* src, int64_t bytes, int device, Stream stream) {
  const cuda::DeviceScope scope(device);
  auto s = static_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  SPATTN_CUDA_CHECK(cudaStreamIsCapturing(s, &capturing));
  if (capturing != cudaStreamCaptureStatusNone)
    throw Error("a run-time mask's call needs its tensors on the host (the host path, or the checking mode), which "
                "cannot run inside a CUDA graph capture: see the plan's explain() for the calls the device path takes");
  SPATTN_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDefault, s));
  SPATTN_CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace spattn::plan
