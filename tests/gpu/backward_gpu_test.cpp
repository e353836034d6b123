// Plan::backward on a CUDA device, kernel by kernel: the sm_90a tensor-core tiles (sm90_bwd, and the warp-specialized
// sm90_bwd_ws rows) and the CUDA-core CSR pass (cuda_csr_bwd), each forced and asserted to have run, against the fp64
// reference backward on fresh random inputs: every tile kind (full, band, bitmask; residue permutations), GQA, per-head
// patterns, empty rows, Lq != Lk, lengths that are no multiple of a tile, D = 64 and 128, bf16 and fp16, [B, H, L, D]
// strided views.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cuda/backward/tile_backward.hpp"
#include "gpu/plan_run.hpp"
#include "gpu/require_gpu.hpp"
#include "plan/analysis.hpp"
#include "plan/gpu/launch.hpp"
#include "plan/kernels.hpp"
#include "spattn/plan.hpp"
#include "spattn/reference.hpp"

namespace {

using spattn::DType;
using spattn::TensorView;
using spattn::test::Buf;
using spattn::test::for_each_index;

struct Case {
  std::vector<const char*> specs;
  DType dt;
  int64_t B, H, HK, Lq, Lk, D;
  bool bhld;  // tensors as [B, H, L, D] memory viewed as [B, L, H, D]
  spattn::Engine engine = spattn::Engine::automatic;
  int compound = -1;  // PlanOptions::compound (1: every column and scattered term out of the tiles)
  int64_t pad = 0;    // o and dq: [B, L, H, D + pad] memory viewed as [B, L, H, D] (narrowed rows; [B, L, H, D] only)
};

// Relative errors (Frobenius) of dq, dk, dv against the reference; `ran`: the kernel the backward launched;
// `explained`: the plan's explain after the backward, where given. graph_replays > 0: after the first backward, one
// captured into a CUDA graph on a stream of its own and the graph launched that many times, the gradients poisoned
// before each launch (the errors are the last launch's).
std::array<double, 3> backward_errors(const Case& c, const std::string& kernel, std::string* ran, uint32_t seed,
                                      std::string* explained = nullptr, int graph_replays = 0) {
  std::vector<spattn::Pattern> pats;
  std::vector<spattn::BoundPattern> bound;
  for (const char* s : c.specs) pats.push_back(spattn::parse(s)), bound.push_back(pats.back().bind(c.Lq, c.Lk));
  spattn::Problem pr;
  pr.batch = c.B, pr.q_heads = c.H, pr.kv_heads = c.HK, pr.q_len = c.Lq, pr.kv_len = c.Lk, pr.head_dim = c.D;
  pr.dtype = c.dt;
  spattn::PlanOptions o;
  o.backward_kernel = kernel;
  o.engine = c.engine;
  o.compound = c.compound;
  const spattn::Plan plan = spattn::make_plan(pats, pr, spattn::Device::cuda(0), o);
  const int es = spattn::dtype_size(c.dt);
  const std::array<int64_t, 4> sq{c.B, c.Lq, c.H, c.D}, sk{c.B, c.Lk, c.HK, c.D};
  // Host copies are contiguous [B, L, H, D]; device tensors [B, L, H, D] or [B, H, L, D] in memory.
  auto dev_view = [&](void* p, std::array<int64_t, 4> s) {
    if (!c.bhld) return TensorView::contiguous(p, c.dt, s);
    return TensorView{p, c.dt, {s[0], s[1], s[2], s[3]}, {s[1] * s[2] * s[3], s[3], s[1] * s[3], 1}};
  };
  const size_t nq = size_t(c.B * c.Lq * c.H * c.D), nk = size_t(c.B * c.Lk * c.HK * c.D);
  // o and dq: rows of D + pad elements in memory (the padding poisoned, and checked to stay so for dq).
  const int64_t Dp = c.D + c.pad;
  const size_t nqp = size_t(c.B * c.Lq * c.H * Dp);
  EXPECT_TRUE(c.pad == 0 || !c.bhld);
  auto narrow_view = [&](void* p, std::array<int64_t, 4> s) {
    if (!c.pad) return dev_view(p, s);
    return TensorView{p, c.dt, {s[0], s[1], s[2], s[3]}, {s[1] * s[2] * Dp, s[2] * Dp, Dp, 1}};
  };
  std::vector<uint8_t> hq(nq * es), hk(nk * es), hv(nk * es), hdo(nq * es);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto fill = [&](std::vector<uint8_t>& h, std::array<int64_t, 4> shape) {
    const TensorView t = TensorView::contiguous(h.data(), c.dt, shape);
    for_each_index(shape, [&](int64_t a, int64_t b, int64_t x, int64_t d) { t.store(a, b, x, d, nd(rng)); });
    return t;
  };
  const TensorView tq = fill(hq, sq), tk = fill(hk, sk), tv = fill(hv, sk), tdo = fill(hdo, sq);
  Buf q(nq * es), k(nk * es), v(nk * es), dout(nq * es), o_(nq * es), lse(size_t(c.B * c.H * c.Lq) * 4), gq(nqp * es),
      gk(nk * es), gv(nk * es), o_narrow(c.pad ? nqp * es : 1);
  auto upload = [&](const TensorView& host, const Buf& b, std::array<int64_t, 4> s) {
    const TensorView d = dev_view(b.p, s);
    std::vector<uint8_t> tmp(host.shape[0] * host.shape[1] * host.shape[2] * host.shape[3] * es);
    const TensorView t{tmp.data(), c.dt, d.shape, d.stride};
    for_each_index(s, [&](int64_t a, int64_t l, int64_t x, int64_t e) { t.store(a, l, x, e, host.load(a, l, x, e)); });
    EXPECT_EQ(cudaMemcpy(b.p, tmp.data(), tmp.size(), cudaMemcpyHostToDevice), cudaSuccess);
  };
  upload(tq, q, sq), upload(tk, k, sk), upload(tv, v, sk), upload(tdo, dout, sq);
  // Poison the gradients: every element must be written.
  for (const Buf* g : {&gq, &gk, &gv}) EXPECT_EQ(cudaMemset(g->p, 0x7f, g == &gq ? nqp * es : nk * es), cudaSuccess);
  const TensorView tl = TensorView::contiguous(lse.p, DType::f32, {c.B, c.H, c.Lq, 1});
  plan.forward(dev_view(q.p, sq), dev_view(k.p, sk), dev_view(v.p, sk), dev_view(o_.p, sq), tl);
  void* o_rows = o_.p;
  if (c.pad) {  // the forward's o copied into the narrowed rows
    EXPECT_EQ(cudaMemset(o_narrow.p, 0x7f, nqp * es), cudaSuccess);
    EXPECT_EQ(cudaMemcpy2D(o_narrow.p, Dp * es, o_.p, c.D * es, c.D * es, nq / c.D, cudaMemcpyDeviceToDevice),
              cudaSuccess);
    o_rows = o_narrow.p;
  }
  auto backward = [&](spattn::Stream st) {
    plan.backward(dev_view(q.p, sq), dev_view(k.p, sk), dev_view(v.p, sk), narrow_view(o_rows, sq), tl,
                  dev_view(dout.p, sq), narrow_view(gq.p, sq), dev_view(gk.p, sk), dev_view(gv.p, sk), st);
  };
  backward(nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (graph_replays > 0) {
    cudaStream_t st;
    EXPECT_EQ(cudaStreamCreate(&st), cudaSuccess);
    cudaGraph_t graph;
    EXPECT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), cudaSuccess);
    backward(st);
    EXPECT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
    cudaGraphExec_t exec;
    EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int r = 0; r < graph_replays; ++r) {
      for (const Buf* g : {&gq, &gk, &gv})
        EXPECT_EQ(cudaMemsetAsync(g->p, 0x7f, g == &gq ? nqp * es : nk * es, st), cudaSuccess);
      EXPECT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
      EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
  }
  *ran = plan.last_backward_kernel();
  if (explained) *explained = plan.explain();
  std::vector<double> rq(nq), rk(nk), rv(nk);
  spattn::cpu::reference_attention_backward(bound, pr, tq, tk, tv, tdo, TensorView::contiguous(rq.data(), DType::f64, sq),
                                            TensorView::contiguous(rk.data(), DType::f64, sk),
                                            TensorView::contiguous(rv.data(), DType::f64, sk));
  auto err = [&](const Buf& g, const std::vector<double>& want, std::array<int64_t, 4> s) {
    const bool narrowed = &g == &gq && c.pad;
    std::vector<uint8_t> h((narrowed ? nqp : want.size()) * es);
    EXPECT_EQ(cudaMemcpy(h.data(), g.p, h.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    const TensorView t = narrowed ? narrow_view(h.data(), s) : dev_view(h.data(), s);
    if (narrowed) {  // the padding keeps its poison
      size_t written = 0;
      for (size_t r = 0; r < nq / size_t(c.D); ++r)
        for (size_t b = c.D * es; b < size_t(Dp * es); ++b) written += h[r * Dp * es + b] != 0x7f;
      EXPECT_EQ(written, 0u) << "dq bytes written past its view's rows";
    }
    double num = 0, den = 0;
    size_t i = 0;
    for_each_index(s, [&](int64_t a, int64_t b, int64_t x, int64_t d) {
      const double e = t.load(a, b, x, d) - want[i];
      num += e * e, den += want[i] * want[i];
      ++i;
    });
    return std::isfinite(num) ? std::sqrt(num / std::max(den, 1e-30)) : INFINITY;
  };
  return {err(gq, rq, sq), err(gk, rk, sk), err(gv, rv, sk)};
}

// dq, dk, dv within 2e-2 (bf16) or 1e-2 (fp16) of the reference.
void expect_within(const std::array<double, 3>& e, DType dt) {
  const double tol = dt == DType::bf16 ? 2e-2 : 1e-2;
  EXPECT_LE(e[0], tol) << "dq";
  EXPECT_LE(e[1], tol) << "dk";
  EXPECT_LE(e[2], tol) << "dv";
}

// A case and the backward kernel it forces ("": the planner's choice).
struct KernelCase {
  Case c;
  const char* kernel;
};
// The prep / finish grids' batch and head limit (TileBackward::set_prepfin_grid_limit) for the scope.
struct PrepFinLimit {
  int prev;
  explicit PrepFinLimit(int l) : prev(spattn::cuda::TileBackward::set_prepfin_grid_limit(l)) {}
  ~PrepFinLimit() { spattn::cuda::TileBackward::set_prepfin_grid_limit(prev); }
};

// The prep and finish kernels (tile_bwd.cuh): 16-byte O loads and dq loads / stores where those rows are 16-byte
// aligned, 4-byte ones where they are not (o and dq narrowed from [B, L, H, D + 2] buffers: 4-byte aligned rows), as
// each launch decides (TileBackward::prepfin_counts, asserted). Every run against the reference: the warp-specialized
// rows' accumulator orders (D = 64, 128), the sm90_bwd rows', residue permutations, GQA, dq_accumulate (a compound
// plan's later tile part), lengths no multiple of 64.
TEST(BackwardGpu, PrepFinishAlignedAndNarrowedRows) {
  REQUIRE_GPU();
  if (!on_sm90a()) GTEST_SKIP() << "the tile backward runs on sm_90a only";
  using spattn::cuda::TileBackward;
  const auto a = spattn::Engine::automatic;
  const KernelCase cs[] = {
      {{{"local(40)"}, DType::bf16, 2, 4, 2, 300, 300, 64, false}, "sm90_bwd_ws_128x128_d64"},  // GQA
      {{{"causal"}, DType::f16, 1, 2, 2, 333, 333, 128, false}, "sm90_bwd_ws_64x128_d128"},
      {{{"local(24)"}, DType::bf16, 2, 4, 2, 190, 190, 128, false}, "sm90_bwd_64x128_d128"},
      {{{"dilated(20, 3)"}, DType::bf16, 1, 2, 1, 301, 301, 64, false}, "sm90_bwd_64x128_d64"},  // residue groups
      {{{"sparse_strided(100)"}, DType::bf16, 1, 2, 2, 2111, 2111, 64, false, a, 1}, ""},  // the affine part adds dq
      {{{"sparse_fixed(128, 4)"}, DType::bf16, 1, 4, 2, 517, 517, 64, false, a, 1}, ""},   // columns: dq added
  };
  uint32_t seed = 1700;
  for (const KernelCase& x : cs) {
    for (int64_t pad : {0, 2}) {
      Case c = x.c;
      c.pad = pad;
      SCOPED_TRACE(std::string(c.specs[0]) + " D=" + std::to_string(c.D) + " pad=" + std::to_string(pad));
      const TileBackward::PrepFinCounts n0 = TileBackward::prepfin_counts();
      std::string ran;
      const auto e = backward_errors(c, x.kernel, &ran, seed);
      const TileBackward::PrepFinCounts n1 = TileBackward::prepfin_counts();
      EXPECT_NE(ran.find("sm90_bwd"), std::string::npos) << ran;
      if (*x.kernel) EXPECT_EQ(ran, x.kernel);
      const int64_t tiles = n1.launches - n0.launches;  // tile backward launches
      EXPECT_GE(tiles, 1);
      EXPECT_EQ(n1.o16 - n0.o16, pad ? 0 : tiles) << "16-byte O loads";
      EXPECT_EQ(n1.dq16 - n0.dq16, pad ? 0 : tiles) << "16-byte dq stores";
      expect_within(e, c.dt);
    }
    ++seed;
  }
  // The grids split past their batch / head limit (lowered here to 3 and 1 a launch; CUDA's is 65535): the same
  // answers, for the row-major and the warp-specialized accumulator orders and dq_accumulate.
  for (int lim : {3, 1}) {
    const PrepFinLimit guard(lim);
    for (int i : {0, 2, 5})
      for (int64_t pad : {0, 2}) {
        Case c = cs[i].c;
        c.pad = pad;
        SCOPED_TRACE(std::string(c.specs[0]) + " D=" + std::to_string(c.D) + " pad=" + std::to_string(pad) +
                     " limit " + std::to_string(lim));
        const TileBackward::PrepFinCounts n0 = TileBackward::prepfin_counts();
        std::string ran;
        const auto e = backward_errors(c, cs[i].kernel, &ran, 1800 + i);
        EXPECT_GE(TileBackward::prepfin_counts().launches - n0.launches, 1) << ran;
        expect_within(e, c.dt);
      }
  }
  EXPECT_THROW(TileBackward::set_prepfin_grid_limit(0), spattn::Error);
  EXPECT_THROW(TileBackward::set_prepfin_grid_limit(65536), spattn::Error);
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {{"local(40)"}, DType::bf16, 2, 4, 2, 300, 300, 64, false},                   // band tiles, GQA
      {{"causal"}, DType::f16, 1, 2, 2, 333, 333, 128, false},                       // full + band, D = 128
      {{"longformer(40, 4)"}, DType::bf16, 2, 2, 2, 257, 257, 64, false},            // global rows / columns
      {{"dilated(20, 3)"}, DType::bf16, 1, 2, 1, 301, 301, 64, false},               // residue permutation
      {{"bigbird(16, 1, 1, 1, seed=1)"}, DType::bf16, 1, 2, 2, 300, 300, 128, false},
      {{"random(5, seed=3) | local(2)"}, DType::f16, 2, 2, 2, 200, 200, 64, false},  // bitmask tiles
      {{"causal & global_cols(100:180)"}, DType::bf16, 1, 2, 2, 250, 250, 64, false},  // rows with no key
      {{"local(30)"}, DType::bf16, 2, 2, 2, 150, 411, 64, false},                   // Lq != Lk
      {{"local(9)", "causal", "local(9)"}, DType::bf16, 1, 3, 3, 200, 200, 64, false},  // per-head patterns
      {{"local(24)"}, DType::bf16, 2, 4, 2, 190, 190, 128, true},                   // [B, H, L, D] views, GQA
      {{"dense"}, DType::f16, 1, 4, 1, 129, 129, 64, true},                          // group 4
      {{"neighborhood(dims=(16,20), kernel=5)"}, DType::bf16, 1, 2, 2, 320, 320, 64, false},  // 2-D windows
  };
  return c;
}

// Every case through `kernel`, which must be the one that ran (D = 64 / 128: the row of that head dim). A forced
// warp-specialized row runs where the plan has no residue permutation and q, dout take tensor maps, else the
// sm90_bwd 64x128 row of the head dim (reported as such); `ws_ran` counts the cases it ran.
void check_cases(const std::string& kernel, uint32_t seed, int64_t only_d = 0, int* ws_ran = nullptr) {
  const int row = spattn::plan::find_kernel(kernel.c_str());
  const bool ws = row >= 0 && spattn::plan::kKernels[row].kind == spattn::plan::KernelKind::sm90_bwd_ws;
  for (const Case& c : cases()) {
    if (only_d && c.D != only_d) continue;
    SCOPED_TRACE(std::string(c.specs[0]) + " D=" + std::to_string(c.D));
    std::string ran;
    const auto e = backward_errors(c, kernel, &ran, seed++);
    if (kernel == "sm90_bwd")  // a row of that kind (not warp-specialized) and head dim, the planner's choice
      EXPECT_TRUE(ran.rfind("sm90_bwd_", 0) == 0 && ran.rfind("sm90_bwd_ws", 0) != 0 &&
                  ran.substr(ran.rfind('_')) == "_d" + std::to_string(c.D)) << ran;
    else if (ws && ran != kernel)
      EXPECT_EQ(ran, spattn::plan::kKernels[spattn::plan::find_kernel(spattn::plan::KernelKind::sm90_bwd, 64, 128,
                                                                       int(c.D))].name);
    else
      EXPECT_EQ(ran, kernel);
    if (ws_ran && ran == kernel) ++*ws_ran;
    expect_within(e, c.dt);
  }
}

TEST(BackwardGpu, TileKernelMatchesReference) {
  REQUIRE_GPU();
  if (!on_sm90a()) GTEST_SKIP() << "the sm90_bwd kernel needs an sm_90a device (compute capability 9.0)";
  check_cases("sm90_bwd", 100);
}

// One small case of each tile kind for compute-sanitizer (memcheck, racecheck: scripts/gpu_check.d/backward.sh).
TEST(BackwardGpu, SmallCaseForSanitizers) {
  REQUIRE_GPU();
  if (!on_sm90a()) GTEST_SKIP() << "the sm90_bwd kernel needs an sm_90a device (compute capability 9.0)";
  const Case c{{"local(20) | random(3, seed=2)"}, DType::bf16, 1, 2, 1, 150, 150, 64, false};
  std::string ran;
  const auto e = backward_errors(c, "sm90_bwd", &ran, 7);
  EXPECT_EQ(ran, "sm90_bwd_64x128_d64");  // the planner's row here (plan::choose_backward_row)
  for (double x : e) EXPECT_LE(x, 2e-2);
}

// The same for the warp-specialized rows (producer / dQ-writer warps, mbarrier rings), D = 64 and 128, GQA.
TEST(BackwardGpu, SmallCaseForSanitizersWs) {
  REQUIRE_GPU();
  if (!on_sm90a()) GTEST_SKIP() << "the sm90_bwd_ws kernel needs an sm_90a device (compute capability 9.0)";
  const Case cs[] = {{{"local(20) | random(3, seed=2)"}, DType::bf16, 1, 2, 1, 150, 150, 64, false},
                     {{"causal"}, DType::f16, 1, 2, 2, 200, 200, 128, false}};
  for (const Case& c : cs) {
    std::string ran;
    const auto e = backward_errors(c, "sm90_bwd_ws", &ran, 7);
    // D = 64: the 128-query-step row (an odd key tile: an empty second half; a bitmask tile)
    EXPECT_EQ(ran, c.D == 64 ? "sm90_bwd_ws_128x128_d64" : "sm90_bwd_ws_64x128_d128");
    for (double x : e) EXPECT_LE(x, c.dt == DType::bf16 ? 2e-2 : 1e-2);
  }
}

TEST(BackwardGpu, EveryTileRowMatchesReference) {
  REQUIRE_GPU();
  if (!on_sm90a()) GTEST_SKIP() << "the sm90_bwd kernel needs an sm_90a device (compute capability 9.0)";
  int rows = 0, ws_rows = 0;
  for (const auto& row : spattn::plan::kKernels)
    if (spattn::plan::is_tile_bwd(row.kind) && !spattn::plan::bwd_strips_only(row)) {  // (QueryStrips*: the other)
      SCOPED_TRACE(row.name);
      const bool ws = row.kind == spattn::plan::KernelKind::sm90_bwd_ws;
      int ws_ran = 0;
      check_cases(row.name, 400 + 20 * rows++, row.head_dim, &ws_ran);
      if (ws) {
        ++ws_rows;
        // most cases on the warp-specialized kernel itself (not the residue-permuted: dilated at D = 64)
        EXPECT_GE(ws_ran, row.head_dim == 64 ? 6 : 2) << row.name << " ran on " << ws_ran << " cases";
      }
    }
  EXPECT_GE(rows, 5);
  EXPECT_EQ(ws_rows, 2);
}

// The 128-query-step row (tile_bwd_ws2.cuh, D = 64), forced: band, causal (full + band), bitmask, GQA, key tiles
// with an odd number of entries (a pair's empty second half), lengths no multiple of 64 or 128, Lq != Lk, empty
// rows, fp16 and bf16; each asserted to have run on that row.
TEST(BackwardGpu, Ws128QueryStepMatchesReference) {
  REQUIRE_GPU();
  if (!on_sm90a()) GTEST_SKIP() << "the sm90_bwd_ws kernel needs an sm_90a device (compute capability 9.0)";
  const Case cs[] = {
      {{"local(256)"}, DType::bf16, 2, 4, 4, 1000, 1000, 64, false},
      {{"local(40)"}, DType::bf16, 2, 4, 2, 300, 300, 64, false},
      {{"causal"}, DType::bf16, 1, 4, 2, 777, 777, 64, false},
      {{"causal"}, DType::f16, 2, 2, 2, 1024, 1024, 64, false},
      {{"local(left=200, right=0)"}, DType::bf16, 1, 8, 2, 650, 650, 64, false},
      {{"random(5, seed=3) | local(2)"}, DType::f16, 2, 2, 2, 200, 200, 64, false},
      {{"causal & global_cols(100:180)"}, DType::bf16, 1, 2, 2, 250, 250, 64, false},
      {{"local(30)"}, DType::bf16, 2, 2, 2, 150, 411, 64, false},
      {{"dense"}, DType::f16, 1, 4, 1, 129, 129, 64, true},
      {{"longformer(40, 4)"}, DType::bf16, 2, 2, 2, 257, 257, 64, false},
  };
  uint32_t seed = 900;
  for (const Case& c : cs) {
    SCOPED_TRACE(std::string(c.specs[0]) + " L=" + std::to_string(c.Lq));
    std::string ran;
    const auto e = backward_errors(c, "sm90_bwd_ws_128x128_d64", &ran, seed++);
    EXPECT_EQ(ran, "sm90_bwd_ws_128x128_d64");
    expect_within(e, c.dt);
  }
}

// The warp-specialized rows (D = 64: 128-query steps, tile_bwd_ws2.cuh; D = 128: 64, tile_bwd_ws.cuh; both with dV,
// dQ, dK as three wgmma groups, dQ staged while dK runs, each step's entries through shared memory), dK / dV through
// shared memory by TMA stores (tile_bwd.cuh, store_dkdv_smem): causal, windows, bitmask tiles, GQA (dK, dV summed over
// the group in registers), key tiles with an odd number of entries (a pair's empty second half), lengths that leave a
// partial last key tile (1000, 4099, 777, 411: rows past Lk must not be written), Lq != Lk, [B, H, L, D] views, fp16
// and bf16; each asserted to have run its row, the shared-memory epilogue and the persistent grid (TileBackward's
// counts; Persistent* run them on smaller grids), against the reference with the gradients poisoned beforehand. A
// compound plan whose tiles part writes dk, dv and whose affine part adds to them too.
const std::vector<Case>& ws_row_cases() {
  static const std::vector<Case> cs = {
      {{"local(256)"}, DType::bf16, 2, 4, 4, 1000, 1000, 64, false},
      {{"causal"}, DType::f16, 1, 2, 2, 1000, 1000, 64, false},
      {{"local(left=200, right=0)"}, DType::bf16, 1, 8, 2, 650, 650, 64, false},  // GQA 4:1
      {{"local(100)"}, DType::f16, 1, 4, 2, 4099, 4099, 64, false},               // GQA, a 3-key last tile
      {{"local(30)"}, DType::bf16, 2, 2, 2, 150, 411, 64, false},                 // Lq != Lk
      {{"random(5, seed=3) | local(2)"}, DType::f16, 2, 2, 2, 200, 200, 64, false},  // bitmask tiles
      {{"causal"}, DType::bf16, 1, 2, 2, 1000, 1000, 128, false},
      {{"causal"}, DType::bf16, 2, 4, 2, 777, 777, 128, false},
      {{"local(100)"}, DType::f16, 1, 4, 2, 4099, 4099, 128, false},              // GQA
      {{"local(100)"}, DType::f16, 2, 4, 1, 411, 411, 128, false},
      {{"local(left=200, right=0)"}, DType::bf16, 1, 8, 2, 650, 650, 128, false},
      {{"causal & global_cols(100:180)"}, DType::bf16, 1, 4, 2, 333, 333, 128, true},  // [B, H, L, D] views
      {{"random(5, seed=3) | local(2)"}, DType::f16, 1, 2, 2, 200, 200, 128, false},   // bitmask tiles
      {{"local(30)"}, DType::bf16, 1, 4, 2, 150, 411, 128, false},                     // Lq != Lk
      {{"local(24)"}, DType::bf16, 2, 4, 2, 190, 190, 128, true},                      // views, GQA
  };
  return cs;
}
// A small case for compute-sanitizer at D = 64 (a partial last key tile, a bitmask tile, an odd key tile).
const Case kWs64SmallCase{{"local(20) | random(3, seed=2)"}, DType::bf16, 1, 2, 1, 150, 150, 64, false};
// ... and at D = 128 (a partial last key tile).
const Case kWs128SmallCase{{"causal"}, DType::f16, 1, 2, 2, 200, 200, 128, false};

TEST(BackwardGpu, WsRowsMatchReference) {
  REQUIRE_GPU();
  if (!on_sm90a()) GTEST_SKIP() << "the sm90_bwd_ws kernels need an sm_90a device (compute capability 9.0)";
  using spattn::cuda::TileBackward;
  uint32_t seed = 2600;
  for (const Case& c : ws_row_cases()) {
    SCOPED_TRACE(std::string(c.specs[0]) + " D=" + std::to_string(c.D) + " L=" + std::to_string(c.Lq) + "x" +
                 std::to_string(c.Lk));
    const int64_t e0 = TileBackward::smem_epilogue_launches(), p0 = TileBackward::persistent_launches();
    std::string ran;
    const auto e = backward_errors(c, "sm90_bwd_ws", &ran, seed++);
    EXPECT_EQ(ran, c.D == 64 ? "sm90_bwd_ws_128x128_d64" : "sm90_bwd_ws_64x128_d128");
    EXPECT_EQ(TileBackward::smem_epilogue_launches() - e0, 1) << "the shared-memory epilogue";
    EXPECT_EQ(TileBackward::persistent_launches() - p0, 1) << "the persistent grid (the SMs' grid)";
    expect_within(e, c.dt);
  }
  {  // a compound plan: the tiles part writes dk, dv, the affine part adds (each thread its pairs)
    const Case c{{"sparse_strided(100)"}, DType::bf16, 1, 2, 2, 2111, 2111, 64, false, spattn::Engine::automatic, 1};
    SCOPED_TRACE("sparse_strided(100), compound");
    std::string ran;
    expect_within(backward_errors(c, "", &ran, seed++), c.dt);
  }
}

// The warp-specialized rows' dQ finish (tile_bwd.cuh, bwd_finish_tile_kernel: a CTA per 64-row tile through shared
// memory) against the reference: D = 64 and 128, bf16 and fp16, GQA, query lengths no multiple of 64, rows that keep
// no key, [B, H, L, D] views, narrowed dq rows (4-byte loads and stores), a compound plan whose columns part adds to
// dq (dq_accumulate); at the grid limit 65535 and 1 (a launch a batch and head). Each asserted to have run it
// (TileBackward::finish_tile_counts). (No residue permutation: the warp-specialized rows load by TMA, identity plans
// only.)
TEST(BackwardGpu, WsFinishTileMatchesReference) {
  REQUIRE_GPU();
  if (!on_sm90a()) GTEST_SKIP() << "the sm90_bwd_ws kernels need an sm_90a device (compute capability 9.0)";
  using spattn::cuda::TileBackward;
  const auto a = spattn::Engine::automatic;
  const KernelCase cs[] = {
      {{{"dense"}, DType::bf16, 1, 4, 2, 333, 100, 64, false}, "sm90_bwd_ws"},
      {{{"local(30)"}, DType::f16, 2, 2, 2, 333, 120, 128, false}, "sm90_bwd_ws"},  // rows past 150 keep no key
      {{{"causal"}, DType::bf16, 2, 4, 2, 200, 128, 128, true}, "sm90_bwd_ws"},     // [B, H, L, D] views
      {{{"dense"}, DType::f16, 1, 2, 1, 190, 128, 64, false, a, -1, 2}, "sm90_bwd_ws"},   // narrowed o, dq rows
      {{{"local(30)"}, DType::bf16, 1, 2, 2, 250, 128, 128, false, a, -1, 2}, "sm90_bwd_ws"},
      // by parts: the tiles part writes dq, the columns part (4 keys gathered) adds to it
      {{{"local(16) | global_cols(0:4)"}, DType::bf16, 1, 4, 2, 120, 120, 64, false, a, 1}, ""},
      {{{"local(16) | global_cols(0:4)"}, DType::f16, 1, 4, 2, 120, 120, 128, false, a, 1}, ""},
  };
  for (int lim : {65535, 1}) {
    const PrepFinLimit guard(lim);
    uint32_t seed = 3100;
    for (const KernelCase& x : cs) {
      const Case& c = x.c;
      SCOPED_TRACE(std::string(c.specs[0]) + " D=" + std::to_string(c.D) + " L=" + std::to_string(c.Lq) + "x" +
                   std::to_string(c.Lk) + " pad=" + std::to_string(c.pad) + " limit " + std::to_string(lim));
      const int64_t parts = c.compound == 1 ? 2 : 1;  // tile backward launches
      const TileBackward::FinishTileCounts n0 = TileBackward::finish_tile_counts();
      std::string ran;
      const auto e = backward_errors(c, x.kernel, &ran, seed);
      const TileBackward::FinishTileCounts n1 = TileBackward::finish_tile_counts();
      EXPECT_NE(ran.find("sm90_bwd_ws"), std::string::npos) << ran;
      EXPECT_EQ(n1.launches - n0.launches, parts) << "tile finishes";
      EXPECT_EQ(n1.accumulate - n0.accumulate, parts - 1) << "tile finishes adding to dq";
      expect_within(e, c.dt);
      ++seed;
    }
  }
}

// One small case of each warp-specialized row, for compute-sanitizer (a partial last key tile, a bitmask tile, an odd
// key tile at D = 64; GQA).
TEST(BackwardGpu, WsRowsSmallCaseForSanitizers) {
  REQUIRE_GPU();
  if (!on_sm90a()) GTEST_SKIP() << "the sm90_bwd_ws kernels need an sm_90a device (compute capability 9.0)";
  using spattn::cuda::TileBackward;
  const Case cs[] = {kWs64SmallCase, kWs128SmallCase};
  for (const Case& c : cs) {
    SCOPED_TRACE(std::string(c.specs[0]) + " D=" + std::to_string(c.D));
    const int64_t e0 = TileBackward::smem_epilogue_launches();
    std::string ran;
    const auto e = backward_errors(c, "sm90_bwd_ws", &ran, 2900);
    EXPECT_EQ(ran, c.D == 64 ? "sm90_bwd_ws_128x128_d64" : "sm90_bwd_ws_64x128_d128");
    EXPECT_EQ(TileBackward::smem_epilogue_launches() - e0, 1);
    expect_within(e, c.dt);
  }
}

// The persistent grid of both warp-specialized rows (tile_bwd_ws2.cuh, tile_bwd_ws_persist_body): CTAs taking key
// tiles from a counter, the ring, dS^T and dQ staging phases running on across items, the next K / V loaded before the
// dK / dV epilogue, which stages them in a dS^T buffer (D = 64) or the dQ buffers (D = 128). The grid set (0: the SMs)
// for the scope.
struct GridLimit {
  int prev;
  explicit GridLimit(int limit) : prev(spattn::cuda::TileBackward::set_persistent_grid_limit(limit)) {}
  ~GridLimit() { spattn::cuda::TileBackward::set_persistent_grid_limit(prev); }
};
// c through the persistent grid (asserted to have run once a backward call, the captured one too, with the
// shared-memory epilogue) against the reference.
void expect_persistent(const Case& c, uint32_t seed, int graph_replays = 0) {
  using spattn::cuda::TileBackward;
  const int64_t p0 = TileBackward::persistent_launches(), e0 = TileBackward::smem_epilogue_launches();
  std::string ran;
  const auto e = backward_errors(c, "sm90_bwd_ws", &ran, seed, nullptr, graph_replays);
  EXPECT_EQ(ran, c.D == 64 ? "sm90_bwd_ws_128x128_d64" : "sm90_bwd_ws_64x128_d128");
  // the eager backward; a captured one launches at capture (host side) too
  const int64_t launches = graph_replays > 0 ? 2 : 1;
  EXPECT_EQ(TileBackward::persistent_launches() - p0, launches) << "the persistent grid";
  EXPECT_EQ(TileBackward::smem_epilogue_launches() - e0, launches) << "the shared-memory epilogue";
  expect_within(e, c.dt);
}

// WsRowsMatchReference's cases (their seeds; that test runs them on the SMs' grid) on grids of 3 and 1 CTAs (every CTA
// several items: the protocol across items), cases with more items than SMs at the full grid, and a compound plan
// (its tiles part on the persistent grid, its affine part adding to dK / dV).
TEST(BackwardGpu, PersistentMatchesReference) {
  REQUIRE_GPU();
  if (!on_sm90a()) GTEST_SKIP() << "the sm90_bwd_ws kernels need an sm_90a device (compute capability 9.0)";
  using spattn::cuda::TileBackward;
  for (int limit : {3, 1}) {
    const GridLimit on(limit);
    uint32_t seed = 2600;
    for (const Case& c : ws_row_cases()) {
      const uint32_t s = seed++;
      SCOPED_TRACE(std::string(c.specs[0]) + " D=" + std::to_string(c.D) + " L=" + std::to_string(c.Lq) + "x" + std::to_string(c.Lk) +
                   " grid limit " + std::to_string(limit));
      expect_persistent(c, s);
      EXPECT_LE(TileBackward::last_persistent_grid(), limit);
    }
  }
  for (int d : {64, 128}) {  // 32 key tiles x 16 kv heads = 512 items
    const Case c{{"local(64)"}, DType::bf16, 2, 8, 8, 4096, 4096, d, false};
    SCOPED_TRACE("local(64) L=4096, 512 items, D=" + std::to_string(d));
    expect_persistent(c, 2700 + d);
    EXPECT_LT(TileBackward::last_persistent_grid(), 512);
    EXPECT_GE(TileBackward::last_persistent_grid(), 1);
  }
  {
    const Case c{{"sparse_strided(100)"}, DType::bf16, 1, 2, 2, 2111, 2111, 64, false, spattn::Engine::automatic, 1};
    SCOPED_TRACE("sparse_strided(100), compound");
    const int64_t p0 = TileBackward::persistent_launches();
    std::string ran;
    expect_within(backward_errors(c, "", &ran, 2750), c.dt);
    // the tiles part (it writes dK, dV) on the persistent grid; the affine part adds on its own rows
    EXPECT_EQ(TileBackward::persistent_launches() - p0, 1) << "the tiles part on the persistent grid";
  }
  EXPECT_THROW(TileBackward::set_persistent_grid_limit(-1), spattn::Error);
}

// Captured into a CUDA graph and launched twice (the gradients poisoned before each): the counter's memset node
// zeroes it at each launch (the eager run before the capture leaves it past the items). 3 CTAs: several items each.
TEST(BackwardGpu, PersistentGraphReplays) {
  REQUIRE_GPU();
  if (!on_sm90a()) GTEST_SKIP() << "the sm90_bwd_ws kernels need an sm_90a device (compute capability 9.0)";
  const Case cs[] = {{{"local(100)"}, DType::f16, 1, 4, 2, 4099, 4099, 64, false},
                     {{"local(256)"}, DType::bf16, 2, 4, 4, 1000, 1000, 64, false},
                     {{"local(100)"}, DType::bf16, 1, 4, 2, 4099, 4099, 128, false}};
  uint32_t seed = 2750;
  for (int limit : {0, 3})
    for (const Case& c : cs) {
      SCOPED_TRACE(std::string(c.specs[0]) + " grid limit " + std::to_string(limit));
      const GridLimit on(limit);
      expect_persistent(c, seed++, 2);
    }
}

// kWs64SmallCase (2 items) and kWs128SmallCase (4 items of 4 or 2 steps) on the persistent grid, for
// compute-sanitizer: the SMs' grid, then 1 CTA (every item in one CTA).
TEST(BackwardGpu, PersistentSmallCaseForSanitizers) {
  REQUIRE_GPU();
  if (!on_sm90a()) GTEST_SKIP() << "the sm90_bwd_ws kernels need an sm_90a device (compute capability 9.0)";
  for (int limit : {0, 1}) {
    SCOPED_TRACE(std::string("grid limit ") + std::to_string(limit));
    const GridLimit on(limit);
    expect_persistent(kWs64SmallCase, 2900);
    expect_persistent(kWs128SmallCase, 2901);
  }
}

// dQ's first writes stored by their owners (plan::dq_owners, tile_bwd_ws.cuh's ws_write_dq; TileBackward's mode): the
// owner's step stores a query tile's accumulator (prep no longer zeroes it) and the other steps add after its flag.
// With mode 2 (owners even where most steps wait: causal's key tile 0 owns every query tile) WsRowsMatchReference's
// D = 128 cases on the SMs' grid, 3 CTAs and 1 (every wait then on an item the same CTA ran before), each with a graph
// captured and replayed twice (the accumulator holds the last launch's sums when the next runs: an owner that added
// instead of storing would be caught); causal & global_cols(100:180)'s first query tile has no key, so that plan keeps
// prep's zeroing and adds (asserted: no owners). Mode 0 on a band (no owners); mode 1 (the default) on the bands the
// rule admits, walked last first; and prep split a launch a batch and head.
struct DqOwnerOn {
  int prev;
  explicit DqOwnerOn(int mode) : prev(spattn::cuda::TileBackward::set_dq_owner_mode(mode)) {}
  ~DqOwnerOn() { spattn::cuda::TileBackward::set_dq_owner_mode(prev); }
};
void expect_dq_owners(const Case& c, uint32_t seed, bool owned, int graph_replays) {
  using spattn::cuda::TileBackward;
  const int64_t o0 = TileBackward::dq_owner_launches();
  std::string ran;
  const auto e = backward_errors(c, "sm90_bwd_ws", &ran, seed, nullptr, graph_replays);
  EXPECT_EQ(ran, "sm90_bwd_ws_64x128_d128");
  EXPECT_EQ(TileBackward::dq_owner_launches() - o0, owned ? (graph_replays > 0 ? 2 : 1) : 0) << "owners' launches";
  expect_within(e, c.dt);
}
TEST(BackwardGpu, DqOwnersMatchReference) {
  REQUIRE_GPU();
  if (!on_sm90a()) GTEST_SKIP() << "the sm90_bwd_ws kernels need an sm_90a device (compute capability 9.0)";
  {
    const DqOwnerOn on(2);
    for (int limit : {0, 3, 1}) {
      const GridLimit grid(limit);
      uint32_t seed = 3300;
      for (const Case& c : ws_row_cases()) {
        const uint32_t sd = seed++;
        if (c.D != 128) continue;
        SCOPED_TRACE(std::string(c.specs[0]) + " L=" + std::to_string(c.Lq) + "x" + std::to_string(c.Lk) +
                     " grid limit " + std::to_string(limit));
        expect_dq_owners(c, sd, std::string(c.specs[0]) != "causal & global_cols(100:180)", 2);
      }
    }
  }
  {  // mode 0: prep zeroes the accumulator and every step adds
    const DqOwnerOn off(0);
    const Case c{{"local(100)"}, DType::f16, 1, 4, 2, 4099, 4099, 128, false};
    SCOPED_TRACE("local(100) 4099, owners off");
    expect_dq_owners(c, 3379, false, 0);
  }
  const DqOwnerOn on(1);
  for (int limit : {0, 3}) {
    const GridLimit grid(limit);
    const Case c{{"local(100)"}, DType::f16, 1, 4, 2, 4099, 4099, 128, false};
    SCOPED_TRACE("local(100) 4099, grid limit " + std::to_string(limit));
    expect_dq_owners(c, 3380 + limit, true, 2);
  }
  const PrepFinLimit lim(1);
  const Case c{{"local(100)"}, DType::bf16, 2, 4, 2, 4099, 4099, 128, false};
  SCOPED_TRACE("local(100), prep grid limit 1, graph replays");
  expect_dq_owners(c, 3390, true, 2);
}

// A grid of twice the SMs' CTAs (one fits an SM: the second half starts only once CTAs of the first have ended) over
// causal lists with owners forced (key tile 0 owns every query tile) and 2 x SMs units (B = 2, H = SMs), one head
// section: the first 2 x SMs items are every unit's key tile 0, the rest wait on them. Were a CTA's first item its
// blockIdx.x (as before this test came), the running CTAs would take from the counter the other key tiles of
// the second half's units and wait on those units' key tile 0, whose CTAs cannot start: every running CTA ends up
// waiting (4 key tiles: 3 x SMs such items, at most 3 taken by a CTA whose writer waits: its producer stops in the
// third's loads), a hang. Every item from the counter (Ws2Items::take): an item waited on is a running CTA's.
TEST(BackwardGpu, DqOwnersOnAGridPastTheSMs) {
  REQUIRE_GPU();
  if (!on_sm90a()) GTEST_SKIP() << "the sm90_bwd_ws kernels need an sm_90a device (compute capability 9.0)";
  int dev = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), cudaSuccess);
  const DqOwnerOn on(2);
  const GridLimit grid(2 * sms);
  setenv("SPATTN_HEAD_SECTION", "0", 1);  // one section: items key tile by key tile over all units
  const Case c{{"causal"}, DType::bf16, 2, sms, sms, 512, 512, 128, false};
  SCOPED_TRACE(std::string("causal L=512, B=2, H=") + std::to_string(sms));
  expect_dq_owners(c, 3396, true, 0);
  EXPECT_EQ(spattn::cuda::TileBackward::last_persistent_grid(), 2 * sms);
  unsetenv("SPATTN_HEAD_SECTION");
}

