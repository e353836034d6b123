// spattn/device.hpp — which GPUs this build of spattn can see.
#pragma once
#include <cstddef>
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

// GPU plans take their device memory (tile lists, bitmasks, workspaces, scratch) from a caching pool, one per
// device: a destroyed plan's blocks go back to the pool (once the device has finished its work, as cudaFree would
// wait) and later plans reuse them, so that building a plan calls no cudaMalloc once the pool holds blocks of its
// sizes. Cached blocks are kept until this call or the end of the process (the driver reclaims them); a cudaMalloc
// that runs out of memory frees the device's cached blocks and tries again. Frees the cached (unused) blocks of
// `device` (-1: every device) and returns their bytes; the memory of live plans is untouched. Thread-safe; 0 in
// a build without CUDA.
size_t release_cached_device_memory(int device = -1);

// The host memory a problem may take, in bytes: SPATTN_MEMORY_LIMIT where set (bytes, or with a K, M, G or T suffix:
// powers of 1024), else the smaller of this machine's physical memory and its cgroup's limit; 0 when unknown.
// make_plan and `spattn run` refuse a problem whose estimate exceeds it, with both figures, before allocating.
int64_t host_memory_limit();

}  // namespace spattn
