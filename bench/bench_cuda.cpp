// `spattn bench --device cuda`: the Multigrain kernels (spattn:sddmm, spattn:spmm, spattn:unfused) beside
// cuSPARSE's SDDMM and SpMM (CSR, same inputs, same run), rows as docs/BENCHMARKS.md defines them.
//
//   spattn bench --device cuda [--suite standard | --pattern SPEC] [--len 4096] [--batch 2] [--heads 16]
//                [--dim 64] [--dtype bf16] [--reps 30] [--block 32] [--json FILE] [--no-cusparse]
//
// Timing: 3 warm-up calls, then `reps` (>= 20) calls each between two CUDA events; the median is reported.
// Outputs are poisoned (NaN bytes) before the timed calls; rel_err is measured after them, against fp64 on
// the host, on two (b, h) pairs (first and last): SDDMM and SpMM on every 8th row, the whole attention
// against cpu::reference_attention on every row of those heads.
#include "bench/bench.hpp"

#include "spattn/config.hpp"

#if !SPATTN_HAVE_CUDA
#include <cstdio>
namespace spattn::bench {
int bench_cuda_main(int, char**) {
  std::fprintf(stderr, "spattn: this build has no CUDA support (rebuild with SPATTN_CUDA=ON)\n");
  return 2;
}
}  // namespace spattn::bench
#else

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/cusparse_baseline.hpp"
#include "spattn/error.hpp"
#include "spattn/format.hpp"
#include "cuda/unfused/unfused.hpp"
#include "spattn/pattern.hpp"
#include "spattn/reference.hpp"
#include "spattn/tensor.hpp"

namespace spattn::bench {
namespace {

namespace mg = spattn::unfused;

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t n) : bytes(n) {
    if (n) ck(cudaMalloc(&p, n), "cudaMalloc");
  }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

struct Args {
  std::string suite, pattern, json, dtype = "bf16";
  int64_t len = 4096, batch = 2, heads = 16, dim = 64;
  int reps = 30, block = 32;
  bool cusparse = true;
};

int64_t to_int(const std::string& flag, const std::string& v) {
  try {
    size_t pos = 0;
    const long long x = std::stoll(v, &pos);
    if (pos != v.size()) throw 0;
    return x;
  } catch (...) {
    throw Error("bench: " + flag + " expects an integer, got '" + v + "'");
  }
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 0; i < argc; ++i) {
    const std::string f = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) throw Error("bench: " + f + " needs a value");
      return argv[++i];
    };
    if (f == "--device") {
      const std::string d = val();
      if (d != "cuda") throw Error("bench: --device '" + d + "' reached the CUDA driver");
    } else if (f == "--suite") a.suite = val();
    else if (f == "--pattern") a.pattern = val();
    else if (f == "--json") a.json = val();
    else if (f == "--dtype") a.dtype = val();
    else if (f == "--len") a.len = to_int(f, val());
    else if (f == "--batch") a.batch = to_int(f, val());
    else if (f == "--heads") a.heads = to_int(f, val());
    else if (f == "--dim") a.dim = to_int(f, val());
    else if (f == "--reps") a.reps = int(to_int(f, val()));
    else if (f == "--block") a.block = int(to_int(f, val()));
    else if (f == "--no-cusparse") a.cusparse = false;
    else throw Error("bench --device cuda: unknown argument '" + f + "'");
  }
  if (a.suite.empty() && a.pattern.empty()) a.suite = "standard";
  if (!a.suite.empty() && !a.pattern.empty()) throw Error("bench: give --suite or --pattern, not both");
  if (!a.suite.empty() && a.suite != "standard") throw Error("bench: unknown suite '" + a.suite + "' (standard)");
  if (a.len < 1) throw Error("bench: --len " + std::to_string(a.len) + " must be at least 1");
  if (a.batch < 1) throw Error("bench: --batch " + std::to_string(a.batch) + " must be at least 1");
  if (a.heads < 1) throw Error("bench: --heads " + std::to_string(a.heads) + " must be at least 1");
  if (a.dim < 1) throw Error("bench: --dim " + std::to_string(a.dim) + " must be at least 1");
  if (a.reps < 20) throw Error("bench: --reps " + std::to_string(a.reps) + " is below 20");
  return a;
}

