// tests/cpu_fused_test.cpp — the fused CPU attention (spattn::cpu::attention) against the fp64 oracle
// (spattn::cpu::reference_attention), which shares no code with it below pattern/.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu/fused_plan.hpp"
#include "spattn/reference.hpp"

namespace {

using spattn::BoundPattern;
using spattn::DType;
using spattn::Pattern;
using spattn::Problem;
using spattn::TensorView;
using spattn::cpu::Isa;
using spattn::cpu::Options;

// Host storage for one tensor, optionally with a strided layout.
struct Tensor {
  std::vector<uint8_t> bytes;
  TensorView view;
};

// Layouts a test can ask for: contiguous [B, L, H, D]; head-major memory [B, H, L, D] seen as [B, L, H, D];
// and padded: every stride larger than needed, inner stride 2 (the view skips every other element).
enum class Layout { contiguous, head_major, padded };

Tensor make_tensor(DType dt, std::array<int64_t, 4> shape, Layout layout, std::mt19937_64& rng) {
  Tensor t;
  const auto [B, L, H, D] = shape;
  std::array<int64_t, 4> stride{};
  int64_t elems = 0;
  switch (layout) {
    case Layout::contiguous: stride = {L * H * D, H * D, D, 1}; elems = B * L * H * D; break;
    case Layout::head_major: stride = {H * L * D, D, L * D, 1}; elems = B * L * H * D; break;
    case Layout::padded: {
      const int64_t sd = 2, sh = 2 * D + 3, sl = H * sh + 5, sb = L * sl + 7;
      stride = {sb, sl, sh, sd};
      elems = B * sb;
      break;
    }
  }
  t.bytes.assign(size_t(std::max<int64_t>(elems, 1) * spattn::dtype_size(dt)), 0);
  t.view = TensorView{t.bytes.data(), dt, shape, stride};
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t l = 0; l < L; ++l)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) t.view.store(b, l, h, d, nd(rng));
  return t;
}

struct Case {
  std::vector<std::string> specs;  // one for all heads or one per query head
  int64_t B = 1, Lq = 64, Lk = 64, H = 2, HK = 2, D = 32, Dv = 0;
  DType dtype = DType::f32;
  Layout layout = Layout::contiguous;
  double scale = 0;
  Isa isa = Isa::automatic;
  int threads = 2;
  // Applied to the random inputs before both runs (e.g. to plant a NaN).
  std::function<void(const TensorView& q, const TensorView& k, const TensorView& v)> edit;
};

struct Result {
  double rel_err_o = 0, max_err_lse = 0;
  std::vector<float> o, lse;
  bool lse_inf_mismatch = false;
  int64_t nan_mismatch = 0;  // elements of O or lse NaN in one output and not in the other
  int64_t nan_rows = 0;      // lse values NaN in both (rows the inputs poison)
};

