// api/plan.cpp — spattn::Plan (include/spattn/plan.hpp): binds and analyses the patterns once, picks the engine,
// hands the analysis to its backend (plan/backend.hpp), checks every forward's tensors against the problem.
#include "spattn/plan.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "api/runtime_plan.hpp"
#include "cuda/common/device.hpp"
#include "spattn/device.hpp"
#include "plan/analysis.hpp"
#include "plan/backend.hpp"
#include "plan/gpu/launch.hpp"
#include "plan/kernels.hpp"

namespace spattn {

Device Device::parse(std::string_view text) {
  if (text == "cpu") return cpu();
  if (text == "cuda" || text == "gpu") return cuda(0);
  if (text.substr(0, 5) == "cuda:" && text.size() > 5) {
    int i = 0;
    for (char c : text.substr(5)) {
      if (c < '0' || c > '9' || i > 1000000) throw Error("device '" + std::string(text) + "': expected cpu, cuda or cuda:N");
      i = i * 10 + (c - '0');
    }
    return cuda(i);
  }
  throw Error("device '" + std::string(text) + "': expected cpu, cuda or cuda:N");
}

std::string Device::str() const { return kind == Kind::cpu ? "cpu" : "cuda:" + std::to_string(index); }

std::string_view engine_name(Engine e) {
  switch (e) {
    case Engine::automatic: return "auto";
    case Engine::cpu_fused: return "cpu";
    case Engine::cuda_fused: return "cuda_fused";
    case Engine::cuda_unfused: return "cuda_unfused";
    case Engine::reference: return "reference";
  }
  return "?";
}

Engine parse_engine(std::string_view name) {
  for (Engine e : {Engine::automatic, Engine::cpu_fused, Engine::cuda_fused, Engine::cuda_unfused, Engine::reference})
    if (name == engine_name(e)) return e;
  if (name == "cpu_fused") return Engine::cpu_fused;
  throw Error("engine '" + std::string(name) + "': expected auto, cpu, cuda_fused, cuda_unfused or reference");
}

struct Plan::Impl {
  Problem problem;
  Device device;
  Engine engine = Engine::automatic;
  std::string why;  // why this engine
  plan::Planned planned;
  std::unique_ptr<plan::Backend> backend;
  const plan::RuntimeBackend* runtime = nullptr;  // backend, where the plan takes run-time masks
  double plan_ms = 0;
};

Plan::Plan() = default;
Plan::Plan(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Plan::~Plan() = default;
Plan::Plan(Plan&&) noexcept = default;
Plan& Plan::operator=(Plan&&) noexcept = default;

namespace {

const Plan::Impl& impl_of(const std::unique_ptr<Plan::Impl>& p) {
  if (!p) throw Error("this spattn::Plan is empty (default-constructed or moved from); build one with make_plan");
  return *p;
}

Plan build(plan::Planned planned, const Problem& problem, Device device, const PlanOptions& options,
           std::chrono::steady_clock::time_point t0, const MaskLayout* runtime = nullptr) {
  if (options.tile_map < -1 || options.tile_map > 2)
    throw Error("tile_map must be -1 (chosen), 0 (never), 1 (always) or 2 (key strips), got " + std::to_string(options.tile_map));
  auto im = std::make_unique<Plan::Impl>();
  im->problem = problem;
  im->device = device;
  const bool cuda = device.kind == Device::Kind::cuda;
  if (cuda) {
    const int n = cuda::device_count();
    if (device.index < 0 || device.index >= n)
      throw Error("device " + device.str() + " does not exist (" + std::to_string(n) + " CUDA devices" +
                  (n == 0 ? ": no GPU, no driver, or a build without CUDA)" : ")"));
  }
  const Engine e = plan::choose_engine(problem, device, options.engine, &im->why);
  im->engine = e;
  // The GPU kernels fold the scale into the exponent of scores whose masked entries are -inf (-inf * 0 is NaN): a
  // scale of 0 runs there as 1e-30, whose exponentials round to exactly 1 for any score under 1e29 (uniform
  // attention, an LSE of log(keys)); the plan reports the scale asked for.
  Problem gpu = problem;
  if (gpu.scale && *gpu.scale == 0) gpu.scale = 1e-30;
  if (runtime) {  // run-time masks: their backend, whatever the engine (api/runtime_plan.hpp)
    auto rb = plan::make_runtime_backend(*runtime, device.kind == Device::Kind::cuda ? gpu : problem, device, e, options);
    im->runtime = rb.get();
    im->backend = std::move(rb);
  } else switch (e) {
    case Engine::cpu_fused: im->backend = plan::make_cpu_backend(planned, problem, options); break;
    case Engine::reference: im->backend = plan::make_reference_backend(planned, problem); break;
    case Engine::cuda_fused: im->backend = plan::make_cuda_fused_backend(planned, gpu, device.index, options); break;
    case Engine::cuda_unfused:
      im->backend = plan::make_cuda_unfused_backend(planned, gpu, device.index, options);
      break;
    case Engine::automatic: break;
  }
  im->planned = std::move(planned);
  im->plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return Plan(std::move(im));
}

plan::Planned plan_patterns(const std::vector<BoundPattern>& bound, const Problem& problem) {
  plan::Planned out;
  const int64_t H = problem.q_heads;
  if (bound.empty() || (bound.size() != 1 && int64_t(bound.size()) != H))
    throw Error("expected 1 pattern or one per query head (" + std::to_string(H) + "), got " +
                std::to_string(bound.size()));
  out.of_head.assign(size_t(H), 0);
  for (int64_t h = 0; h < H; ++h) {
    const BoundPattern& bp = bound.size() == 1 ? bound[0] : bound[size_t(h)];
    auto it = std::find_if(out.patterns.begin(), out.patterns.end(),
                           [&](const BoundPattern& x) { return x.spec() == bp.spec(); });
    if (it == out.patterns.end()) {
      out.patterns.push_back(bp);
      out.analyses.push_back(plan::analyze(bp));
      it = out.patterns.end() - 1;
    }
    out.of_head[size_t(h)] = int(it - out.patterns.begin());
  }
  return out;
}

// Refuses a plan whose memory floor exceeds the host's limit (a length like 2^31 - 1 was killed by the OOM killer
// after 79 s at 24 GB).
void check_plan_memory(const std::vector<BoundPattern>& bound, const Problem& pr, Device device, const PlanOptions& options) {
  const int64_t need = plan_host_bytes_floor(bound, pr, device, options);
  if (need == 0) return;
  const int64_t have = host_memory_limit();
  if (have <= 0 || need <= have) return;
  char msg[400];
  std::snprintf(msg, sizeof msg,
                "the plan of '%.80s' at %lld x %lld needs at least %.1f GiB of host memory (the fused CPU engine's tiles, "
                "24 bytes a query row per run of a row); the limit is %.1f GiB (this machine's memory, or "
                "SPATTN_MEMORY_LIMIT)",
                bound.empty() ? "" : bound[0].spec().c_str(), (long long)pr.q_len, (long long)pr.kv_len,
                double(need) / double(1 << 30), double(have) / double(1 << 30));
  throw Error(msg);
}

}  // namespace

int64_t plan_host_bytes_floor(const std::vector<BoundPattern>& patterns, const Problem& pr, Device device,
                              const PlanOptions& options) {
  if (device.kind != Device::Kind::cpu || (options.engine != Engine::automatic && options.engine != Engine::cpu_fused))
    return 0;
  constexpr int64_t kSamples = 64;
  constexpr double kBytesPerRun = 24;
  double total = 0;
  std::vector<std::string> seen;
  RowRuns runs;
  for (const BoundPattern& b : patterns) {
    if (!b.spec().empty() && std::find(seen.begin(), seen.end(), b.spec()) != seen.end()) continue;
    seen.push_back(b.spec());
    const int64_t rows = std::min(kSamples, pr.q_len);
    int64_t n = 0;
    for (int64_t i = 0; i < rows; ++i) {
      b.row(int64_t(double(i) * double(pr.q_len) / double(rows)), runs);
      n += int64_t(runs.size());
    }
    total += double(pr.q_len) * kBytesPerRun * std::max(1.0, rows ? double(n) / double(rows) : 0.0);
  }
  return int64_t(std::min(total, 9e18));
}

Plan make_plan(const std::vector<Pattern>& patterns, const Problem& problem, Device device, const PlanOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  problem.validate();
  std::vector<BoundPattern> bound;
  bound.reserve(patterns.size());
  for (const Pattern& p : patterns) bound.push_back(p.bind(problem.q_len, problem.kv_len));
  check_plan_memory(bound, problem, device, options);
  return build(plan_patterns(bound, problem), problem, device, options, t0);
}

Plan make_plan(const std::vector<BoundPattern>& patterns, const Problem& problem, Device device,
               const PlanOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  problem.validate();
  for (const BoundPattern& p : patterns)
    if (p.q_len() != problem.q_len || p.k_len() != problem.kv_len)
      throw Error("pattern '" + p.spec() + "' is bound to " + std::to_string(p.q_len()) + " x " +
                  std::to_string(p.k_len()) + ", the problem is " + std::to_string(problem.q_len) + " x " +
                  std::to_string(problem.kv_len) + " (q_len x kv_len)");
  check_plan_memory(patterns, problem, device, options);
  return build(plan_patterns(patterns, problem), problem, device, options, t0);
}

Plan make_plan(const Csr& mask, const Problem& problem, Device device, const PlanOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  problem.validate();
  validate(mask);
  if (mask.rows != problem.q_len || mask.cols != problem.kv_len)
    throw Error("mask is " + std::to_string(mask.rows) + " x " + std::to_string(mask.cols) + ", the problem is " +
                std::to_string(problem.q_len) + " x " + std::to_string(problem.kv_len) + " (q_len x kv_len)");
  return build(plan_patterns({BoundPattern::from_rows(mask.rows, mask.cols, mask.row_offsets, mask.col_indices)},
                             problem),
               problem, device, options, t0);
}

Plan make_plan(const Bsr& mask, const Problem& problem, Device device, const PlanOptions& options) {
  validate(mask);
  return make_plan(to_csr(mask), problem, device, options);
}

Plan make_plan(const MaskLayout& layout, const Problem& problem, Device device, const PlanOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  problem.validate();
  layout.validate(problem);
  return build(plan::Planned{}, problem, device, options, t0, &layout);
}

const Problem& Plan::problem() const { return impl_of(impl_).problem; }
const Device& Plan::device() const { return impl_of(impl_).device; }
Engine Plan::engine() const { return impl_of(impl_).engine; }
double Plan::plan_ms() const { return impl_of(impl_).plan_ms; }
std::string Plan::kernel() const { return impl_of(impl_).backend->kernel(); }
std::string Plan::last_kernel() const { return impl_of(impl_).backend->last_kernel(); }
std::string Plan::last_backward_kernel() const { return impl_of(impl_).backend->last_backward_kernel(); }

int64_t Plan::nnz() const {
  const Impl& im = impl_of(impl_);
  int64_t n = 0;
  for (int p : im.planned.of_head) n += im.planned.analyses[size_t(p)].nnz;
  return n;
}

std::string Plan::explain() const {
  const Impl& im = impl_of(impl_);
  const Problem& pr = im.problem;
  std::ostringstream s;
  s << "engine " << engine_name(im.engine) << " on " << im.device.str();
  if (im.device.kind == Device::Kind::cuda) s << " (" << cuda::device_name(im.device.index) << ")";
  s << " (" << im.why << "), kernel " << im.backend->kernel() << "\n";
  s << "problem: batch " << pr.batch << ", heads " << pr.q_heads << " (kv " << pr.kv_heads << "), lengths " << pr.q_len
    << " x " << pr.kv_len << ", head dim " << pr.head_dim << " (value " << pr.dv() << "), " << dtype_name(pr.dtype)
    << ", scale " << pr.softmax_scale() << "\n";
  const auto& pl = im.planned;
  for (size_t i = 0; i < pl.patterns.size(); ++i) {
    int first = -1, count = 0;
    for (size_t h = 0; h < pl.of_head.size(); ++h)
      if (pl.of_head[h] == int(i)) count += 1, first = first < 0 ? int(h) : first;
    s << "pattern '" << pl.patterns[i].spec() << "'";
    if (pl.per_head()) s << " (" << count << " heads from head " << first << ")";
    s << ": " << pl.analyses[i].describe() << "\n";
  }
  s << im.backend->explain() << "\n";
  s << "planned in " << im.plan_ms << " ms";
  return s.str();
}

namespace {
// The problem the plan was built for: every shape must match it (the error names tensor and dimension); q, k and v
// share one dtype, the plan's on the GPU engines. o may have null data where `o_optional` (backward).
void check_inputs(const Plan::Impl& im, const TensorView& q, const TensorView& k, const TensorView& v,
                  const TensorView& o, const TensorView& lse, bool o_optional) {
  const Problem& pr = im.problem;
  Problem::check_view(q, "q", {pr.batch, pr.q_len, pr.q_heads, pr.head_dim});
  Problem::check_view(k, "k", {pr.batch, pr.kv_len, pr.kv_heads, pr.head_dim});
  Problem::check_view(v, "v", {pr.batch, pr.kv_len, pr.kv_heads, pr.dv()});
  if (o.data || !o_optional) Problem::check_view(o, "o", {pr.batch, pr.q_len, pr.q_heads, pr.dv()});
  if (lse.data) Problem::check_view(lse, "lse", {pr.batch, pr.q_heads, pr.q_len, 1});
  if (q.dtype != k.dtype || q.dtype != v.dtype)
    throw Error("q, k and v must share one dtype, got " + std::string(dtype_name(q.dtype)) + ", " +
                std::string(dtype_name(k.dtype)) + ", " + std::string(dtype_name(v.dtype)));
  if (im.engine != Engine::cpu_fused && im.engine != Engine::reference && q.dtype != pr.dtype)
    throw Error("q has dtype " + std::string(dtype_name(q.dtype)) + ", the plan was built for " +
                std::string(dtype_name(pr.dtype)));
}
}  // namespace

void Plan::forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                   const TensorView& lse, Stream stream) const {
  const Impl& im = impl_of(impl_);
  check_inputs(im, q, k, v, o, lse, false);
  im.backend->forward(q, k, v, o, lse, stream);
}

void Plan::backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                    const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                    const TensorView& dv, Stream stream) const {
  const Impl& im = impl_of(impl_);
  const Problem& pr = im.problem;
  check_inputs(im, q, k, v, o, lse, true);
  pr.check_backward_views(q, k, v, dout, dq, dk, dv, im.device.kind == Device::Kind::cpu);
  im.backend->backward(q, k, v, o, lse, dout, dq, dk, dv, stream);
}

namespace {
const plan::RuntimeBackend& runtime_of(const Plan::Impl& im) {
  if (!im.runtime)
    throw Error("this plan was built for a static pattern; it takes no run-time mask (make_plan(MaskLayout) builds "
                "one that does)");
  return *im.runtime;
}
}  // namespace

bool Plan::takes_mask() const { return impl_of(impl_).runtime != nullptr; }

void Plan::forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                   const TensorView& lse, const RuntimeMask& mask, Stream stream) const {
  const Impl& im = impl_of(impl_);
  const plan::RuntimeBackend& rb = runtime_of(im);
  check_inputs(im, q, k, v, o, lse, false);
  rb.forward_mask(q, k, v, o, lse, mask, stream);
}

void Plan::backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                    const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                    const TensorView& dv, const RuntimeMask& mask, Stream stream) const {
  const Impl& im = impl_of(impl_);
  const plan::RuntimeBackend& rb = runtime_of(im);
  check_inputs(im, q, k, v, o, lse, true);
  im.problem.check_backward_views(q, k, v, dout, dq, dk, dv, im.device.kind == Device::Kind::cpu);
  rb.backward_mask(q, k, v, o, lse, dout, dq, dk, dv, mask, stream);
}

}  // namespace spattn