// kWs128SmallCase with the owners' stores, for compute-sanitizer: the SMs' grid, then 1 CTA.
TEST(BackwardGpu, DqOwnersSmallCaseForSanitizers) {
  REQUIRE_GPU();
  if (!on_sm90a()) GTEST_SKIP() << "the sm90_bwd_ws kernels need an sm_90a device (compute capability 9.0)";
  const DqOwnerOn on(2);
  for (int limit : {0, 1}) {
    SCOPED_TRACE(std::string("grid limit ") + std::to_string(limit));
    const GridLimit grid(limit);
    expect_dq_owners(kWs128SmallCase, 3395, true, 0);
  }
}

TEST(BackwardGpu, CsrKernelMatchesReference) {
  REQUIRE_GPU();
  check_cases("cuda_csr_bwd", 200);
}

// The CSR pass takes what the tiles do not: fp32, other head dims; and it is the unfused engine's backward too.
TEST(BackwardGpu, CsrKernelTakesTheRest) {
  REQUIRE_GPU();
  const Case cs[] = {
      {{"dilated(20, 2) | random(3, seed=4)"}, DType::f32, 2, 2, 1, 300, 300, 32, false},
      {{"bigbird(16, 1, 1, 1, seed=1)"}, DType::bf16, 2, 2, 2, 300, 300, 64, false, spattn::Engine::cuda_unfused},
  };
  for (const Case& c : cs) {
    SCOPED_TRACE(c.specs[0]);
    std::string ran;
    const auto e = backward_errors(c, "", &ran, 300);
    EXPECT_EQ(ran, c.dt == DType::f32 || !on_sm90a() ? "cuda_csr_bwd" : "sm90_bwd_ws_128x128_d64");  // the default
    for (double x : e) EXPECT_LE(x, c.dt == DType::f32 ? 1e-4 : 2e-2);
  }
}

