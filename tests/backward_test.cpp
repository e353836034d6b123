// The backward pass on the CPU: the fp64 reference backward against central finite differences of the reference
// forward (the oracle checked itself), then Plan::backward of the CPU engine (the fused backward, fp32) against the
// reference backward on fresh random inputs: every suite pattern at awkward sizes on every kernel set this CPU runs,
// GQA, per-head patterns, fully masked rows, Dv != D, a custom scale, fp16 / bf16 inputs, strided views, O and LSE
// given or recomputed, the work split into slices, non-finite inputs and scores past fp32's range.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/fused_plan.hpp"
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
  if (c.scale != 0) p.scale = c.scale;  // the cases' 0: the default
  p.dtype = DType::f64;
  return p;
}

std::string describe(const Case& c) {
  std::string s;
  for (const auto& x : c.specs) s += (s.empty() ? "" : " ; ") + x;
  return s + " B=" + std::to_string(c.B) + " H=" + std::to_string(c.H) + "/" + std::to_string(c.HK) + " Lq=" +
         std::to_string(c.Lq) + " Lk=" + std::to_string(c.Lk) + " D=" + std::to_string(c.D) + " Dv=" + std::to_string(c.Dv);
}

// Memory layouts a view can have: [B, L, H, D] contiguous, or [B, H, L, D] storage seen as [B, L, H, D].
enum class Layout { blhd, bhld };

// One [B, L, H, D] tensor in some dtype and layout.
struct Tensor {
  std::vector<uint8_t> bytes;
  TensorView view;
  Tensor() = default;
  Tensor(DType dt, std::array<int64_t, 4> shape, Layout layout = Layout::blhd) {
    const auto [B, L, H, D] = shape;
    bytes.assign(size_t(std::max<int64_t>(B * L * H * D, 1) * spattn::dtype_size(dt)), 0);
    view = layout == Layout::blhd ? TensorView::contiguous(bytes.data(), dt, shape)
                                  : TensorView{bytes.data(), dt, shape, {H * L * D, D, L * D, 1}};
  }
  void fill(std::mt19937& rng) {
    std::normal_distribution<double> nd(0.0, 1.0);
    for_each([&](int64_t b, int64_t l, int64_t h, int64_t d) { view.store(b, l, h, d, nd(rng)); });
  }
  void poison() {
    for_each([&](int64_t b, int64_t l, int64_t h, int64_t d) { view.store(b, l, h, d, NAN); });
  }
  void for_each(const std::function<void(int64_t, int64_t, int64_t, int64_t)>& f) const {
    for (int64_t b = 0; b < view.shape[0]; ++b)
      for (int64_t l = 0; l < view.shape[1]; ++l)
        for (int64_t h = 0; h < view.shape[2]; ++h)
          for (int64_t d = 0; d < view.shape[3]; ++d) f(b, l, h, d);
  }
  // The values in [B, L, H, D] order, as doubles.
  std::vector<double> values() const {
    std::vector<double> out;
    for_each([&](int64_t b, int64_t l, int64_t h, int64_t d) { out.push_back(view.load(b, l, h, d)); });
    return out;
  }
};

struct Inputs {
  Tensor q, k, v, dout;
  Inputs(const spattn::Problem& p, uint32_t seed, DType dt = DType::f64, Layout layout = Layout::blhd)
      : q(dt, {p.batch, p.q_len, p.q_heads, p.head_dim}, layout),
        k(dt, {p.batch, p.kv_len, p.kv_heads, p.head_dim}, layout),
        v(dt, {p.batch, p.kv_len, p.kv_heads, p.dv()}, layout),
        dout(dt, {p.batch, p.q_len, p.q_heads, p.dv()}, layout) {
    std::mt19937 rng(seed);
    for (Tensor* t : {&q, &k, &v, &dout}) t->fill(rng);
  }
};

struct Grads {
  Tensor dq, dk, dv;
  Grads(const spattn::Problem& p, DType dt = DType::f64, Layout layout = Layout::blhd)
      : dq(dt, {p.batch, p.q_len, p.q_heads, p.head_dim}, layout), dk(dt, {p.batch, p.kv_len, p.kv_heads, p.head_dim}, layout),
        dv(dt, {p.batch, p.kv_len, p.kv_heads, p.dv()}, layout) {
    for (Tensor* t : {&dq, &dk, &dv}) t->poison();  // every element must be written
  }
};

