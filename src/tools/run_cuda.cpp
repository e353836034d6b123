// `spattn run --device cuda`: uploads the inputs, runs the fused GPU kernel, downloads O and LSE.
#include "spattn/config.hpp"
#include "tools/commands.hpp"

#if !SPATTN_HAVE_CUDA
namespace spattn::tools {
double run_cuda(const BoundPattern&, const Problem&, const TensorView&, const TensorView&, const TensorView&, float*, float*,
                const std::string&) {
  throw Error("this build of spattn has no CUDA support: rebuild with a CUDA compiler (SPATTN_CUDA=ON), or use --device cpu");
}
}  // namespace spattn::tools
#else
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "spattn/device.hpp"
#include "spattn/fused.hpp"

namespace spattn::tools {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) { check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(p); }
};

// Copies a host view into a contiguous device buffer of dtype t (converting on the host when needed).
TensorView upload(const TensorView& h, DType t, std::vector<std::unique_ptr<DeviceBuffer>>& keep) {
  const int64_t n = h.shape[0] * h.shape[1] * h.shape[2] * h.shape[3];
  std::vector<uint16_t> host(static_cast<size_t>(n));
  const TensorView dst = TensorView::contiguous(host.data(), t, h.shape);
  for (int64_t a = 0; a < h.shape[0]; ++a)
    for (int64_t b = 0; b < h.shape[1]; ++b)
      for (int64_t c = 0; c < h.shape[2]; ++c)
        for (int64_t d = 0; d < h.shape[3]; ++d) dst.store(a, b, c, d, h.load(a, b, c, d));
  keep.push_back(std::make_unique<DeviceBuffer>(size_t(n) * 2));
  check(cudaMemcpy(keep.back()->p, host.data(), size_t(n) * 2, cudaMemcpyHostToDevice), "upload");
  return TensorView::contiguous(keep.back()->p, t, h.shape);
}

}  // namespace

double run_cuda(const BoundPattern& pat, const Problem& p, const TensorView& q, const TensorView& k, const TensorView& v, float* o,
                float* lse, const std::string& impl) {
  if (impl != "auto" && impl != "fused") throw Error("unknown --impl '" + impl + "' for --device cuda (use auto|fused)");
  std::string why;
  if (list_gpus(&why).empty()) throw Error("--device cuda: " + why);
  const DType t = p.dtype == DType::f16 ? DType::f16 : DType::bf16;
  if (p.dtype != DType::bf16 && p.dtype != DType::f16)
    std::fprintf(stderr, "spattn run: note: the GPU kernel takes bf16 or fp16; %s inputs are rounded to bf16\n",
                 std::string(dtype_name(p.dtype)).c_str());
  std::vector<std::unique_ptr<DeviceBuffer>> keep;
  const TensorView dq = upload(q, t, keep), dk = upload(k, t, keep), dv = upload(v, t, keep);
  const int64_t on = p.batch * p.q_len * p.q_heads * p.dv(), ln = p.batch * p.q_heads * p.q_len;
  // O comes back in the input dtype (the kernel's epilogue writes bf16/fp16); LSE in fp32.
  DeviceBuffer od(size_t(on) * 2), ld(size_t(ln) * 4);
  const TensorView ov = TensorView::contiguous(od.p, t, {p.batch, p.q_len, p.q_heads, p.dv()});
  const TensorView lv = TensorView::contiguous(ld.p, DType::f32, {p.batch, p.q_heads, p.q_len, 1});
  Problem dp = p;
  dp.dtype = t;
  FusedAttention attn(pat, p.head_dim);
  const FusedStatus st = attn.can_implement(dp, dq, dk, dv, ov, lv);
  if (!st.ok) throw Error("the fused GPU kernel cannot run this problem: " + st.reason);
  attn.run(dp, dq, dk, dv, ov, lv);  // warm-up
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "cudaEventCreate");
  check(cudaEventCreate(&e1), "cudaEventCreate");
  check(cudaEventRecord(e0), "cudaEventRecord");
  attn.run(dp, dq, dk, dv, ov, lv);
  check(cudaEventRecord(e1), "cudaEventRecord");
  check(cudaEventSynchronize(e1), "kernel");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::vector<uint16_t> o16(static_cast<size_t>(on));
  check(cudaMemcpy(o16.data(), od.p, size_t(on) * 2, cudaMemcpyDeviceToHost), "download");
  for (int64_t i = 0; i < on; ++i) o[i] = t == DType::f16 ? half_to_float(o16[size_t(i)]) : bf16_to_float(o16[size_t(i)]);
  check(cudaMemcpy(lse, ld.p, size_t(ln) * 4, cudaMemcpyDeviceToHost), "download");
  return ms / 1e3;
}

}  // namespace spattn::tools
#endif