// Compound plans (issue 39): each part of the forward's split differentiated against the merged LSE, the tiles part on
// the tile backward (the CSR pass where the device or tensors refuse it) and the columns and scattered parts on the
// CSR pass over their own CSR, the first part writing the gradients (poisoned beforehand) and the others adding to
// them. Awkward lengths, GQA, D = 64 and 128, empty rows, per-head patterns; patterns with a rows part (longformer's
// global rows) run whole. Whether a case runs by parts is the planner's (plan::backward_parts), and the cases marked
// must.
TEST(BackwardGpu, CompoundPlansByParts) {
  REQUIRE_GPU();
  struct ByParts {
    Case c;
    bool must;  // by parts whatever the device
  };
  const ByParts cs[] = {
      {{{"sparse_fixed(128, 4)"}, DType::bf16, 1, 4, 2, 517, 517, 64, false, spattn::Engine::automatic, 1}, true},
      {{{"local(64) | random(8, seed=3)"}, DType::bf16, 2, 2, 2, 333, 333, 64, false, spattn::Engine::automatic, 1}, true},
      {{{"local(256) | random(8)"}, DType::bf16, 1, 2, 2, 1000, 1000, 128, false}, true},  // the split's own choice
      {{{"random(6, seed=2)"}, DType::f16, 1, 2, 1, 301, 301, 64, false, spattn::Engine::automatic, 1}, true},  // no tiles part
      {{{"local(16) | global_cols(0:4) | random(3, seed=4)"}, DType::bf16, 1, 4, 1, 290, 290, 128, false,
        spattn::Engine::automatic, 1}, true},  // three parts, GQA 4:1
      {{{"(local(left=200, right=0) | global_cols(0:4)) & causal"}, DType::f16, 1, 4, 1, 457, 457, 128, false,
        spattn::Engine::automatic, 1}, false},
      {{{"longformer(40, 4)"}, DType::bf16, 2, 2, 2, 257, 257, 64, false, spattn::Engine::automatic, 1}, false},
      {{{"bigbird(16, 1, 1, 1, seed=1)"}, DType::bf16, 1, 2, 2, 300, 300, 128, false, spattn::Engine::automatic, 1}, false},
      {{{"local(5) & global_rows(0:120) | random(3, seed=9) & global_rows(60:150)"}, DType::bf16, 1, 2, 2, 250, 250, 64,
        false, spattn::Engine::automatic, 1}, false},  // rows 150... keep no key
      {{{"local(16) | random(4, seed=1)", "sparse_fixed(64, 2)"}, DType::bf16, 1, 2, 2, 300, 300, 64, false,
        spattn::Engine::automatic, 1}, true},  // per-head patterns
  };
  int dev = 0, sms = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  int by_parts = 0;
  uint32_t seed = 900;
  for (const ByParts& b : cs) {
    const Case& c = b.c;
    SCOPED_TRACE(std::string(c.specs[0]) + " D=" + std::to_string(c.D));
    spattn::PlanOptions o;
    o.compound = c.compound;
    bool want = false;
    for (const char* s : c.specs) {
      const spattn::BoundPattern bp = spattn::parse(s).bind(c.Lq, c.Lk);
      want = want || spattn::plan::backward_parts(bp, spattn::plan::analyze(bp), c.D,
                                                  spattn::plan::GpuTarget{10 * major + minor, sms}, o).by_parts();
    }
    if (b.must) EXPECT_TRUE(want);
    std::string ran;
    const auto e = backward_errors(c, "", &ran, seed++);
    EXPECT_EQ(ran.rfind("parts(", 0) == 0, want) << ran;
    if (want && on_sm90a() && c.specs[0][0] != 'r')  // a tiles part first, on the tile backward
      EXPECT_EQ(ran.rfind("parts(sm90_bwd", 0), 0u) << ran;
    // (ran: the last head's pattern; the parts' kernels checked on one-pattern cases)
    const std::string spec = c.specs.size() == 1 ? c.specs[0] : "";
    if (want && on_sm90a() && spec.rfind("sparse_fixed", 0) == 0)  // columns: the tiles over their gathered keys
      EXPECT_EQ(ran.find("cuda_csr_bwd"), std::string::npos) << ran;
    if (want && spec.find("random") != std::string::npos)  // the scattered part on the rows kernels
      EXPECT_NE(ran.find("cuda_scattered_bwd"), std::string::npos) << ran;
    by_parts += want;
    expect_within(e, c.dt);
  }
  EXPECT_GE(by_parts, 6);
}