std::vector<spattn::BoundPattern> bind(const Case& c) {
  std::vector<spattn::BoundPattern> out;
  for (const auto& s : c.specs) out.push_back(spattn::parse(s).bind(c.Lq, c.Lk));
  return out;
}

Grads reference_grads(const Case& c, const Inputs& in) {
  const auto p = problem_of(c);
  Grads g(p);
  spattn::cpu::reference_attention_backward(bind(c), p, in.q.view, in.k.view, in.v.view, in.dout.view, g.dq.view,
                                            g.dk.view, g.dv.view);
  return g;
}

// max |a - b| / max |b| (a non-finite a: 1e30).
double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0, scale = 1e-12;
  for (size_t i = 0; i < b.size(); ++i) scale = std::max(scale, std::abs(b[i]));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::isfinite(a[i]) ? std::abs(a[i] - b[i]) / scale : 1e30);
  return worst;
}

// fp32 accumulation against the fp64 oracle: the worst element within this share of the largest gradient.
constexpr double kTolF32 = 2e-5;

void expect_close(const Grads& got, const Grads& want, const std::string& what, double tol = kTolF32) {
  EXPECT_LT(max_rel(got.dq.values(), want.dq.values()), tol) << what << ": dq";
  EXPECT_LT(max_rel(got.dk.values(), want.dk.values()), tol) << what << ": dk";
  EXPECT_LT(max_rel(got.dv.values(), want.dv.values()), tol) << what << ": dv";
}

// Gradients from non-finite inputs against the oracle's: NaN exactly where it has NaN, within kTolF32 (relative to
// max(1, |oracle|)) elsewhere. Returns the oracle's NaN count.
int64_t expect_nans_as_oracle(const Grads& got, const Grads& want) {
  int64_t nans = 0, nan_mismatch = 0, off = 0;
  for (auto [a, b] : {std::pair{&got.dq, &want.dq}, {&got.dk, &want.dk}, {&got.dv, &want.dv}}) {
    const std::vector<double> x = a->values(), y = b->values();
    for (size_t i = 0; i < y.size(); ++i) {
      nan_mismatch += std::isnan(x[i]) != std::isnan(y[i]);
      nans += std::isnan(y[i]);
      off += !std::isnan(y[i]) && !(std::abs(x[i] - y[i]) <= kTolF32 * std::max(1.0, std::abs(y[i])));
    }
  }
  EXPECT_EQ(nan_mismatch, 0) << "elements NaN in one and not in the other";
  EXPECT_EQ(off, 0) << "finite elements off the oracle";
  return nans;
}

std::vector<spattn::Pattern> patterns_of(const Case& c) {
  std::vector<spattn::Pattern> pats;
  for (const auto& s : c.specs) pats.push_back(spattn::parse(s));
  return pats;
}

// Plan::backward of the CPU engine on `in`: with O and the LSE from its forward (given) or without them.
struct BwdRun {
  bool given = true;
  DType grad_dtype = DType::f32;
  Layout grad_layout = Layout::blhd;
  spattn::PlanOptions options{};
};

Grads plan_grads(const Case& c, const Inputs& in, const BwdRun& r, std::string* ran = nullptr) {
  auto p = problem_of(c);
  p.dtype = in.q.view.dtype == DType::f64 ? DType::f32 : in.q.view.dtype;
  spattn::PlanOptions o = r.options;
  if (o.engine == spattn::Engine::automatic) o.engine = spattn::Engine::cpu_fused;
  const spattn::Plan plan = spattn::make_plan(patterns_of(c), p, spattn::Device::cpu(), o);
  std::vector<float> out(size_t(c.B * c.Lq * c.H * c.Dv)), lse(size_t(c.B * c.H * c.Lq));
  TensorView ov{}, lv{};
  if (r.given) {
    ov = TensorView::contiguous(out.data(), DType::f32, {c.B, c.Lq, c.H, c.Dv});
    lv = TensorView::contiguous(lse.data(), DType::f32, {c.B, c.H, c.Lq, 1});
    plan.forward(in.q.view, in.k.view, in.v.view, ov, lv);
  }
  Grads g(p, r.grad_dtype, r.grad_layout);
  plan.backward(in.q.view, in.k.view, in.v.view, ov, lv, in.dout.view, g.dq.view, g.dk.view, g.dv.view);
  if (ran) *ran = plan.last_backward_kernel();
  return g;
}

