// `spattn run`: attention on .npy or random inputs through the chosen implementation.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "spattn/device.hpp"
#include "spattn/pattern.hpp"
#include "spattn/plan.hpp"
#include "tools/commands.hpp"
#include "tools/npy.hpp"

namespace spattn::tools {
namespace {

// Host storage for one [B, L, H, D] tensor in the problem's dtype.
struct HostTensor {
  std::vector<uint8_t> bytes;
  TensorView view;
};

HostTensor random_tensor(DType t, std::array<int64_t, 4> shape, std::mt19937_64& rng) {
  HostTensor h;
  const int64_t n = shape[0] * shape[1] * shape[2] * shape[3];
  h.bytes.resize(size_t(n * dtype_size(t)));
  h.view = TensorView::contiguous(h.bytes.data(), t, shape);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t i = 0; i < n; ++i) {
    const float x = nd(rng);
    if (t == DType::f32) reinterpret_cast<float*>(h.bytes.data())[i] = x;
    else if (t == DType::f16) reinterpret_cast<uint16_t*>(h.bytes.data())[i] = float_to_half(x);
    else if (t == DType::bf16) reinterpret_cast<uint16_t*>(h.bytes.data())[i] = float_to_bf16(x);
    else reinterpret_cast<double*>(h.bytes.data())[i] = x;
  }
  return h;
}

HostTensor from_npy(const std::string& path, const char* what) {
  NpyArray a = read_npy(path);
  if (a.shape.size() != 4)
    throw Error(std::string(what) + " '" + path + "' has shape " + shape_str(a.shape) + "; expected 4 dimensions [B, L, H, D]");
  HostTensor h;
  h.bytes = std::move(a.bytes);
  h.view = TensorView::contiguous(h.bytes.data(), a.dtype, {a.shape[0], a.shape[1], a.shape[2], a.shape[3]});
  return h;
}

// Refuses a problem whose host tensors (q, k, v, O and the LSE) and plan (at least plan_bytes, make_plan's floor)
// exceed this machine's memory (host_memory_limit): an error now rather than minutes of planning, swapping or the
// OOM killer. `p` is validated (its sizes fit in 63 bits).
void check_host_memory(const Problem& p, int64_t plan_bytes) {
  const double in = double(dtype_size(p.dtype)), B = double(p.batch);
  const double need = B * (double(p.q_len) * double(p.q_heads) * (double(p.head_dim) * in + double(p.dv()) * 4 + 4) +
                           double(p.kv_len) * double(p.kv_heads) * double(p.head_dim + p.dv()) * in);
  const int64_t limit = host_memory_limit();
  if (limit <= 0) return;  // unknown: let the allocation decide
  const double have = double(limit), gib = double(1 << 30);
  if (need + double(plan_bytes) > have) {
    char msg[300];
    if (plan_bytes > 0)
      std::snprintf(msg, sizeof msg, "this problem needs %.1f GiB for q, k, v, O and the LSE and at least %.1f GiB for "
                    "the plan; the limit is %.1f GiB (this machine's memory, or SPATTN_MEMORY_LIMIT)", need / gib, double(plan_bytes) / gib, have / gib);
    else
      std::snprintf(msg, sizeof msg, "this problem needs %.1f GiB for q, k, v, O and the LSE; the limit is %.1f GiB (this machine's memory, or "
                    "SPATTN_MEMORY_LIMIT)",
                    need / gib, have / gib);
    throw Error(msg);
  }
}

}  // namespace

