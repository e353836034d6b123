// The backward pass on the CPU: the fp64 reference backward against central finite differences of the reference
// forward (the oracle checked itself), then Plan::backward of the CPU engine against the reference backward on
// fresh random inputs (GQA, per-head patterns, empty rows, Dv != D, a custom scale).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "spattn/plan.hpp"
#include "spattn/reference.hpp"

namespace {

using spattn::DType;
using spattn::TensorView;

struct Case {
  std::vector<std::string> specs;
  int64_t B, H, HK, Lq, Lk, D, Dv;
  double scale;
};

spattn::Problem problem_of(const Case& c) {
  spattn::Problem p;
  p.batch = c.B, p.q_heads = c.H, p.kv_heads = c.HK, p.q_len = c.Lq, p.kv_len = c.Lk, p.head_dim = c.D;
  p.value_dim = c.Dv == c.D ? 0 : c.Dv;
  p.scale = c.scale;
  p.dtype = DType::f64;
  return p;
}

struct Tensors {
  std::vector<double> q, k, v, dout;
  TensorView tq, tk, tv, tdo;
  Tensors(const spattn::Problem& p, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<double> nd(0.0, 1.0);
    q.resize(size_t(p.batch * p.q_len * p.q_heads * p.head_dim));
    k.resize(size_t(p.batch * p.kv_len * p.kv_heads * p.head_dim));
    v.resize(size_t(p.batch * p.kv_len * p.kv_heads * p.dv()));
    dout.resize(size_t(p.batch * p.q_len * p.q_heads * p.dv()));
    for (auto* t : {&q, &k, &v, &dout})
      for (double& x : *t) x = nd(rng);
    tq = TensorView::contiguous(q.data(), DType::f64, {p.batch, p.q_len, p.q_heads, p.head_dim});
    tk = TensorView::contiguous(k.data(), DType::f64, {p.batch, p.kv_len, p.kv_heads, p.head_dim});
    tv = TensorView::contiguous(v.data(), DType::f64, {p.batch, p.kv_len, p.kv_heads, p.dv()});
    tdo = TensorView::contiguous(dout.data(), DType::f64, {p.batch, p.q_len, p.q_heads, p.dv()});
  }
};

std::vector<spattn::BoundPattern> bind(const Case& c) {
  std::vector<spattn::BoundPattern> out;
  for (const auto& s : c.specs) out.push_back(spattn::parse(s).bind(c.Lq, c.Lk));
  return out;
}

// sum(dout * O) with O from the reference forward: its gradient is what backward computes.
double loss(const Case& c, const Tensors& t) {
  const auto p = problem_of(c);
  std::vector<double> o(t.dout.size());
  spattn::cpu::reference_attention(bind(c), p, t.tq, t.tk, t.tv,
                                   TensorView::contiguous(o.data(), DType::f64, t.tdo.shape), TensorView{});
  double l = 0;
  for (size_t i = 0; i < o.size(); ++i) l += o[i] * t.dout[i];
  return l;
}

struct Grads {
  std::vector<double> dq, dk, dv;
  TensorView tq, tk, tv;
  explicit Grads(const Tensors& t) : dq(t.q.size(), NAN), dk(t.k.size(), NAN), dv(t.v.size(), NAN) {
    tq = TensorView::contiguous(dq.data(), DType::f64, t.tq.shape);
    tk = TensorView::contiguous(dk.data(), DType::f64, t.tk.shape);
    tv = TensorView::contiguous(dv.data(), DType::f64, t.tv.shape);
  }
};

double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0, scale = 1e-12;
  for (size_t i = 0; i < b.size(); ++i) scale = std::max(scale, std::abs(b[i]));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::isfinite(a[i]) ? std::abs(a[i] - b[i]) / scale : 1e30);
  return worst;
}

TEST(Backward, ReferenceMatchesFiniteDifferences) {
  const Case c{{"local(2) | global(0)"}, 1, 2, 1, 7, 7, 4, 3, 0.7};
  Tensors t(problem_of(c), 1);
  Grads g(t);
  spattn::cpu::reference_attention_backward(bind(c), problem_of(c), t.tq, t.tk, t.tv, t.tdo, g.tq, g.tk, g.tv);
  const double h = 1e-6;
  auto fd = [&](std::vector<double>& x, size_t i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss(c, t);
    x[i] = x0 - h;
    const double lm = loss(c, t);
    x[i] = x0;
    return (lp - lm) / (2 * h);
  };
  std::vector<double> nq(t.q.size()), nk(t.k.size()), nv(t.v.size());
  for (size_t i = 0; i < nq.size(); ++i) nq[i] = fd(t.q, i);
  for (size_t i = 0; i < nk.size(); ++i) nk[i] = fd(t.k, i);
  for (size_t i = 0; i < nv.size(); ++i) nv[i] = fd(t.v, i);
  EXPECT_LT(max_rel(g.dq, nq), 1e-6);
  EXPECT_LT(max_rel(g.dk, nk), 1e-6);
  EXPECT_LT(max_rel(g.dv, nv), 1e-6);
}