std::vector<std::string> isas() {
  using spattn::cpu::Isa;
  const Isa best = spattn::cpu::best_isa();
  if (best == Isa::avx512) return {"avx512", "avx2", "generic"};
  if (best == Isa::avx2) return {"avx2", "generic"};
  return {"generic"};
}

// sum(dout * O) with O from the reference forward: its gradient is what backward computes.
double loss(const Case& c, const Inputs& in) {
  const auto p = problem_of(c);
  Tensor o(DType::f64, in.dout.view.shape);
  spattn::cpu::reference_attention(bind(c), p, in.q.view, in.k.view, in.v.view, o.view, TensorView{});
  const std::vector<double> ov = o.values(), dv = in.dout.values();
  double l = 0;
  for (size_t i = 0; i < ov.size(); ++i) l += ov[i] * dv[i];
  return l;
}

TEST(Backward, ReferenceMatchesFiniteDifferences) {
  const Case c{{"local(2) | global(0)"}, 1, 2, 1, 7, 7, 4, 3, 0.7};
  Inputs in(problem_of(c), 1);
  const Grads g = reference_grads(c, in);
  const double h = 1e-6;
  auto fd = [&](Tensor& x) {
    std::vector<double> out;
    x.for_each([&](int64_t b, int64_t l, int64_t hh, int64_t d) {
      const double x0 = x.view.load(b, l, hh, d);
      x.view.store(b, l, hh, d, x0 + h);
      const double lp = loss(c, in);
      x.view.store(b, l, hh, d, x0 - h);
      const double lm = loss(c, in);
      x.view.store(b, l, hh, d, x0);
      out.push_back((lp - lm) / (2 * h));
    });
    return out;
  };
  EXPECT_LT(max_rel(g.dq.values(), fd(in.q)), 1e-6);
  EXPECT_LT(max_rel(g.dk.values(), fd(in.k)), 1e-6);
  EXPECT_LT(max_rel(g.dv.values(), fd(in.v)), 1e-6);
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
    SCOPED_TRACE(describe(c));
    Inputs in(problem_of(c), 7);
    std::string ran;
    expect_close(plan_grads(c, in, BwdRun{}, &ran), reference_grads(c, in), describe(c));
    EXPECT_EQ(ran.rfind("cpu_fused_", 0), 0u) << ran;
    EXPECT_EQ(ran.find("fp64"), std::string::npos) << ran << ": finite inputs stay on the fp32 kernel";
  }
}

// The suite patterns of bench/bench_cpu.cpp, scaled down, at lengths that are no multiple of a tile (8, 16, 32 rows)
// or a key block (64), Lq != Lk where the pattern allows it, GQA; on every kernel set this CPU runs. D = 64 is the
// kernels' whole-vector path; one case with D = 128.
TEST(Backward, FusedMatchesReferenceOnSuitePatterns) {
  const std::vector<Case> cases = {
      {{"local(9)"}, 1, 2, 1, 131, 131, 64, 64, 0},
      {{"longformer(9, 3)"}, 1, 2, 1, 131, 131, 64, 64, 0},
      {{"bigbird(8, 1, 1, 1, seed=0)"}, 1, 2, 1, 131, 131, 64, 64, 0},
      {{"dilated(9, 2)"}, 1, 2, 1, 131, 131, 64, 64, 0},  // planned in two residue groups
      {{"sparse_fixed(16)"}, 1, 2, 1, 131, 131, 64, 64, 0},
      {{"random(7, seed=0)"}, 1, 2, 1, 131, 150, 64, 64, 0},  // all residue rows
      {{"neighborhood(dims=(11,12),kernel=5)"}, 1, 2, 1, 132, 132, 64, 64, 0},  // 2-D query tiles
      {{"causal"}, 1, 2, 1, 97, 131, 64, 64, 0},
      {{"local(left=20, right=3)"}, 1, 2, 2, 100, 131, 64, 64, 0},
      {{"longformer(20, 2)"}, 1, 1, 1, 75, 75, 128, 128, 0},
  };
  for (const std::string& isa : isas())
    for (const Case& c : cases) {
      SCOPED_TRACE(describe(c) + " isa=" + isa);
      Inputs in(problem_of(c), 3, DType::f32);
      BwdRun r;
      r.options.kernel = isa;
      std::string ran;
      expect_close(plan_grads(c, in, r, &ran), reference_grads(c, in), describe(c));
      EXPECT_EQ(ran.rfind("cpu_fused_" + isa, 0), 0u) << ran << ": the kernel set asked for";
      EXPECT_EQ(ran.find("fp64"), std::string::npos) << ran << ": no fp64 redo";
      EXPECT_EQ(ran.find("recomputed"), std::string::npos) << ran << ": O and LSE given";
    }
}