// Runs fused and reference on the same random inputs; returns the errors and the fused output.
Result check(const Case& c, uint64_t seed = 1) {
  std::vector<BoundPattern> pats;
  for (const auto& s : c.specs) pats.push_back(Pattern::parse(s).bind(c.Lq, c.Lk));
  Problem p;
  p.batch = c.B, p.q_heads = c.H, p.kv_heads = c.HK, p.q_len = c.Lq, p.kv_len = c.Lk, p.head_dim = c.D;
  p.value_dim = c.Dv, p.dtype = c.dtype;
  if (c.scale != 0) p.scale = c.scale;  // the cases' 0: the default
  std::mt19937_64 rng(seed);
  Tensor q = make_tensor(c.dtype, {c.B, c.Lq, c.H, c.D}, c.layout, rng);
  Tensor k = make_tensor(c.dtype, {c.B, c.Lk, c.HK, c.D}, c.layout, rng);
  Tensor v = make_tensor(c.dtype, {c.B, c.Lk, c.HK, p.dv()}, c.layout, rng);
  if (c.edit) c.edit(q.view, k.view, v.view);
  // Fused output: in the requested layout too (poisoned first); lse [B, H, Lq, 1] with a gap per head.
  Tensor o = make_tensor(DType::f32, {c.B, c.Lq, c.H, p.dv()}, c.layout, rng);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t l = 0; l < c.Lq; ++l)
      for (int64_t h = 0; h < c.H; ++h)
        for (int64_t d = 0; d < p.dv(); ++d) o.view.store(b, l, h, d, std::numeric_limits<double>::quiet_NaN());
  std::vector<float> lse_buf(size_t(c.B * c.H * (c.Lq + 3) + 1), std::numeric_limits<float>::quiet_NaN());
  TensorView lse{lse_buf.data(), DType::f32, {c.B, c.H, c.Lq, 1}, {c.H * (c.Lq + 3), c.Lq + 3, 1, 1}};
  Options opt;
  opt.threads = c.threads;
  opt.isa = c.isa;
  spattn::cpu::attention(pats, p, q.view, k.view, v.view, o.view, lse, opt);

  std::vector<double> ro(size_t(c.B * c.Lq * c.H * p.dv())), rl(size_t(c.B * c.H * c.Lq));
  const TensorView rov = TensorView::contiguous(ro.data(), DType::f64, {c.B, c.Lq, c.H, p.dv()});
  const TensorView rlv = TensorView::contiguous(rl.data(), DType::f64, {c.B, c.H, c.Lq, 1});
  spattn::cpu::reference_attention(pats, p, q.view, k.view, v.view, rov, rlv);

  Result r;
  double num = 0, den = 0;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t l = 0; l < c.Lq; ++l)
      for (int64_t h = 0; h < c.H; ++h)
        for (int64_t d = 0; d < p.dv(); ++d) {
          const double x = o.view.load(b, l, h, d), y = rov.load(b, l, h, d);
          r.o.push_back(float(x));
          if (std::isnan(x) || std::isnan(y)) {
            r.nan_mismatch += std::isnan(x) != std::isnan(y);
            continue;
          }
          num += (x - y) * (x - y);
          den += y * y;
        }
  r.rel_err_o = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t l = 0; l < c.Lq; ++l) {
        // (the reference's lse rounded to the fused output's fp32: beyond its range, +-inf)
        const double x = lse.load(b, h, l, 0), y = double(float(rlv.load(b, h, l, 0)));
        r.lse.push_back(float(x));
        if (std::isnan(x) || std::isnan(y)) {
          r.nan_mismatch += std::isnan(x) != std::isnan(y);
          r.nan_rows += std::isnan(x) && std::isnan(y);
          continue;
        }
        if (std::isinf(y) || std::isinf(x)) {
          if (!(std::isinf(x) && std::isinf(y) && (x < 0) == (y < 0))) r.lse_inf_mismatch = true;
          continue;
        }
        r.max_err_lse = std::max(r.max_err_lse, std::abs(x - y) / std::max(1.0, std::abs(y)));
      }
  return r;
}

std::string describe(const Case& c) {
  std::string s;
  for (const auto& x : c.specs) s += (s.empty() ? "" : " ; ") + x;
  return s + " B=" + std::to_string(c.B) + " Lq=" + std::to_string(c.Lq) + " Lk=" + std::to_string(c.Lk) +
         " H=" + std::to_string(c.H) + "/" + std::to_string(c.HK) + " D=" + std::to_string(c.D) + " Dv=" +
         std::to_string(c.Dv) + " " + std::string(spattn::dtype_name(c.dtype)) + " isa=" + spattn::cpu::isa_name(c.isa);
}

void expect_close(const Case& c, double tol = 1e-5) {
  const Result r = check(c);
  EXPECT_LE(r.rel_err_o, tol) << describe(c);
  EXPECT_LE(r.max_err_lse, tol) << describe(c);
  EXPECT_FALSE(r.lse_inf_mismatch) << describe(c) << ": a fully masked row must give lse = -inf, others finite";
  EXPECT_EQ(r.nan_mismatch, 0) << describe(c) << ": NaN where the reference has none, or the other way";
}

std::vector<Isa> isas() {
  std::vector<Isa> out{Isa::generic};
  const Isa best = spattn::cpu::best_isa();
  if (best == Isa::avx512) out = {Isa::avx512, Isa::avx2, Isa::generic};
  else if (best == Isa::avx2) out = {Isa::avx2, Isa::generic};
  return out;
}

