// spattn::Plan on the CPU: engines against the reference engine, masks given as CSR / BSR, per-head patterns,
// forced kernels, and the errors a demanding user meets (each naming the value).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "spattn/plan.hpp"

namespace {

using spattn::DType;
using spattn::TensorView;

spattn::Problem problem(int64_t B, int64_t H, int64_t HK, int64_t L, int64_t D) {
  spattn::Problem p;
  p.batch = B, p.q_heads = H, p.kv_heads = HK, p.q_len = p.kv_len = L, p.head_dim = D, p.dtype = DType::f32;
  return p;
}

struct Inputs {
  std::vector<float> q, k, v;
  TensorView tq, tk, tv;
  explicit Inputs(const spattn::Problem& p, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    q.resize(size_t(p.batch * p.q_len * p.q_heads * p.head_dim));
    k.resize(size_t(p.batch * p.kv_len * p.kv_heads * p.head_dim));
    v.resize(k.size());
    for (auto* t : {&q, &k, &v})
      for (float& x : *t) x = nd(rng);
    tq = TensorView::contiguous(q.data(), DType::f32, {p.batch, p.q_len, p.q_heads, p.head_dim});
    tk = TensorView::contiguous(k.data(), DType::f32, {p.batch, p.kv_len, p.kv_heads, p.head_dim});
    tv = TensorView::contiguous(v.data(), DType::f32, {p.batch, p.kv_len, p.kv_heads, p.head_dim});
  }
};

std::vector<float> run(const spattn::Plan& plan, const Inputs& in) {
  std::vector<float> o(in.q.size());
  plan.forward(in.tq, in.tk, in.tv, TensorView::contiguous(o.data(), DType::f32, in.tq.shape), TensorView{});
  return o;
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * double(a[i] - b[i]), den += double(b[i]) * b[i];
  return std::sqrt(num / std::max(den, 1e-30));
}

spattn::Plan reference(const std::vector<spattn::Pattern>& pats, const spattn::Problem& p) {
  spattn::PlanOptions o;
  o.engine = spattn::Engine::reference;
  return spattn::make_plan(pats, p, spattn::Device::cpu(), o);
}

TEST(Plan, CpuMatchesReferenceAndExplains) {
  const auto pr = problem(2, 4, 2, 300, 32);
  const std::vector<spattn::Pattern> pats{spattn::parse("longformer(20, 3) | random(5, seed=2)")};
  const spattn::Plan plan = spattn::make_plan(pats, pr);
  EXPECT_EQ(plan.engine(), spattn::Engine::cpu_fused);
  EXPECT_EQ(plan.last_kernel(), "");
  const Inputs in(pr, 1);
  EXPECT_LE(rel(run(plan, in), run(reference(pats, pr), in)), 1e-5);
  EXPECT_EQ(plan.last_kernel(), plan.kernel());
  EXPECT_EQ(plan.nnz(), spattn::parse("longformer(20, 3) | random(5, seed=2)").bind(300).nnz() * 4);
  const std::string ex = plan.explain();
  for (const char* what : {"engine cpu", "kernel cpu_fused", "nnz", "planned in"})
    EXPECT_NE(ex.find(what), std::string::npos) << what << " not in: " << ex;
}

TEST(Plan, PerHeadPatterns) {
  const auto pr = problem(1, 3, 3, 200, 16);
  const std::vector<spattn::Pattern> pats{spattn::parse("causal"), spattn::parse("local(7)"), spattn::parse("causal")};
  const Inputs in(pr, 2);
  EXPECT_LE(rel(run(spattn::make_plan(pats, pr), in), run(reference(pats, pr), in)), 1e-5);
  EXPECT_THROW(spattn::make_plan({pats[0], pats[1]}, pr), spattn::Error) << "2 patterns for 3 heads";
}

TEST(Plan, MaskAsCsrAndBsr) {
  const int64_t L = 130;
  const auto pr = problem(1, 2, 2, L, 16);
  const spattn::Pattern pat = spattn::parse("dilated(9, 2) | global(0:3)");
  const spattn::Csr csr = spattn::make_csr(pat.bind(L));
  const Inputs in(pr, 3);
  const auto want = run(reference({pat}, pr), in);
  EXPECT_LE(rel(run(spattn::make_plan(csr, pr), in), want), 1e-5);
  EXPECT_LE(rel(run(spattn::make_plan(spattn::make_bsr(pat.bind(L), 32), pr), in), want), 1e-5);
  spattn::Csr bad = csr;
  std::swap(bad.col_indices[size_t(bad.row_offsets[5])], bad.col_indices[size_t(bad.row_offsets[5]) + 1]);
  try {
    spattn::make_plan(bad, pr);
    ADD_FAILURE() << "unsorted columns must be refused";
  } catch (const spattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 5"), std::string::npos) << e.what();
  }
  EXPECT_THROW(spattn::make_plan(csr, problem(1, 2, 2, L + 1, 16)), spattn::Error) << "mask of another size";
}

TEST(Plan, ForcedKernelsAndEngines) {
  const auto pr = problem(1, 2, 1, 256, 64);
  const std::vector<spattn::Pattern> pats{spattn::parse("local(31)")};
  const Inputs in(pr, 4);
  const auto want = run(reference(pats, pr), in);
  spattn::PlanOptions o;
  o.kernel = "generic";
  const spattn::Plan g = spattn::make_plan(pats, pr, spattn::Device::cpu(), o);
  EXPECT_LE(rel(run(g, in), want), 1e-5);
  EXPECT_EQ(g.last_kernel(), "cpu_fused_generic");
  o.kernel = "sm90_band";
  EXPECT_THROW(spattn::make_plan(pats, pr, spattn::Device::cpu(), o), spattn::Error);
  o = {};
  o.engine = spattn::Engine::cuda_fused;
  EXPECT_THROW(spattn::make_plan(pats, pr, spattn::Device::cpu(), o), spattn::Error) << "a GPU engine on the CPU";
}

// An empty problem is valid input: with Lq = 0 forward and backward do nothing; with Lk = 0 every row has no key
// (O = 0, lse = -inf; dq = 0). On each CPU engine.
TEST(Plan, EmptyLengths) {
  for (spattn::Engine e : {spattn::Engine::cpu_fused, spattn::Engine::reference})
    for (auto [lq, lk] : {std::pair<int64_t, int64_t>{0, 0}, {0, 5}, {7, 0}}) {
      SCOPED_TRACE(std::string(spattn::engine_name(e)) + " " + std::to_string(lq) + " x " + std::to_string(lk));
      spattn::Problem pr = problem(2, 2, 1, 0, 8);
      pr.q_len = lq, pr.kv_len = lk;
      spattn::PlanOptions opt;
      opt.engine = e;
      const spattn::Plan plan = spattn::make_plan(spattn::parse("local(3)"), pr, spattn::Device::cpu(), opt);
      const Inputs in(pr, 1);
      std::vector<float> o(in.q.size(), 5.f), lse(size_t(2 * 2 * lq), 5.f), dq(in.q.size(), 5.f);
      std::vector<float> dk(in.k.size(), 5.f), dv(in.v.size(), 5.f);
      const TensorView ov = TensorView::contiguous(o.data(), DType::f32, in.tq.shape);
      plan.forward(in.tq, in.tk, in.tv, ov, TensorView::contiguous(lse.data(), DType::f32, {2, 2, lq, 1}));
      for (float x : o) EXPECT_EQ(x, 0.f);
      for (float x : lse) EXPECT_EQ(x, -INFINITY);
      plan.backward(in.tq, in.tk, in.tv, ov, TensorView{}, in.tq, TensorView::contiguous(dq.data(), DType::f32, in.tq.shape),
                    TensorView::contiguous(dk.data(), DType::f32, in.tk.shape),
                    TensorView::contiguous(dv.data(), DType::f32, in.tv.shape));
      for (float x : dq) EXPECT_EQ(x, 0.f);
      for (float x : dk) EXPECT_EQ(x, 0.f);
    }
}

TEST(Plan, ErrorsNameTheValue) {
  const auto pr = problem(1, 2, 2, 64, 16);
  const spattn::Plan plan = spattn::make_plan(spattn::parse("local(3)"), pr);
  const Inputs in(pr, 5);
  std::vector<float> o(in.q.size());
  const TensorView good = TensorView::contiguous(o.data(), DType::f32, {1, 64, 2, 16});
  const TensorView wide = TensorView::contiguous(o.data(), DType::f32, {1, 64, 2, 8});
  auto message = [&](auto&& f) {
    try {
      f();
    } catch (const spattn::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message([&] { plan.forward(in.tq, in.tk, wide, good, TensorView{}); }).find("v: dimension 3 is 8, expected 16"),
            std::string::npos);
  EXPECT_NE(message([&] { spattn::make_plan(spattn::parse("local(3)"), problem(1, 3, 2, 64, 16)); }).find("multiple of kv heads"),
            std::string::npos);
  EXPECT_NE(message([&] { spattn::Device::parse("tpu:0"); }).find("tpu:0"), std::string::npos);
  EXPECT_NE(message([&] { spattn::parse_engine("fast"); }).find("fast"), std::string::npos);
  EXPECT_NE(message([&] { spattn::Plan().explain(); }).find("empty"), std::string::npos);
  // Sizes whose product overflows 63 bits, named with their dims, before anything is allocated; heads count even
  // at length 0 (B * H work items).
  auto huge = problem(int64_t(1) << 32, int64_t(1) << 32, int64_t(1) << 32, 1, 1);
  EXPECT_NE(message([&] { spattn::make_plan(spattn::parse("dense"), huge); })
                .find("q [B, H, Lq, D] = [4294967296, 4294967296, 1, 1] is too large"),
            std::string::npos);
  huge = problem(int64_t(1) << 40, int64_t(1) << 40, int64_t(1) << 40, 0, 1);
  EXPECT_NE(message([&] { spattn::make_plan(spattn::parse("dense"), huge); }).find("is too large"), std::string::npos);
  EXPECT_NE(message([&] { spattn::checked_bytes("x", {3, -1}, 4); }).find("x = [3, -1] has a negative dimension"), std::string::npos);
}

}  // namespace
