// Run-time masks on the GPU (spattn/runtime_mask.hpp): packed documents on the device path (tile lists written on the
// device at every call; the test asserts it ran), replayed from a CUDA graph with new boundaries each replay; block
// masks and top-k keys on the host-materialised path; backward; the checking mode. Everything against the reference
// engine's run-time plan on the same (rounded) inputs and the same mask in host memory. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu/plan_run.hpp"
#include "gpu/require_gpu.hpp"
#include "spattn/runtime_mask.hpp"

namespace {

using spattn::DType;
using spattn::TensorView;
using spattn::test::Buf;

spattn::Problem problem(int64_t B, int64_t H, int64_t HK, int64_t L, int64_t D) {
  spattn::Problem p;
  p.batch = B, p.q_heads = H, p.kv_heads = HK, p.q_len = p.kv_len = L, p.head_dim = D, p.dtype = DType::bf16;
  return p;
}

// Inputs in bf16 on the host and the device; outputs on the device.
struct Io {
  spattn::Problem p;
  std::vector<uint16_t> hq, hk, hv, hdo;
  Buf q, k, v, o, lse, dout, dq, dk, dv;
  static size_t nq(const spattn::Problem& p) { return size_t(p.batch * p.q_len * p.q_heads * p.head_dim); }
  static size_t nk(const spattn::Problem& p) { return size_t(p.batch * p.kv_len * p.kv_heads * p.head_dim); }
  Io(const spattn::Problem& pr, uint32_t seed)
      : p(pr), hq(nq(pr)), hk(nk(pr)), hv(nk(pr)), hdo(nq(pr)), q(nq(pr) * 2), k(nk(pr) * 2), v(nk(pr) * 2),
        o(nq(pr) * 2), lse(size_t(pr.batch * pr.q_heads * pr.q_len) * 4), dout(nq(pr) * 2), dq(nq(pr) * 2),
        dk(nk(pr) * 2), dv(nk(pr) * 2) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto* h : {&hq, &hk, &hv, &hdo})
      for (uint16_t& x : *h) x = spattn::float_to_bf16(nd(rng));
    EXPECT_EQ(cudaMemcpy(q.p, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(k.p, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(v.p, hv.data(), hv.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(dout.p, hdo.data(), hdo.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::array<int64_t, 4> qs() const { return {p.batch, p.q_len, p.q_heads, p.head_dim}; }
  std::array<int64_t, 4> ks() const { return {p.batch, p.kv_len, p.kv_heads, p.head_dim}; }
  TensorView dev(const Buf& b, std::array<int64_t, 4> s) const { return TensorView::contiguous(b.p, DType::bf16, s); }
  TensorView dlse() const { return TensorView::contiguous(lse.p, DType::f32, {p.batch, p.q_heads, p.q_len, 1}); }
  void forward(const spattn::Plan& plan, const spattn::RuntimeMask& m, cudaStream_t s = nullptr) {
    plan.forward(dev(q, qs()), dev(k, ks()), dev(v, ks()), dev(o, qs()), dlse(), m, s);
  }

  void backward(const spattn::Plan& plan, const spattn::RuntimeMask& m, cudaStream_t s = nullptr) {
    plan.backward(dev(q, qs()), dev(k, ks()), dev(v, ks()), dev(o, qs()), dlse(), dev(dout, qs()), dev(dq, qs()),
                  dev(dk, ks()), dev(dv, ks()), m, s);
  }

  // The backward of `plan` after its forward (o, lse on the device) against the reference engine's; expects the
  // device path where `device_path` and the device is sm_90a.
  void check_backward(const spattn::Plan& plan, const spattn::MaskLayout& layout, const spattn::RuntimeMask& dm,
                      const spattn::RuntimeMask& hm, bool device_path) {
    backward(plan, dm);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (device_path && on_sm90a()) {  // the key-major lists written on the device, the tile backward
      EXPECT_EQ(plan.last_backward_kernel().rfind("runtime_device: sm90_bwd", 0), 0u) << plan.last_backward_kernel();
    }
    compare_backward(layout, hm);
  }
  // dq, dk, dv on the device against the reference engine's backward of `hm`.
  void compare_backward(const spattn::MaskLayout& layout, const spattn::RuntimeMask& hm) {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    spattn::PlanOptions ref;
    ref.engine = spattn::Engine::reference;
    const spattn::Plan rp = spattn::make_plan(layout, p, spattn::Device::cpu(), ref);
    std::vector<float> rdq(hq.size()), rdk(hk.size()), rdv(hk.size());
    rp.backward(TensorView::contiguous(hq.data(), DType::bf16, qs()), TensorView::contiguous(hk.data(), DType::bf16, ks()),
                TensorView::contiguous(hv.data(), DType::bf16, ks()), TensorView{}, TensorView{},
                TensorView::contiguous(hdo.data(), DType::bf16, qs()), TensorView::contiguous(rdq.data(), DType::f32, qs()),
                TensorView::contiguous(rdk.data(), DType::f32, ks()), TensorView::contiguous(rdv.data(), DType::f32, ks()), hm);
    for (auto [buf, ref_grad] : {std::pair{&dq, &rdq}, {&dk, &rdk}, {&dv, &rdv}}) {
      std::vector<uint16_t> h(ref_grad->size());
      ASSERT_EQ(cudaMemcpy(h.data(), buf->p, h.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      double e = 0, m = 0;
      for (size_t i = 0; i < h.size(); ++i)
        e = std::max(e, std::fabs(double(spattn::bf16_to_float(h[i])) - (*ref_grad)[i])), m = std::max(m, double(std::fabs((*ref_grad)[i])));
      EXPECT_LT(e, 3e-2 * std::max(1.0, m));
    }
  }

  // Max |O - reference| over O's entries (bf16 inputs read exactly by both), and over the lse of rows with keys (an
  // empty row must give -inf).
  double error_vs_reference(const spattn::MaskLayout& layout, const spattn::RuntimeMask& host_mask, double* lse_err) {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint16_t> ho(hq.size());
    std::vector<float> hl(size_t(p.batch * p.q_heads * p.q_len));
    EXPECT_EQ(cudaMemcpy(ho.data(), o.p, ho.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(hl.data(), lse.p, hl.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    spattn::PlanOptions ref;
    ref.engine = spattn::Engine::reference;
    const spattn::Plan rp = spattn::make_plan(layout, p, spattn::Device::cpu(), ref);
    std::vector<float> ro(hq.size()), rl(hl.size());
    rp.forward(TensorView::contiguous(hq.data(), DType::bf16, qs()), TensorView::contiguous(hk.data(), DType::bf16, ks()),
               TensorView::contiguous(hv.data(), DType::bf16, ks()), TensorView::contiguous(ro.data(), DType::f32, qs()),
               TensorView::contiguous(rl.data(), DType::f32, {p.batch, p.q_heads, p.q_len, 1}), host_mask);
    double e = 0;
    for (size_t i = 0; i < ro.size(); ++i) e = std::max(e, std::fabs(double(spattn::bf16_to_float(ho[i])) - ro[i]));
    *lse_err = 0;
    for (size_t i = 0; i < rl.size(); ++i)
      *lse_err = std::max(*lse_err, std::isinf(rl[i]) ? (hl[i] == rl[i] ? 0.0 : INFINITY)
                                    : std::isnan(hl[i]) ? INFINITY
                                                        : std::fabs(double(hl[i]) - rl[i]));
    return e;
  }
};

// A CUDA graph of the plan's forward and backward (the backward only on sm_90a devices, where it is on the device
// path) captured once, replayed `replays` times; before each, update(replay) writes new mask contents to the device
// tensors the graph reads and returns the same mask in host memory. Every replay is checked against the reference.
template <class Update>
void check_graph_replays(Io& io, const spattn::Plan& plan, const spattn::MaskLayout& layout,
                         const spattn::RuntimeMask& dm, int replays, Update update) {
  const bool bwd = on_sm90a();
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  update(-1);
  io.forward(plan, dm, s);  // warm (kernel attributes set outside the capture)
  if (bwd) io.backward(plan, dm, s);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(plan.last_kernel().rfind("runtime_device: ", 0), 0u) << plan.last_kernel() << "\n" << plan.explain();
  if (bwd) EXPECT_EQ(plan.last_backward_kernel().rfind("runtime_device: ", 0), 0u) << plan.last_backward_kernel();
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  io.forward(plan, dm, s);
  if (bwd) io.backward(plan, dm, s);
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < replays; ++replay) {
    const spattn::RuntimeMask hm = update(replay);
    ASSERT_EQ(cudaMemsetAsync(io.o.p, 0xFF, Io::nq(io.p) * 2, s), cudaSuccess);  // NaN poison
    ASSERT_EQ(cudaMemsetAsync(io.dk.p, 0xFF, Io::nk(io.p) * 2, s), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    double lse_err = 0;
    EXPECT_LT(io.error_vs_reference(layout, hm, &lse_err), 2e-2) << "replay " << replay;
    EXPECT_LT(lse_err, 1e-3) << "replay " << replay;
    if (bwd) io.compare_backward(layout, hm);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

std::vector<int32_t> random_documents(int64_t L, int n, std::mt19937& rng, bool gaps) {
  std::vector<int32_t> cu(size_t(n + 1));
  for (int32_t& x : cu) x = int32_t(std::uniform_int_distribution<int64_t>(0, L)(rng));
  std::sort(cu.begin(), cu.end());
  if (!gaps) cu.front() = 0, cu.back() = int32_t(L);
  return cu;
}

spattn::Plan gpu_plan(const spattn::MaskLayout& layout, const spattn::Problem& p) {
  return spattn::make_plan(layout, p, spattn::Device::cuda(0));
}

TEST(RuntimeMaskGpu, DocumentsOnTheDevicePath) {
  REQUIRE_GPU();
  std::mt19937 rng(3);
  for (int64_t D : {64, 128})
    for (const char* spec : {"causal", "local(left=100, right=0)", "", "local(40)"}) {
      SCOPED_TRACE(std::string("D ") + std::to_string(D) + ", spec '" + spec + "'");
      const auto p = problem(2, 4, 2, 1000, D);
      Io io(p, 7);
      const auto layout = spattn::MaskLayout::documents(spec);
      const spattn::Plan plan = gpu_plan(layout, p);
      EXPECT_NE(plan.kernel().find("runtime_device"), std::string::npos) << plan.explain();
      Buf dcu(64 * 4);
      for (int trial = 0; trial < 4; ++trial) {  // new boundaries each call, one plan
        const int n = 3 + 4 * trial;
        const std::vector<int32_t> cu = random_documents(p.q_len, n, rng, trial == 3);
        ASSERT_EQ(cudaMemcpy(dcu.p, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
        spattn::RuntimeMask dm, hm;
        dm.cu_seqlens_q = spattn::IndexView::of(static_cast<const int32_t*>(dcu.p), {n + 1});
        hm.cu_seqlens_q = spattn::IndexView::of(cu.data(), {n + 1});
        io.forward(plan, dm);
        EXPECT_EQ(plan.last_kernel().rfind("runtime_device: ", 0), 0u) << plan.last_kernel();  // the device path ran
        double lse_err = 0;
        EXPECT_LT(io.error_vs_reference(layout, hm, &lse_err), 2e-2) << "trial " << trial;
        EXPECT_LT(lse_err, 1e-3) << "trial " << trial;
      }
    }
}

TEST(RuntimeMaskGpu, DocumentsReplayedFromACudaGraph) {
  REQUIRE_GPU();
  std::mt19937 rng(5);
  const auto p = problem(1, 2, 1, 777, 64);
  Io io(p, 9);
  const auto layout = spattn::MaskLayout::documents("causal");
  const spattn::Plan plan = gpu_plan(layout, p);
  const int n = 6;
  Buf dcu((n + 1) * 4);
  std::vector<int32_t> cu = random_documents(p.q_len, n, rng, false);
  ASSERT_EQ(cudaMemcpy(dcu.p, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  spattn::RuntimeMask dm;
  dm.cu_seqlens_q = spattn::IndexView::of(static_cast<const int32_t*>(dcu.p), {n + 1});
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  io.forward(plan, dm, s);  // warm (kernel attributes set outside the capture)
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  io.forward(plan, dm, s);
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 3; ++replay) {
    cu = random_documents(p.q_len, n, rng, replay == 2);
    ASSERT_EQ(cudaMemcpyAsync(dcu.p, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice, s), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(io.o.p, 0xFF, Io::nq(p) * 2, s), cudaSuccess);  // NaN poison
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    spattn::RuntimeMask hm;
    hm.cu_seqlens_q = spattn::IndexView::of(cu.data(), {n + 1});
    double lse_err = 0;
    EXPECT_LT(io.error_vs_reference(layout, hm, &lse_err), 2e-2) << "replay " << replay;
    EXPECT_LT(lse_err, 1e-3) << "replay " << replay;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

TEST(RuntimeMaskGpu, BlocksOnTheDevicePath) {
  REQUIRE_GPU();
  std::mt19937 rng(23);
  const int64_t L = 1000;  // the last blocks partial
  for (int64_t bs : {128, 64})  // 64-blocks: 64x64 tiles forward and backward (head dim 64)
  for (int64_t D : {64, 128})
    for (int64_t heads : {1, 4})  // a mask broadcast over the heads (one launch), or one a head
      for (const char* spec : {"causal", ""}) {
        SCOPED_TRACE("blocks " + std::to_string(bs) + ", D " + std::to_string(D) + ", mask heads " + std::to_string(heads) +
                     ", spec '" + spec + "'");
        const int64_t nq = (L + bs - 1) / bs, nk = nq;
        const auto p = problem(2, 4, 2, L, D);
        Io io(p, 29);
        const int64_t rows = 2 * heads * nq;
        std::vector<int64_t> num(static_cast<size_t>(rows)), idx(static_cast<size_t>(rows * nk), 77),
            fnum(static_cast<size_t>(rows)), fidx(static_cast<size_t>(rows * nk), 77);
        for (int64_t r = 0; r < rows; ++r) {  // random blocks, unsorted, some full
          std::vector<int64_t> b(static_cast<size_t>(nk));
          std::iota(b.begin(), b.end(), 0);
          std::shuffle(b.begin(), b.end(), rng);
          const int n = std::uniform_int_distribution<int>(0, int(nk))(rng), f = std::uniform_int_distribution<int>(0, n)(rng);
          fnum[size_t(r)] = f, num[size_t(r)] = n - f;
          std::copy(b.begin(), b.begin() + f, fidx.begin() + r * nk);
          std::copy(b.begin() + f, b.begin() + n, idx.begin() + r * nk);
        }
        Buf dn(rows * 8), di(rows * nk * 8), dfn(rows * 8), dfi(rows * nk * 8);
        for (auto [d, h] : {std::pair{&dn, &num}, {&di, &idx}, {&dfn, &fnum}, {&dfi, &fidx}})
          ASSERT_EQ(cudaMemcpy(d->p, h->data(), h->size() * 8, cudaMemcpyHostToDevice), cudaSuccess);
        auto view = [&](const void* data, bool list) {
          return list ? spattn::IndexView::of(static_cast<const int64_t*>(data), {2, heads, nq, nk})
                      : spattn::IndexView::of(static_cast<const int64_t*>(data), {2, heads, nq});
        };
        spattn::RuntimeMask dm, hm;
        dm.kv_num_blocks = view(dn.p, false), dm.kv_indices = view(di.p, true);
        dm.full_kv_num_blocks = view(dfn.p, false), dm.full_kv_indices = view(dfi.p, true);
        hm.kv_num_blocks = view(num.data(), false), hm.kv_indices = view(idx.data(), true);
        hm.full_kv_num_blocks = view(fnum.data(), false), hm.full_kv_indices = view(fidx.data(), true);
        const auto layout = spattn::MaskLayout::blocks(bs, bs, spec);
        const spattn::Plan plan = gpu_plan(layout, p);
        io.forward(plan, dm);
        EXPECT_EQ(plan.last_kernel().rfind("runtime_device: ", 0), 0u) << plan.last_kernel() << "\n" << plan.explain();
        double lse_err = 0;
        EXPECT_LT(io.error_vs_reference(layout, hm, &lse_err), 2e-2);
        EXPECT_LT(lse_err, 1e-3);
        // per-head lists under GQA too: each head's dK / dV partials summed over its kv group; 64-blocks on the
        // sm90_bwd 64x64 row (head dim 64), at head dim 128 on the host path (docs/RUNTIME_MASKS.md)
        io.check_backward(plan, layout, dm, hm, bs == 128 || D == 64);
        if (bs == 64 && D == 128)
          EXPECT_EQ(plan.last_backward_kernel().rfind("runtime_rows: ", 0), 0u) << plan.last_backward_kernel();
      }
}

// Block masks' lists, forward and key-major backward, from both builds (issue 44: the grid builds, the default, and
// the one-CTA builds they replaced, SPATTN_RT_KEY_LISTS=cta or one of them, read at every call): more than 32 query
// blocks (marks of several words), per-head masks under GQA, full, partial and empty rows; two masks one after the
// other through one plan (the grid builds' marks are cleared by the call that read them). Both against the
// reference.
TEST(RuntimeMaskGpu, BlockListsBothBuilds) {
  REQUIRE_GPU();
  if (!on_sm90a()) GTEST_SKIP() << "the device backward needs sm_90a";
  std::mt19937 rng(61);
  for (int64_t bs : {128, 64})
    for (const char* build : {"", "cta", "fwd"}) {  // the grid builds, the one-CTA builds, the forward's only
      SCOPED_TRACE(std::string("blocks ") + std::to_string(bs) + ", build '" + build + "'");
      setenv("SPATTN_RT_KEY_LISTS", build, 1);
      const int64_t L = bs == 64 ? 2500 : 4500, nq = (L + bs - 1) / bs, nk = nq, C = 6;
      const auto p = problem(1, 2, 1, L, 64);
      Io io(p, 67);
      const auto layout = spattn::MaskLayout::blocks(bs, bs, "causal");
      const spattn::Plan plan = gpu_plan(layout, p);
      for (int mask = 0; mask < 2; ++mask) {
        const int64_t rows = 2 * nq;
        std::vector<int32_t> num(static_cast<size_t>(rows)), idx(static_cast<size_t>(rows * C), 0),
            fnum(static_cast<size_t>(rows)), fidx(static_cast<size_t>(rows * C), 0);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t qb = r % nq;
          std::vector<int32_t> b(static_cast<size_t>(qb + 1));  // the causal blocks, the diagonal partial
          std::iota(b.begin(), b.end(), 0);
          std::shuffle(b.begin(), b.end() - 1, rng);
          const int n = rng() % 5 == 0 ? 0 : std::uniform_int_distribution<int>(0, int(std::min<int64_t>(C, qb)))(rng);
          fnum[size_t(r)] = n;
          std::copy(b.begin(), b.begin() + n, fidx.begin() + r * C);
          num[size_t(r)] = rng() % 7 == 0 ? 0 : 1;
          idx[size_t(r * C)] = int32_t(qb);
        }
        Buf dn(size_t(rows) * 4), di(size_t(rows * C) * 4), dfn(size_t(rows) * 4), dfi(size_t(rows * C) * 4);
        for (auto [d, h] : {std::pair{&dn, &num}, {&di, &idx}, {&dfn, &fnum}, {&dfi, &fidx}})
          ASSERT_EQ(cudaMemcpy(d->p, h->data(), h->size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
        auto view = [&](const void* data, bool list) {
          return list ? spattn::IndexView::of(static_cast<const int32_t*>(data), {1, 2, nq, C})
                      : spattn::IndexView::of(static_cast<const int32_t*>(data), {1, 2, nq});
        };
        spattn::RuntimeMask dm, hm;
        dm.kv_num_blocks = view(dn.p, false), dm.kv_indices = view(di.p, true);
        dm.full_kv_num_blocks = view(dfn.p, false), dm.full_kv_indices = view(dfi.p, true);
        hm.kv_num_blocks = view(num.data(), false), hm.kv_indices = view(idx.data(), true);
        hm.full_kv_num_blocks = view(fnum.data(), false), hm.full_kv_indices = view(fidx.data(), true);
        io.forward(plan, dm);
        double lse_err = 0;
        EXPECT_LT(io.error_vs_reference(layout, hm, &lse_err), 2e-2) << "mask " << mask;
        EXPECT_LT(lse_err, 1e-3) << "mask " << mask;
        io.check_backward(plan, layout, dm, hm, true);
      }
    }
  unsetenv("SPATTN_RT_KEY_LISTS");
}

TEST(RuntimeMaskGpu, TopkBothPathsAndSmallBlocks) {
  REQUIRE_GPU();
  std::mt19937 rng(11);
  const auto p = problem(1, 4, 2, 640, 64);
  Io io(p, 13);
  // A block mask per head: random key blocks of 64, causal inside partial blocks.
  const int64_t nq = 10, nk = 10;
  std::vector<int32_t> num(size_t(4 * nq)), idx(size_t(4 * nq * nk));
  for (int64_t r = 0; r < 4 * nq; ++r) {
    std::vector<int32_t> b(static_cast<size_t>(nk));
    std::iota(b.begin(), b.end(), 0);
    std::shuffle(b.begin(), b.end(), rng);
    num[size_t(r)] = int32_t(std::uniform_int_distribution<int>(0, int(nk))(rng));
    std::copy(b.begin(), b.end(), idx.begin() + r * nk);
  }
  Buf dn(num.size() * 4), di(idx.size() * 4);
  ASSERT_EQ(cudaMemcpy(dn.p, num.data(), num.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(di.p, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  spattn::RuntimeMask dm, hm;
  dm.kv_num_blocks = spattn::IndexView::of(static_cast<const int32_t*>(dn.p), {1, 4, nq});
  dm.kv_indices = spattn::IndexView::of(static_cast<const int32_t*>(di.p), {1, 4, nq, nk});
  hm.kv_num_blocks = spattn::IndexView::of(num.data(), {1, 4, nq});
  hm.kv_indices = spattn::IndexView::of(idx.data(), {1, 4, nq, nk});
  const auto blocks = spattn::MaskLayout::blocks(64, 64, "causal");
  const spattn::Plan bp = gpu_plan(blocks, p);
  io.forward(bp, dm);
  double lse_err = 0;
  EXPECT_LT(io.error_vs_reference(blocks, hm, &lse_err), 2e-2);
  EXPECT_LT(lse_err, 1e-3);
  io.check_backward(bp, blocks, dm, hm, true);  // 64x64 tiles, per-head lists under GQA through the partials
  // Top-k keys per kv head, -1 padded, united with a window.
  const int64_t K = 16;
  std::vector<int64_t> tk(size_t(p.q_len * 2 * K));
  for (size_t r = 0; r < tk.size() / K; ++r) {
    std::vector<int64_t> keys(static_cast<size_t>(p.kv_len));
    std::iota(keys.begin(), keys.end(), 0);
    std::shuffle(keys.begin(), keys.end(), rng);
    for (int64_t j = 0; j < K; ++j) tk[r * K + size_t(j)] = j < 3 ? -1 : keys[size_t(j)];
  }
  Buf dt(tk.size() * 8);
  ASSERT_EQ(cudaMemcpy(dt.p, tk.data(), tk.size() * 8, cudaMemcpyHostToDevice), cudaSuccess);
  spattn::RuntimeMask dtm, htm;
  dtm.topk_indices = spattn::IndexView::of(static_cast<const int64_t*>(dt.p), {1, p.q_len, 2, K});
  htm.topk_indices = spattn::IndexView::of(tk.data(), {1, p.q_len, 2, K});
  const auto topk = spattn::MaskLayout::topk_keys(K, "local(left=8, right=0)");
  const spattn::Plan tp = gpu_plan(topk, p);
  io.forward(tp, dtm);
  EXPECT_EQ(tp.last_kernel().rfind("runtime_device: ", 0), 0u) << tp.last_kernel();  // per kv head: a head at a time
  EXPECT_LT(io.error_vs_reference(topk, htm, &lse_err), 2e-2);
  EXPECT_LT(lse_err, 1e-3);
  io.check_backward(tp, topk, dtm, htm, true);
  // Shared by the heads ([B, Lq, K], a batch of 2): the device path, forward and backward.
  {
    const auto p2 = problem(2, 4, 2, 777, 64);
    Io io2(p2, 31);
    std::vector<int32_t> t2(size_t(2 * p2.q_len * K));
    for (size_t r = 0; r < t2.size() / K; ++r) {
      std::vector<int32_t> keys(static_cast<size_t>(p2.kv_len));
      std::iota(keys.begin(), keys.end(), 0);
      std::shuffle(keys.begin(), keys.end(), rng);
      for (int64_t j = 0; j < K; ++j) t2[r * K + size_t(j)] = j % 5 == 0 ? -1 : keys[size_t(j)];
    }
    Buf d2(t2.size() * 4);
    ASSERT_EQ(cudaMemcpy(d2.p, t2.data(), t2.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    spattn::RuntimeMask dm2, hm2;
    dm2.topk_indices = spattn::IndexView::of(static_cast<const int32_t*>(d2.p), {2, p2.q_len, K});
    hm2.topk_indices = spattn::IndexView::of(t2.data(), {2, p2.q_len, K});
    const spattn::Plan dp = gpu_plan(topk, p2);
    io2.forward(dp, dm2);
    EXPECT_EQ(dp.last_kernel().rfind("runtime_device: ", 0), 0u) << dp.last_kernel() << "\n" << dp.explain();
    EXPECT_LT(io2.error_vs_reference(topk, hm2, &lse_err), 2e-2);
    EXPECT_LT(lse_err, 1e-3);
    io2.check_backward(dp, topk, dm2, hm2, true);
  }
  // The checking mode reads the device tensors: a bad key names itself.
  tk[5] = 640;
  ASSERT_EQ(cudaMemcpy(dt.p, tk.data(), tk.size() * 8, cudaMemcpyHostToDevice), cudaSuccess);
  dtm.check = true;
  try {
    io.forward(tp, dtm);
    ADD_FAILURE() << "no error for key 640";
  } catch (const spattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("topk_indices[0, 0, 0, 5] is 640"), std::string::npos) << e.what();
  }
}

TEST(RuntimeMaskGpu, DocumentsBackward) {
  REQUIRE_GPU();
  std::mt19937 rng(17);
  const auto p = problem(1, 2, 2, 300, 64);
  Io io(p, 19);
  const auto layout = spattn::MaskLayout::documents("causal");
  const spattn::Plan plan = gpu_plan(layout, p);
  const std::vector<int32_t> cu = random_documents(p.q_len, 4, rng, false);
  Buf dcu(cu.size() * 4);
  ASSERT_EQ(cudaMemcpy(dcu.p, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  spattn::RuntimeMask dm, hm;
  dm.cu_seqlens_q = spattn::IndexView::of(static_cast<const int32_t*>(dcu.p), {5});
  hm.cu_seqlens_q = spattn::IndexView::of(cu.data(), {5});
  io.forward(plan, dm);
  EXPECT_EQ(plan.last_kernel().rfind("runtime_device: ", 0), 0u) << plan.last_kernel();
  io.check_backward(plan, layout, dm, hm, true);
}

// Random top-k rows: K distinct keys of [0, lk) each, about one in five entries -1.
std::vector<int32_t> random_topk(int64_t rows, int64_t K, int64_t lk, std::mt19937& rng) {
  std::vector<int32_t> t(size_t(rows * K));
  std::vector<int32_t> keys(static_cast<size_t>(lk));
  std::iota(keys.begin(), keys.end(), 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < K; ++j) std::swap(keys[size_t(j)], keys[size_t(j + int64_t(rng() % uint32_t(lk - j)))]);
    for (int64_t j = 0; j < K; ++j) t[size_t(r * K + j)] = rng() % 5 == 0 ? -1 : keys[size_t(j)];
  }
  return t;
}

// Top-k keys per kv head and per query head (under GQA: per-head dK / dV partials summed over the group), on the
// device path, replayed from a CUDA graph with new indices each replay.
TEST(RuntimeMaskGpu, TopkPerHeadReplayedFromACudaGraph) {
  REQUIRE_GPU();
  std::mt19937 rng(41);
  for (int64_t ht : {2, 4})
    for (const char* spec : {"", "local(left=16, right=0)"}) {
      SCOPED_TRACE("heads " + std::to_string(ht) + ", spec '" + spec + "'");
      const auto p = problem(2, 4, 2, 700, 128);
      Io io(p, 43);
      const int64_t K = 24;
      Buf dt(size_t(2 * p.q_len * ht * K) * 4);
      std::vector<int32_t> t;
      spattn::RuntimeMask dm;
      dm.topk_indices = spattn::IndexView::of(static_cast<const int32_t*>(dt.p), {2, p.q_len, ht, K});
      const auto layout = spattn::MaskLayout::topk_keys(K, spec);
      const spattn::Plan plan = gpu_plan(layout, p);
      check_graph_replays(io, plan, layout, dm, 3, [&](int) {
        t = random_topk(2 * p.q_len * ht, K, p.kv_len, rng);
        EXPECT_EQ(cudaMemcpy(dt.p, t.data(), t.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
        spattn::RuntimeMask hm;
        hm.topk_indices = spattn::IndexView::of(t.data(), {2, p.q_len, ht, K});
        return hm;
      });
    }
}

// A block mask per query head under GQA (and one broadcast over the batch): forward and backward on the device
// path, replayed from a CUDA graph with new blocks each replay.
TEST(RuntimeMaskGpu, PerHeadBlocksUnderGqaReplayedFromACudaGraph) {
  REQUIRE_GPU();
  std::mt19937 rng(47);
  for (int64_t nb : {1, 2}) {
    SCOPED_TRACE("mask batch " + std::to_string(nb));
    const auto p = problem(2, 4, 2, 1000, 64);
    Io io(p, 53);
    const int64_t nq = 8, nk = 8, rows = nb * 4 * nq;
    Buf dn(size_t(rows) * 4), di(size_t(rows * nk) * 4);
    std::vector<int32_t> num, idx;
    spattn::RuntimeMask dm;
    dm.kv_num_blocks = spattn::IndexView::of(static_cast<const int32_t*>(dn.p), {nb, 4, nq});
    dm.kv_indices = spattn::IndexView::of(static_cast<const int32_t*>(di.p), {nb, 4, nq, nk});
    const auto layout = spattn::MaskLayout::blocks(128, 128, "causal");
    const spattn::Plan plan = gpu_plan(layout, p);
    check_graph_replays(io, plan, layout, dm, 3, [&](int) {
      num.assign(size_t(rows), 0), idx.assign(size_t(rows * nk), 0);
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<int32_t> b(static_cast<size_t>(nk));
        std::iota(b.begin(), b.end(), 0);
        std::shuffle(b.begin(), b.end(), rng);
        num[size_t(r)] = int32_t(std::uniform_int_distribution<int>(0, int(nk))(rng));
        std::copy(b.begin(), b.end(), idx.begin() + r * nk);
      }
      EXPECT_EQ(cudaMemcpy(dn.p, num.data(), num.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(di.p, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
      spattn::RuntimeMask hm;
      hm.kv_num_blocks = spattn::IndexView::of(num.data(), {nb, 4, nq});
      hm.kv_indices = spattn::IndexView::of(idx.data(), {nb, 4, nq, nk});
      return hm;
    });
  }
}

// Packed documents with separate key boundaries (cu_seqlens_k; queries and keys of different lengths): the device
// path, replayed from a CUDA graph with new boundaries each replay.
TEST(RuntimeMaskGpu, DocumentsWithKeyBoundariesReplayedFromACudaGraph) {
  REQUIRE_GPU();
  std::mt19937 rng(59);
  for (const char* spec : {"causal", "", "local(left=50, right=0)"}) {
    SCOPED_TRACE(std::string("spec '") + spec + "'");
    spattn::Problem p = problem(1, 4, 2, 900, 64);
    p.kv_len = 1300;
    Io io(p, 61);
    const int n = 5;
    Buf dq((n + 1) * 4), dk((n + 1) * 4);
    std::vector<int32_t> cq, ck;
    spattn::RuntimeMask dm;
    dm.cu_seqlens_q = spattn::IndexView::of(static_cast<const int32_t*>(dq.p), {n + 1});
    dm.cu_seqlens_k = spattn::IndexView::of(static_cast<const int32_t*>(dk.p), {n + 1});
    const auto layout = spattn::MaskLayout::documents(spec);
    const spattn::Plan plan = gpu_plan(layout, p);
    check_graph_replays(io, plan, layout, dm, 3, [&](int replay) {
      cq = random_documents(p.q_len, n, rng, replay == 1);
      ck = random_documents(p.kv_len, n, rng, replay == 2);
      EXPECT_EQ(cudaMemcpy(dq.p, cq.data(), cq.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(dk.p, ck.data(), ck.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
      spattn::RuntimeMask hm;
      hm.cu_seqlens_q = spattn::IndexView::of(cq.data(), {n + 1});
      hm.cu_seqlens_k = spattn::IndexView::of(ck.data(), {n + 1});
      return hm;
    });
  }
}

// The host path refused: under RuntimeMask::no_host a call the device path does not take throws naming why, and
// inside a CUDA graph capture it throws whatever no_host says (no copy is attempted there).
TEST(RuntimeMaskGpu, HostPathRefusedWhereAskedAndInsideCaptures) {
  REQUIRE_GPU();
  const auto p = problem(1, 2, 2, 256, 128);
  Io io(p, 67);
  std::vector<int32_t> num{1, 1, 1, 1}, idx{0, 1, 0, 1, 0, 1, 0, 1};
  Buf dn(num.size() * 4), di(idx.size() * 4);
  ASSERT_EQ(cudaMemcpy(dn.p, num.data(), num.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(di.p, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  spattn::RuntimeMask dm;
  dm.kv_num_blocks = spattn::IndexView::of(static_cast<const int32_t*>(dn.p), {1, 1, 4});
  dm.kv_indices = spattn::IndexView::of(static_cast<const int32_t*>(di.p), {1, 1, 4, 2});
  const spattn::Plan plan = gpu_plan(spattn::MaskLayout::blocks(64, 64), p);  // 64-blocks at D 128: backward on the host path
  dm.no_host = true;
  io.forward(plan, dm);  // the forward is on the device path
  EXPECT_EQ(plan.last_kernel().rfind("runtime_device: ", 0), 0u) << plan.last_kernel();
  EXPECT_NE(plan.explain().find("the host path only for"), std::string::npos) << plan.explain();
  try {
    io.backward(plan, dm);
    ADD_FAILURE() << "no error for the host path under no_host";
  } catch (const spattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("would run on the host path (the device path does not take it"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("64 x 64 blocks"), std::string::npos) << e.what();
  }
  dm.no_host = false;
  io.backward(plan, dm);  // allowed: the host path
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(plan.last_backward_kernel().rfind("runtime_rows: ", 0), 0u) << plan.last_backward_kernel();
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  std::string err;
  try {
    io.backward(plan, dm, s);
  } catch (const spattn::Error& e) {
    err = e.what();
  }
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(s, &graph);
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();
  EXPECT_NE(err.find("cannot run inside a CUDA graph capture"), std::string::npos) << err;
  cudaStreamDestroy(s);
}

}  // namespace
