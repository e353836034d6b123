// api/runtime_plan.cpp — plans of run-time masks: each call's mask is read on the host, validated, and its rows run
// as explicit patterns by the engine chosen at make_plan (the reference engine: rows from the semantics' predicate).
// A correct path for every engine; on the GPU it copies the mask to the host and waits for the stream, except where
// the device path (plan/runtime_mask.hpp, DeviceMaskRunner: tile lists written on the device) takes the call.
#include "api/runtime_plan.hpp"

#include <map>
#include <mutex>

#include "plan/runtime_mask.hpp"
#include "spattn/reference.hpp"

namespace spattn::plan {
namespace {

class MaterialisedBackend final : public RuntimeBackend {
 public:
  MaterialisedBackend(const MaskLayout& layout, const Problem& problem, Device device, Engine engine,
                      const PlanOptions& options)
      : layout_(layout), problem_(problem), device_(device), engine_(engine), options_(options) {
    options_.engine = engine;
    if (engine == Engine::cuda_fused) runner_ = make_device_mask_runner(layout, problem, device.index, &no_runner_);
  }

  void forward(const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView&,
               Stream) const override {
    refuse();
  }
  void backward(const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                const TensorView&, const TensorView&, const TensorView&, const TensorView&, Stream) const override {
    refuse();
  }

  void forward_mask(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                    const TensorView& lse, const RuntimeMask& mask, Stream stream) const override {
    if (runner_) {
      if (mask.check) validate(load_host_mask(layout_, problem_, mask, true, device_.index, stream));
      if (runner_->forward(q, k, v, o, lse, mask, stream)) {
        std::lock_guard<std::mutex> lock(mu_);
        last_ = "runtime_device: " + runner_->kernel();
        return;
      }
    }
    run(mask, stream, [&](const std::vector<BoundPattern>& pats, const Problem& pr, int64_t b0, int64_t b1) {
      auto cut = [&](const TensorView& t) { return t.data ? t.slice(0, b0, b1) : t; };
      if (engine_ == Engine::reference) {
        cpu::reference_attention(pats, pr, cut(q), cut(k), cut(v), cut(o), cut(lse));
        return std::string("reference");
      }
      const Plan plan = make_plan(pats, pr, device_, options_);
      plan.forward(cut(q), cut(k), cut(v), cut(o), cut(lse), stream);
      return plan.last_kernel();
    }, last_);
  }

  void backward_mask(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                     const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                     const TensorView& dv, const RuntimeMask& mask, Stream stream) const override {
    if (runner_) {
      if (mask.check) validate(load_host_mask(layout_, problem_, mask, true, device_.index, stream));
      if (runner_->backward(q, k, v, o, lse, dout, dq, dk, dv, mask, stream)) {
        std::lock_guard<std::mutex> lock(mu_);
        last_backward_ = "runtime_device: " + runner_->backward_kernel();
        return;
      }
    }
    run(mask, stream, [&](const std::vector<BoundPattern>& pats, const Problem& pr, int64_t b0, int64_t b1) {
      auto cut = [&](const TensorView& t) { return t.data ? t.slice(0, b0, b1) : t; };
      if (engine_ == Engine::reference) {
        cpu::reference_attention_backward(pats, pr, cut(q), cut(k), cut(v), cut(dout), cut(dq), cut(dk), cut(dv));
        return std::string("reference");
      }
      const Plan plan = make_plan(pats, pr, device_, options_);
      plan.backward(cut(q), cut(k), cut(v), cut(o), cut(lse), cut(dout), cut(dq), cut(dk), cut(dv), stream);
      return plan.last_backward_kernel();
    }, last_backward_);
  }

  std::string kernel() const override { return runner_ ? "runtime_device: " + runner_->kernel() : "runtime_rows"; }
  std::string last_kernel() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }
  std::string last_backward_kernel() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return last_backward_;
  }
  std::string explain() const override {
    if (runner_)
      return "run-time mask " + layout_.str() + ": forward on the " + runner_->explain() +
             "; the backward (and calls the device path does not take) as below\n" + host_explain();
    return host_explain() + (no_runner_.empty() ? "" : " (no device path: " + no_runner_ + ")");
  }
  std::string host_explain() const {
    return "run-time mask " + layout_.str() + ": each call's mask read on the host" +
           (device_.kind == Device::Kind::cuda ? " (copied from the device; the stream is waited for)" : "") +
           ", validated, and its rows run as explicit patterns by a plan of engine " +
           std::string(engine_name(engine_)) + " built for the call";
  }
  const MaskLayout& layout() const override { return layout_; }

 private:
  [[noreturn]] void refuse() const {
    throw Error("this plan takes its mask at every call (make_plan(MaskLayout) for mask " + layout_.str() +
                "): pass a RuntimeMask to forward / backward");
  }

  // Loads and validates the mask, then calls body(patterns, problem, b0, b1) for batch ranges whose rows agree
  // (all of them at once where every batch element has the same rows); records the kernel it names in `last`.
  template <class Body>
  void run(const RuntimeMask& mask, Stream stream, Body&& body, std::string& last) const {
    const bool on_device = device_.kind == Device::Kind::cuda;
    const HostMask m = load_host_mask(layout_, problem_, mask, on_device, device_.index, stream);
    validate(m);
    std::optional<MaskPredicate> pred;
    if (engine_ == Engine::reference) pred.emplace(m);
    const int64_t B = problem_.batch, H = problem_.q_heads;
    bool same_batches = true;
    for (int64_t b = 1; b < B && same_batches; ++b)
      for (int64_t h = 0; h < H; ++h) same_batches = same_batches && row_group(m, b, h) == row_group(m, 0, h);
    std::string ran;
    for (int64_t b0 = 0; b0 < B;) {
      const int64_t b1 = same_batches ? B : b0 + 1;
      std::map<int64_t, BoundPattern> rows;  // by row group
      std::vector<BoundPattern> pats;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t g = row_group(m, b0, h);
        auto it = rows.find(g);
        if (it == rows.end())
          it = rows.emplace(g, pred ? predicate_rows(*pred, m, b0, h) : mask_rows(m, b0, h)).first;
        pats.push_back(it->second);
      }
      if (rows.size() == 1) pats.resize(1);
      Problem pr = problem_;
      pr.batch = b1 - b0;
      ran = body(pats, pr, b0, b1);
      b0 = b1;
    }
    std::lock_guard<std::mutex> lock(mu_);
    last = "runtime_rows: " + ran;
  }

  MaskLayout layout_;
  Problem problem_;
  Device device_;
  Engine engine_;
  PlanOptions options_;
  std::unique_ptr<DeviceMaskRunner> runner_;  // the device path (cuda_fused plans it takes), else null
  std::string no_runner_;                     // why there is none
  mutable std::mutex mu_;
  mutable std::string last_, last_backward_;
};

}  // namespace

std::unique_ptr<RuntimeBackend> make_runtime_backend(const MaskLayout& layout, const Problem& problem, Device device,
                                                     Engine engine, const PlanOptions& options) {
  return std::make_unique<MaterialisedBackend>(layout, problem, device, engine, options);
}

}  // namespace spattn::plan
