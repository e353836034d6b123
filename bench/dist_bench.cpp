// `spattn dist-bench` — context-parallel attention (spattn/distributed.hpp): the exchange schedule of W ranks (bytes
// each receives against the pattern's boundary volume) and, unless --plan-only, W ranks simulated in this process
// on the CPU engine (threads, SimWorld), forward and backward timed and checked against one device's plan.
// Simulated ranks share this machine's cores: their times show the overhead of the split, not a scaling; the
// issue's bar (2 and 4 GPUs, NCCL) needs the GPU path and a machine with several GPUs.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <random>
#include <thread>

#include "spattn/distributed.hpp"
#include "tools/args.hpp"
#include "tools/commands.hpp"

namespace spattn::tools {

namespace {

const char* kUsage =
    "usage: spattn dist-bench [--pattern SPEC] --len L --world W [--layout contiguous|zigzag] [--key-block N]\n"
    "                         [--batch B] [--heads H] [--kv-heads HK] [--dim D] [--dtype fp32|fp16|bf16]\n"
    "                         [--plan-only] [--reps N] [--threads N]\n"
    "Context-parallel attention over W ranks: per rank the keys it fetches and the bytes against the boundary\n"
    "volume (the bar: within 10%), then (without --plan-only) W ranks simulated on threads on the CPU engine,\n"
    "forward and backward timed against one device's plan and checked (max relative error). Default pattern\n"
    "local(4096). Simulated ranks share the CPU: the times are no scaling measurement.\n";

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int dist_bench_main(int argc, char** argv) {
  const Args a(argc, argv, 2,
               {"pattern", "len", "world", "layout", "key-block", "batch", "heads", "kv-heads", "dim", "dtype", "reps",
                "threads"},
               {"plan-only", "help"});
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
  pr.dtype = parse_dtype(a.str("dtype", "fp32"));
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

}  // namespace spattn::tools