// Grouped-query attention (dK / dV summed over a group's query heads, MQA too), head dims that are no multiple of
// any vector width, Dv != D, a custom scale, two batch elements.
TEST(Backward, GqaAndOddHeadDims) {
  const std::vector<Case> cases = {
      {{"longformer(7, 2)"}, 2, 6, 2, 77, 77, 20, 12, 0.3},
      {{"local(5) | random(3, seed=4)"}, 2, 4, 1, 61, 61, 36, 5, 0},
      {{"causal", "local(3)", "random(5, seed=1)", "dense"}, 1, 4, 2, 45, 45, 8, 24, 0},  // per-head patterns
  };
  for (const std::string& isa : isas())
    for (const Case& c : cases) {
      SCOPED_TRACE(describe(c) + " isa=" + isa);
      Inputs in(problem_of(c), 5);
      BwdRun r;
      r.options.kernel = isa;
      expect_close(plan_grads(c, in, r), reference_grads(c, in), describe(c));
    }
}

// A row that keeps no key gets dQ = 0 exactly, and a key no row keeps dK = dV = 0: no NaN from the LSE of -inf or
// from the masked entries of a tile. Lengths of 0: every gradient there is 0.
TEST(Backward, FullyMaskedRowsGetZeroGradients) {
  const Case c{{"local(3) & global_rows(10:20)"}, 1, 2, 1, 50, 50, 16, 16, 0};
  Inputs in(problem_of(c), 9, DType::f32);
  for (bool given : {true, false}) {
    BwdRun r;
    r.given = given;
    const Grads g = plan_grads(c, in, r);
    expect_close(g, reference_grads(c, in), describe(c));
    for (int64_t l = 0; l < c.Lq; ++l)
      for (int64_t h = 0; h < c.H; ++h)
        for (int64_t d = 0; d < c.D; ++d) {
          if (l < 10 || l >= 20) ASSERT_EQ(g.dq.view.load(0, l, h, d), 0.0) << "row " << l << " keeps no key";
          if (l < 7 || l >= 23) ASSERT_EQ(g.dk.view.load(0, l, 0, d), 0.0) << "key " << l << " is kept by no row";
          if (l < 7 || l >= 23) ASSERT_EQ(g.dv.view.load(0, l, 0, d), 0.0) << "key " << l << " is kept by no row";
        }
  }
  for (auto [lq, lk] : {std::pair<int64_t, int64_t>{0, 17}, {17, 0}}) {
    const Case e{{"dense"}, 2, 2, 1, lq, lk, 8, 8, 0};
    SCOPED_TRACE(describe(e));
    Inputs ein(problem_of(e), 1, DType::f32);
    for (bool given : {true, false}) {
      BwdRun r;
      r.given = given;
      const Grads g = plan_grads(e, ein, r);
      for (const Tensor* t : {&g.dq, &g.dk, &g.dv})
        for (double x : t->values()) ASSERT_EQ(x, 0.0);
    }
  }
}

// fp16 and bf16 inputs: converted once, fp32 accumulation; the reference runs on the same (rounded) values.
TEST(Backward, HalfPrecisionInputs) {
  const Case c{{"longformer(8, 2) | random(2, seed=3)"}, 1, 4, 2, 90, 90, 32, 32, 0};
  for (DType dt : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(std::string(spattn::dtype_name(dt)));
    Inputs in(problem_of(c), 11, dt);
    std::string ran;
    expect_close(plan_grads(c, in, BwdRun{}, &ran), reference_grads(c, in), describe(c));
    EXPECT_EQ(ran.find("fp64"), std::string::npos) << ran;
  }
}

// Strided views: inputs and gradients in [B, H, L, D] storage; fp64 gradients.
TEST(Backward, StridedViewsAndFp64Gradients) {
  const Case c{{"bigbird(4, 1, 1, 2, seed=1)"}, 2, 4, 2, 70, 70, 24, 24, 0};
  Inputs in(problem_of(c), 13, DType::f32, Layout::bhld);
  const Grads want = reference_grads(c, in);
  for (DType gd : {DType::f32, DType::f64}) {
    SCOPED_TRACE(std::string(spattn::dtype_name(gd)));
    BwdRun r;
    r.grad_dtype = gd;
    r.grad_layout = Layout::bhld;
    expect_close(plan_grads(c, in, r), want, describe(c));
  }
}