// The CSR parts' rows kernels (cuda_scattered_bwd, scattered_backward.hpp): the scattered part alone (it writes the
// gradients: keys no row keeps get 0), after a tiles part (it adds), GQA, Lq != Lk, D = 64 and 128, a scattered part
// with empty rows (a band covering most random keys); each against the reference, and again with o and dq narrowed
// from [B, L, H, D + 2] rows ([B, L, H, D] layout), which the rows kernels do not take: the warp-a-row pass
// (cuda_csr_bwd) runs the scattered part then, writing or, after a tiles part, adding.
TEST(BackwardGpu, ScatteredPartRowsKernels) {
  REQUIRE_GPU();
  const Case cs[] = {
      {{"random(6, seed=2)"}, DType::f16, 1, 2, 1, 301, 301, 64, false, spattn::Engine::automatic, 1},
      {{"local(64) | random(8, seed=3)"}, DType::bf16, 2, 4, 2, 333, 301, 128, false, spattn::Engine::automatic, 1},
      {{"local(100) | random(3, seed=1)"}, DType::bf16, 1, 2, 2, 150, 150, 64, false, spattn::Engine::automatic, 1},
      {{"local(7) | random(5, seed=4)"}, DType::bf16, 2, 8, 1, 77, 1000, 64, true, spattn::Engine::automatic, 1},
  };
  uint32_t seed = 1300;
  for (const Case& c : cs) {
    SCOPED_TRACE(std::string(c.specs[0]) + " D=" + std::to_string(c.D));
    const spattn::BoundPattern bp = spattn::parse(c.specs[0]).bind(c.Lq, c.Lk);
    spattn::PlanOptions o;
    o.compound = c.compound;
    const spattn::plan::BackwardParts parts =
        spattn::plan::backward_parts(bp, spattn::plan::analyze(bp), c.D, spattn::plan::GpuTarget{90, 132}, o);
    ASSERT_TRUE(parts.by_parts()) << parts.describe();
    ASSERT_EQ(parts.parts.back().kind, spattn::plan::PartKind::scattered) << parts.describe();
    if (c.Lq == 150) {  // rows whose random keys all lie in the band: empty in the scattered part
      const auto& off = parts.parts.back().offsets;
      int64_t empty = 0;
      for (size_t q = 0; q + 1 < off.size(); ++q) empty += off[q] == off[q + 1];
      EXPECT_GT(empty, 20) << "the case should have empty scattered rows";
    }
    for (int64_t pad : {0, 2}) {
      Case cp = c;
      cp.pad = pad;
      if (pad) cp.bhld = false;
      std::string ran;
      const auto e = backward_errors(cp, "", &ran, seed);
      EXPECT_EQ(ran.rfind("parts(", 0), 0u) << "pad " << pad << ": " << ran;
      EXPECT_EQ(ran.find("cuda_scattered_bwd") != std::string::npos, pad == 0) << "pad " << pad << ": " << ran;
      EXPECT_EQ(ran.find("cuda_csr_bwd") != std::string::npos, pad != 0) << "pad " << pad << ": " << ran;
      const double tol = c.dt == DType::bf16 ? 2e-2 : 1e-2;
      EXPECT_LE(e[0], tol) << "dq, pad " << pad;
      EXPECT_LE(e[1], tol) << "dk, pad " << pad;
      EXPECT_LE(e[2], tol) << "dv, pad " << pad;
    }
    ++seed;
  }
}

