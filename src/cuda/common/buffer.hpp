// cuda/common/buffer.hpp — an owned device allocation from the caching pool (cuda/common/pool.hpp; host code: g++
// and nvcc alike).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "cuda/common/check.hpp"
#include "cuda/common/pool.hpp"

namespace spattn::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes, const char* what = "device memory") : p_(pool_alloc(bytes, what)), bytes_(bytes) {}
  template <class T>
  static DeviceBuffer upload(const std::vector<T>& v) {
    DeviceBuffer b(v.size() * sizeof(T));
    if (b.bytes_) SPATTN_CUDA_CHECK(cudaMemcpy(b.p_, v.data(), b.bytes_, cudaMemcpyHostToDevice));
    return b;
  }
  ~DeviceBuffer() { pool_free(p_); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  template <class T = void>
  T* get() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace spattn::cuda
