// `spattn run --device cuda`: uploads the inputs, runs a Plan on CUDA device 0, downloads O and LSE (and, asked,
// the gradients of Plan::backward).
#include "spattn/config.hpp"
#include "tools/commands.hpp"

#if !SPATTN_HAVE_CUDA
namespace spattn::tools {
double run_cuda(const Pattern&, const Problem&, const TensorView&, const TensorView&, const TensorView&, float*, float*,
                const PlanOptions&, std::string*, RunBackward*) {
  throw Error("this build of spattn has no CUDA support: rebuild with a CUDA compiler (SPATTN_CUDA=ON), or use --device cpu");
}
}  // namespace spattn::tools
#else
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "spattn/device.hpp"

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
  std::vector<uint8_t> host(size_t(n) * size_t(dtype_size(t)));
  const TensorView dst = TensorView::contiguous(host.data(), t, h.shape);
  for (int64_t a = 0; a < h.shape[0]; ++a)
    for (int64_t b = 0; b < h.shape[1]; ++b)
      for (int64_t c = 0; c < h.shape[2]; ++c)
        for (int64_t d = 0; d < h.shape[3]; ++d) dst.store(a, b, c, d, h.load(a, b, c, d));
  keep.push_back(std::make_unique<DeviceBuffer>(host.size()));
  check(cudaMemcpy(keep.back()->p, host.data(), host.size(), cudaMemcpyHostToDevice), "upload");
  return TensorView::contiguous(keep.back()->p, t, h.shape);
}

// A contiguous device tensor of dtype t and `shape`, uninitialised (kept alive by `keep`).
TensorView device_tensor(DType t, std::array<int64_t, 4> shape, std::vector<std::unique_ptr<DeviceBuffer>>& keep) {
  keep.push_back(std::make_unique<DeviceBuffer>(size_t(shape[0] * shape[1] * shape[2] * shape[3]) * size_t(dtype_size(t))));
  return TensorView::contiguous(keep.back()->p, t, shape);
}

// A contiguous device tensor into host float32 [same shape] at `out`.
void download(const TensorView& dev, float* out) {
  const auto& s = dev.shape;
  std::vector<uint8_t> raw(size_t(s[0] * s[1] * s[2] * s[3]) * size_t(dtype_size(dev.dtype)));
  check(cudaMemcpy(raw.data(), dev.data, raw.size(), cudaMemcpyDeviceToHost), "download");
  const TensorView got = TensorView::contiguous(raw.data(), dev.dtype, s);
  const TensorView host = TensorView::contiguous(out, DType::f32, s);
  for (int64_t a = 0; a < s[0]; ++a)
    for (int64_t b = 0; b < s[1]; ++b)
      for (int64_t c = 0; c < s[2]; ++c)
        for (int64_t d = 0; d < s[3]; ++d) host.store(a, b, c, d, got.load(a, b, c, d));
}

// Milliseconds of fn() on the default stream, by events.
template <class Fn>
float event_ms(Fn&& fn) {
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "cudaEventCreate");
  check(cudaEventCreate(&e1), "cudaEventCreate");
  check(cudaEventRecord(e0), "cudaEventRecord");
  fn();
  check(cudaEventRecord(e1), "cudaEventRecord");
  check(cudaEventSynchronize(e1), "kernel");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms;
}

}  // namespace

double run_cuda(const Pattern& pat, const Problem& p, const TensorView& q, const TensorView& k, const TensorView& v, float* o,
                float* lse, const PlanOptions& options, std::string* engine, RunBackward* backward) {
  std::string why;
  if (list_gpus(&why).empty()) throw Error("--device cuda: " + why);
  // The fused kernels take bf16 / fp16: other inputs are rounded to bf16 unless the unfused engine (f32) is asked.
  const bool keep_f32 = p.dtype == DType::f32 && options.engine == Engine::cuda_unfused;
  const DType t = p.dtype == DType::f16 ? DType::f16 : keep_f32 ? DType::f32 : DType::bf16;
  if (p.dtype != t)
    std::fprintf(stderr, "spattn run: note: the fused GPU kernels take bf16 or fp16; %s inputs are rounded to bf16\n",
                 std::string(dtype_name(p.dtype)).c_str());
  std::vector<std::unique_ptr<DeviceBuffer>> keep;
  const TensorView dq = upload(q, t, keep), dk = upload(k, t, keep), dv = upload(v, t, keep);
  const int64_t ln = p.batch * p.q_heads * p.q_len;
  // O comes back in the input dtype (the kernels' epilogues write it); LSE in fp32.
  const TensorView ov = device_tensor(t, {p.batch, p.q_len, p.q_heads, p.dv()}, keep);
  const TensorView lv = device_tensor(DType::f32, {p.batch, p.q_heads, p.q_len, 1}, keep);
  Problem dp = p;
  dp.dtype = t;
  const Plan plan = make_plan(pat, dp, Device::cuda(0), options);
  plan.forward(dq, dk, dv, ov, lv);  // warm-up
  const float ms = event_ms([&] { plan.forward(dq, dk, dv, ov, lv); });
  *engine = std::string(engine_name(plan.engine())) + " (" + plan.last_kernel() + ")";
  download(ov, o);
  check(cudaMemcpy(lse, lv.data, size_t(ln) * 4, cudaMemcpyDeviceToHost), "download");
  if (backward) {
    // Every tensor in the plan's dtype (the GPU engines' rule), O and the LSE the forward's.
    const TensorView ddo = upload(backward->dout, t, keep);
    const TensorView gq = device_tensor(t, dq.shape, keep), gk = device_tensor(t, dk.shape, keep),
                     gv = device_tensor(t, dv.shape, keep);
    backward->seconds = event_ms([&] { plan.backward(dq, dk, dv, ov, lv, ddo, gq, gk, gv); }) / 1e3;
    backward->engine = plan.last_backward_kernel();
    download(gq, backward->dq);
    download(gk, backward->dk);
    download(gv, backward->dv);
  }
  return ms / 1e3;
}

}  // namespace spattn::tools
#endif