// Specs valid for a given length (every atom and preset; lengths make some invalid, e.g. a window that
// does not fit: those are skipped with their reason checked by bind() throwing spattn::Error).
std::vector<std::string> atom_specs(int64_t L) {
  std::vector<std::string> v = {
      "dense", "causal", "local(3)", "local(left=5, right=0)", "local(left=0, right=9)", "dilated(3, 2)",
      "dilated(40, 3)", "stride(5)", "stride(4) & causal", "block_diag(16)", "summary(16, 2)", "global(0:2)",
      "global_rows(0:3)", "global_cols(1:4)", "random(5, seed=7)", "random(60, seed=1)",
      "blocked(16, local(1))", "blocked(8, random(2, seed=3) | global(0))", "longformer(4, 1)",
      "longformer(40, 8)", "bigbird(16, 1, 1, 1, seed=2)", "sparse_fixed(16)", "sparse_fixed(32, 4)",
      "sparse_strided(8)", "local(2) & stride(2)", "(local(50) & causal) | global(0:3)", "neighborhood(kernel=3)",
      "neighborhood(kernel=5, dilation=2)", "neighborhood(kernel=4, causal=1)"};
  v.push_back("document(" + std::to_string(L / 2) + ", " + std::to_string(L - L / 2) + ")");
  if (L == 799) {
    v.push_back("neighborhood(dims=(17, 47), kernel=5)");
    v.push_back("neighborhood(dims=(17, 47), kernel=(3, 7), dilation=(2, 3))");
    v.push_back("neighborhood(dims=(17, 47), kernel=5, causal=(1, 0))");
  }
  return v;
}

// Every atom and preset at awkward lengths (1, 7, 113, 799: not multiples of any tile or block size), on
// every kernel set this CPU runs.
TEST(CpuFused, EveryAtomAndPresetAtAwkwardSizes) {
  for (Isa isa : isas())
    for (int64_t L : {1, 7, 113, 799}) {
      int ran = 0;
      for (const std::string& spec : atom_specs(L)) {
        try {
          (void)Pattern::parse(spec).bind(L, L);
        } catch (const spattn::Error&) {
          continue;  // not valid at this length (window does not fit, segment/lengths mismatch)
        }
        Case c;
        c.specs = {spec};
        c.Lq = c.Lk = L;
        c.H = c.HK = L > 200 ? 1 : 2;
        c.isa = isa;
        expect_close(c);
        ++ran;
      }
      EXPECT_GE(ran, 10) << "too few specs valid at L=" << L;
    }
}

// Rectangular problems (Lq != Lk), e.g. decoding a few queries against a long cache.
TEST(CpuFused, RectangularLengths) {
  for (Isa isa : isas())
    for (const char* spec : {"dense", "causal", "local(10)", "random(9, seed=4)", "global_cols(0:5) | local(3)"}) {
      Case c;
      c.specs = {spec};
      c.Lq = 37, c.Lk = 301, c.isa = isa;
      expect_close(c);
      c.Lq = 301, c.Lk = 37;
      expect_close(c);
    }
}

// Grouped-query attention with a different pattern per query head (each head maps to hk = h / 2).
TEST(CpuFused, GqaWithPerHeadPatterns) {
  for (Isa isa : isas()) {
    Case c;
    c.specs = {"local(7)", "causal", "random(11, seed=5)", "dilated(5, 3) | global(0:2)"};
    c.Lq = c.Lk = 113, c.H = 4, c.HK = 2, c.B = 2, c.isa = isa;
    expect_close(c);
    c.specs = {"longformer(9, 2)"};
    c.H = 6, c.HK = 1;
    expect_close(c);
  }
}

// Head dims that are not a multiple of any vector width, Dv != D, and a custom scale.
TEST(CpuFused, OddHeadDimsAndScale) {
  for (Isa isa : isas())
    for (auto [D, Dv] : {std::pair<int64_t, int64_t>{24, 40}, {64, 16}, {7, 3}, {128, 128}, {1, 1}, {80, 0}}) {
      Case c;
      c.specs = {"longformer(20, 3) | random(4, seed=9)"};
      c.Lq = c.Lk = 113, c.D = D, c.Dv = Dv, c.isa = isa;
      c.scale = 0.37;
      expect_close(c);
    }
}

// Rows with no key at all: O = 0 and lse = -inf, never NaN; also whole tiles without keys.
TEST(CpuFused, FullyMaskedRows) {
  for (Isa isa : isas())
    for (const char* spec : {"global_rows(0:3)", "local(2) & global_cols(50:60)", "random(3, seed=1) & causal",
                             "local(left=-0, right=0) & stride(3) & global_rows(40:80)"}) {
      Case c;
      c.specs = {spec};
      c.Lq = c.Lk = 113, c.isa = isa;
      expect_close(c);
    }
}