// explain() names the backward's parts and kernels.
TEST(BackwardGpu, CompoundExplainListsBackwardParts) {
  REQUIRE_GPU();
  spattn::Problem pr;
  pr.batch = 1, pr.q_heads = pr.kv_heads = 2, pr.q_len = pr.kv_len = 600, pr.head_dim = 64, pr.dtype = DType::bf16;
  spattn::PlanOptions o;
  o.compound = 1;
  const spattn::Plan plan = spattn::make_plan(spattn::parse("local(32) | random(4, seed=2)"), pr, spattn::Device::cuda(0), o);
  const std::string ex = plan.explain();
  EXPECT_NE(ex.find("backward by parts"), std::string::npos) << ex;
  EXPECT_NE(ex.find("scattered [random(4, seed=2)]"), std::string::npos) << ex;
  EXPECT_NE(ex.find("the CSR pass over the part's CSR and its transpose (cuda_scattered_bwd"), std::string::npos) << ex;
  const spattn::Plan cols = spattn::make_plan(spattn::parse("sparse_fixed(64, 2)"), pr, spattn::Device::cuda(0), o);
  EXPECT_NE(cols.explain().find("columns [summary(64, c=2)]"), std::string::npos) << cols.explain();
  EXPECT_NE(cols.explain().find("keys gathered"), std::string::npos) << cols.explain();
  o.compound = 0;
  const spattn::Plan whole = spattn::make_plan(spattn::parse("local(32) | random(4, seed=2)"), pr, spattn::Device::cuda(0), o);
  EXPECT_NE(whole.explain().find("backward: the whole pattern (one tile list)"), std::string::npos) << whole.explain();
}

