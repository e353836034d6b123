// api/runtime_plan.cpp — plans of run-time masks: each call's mask is read on the host, validated, and its rows run
// as explicit patterns by the engine chosen at make_plan (the reference engine: rows from the semantics' predicate).
// A correct path for every engine; on the GPU it copies the mask to the host and waits for the stream, except where
// the device path (plan/runtime_mask.hpp, DeviceMaskRunner: tile lists written on the device) takes the call.
#include "api/runtime_plan.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

#include "plan/runtime_mask.hpp"
#include "spattn/reference.hpp"

namespace spattn::plan {
namespace {

// A device tensor's bytes on the host: the span its strides reach (strides are never negative), copied there, the
// view re-pointed at the copy; back() writes the span to the device again (device_to_host copies either way).
struct HostCopy {
  std::vector<char> bytes;
  TensorView view;
  HostCopy(const TensorView& t, int device, Stream stream) : view(t) {
    int64_t last = 0;
    for (size_t i = 0; i < 4; ++i) {
      if (t.shape[i] == 0) return;
      last += (t.shape[i] - 1) * t.stride[i];
    }
    if (!t.data) return;
    bytes.resize(size_t((last + 1) * dtype_size(t.dtype)));
    device_to_host(bytes.data(), t.data, int64_t(bytes.size()), device, stream);
    view.data = bytes.data();
  }
  void back(const TensorView& t, int device, Stream stream) const {
    if (!bytes.empty()) device_to_host(t.data, bytes.data(), int64_t(bytes.size()), device, stream);
  }
};

// Element-wise copy of one 4-D view into another of the same shape (any dtypes).
void copy_into(const TensorView& src, const TensorView& dst) {
  for (int64_t a = 0; a < src.shape[0]; ++a)
    for (int64_t b = 0; b < src.shape[1]; ++b)
      for (int64_t c = 0; c < src.shape[2]; ++c)
        for (int64_t d = 0; d < src.shape[3]; ++d) dst.store(a, b, c, d, src.load(a, b, c, d));
}

// An fp32 host buffer shaped like `t` (contiguous), for the reference's outputs.
struct F32Buffer {
  std::vector<float> data;
  TensorView view;
  explicit F32Buffer(const TensorView& t) {
    data.resize(size_t(std::max<int64_t>(1, t.shape[0] * t.shape[1] * t.shape[2] * t.shape[3])));
    view = TensorView::contiguous(data.data(), DType::f32, t.shape);
  }
};

class MaterialisedBackend final : public RuntimeBackend {
 public:
  MaterialisedBackend(const MaskLayout& layout, const Problem& problem, Device device, Engine engine,
                      const PlanOptions& options)
      : layout_(layout), problem_(problem), device_(device), engine_(engine), options_(options) {
    options_.engine = engine;
    if (engine == Engine::cuda_fused)
      runner_ = make_device_mask_runner(layout, problem, device.index, &no_runner_);
    else if (device.kind == Device::Kind::cuda)
      no_runner_ = "engine " + std::string(engine_name(engine)) + " (the device path is cuda_fused's)";
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
      device_shapes(mask, stream);
      if (runner_->forward(q, k, v, o, lse, mask, stream)) {
        std::lock_guard<std::mutex> lock(mu_);
        last_ = "runtime_device: " + runner_->kernel();
        return;
      }
    }
    refuse_host(mask, false);
    run(mask, stream, [&](const std::vector<BoundPattern>& pats, const Problem& pr, int64_t b0, int64_t b1) {
      auto cut = [&](const TensorView& t) { return t.data ? t.slice(0, b0, b1) : t; };
      if (engine_ == Engine::reference) {
        cpu::reference_attention(pats, pr, cut(q), cut(k), cut(v), cut(o), cut(lse));
        return std::string("reference");
      }
      if (gpu_refuses(pats, pr, false))
        return reference_on_host(pats, pr, {cut(q), cut(k), cut(v)}, {cut(o), cut(lse)}, stream);
      const Plan plan = make_plan(pats, pr, device_, options_);
      plan.forward(cut(q), cut(k), cut(v), cut(o), cut(lse), stream);
      return plan.last_kernel();
    }, last_);
  }

