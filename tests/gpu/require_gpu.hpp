// tests/gpu/require_gpu.hpp — REQUIRE_GPU(): a GPU test skips itself where no CUDA device is usable, with the reason
// spattn::list_gpus gives (e.g. "no CUDA device (no NVIDIA driver is installed; cudaGetDeviceCount: ...)").
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "spattn/device.hpp"

#define REQUIRE_GPU()                                                    \
  do {                                                                   \
    std::string why_no_gpu;                                              \
    if (spattn::list_gpus(&why_no_gpu).empty()) GTEST_SKIP() << why_no_gpu; \
  } while (0)