// Non-finite values behave as in dense softmax, in fp64 (PATTERNS.md, "Attention semantics"): a NaN or +inf
// score makes its row's O and lse NaN and leaves every other row alone; a -inf score weighs 0; a row whose
// scores are all -inf is NaN; an empty row stays O = 0, lse = -inf. Planted in K, Q and V on dense blocks
// (full and masked), residue rows and both; each is compared element by element with the reference. The fused
// kernel used to clamp NaN scores into its exponential (a finite O where the reference has NaN) and to spread
// a NaN of V into rows of the tile that do not keep its key.
TEST(CpuFused, NonFiniteInputsPoisonOnlyTheirRows) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  struct Plant {
    const char* what;
    std::function<void(const TensorView&, const TensorView&, const TensorView&)> edit;
  };
  const std::vector<Plant> plants = {
      {"NaN in one key", [&](auto&, auto& k, auto&) { k.store(0, 10, 0, 5, nan); }},
      {"NaN in one query", [&](auto& q, auto&, auto&) { q.store(0, 20, 1, 3, nan); }},
      {"NaN in one value", [&](auto&, auto&, auto& v) { v.store(0, 30, 0, 2, nan); }},
      {"+inf key row (scores +-inf or NaN)", [&](auto&, auto& k, auto&) {
         for (int64_t d = 0; d < k.shape[3]; ++d) k.store(0, 40, 0, d, inf);
       }},
      {"-inf in one key element (-inf scores weigh 0)", [&](auto&, auto& k, auto&) { k.store(0, 50, 0, 0, -inf); }},
      {"a query whose every score is -inf", [&](auto& q, auto& k, auto&) {
         for (int64_t l = 0; l < k.shape[1]; ++l) k.store(0, l, 0, 0, -1.0);
         q.store(0, 60, 0, 0, inf);
         for (int64_t d = 1; d < q.shape[3]; ++d) q.store(0, 60, 0, d, 0.0);
       }},
  };
  for (Isa isa : isas())
    for (const char* spec : {"local(16)", "random(20, seed=1)", "longformer(8, 2) | random(5, seed=3)",
                             "local(3) & global_rows(10:70)", "dilated(6, 3)"})
      for (const Plant& plant : plants) {
        Case c;
        c.specs = {spec};
        c.Lq = c.Lk = 113, c.H = 2, c.HK = 1, c.isa = isa;
        c.edit = plant.edit;
        const Result r = check(c);
        EXPECT_LE(r.rel_err_o, 1e-5) << describe(c) << ", " << plant.what;
        EXPECT_LE(r.max_err_lse, 1e-5) << describe(c) << ", " << plant.what;
        EXPECT_FALSE(r.lse_inf_mismatch) << describe(c) << ", " << plant.what;
        EXPECT_EQ(r.nan_mismatch, 0) << describe(c) << ", " << plant.what;
      }
  // The planted NaN reaches exactly the rows that keep its key: local(16) around key 10 (rows 0..26), on the
  // one kv head both query heads share.
  Case c;
  c.specs = {"local(16)"};
  c.Lq = c.Lk = 113, c.H = 2, c.HK = 1;
  c.edit = plants[0].edit;
  EXPECT_EQ(check(c).nan_rows, 2 * 27);
}

// A huge scale: scores overflow fp32 where fp64 holds them. O is then finite and lse +inf (or -inf) where the
// reference, rounding its fp64 lse to fp32, says so (the fused kernel used to write NaN).
TEST(CpuFused, HugeScaleMatchesTheReference) {
  for (Isa isa : isas())
    for (const char* spec : {"local(16)", "random(20, seed=1)", "longformer(8, 2) | random(5, seed=3)", "dense"})
      for (double scale : {1e38, 1e30, -1e38}) {
        Case c;
        c.specs = {spec};
        c.Lq = c.Lk = 113, c.isa = isa, c.scale = scale;
        expect_close(c);
      }
}