  void backward_mask(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                     const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                     const TensorView& dv, const RuntimeMask& mask, Stream stream) const override {
    if (runner_) {
      device_shapes(mask, stream);
      if (runner_->backward(q, k, v, o, lse, dout, dq, dk, dv, mask, stream)) {
        std::lock_guard<std::mutex> lock(mu_);
        last_backward_ = "runtime_device: " + runner_->backward_kernel();
        return;
      }
    }
    refuse_host(mask, true);
    run(mask, stream, [&](const std::vector<BoundPattern>& pats, const Problem& pr, int64_t b0, int64_t b1) {
      auto cut = [&](const TensorView& t) { return t.data ? t.slice(0, b0, b1) : t; };
      if (engine_ == Engine::reference) {
        cpu::reference_attention_backward(pats, pr, cut(q), cut(k), cut(v), cut(dout), cut(dq), cut(dk), cut(dv));
        return std::string("reference");
      }
      if (gpu_refuses(pats, pr, true))
        return reference_on_host(pats, pr, {cut(q), cut(k), cut(v), cut(dout)}, {cut(dq), cut(dk), cut(dv)}, stream);
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
      return "run-time mask " + layout_.str() + ": forward and backward on the device path, " + runner_->explain() +
             "\nthe host path only for: " + runner_->host_cases() + "; there, " + host_explain();
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
  // Whether the GPU engine's plans cannot take these per-head rows: cuda_unfused takes one pattern for all heads,
  // and the GPU backward takes per-head patterns only without grouped-query attention (dK / dV of a kv head whose
  // query heads have different rows would need summing). Such calls run the reference on host copies: slow, correct.
  bool gpu_refuses(const std::vector<BoundPattern>& pats, const Problem& pr, bool backward) const {
    if (device_.kind != Device::Kind::cuda || pats.size() < 2) return false;
    return engine_ == Engine::cuda_unfused || (backward && pr.q_heads != pr.kv_heads);
  }

  // The reference (fp64 accumulation) on host copies of the device tensors: `in` are q, k, v (and dout for the
  // backward), `out` o and lse (dq, dk, dv for the backward), each computed in fp32 and stored in its own dtype.
  std::string reference_on_host(const std::vector<BoundPattern>& pats, const Problem& pr,
                                const std::vector<TensorView>& in, const std::vector<TensorView>& out,
                                Stream stream) const {
    const int dev = device_.index;
    std::vector<HostCopy> hin, hout;
    for (const TensorView& t : in) hin.emplace_back(t, dev, stream);
    for (const TensorView& t : out) hout.emplace_back(t, dev, stream);
    std::vector<F32Buffer> f32;
    for (const TensorView& t : out) f32.emplace_back(t);
    if (in.size() == 3) {
      const TensorView lse = out[1].data ? f32[1].view : TensorView{};
      cpu::reference_attention(pats, pr, hin[0].view, hin[1].view, hin[2].view, f32[0].view, lse);
    } else {
      cpu::reference_attention_backward(pats, pr, hin[0].view, hin[1].view, hin[2].view, hin[3].view, f32[0].view,
                                        f32[1].view, f32[2].view);
    }
    for (size_t i = 0; i < out.size(); ++i)
      if (out[i].data) {
        copy_into(f32[i].view, hout[i].view);
        hout[i].back(out[i], dev, stream);
      }
    return "reference on host copies";
  }

  // The device path's calls: every shape checked (no tensor read), then the checking mode's validation if asked for.
  void device_shapes(const RuntimeMask& mask, Stream stream) const {
    load_host_mask(layout_, problem_, mask, true, device_.index, stream, false);
    if (mask.check) validate(load_host_mask(layout_, problem_, mask, true, device_.index, stream));
  }

  // Throws where a GPU call would take the host path and the mask asks for none (RuntimeMask::no_host).
  void refuse_host(const RuntimeMask& mask, bool backward) const {
    if (device_.kind != Device::Kind::cuda || !mask.no_host) return;
    const std::string why = runner_ ? "the device path does not take it; its host cases: " + runner_->host_cases()
                                    : "this plan has no device path: " + no_runner_;
    throw Error("run-time mask " + layout_.str() + ": this " + (backward ? "backward" : "forward") +
                " would run on the host path (" + why +
                "), which copies the mask to the host and waits for the stream; refused because no host "
                "synchronisation was asked for (RuntimeMask::no_host; torch.cuda.set_sync_debug_mode(\"error\") in "
                "Python)");
  }

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
