// cuda/common/device.hpp — what the host code needs to know of a CUDA device, read once per device.
#pragma once
#include <cstdint>
#include <string>

namespace spattn::cuda {

struct DeviceInfo {
  int sms = 0;             // multiprocessors
  int cc = 0;              // compute capability, major * 10 + minor
  int max_smem_optin = 0;  // dynamic shared memory a CTA may opt into (bytes; cudaFuncSetAttribute)
  int64_t l2_bytes = 0;    // L2 cache (bytes; the work orders' head sections, plan::head_section)
  // Whether the sm_90a kernels (wgmma, TMA, setmaxnreg) run here: their code runs on compute capability 9.0 only
  // (architecture-specific features, the "a").
  bool sm90a() const { return cc == 90; }
};

// CUDA devices on this machine (0 where the runtime finds none or fails; it never throws), and device `device`'s
// name ("?" where the runtime cannot say), read once per device. A build without CUDA has them too
// (src/api/device_stub.cpp: 0 and "none").
int device_count();
std::string device_name(int device);

// The calling thread's current device (cudaGetDevice); throws spattn::Error.
int current_device();
// Device `dev`'s attributes, queried on the first call for that device and cached (they do not change while the
// process runs); thread-safe. Throws spattn::Error where the runtime fails (and caches nothing then).
DeviceInfo device_info(int dev);

// Makes `device` current for a scope, then restores the caller's (the engines behind spattn::Plan run on the
// plan's device whatever the caller's current one is). Throws spattn::Error where the device cannot be set.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = 0;
};

}  // namespace spattn::cuda