int run_attention(const RunOptions& o) {
  Problem p = o.problem;
  HostTensor q, k, v;
  const bool from_files = !o.q_path.empty() || !o.k_path.empty() || !o.v_path.empty();
  if (from_files) {
    if (o.q_path.empty() || o.k_path.empty() || o.v_path.empty()) throw Error("--q, --k and --v go together");
    q = from_npy(o.q_path, "q");
    k = from_npy(o.k_path, "k");
    v = from_npy(o.v_path, "v");
    const auto& qs = q.view.shape;
    const auto& ks = k.view.shape;
    const auto& vs = v.view.shape;
    if (ks[0] != qs[0] || vs[0] != qs[0])
      throw Error("batch sizes differ: q " + std::to_string(qs[0]) + ", k " + std::to_string(ks[0]) + ", v " + std::to_string(vs[0]));
    if (ks[3] != qs[3]) throw Error("head dims differ: q " + std::to_string(qs[3]) + ", k " + std::to_string(ks[3]));
    if (vs[1] != ks[1] || vs[2] != ks[2])
      throw Error("v has shape [" + std::to_string(vs[0]) + ", " + std::to_string(vs[1]) + ", " + std::to_string(vs[2]) + ", " +
                  std::to_string(vs[3]) + "] but k has " + std::to_string(ks[1]) + " keys and " + std::to_string(ks[2]) + " heads");
    if (ks[2] < 1 || qs[2] % ks[2] != 0)
      throw Error("q has " + std::to_string(qs[2]) + " heads, not a multiple of k's " + std::to_string(ks[2]));
    if (q.view.dtype != k.view.dtype || q.view.dtype != v.view.dtype) throw Error("q, k and v must have the same dtype");
    p.batch = qs[0];
    p.q_len = qs[1];
    p.q_heads = qs[2];
    p.head_dim = qs[3];
    p.kv_len = ks[1];
    p.kv_heads = ks[2];
    p.value_dim = vs[3] == qs[3] ? 0 : vs[3];
    p.dtype = q.view.dtype;
    // Shape options given with the files must agree with them (they used to be ignored silently).
    const Problem& flags = o.problem;
    for (const std::string& f : o.shape_flags) {
      const auto [given, found] =
          f == "--len"        ? std::pair{flags.q_len, p.q_len != p.kv_len ? -1 : p.q_len}
          : f == "--q-len"    ? std::pair{flags.q_len, p.q_len}
          : f == "--k-len"    ? std::pair{flags.kv_len, p.kv_len}
          : f == "--batch"    ? std::pair{flags.batch, p.batch}
          : f == "--heads"    ? std::pair{flags.q_heads, p.q_heads}
          : f == "--kv-heads" ? std::pair{flags.kv_heads, p.kv_heads}
          : f == "--dim"      ? std::pair{flags.head_dim, p.head_dim}
          : f == "--value-dim" ? std::pair{flags.dv(), p.dv()}
                               : std::pair{int64_t(flags.dtype), int64_t(p.dtype)};
      if (given != found) {
        const std::string in_files = f == "--dtype" ? std::string(dtype_name(p.dtype))
                                     : f == "--len" ? std::to_string(p.q_len) + " x " + std::to_string(p.kv_len)
                                                    : std::to_string(found);
        throw Error(f + " " + (f == "--dtype" ? std::string(dtype_name(flags.dtype)) : std::to_string(given)) +
                    " disagrees with the .npy inputs (" + in_files + "): with --q, --k and --v the shape and dtype " +
                    "come from the files; drop " + f + " or make it match");
      }
    }
  }
  p.validate();
  // The backward: dO from --do (or random, as random inputs are) when a gradient is asked for.
  const bool grads = !o.dq_path.empty() || !o.dk_path.empty() || !o.dv_path.empty();
  if (!o.do_path.empty() && !grads)
    throw Error("--do (the gradient of O) is for --dq, --dk and --dv: give at least one of them");
  if (grads && from_files && o.do_path.empty())
    throw Error("--dq, --dk and --dv need --do (the gradient of O, [B, L, H, Dv]) with .npy inputs");
  HostTensor dout;
  if (!o.do_path.empty()) {
    dout = from_npy(o.do_path, "do");
    const std::vector<int64_t> want{p.batch, p.q_len, p.q_heads, p.dv()};
    const std::vector<int64_t> got(dout.view.shape.begin(), dout.view.shape.end());
    if (got != want) throw Error("do '" + o.do_path + "' has shape " + shape_str(got) + "; O is " + shape_str(want));
  }
  if (o.device != "cpu" && o.device != "cuda") throw Error("unknown device '" + o.device + "' (use cpu or cuda)");
  if (o.device == "cpu" && o.impl != "auto" && o.impl != "fused" && o.impl != "reference")
    throw Error("unknown --impl '" + o.impl + "' for --device cpu (use " SPATTN_CPU_IMPLS ")");
  if (o.device == "cuda" && o.impl != "auto" && o.impl != "fused" && o.impl != "unfused")
    throw Error("unknown --impl '" + o.impl + "' for --device cuda (use " SPATTN_CUDA_IMPLS ")");
  const Pattern pat = Pattern::parse(o.spec);
  PlanOptions opt;
  opt.threads = o.threads;
  opt.engine = o.impl == "auto" ? Engine::automatic
               : o.impl == "fused" ? (o.device == "cuda" ? Engine::cuda_fused : Engine::cpu_fused)
               : o.impl == "unfused" ? Engine::cuda_unfused
                                     : parse_engine(o.impl);
  const BoundPattern bound = pat.bind(p.q_len, p.kv_len);
  check_host_memory(p, plan_host_bytes_floor({bound}, p, o.device == "cuda" ? Device::cuda(0) : Device::cpu(), opt));
  const int64_t nnz = bound.nnz();
  // A long run says what it is doing, on stderr (stdout keeps the results): past 1e11 multiply-adds (the CPU kernels
  // pad rows to 16 floats; about a second on the 2-core VM: local(8192) at L = 65536, D = 64 takes 1.7 s) or 1e8
  // input values to draw. SPATTN_PROGRESS=1 shows it always, 0 never.
  const auto t_start = std::chrono::steady_clock::now();
  const double work = double(p.batch * p.q_heads) * double(nnz) * double(std::max<int64_t>(p.head_dim + p.dv(), 32));
  const double values = double(p.batch) * (double(p.q_len) * double(p.q_heads) * double(p.head_dim + (grads ? p.dv() : 0)) +
                                           double(p.kv_len) * double(p.kv_heads) * double(p.head_dim + p.dv()));
  const char* forced = std::getenv("SPATTN_PROGRESS");
  const bool progress = forced && (*forced == '0' || *forced == '1') ? *forced == '1'
                                                                      : work > 1e11 || (!from_files && values > 1e8);
  auto note = [&](const std::string& what) {
    if (!progress) return;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    std::fprintf(stderr, "spattn run: [%.1f s] %s\n", s, what.c_str());
  };
  const int64_t heads = p.batch * p.q_heads;
  note(std::to_string(nnz) + " kept scores a head, " + std::to_string(heads) + (heads == 1 ? " head" : " heads (batch x heads)"));
  if (!from_files) {
    note("drawing random inputs");
    std::mt19937_64 rng(o.seed);
    q = random_tensor(p.dtype, {p.batch, p.q_len, p.q_heads, p.head_dim}, rng);
    k = random_tensor(p.dtype, {p.batch, p.kv_len, p.kv_heads, p.head_dim}, rng);
    v = random_tensor(p.dtype, {p.batch, p.kv_len, p.kv_heads, p.dv()}, rng);
    if (grads && o.do_path.empty()) dout = random_tensor(p.dtype, {p.batch, p.q_len, p.q_heads, p.dv()}, rng);
  }
  std::vector<float> out(size_t(p.batch * p.q_len * p.q_heads * p.dv()));
  std::vector<float> lse(size_t(p.batch * p.q_heads * p.q_len));
  const TensorView ov = TensorView::contiguous(out.data(), DType::f32, {p.batch, p.q_len, p.q_heads, p.dv()});
  const TensorView lv = TensorView::contiguous(lse.data(), DType::f32, {p.batch, p.q_heads, p.q_len, 1});
  std::vector<float> gq, gk, gv;
  RunBackward bwd;
  if (grads) {
    gq.resize(size_t(p.batch * p.q_len * p.q_heads * p.head_dim));
    gk.resize(size_t(p.batch * p.kv_len * p.kv_heads * p.head_dim));
    gv.resize(size_t(p.batch * p.kv_len * p.kv_heads * p.dv()));
    bwd.dout = dout.view, bwd.dq = gq.data(), bwd.dk = gk.data(), bwd.dv = gv.data();
  }
  double secs = 0;
  std::string engine;
  if (o.device == "cuda") {
    note(grads ? "planning and running the forward and the backward on the GPU" : "planning and running on the GPU");
    secs = run_cuda(pat, p, q.view, k.view, v.view, out.data(), lse.data(), opt, &engine, grads ? &bwd : nullptr);
  } else {
    note("planning");
    const Plan plan = make_plan(pat, p, Device::cpu(), opt);  // planned once, outside the timed call
    engine = std::string(engine_name(plan.engine())) + " (" + plan.kernel() + ")";
    note("forward");
    const auto t0 = std::chrono::steady_clock::now();
    plan.forward(q.view, k.view, v.view, ov, lv);
    secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (grads) {
      note("backward");
      const auto t1 = std::chrono::steady_clock::now();
      plan.backward(q.view, k.view, v.view, ov, lv, dout.view,
                    TensorView::contiguous(gq.data(), DType::f32, {p.batch, p.q_len, p.q_heads, p.head_dim}),
                    TensorView::contiguous(gk.data(), DType::f32, {p.batch, p.kv_len, p.kv_heads, p.head_dim}),
                    TensorView::contiguous(gv.data(), DType::f32, {p.batch, p.kv_len, p.kv_heads, p.dv()}));
      bwd.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
      bwd.engine = plan.last_backward_kernel();
    }
  }
  auto write = [&](const std::string& path, const float* data, const std::vector<int64_t>& shape, const char* what) {
    note("writing " + path);
    write_npy(path, data, shape);
    std::printf("wrote %s: %s %s float32\n", path.c_str(), what, shape_str(shape).c_str());
  };
  if (!o.out_path.empty()) write(o.out_path, out.data(), {p.batch, p.q_len, p.q_heads, p.dv()}, "O [B, L, H, Dv] =");
  if (!o.lse_path.empty()) write(o.lse_path, lse.data(), {p.batch, p.q_heads, p.q_len}, "log-sum-exp [B, H, L] =");
  if (!o.dq_path.empty()) write(o.dq_path, gq.data(), {p.batch, p.q_len, p.q_heads, p.head_dim}, "dQ [B, L, H, D] =");
  if (!o.dk_path.empty()) write(o.dk_path, gk.data(), {p.batch, p.kv_len, p.kv_heads, p.head_dim}, "dK [B, L, HK, D] =");
  if (!o.dv_path.empty()) write(o.dv_path, gv.data(), {p.batch, p.kv_len, p.kv_heads, p.dv()}, "dV [B, L, HK, Dv] =");
  note("done");
  if (o.verbose) {
    const double flops = 2.0 * double(nnz) * double(p.head_dim + p.dv()) * double(p.batch * p.q_heads);
    std::printf("spattn run: pattern \"%s\"  B=%lld Lq=%lld Lk=%lld H=%lld HK=%lld D=%lld Dv=%lld %s  impl=%s device=%s\n", o.spec.c_str(),
                (long long)p.batch, (long long)p.q_len, (long long)p.kv_len, (long long)p.q_heads, (long long)p.kv_heads,
                (long long)p.head_dim, (long long)p.dv(), std::string(dtype_name(p.dtype)).c_str(), engine.c_str(), o.device.c_str());
    std::printf("  nnz %lld per head (density %.3f%%)  time %.3f ms  effective %.2f GFLOP/s\n", (long long)nnz,
                p.q_len && p.kv_len ? 100.0 * double(nnz) / (double(p.q_len) * double(p.kv_len)) : 0.0, secs * 1e3,
                secs > 0 ? flops / secs / 1e9 : 0.0);
    if (grads) {
      // S, dP, dV, dK, dQ: 2 * nnz * (3 D + 2 Dv) a head (10 * nnz * D where Dv = D, 2.5x the forward's).
      const double bflops = 2.0 * double(nnz) * double(3 * p.head_dim + 2 * p.dv()) * double(p.batch * p.q_heads);
      std::printf("  backward %s  time %.3f ms  effective %.2f GFLOP/s\n", bwd.engine.c_str(), bwd.seconds * 1e3,
                  bwd.seconds > 0 ? bflops / bwd.seconds / 1e9 : 0.0);
    }
  }
  return 0;
}

}  // namespace spattn::tools
