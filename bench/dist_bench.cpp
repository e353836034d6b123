// `spattn dist-bench` — context-parallel attention (spattn/distributed.hpp): the exchange schedule of W ranks (bytes
// each receives against the pattern's boundary volume) and, unless --plan-only, W ranks simulated in this process
// on the CPU engine (threads, SimWorld), forward and backward timed and checked against one device's plan.
// Simulated ranks share this machine's cores: their times show the overhead of the split, not a scaling; the
// issue's bar (2 and 4 GPUs, NCCL) needs the GPU path and a machine with several GPUs.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "spattn/config.hpp"
#if SPATTN_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda/common/check.hpp"
#endif

#include "bench/bench.hpp"
#include "common/args.hpp"
#include "spattn/distributed.hpp"

namespace spattn::bench {
using common::Args;

namespace {

const char* kUsage =
    "usage: spattn dist-bench [--pattern SPEC] --len L --world W [--layout contiguous|zigzag] [--key-block N]\n"
    "                         [--batch B] [--heads H] [--kv-heads HK] [--dim D] [--dtype fp32|fp16|bf16]\n"
    "                         [--plan-only] [--reps N] [--threads N] [--device cpu|cuda] [--nccl]\n"
    "Context-parallel attention over W ranks: per rank the keys it fetches and the bytes against the boundary\n"
    "volume (the bar: within 10%), then (without --plan-only) the W ranks run, forward and backward timed against\n"
    "one device's plan over the whole sequence and checked. Default pattern local(4096).\n"
    "--device cpu (default): ranks simulated on threads on the CPU engine (they share the cores: no scaling).\n"
    "--device cuda: bf16 (or fp16) on GPUs: the ranks simulated on GPU 0, or with --nccl on GPUs 0 .. W-1 over NCCL\n"
    "(one process, a thread a rank); prints the throughput scaling against one GPU (the bar: >= 0.8 of linear).\n";

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

#if SPATTN_HAVE_CUDA
#define CUDA_OK(x) ::spattn::cuda::check((x), #x, __FILE__, __LINE__)

// Uniform [-1, 1) values (an LCG: fast at L = 1M), rounded to bf16 or fp16 words.
std::vector<uint16_t> uniform_words(int64_t n, uint64_t seed, DType t) {
  std::vector<uint16_t> x(static_cast<size_t>(n));
  uint64_t st = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (auto& e : x) {
    st = st * 6364136223846793005ULL + 1442695040888963407ULL;
    const float u = float((st >> 40) & 0xFFFFFF) / float(1 << 23) - 1.f;
    e = t == DType::bf16 ? float_to_bf16(u) : float_to_half(u);
  }
  return x;
}

// The tokens `own` of a [B, L, HD] host array, in order.
std::vector<uint16_t> shard_words(const std::vector<uint16_t>& full, const IndexRanges& own, int64_t B, int64_t L,
                                  int64_t HD) {
  const int64_t n = total_size(own);
  std::vector<uint16_t> s(static_cast<size_t>(B * n * HD));
  for (int64_t b = 0; b < B; ++b) {
    int64_t i = 0;
    for (const IndexRange& x : own) {
      std::copy_n(&full[size_t((b * L + x.begin) * HD)], x.size() * HD, &s[size_t((b * n + i) * HD)]);
      i += x.size();
    }
  }
  return s;
}

double rel_l2_words(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, DType t) {
  auto f = [&](uint16_t w) { return double(t == DType::bf16 ? bf16_to_float(w) : half_to_float(w)); };
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) num += (f(got[i]) - f(want[i])) * (f(got[i]) - f(want[i])), den += f(want[i]) * f(want[i]);
  return std::sqrt(num / std::max(den, 1e-30));
}

// GPU ranks: one GPU over the whole sequence, then W ranks (simulated on GPU 0, or over NCCL on GPUs 0 .. W-1).
int dist_bench_cuda(const std::string& spec, const Problem& pr, const Args& a, bool within) {
  if (pr.dtype != DType::bf16 && pr.dtype != DType::f16) throw Error("dist-bench --device cuda: --dtype bf16 or fp16");
  const bool nccl = a.has("nccl");
  const int world = int(a.integer("world", 1)), reps = int(std::max<int64_t>(1, a.integer("reps", 3)));
  const int64_t B = pr.batch, L = pr.q_len, Hq = pr.q_heads, Hkv = pr.kv_heads, D = pr.head_dim;
  const dist::DistPlan plan({parse(spec)}, pr, dist::ShardLayout::parse(a.str("layout", "contiguous"), L, world),
                            {.key_block = a.integer("key-block", 1), .distribute_rows = false});
  const std::vector<uint16_t> q = uniform_words(B * L * Hq * D, 1, pr.dtype), k = uniform_words(B * L * Hkv * D, 2, pr.dtype),
                              v = uniform_words(B * L * Hkv * D, 3, pr.dtype), dout = uniform_words(B * L * Hq * D, 4, pr.dtype);
  auto view = [&](void* p, int64_t n, int64_t h) { return TensorView::contiguous(p, pr.dtype, {B, n, h, D}); };
  auto lse_view = [&](void* p, int64_t n) { return TensorView::contiguous(p, DType::f32, {B, Hq, n, 1}); };
  auto upload = [](const std::vector<uint16_t>& h) {
    void* p = nullptr;
    CUDA_OK(cudaMalloc(&p, std::max<size_t>(h.size() * 2, 2)));
    CUDA_OK(cudaMemcpy(p, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    return std::shared_ptr<void>(p, [](void* x) { cudaFree(x); });
  };
  auto zeros = [](size_t bytes) {
    void* p = nullptr;
    CUDA_OK(cudaMalloc(&p, std::max<size_t>(bytes, 2)));
    return std::shared_ptr<void>(p, [](void* x) { cudaFree(x); });
  };
  auto download = [](const std::shared_ptr<void>& p, size_t n) {
    std::vector<uint16_t> h(n);
    CUDA_OK(cudaMemcpy(h.data(), p.get(), n * 2, cudaMemcpyDeviceToHost));
    return h;
  };
  // One GPU: the whole sequence on GPU 0 (its outputs kept on the host for the check).
  std::vector<uint16_t> want_o, want_dq, want_dk, want_dv;
  double t1f = 1e30, t1b = 1e30;
  {
    CUDA_OK(cudaSetDevice(0));
    const Plan one = make_plan(parse(spec), pr, Device::cuda(0));
    auto dq = upload(q), dk = upload(k), dv = upload(v), dd = upload(dout), o = zeros(q.size() * 2),
         l = zeros(size_t(B * Hq * L) * 4), gq = zeros(q.size() * 2), gk = zeros(k.size() * 2), gv = zeros(v.size() * 2);
    for (int i = 0; i <= reps; ++i) {  // the first call warms up
      auto t0 = std::chrono::steady_clock::now();
      one.forward(view(dq.get(), L, Hq), view(dk.get(), L, Hkv), view(dv.get(), L, Hkv), view(o.get(), L, Hq),
                  lse_view(l.get(), L));
      CUDA_OK(cudaDeviceSynchronize());
      if (i) t1f = std::min(t1f, seconds_since(t0));
      t0 = std::chrono::steady_clock::now();
      one.backward(view(dq.get(), L, Hq), view(dk.get(), L, Hkv), view(dv.get(), L, Hkv), view(o.get(), L, Hq),
                   lse_view(l.get(), L), view(dd.get(), L, Hq), view(gq.get(), L, Hq), view(gk.get(), L, Hkv),
                   view(gv.get(), L, Hkv));
      CUDA_OK(cudaDeviceSynchronize());
      if (i) t1b = std::min(t1b, seconds_since(t0));
    }
    want_o = download(o, q.size()), want_dq = download(gq, q.size()), want_dk = download(gk, k.size()),
    want_dv = download(gv, v.size());
  }
  // W ranks.
  std::vector<double> tf(size_t(world), 1e30), tb(size_t(world), 1e30), err(size_t(world), 1.0);
  std::vector<int64_t> got_bytes(size_t(world), 0);
  std::vector<cudaStream_t> streams(static_cast<size_t>(world), nullptr);
  for (int r = 0; r < world; ++r) {
    CUDA_OK(cudaSetDevice(nccl ? r : 0));
    CUDA_OK(cudaStreamCreate(&streams[size_t(r)]));
  }
  auto body = [&](int r, dist::Communicator& comm) {
    const int dev = nccl ? r : 0;
    CUDA_OK(cudaSetDevice(dev));
    const IndexRanges& own = plan.layout().owned[size_t(r)];
    const int64_t n = total_size(own);
    auto sq = upload(shard_words(q, own, B, L, Hq * D)), sk = upload(shard_words(k, own, B, L, Hkv * D)),
         sv = upload(shard_words(v, own, B, L, Hkv * D)), sd = upload(shard_words(dout, own, B, L, Hq * D));
    auto so = zeros(size_t(B * n * Hq * D) * 2), sl = zeros(size_t(B * Hq * n) * 4), gq = zeros(size_t(B * n * Hq * D) * 2),
         gk = zeros(size_t(B * n * Hkv * D) * 2), gv = zeros(size_t(B * n * Hkv * D) * 2);
    const dist::DistRank rank(plan, r, Device::cuda(dev));
    const cudaStream_t st = streams[size_t(r)];
    for (int i = 0; i <= reps; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      rank.forward(comm, view(sq.get(), n, Hq), view(sk.get(), n, Hkv), view(sv.get(), n, Hkv), view(so.get(), n, Hq),
                   lse_view(sl.get(), n), st);
      CUDA_OK(cudaStreamSynchronize(st));
      if (i) tf[size_t(r)] = std::min(tf[size_t(r)], seconds_since(t0));
      if (i == 0) got_bytes[size_t(r)] = comm.bytes_received();
      t0 = std::chrono::steady_clock::now();
      rank.backward(comm, view(sq.get(), n, Hq), view(sk.get(), n, Hkv), view(sv.get(), n, Hkv), view(so.get(), n, Hq),
                    lse_view(sl.get(), n), view(sd.get(), n, Hq), view(gq.get(), n, Hq), view(gk.get(), n, Hkv),
                    view(gv.get(), n, Hkv), st);
      CUDA_OK(cudaStreamSynchronize(st));
      if (i) tb[size_t(r)] = std::min(tb[size_t(r)], seconds_since(t0));
    }
    double e = 0;
    e = std::max(e, rel_l2_words(download(so, size_t(B * n * Hq * D)), shard_words(want_o, own, B, L, Hq * D), pr.dtype));
    e = std::max(e, rel_l2_words(download(gq, size_t(B * n * Hq * D)), shard_words(want_dq, own, B, L, Hq * D), pr.dtype));
    e = std::max(e, rel_l2_words(download(gk, size_t(B * n * Hkv * D)), shard_words(want_dk, own, B, L, Hkv * D), pr.dtype));
    e = std::max(e, rel_l2_words(download(gv, size_t(B * n * Hkv * D)), shard_words(want_dv, own, B, L, Hkv * D), pr.dtype));
    err[size_t(r)] = e;
  };
  std::vector<Stream> sts(streams.begin(), streams.end());
  if (nccl) {
    dist::NcclWorld w(sts);
    w.run(body);
  } else {
    dist::SimWorld w(world, Device::cuda(0));
    w.run(body);
  }
  for (cudaStream_t s : streams) cudaStreamDestroy(s);
  const double twf = *std::max_element(tf.begin(), tf.end()), twb = *std::max_element(tb.begin(), tb.end());
  const double e = *std::max_element(err.begin(), err.end());
  for (int r = 0; r < world; ++r)
    std::printf("rank %d: forward %.3f ms, backward %.3f ms, received %lld bytes in the first forward (planned %lld)\n", r,
                tf[size_t(r)] * 1e3, tb[size_t(r)] * 1e3, (long long)got_bytes[size_t(r)],
                (long long)plan.rank(r).recv_bytes);
  std::printf("one GPU: forward %.3f ms, backward %.3f ms\n", t1f * 1e3, t1b * 1e3);
  const double sf = t1f / (world * twf), sb = t1b / (world * twb);
  std::printf("%d ranks (%s): forward %.3f ms, backward %.3f ms (slowest rank); scaling of throughput vs linear: "
              "forward %.3f, backward %.3f\n",
              world, nccl ? "NCCL, one GPU each" : "simulated on GPU 0", twf * 1e3, twb * 1e3, sf, sb);
  if (nccl && world > 1)
    std::printf("bar: >= 0.8 of linear scaling, forward and backward: %s\n", sf >= 0.8 && sb >= 0.8 ? "PASS" : "FAIL");
  std::printf("check: max relative L2 error of o, dq, dk, dv against one GPU: %.2e (%s)\n", e, e <= 2e-2 ? "PASS" : "FAIL");
  return within && e <= 2e-2 ? 0 : 1;
}
#else
int dist_bench_cuda(const std::string&, const Problem&, const Args&, bool) {
  throw Error("dist-bench --device cuda: this build of spattn has no CUDA support");
}
#endif

}  // namespace

int dist_bench_main(int argc, char** argv) {
  const Args a(argc, argv, 2,
               {"pattern", "len", "world", "layout", "key-block", "batch", "heads", "kv-heads", "dim", "dtype", "reps",
                "threads", "device"},
               {"plan-only", "help", "nccl"});
  if (a.has("help")) {
    std::cout << kUsage;
    return 0;
  }
  if (!a.has("len") || !a.has("world")) throw Error("dist-bench: give --len L and --world W");
  Problem pr;
  pr.batch = a.integer("batch", 1);
  pr.q_heads = a.integer("heads", 4);
  pr.kv_heads = a.integer("kv-heads", pr.q_heads);
  pr.q_len = pr.kv_len = a.integer("len", 0);
  pr.head_dim = a.integer("dim", 64);
  const bool gpu = a.str("device", "cpu") == "cuda";
  if (!gpu && a.str("device", "cpu") != "cpu") throw Error("--device '" + a.str("device") + "': expected cpu or cuda");
  if (a.has("nccl") && !gpu) throw Error("--nccl runs the ranks on GPUs: add --device cuda");
  pr.dtype = parse_dtype(a.str("dtype", gpu ? "bf16" : "fp32"));
  const int world = int(a.integer("world", 1));
  const std::string spec = a.str("pattern", "local(4096)");
  const dist::DistPlan plan({parse(spec)}, pr, dist::ShardLayout::parse(a.str("layout", "contiguous"), pr.q_len, world),
                            {.key_block = a.integer("key-block", 1)});
  std::printf("%s\n", plan.explain().c_str());
  bool within = true;
  for (int r = 0; r < world; ++r) {
    const dist::RankPlan& rp = plan.rank(r);
    within = within && double(rp.kv_recv_bytes) <= 1.1 * double(rp.boundary_bytes);
  }
  std::printf("bar: K/V bytes received per rank within 10%% of the boundary volume: %s\n", within ? "PASS" : "FAIL");
  if (a.has("plan-only")) return within ? 0 : 1;
  if (gpu) return dist_bench_cuda(spec, pr, a, within);

  // Inputs of the whole sequence, [B, L, H, D] fp32; each rank's shard copied out in its ranges' order.
  const int64_t B = pr.batch, L = pr.q_len, Hq = pr.q_heads, Hkv = pr.kv_heads, D = pr.head_dim;
  std::mt19937 gen(1);
  std::normal_distribution<float> nd;
  auto randn = [&](int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& e : x) e = nd(gen);
    return x;
  };
  std::vector<float> q = randn(B * L * Hq * D), k = randn(B * L * Hkv * D), v = randn(B * L * Hkv * D),
                     dout = randn(B * L * Hq * D);
  auto view = [](std::vector<float>& x, int64_t b, int64_t l, int64_t h, int64_t d) {
    return TensorView::contiguous(x.data(), DType::f32, {b, l, h, d});
  };
  const int reps = int(std::max<int64_t>(1, a.integer("reps", 3)));
  const int threads = int(a.integer("threads", 0));
  Problem one_pr = pr;
  one_pr.dtype = DType::f32;
  const Plan one = make_plan(parse(spec), one_pr, Device::cpu(), {.threads = threads});
  std::vector<float> o(q.size()), lse(size_t(B * Hq * L)), dq(q.size()), dk(k.size()), dv(v.size());
  double t_fwd1 = 1e30, t_bwd1 = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    one.forward(view(q, B, L, Hq, D), view(k, B, L, Hkv, D), view(v, B, L, Hkv, D), view(o, B, L, Hq, D),
                view(lse, B, Hq, L, 1));
    t_fwd1 = std::min(t_fwd1, seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    one.backward(view(q, B, L, Hq, D), view(k, B, L, Hkv, D), view(v, B, L, Hkv, D), view(o, B, L, Hq, D),
                 view(lse, B, Hq, L, 1), view(dout, B, L, Hq, D), view(dq, B, L, Hq, D), view(dk, B, L, Hkv, D),
                 view(dv, B, L, Hkv, D));
    t_bwd1 = std::min(t_bwd1, seconds_since(t0));
  }
  // The simulated ranks (each with an equal share of the threads).
  const dist::DistPlan plan32({parse(spec)}, one_pr, plan.layout(), plan.options());
  dist::SimWorld sim(world);
  const int per_rank = std::max(1, (threads > 0 ? threads : int(std::thread::hardware_concurrency())) / world);
  double t_fwd = 1e30, t_bwd = 1e30, err = 0;
  std::vector<double> rank_err(size_t(world), 0);
  for (int i = 0; i < reps; ++i) {
    double tf = 0, tb = 0;
    std::mutex mu;
    sim.run([&](int r, dist::Communicator& comm) {
      const IndexRanges& own = plan32.layout().owned[size_t(r)];
      const int64_t n = total_size(own);
      auto shard = [&](const std::vector<float>& full, int64_t H) {
        std::vector<float> s(size_t(B * n * H * D));
        for (int64_t b = 0; b < B; ++b) {
          int64_t j = 0;
          for (const IndexRange& x : own)
            for (int64_t g = x.begin; g < x.end; ++g, ++j)
              std::copy_n(&full[size_t(((b * L + g) * H) * D)], H * D, &s[size_t(((b * n + j) * H) * D)]);
        }
        return s;
      };
      std::vector<float> qs = shard(q, Hq), ks = shard(k, Hkv), vs = shard(v, Hkv), ds = shard(dout, Hq);
      std::vector<float> os(qs.size()), ls(size_t(B * Hq * n)), dqs(qs.size()), dks(ks.size()), dvs(vs.size());
      const dist::DistRank rank(plan32, r, Device::cpu(), {.threads = per_rank});
      auto t0 = std::chrono::steady_clock::now();
      rank.forward(comm, view(qs, B, n, Hq, D), view(ks, B, n, Hkv, D), view(vs, B, n, Hkv, D), view(os, B, n, Hq, D),
                   view(ls, B, Hq, n, 1));
      const double f = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      rank.backward(comm, view(qs, B, n, Hq, D), view(ks, B, n, Hkv, D), view(vs, B, n, Hkv, D),
                    view(os, B, n, Hq, D), view(ls, B, Hq, n, 1), view(ds, B, n, Hq, D), view(dqs, B, n, Hq, D),
                    view(dks, B, n, Hkv, D), view(dvs, B, n, Hkv, D));
      const double bw = seconds_since(t0);
      // Max relative error of o and dk against one device's plan.
      const std::vector<float> want_o = shard(o, Hq), want_dk = shard(dk, Hkv);
      double e = 0;
      for (size_t j = 0; j < os.size(); ++j) e = std::max(e, std::abs(double(os[j]) - want_o[j]) / (1 + std::abs(want_o[j])));
      for (size_t j = 0; j < dks.size(); ++j)
        e = std::max(e, std::abs(double(dks[j]) - want_dk[j]) / (1 + std::abs(want_dk[j])));
      std::lock_guard<std::mutex> lock(mu);
      tf = std::max(tf, f);
      tb = std::max(tb, bw);
      rank_err[size_t(r)] = e;
    });
    t_fwd = std::min(t_fwd, tf);
    t_bwd = std::min(t_bwd, tb);
  }
  for (double e : rank_err) err = std::max(err, e);
  std::printf("one device (cpu, %d threads): forward %.3f ms, backward %.3f ms\n", threads, t_fwd1 * 1e3, t_bwd1 * 1e3);
  std::printf("%d simulated ranks (threads, %d each, slowest rank): forward %.3f ms, backward %.3f ms\n", world, per_rank,
              t_fwd * 1e3, t_bwd * 1e3);
  std::printf("check: max relative error of o and dk against one device: %.2e (%s)\n", err, err <= 1e-4 ? "PASS" : "FAIL");
  return within && err <= 1e-4 ? 0 : 1;
}

}  // namespace spattn::bench