// fp16 and bf16 inputs are converted on load; both implementations read the same rounded values, so the
// fp32-accumulation bound still holds.
TEST(CpuFused, HalfAndBfloatInputs) {
  for (Isa isa : isas())
    for (DType dt : {DType::f16, DType::bf16})
      for (const char* spec : {"longformer(30, 4)", "random(20, seed=3)", "causal"}) {
        Case c;
        c.specs = {spec};
        c.Lq = c.Lk = 211, c.dtype = dt, c.isa = isa;
        expect_close(c);
      }
}

// Strided views: head-major memory seen as [B, L, H, D], and views with gaps and inner stride 2 (q, k, v
// and o alike).
TEST(CpuFused, StridedViews) {
  for (Isa isa : isas())
    for (Layout layout : {Layout::head_major, Layout::padded})
      for (DType dt : {DType::f32, DType::bf16}) {
        Case c;
        c.specs = {"bigbird(16, 1, 1, 2, seed=1)"};
        c.Lq = c.Lk = 150, c.B = 2, c.H = 4, c.HK = 2, c.layout = layout, c.dtype = dt, c.isa = isa;
        expect_close(c);
      }
}

// Larger cases that exercise many dense blocks, masked edges, residue rows and the permutation.
TEST(CpuFused, SuiteShapesAtModerateLength) {
  for (const char* spec : {"local(100)", "longformer(100, 16)", "bigbird(32, 1, 2, 3, seed=0)", "dilated(50, 2)",
                           "sparse_fixed(64)", "random(60, seed=0)", "neighborhood(dims=(32,32), kernel=7)", "causal"}) {
    Case c;
    c.specs = {spec};
    c.Lq = c.Lk = 1024, c.H = c.HK = 1, c.D = 64;
    expect_close(c);
  }
}

// Residue-heavy plans (scattered keys) run groups of tiles in key passes once Lk exceeds 1.5 passes (a pass
// is 1536 keys at D = Dv = 64): rows continue their online softmax across passes, lists split mid-run.
TEST(CpuFused, ResidueKeyPasses) {
  for (Isa isa : isas())
    for (const char* spec : {"random(40, seed=2)", "random(300, seed=1) | global_rows(0:3)", "random(9, seed=4) & causal"}) {
      Case c;
      c.specs = {spec};
      c.Lq = 301, c.Lk = 3333, c.H = 2, c.HK = 1, c.D = 64, c.isa = isa;
      expect_close(c);
    }
}

// Residue rows address K / V through 32-bit row offsets where token * row stride fits an int32; the 64-bit
// addressing (long sequences) is forced here, on the shapes of the key-pass test and a D = 32 case.
TEST(CpuFused, ResidueWideOffsets) {
  setenv("SPATTN_CPU_WIDE_OFFSETS", "1", 1);
  for (Isa isa : isas())
    for (int64_t D : {64, 32}) {
      Case c;
      c.specs = {"random(40, seed=2) | global_rows(0:3)"};
      c.Lq = 301, c.Lk = 3333, c.H = 2, c.HK = 1, c.D = D, c.isa = isa;
      expect_close(c);
    }
  unsetenv("SPATTN_CPU_WIDE_OFFSETS");
}

// The work split over threads does not change the result: every tile is computed by one thread in a fixed
// order, so 1 and N threads agree (to rounding; in practice bit for bit).
TEST(CpuFused, OneThreadAndManyAgree) {
  for (const char* spec : {"longformer(30, 4)", "random(20, seed=3)", "neighborhood(dims=(16,25), kernel=5)"}) {
    Case c;
    c.specs = {spec};
    c.Lq = c.Lk = 400, c.B = 2, c.H = 3, c.HK = 3;
    c.threads = 1;
    const Result one = check(c, 42);
    c.threads = 5;
    const Result many = check(c, 42);
    ASSERT_EQ(one.o.size(), many.o.size());
    double worst = 0;
    for (size_t i = 0; i < one.o.size(); ++i) worst = std::max(worst, double(std::abs(one.o[i] - many.o[i])));
    for (size_t i = 0; i < one.lse.size(); ++i)
      if (!std::isinf(one.lse[i])) worst = std::max(worst, double(std::abs(one.lse[i] - many.lse[i])));
    EXPECT_LE(worst, 1e-6) << spec;
  }
}

