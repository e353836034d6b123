// cuda/common/empty_backend.cpp — see empty_backend.hpp.
#include "cuda/common/empty_backend.hpp"

#include <atomic>
#include <cmath>

#include "cuda/common/device.hpp"
#include "cuda/common/fill.hpp"

namespace spattn::cuda {
namespace {

class EmptyBackend final : public plan::Backend {
 public:
  EmptyBackend(const Problem& p, int device, std::string engine) : problem_(p), device_(device), engine_(std::move(engine)) {}

  void forward(const TensorView&, const TensorView&, const TensorView&, const TensorView& o, const TensorView& lse,
               Stream stream) const override {
    DeviceScope scope(device_);
    if (problem_.kv_len == 0) {  // rows without keys (none at all where Lq = 0 too: the views are empty)
      fill(o, 0.f, static_cast<cudaStream_t>(stream));
      if (lse.data) fill(lse, -INFINITY, static_cast<cudaStream_t>(stream));
    }
    ran_ = true;
  }
  void backward(const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                const TensorView&, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                Stream stream) const override {
    DeviceScope scope(device_);
    for (const TensorView* g : {&dq, &dk, &dv}) fill(*g, 0.f, static_cast<cudaStream_t>(stream));
    ran_backward_ = true;
  }
  std::string kernel() const override { return "none"; }
  std::string last_kernel() const override { return ran_ ? "none" : ""; }
  std::string last_backward_kernel() const override { return ran_backward_ ? "none" : ""; }
  std::string explain() const override {
    const std::string shape = std::to_string(problem_.q_len) + " x " + std::to_string(problem_.kv_len);
    return engine_ + ": nothing to compute, the problem is " + shape + " (a length is 0), no attention kernel runs: " +
           (problem_.q_len == 0 ? "the forward has no query row to write, the backward writes dK = dV = 0"
                                : "the forward writes O = 0 and LSE = -inf in every query row (none has a key), the " +
                                      std::string("backward dQ = 0"));
  }

 private:
  Problem problem_;
  int device_;
  std::string engine_;
  mutable std::atomic<bool> ran_{false}, ran_backward_{false};
};

}  // namespace

std::unique_ptr<plan::Backend> make_empty_backend(const Problem& problem, int device, std::string engine) {
  return std::make_unique<EmptyBackend>(problem, device, std::move(engine));
}

}  // namespace spattn::cuda
