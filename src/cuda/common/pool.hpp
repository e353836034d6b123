// cuda/common/pool.hpp — the caching pool of device memory behind every plan's device arrays and workspaces.
//
// A cudaMalloc costs tens of microseconds to milliseconds (large blocks map pages), and a cudaFree synchronizes the
// device; a plan of a band pattern is built in less than either. So plans take their memory from a pool, one per
// device: a block given back is kept (after cudaDeviceSynchronize, which is what cudaFree would have done: the
// device may still be running the plan's last launch), and a later request of about its size takes it without a
// runtime call. Requests are rounded up (512 bytes below 1 MiB, then 2 MiB), and a cached block serves a request
// of at least half its size. Where cudaMalloc runs out of memory, the device's cached blocks are freed and it is
// tried again. DeviceBuffer (cuda/common/buffer.hpp) is an owned block. Cached blocks are held until spattn::release_cached_device_memory() (spattn/device.hpp) or the end
// of the process (the driver reclaims them; nothing is freed from a static destructor, after the runtime's own
// teardown). Thread-safe (one mutex; no runtime call under it but cudaMalloc / cudaFree of the pool's own blocks).
#pragma once
#include <cstddef>

namespace spattn::cuda {

// A block of at least `bytes` on the current device (null for 0 bytes). Throws spattn::Error naming `what` where
// the device has no room even after the pool's cached blocks are freed.
void* pool_alloc(size_t bytes, const char* what = "device memory");
// Gives a block of pool_alloc back (null: nothing). Synchronizes its device first. Never throws.
void pool_free(void* p) noexcept;

struct PoolStats {
  size_t mallocs = 0;       // cudaMalloc calls the pool made
  size_t hits = 0;          // requests served from cached blocks
  size_t cached_bytes = 0;  // bytes held in cached (free) blocks, all devices
  size_t live_bytes = 0;    // bytes in blocks handed out and not given back
};
PoolStats pool_stats();
// Frees the cached blocks of `device` (-1: every device) to the driver; returns the bytes freed.
size_t pool_release(int device = -1) noexcept;

}  // namespace spattn::cuda