// Residue-heavy plans pack K/V inside the parallel region (token ranges, then a barrier, then the work
// items) on the kept worker threads, in key passes whose ends are rounded to whole vectors per row: awkward
// sizes (several batches, GQA, D and Dv not multiples of the vector width, a key count not a multiple of the
// pack's token range, fp16 inputs read through strides), 1, 3 and 2 threads against the reference and each
// other; then two callers at once (one gets the worker threads, the other its own).
TEST(CpuFused, RandomHeavyPackedOnWorkerThreads) {
  for (Layout layout : {Layout::contiguous, Layout::head_major})
    for (DType dt : {DType::f32, DType::f16}) {
      Case c;
      c.specs = {"random(70, seed=11) | global_rows(0:2)"};
      c.B = 2, c.Lq = 150, c.Lk = 5003, c.H = 4, c.HK = 2, c.D = 40, c.Dv = 24, c.dtype = dt, c.layout = layout;
      std::vector<Result> runs;
      for (int threads : {1, 3, 2}) {  // 2 after 3: a kept worker sits out a region
        c.threads = threads;
        const Result r = check(c, 5);
        EXPECT_LE(r.rel_err_o, dt == DType::f32 ? 1e-5 : 1e-3) << describe(c) << " threads " << threads;
        EXPECT_FALSE(r.lse_inf_mismatch) << describe(c);
        runs.push_back(r);
      }
      for (size_t i = 1; i < runs.size(); ++i) {
        ASSERT_EQ(runs[0].o.size(), runs[i].o.size());
        double worst = 0;
        for (size_t j = 0; j < runs[0].o.size(); ++j) worst = std::max(worst, double(std::abs(runs[0].o[j] - runs[i].o[j])));
        EXPECT_LE(worst, 1e-6) << describe(c);
      }
    }
  Case c;
  c.specs = {"random(150, seed=3)"};
  c.Lq = 333, c.Lk = 4000, c.H = 2, c.HK = 2, c.D = 64;
  Result a, b;
  std::thread other([&] { b = check(c, 9); });
  a = check(c, 9);
  other.join();
  EXPECT_LE(a.rel_err_o, 1e-5);
  EXPECT_LE(b.rel_err_o, 1e-5);
  EXPECT_EQ(a.o, b.o);
}

// Neighborhoods of 2 and 3 axes run in query tiles that are boxes of the grid (plan/tile_map.hpp): grids narrower
// than a tile, sides not a multiple of the box, windows touching every edge, causal and dilated axes (groups of
// unequal size), a union with another term (the grid then guides the boxes only).
TEST(CpuFused, NeighborhoodBoxTiles) {
  struct Shape {
    const char* spec;
    int64_t L;
  };
  for (Isa isa : isas())
    for (const Shape& sh : {Shape{"neighborhood(dims=(7, 13), kernel=5)", 91},
                            Shape{"neighborhood(dims=(13, 7), kernel=(3, 5))", 91},
                            Shape{"neighborhood(dims=(7, 13), kernel=7)", 91},
                            Shape{"neighborhood(dims=(33, 50), kernel=13)", 1650},
                            Shape{"neighborhood(dims=(21, 19), kernel=5, causal=(1, 0))", 399},
                            Shape{"neighborhood(dims=(21, 19), kernel=5, causal=(0, 1))", 399},
                            Shape{"neighborhood(dims=(21, 19), kernel=5, causal=1)", 399},
                            Shape{"neighborhood(dims=(21, 19), kernel=(5, 3), dilation=(2, 1))", 399},
                            Shape{"neighborhood(dims=(21, 19), kernel=3, dilation=(1, 2))", 399},
                            Shape{"neighborhood(dims=(21, 19), kernel=5) | global(0:2)", 399},
                            Shape{"neighborhood(dims=(5, 9, 11), kernel=3)", 495},
                            Shape{"neighborhood(dims=(6, 7, 9), kernel=(3, 3, 5), dilation=(1, 2, 1), causal=(1, 0, 0))", 378}}) {
      Case c;
      c.specs = {sh.spec};
      c.Lq = c.Lk = sh.L;
      c.H = c.HK = 2, c.D = 64, c.isa = isa;
      expect_close(c);
      Problem p;
      p.q_heads = p.kv_heads = 2, p.q_len = p.kv_len = sh.L, p.head_dim = 64;
      Options opt;
      opt.isa = isa;
      const spattn::cpu::FusedPlan plan({Pattern::parse(sh.spec).bind(sh.L)}, p, opt);
      EXPECT_NE(plan.stats().boxes, "") << sh.spec << ": " << plan.describe();
      EXPECT_EQ(plan.stats().tile_box.volume(), plan.stats().tile_rows) << sh.spec << ": " << plan.describe();
    }
  // A grid of one axis longer than 1 keeps runs of consecutive tokens.
  Problem p;
  p.q_heads = p.kv_heads = 1, p.q_len = p.kv_len = 300, p.head_dim = 64;
  const spattn::cpu::FusedPlan one({Pattern::parse("neighborhood(dims=(1, 300), kernel=(1, 9))").bind(300)}, p);
  EXPECT_EQ(one.stats().boxes, "") << one.describe();
}