TEST(BackwardGpu, ForcedTileKernelRefusesWhatItCannotRun) {
  REQUIRE_GPU();
  Case c{{"local(8)"}, DType::f32, 1, 2, 2, 64, 64, 64, false};  // fp32: the CSR pass only
  std::string ran;
  try {
    backward_errors(c, "sm90_bwd", &ran, 1);
    FAIL() << "fp32 with the tile kernel forced should be refused";
  } catch (const spattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("sm90_bwd"), std::string::npos) << e.what();
  }
  spattn::Problem pr;
  pr.batch = 1, pr.q_heads = pr.kv_heads = 1, pr.q_len = pr.kv_len = 64, pr.head_dim = 64, pr.dtype = DType::bf16;
  spattn::PlanOptions o;
  o.backward_kernel = "sm90_bwd_64x128_d128";  // a head dim the problem does not have
  EXPECT_THROW(spattn::make_plan(spattn::parse("local(8)"), pr, spattn::Device::cuda(0), o), spattn::Error);
  o.backward_kernel = "sm90_tma_128x128_d64";  // a forward row
  EXPECT_THROW(spattn::make_plan(spattn::parse("local(8)"), pr, spattn::Device::cuda(0), o), spattn::Error);
}

// Issue 42: the backward of the strided cases on the tile kernels the planner chooses, against the reference, at
// lengths that leave residue groups unequal: sparse_strided by parts (the band's tiles part writes dQ, dK, dV, the
// affine part, grouped by residue past 16, adds to them: tile_bwd.cuh's dkv_accumulate), stride and dilated terms
// whole, grouped by residue past 16. Session 23 and 24 (before the fix) threw at the first case: backward_parts
// dropped the affine part and the CSR pass refused its empty CSR. Groups of at most half a key tile of tokens run
// coarser (plan::backward_tiles: several residues a group, in bitmask tiles).
TEST(BackwardGpu, StridedPastSixteen) {
  REQUIRE_GPU();
  if (!on_sm90a()) GTEST_SKIP() << "the tile backward runs on sm_90a only";
  struct Strided {
    Case c;
    int perm;  // the residue groups of the (last) tile plan the backward runs
    bool by_parts;
  };
  // Groups of at most half a key tile of tokens run coarser in the backward (several residues a group, bitmask tiles).
  const Strided cs[] = {
      {{{"sparse_strided(256)"}, DType::bf16, 1, 2, 2, 4099, 4099, 64, false}, 128, true},
      {{{"sparse_strided(128)"}, DType::f16, 2, 4, 2, 3001, 3001, 128, false}, 32, true},  // GQA, D = 128
      {{{"sparse_strided(100)"}, DType::bf16, 1, 2, 2, 2111, 2111, 64, false, spattn::Engine::automatic, 1}, 50, true},
      {{{"sparse_strided(512)"}, DType::bf16, 1, 2, 2, 9001, 9001, 128, false}, 128, true},
      {{{"stride(64) & causal"}, DType::bf16, 1, 2, 1, 3001, 3001, 128, false}, 32, false},
      {{{"stride(40) & causal"}, DType::bf16, 1, 2, 2, 1999, 1999, 64, true}, 40, false},  // [B, H, L, D] views
      {{{"dilated(64, 32)"}, DType::f16, 1, 2, 2, 2049, 2049, 64, false}, 32, false},
      {{{"dilated(16, 17)"}, DType::bf16, 1, 2, 2, 1500, 1301, 64, false}, 17, false},  // Lq != Lk
  };
  uint32_t seed = 400;
  // Passes: the default; head sections of one kv head (SPATTN_HEAD_SECTION, read at each launch: residue-grouped
  // plans run in sections at the suite's lengths, plan::list_shape).
  for (const int pass : {0, 1})
  for (const Strided& x : cs) {
    const Case& c = x.c;
    SCOPED_TRACE(std::string(c.specs[0]) + " D=" + std::to_string(c.D) + " L=" + std::to_string(c.Lq) +
                 (pass == 1 ? " SPATTN_HEAD_SECTION=1" : ""));
    std::string ran, ex;
    if (pass == 1) setenv("SPATTN_HEAD_SECTION", "1", 1);
    const auto e = backward_errors(c, "", &ran, seed++, &ex);
    unsetenv("SPATTN_HEAD_SECTION");
    if (x.by_parts) {
      EXPECT_EQ(ran.rfind("parts(sm90_bwd", 0), 0u) << ran;
      EXPECT_NE(ran.find("+sm90_bwd"), std::string::npos) << "the affine part on the tile backward: " << ran;
      EXPECT_NE(ex.find("affine part: backward"), std::string::npos) << ex;
    } else {
      EXPECT_EQ(ran.rfind("sm90_bwd", 0), 0u) << ran;
    }
    const size_t last = ex.rfind("key-major block");
    ASSERT_NE(last, std::string::npos) << ex;
    EXPECT_NE(ex.find("perm_d " + std::to_string(x.perm) + ",", last), std::string::npos)
        << ex.substr(last);
    EXPECT_LE(e[0], 2e-2) << "dq";
    EXPECT_LE(e[1], 2e-2) << "dk";
    EXPECT_LE(e[2], 2e-2) << "dv";
  }
}

