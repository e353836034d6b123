// tests/gpu/require_gpu.hpp — REQUIRE_GPU(): a GPU test skips itself where no CUDA device is usable, with the reason
// spattn::list_gpus gives (e.g. "no CUDA device (no NVIDIA driver is installed; cudaGetDeviceCount: ...)").
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

#include "spattn/device.hpp"

#define REQUIRE_GPU()                                                    \
  do {                                                                   \
    std::string why_no_gpu;                                              \
    if (spattn::list_gpus(&why_no_gpu).empty()) GTEST_SKIP() << why_no_gpu; \
  } while (0)

// The current device is compute capability 9.0 (where the sm_90a kernels run).
inline bool on_sm90a() {
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return major == 9 && minor == 0;
}
