// Timing harness of session s4 (bench/results/README.md): random(205, seed=0) (or $SPEC), L=4096, B=1, H=4, D=64,
// fp32, one FusedPlan, calls timed back to back (mode 0) or each after a 1536^3 sgemm and a 150 ms pause (mode 1,
// the bench's protocol). Prints per-call median/min wall time, TSC ticks per score x threads and the calling
// thread's CPU time. During the session a temporary global in the library picked kernel variants (the trailing
// arguments, interleaved call by call, paired ratios against the first); here they only label repeated runs.
// Build: g++ -O2 -std=c++20 -I include -I BUILD/include cpu-2026-11-22-s4-harness.cpp BUILD/libspattn.a -lopenblas -lpthread
// Run:   NOREF=1 ./h THREADS REPS MODE 0
#include <spattn/cpu.hpp>
#include <spattn/pattern.hpp>
#include <spattn/reference.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>
#include <time.h>
static double cpu_ms(){ timespec ts; clock_gettime(CLOCK_THREAD_CPUTIME_ID,&ts); return ts.tv_sec*1e3+ts.tv_nsec*1e-6; }
extern "C" void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*, const int*,
                       const float*, const int*, const float*, float*, const int*);
using namespace spattn;
static double now_ms() { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main(int argc, char** argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 1;
  const int reps = argc > 2 ? atoi(argv[2]) : 15;
  const int mode = argc > 3 ? atoi(argv[3]) : 0;  // 0 back-to-back, 1 bench protocol (sgemm + 150 ms pause)
  std::vector<int> vars;
  for (int i = 4; i < argc; ++i) vars.push_back(atoi(argv[i]));
  if (vars.empty()) vars = {0};
  const char* spec = getenv("SPEC") ? getenv("SPEC") : "random(205, seed=0)";
  const int64_t B = 1, L = 4096, H = 4, D = 64;
  Problem prob;
  prob.batch = B, prob.q_len = L, prob.kv_len = L, prob.q_heads = H, prob.kv_heads = H, prob.head_dim = D;
  prob.dtype = DType::f32;
  BoundPattern pat = Pattern::parse(spec).bind(L, L);
  cpu::Options opt;
  opt.threads = threads;
  cpu::FusedPlan plan({pat}, prob, opt);
  const int64_t n = B * L * H * D;
  float *q, *k, *v, *o, *lse;
  posix_memalign((void**)&q, 64, n * 4); posix_memalign((void**)&k, 64, n * 4); posix_memalign((void**)&v, 64, n * 4);
  posix_memalign((void**)&o, 64, n * 4); posix_memalign((void**)&lse, 64, B * H * L * 4);
  std::mt19937_64 rng(2024);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t i = 0; i < n; ++i) q[i] = nd(rng);
  for (int64_t i = 0; i < n; ++i) k[i] = nd(rng);
  for (int64_t i = 0; i < n; ++i) v[i] = nd(rng);
  auto qv = TensorView::contiguous(q, DType::f32, {B, L, H, D}), kv = TensorView::contiguous(k, DType::f32, {B, L, H, D}),
       vv = TensorView::contiguous(v, DType::f32, {B, L, H, D}), ov = TensorView::contiguous(o, DType::f32, {B, L, H, D}),
       lv = TensorView::contiguous(lse, DType::f32, {B, H, L, 1});
  // reference error (once, variant 0 and each variant)
  std::vector<double> ref(n);
  if (!getenv("NOREF")) {
    auto rov = TensorView::contiguous(ref.data(), DType::f64, {B, L, H, D});
    cpu::reference_attention({pat}, prob, qv, kv, vv, rov, TensorView{});
  }
  const int sn = 1536; std::vector<float> A(sn * sn, 1.f), Bm(sn * sn, 1.f), C(sn * sn);
  auto sgemm = [&] { const float al = 1, be = 0; sgemm_("N", "N", &sn, &sn, &sn, &al, A.data(), &sn, Bm.data(), &sn, &be, C.data(), &sn); };
  const double nnz = double(pat.nnz()) * H * B;
  std::vector<std::vector<double>> t(vars.size()), tk(vars.size()), tc(vars.size());
  for (size_t vi = 0; vi < vars.size(); ++vi) {
    std::fill(o, o + n, NAN);
    plan.run(qv, kv, vv, ov, lv, opt);
    if (!getenv("NOREF")) {
      double e2 = 0, r2 = 0;
      for (int64_t i = 0; i < n; ++i) { const double d = o[i] - ref[i]; e2 += d * d; r2 += ref[i] * ref[i]; }
      printf("variant %d rel_err %.3g\n", vars[vi], std::sqrt(e2 / r2));
    }
  }
  for (int r = 0; r < reps; ++r)
    for (size_t vi = 0; vi < vars.size(); ++vi) {
        if (mode == 1) { sgemm(); std::this_thread::sleep_for(std::chrono::milliseconds(150)); }
      const double t0 = now_ms(), tc0 = cpu_ms();
      const unsigned long long c0 = __builtin_ia32_rdtsc();
      plan.run(qv, kv, vv, ov, lv, opt);
      const unsigned long long c1 = __builtin_ia32_rdtsc();
      t[vi].push_back(now_ms() - t0);
      tc[vi].push_back(cpu_ms() - tc0);
      tk[vi].push_back(double(c1 - c0) * threads / nnz);
    }
  for (size_t vi = 1; vi < vars.size(); ++vi) {
    std::vector<double> r;
    std::vector<double> rc;
    for (size_t i = 0; i < t[0].size(); ++i) r.push_back(t[vi][i] / t[0][i]), rc.push_back(tc[vi][i] / tc[0][i]);
    std::sort(r.begin(), r.end()); std::sort(rc.begin(), rc.end());
    printf("variant %d / variant %d: paired ratio wall median %.3f (q25 %.3f q75 %.3f)  cpu median %.3f (q25 %.3f q75 %.3f)\n", vars[vi], vars[0], r[r.size() / 2], r[r.size() / 4], r[3 * r.size() / 4], rc[rc.size() / 2], rc[rc.size() / 4], rc[3 * rc.size() / 4]);
  }
  for (size_t vi = 0; vi < vars.size(); ++vi) {
    auto a = t[vi], b = tk[vi], c = tc[vi];
    std::sort(a.begin(), a.end()); std::sort(b.begin(), b.end()); std::sort(c.begin(), c.end());
    printf("variant %d threads %d mode %d: median %.3f ms  min %.3f ms  max %.3f  ticks/score*threads median %.2f min %.2f  (%.1f GFLOP/s)  cpu(thread0) med %.3f min %.3f ms = %.2f ticks/score (1 thr)\n", vars[vi], threads, mode,
           a[a.size() / 2], a[0], a.back(), b[b.size() / 2], b[0], 4.0 * nnz * D / (a[a.size() / 2] * 1e-3) / 1e9, c[c.size()/2], c[0], c[c.size()/2]*2.596e6/nnz);
  }
}