struct Case {
  std::string name, spec;
};

// The standard suite as the unfused bench runs it: standard_suite (bench_cpu.cpp) but for random's keys a row,
// (L + 19) / 20 here.
std::vector<Case> cuda_suite(int64_t L) {
  std::vector<Case> s = {{"local", "local(256)"},
                         {"longformer", "longformer(256, 32)"},
                         {"bigbird", "bigbird(64, 1, 2, 3, seed=0)"},
                         {"dilated", "dilated(256, 2)"},
                         {"fixed", "sparse_fixed(128)"},
                         {"random", "random(" + std::to_string((L + 19) / 20) + ", seed=0)"}};
  const int64_t side = int64_t(std::llround(std::sqrt(double(L))));
  if (side * side == L)
    s.push_back({"na2d", "neighborhood(dims=(" + std::to_string(side) + "," + std::to_string(side) + "), kernel=13)"});
  else
    std::fprintf(stderr, "bench: na2d skipped: L = %lld is not a square\n", (long long)L);
  s.push_back({"causal", "causal"});
  return s;
}

// Median time of fn() in ms: 3 warm-ups, then reps calls each between two events.
double time_ms(const std::function<void()>& fn, int reps, cudaStream_t st) {
  for (int i = 0; i < 3; ++i) fn();
  ck(cudaStreamSynchronize(st), "warm-up");
  std::vector<cudaEvent_t> ev(size_t(2 * reps));
  for (auto& e : ev) ck(cudaEventCreate(&e), "cudaEventCreate");
  for (int i = 0; i < reps; ++i) {
    ck(cudaEventRecord(ev[size_t(2 * i)], st), "cudaEventRecord");
    fn();
    ck(cudaEventRecord(ev[size_t(2 * i + 1)], st), "cudaEventRecord");
  }
  ck(cudaStreamSynchronize(st), "timed runs");
  std::vector<float> t(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) ck(cudaEventElapsedTime(&t[size_t(i)], ev[size_t(2 * i)], ev[size_t(2 * i + 1)]), "elapsed");
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(t.begin(), t.end());
  return reps % 2 ? t[size_t(reps / 2)] : 0.5 * (t[size_t(reps / 2 - 1)] + t[size_t(reps / 2)]);
}

struct Row {
  std::string impl, pattern, spec, device, dtype, note;
  int64_t B = 0, L = 0, Hq = 0, Hkv = 0, D = 0;
  double density = 0, ms = 0, eff_tflops = 0, plan_ms = 0, rel_err = -1;
};

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}
std::string num(double x) {
  if (!std::isfinite(x)) return "null";
  std::ostringstream os;
  os.precision(6);
  os << x;
  return os.str();
}

// Host copies of the inputs as doubles, for the checks.
struct HostTensor {
  std::vector<uint16_t> half;
  std::vector<float> f32;
  DType dtype;
  double at(int64_t i) const {
    if (dtype == DType::f32) return f32[size_t(i)];
    return dtype == DType::bf16 ? bf16_to_float(half[size_t(i)]) : half_to_float(half[size_t(i)]);
  }
  const void* data() const { return dtype == DType::f32 ? static_cast<const void*>(f32.data()) : half.data(); }
  size_t bytes() const { return dtype == DType::f32 ? f32.size() * 4 : half.size() * 2; }
};

HostTensor random_tensor(int64_t n, DType dt, uint64_t seed) {
  HostTensor t;
  t.dtype = dt;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  if (dt == DType::f32) {
    t.f32.resize(size_t(n));
    for (auto& x : t.f32) x = nd(rng);
  } else {
    t.half.resize(size_t(n));
    for (auto& x : t.half) x = dt == DType::bf16 ? float_to_bf16(nd(rng)) : float_to_half(nd(rng));
  }
  return t;
}

