// cuda/common/pool.cpp — the caching pool of device memory (pool.hpp) and spattn::release_cached_device_memory.
#include "cuda/common/pool.hpp"

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cuda/common/check.hpp"
#include "spattn/device.hpp"

namespace spattn::cuda {

namespace {

struct Block {
  int device = 0;
  size_t bytes = 0;  // rounded: what cudaMalloc gave
};

struct Pool {
  std::mutex mu;
  std::unordered_map<void*, Block> live;              // handed out
  std::map<int, std::multimap<size_t, void*>> free_;  // per device: cached blocks by size
  PoolStats stats;
};

// Leaked on purpose: blocks may be given back from other static destructors, and the runtime's teardown may run
// before ours (the driver reclaims the memory at exit).
Pool& pool() {
  static Pool* p = new Pool;
  return *p;
}

size_t rounded(size_t bytes) {
  constexpr size_t kSmall = size_t(1) << 20, kLarge = size_t(2) << 20;
  return bytes <= kSmall ? (bytes + 511) / 512 * 512 : (bytes + kLarge - 1) / kLarge * kLarge;
}

// Frees the cached blocks of `device` (-1: all); the caller holds the lock.
size_t release_locked(Pool& p, int device) {
  size_t freed = 0;
  int prev = -1;
  cudaGetDevice(&prev);
  for (auto& [dev, blocks] : p.free_) {
    if ((device >= 0 && dev != device) || blocks.empty()) continue;
    cudaSetDevice(dev);
    for (auto& [bytes, ptr] : blocks) {
      cudaFree(ptr);
      freed += bytes;
    }
    blocks.clear();
  }
  if (prev >= 0) cudaSetDevice(prev);
  p.stats.cached_bytes -= freed;
  return freed;
}

}  // namespace

void* pool_alloc(size_t bytes, const char* what) {
  if (bytes == 0) return nullptr;
  int dev = 0;
  SPATTN_CUDA_CHECK(cudaGetDevice(&dev));
  const size_t want = rounded(bytes);
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  auto& cached = p.free_[dev];
  // The smallest cached block that fits, if it is no more than twice the request.
  if (auto it = cached.lower_bound(want); it != cached.end() && it->first <= 2 * want) {
    void* ptr = it->second;
    const size_t got = it->first;
    cached.erase(it);
    p.live[ptr] = {dev, got};
    p.stats.cached_bytes -= got;
    p.stats.live_bytes += got;
    ++p.stats.hits;
    return ptr;
  }
  void* ptr = nullptr;
  cudaError_t e = cudaMalloc(&ptr, want);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it and retry with the cached blocks freed
    release_locked(p, dev);
    e = cudaMalloc(&ptr, want);
  }
  if (e != cudaSuccess) check(e, (std::string("cudaMalloc for ") + what).c_str(), __FILE__, __LINE__);
  ++p.stats.mallocs;
  p.live[ptr] = {dev, want};
  p.stats.live_bytes += want;
  return ptr;
}

void pool_free(void* ptr) noexcept {
  if (!ptr) return;
  Pool& p = pool();
  Block b;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    auto it = p.live.find(ptr);
    if (it == p.live.end()) return;  // not the pool's (never happens)
    b = it->second;
  }
  // The device may still run the block's last user: wait for it, as cudaFree does, before anyone may reuse it.
  int prev = -1;
  cudaGetDevice(&prev);
  if (prev != b.device) cudaSetDevice(b.device);
  cudaDeviceSynchronize();
  if (prev >= 0 && prev != b.device) cudaSetDevice(prev);
  std::lock_guard<std::mutex> lock(p.mu);
  p.live.erase(ptr);
  p.free_[b.device].emplace(b.bytes, ptr);
  p.stats.live_bytes -= b.bytes;
  p.stats.cached_bytes += b.bytes;
}

PoolStats pool_stats() {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  return p.stats;
}

size_t pool_release(int device) noexcept {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  return release_locked(p, device);
}

}  // namespace spattn::cuda

namespace spattn {
size_t release_cached_device_memory(int device) { return cuda::pool_release(device); }
}  // namespace spattn