// A plan is reusable across calls and inputs.
TEST(CpuFused, PlanReuse) {
  std::vector<BoundPattern> pats{Pattern::parse("longformer(16, 2)").bind(100)};
  Problem p;
  p.q_len = p.kv_len = 100, p.q_heads = p.kv_heads = 2, p.head_dim = 16;
  spattn::cpu::FusedPlan plan(pats, p);
  EXPECT_NE(plan.describe().find("tiles"), std::string::npos);
  std::mt19937_64 rng(3);
  for (int rep = 0; rep < 2; ++rep) {
    Tensor q = make_tensor(DType::f32, {1, 100, 2, 16}, Layout::contiguous, rng);
    Tensor k = make_tensor(DType::f32, {1, 100, 2, 16}, Layout::contiguous, rng);
    Tensor v = make_tensor(DType::f32, {1, 100, 2, 16}, Layout::contiguous, rng);
    std::vector<float> o(100 * 2 * 16);
    std::vector<double> ro(o.size());
    const TensorView ov = TensorView::contiguous(o.data(), DType::f32, {1, 100, 2, 16});
    plan.run(q.view, k.view, v.view, ov, TensorView{});
    spattn::cpu::reference_attention(pats, p, q.view, k.view, v.view,
                                     TensorView::contiguous(ro.data(), DType::f64, {1, 100, 2, 16}), TensorView{});
    double num = 0, den = 0;
    for (size_t i = 0; i < o.size(); ++i) num += (o[i] - ro[i]) * (o[i] - ro[i]), den += ro[i] * ro[i];
    EXPECT_LE(std::sqrt(num / den), 1e-5);
  }
}

// Bad input is a spattn::Error naming the problem, never a crash.
TEST(CpuFused, ErrorsNameTheProblem) {
  std::vector<BoundPattern> pats{Pattern::parse("local(4)").bind(32)};
  Problem p;
  p.q_len = p.kv_len = 32, p.q_heads = p.kv_heads = 1, p.head_dim = 8;
  std::vector<float> f(32 * 8), of(32 * 8);
  std::vector<uint16_t> h(32 * 8);
  const TensorView q = TensorView::contiguous(f.data(), DType::f32, {1, 32, 1, 8});
  const TensorView o = TensorView::contiguous(of.data(), DType::f32, {1, 32, 1, 8});
  const TensorView qh = TensorView::contiguous(h.data(), DType::f16, {1, 32, 1, 8});
  const TensorView bad = TensorView::contiguous(f.data(), DType::f32, {1, 16, 1, 16});
  auto expect_error = [&](auto&& fn, const char* needle) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const spattn::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([&] { spattn::cpu::attention(pats, p, bad, q, q, o, TensorView{}); }, "q");
  expect_error([&] { spattn::cpu::attention(pats, p, q, q, q, qh, TensorView{}); }, "fp32");
  expect_error([&] { spattn::cpu::attention(pats, p, qh, q, q, o, TensorView{}); }, "dtype");
  expect_error([&] { spattn::cpu::attention({pats[0], pats[0]}, p, q, q, q, o, TensorView{}); }, "pattern");
  Problem p2 = p;
  p2.q_len = p2.kv_len = 33;
  expect_error([&] { spattn::cpu::attention(pats, p2, q, q, q, o, TensorView{}); }, "bound");
  Options bad_threads;
  bad_threads.threads = -1;
  expect_error([&] { spattn::cpu::attention(pats, p, q, q, q, o, TensorView{}, bad_threads); }, "threads");
}

}  // namespace
