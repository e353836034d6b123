// Non-finite inputs on the GPU paths (issue 21; PATTERNS.md, "Attention semantics"), against the fp64 reference on
// the same (rounded) inputs, element by element: a NaN or +inf score poisons its row (O and LSE NaN) and no other;
// an empty row stays O = 0, LSE = -inf beside a poisoned one; rows the plant does not reach match the reference.
// Paths: every fused kernel-table row this device runs (forced, checked through Plan::last_kernel), the band
// kernel's split-item and slab-part routes, compound plans (tiles, columns, scattered, affine parts and their merges),
// cuda_unfused, and the backward (sm90_bwd rows, cuda_csr_bwd). Awkward lengths (Lq 400, Lk 300: no multiple of a
// tile), GQA, bf16 and fp16, D 64 and 128.
//
// Checked on every path: an element the reference makes NaN is NaN (a finite value there is a silent wrong
// answer); the LSE is NaN exactly where the reference's is; finite elements within the dtype's tolerance. A NaN
// where the reference has a finite value ("spread") fails, with one documented exception (PATTERNS.md): the tile
// kernels multiply P = 0 of a masked (q, k) of a loaded tile by that key's V (forward) or K / Q / dO (backward),
// and 0 * NaN is NaN, so a NaN of V (or, in the backward, of any input) can reach rows or keys of the same tile
// that do not keep it. Spread is counted and printed there; paths that walk only kept pairs (the scattered part,
// cuda_csr_bwd) must have none.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <array>
#include <cfloat>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gpu/plan_run.hpp"
#include "gpu/require_gpu.hpp"
#include "plan/kernels.hpp"
#include "spattn/plan.hpp"
#include "spattn/reference.hpp"