// With O and the LSE the backward starts from them; without, it runs the forward first. Either way the oracle's.
TEST(Backward, OAndLseGivenOrRecomputed) {
  const Case c{{"sparse_fixed(16)"}, 1, 2, 2, 100, 100, 32, 32, 0};
  Inputs in(problem_of(c), 17, DType::f32);
  const Grads want = reference_grads(c, in);
  for (bool given : {true, false}) {
    BwdRun r;
    r.given = given;
    std::string ran;
    expect_close(plan_grads(c, in, r, &ran), want, describe(c));
    EXPECT_EQ(ran.find("forward recomputed") != std::string::npos, !given) << ran;
  }
}

// Each (batch, kv head) group cut into slices whose dK / dV partials are added at the end: any count of slices,
// one thread or two, gives the oracle's gradients; with one slice the result does not depend on the thread count.
TEST(Backward, SlicedGroupsMatchReference) {
  const Case c{{"longformer(6, 2) | random(2, seed=5)"}, 1, 2, 1, 150, 150, 16, 16, 0};
  Inputs in(problem_of(c), 19, DType::f32);
  const Grads want = reference_grads(c, in);
  std::vector<double> one_slice;
  for (int threads : {1, 2})
    for (int split : {1, 2, 3, 7}) {
      SCOPED_TRACE("threads " + std::to_string(threads) + " split " + std::to_string(split));
      BwdRun r;
      r.options.threads = threads;
      r.options.split = split;
      std::string ran;
      const Grads g = plan_grads(c, in, r, &ran);
      expect_close(g, want, describe(c));
      EXPECT_EQ(ran.find("split " + std::to_string(split)) != std::string::npos, split > 1) << ran;
      if (split == 1) {
        const std::vector<double> all = g.dk.values();
        if (one_slice.empty()) one_slice = all;
        else EXPECT_EQ(all, one_slice) << "one slice: the same sums in the same order on any thread count";
      }
    }
}

// A compound plan (PlanOptions::compound = 1) runs its backward over one tile list of the whole pattern.
TEST(Backward, CompoundPlan) {
  const Case c{{"local(8) | random(3, seed=1)"}, 1, 2, 1, 120, 120, 16, 16, 0};
  Inputs in(problem_of(c), 23, DType::f32);
  BwdRun r;
  r.options.compound = 1;
  std::string ran;
  expect_close(plan_grads(c, in, r, &ran), reference_grads(c, in), describe(c));
  EXPECT_EQ(ran.rfind("cpu_fused_", 0), 0u) << ran;
}

// Issue 39 on the CPU: the backward runs on the forward's tiles, never by parts, and explain() says why: no residue
// (column strips and blocks are key blocks), residue rows (the scattered keys by parts measured no faster), or a
// compound plan (one tile plan over the whole pattern).
TEST(Backward, CpuExplainSaysWhyNotByParts) {
  const auto explain = [](const std::string& spec, int compound) {
    spattn::Problem p{.batch = 1, .q_heads = 2, .kv_heads = 1, .q_len = 200, .kv_len = 200, .head_dim = 16};
    spattn::PlanOptions o;
    o.compound = compound;
    return spattn::make_plan(spattn::parse(spec), p, spattn::Device::cpu(), o).explain();
  };
  const std::string strips = explain("sparse_fixed(16, 2)", -1), residue = explain("local(8) | random(3, seed=1)", -1),
                    compound = explain("local(8) | random(3, seed=1)", 1);
  EXPECT_NE(strips.find("\nbackward: on the forward's tiles over the whole pattern (not by parts: every kept score is in "
                        "the tiles' key blocks"),
            std::string::npos)
      << strips;
  EXPECT_NE(residue.find("\nbackward: on the forward's tiles over the whole pattern, residue rows one at a time (not by "
                         "parts:"),
            std::string::npos)
      << residue;
  EXPECT_NE(compound.find("\nbackward: one tile plan over the whole pattern"), std::string::npos) << compound;
}