// Issue 39: the neighborhood backward on query strips (chosen for 2-D neighborhoods; backward_kernel "sm90_bwd_strips"),
// forced and asserted to have run, against the fp64 reference: dilation, causal axes, an
// intersection with causal, awkward grid sizes (strips and key boxes with padding), GQA, [B, H, L, D] views, fp16.
const std::vector<Case>& strip_cases() {
  static const std::vector<Case> c = {
      {{"neighborhood(dims=(16,20), kernel=5)"}, DType::bf16, 1, 2, 2, 320, 320, 64, false},
      {{"neighborhood(dims=(23,29), kernel=(5,3), dilation=(2,3))"}, DType::bf16, 2, 4, 2, 667, 667, 64, false},  // GQA
      {{"neighborhood(dims=(30,33), kernel=5, causal=(1,0))"}, DType::f16, 1, 2, 1, 990, 990, 64, true},  // group 2
      {{"neighborhood(dims=(19,45), kernel=4, causal=1, dilation=(1,2))"}, DType::bf16, 1, 2, 2, 855, 855, 64, false},
      {{"neighborhood(dims=(40,48), kernel=13)"}, DType::bf16, 1, 2, 2, 1920, 1920, 64, false},
      {{"neighborhood(dims=(20,30), kernel=5) & causal"}, DType::bf16, 2, 2, 2, 600, 600, 64, false},
      {{"neighborhood(dims=(37,41), kernel=7)"}, DType::f16, 1, 4, 4, 1517, 1517, 64, true},
      // D = 128 (sm90_bwd_64x64_d128, dQ in two halves)
      {{"neighborhood(dims=(16,20), kernel=5)"}, DType::bf16, 1, 2, 2, 320, 320, 128, false},
      {{"neighborhood(dims=(23,29), kernel=(5,3), dilation=(2,3))"}, DType::f16, 2, 4, 2, 667, 667, 128, true},  // GQA
      {{"neighborhood(dims=(30,33), kernel=9, causal=(0,1))"}, DType::bf16, 1, 2, 1, 990, 990, 128, false},
  };
  return c;
}