TEST(Backward, CpuEngineMatchesReference) {
  const std::vector<Case> cases = {
      {{"longformer(9, 2)"}, 2, 4, 2, 97, 97, 16, 16, 0},
      {{"causal"}, 1, 2, 2, 64, 64, 8, 12, 0.3},
      {{"dilated(5, 3) | random(4, seed=1)"}, 1, 3, 1, 80, 80, 8, 8, 0},
      {{"local(3) & global_rows(10:20)"}, 1, 2, 1, 50, 50, 8, 8, 0},  // rows with no key
      {{"local(left=20, right=0)"}, 1, 2, 2, 40, 90, 8, 8, 0},        // cross lengths
      {{"causal", "local(4)", "bigbird(4, 1, 1, 1, seed=2)"}, 2, 3, 3, 48, 48, 8, 8, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.specs[0]);
    const auto pr = problem_of(c);
    Tensors t(pr, 7);
    Grads want(t), got(t);
    spattn::cpu::reference_attention_backward(bind(c), pr, t.tq, t.tk, t.tv, t.tdo, want.tq, want.tk, want.tv);
    std::vector<spattn::Pattern> pats;
    for (const auto& s : c.specs) pats.push_back(spattn::parse(s));
    auto p32 = pr;
    p32.dtype = DType::f32;
    const spattn::Plan plan = spattn::make_plan(pats, p32);
    plan.backward(t.tq, t.tk, t.tv, TensorView{}, TensorView{}, t.tdo, got.tq, got.tk, got.tv);
    EXPECT_LT(max_rel(got.dq, want.dq), 1e-9);
    EXPECT_LT(max_rel(got.dk, want.dk), 1e-9);
    EXPECT_LT(max_rel(got.dv, want.dv), 1e-9);
  }
}

// Non-finite inputs as in dense attention (PATTERNS.md, "Attention semantics"): a NaN key poisons the rows that
// keep it, hence dq of those rows and dk / dv of every key they keep; the CPU engine's NaNs and values are the
// reference's, element by element. Also a -inf key element (scores of -inf weigh 0 and +inf poison the row in
// the forward pass; dq = dS K meets 0 * -inf) and a query whose every score is -inf.
TEST(Backward, NonFiniteInputsAsTheReference) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const Case c{{"local(4) | random(3, seed=2)"}, 1, 2, 1, 60, 60, 8, 8, 0};
  const auto pr = problem_of(c);
  for (int plant = 0; plant < 3; ++plant) {
    SCOPED_TRACE(plant);
    Tensors t(pr, 11);
    if (plant == 0) t.tk.store(0, 10, 0, 3, nan);
    if (plant == 1) t.tk.store(0, 20, 0, 0, -inf);
    if (plant == 2) {  // row 30 of head 0: every score -inf
      for (int64_t l = 0; l < c.Lk; ++l) t.tk.store(0, l, 0, 0, -1.0);
      t.tq.store(0, 30, 0, 0, inf);
      for (int64_t d = 1; d < c.D; ++d) t.tq.store(0, 30, 0, d, 0.0);
    }
    Grads want(t), got(t);
    spattn::cpu::reference_attention_backward(bind(c), pr, t.tq, t.tk, t.tv, t.tdo, want.tq, want.tk, want.tv);
    auto p32 = pr;
    p32.dtype = DType::f32;
    spattn::make_plan(spattn::parse(c.specs[0]), p32)
        .backward(t.tq, t.tk, t.tv, TensorView{}, TensorView{}, t.tdo, got.tq, got.tk, got.tv);
    int64_t nans = 0;
    for (auto [a, b] : {std::pair{&got.dq, &want.dq}, {&got.dk, &want.dk}, {&got.dv, &want.dv}})
      for (size_t i = 0; i < b->size(); ++i) {
        ASSERT_EQ(std::isnan((*a)[i]), std::isnan((*b)[i])) << "element " << i;
        nans += std::isnan((*b)[i]);
        if (!std::isnan((*b)[i])) ASSERT_NEAR((*a)[i], (*b)[i], 1e-9 * std::max(1.0, std::abs((*b)[i])));
      }
    EXPECT_GT(nans, 0) << "each plant poisons some gradient (a -inf in K: dq = dS K meets 0 * -inf)";
  }
}

TEST(Backward, RefusesMismatchedGradients) {
  const Case c{{"local(3)"}, 1, 2, 1, 32, 32, 8, 8, 0};
  const auto pr = problem_of(c);
  Tensors t(pr, 3);
  Grads g(t);
  const spattn::Plan plan = spattn::make_plan(spattn::parse("local(3)"), pr);
  std::vector<uint16_t> half(t.q.size());
  const TensorView dq16 = TensorView::contiguous(half.data(), DType::bf16, t.tq.shape);
  try {
    plan.backward(t.tq, t.tk, t.tv, {}, {}, t.tdo, dq16, g.tk, g.tv);
    ADD_FAILURE() << "bf16 gradients must be refused on the CPU";
  } catch (const spattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp32 or fp64"), std::string::npos) << e.what();
  }
  EXPECT_THROW(plan.backward(t.tq, t.tk, t.tv, {}, {}, t.tdo, g.tk, g.tk, g.tv), spattn::Error) << "dq of k's shape";
}

}  // namespace
