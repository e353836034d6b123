// The TSVD GPU entry points for builds without CUDA (the CUDA build defines them in src/cuda/tsvd/).
#include "spattn/config.hpp"
#include "spattn/tsvd.hpp"

#if !SPATTN_HAVE_CUDA
namespace spattn {
namespace {
[[noreturn]] void no_cuda() {
  throw Error("this build of spattn has no CUDA support (configured with SPATTN_CUDA=OFF or no nvcc found): use the CPU");
}
}  // namespace
struct TsvdGpu::Impl {};
TsvdGpu::TsvdGpu(const TsvdFactors&, DType, int) : impl_(nullptr) { no_cuda(); }
TsvdGpu::~TsvdGpu() = default;
void TsvdGpu::matmul(const void*, int64_t, void*, void*, const std::string&) { no_cuda(); }
std::string TsvdGpu::last_kernel() const { no_cuda(); }
int64_t TsvdGpu::k() const { no_cuda(); }
int64_t TsvdGpu::n() const { no_cuda(); }
DType TsvdGpu::dtype() const { no_cuda(); }
TsvdFactors tsvd_compress_gpu(const float*, int64_t, int64_t, const TsvdOptions&, int) { no_cuda(); }
}  // namespace spattn
#endif