// Issue 42 on the CPU: sparse_strided's strided term split from its band by default (compound -1) where its residue
// groups hold kCpuAffineMinGroup tokens or more (plan/parts.hpp, kCpuAffineMinLen), run grouped by residue and merged
// through the LSE; forward and backward against the oracle at a length that leaves the groups unequal
// (8197 = 256 x 32 + 5), with GQA. Shorter rows run whole.
TEST(Backward, AffineSplitChosenOnTheCpu) {
  const Case c{{"sparse_strided(256)"}, 1, 2, 1, 8197, 8197, 16, 16, 0};
  Inputs in(problem_of(c), 31, DType::f32);
  auto p = problem_of(c);
  p.dtype = DType::f32;
  const spattn::Plan plan = spattn::make_plan(patterns_of(c), p, spattn::Device::cpu(), spattn::PlanOptions{});
  const std::string ex = plan.explain();
  EXPECT_NE(ex.find("compound plan, 2 parts"), std::string::npos) << ex;
  EXPECT_NE(ex.find("affine [stride(256) & causal]"), std::string::npos) << ex;
  std::vector<float> out(size_t(c.B * c.Lq * c.H * c.Dv)), lse(size_t(c.B * c.H * c.Lq));
  plan.forward(in.q.view, in.k.view, in.v.view, TensorView::contiguous(out.data(), DType::f32, {c.B, c.Lq, c.H, c.Dv}),
               TensorView::contiguous(lse.data(), DType::f32, {c.B, c.H, c.Lq, 1}));
  std::vector<double> ro(out.size()), rl(lse.size());
  spattn::cpu::reference_attention(bind(c), problem_of(c), in.q.view, in.k.view, in.v.view,
                                   TensorView::contiguous(ro.data(), DType::f64, {c.B, c.Lq, c.H, c.Dv}),
                                   TensorView::contiguous(rl.data(), DType::f64, {c.B, c.H, c.Lq, 1}));
  EXPECT_LT(max_rel(std::vector<double>(out.begin(), out.end()), ro), kTolF32) << "o";
  EXPECT_LT(max_rel(std::vector<double>(lse.begin(), lse.end()), rl), kTolF32) << "lse";
  // The backward (one tile list over the whole pattern), with O and the LSE given or recomputed.
  const Grads want = reference_grads(c, in);
  for (bool given : {true, false}) {
    BwdRun r;
    r.given = given;
    std::string ran;
    expect_close(plan_grads(c, in, r, &ran), want, describe(c) + (given ? "" : ", forward recomputed"));
    EXPECT_EQ(ran.rfind("cpu_fused_", 0), 0u) << ran;
    EXPECT_EQ(ran.find("forward recomputed") != std::string::npos, !given) << ran;
  }
  // A NaN key: the NaNs where the oracle has them (the rows keeping the key, through the band and the lattice).
  in.k.view.store(0, 4096 + 7, 0, 3, std::numeric_limits<double>::quiet_NaN());
  const Grads want_nan = reference_grads(c, in);
  BwdRun r;
  r.grad_dtype = DType::f64;
  std::string ran;
  const Grads got = plan_grads(c, in, r, &ran);
  EXPECT_EQ(ran.rfind("cpu_fused_", 0), 0u) << ran;
  EXPECT_GT(expect_nans_as_oracle(got, want_nan), 0);
  p.q_len = p.kv_len = 4099;
  const std::string whole = spattn::make_plan(patterns_of(c), p, spattn::Device::cpu(), spattn::PlanOptions{}).explain();
  EXPECT_EQ(whole.find("compound plan"), std::string::npos) << whole;
}

// The reference engine's backward is the oracle itself (o and lse not needed).
TEST(Backward, ReferenceEngineRunsTheOracle) {
  const Case c{{"local(3) | global(0)"}, 1, 2, 1, 30, 30, 8, 8, 0};
  Inputs in(problem_of(c), 29);
  BwdRun r;
  r.options.engine = spattn::Engine::reference;
  r.given = false;
  r.grad_dtype = DType::f64;
  std::string ran;
  const Grads g = plan_grads(c, in, r, &ran);
  EXPECT_EQ(ran, "reference");
  expect_close(g, reference_grads(c, in), describe(c), 1e-12);
}

