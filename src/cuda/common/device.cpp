// cuda/common/device.cpp — device attributes (cuda/common/device.hpp), and list_gpus(), the CUDA build's device
// list, exercised by `spattn info` on every machine (with or without a GPU).
#include "cuda/common/device.hpp"

#include <cuda_runtime.h>

#include <map>
#include <mutex>

#include "cuda/common/check.hpp"
#include "spattn/device.hpp"

namespace spattn {

namespace cuda {

int current_device() {
  int dev = 0;
  SPATTN_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

DeviceScope::DeviceScope(int device) : prev_(current_device()) {
  if (prev_ != device) SPATTN_CUDA_CHECK(cudaSetDevice(device));
}
DeviceScope::~DeviceScope() { cudaSetDevice(prev_); }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string device_name(int device) {
  // Read once per device: cudaGetDeviceProperties can take milliseconds, and explain() (the C API's plan_create
  // calls it) asks each time.
  static std::mutex mu;
  static std::map<int, std::string> names;
  std::lock_guard<std::mutex> lock(mu);
  if (const auto it = names.find(device); it != names.end()) return it->second;
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return "?";
  return names[device] = p.name;
}

namespace {
DeviceInfo query(int dev) {
  auto attribute = [dev](cudaDeviceAttr attr) {
    int v = 0;
    SPATTN_CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, dev));
    return v;
  };
  DeviceInfo d;
  d.sms = attribute(cudaDevAttrMultiProcessorCount);
  d.cc = attribute(cudaDevAttrComputeCapabilityMajor) * 10 + attribute(cudaDevAttrComputeCapabilityMinor);
  d.max_smem_optin = attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  d.l2_bytes = attribute(cudaDevAttrL2CacheSize);
  return d;
}
}  // namespace

DeviceInfo device_info(int dev) {
  // Devices 0-63 cached (a once_flag each: no lock once read); any others (none seen so far) queried every time.
  constexpr int kCached = 64;
  static std::once_flag once[kCached];
  static DeviceInfo cache[kCached];
  if (dev < 0 || dev >= kCached) return query(dev);
  std::call_once(once[dev], [dev] { cache[dev] = query(dev); });  // a throw leaves the flag unset
  return cache[dev];
}

}  // namespace cuda

std::vector<GpuInfo> list_gpus(std::string* why_none) {
  std::vector<GpuInfo> out;
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    // Said as a person reads it: on a machine with no GPU the runtime's own words are "CUDA driver version is
    // insufficient for CUDA runtime version" (there is no driver at all); they follow in parentheses.
    int driver = 0;
    cudaDriverGetVersion(&driver);
    const std::string detail = err != cudaSuccess ? std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err)
                                                  : "cudaGetDeviceCount: 0 devices";
    if (why_none) {
      if (driver == 0) *why_none = "no CUDA device (no NVIDIA driver is installed; " + detail + ")";
      else if (err == cudaSuccess || err == cudaErrorNoDevice) *why_none = "no CUDA device (" + detail + ")";
      else *why_none = "no usable CUDA device (" + detail + ")";
    }
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return out;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out.push_back({i, p.name, p.major, p.minor, p.multiProcessorCount, int64_t(p.totalGlobalMem)});
  }
  return out;
}

}  // namespace spattn