namespace {

using spattn::DType;
using spattn::TensorView;
using spattn::test::Buf;
using spattn::test::for_each_index;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN(), kInf = std::numeric_limits<double>::infinity();

struct Case {
  std::string what;
  const char* spec;
  int64_t B = 1, H = 4, HK = 2, Lq = 400, Lk = 300, D = 64;
  DType dt = DType::bf16;
  spattn::PlanOptions opt;
  std::string want_kernel;  // the kernel (prefix) Plan::last_kernel must name; empty: not checked
  bool exact = false;       // walks only kept pairs: no spread allowed
};

// A plant edits host q, k, v, dO before the upload; `v_only` marks plants whose forward spread the tile kernels may
// show (a NaN of V).
struct Plant {
  const char* what;
  std::function<void(const TensorView&, const TensorView&, const TensorView&, const TensorView&)> edit;
  bool v_only = false;
  double scale = 0;
};

const std::vector<Plant>& plants() {
  static const std::vector<Plant> p = {
      {"NaN in key 10 (kv head 0)", [](auto&, auto& k, auto&, auto&) { k.store(0, 10, 0, 5, kNaN); }},
      // Key 299, the last: rows up to 339 keep it under local(40), rows 340 on have no key (Lq 400 > Lk 300).
      {"NaN in the last key, beside empty rows", [](auto&, auto& k, auto&, auto&) { k.store(0, 299, 1, 0, kNaN); }},
      {"+inf in one K element (scores +inf, -inf or NaN)", [](auto&, auto& k, auto&, auto&) { k.store(0, 40, 0, 3, kInf); }},
      {"NaN in query row 20 (head 1)", [](auto& q, auto&, auto&, auto&) { q.store(0, 20, 1, 3, kNaN); }},
      {"NaN in V of key 30", [](auto&, auto&, auto& v, auto&) { v.store(0, 30, 0, 2, kNaN); }, true},
      {"-inf in V of key 50", [](auto&, auto&, auto& v, auto&) { v.store(0, 50, 1, 7, -kInf); }, true},
      {"scale 1e5 (scaled scores below 2^27: every row the reference's)", [](auto&, auto&, auto&, auto&) {}, false, 1e5},
      {"scale 1e30 (scores far past any exp, within fp32)", [](auto&, auto&, auto&, auto&) {}, false, 1e30},
      {"scale 1e38 (scaled scores past fp32's range)", [](auto&, auto&, auto&, auto&) {}, false, 1e38},
  };
  return p;
}

struct Host {
  std::vector<uint8_t> q, k, v, dout;
  TensorView tq, tk, tv, tdo;
};

Host make_inputs(const spattn::Problem& p, DType dt, uint32_t seed, const Plant& plant) {
  Host h;
  const int es = spattn::dtype_size(dt);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto fill = [&](std::vector<uint8_t>& buf, std::array<int64_t, 4> s) {
    buf.resize(size_t(s[0] * s[1] * s[2] * s[3]) * es);
    const TensorView t = TensorView::contiguous(buf.data(), dt, s);
    for_each_index(s, [&](int64_t a, int64_t b, int64_t c, int64_t d) { t.store(a, b, c, d, nd(rng)); });
    return t;
  };
  h.tq = fill(h.q, {p.batch, p.q_len, p.q_heads, p.head_dim});
  h.tk = fill(h.k, {p.batch, p.kv_len, p.kv_heads, p.head_dim});
  h.tv = fill(h.v, {p.batch, p.kv_len, p.kv_heads, p.head_dim});
  h.tdo = fill(h.dout, {p.batch, p.q_len, p.q_heads, p.head_dim});
  plant.edit(h.tq, h.tk, h.tv, h.tdo);
  return h;
}

struct Dev {
  Buf b;
  TensorView t;
  Dev(const std::vector<uint8_t>& host, const TensorView& like) : b(host.size()) {
    EXPECT_EQ(cudaMemcpy(b.p, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
    t = TensorView::contiguous(b.p, like.dtype, like.shape);
  }
};

std::vector<double> download(const Buf& b, DType dt, std::array<int64_t, 4> s) {
  const int es = spattn::dtype_size(dt);
  const size_t n = size_t(s[0] * s[1] * s[2] * s[3]);
  std::vector<uint8_t> h(n * es);
  EXPECT_EQ(cudaMemcpy(h.data(), b.p, h.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  const TensorView t = TensorView::contiguous(h.data(), dt, s);
  std::vector<double> out(n);
  size_t i = 0;
  for_each_index(s, [&](int64_t a, int64_t l, int64_t c, int64_t d) { out[i++] = t.load(a, l, c, d); });
  return out;
}

// Element-wise comparison: `missing` (reference NaN, GPU not), `spread` (GPU NaN, reference not), the relative
// (Frobenius) error over elements finite in both, and elements infinite in one and not identical in the other.
struct Cmp {
  int64_t missing = 0, spread = 0, inf_mismatch = 0, nans = 0;
  double num = 0, den = 0;
  void add(double got, double want) {
    if (std::isnan(want)) {
      ++nans;
      missing += !std::isnan(got);
      return;
    }
    if (std::isnan(got)) {
      ++spread;
      return;
    }
    if (std::isinf(want) || std::isinf(got)) {
      inf_mismatch += got != want;
      return;
    }
    num += (got - want) * (got - want), den += want * want;
  }
  double rel() const { return std::sqrt(num / std::max(den, 1e-30)); }
};

spattn::Problem problem_of(const Case& c, double scale) {
  spattn::Problem p;
  p.batch = c.B, p.q_heads = c.H, p.kv_heads = c.HK, p.q_len = c.Lq, p.kv_len = c.Lk, p.head_dim = c.D, p.dtype = c.dt;
  if (scale != 0) p.scale = scale;  // the plants' 0: the default
  return p;
}

bool kernel_ran(const Case& c, const std::string& ran) {
  return c.want_kernel.empty() || ran.rfind(c.want_kernel, 0) == 0;
}

// The forward of `c` with `plant` against the reference.
void check_forward(const Case& c, const Plant& plant, uint32_t seed) {
  SCOPED_TRACE(c.what + " | " + plant.what + " | " + c.spec + " D=" + std::to_string(c.D) + " " +
               std::string(spattn::dtype_name(c.dt)));
  const spattn::Problem p = problem_of(c, plant.scale);
  const std::vector<spattn::Pattern> pats{spattn::parse(c.spec)};
  const spattn::Plan plan = spattn::make_plan(pats, p, spattn::Device::cuda(0), c.opt);
  const Host h = make_inputs(p, c.dt, seed, plant);
  Dev q(h.q, h.tq), k(h.k, h.tk), v(h.v, h.tv);
  const std::array<int64_t, 4> so{p.batch, p.q_len, p.q_heads, p.head_dim};
  const size_t nq = size_t(so[0] * so[1] * so[2] * so[3]), nl = size_t(p.batch * p.q_heads * p.q_len);
  Buf o(nq * spattn::dtype_size(c.dt)), lse(nl * 4);
  EXPECT_EQ(cudaMemset(o.p, 0xFF, nq * spattn::dtype_size(c.dt)), cudaSuccess);  // NaN: an unwritten row fails
  EXPECT_EQ(cudaMemset(lse.p, 0xFF, nl * 4), cudaSuccess);
  plan.forward(q.t, k.t, v.t, TensorView::contiguous(o.p, c.dt, so),
               TensorView::contiguous(lse.p, DType::f32, {p.batch, p.q_heads, p.q_len, 1}));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(kernel_ran(c, plan.last_kernel())) << "ran " << plan.last_kernel() << ", want " << c.want_kernel;
  const std::vector<double> go = download(o, c.dt, so);
  std::vector<float> gl(nl);
  EXPECT_EQ(cudaMemcpy(gl.data(), lse.p, nl * 4, cudaMemcpyDeviceToHost), cudaSuccess);

  std::vector<double> ro(nq), rl(nl);
  spattn::PlanOptions ref;
  ref.engine = spattn::Engine::reference;
  spattn::make_plan(pats, p, spattn::Device::cpu(), ref)
      .forward(h.tq, h.tk, h.tv, TensorView::contiguous(ro.data(), DType::f64, so),
               TensorView::contiguous(rl.data(), DType::f64, {p.batch, p.q_heads, p.q_len, 1}));

  // The GPU kernels fold scale * log2(e) into fp32 scores: a row whose largest scaled score reaches 2^28 (log2 units)
  // is NaN on the GPU where the reference is finite (PATTERNS.md; ptx.cuh, scaled_max_lost). The reference's LSE is
  // at least that score, and exceeds it by at most log(keys): rows with |LSE| log2 e >= 2^27 must be NaN (O and LSE)
  // or the reference's, never finite and wrong; every other row must be the reference's.
  auto overflows = [&](double want) { return std::fabs(want) * 1.4426950408889634 >= 134217728.0; };
  Cmp co;
  // With a huge scale the softmax is one-hot on the row's largest score; where two keys' scores are closer than the
  // GPU's fp32 (or cuda_unfused's 16-bit S) rounding, it may pick the other: such rows are counted, a few allowed.
  int64_t scale_rows_off = 0;
  int64_t lse_nan_mismatch = 0, lse_inf_mismatch = 0, empty_bad = 0, overflow_rows = 0, overflow_bad = 0, nan_rows = 0;
  double lse_err = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t hq = 0; hq < p.q_heads; ++hq)
      for (int64_t l = 0; l < p.q_len; ++l) {
        const size_t li = size_t((b * p.q_heads + hq) * p.q_len + l);
        const double want = rl[li], got = gl[li];
        const size_t o0 = size_t(((b * p.q_len + l) * p.q_heads + hq) * p.head_dim);
        if (overflows(want)) {  // NaN row (O and LSE), or the reference's values
          ++overflow_rows;
          bool row_nan = std::isnan(got);
          for (int64_t d = 0; d < p.head_dim; ++d) row_nan = row_nan && std::isnan(go[o0 + d]);
          bool row_ok = got == float(want) || std::fabs(got - want) <= 2e-2 * std::fabs(want);  // as lse_err below
          for (int64_t d = 0; d < p.head_dim; ++d) row_ok = row_ok && std::fabs(go[o0 + d] - ro[o0 + d]) <= 1e-2 * (1 + std::fabs(ro[o0 + d]));
          overflow_bad += !(row_nan || row_ok || std::isfinite(got));  // finite LSE, O off: a tie (counted below)
          scale_rows_off += !row_nan && !row_ok;
          nan_rows += row_nan;
          continue;
        }
        if (std::isnan(want) != std::isnan(double(got))) ++lse_nan_mismatch;
        else if (want == -kInf) {
          lse_inf_mismatch += got != -INFINITY;
          for (int64_t d = 0; d < p.head_dim; ++d) empty_bad += go[o0 + d] != 0.0;  // exactly 0, never NaN
        } else if (!std::isnan(want))
          lse_err = std::max(lse_err, std::fabs(got - want) / std::max(1.0, std::fabs(want)));
        if (plant.scale != 0) {  // O is one V row (the argmax key's) or the mean of tied ones: checked row by row
          bool row_ok = true;
          for (int64_t d = 0; d < p.head_dim; ++d)
            row_ok = row_ok && std::fabs(go[o0 + d] - ro[o0 + d]) <= 1e-2 * (1 + std::fabs(ro[o0 + d]));
          scale_rows_off += !row_ok && !std::isnan(want);
        }
        for (int64_t d = 0; d < p.head_dim; ++d) co.add(go[o0 + d], ro[o0 + d]);
      }
  const double tol = c.dt == DType::bf16 ? 2e-2 : 1e-2;
  EXPECT_EQ(co.missing, 0) << "O finite where the reference's is NaN (a silent wrong answer)";
  EXPECT_EQ(lse_nan_mismatch, 0) << "LSE NaN in one and not in the other";
  EXPECT_EQ(lse_inf_mismatch, 0) << "an empty row's LSE is not -inf";
  EXPECT_EQ(empty_bad, 0) << "an empty row's O is not 0";
  EXPECT_EQ(co.inf_mismatch, 0) << "O infinite in one and not the same in the other";
  EXPECT_EQ(overflow_bad, 0) << "a row past fp32's range neither NaN nor the reference's";
  const int64_t rows = p.batch * p.q_heads * p.q_len;
  if (plant.scale == 0) EXPECT_LE(co.rel(), tol);
  else {
    EXPECT_LE(scale_rows_off, std::max<int64_t>(2, rows / 50)) << "rows off the reference's argmax key";
    if (scale_rows_off)
      std::printf("    [%s | %s] %lld of %lld rows off the reference (score ties at this scale)\n", c.what.c_str(),
                  plant.what, static_cast<long long>(scale_rows_off), static_cast<long long>(rows));
  }
  EXPECT_LE(lse_err, 2e-2);
  if (c.exact || !plant.v_only)
    EXPECT_EQ(co.spread, 0) << "O NaN where the reference's is finite";
  else if (co.spread)
    std::printf("    [%s | %s] tile spread of the V plant: %lld O elements NaN where the reference is finite\n",
                c.what.c_str(), plant.what, static_cast<long long>(co.spread));
  if (plant.scale == 0 && std::string(plant.what).rfind("NaN", 0) == 0) EXPECT_GT(co.nans, 0) << "the plant reaches no row";
  if (overflow_rows)
    std::printf("    [%s | %s] %lld rows checked as NaN or the reference's: %lld NaN\n", c.what.c_str(), plant.what,
                static_cast<long long>(overflow_rows), static_cast<long long>(nan_rows));
}

// The forward cases: every fused row this device runs, the band routes, compound plans, cuda_unfused.
std::vector<Case> forward_cases() {
  std::vector<Case> cs;
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  const bool sm90 = major == 9 && minor == 0;
  int i = 0;
  for (const auto& row : spattn::plan::kKernels) {
    if (!spattn::plan::is_gpu_fused(row.kind)) continue;
    if (spattn::plan::is_sm90(row.kind) && !sm90) continue;
    Case c;
    c.what = row.name;
    // Band rows: a band (rows 340-399 past the keys: empty); others: band, bitmask and full tiles, empty rows too.
    c.spec = spattn::plan::is_band(row.kind) ? "local(40)" : "local(40) | random(3, seed=1) & global_rows(0:64)";
    c.D = row.head_dim;
    c.dt = i++ % 2 ? DType::f16 : DType::bf16;
    c.opt.kernel = row.name;
    c.want_kernel = row.name;
    cs.push_back(c);
  }
  if (sm90) {
    for (int split : {0, 1, 2, 4}) {  // unsplit, slab parts, items in 2 and 4 parts
      Case c;
      c.what = "sm90_band_d64 split " + std::to_string(split);
      c.spec = split == 1 ? "causal" : "local(40)";
      c.B = 2, c.H = 8, c.HK = 4, c.Lq = 1000, c.Lk = 999;
      c.dt = split % 4 ? DType::f16 : DType::bf16;
      c.opt.kernel = "sm90_band_d64";
      c.opt.split = split;
      c.want_kernel = "sm90_band_d64";
      cs.push_back(c);
    }
    Case r;  // long rows: the running-max steps
    r.what = "sm90_band_rmax_d64 causal";
    r.spec = "causal";
    r.Lq = r.Lk = 777;
    r.opt.kernel = "sm90_band_rmax_d64";
    r.want_kernel = "sm90_band_rmax_d64";
    cs.push_back(r);
  }
  struct Cp {
    const char* spec;
    int64_t D;
    DType dt;
    bool exact;
  } const compound[] = {
      {"longformer(40, 8)", 64, DType::bf16, false},                     // tiles, columns, rows
      {"local(40) | random(4, seed=3)", 128, DType::f16, false},         // tiles, scattered
      {"random(9, seed=2)", 64, DType::bf16, true},                      // scattered only: kept pairs only
      {"dilated(20, 3) | global(0:5) | random(2)", 64, DType::f16, false},  // all four
      // Band and affine parts (issue 42): the affine part grouped by residue (8: groups of 50 tokens), merged into the
      // band part's rows in its epilogue, rows past Lk + s - 1 empty in the band part; 64x64 at D = 64: four CTAs an SM.
      {"sparse_strided(64)", 64, DType::bf16, false},
      {"sparse_strided(32)", 128, DType::f16, false},
  };
  for (const Cp& p : compound) {
    Case c;
    c.what = std::string("compound ") + p.spec;
    c.spec = p.spec, c.D = p.D, c.dt = p.dt, c.exact = p.exact;
    c.opt.compound = 1;
    cs.push_back(c);
  }
  struct Un {
    const char* spec;
    int64_t D;
    DType dt;
  } const unfused[] = {
      {"bigbird(32, 1, 1, 2, seed=3)", 64, DType::bf16},         // coarse blocks and fine entries
      {"random(12, seed=2) | local(3)", 64, DType::f16},         // fine only: the fused fine kernel
      {"local(40) | random(3, seed=1) & global_rows(0:64)", 128, DType::bf16},
  };
  for (const Un& u : unfused) {
    Case c;
    c.what = std::string("cuda_unfused ") + u.spec;
    c.spec = u.spec, c.D = u.D, c.dt = u.dt;
    c.opt.engine = spattn::Engine::cuda_unfused;
    cs.push_back(c);
  }
  return cs;
}

TEST(NonFiniteGpu, ForwardEveryPath) {
  REQUIRE_GPU();
  uint32_t seed = 100;
  for (const Case& c : forward_cases())
    for (const Plant& plant : plants()) {
      // cuda_unfused keeps S in the inputs' 16-bit type: at scales that make the softmax one-hot its rounding picks
      // the argmax among keys closer than it (H100: 830-1230 of 1600 rows at 1e5; PATTERNS.md). The scale plants
      // check the paths with fp32 scores.
      if (plant.scale != 0 && c.opt.engine == spattn::Engine::cuda_unfused) {
        std::printf("    [%s | %s] not run: cuda_unfused's 16-bit S (PATTERNS.md)\n", c.what.c_str(), plant.what);
        ++seed;
        continue;
      }
      check_forward(c, plant, seed++);
    }
}

// Small enough for compute-sanitizer: a few rows and plants.
TEST(NonFiniteGpu, SmallCaseForSanitizers) {
  REQUIRE_GPU();
  Case c;
  c.what = "auto";
  c.spec = "local(40) | random(3, seed=1) & global_rows(0:64)";
  c.H = 2, c.HK = 1, c.Lq = 150, c.Lk = 130;
  for (int i : {0, 3, 4}) check_forward(c, plants()[size_t(i)], 7);
  c.what = "compound", c.opt.compound = 1, c.spec = "local(8) | random(3, seed=2)";
  check_forward(c, plants()[0], 8);
}

// The backward of `c` (kernel forced) with `plant`, against reference_attention_backward: every gradient element
// the reference makes NaN is NaN, finite ones correct; spread counted (tile kernels) or refused (CSR pass).
void check_backward(const Case& c, const std::string& kernel, const Plant& plant, uint32_t seed) {
  SCOPED_TRACE(kernel + " | " + plant.what + " | " + c.spec + " D=" + std::to_string(c.D) + " " +
               std::string(spattn::dtype_name(c.dt)));
  const spattn::Problem p = problem_of(c, 0);
  std::vector<spattn::Pattern> pats{spattn::parse(c.spec)};
  std::vector<spattn::BoundPattern> bound{pats[0].bind(c.Lq, c.Lk)};
  spattn::PlanOptions o = c.opt;
  o.backward_kernel = kernel;
  const spattn::Plan plan = spattn::make_plan(pats, p, spattn::Device::cuda(0), o);
  const Host h = make_inputs(p, c.dt, seed, plant);
  Dev q(h.q, h.tq), k(h.k, h.tk), v(h.v, h.tv), dout(h.dout, h.tdo);
  const int es = spattn::dtype_size(c.dt);
  const std::array<int64_t, 4> sq{p.batch, p.q_len, p.q_heads, p.head_dim}, sk{p.batch, p.kv_len, p.kv_heads, p.head_dim};
  const size_t nq = size_t(sq[0] * sq[1] * sq[2] * sq[3]), nk = size_t(sk[0] * sk[1] * sk[2] * sk[3]);
  Buf ob(nq * es), lse(size_t(p.batch * p.q_heads * p.q_len) * 4), gq(nq * es), gk(nk * es), gv(nk * es);
  for (const Buf* g : {&gq, &gk, &gv}) EXPECT_EQ(cudaMemset(g->p, 0x7f, g == &gq ? nq * es : nk * es), cudaSuccess);
  const TensorView tl = TensorView::contiguous(lse.p, DType::f32, {p.batch, p.q_heads, p.q_len, 1});
  const TensorView to = TensorView::contiguous(ob.p, c.dt, sq);
  // The CSR pass walks only kept pairs, so it must spread nothing; but O from a tile forward can already carry a V
  // NaN into rows of its tile that do not keep the key (PATTERNS.md), and delta = rowsum(dO * O) takes it into dq and
  // dk. So it runs on the reference's O and LSE, which tests the pass itself; the tile rows take their own forward's.
  const bool csr = kernel == "cuda_csr_bwd";
  if (csr) {
    std::vector<double> ro(nq), rl(size_t(p.batch * p.q_heads * p.q_len));
    spattn::PlanOptions ref;
    ref.engine = spattn::Engine::reference;
    spattn::make_plan(pats, p, spattn::Device::cpu(), ref)
        .forward(h.tq, h.tk, h.tv, TensorView::contiguous(ro.data(), DType::f64, sq),
                 TensorView::contiguous(rl.data(), DType::f64, {p.batch, p.q_heads, p.q_len, 1}));
    std::vector<uint8_t> oh(nq * es);
    const TensorView ot = TensorView::contiguous(oh.data(), c.dt, sq);
    size_t i = 0;
    for_each_index(sq, [&](int64_t a, int64_t l, int64_t hh, int64_t d) { ot.store(a, l, hh, d, ro[i++]); });
    const std::vector<float> lf(rl.begin(), rl.end());
    EXPECT_EQ(cudaMemcpy(ob.p, oh.data(), oh.size(), cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(lse.p, lf.data(), lf.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  } else {
    plan.forward(q.t, k.t, v.t, to, tl);
  }
  plan.backward(q.t, k.t, v.t, to, tl, dout.t, TensorView::contiguous(gq.p, c.dt, sq),
                TensorView::contiguous(gk.p, c.dt, sk), TensorView::contiguous(gv.p, c.dt, sk));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::string ran = plan.last_backward_kernel();
  EXPECT_EQ(ran.rfind(kernel, 0), 0u) << ran;
  EXPECT_NE(ran.find(c.want_kernel), std::string::npos) << ran;
  std::vector<double> rq(nq), rk(nk), rv(nk);
  spattn::cpu::reference_attention_backward(bound, p, h.tq, h.tk, h.tv, h.tdo,
                                            TensorView::contiguous(rq.data(), DType::f64, sq),
                                            TensorView::contiguous(rk.data(), DType::f64, sk),
                                            TensorView::contiguous(rv.data(), DType::f64, sk));
  const bool exact = csr || c.exact;
  const double tol = c.dt == DType::bf16 ? 2e-2 : 1e-2;
  int64_t nans = 0;
  const char* names[] = {"dq", "dk", "dv"};
  const std::vector<double>* want[] = {&rq, &rk, &rv};
  const Buf* got[] = {&gq, &gk, &gv};
  for (int t = 0; t < 3; ++t) {
    const std::vector<double> g = download(*got[t], c.dt, t == 0 ? sq : sk);
    Cmp cmp;
    for (size_t i = 0; i < g.size(); ++i) cmp.add(g[i], (*want[t])[i]);
    nans += cmp.nans;
    EXPECT_EQ(cmp.missing, 0) << names[t] << " finite where the reference's is NaN";
    EXPECT_EQ(cmp.inf_mismatch, 0) << names[t];
    EXPECT_LE(cmp.rel(), tol) << names[t];
    if (exact)
      EXPECT_EQ(cmp.spread, 0) << names[t] << " NaN where the reference's is finite";
    else if (cmp.spread)
      std::printf("    [%s | %s] tile spread: %lld %s elements NaN where the reference is finite\n", kernel.c_str(),
                  plant.what, static_cast<long long>(cmp.spread), names[t]);
  }
  EXPECT_GT(nans, 0) << "the plant poisons no gradient";
}

// The backward's plants: NaN in a key, beside empty rows, in a query row, in V, in a dO row.
const std::vector<Plant>& backward_plants() {
  static const std::vector<Plant> p = {
      plants()[0], plants()[1], plants()[3], plants()[4],
      {"NaN in dO of row 30 (head 0)", [](auto&, auto&, auto&, auto& d) { d.store(0, 30, 0, 2, kNaN); }},
  };
  return p;
}

TEST(NonFiniteGpu, BackwardEveryKernel) {
  REQUIRE_GPU();
  const std::vector<Plant>& bwd_plants = backward_plants();
  struct B {
    const char* spec;
    int64_t D;
    DType dt;
  } const cases[] = {
      {"local(40)", 64, DType::bf16},
      {"local(40) | random(3, seed=1) & global_rows(0:64)", 128, DType::f16},
  };
  std::vector<std::string> kernels = {"cuda_csr_bwd"};
  if (on_sm90a()) kernels.push_back("sm90_bwd");
  uint32_t seed = 500;
  for (const std::string& kernel : kernels)
    for (const B& b : cases)
      for (const Plant& plant : bwd_plants) {
        Case c;
        c.spec = b.spec, c.D = b.D, c.dt = b.dt;
        check_backward(c, kernel, plant, seed++);
      }
}

// Compound plans' backward by parts (issue 39): the scattered part on its rows kernels (cuda_scattered_bwd) alone
// (walks kept pairs only, forward and backward: no spread allowed) and after a tiles part (the tile part may spread,
// as above, and is counted); the plants as for the kernels above.
TEST(NonFiniteGpu, BackwardByParts) {
  REQUIRE_GPU();
  struct B {
    const char* spec;
    int64_t D;
    DType dt;
    bool exact;
    const char* want;
  } const cases[] = {
      {"random(9, seed=2)", 64, DType::bf16, true, "parts(cuda_scattered_bwd)"},
      {"local(40) | random(3, seed=1)", 128, DType::f16, false, "+cuda_scattered_bwd)"},
  };
  uint32_t seed = 700;
  for (const B& b : cases)
    for (const Plant& plant : backward_plants()) {
      Case c;
      c.spec = b.spec, c.D = b.D, c.dt = b.dt, c.exact = b.exact;
      c.opt.compound = 1;
      c.want_kernel = b.want;
      check_backward(c, "", plant, seed++);
    }
}

}  // namespace