// Non-finite inputs as in dense attention (PATTERNS.md, "Attention semantics"): a NaN key poisons the rows that
// keep it, hence dq of those rows and dk / dv of every key they keep; the CPU engine's NaNs are the reference's,
// element by element. Also a -inf key element (scores of -inf weigh 0 and +inf poison the row in the forward pass;
// dq = dS K meets 0 * -inf), a query whose every score is -inf; and finite inputs whose scores pass fp32's range
// (plant 3: the fp32 scores overflow, the reference's gradients are finite) or reach where fp32 cannot recompute
// P from the LSE (plant 4: scores near 3e5 put P 2% off); and a NaN in dO (plant 5: O and the LSE stay finite, only
// the gradients show it). The plants are in kv head 0: its group is redone in fp64
// (as the reference, to 1e-9), kv head 1's stays on the fp32 kernel. Inputs in fp64 (converted, packed) and in
// fp32 (read in place where they can be).
TEST(Backward, NonFiniteInputsAsTheReference) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const Case c{{"local(4) | random(3, seed=2)"}, 1, 2, 2, 60, 60, 16, 16, 0};
  const auto pr = problem_of(c);
  for (DType dt : {DType::f64, DType::f32}) {
    for (int plant = 0; plant < 6; ++plant) {
      SCOPED_TRACE(std::to_string(plant) + " " + std::string(spattn::dtype_name(dt)));
      Inputs in(pr, 11, dt);
      const TensorView& q = in.q.view;
      const TensorView& k = in.k.view;
      if (plant == 0) k.store(0, 10, 0, 3, nan);
      if (plant == 1) k.store(0, 20, 0, 0, -inf);
      if (plant == 2) {  // row 30 of head 0: every score -inf
        for (int64_t l = 0; l < c.Lk; ++l) k.store(0, l, 0, 0, -1.0);
        q.store(0, 30, 0, 0, inf);
        for (int64_t d = 1; d < c.D; ++d) q.store(0, 30, 0, d, 0.0);
      }
      if (plant == 3)  // a score near 1e40 (fp32 ends at 3.4e38) from finite fp32 inputs
        for (int64_t d = 0; d < c.D; ++d) {
          const double x = k.load(0, 31, 0, d);
          q.store(0, 30, 0, d, 1e20 * x);
          k.store(0, 31, 0, d, 1e20 * x);
        }
      if (plant == 4)  // scores near 3e5: fp32 has no exact P there (its spacing is 2^-5); no overflow
        for (int64_t d = 0; d < c.D; ++d) q.store(0, 30, 0, d, 1e5 * k.load(0, 31, 0, d));
      if (plant == 5) in.dout.view.store(0, 30, 0, 2, nan);  // the forward (and its LSE) sees nothing of it
      const Grads want = reference_grads(c, in);
      BwdRun r;
      r.grad_dtype = DType::f64;
      std::string ran;
      const Grads got = plan_grads(c, in, r, &ran);
      EXPECT_NE(ran.find("fp64 for 1 of 2 groups"), std::string::npos) << ran;
      const int64_t nans = expect_nans_as_oracle(got, want);
      if (plant < 3 || plant == 5) EXPECT_GT(nans, 0) << "each plant poisons some gradient (a -inf in K: dq = dS K meets 0 * -inf)";
      // Head 0's group to 1e-9: it ran in fp64.
      for (int64_t l = 0; l < c.Lq; ++l)
        for (int64_t d = 0; d < c.D; ++d) {
          const double x = got.dq.view.load(0, l, 0, d), y = want.dq.view.load(0, l, 0, d);
          if (!std::isnan(y)) ASSERT_NEAR(x, y, 1e-9 * std::max(1.0, std::abs(y))) << "row " << l;
        }
    }
  }
}

TEST(Backward, RefusesMismatchedGradients) {
  const Case c{{"local(3)"}, 1, 2, 1, 32, 32, 8, 8, 0};
  const auto pr = problem_of(c);
  Inputs in(pr, 3);
  Grads g(pr);
  const spattn::Plan plan = spattn::make_plan(spattn::parse("local(3)"), pr);
  Tensor dq16(DType::bf16, in.q.view.shape);
  try {
    plan.backward(in.q.view, in.k.view, in.v.view, {}, {}, in.dout.view, dq16.view, g.dk.view, g.dv.view);
    ADD_FAILURE() << "bf16 gradients must be refused on the CPU";
  } catch (const spattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("gradient dq must be fp32 or fp64 on the CPU, got bf16"), std::string::npos) << e.what();
  }
  EXPECT_THROW(plan.backward(in.q.view, in.k.view, in.v.view, {}, {}, in.dout.view, g.dk.view, g.dk.view, g.dv.view),
               spattn::Error)
      << "dq of k's shape";
}

}  // namespace
