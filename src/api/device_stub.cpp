// host_memory_limit(); list_gpus() and the device queries of cuda/common/device.hpp for builds without CUDA (the CUDA
// build defines them in src/cuda/common/device.cpp).
#include "spattn/config.hpp"
#include "spattn/device.hpp"

#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <string>

#include "spattn/error.hpp"

namespace spattn {
int64_t host_memory_limit() {
  if (const char* env = std::getenv("SPATTN_MEMORY_LIMIT"); env && *env) {
    char* end = nullptr;
    const double v = std::strtod(env, &end);
    const std::string unit = end ? end : "";
    const int shift = unit.empty() ? 0 : unit == "K" ? 10 : unit == "M" ? 20 : unit == "G" ? 30 : unit == "T" ? 40 : -1;
    if (!(v > 0) || shift < 0 || v * double(int64_t(1) << shift) > 9e18)
      throw Error("SPATTN_MEMORY_LIMIT='" + std::string(env) + "': expected a positive number of bytes, optionally with K, M, G or T");
    return int64_t(v * double(int64_t(1) << shift));
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  int64_t have = pages > 0 && page > 0 ? int64_t(pages) * int64_t(page) : 0;
  std::ifstream cg("/sys/fs/cgroup/memory.max");  // cgroup v2 ("max": none)
  if (std::string s; cg >> s && !s.empty() && std::isdigit(static_cast<unsigned char>(s[0]))) {
    const int64_t lim = std::strtoll(s.c_str(), nullptr, 10);
    if (lim > 0 && (have == 0 || lim < have)) have = lim;
  }
  return have;
}
}  // namespace spattn

#if !SPATTN_HAVE_CUDA
#include "cuda/common/device.hpp"

namespace spattn {
namespace cuda {
int device_count() { return 0; }
std::string device_name(int) { return "none"; }
}  // namespace cuda
std::vector<GpuInfo> list_gpus(std::string* why_none) {
  if (why_none) *why_none = "this build of spattn has no CUDA support (configured with SPATTN_CUDA=OFF or no nvcc found)";
  return {};
}
size_t release_cached_device_memory(int) { return 0; }
}  // namespace spattn
#endif

// The CUDA engines' factories for builds without CUDA: make_plan on a CUDA device says why it cannot.
#if !SPATTN_HAVE_CUDA
#include "plan/backend.hpp"

namespace spattn::plan {
std::unique_ptr<Backend> make_cuda_fused_backend(const Planned&, const Problem&, int, const PlanOptions&) {
  throw Error("this build of spattn has no CUDA support (configured with SPATTN_CUDA=OFF or no nvcc found)");
}
std::unique_ptr<Backend> make_cuda_unfused_backend(const Planned&, const Problem&, int, const PlanOptions&) {
  throw Error("this build of spattn has no CUDA support (configured with SPATTN_CUDA=OFF or no nvcc found)");
}
}  // namespace spattn::plan
#endif