TEST(BackwardGpu, QueryStripsMatchReference) {
  REQUIRE_GPU();
  if (!on_sm90a()) GTEST_SKIP() << "the tile backward runs on sm_90a only";
  uint32_t seed = 900;
  for (const Case& c : strip_cases()) {
    SCOPED_TRACE(std::string(c.specs[0]) + " D=" + std::to_string(c.D));
    std::string ran, ex;
    const auto e = backward_errors(c, "sm90_bwd_strips", &ran, seed++, &ex);
    EXPECT_EQ(ran, "sm90_bwd_strips(sm90_bwd_64x64_d" + std::to_string(c.D) + ")");
    EXPECT_NE(ex.find("key-major query strips over"), std::string::npos) << ex;
    expect_within(e, c.dt);
  }
}

// The choice: a 2-D neighborhood runs query strips by default; a tile kernel forced runs the row-major tile plan
// instead ("sm90_bwd_ws" runs the row the planner picks for that plan, the other side of the strips' A/B; "sm90_bwd"
// the plain rows); a 1-D window runs the chosen row (no strips asked), and forcing the strips there is an Error naming
// them.
TEST(BackwardGpu, QueryStripsChosenOrForcedOff) {
  REQUIRE_GPU();
  if (!on_sm90a()) GTEST_SKIP() << "the tile backward runs on sm_90a only";
  const Case c{{"neighborhood(dims=(16,20), kernel=5)"}, DType::bf16, 1, 2, 2, 320, 320, 64, false};
  std::string ran, ex;
  auto e = backward_errors(c, "", &ran, 30, &ex);
  EXPECT_EQ(ran, "sm90_bwd_strips(sm90_bwd_64x64_d64)");
  EXPECT_NE(ex.find("key-major query strips over"), std::string::npos) << ex;
  for (double x : e) EXPECT_LE(x, 2e-2);
  // The row-major tile plan: the planner's row for it, forced by its kind.
  const spattn::BoundPattern bp = spattn::parse(c.specs[0]).bind(c.Lq, c.Lk);
  const int rowmajor = spattn::plan::backward_row(spattn::plan::backward_choice("", c.D), spattn::plan::analyze(bp), c.D);
  ASSERT_GE(rowmajor, 0);
  e = backward_errors(c, "sm90_bwd_ws", &ran, 34, &ex);
  EXPECT_EQ(ran, spattn::plan::kKernels[rowmajor].name);
  EXPECT_EQ(ex.find("key-major query strips over"), std::string::npos) << ex;
  for (double x : e) EXPECT_LE(x, 2e-2);
  e = backward_errors(c, "sm90_bwd", &ran, 32);
  EXPECT_EQ(ran.find("strips"), std::string::npos) << ran;
  EXPECT_EQ(ran.rfind("sm90_bwd_64x", 0), 0u) << ran;
  for (double x : e) EXPECT_LE(x, 2e-2);
  // A 1-D window: a band, no strips asked (the chosen row); forced, they do not fit.
  const Case band{{"neighborhood(kernel=7)"}, DType::bf16, 1, 2, 2, 300, 300, 64, false};
  e = backward_errors(band, "", &ran, 33, &ex);
  EXPECT_EQ(ran.find("strips"), std::string::npos) << ran;
  EXPECT_EQ(ex.find("query strips"), std::string::npos) << ex;
  for (double x : e) EXPECT_LE(x, 2e-2);
  try {
    backward_errors(band, "sm90_bwd_strips", &ran, 33);
    FAIL() << "query strips forced on a 1-D window should be refused, ran " << ran;
  } catch (const spattn::Error& err) {
    EXPECT_NE(std::string(err.what()).find("sm90_bwd_strips"), std::string::npos) << err.what();
  }
}

// One small case for compute-sanitizer (scripts/gpu_check.d/nbr_bwd.sh): padding slots and keys, GQA.
TEST(BackwardGpu, QueryStripsSmallCaseForSanitizers) {
  REQUIRE_GPU();
  if (!on_sm90a()) GTEST_SKIP() << "the tile backward runs on sm_90a only";
  for (int64_t d : {64, 128}) {
    const Case c{{"neighborhood(dims=(13,21), kernel=(5,7), dilation=(1,2))"}, DType::bf16, 1, 4, 2, 273, 273, d, false};
    std::string ran;
    const auto e = backward_errors(c, "sm90_bwd_strips", &ran, 35);
    EXPECT_EQ(ran, "sm90_bwd_strips(sm90_bwd_64x64_d" + std::to_string(d) + ")");
    for (double x : e) EXPECT_LE(x, 2e-2);
  }
}

}  // namespace