double load_elem(const std::vector<char>& buf, DType dt, int64_t i) {
  if (dt == DType::f32) {
    float f;
    std::memcpy(&f, &buf[size_t(i) * 4], 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, &buf[size_t(i) * 2], 2);
  return dt == DType::bf16 ? bf16_to_float(h) : half_to_float(h);
}

std::vector<char> to_host(const void* dev, size_t bytes) {
  std::vector<char> h(bytes);
  if (bytes) ck(cudaMemcpy(h.data(), dev, bytes, cudaMemcpyDeviceToHost), "copy back");
  return h;
}

struct Err {
  double num = 0, den = 0;
  int64_t nonfinite = 0;
  void add(double got, double ref) {
    if (!std::isfinite(got)) ++nonfinite;
    num += (got - ref) * (got - ref);
    den += ref * ref;
  }
  double rel() const { return nonfinite ? INFINITY : den > 0 ? std::sqrt(num / den) : std::sqrt(num); }
};

void run_case(const Args& A, const Case& c, DType dt, const std::string& gpu, std::vector<Row>& rows) {
  const int64_t B = A.batch, H = A.heads, L = A.len, D = A.dim, nb = B * H;
  Problem pr;
  pr.batch = B;
  pr.q_heads = pr.kv_heads = H;
  pr.q_len = pr.kv_len = L;
  pr.head_dim = D;
  pr.dtype = dt;
  const BoundPattern bound = Pattern::parse(c.spec).bind(L, L);

  mg::Options opt;
  opt.block = A.block;
  const auto t0 = std::chrono::steady_clock::now();
  const mg::UnfusedPlan plan = mg::UnfusedPlan::build(bound, pr, opt);
  ck(cudaDeviceSynchronize(), "plan");
  const double plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const mg::Split& sp = plan.split();
  const int64_t nnz = sp.nnz;
  const double density = double(nnz) / (double(L) * double(L));
  const int es = dtype_size(dt);
  std::fprintf(stderr, "[%s] %s", c.name.c_str(), plan.explain().c_str());

  const int64_t nq = B * L * H * D;
  const HostTensor hq = random_tensor(nq, dt, 1), hk = random_tensor(nq, dt, 2), hv = random_tensor(nq, dt, 3);
  DevBuf q(hq.bytes()), k(hk.bytes()), v(hv.bytes()), o(size_t(nq) * es);
  ck(cudaMemcpy(q.p, hq.data(), hq.bytes(), cudaMemcpyHostToDevice), "upload q");
  ck(cudaMemcpy(k.p, hk.data(), hk.bytes(), cudaMemcpyHostToDevice), "upload k");
  ck(cudaMemcpy(v.p, hv.data(), hv.bytes(), cudaMemcpyHostToDevice), "upload v");
  const TensorView Q = TensorView::contiguous(q.p, dt, {B, L, H, D}), K = TensorView::contiguous(k.p, dt, {B, L, H, D}),
                   V = TensorView::contiguous(v.p, dt, {B, L, H, D}), O = TensorView::contiguous(o.p, dt, {B, L, H, D});
  const int64_t ce = plan.coarse_elems_per_head(), fe = plan.fine_elems_per_head();
  DevBuf sc(size_t(nb * ce) * es), sf(size_t(nb * fe) * es), pc(size_t(nb * ce) * es), pf(size_t(nb * fe) * es),
      lse(size_t(nb * L) * 4), ws(size_t(plan.spmm_workspace_size())), aws(size_t(plan.attention_workspace_size(false)));
  const mg::SparseValues S{sc.p, sf.p}, P{pc.p, pf.p};
  cudaStream_t st;
  ck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");

  auto base_row = [&](const std::string& impl) {
    Row r;
    r.impl = impl;
    r.pattern = c.name;
    r.spec = c.spec;
    r.device = gpu;
    r.dtype = std::string(dtype_name(dt));
    r.B = B;
    r.L = L;
    r.Hq = r.Hkv = H;
    r.D = D;
    r.density = density;
    return r;
  };
  const double flops2 = 2.0 * double(nnz) * double(D) * double(nb);
  std::vector<int64_t> heads = {0};
  if (nb > 1) heads.push_back(nb - 1);

  // ---- SDDMM ----
  ck(cudaMemsetAsync(sc.p, 0xff, sc.bytes, st), "poison");
  ck(cudaMemsetAsync(sf.p, 0xff, sf.bytes, st), "poison");
  Row rs = base_row("spattn:sddmm");
  rs.ms = time_ms([&] { plan.sddmm(Q, K, S, st); }, A.reps, st);
  rs.eff_tflops = flops2 / (rs.ms * 1e9);
  rs.plan_ms = plan_ms;
  {
    Err e;
    const int64_t bs = sp.block, bb = int64_t(bs) * bs, wpm = bb / 64;
    for (int64_t bh : heads) {
      const auto hsc = to_host(static_cast<char*>(sc.p) + bh * ce * es, size_t(ce) * es);
      const auto hsf = to_host(static_cast<char*>(sf.p) + bh * fe * es, size_t(fe) * es);
      const int64_t b = bh / H, h = bh % H;
      auto ref = [&](int64_t qi, int64_t ki) {
        double s = 0;
        for (int64_t d = 0; d < D; ++d) s += hq.at(((b * L + qi) * H + h) * D + d) * hk.at(((b * L + ki) * H + h) * D + d);
        return s;
      };
      for (int64_t qi = 0; qi < L; qi += 8) {
        const int64_t br = qi / bs, r = qi % bs;
        for (int64_t blk = sp.coarse.row_offsets[size_t(br)]; blk < sp.coarse.row_offsets[size_t(br) + 1]; ++blk) {
          const int64_t mi = sp.coarse.mask_index[size_t(blk)], kc = sp.coarse.col_indices[size_t(blk)];
          for (int64_t cc = 0; cc < bs && kc * bs + cc < L; ++cc) {
            const int64_t bit = r * bs + cc;
            const bool kept = mi < 0 || ((sp.coarse.masks[size_t(mi * wpm + bit / 64)] >> (bit % 64)) & 1);
            e.add(load_elem(hsc, dt, blk * bb + bit), kept ? ref(qi, kc * bs + cc) : 0.0);
          }
        }
        for (int64_t i = sp.fine.row_offsets[size_t(qi)]; i < sp.fine.row_offsets[size_t(qi) + 1]; ++i) {
          e.add(load_elem(hsf, dt, i), ref(qi, sp.fine.col_indices[size_t(i)]));
        }
      }
    }
    rs.rel_err = e.rel();
  }
  rows.push_back(rs);

  // ---- SpMM on the P of our softmax ----
  plan.softmax(S, P, static_cast<float*>(lse.p), st);
  ck(cudaMemsetAsync(o.p, 0xff, o.bytes, st), "poison");
  Row rm = base_row("spattn:spmm");
  rm.ms = time_ms([&] { plan.spmm(P, V, O, ws.p, st); }, A.reps, st);
  rm.eff_tflops = flops2 / (rm.ms * 1e9);
  rm.plan_ms = plan_ms;
  {
    Err e;
    const auto ho = to_host(o.p, o.bytes);
    const int64_t bs = sp.block, bb = int64_t(bs) * bs;
    for (int64_t bh : heads) {
      const auto hpc = to_host(static_cast<char*>(pc.p) + bh * ce * es, size_t(ce) * es);
      const auto hpf = to_host(static_cast<char*>(pf.p) + bh * fe * es, size_t(fe) * es);
      const int64_t b = bh / H, h = bh % H;
      std::vector<double> acc(static_cast<size_t>(D));
      for (int64_t qi = 0; qi < L; qi += 8) {
        std::fill(acc.begin(), acc.end(), 0.0);
        const int64_t br = qi / bs, r = qi % bs;
        auto axpy = [&](double p, int64_t ki) {
          for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += p * hv.at(((b * L + ki) * H + h) * D + d);
        };
        for (int64_t blk = sp.coarse.row_offsets[size_t(br)]; blk < sp.coarse.row_offsets[size_t(br) + 1]; ++blk) {
          const int64_t kc = sp.coarse.col_indices[size_t(blk)];
          for (int64_t cc = 0; cc < bs && kc * bs + cc < L; ++cc) {
            const double p = load_elem(hpc, dt, blk * bb + r * bs + cc);
            if (p != 0) axpy(p, kc * bs + cc);
          }
        }
        for (int64_t i = sp.fine.row_offsets[size_t(qi)]; i < sp.fine.row_offsets[size_t(qi) + 1]; ++i)
          axpy(load_elem(hpf, dt, i), sp.fine.col_indices[size_t(i)]);
        for (int64_t d = 0; d < D; ++d) e.add(load_elem(ho, dt, ((b * L + qi) * H + h) * D + d), acc[size_t(d)]);
      }
    }
    rm.rel_err = e.rel();
  }
  rows.push_back(rm);

  // ---- unfused attention: O and LSE (without P), then with P requested ----
  // The reference O of the checked heads, once (fp64, from the pattern's definition).
  std::vector<std::vector<double>> refs;
  {
    Problem p1 = pr;
    p1.batch = p1.q_heads = p1.kv_heads = 1;
    for (int64_t bh : heads) {
      const int64_t b = bh / H, h = bh % H;
      const std::array<int64_t, 4> stv{L * H * D, H * D, D, 1};
      const int64_t off = (b * L * H + h) * D;
      auto view = [&](const HostTensor& t) {
        return TensorView{const_cast<char*>(static_cast<const char*>(t.data())) + off * es, dt, {1, L, 1, D}, stv};
      };
      refs.emplace_back(size_t(L * D));
      const TensorView ro = TensorView::contiguous(refs.back().data(), DType::f64, {1, L, 1, D});
      cpu::reference_attention({bound}, p1, view(hq), view(hk), view(hv), ro, TensorView{});
    }
  }
  auto o_err = [&] {
    Err e;
    const auto ho = to_host(o.p, o.bytes);
    for (size_t i = 0; i < heads.size(); ++i) {
      const int64_t b = heads[i] / H, h = heads[i] % H;
      for (int64_t qi = 0; qi < L; ++qi)
        for (int64_t d = 0; d < D; ++d)
          e.add(load_elem(ho, dt, ((b * L + qi) * H + h) * D + d), refs[i][size_t(qi * D + d)]);
    }
    return e.rel();
  };
  auto attention_row = [&](const char* impl, const mg::UnfusedPlan& pl, mg::SparseValues pv, void* wsp) {
    ck(cudaMemsetAsync(o.p, 0xff, o.bytes, st), "poison");
    ck(cudaMemsetAsync(lse.p, 0xff, lse.bytes, st), "poison");
    Row r = base_row(impl);
    r.ms = time_ms([&] { pl.attention(Q, K, V, O, static_cast<float*>(lse.p), pv, wsp, st); }, A.reps, st);
    r.eff_tflops = 2 * flops2 / (r.ms * 1e9);
    r.plan_ms = plan_ms;
    r.rel_err = o_err();
    rows.push_back(r);
    return r;
  };
  const Row ru = attention_row("spattn:unfused", plan, {}, aws.p);
  // With P requested: always SDDMM -> (softmax) -> SpMM, P written (without P a fine-only tensor-core plan
  // with D == Dv in {64, 128} runs one fused kernel instead, see plan.explain()).
  DevBuf aws_p(size_t(plan.attention_workspace_size(true)));
  const Row rp = attention_row("spattn:unfused_p", plan, P, aws_p.p);
  // Where the fused kernel ran without P: the split SDDMM -> SpMM pipeline without P too (log only).
  double split_ms = NAN;
  if (plan.has_fine() && plan.attention_workspace_size(false) == 0) {
    mg::Options o2 = opt;
    o2.fused_fine_attention = false;
    const mg::UnfusedPlan plan2 = mg::UnfusedPlan::build(bound, pr, o2);
    DevBuf aws2(size_t(plan2.attention_workspace_size(false)));
    split_ms = attention_row("spattn:unfused_split", plan2, {}, aws2.p).ms;
  }
  // The softmax alone (log only: where the rest of the unfused time goes).
  const double softmax_ms = time_ms([&] { plan.softmax(S, P, static_cast<float*>(lse.p), st); }, A.reps, st);
  std::fprintf(stderr, "  %-10s sddmm %.3f ms (err %.2e)  softmax %.3f ms  spmm %.3f ms (err %.2e)  unfused %.3f ms (err %.2e)  attention with P %.3f ms (err %.2e)  split without P %.3f ms\n",
               c.name.c_str(), rs.ms, rs.rel_err, softmax_ms, rm.ms, rm.rel_err, ru.ms, ru.rel_err, rp.ms, rp.rel_err,
               split_ms);

  // ---- cuSPARSE ----
  if (A.cusparse) {
    try {
      const Csr csr = make_csr(bound);
      CusparseBaseline cs(csr, pr, q.p, k.p, v.p);
      Row a = base_row("cusparse_sddmm");
      a.ms = time_ms([&] { cs.sddmm(st); }, A.reps, st);
      a.eff_tflops = flops2 / (a.ms * 1e9);
      a.dtype = cs.sddmm_dtype();
      a.note = cs.mode();
      a.rel_err = NAN;
      Row b = base_row("cusparse_spmm");
      b.ms = time_ms([&] { cs.spmm(st); }, A.reps, st);
      b.eff_tflops = flops2 / (b.ms * 1e9);
      b.dtype = cs.spmm_dtype();
      b.note = cs.mode();
      b.rel_err = NAN;
      rows.push_back(a);
      rows.push_back(b);
      std::fprintf(stderr, "  %-10s cusparse sddmm %.3f ms (%s)  spmm %.3f ms (%s), %s\n", c.name.c_str(), a.ms,
                   a.dtype.c_str(), b.ms, b.dtype.c_str(), a.note.c_str());
    } catch (const Error& e) {
      std::fprintf(stderr, "  %-10s cusparse skipped: %s\n", c.name.c_str(), e.what());
    }
  }
  ck(cudaStreamDestroy(st), "stream");
}

void write_json(const std::string& path, const std::vector<Row>& rows, const cudaDeviceProp& prop, int driver,
                int runtime) {
  std::ofstream f(path);
  if (!f) throw Error("bench: cannot write --json file '" + path + "'");
  f << "{\"machine\": {\"gpu\": \"" << json_escape(prop.name) << "\", \"sms\": " << prop.multiProcessorCount
    << ", \"cc\": \"" << prop.major << "." << prop.minor << "\", \"memory_bytes\": " << prop.totalGlobalMem
    << ", \"driver\": " << driver << ", \"cuda_runtime\": " << runtime << ", \"spattn\": \"" << SPATTN_VERSION
    << "\", \"build\": \"" << SPATTN_BUILD_TYPE << "\", \"cuda_archs\": \"" << SPATTN_CUDA_ARCHS << "\"},\n \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    f << "  {\"impl\": \"" << r.impl << "\", \"pattern\": \"" << r.pattern << "\", \"spec\": \"" << json_escape(r.spec)
      << "\", \"device\": \"" << json_escape(r.device) << "\", \"B\": " << r.B << ", \"L\": " << r.L << ", \"Hq\": " << r.Hq
      << ", \"Hkv\": " << r.Hkv << ", \"D\": " << r.D << ", \"dtype\": \"" << r.dtype << "\", \"density\": " << num(r.density)
      << ", \"ms\": " << num(r.ms) << ", \"eff_tflops\": " << num(r.eff_tflops) << ", \"plan_ms\": " << num(r.plan_ms)
      << ", \"rel_err\": " << num(r.rel_err);
    if (!r.note.empty()) f << ", \"note\": \"" << json_escape(r.note) << "\"";
    f << "}" << (i + 1 < rows.size() ? ",\n" : "\n");
  }
  f << " ]}\n";
}

void print_table(const std::vector<Row>& rows) {
  std::map<std::string, std::map<std::string, const Row*>> by;
  std::vector<std::string> order;
  for (const Row& r : rows) {
    if (!by.count(r.pattern)) order.push_back(r.pattern);
    by[r.pattern][r.impl] = &r;
  }
  std::printf("\n%-11s %8s | %9s %9s %6s | %9s %9s %6s | %9s %9s %6s | %9s %6s | %8s %8s %8s\n", "pattern",
              "density", "sddmm ms", "cusp ms", "x", "spmm ms", "cusp ms", "x", "unfused", "cusp s+m", "x", "with P", "x",
              "err sd", "err sp", "err att");
  double lsd = 0, lsp = 0;
  int n = 0;
  double min_sd = INFINITY, min_sp = INFINITY, min_un = INFINITY, min_up = INFINITY, max_err = 0;
  for (const std::string& p : order) {
    auto& m = by[p];
    auto ms = [&](const char* impl) { return m.count(impl) ? m[impl]->ms : NAN; };
    auto er = [&](const char* impl) { return m.count(impl) ? m[impl]->rel_err : NAN; };
    const double sd = ms("spattn:sddmm"), csd = ms("cusparse_sddmm"), spm = ms("spattn:spmm"), csp = ms("cusparse_spmm"),
                 un = ms("spattn:unfused"), up = ms("spattn:unfused_p");
    const double x1 = csd / sd, x2 = csp / spm, x3 = (csd + csp) / un, x4 = (csd + csp) / up;
    std::printf("%-11s %8.4f | %9.4f %9.4f %6.2f | %9.4f %9.4f %6.2f | %9.4f %9.4f %6.2f | %9.4f %6.2f | %8.1e %8.1e %8.1e\n",
                p.c_str(), m.begin()->second->density, sd, csd, x1, spm, csp, x2, un, csd + csp, x3, up, x4,
                er("spattn:sddmm"), er("spattn:spmm"), std::max(er("spattn:unfused"), er("spattn:unfused_p")));
    if (std::isfinite(x1) && std::isfinite(x2)) {
      lsd += std::log(x1);
      lsp += std::log(x2);
      ++n;
      min_sd = std::min(min_sd, x1);
      min_sp = std::min(min_sp, x2);
      min_un = std::min(min_un, x3);
      min_up = std::min(min_up, x4);
    }
    for (const char* i : {"spattn:sddmm", "spattn:spmm", "spattn:unfused", "spattn:unfused_p"})
      if (m.count(i)) max_err = std::max(max_err, er(i));
  }
  if (n > 0) {
    const double g1 = std::exp(lsd / n), g2 = std::exp(lsp / n);
    std::printf("\ngeomean speedup vs cuSPARSE: SDDMM %.2fx (min %.2fx), SpMM %.2fx (min %.2fx); unfused vs cuSPARSE "
                "SDDMM+SpMM: min %.2fx without P, %.2fx with P; max rel err %.2e\n",
                g1, min_sd, g2, min_sp, min_un, min_up, max_err);
    std::printf("bar (issue 4): SDDMM/SpMM geomean >= 5x and >= 2x each: %s; unfused >= 3x each, without and with P: %s; rel err <= 1e-2: %s\n",
                g1 >= 5 && g2 >= 5 && min_sd >= 2 && min_sp >= 2 ? "PASS" : "FAIL", std::min(min_un, min_up) >= 3 ? "PASS" : "FAIL",
                max_err <= 1e-2 ? "PASS" : "FAIL");
  }
}

}  // namespace

