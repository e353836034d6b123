// cuda/common/check.hpp — CUDA runtime errors as spattn::Error (host code: g++ and nvcc alike).
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "spattn/error.hpp"

namespace spattn::cuda {

// Throws spattn::Error if `e` is an error, naming `what` (the failed call's text, or what was launched), where it
// was checked, and the error: "CUDA error in cudaMalloc(&p, n) (plan.cpp:12): cudaErrorMemoryAllocation: out of
// memory".
inline void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess)
    throw Error(std::string("CUDA error in ") + what + " (" + file + ":" + std::to_string(line) +
                "): " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

}  // namespace spattn::cuda

// A runtime call: SPATTN_CUDA_CHECK(cudaMalloc(&p, n));
#define SPATTN_CUDA_CHECK(expr) ::spattn::cuda::check((expr), #expr, __FILE__, __LINE__)
// Right after a kernel launch (<<<>>> returns nothing): its launch error, under `name` (the kernel's name).
#define SPATTN_LAUNCH_CHECK(name) ::spattn::cuda::check(cudaGetLastError(), (name), __FILE__, __LINE__)
