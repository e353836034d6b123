// spattn/device.hpp — which GPUs this build of spattn can see.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace spattn {

struct GpuInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int multiprocessors = 0;
  int64_t memory_bytes = 0;
};

// The GPUs the CUDA runtime reports. When there are none (no CUDA in this build, no driver, no device),
// returns an empty list and sets *why_none to the reason.
std::vector<GpuInfo> list_gpus(std::string* why_none = nullptr);

}  // namespace spattn