int bench_cuda_main(int argc, char** argv) {
  const Args A = parse_args(argc, argv);
  const DType dt = parse_dtype(A.dtype);
  int ndev = 0;
  const cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0) {
    std::fprintf(stderr, "spattn bench --device cuda: no usable GPU (%s)\n",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 2;
  }
  cudaDeviceProp prop{};
  ck(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::vector<Case> cases = A.pattern.empty() ? cuda_suite(A.len) : std::vector<Case>{{"custom", A.pattern}};
  std::vector<Row> rows;
  std::fprintf(stderr, "spattn bench --device cuda: %s, %zu case(s), B %lld, H %lld, L %lld, D %lld, %s, %d reps\n",
               prop.name, cases.size(), (long long)A.batch, (long long)A.heads, (long long)A.len, (long long)A.dim,
               A.dtype.c_str(), A.reps);
  int failures = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    std::fprintf(stderr, "(%zu/%zu) %s: %s\n", i + 1, cases.size(), cases[i].name.c_str(), cases[i].spec.c_str());
    try {
      run_case(A, cases[i], dt, prop.name, rows);
    } catch (const Error& err) {
      ++failures;
      std::fprintf(stderr, "  FAILED: %s\n", err.what());
      cudaGetLastError();
    }
  }
  print_table(rows);
  if (!A.json.empty()) {
    write_json(A.json, rows, prop, driver, runtime);
    std::fprintf(stderr, "wrote %s\n", A.json.c_str());
  }
  return failures ? 1 : 0;
}

}  // namespace spattn::bench

#endif  // SPATTN_HAVE_CUDA
