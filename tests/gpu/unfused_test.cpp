// Multigrain kernels (SDDMM coarse/fine, compound softmax, SpMM coarse/fine, unfused attention) against the
// fp64 CPU reference, on fresh random inputs, for every suite pattern at awkward sizes. Each test names the
// failure it guards against. GPU tests skip themselves, with the reason, where no GPU is usable.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpu/require_gpu.hpp"
#include "cuda/unfused/unfused.hpp"
#include "spattn/reference.hpp"

namespace mg = spattn::unfused;
using spattn::BoundPattern;
using spattn::DType;
using spattn::Pattern;
using spattn::Problem;
using spattn::TensorView;

namespace {

void ck(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

struct Dev {
  void* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t bytes) : n(bytes) {
    if (bytes) EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
  }
  ~Dev() {
    if (p) cudaFree(p);
  }
  void poison() { if (n) EXPECT_EQ(cudaMemset(p, 0xff, n), cudaSuccess); }  // NaN in every float type
  std::vector<char> host() const {
    std::vector<char> h(n);
    if (n) EXPECT_EQ(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

double elem(const std::vector<char>& b, DType t, int64_t i) {
  if (t == DType::f32) {
    float f;
    std::memcpy(&f, &b[size_t(i) * 4], 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, &b[size_t(i) * 2], 2);
  return t == DType::bf16 ? spattn::bf16_to_float(h) : spattn::half_to_float(h);
}

std::vector<char> random_bytes(int64_t n, DType t, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  const int es = spattn::dtype_size(t);
  std::vector<char> b(size_t(n) * es);
  for (int64_t i = 0; i < n; ++i) {
    const float x = nd(rng);
    if (t == DType::f32) std::memcpy(&b[size_t(i) * 4], &x, 4);
    else {
      const uint16_t h = t == DType::bf16 ? spattn::float_to_bf16(x) : spattn::float_to_half(x);
      std::memcpy(&b[size_t(i) * 2], &h, 2);
    }
  }
  return b;
}

// The suite of docs/BENCHMARKS.md at a length that is not a multiple of any block size.
std::vector<std::pair<std::string, std::string>> suite(int64_t L) {
  std::string na2d = L == 799 ? "neighborhood(dims=(17,47), kernel=13)" : L == 1023 ? "neighborhood(dims=(31,33), kernel=13)"
                                                                                     : "neighborhood(kernel=13)";
  return {{"local", "local(256)"},
          {"longformer", "longformer(256, 32)"},
          {"bigbird", "bigbird(64, 1, 2, 3, seed=0)"},
          {"dilated", "dilated(256, 2)"},
          {"fixed", "sparse_fixed(128)"},
          {"random", "random(" + std::to_string((L + 19) / 20) + ", seed=0)"},
          {"na2d", na2d},
          {"causal", "causal"},
          // rows outside 10:300 are fully masked: O = 0, LSE = -inf, never NaN
          {"empty_rows", "local(3) & global_rows(10:300)"}};
}

// ---- the split (host only, no GPU needed) --------------------------------------------------------------

// Guards: a kept (q, k) lost or computed twice by the coarse/fine split; masks with stray bits.
TEST(MultigrainSplit, CoversThePatternExactlyOnce) {
  for (int64_t L : {799, 1023})
    for (const auto& [name, spec] : suite(L))
      for (int block : {32, 64})
        for (auto mode : {mg::Options::Split::automatic, mg::Options::Split::all_coarse, mg::Options::Split::all_fine}) {
          const BoundPattern bp = Pattern::parse(spec).bind(L);
          mg::Options o;
          o.block = block;
          o.split = mode;
          const mg::Split s = mg::split_pattern(bp, o, DType::bf16);
          const auto& C = s.coarse;
          std::vector<uint8_t> seen(size_t(L * L), 0);
          const int64_t wpm = int64_t(block) * block / 64;
          for (int64_t br = 0; br < C.block_rows; ++br)
            for (int64_t i = C.row_offsets[size_t(br)]; i < C.row_offsets[size_t(br) + 1]; ++i)
              for (int r = 0; r < block; ++r)
                for (int c = 0; c < block; ++c) {
                  const int64_t q = br * block + r, k = int64_t(C.col_indices[size_t(i)]) * block + c;
                  const int64_t mi = C.mask_index[size_t(i)];
                  const int64_t bit = int64_t(r) * block + c;
                  const bool on = mi < 0 ? (q < L && k < L) : ((C.masks[size_t(mi * wpm + bit / 64)] >> (bit % 64)) & 1);
                  if (!on) continue;
                  ASSERT_TRUE(q < L && k < L) << name << ": mask bit past the edge";
                  seen[size_t(q * L + k)]++;
                }
          for (int64_t q = 0; q < L; ++q)
            for (int64_t i = s.fine.row_offsets[size_t(q)]; i < s.fine.row_offsets[size_t(q) + 1]; ++i)
              seen[size_t(q * L + s.fine.col_indices[size_t(i)])]++;
          int64_t bad = 0;
          for (int64_t q = 0; q < L; ++q)
            for (int64_t k = 0; k < L; ++k) bad += seen[size_t(q * L + k)] != (bp.contains(q, k) ? 1 : 0);
          EXPECT_EQ(bad, 0) << name << " L=" << L << " block " << block << " mode " << int(mode);
          EXPECT_EQ(s.nnz, bp.nnz()) << name;
        }
}

// ---- the kernels ---------------------------------------------------------------------------------------

struct Config {
  std::string name, spec;
  int64_t L, B, Hq, Hkv, D;
  DType dtype;
  int block;
  mg::Options::Split split;
};

struct Result {
  double o_err = 0, s_err = 0, spmm_err = 0, lse_err = 0, psum_err = 0;
  int64_t unwritten = 0, masked_bad = 0;
};

// Runs SDDMM, softmax, SpMM one by one and the whole attention, checks everything against fp64.
Result run_and_check(const Config& c) {
  Result res;
  Problem pr;
  pr.batch = c.B;
  pr.q_heads = c.Hq;
  pr.kv_heads = c.Hkv;
  pr.q_len = pr.kv_len = c.L;
  pr.head_dim = c.D;
  pr.dtype = c.dtype;
  const BoundPattern bp = Pattern::parse(c.spec).bind(c.L);
  mg::Options opt;
  opt.block = c.block;
  opt.split = c.split;
  const mg::UnfusedPlan plan = mg::UnfusedPlan::build(bp, pr, opt);
  const mg::Split& sp = plan.split();
  const int es = spattn::dtype_size(c.dtype);
  const int64_t nb = c.B * c.Hq, L = c.L, D = c.D;
  std::mt19937_64 rng(std::random_device{}());  // fresh inputs every run
  const auto hq = random_bytes(c.B * L * c.Hq * D, c.dtype, rng), hk = random_bytes(c.B * L * c.Hkv * D, c.dtype, rng),
             hv = random_bytes(c.B * L * c.Hkv * D, c.dtype, rng);
  Dev q(hq.size()), k(hk.size()), v(hv.size()), o(size_t(c.B * L * c.Hq * D) * es), lse(size_t(nb * L) * 4);
  cudaMemcpy(q.p, hq.data(), hq.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(k.p, hk.data(), hk.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(v.p, hv.data(), hv.size(), cudaMemcpyHostToDevice);
  const TensorView Q = TensorView::contiguous(q.p, c.dtype, {c.B, L, c.Hq, D});
  const TensorView K = TensorView::contiguous(k.p, c.dtype, {c.B, L, c.Hkv, D});
  const TensorView V = TensorView::contiguous(v.p, c.dtype, {c.B, L, c.Hkv, D});
  const TensorView O = TensorView::contiguous(o.p, c.dtype, {c.B, L, c.Hq, D});
  const int64_t ce = plan.coarse_elems_per_head(), fe = plan.fine_elems_per_head();
  Dev sc(size_t(nb * ce) * es), sf(size_t(nb * fe) * es), pc(size_t(nb * ce) * es), pf(size_t(nb * fe) * es),
      ws(size_t(plan.attention_workspace_size(true)));
  const int64_t group = c.Hq / c.Hkv;
  auto qat = [&](int64_t b, int64_t i, int64_t h, int64_t d) { return elem(hq, c.dtype, ((b * L + i) * c.Hq + h) * D + d); };
  auto kat = [&](int64_t b, int64_t i, int64_t h, int64_t d) { return elem(hk, c.dtype, ((b * L + i) * c.Hkv + h / group) * D + d); };
  auto vat = [&](int64_t b, int64_t i, int64_t h, int64_t d) { return elem(hv, c.dtype, ((b * L + i) * c.Hkv + h / group) * D + d); };
  const int bs = sp.block;
  const int64_t bb = int64_t(bs) * bs, wpm = bb / 64;
  // Visits every stored entry of row qi: f(kept, key, coarse index or -1, fine index or -1).
  auto for_row = [&](int64_t qi, auto&& f) {
    if (plan.has_coarse()) {
      const int64_t br = qi / bs, r = qi % bs;
      for (int64_t blk = sp.coarse.row_offsets[size_t(br)]; blk < sp.coarse.row_offsets[size_t(br) + 1]; ++blk) {
        const int64_t mi = sp.coarse.mask_index[size_t(blk)], kc = sp.coarse.col_indices[size_t(blk)];
        for (int64_t cc = 0; cc < bs; ++cc) {
          const int64_t bit = r * bs + cc, key = kc * bs + cc;
          const bool kept = key < L && (mi < 0 || ((sp.coarse.masks[size_t(mi * wpm + bit / 64)] >> (bit % 64)) & 1));
          f(kept, key, blk * bb + bit, int64_t(-1));
        }
      }
    }
    for (int64_t i = sp.fine.row_offsets[size_t(qi)]; i < sp.fine.row_offsets[size_t(qi) + 1]; ++i)
      f(true, int64_t(sp.fine.col_indices[size_t(i)]), int64_t(-1), i);
  };

  // SDDMM alone: S == Q K^T (unscaled) on kept entries, 0 on masked ones, every entry written.
  sc.poison();
  sf.poison();
  plan.sddmm(Q, K, {sc.p, sf.p}, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  {
    const auto hsc = sc.host(), hsf = sf.host();
    double num = 0, den = 0;
    for (int64_t bh = 0; bh < nb; ++bh) {
      const int64_t b = bh / c.Hq, h = bh % c.Hq;
      if (plan.has_coarse())  // the padding rows of the last block row too
        for (int64_t i = 0; i < ce; ++i) res.unwritten += std::isnan(elem(hsc, c.dtype, bh * ce + i));
      for (int64_t qi = 0; qi < L; ++qi)
        for_row(qi, [&](bool kept, int64_t key, int64_t ci, int64_t fi) {
          const double got = ci >= 0 ? elem(hsc, c.dtype, bh * ce + ci) : elem(hsf, c.dtype, bh * fe + fi);
          if (std::isnan(got)) ++res.unwritten;
          double ref = 0;
          if (kept)
            for (int64_t d = 0; d < D; ++d) ref += qat(b, qi, h, d) * kat(b, key, h, d);
          else if (got != 0)
            ++res.masked_bad;
          num += (got - ref) * (got - ref);
          den += ref * ref;
        });
    }
    res.s_err = std::sqrt(num / std::max(den, 1e-300));
  }

  // Softmax alone: P rows sum to 1 (0 for an empty row), masked P == 0.
  pc.poison();
  pf.poison();
  lse.poison();
  plan.softmax({sc.p, sf.p}, {pc.p, pf.p}, static_cast<float*>(lse.p), nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // P on the host: every entry written, rows sum to 1 (0 for an empty row), masked P == 0.
  auto check_p = [&](const std::vector<char>& hpc, const std::vector<char>& hpf) {
    for (int64_t bh = 0; bh < nb; ++bh) {
      if (plan.has_coarse())
        for (int64_t i = 0; i < ce; ++i) res.unwritten += std::isnan(elem(hpc, c.dtype, bh * ce + i));
      for (int64_t qi = 0; qi < L; ++qi) {
        double sum = 0;
        int64_t n = 0;
        for_row(qi, [&](bool kept, int64_t, int64_t ci, int64_t fi) {
          const double p = ci >= 0 ? elem(hpc, c.dtype, bh * ce + ci) : elem(hpf, c.dtype, bh * fe + fi);
          if (std::isnan(p)) ++res.unwritten;
          if (!kept && p != 0) ++res.masked_bad;
          if (kept) sum += p, ++n;
        });
        res.psum_err = std::max(res.psum_err, std::abs(sum - (n ? 1.0 : 0.0)));
      }
    }
  };
  const auto hpc = pc.host(), hpf = pf.host();
  check_p(hpc, hpf);

  // SpMM alone on that P: O == P V in fp64 from the same P.
  o.poison();
  plan.spmm({pc.p, pf.p}, V, O, static_cast<char*>(ws.p) + (plan.attention_workspace_size(true) - plan.spmm_workspace_size()),
            nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  {
    const auto ho = o.host();
    double num = 0, den = 0;
    std::vector<double> acc(static_cast<size_t>(D));
    for (int64_t bh = 0; bh < nb; ++bh) {
      const int64_t b = bh / c.Hq, h = bh % c.Hq;
      for (int64_t qi = 0; qi < L; ++qi) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for_row(qi, [&](bool kept, int64_t key, int64_t ci, int64_t fi) {
          if (!kept) return;
          const double p = ci >= 0 ? elem(hpc, c.dtype, bh * ce + ci) : elem(hpf, c.dtype, bh * fe + fi);
          for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += p * vat(b, key, h, d);
        });
        for (int64_t d = 0; d < D; ++d) {
          const double got = elem(ho, c.dtype, ((b * L + qi) * c.Hq + h) * D + d);
          if (std::isnan(got)) ++res.unwritten;
          num += (got - acc[size_t(d)]) * (got - acc[size_t(d)]);
          den += acc[size_t(d)] * acc[size_t(d)];
        }
      }
    }
    res.spmm_err = std::sqrt(num / std::max(den, 1e-300));
  }

  // The whole attention (P requested) vs cpu::reference_attention: O and LSE.
  o.poison();
  lse.poison();
  pc.poison();
  pf.poison();
  plan.attention(Q, K, V, O, static_cast<float*>(lse.p), {pc.p, pf.p}, ws.p, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  {
    std::vector<double> ro(size_t(c.B * L * c.Hq * D)), rl(size_t(nb * L));
    const TensorView hQ{const_cast<char*>(hq.data()), c.dtype, {c.B, L, c.Hq, D}, Q.stride};
    const TensorView hK{const_cast<char*>(hk.data()), c.dtype, {c.B, L, c.Hkv, D}, K.stride};
    const TensorView hV{const_cast<char*>(hv.data()), c.dtype, {c.B, L, c.Hkv, D}, V.stride};
    spattn::cpu::reference_attention({bp}, pr, hQ, hK, hV, TensorView::contiguous(ro.data(), DType::f64, {c.B, L, c.Hq, D}),
                                     TensorView::contiguous(rl.data(), DType::f64, {c.B, c.Hq, L, 1}));
    // O and LSE as they are now on the device vs the reference.
    auto check_o_lse = [&] {
      const auto ho = o.host(), hl = lse.host();
      double num = 0, den = 0;
      for (size_t i = 0; i < ro.size(); ++i) {
        const double got = elem(ho, c.dtype, int64_t(i));
        if (std::isnan(got)) ++res.unwritten;
        num += (got - ro[i]) * (got - ro[i]);
        den += ro[i] * ro[i];
      }
      res.o_err = std::max(res.o_err, std::sqrt(num / std::max(den, 1e-300)));
      for (size_t i = 0; i < rl.size(); ++i) {
        const double got = elem(hl, DType::f32, int64_t(i));
        if (std::isnan(got)) ++res.unwritten;
        if (std::isinf(rl[i])) {
          if (!(std::isinf(got) && got < 0)) ++res.masked_bad;
        } else {
          res.lse_err = std::max(res.lse_err, std::abs(got - rl[i]) / std::max(1.0, std::abs(rl[i])));
        }
      }
    };
    check_o_lse();
    // The P that attention() wrote.
    check_p(pc.host(), pf.host());
    // Again without P (a fine-only tensor-core plan with D == Dv in {64, 128} runs the fused kernel then):
    // O and LSE vs the same reference.
    Dev ws2(size_t(plan.attention_workspace_size(false)));
    ws2.poison();
    o.poison();
    lse.poison();
    plan.attention(Q, K, V, O, static_cast<float*>(lse.p), {}, ws2.p, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    check_o_lse();
    // Where that was the fused kernel: the split SDDMM -> SpMM pipeline without P too.
    if (plan.has_fine() && plan.attention_workspace_size(false) == 0) {
      mg::Options o2 = opt;
      o2.fused_fine_attention = false;
      const mg::UnfusedPlan plan2 = mg::UnfusedPlan::build(bp, pr, o2);
      Dev ws3(size_t(plan2.attention_workspace_size(false)));
      ws3.poison();
      o.poison();
      lse.poison();
      plan2.attention(Q, K, V, O, static_cast<float*>(lse.p), {}, ws3.p, nullptr);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      check_o_lse();
    }
  }
  return res;
}

void expect_ok(const Config& c) {
  SCOPED_TRACE(c.name + " [" + c.spec + "] L=" + std::to_string(c.L) + " B=" + std::to_string(c.B) + " Hq=" +
               std::to_string(c.Hq) + " Hkv=" + std::to_string(c.Hkv) + " D=" + std::to_string(c.D) + " " +
               std::string(spattn::dtype_name(c.dtype)) + " block " + std::to_string(c.block) + " split " +
               std::to_string(int(c.split)));
  const Result r = run_and_check(c);
  const double tol = c.dtype == DType::f32 ? 1e-4 : 1e-2;
  EXPECT_EQ(r.unwritten, 0) << "outputs left poisoned";
  EXPECT_EQ(r.masked_bad, 0) << "masked entries not 0 / empty rows without LSE = -inf";
  EXPECT_LE(r.s_err, c.dtype == DType::f32 ? 1e-5 : 5e-3) << "SDDMM (fp32 accumulation, rounded once to the input dtype)";
  EXPECT_LE(r.psum_err, c.dtype == DType::f32 ? 1e-4 : 2e-2) << "rows of P must sum to 1";
  EXPECT_LE(r.spmm_err, tol) << "SpMM";
  EXPECT_LE(r.o_err, tol) << "attention O";
  EXPECT_LE(r.lse_err, c.dtype == DType::f32 ? 1e-5 : 1e-2) << "attention LSE (S rounded to the input dtype)";
}

// Small enough for compute-sanitizer (memcheck, racecheck): both parts (fine entries in the coarse SpMM's
// epilogue), a fine-only tensor-core plan (random), block 32 tiles
// with masks, and the fp32 fine path. Guards: out-of-bounds accesses at the edges, shared-memory races in the
// cp.async double buffers.
TEST(MultigrainGpu, SmallCaseForSanitizers) {
  REQUIRE_GPU();
  expect_ok({"mixed", "sparse_fixed(32) | random(5, seed=1)", 150, 1, 2, 1, 64, DType::bf16, 64, mg::Options::Split::automatic});
  expect_ok({"masked32", "dilated(20, 3) | global(0:2)", 150, 1, 2, 2, 64, DType::f16, 32, mg::Options::Split::all_coarse});
  expect_ok({"fine32", "local(9) | global_cols(3)", 150, 1, 2, 2, 32, DType::f32, 64, mg::Options::Split::automatic});
  expect_ok({"finetc", "random(12, seed=2) | local(3)", 150, 1, 2, 1, 64, DType::f16, 64, mg::Options::Split::all_fine});
}

// Guards: wrong tiles, masks, edges (799, 1023 are no multiple of 32/64), the split's two streams, the merge.
TEST(MultigrainGpu, EverySuitePatternAutomaticSplitBf16) {
  REQUIRE_GPU();
  for (int64_t L : {799, 1023})
    for (const auto& [name, spec] : suite(L))
      expect_ok({name, spec, L, L == 799 ? 1 : 2, 2, 2, 64, DType::bf16, 64, mg::Options::Split::automatic});
}

// Guards: the coarse kernels alone (every block on tensor cores, masks everywhere) and the fine ones alone.
TEST(MultigrainGpu, ForcedCoarseAndForcedFine) {
  REQUIRE_GPU();
  for (const auto& [name, spec] : suite(799)) {
    expect_ok({name, spec, 799, 1, 2, 1, 64, DType::bf16, 64, mg::Options::Split::all_coarse});
    expect_ok({name, spec, 799, 1, 2, 1, 64, DType::bf16, 32, mg::Options::Split::all_fine});
  }
}

// Guards: block 32 tiles, fp16 mma, fp32 (fine only), GQA head mapping, D = 128 and D = 32.
TEST(MultigrainGpu, BlockDtypeHeadDimVariants) {
  REQUIRE_GPU();
  expect_ok({"longformer", "longformer(100, 7)", 1023, 1, 4, 2, 64, DType::bf16, 32, mg::Options::Split::automatic});
  expect_ok({"dilated", "dilated(64, 3) | global(0:5)", 799, 2, 2, 1, 128, DType::f16, 64, mg::Options::Split::automatic});
  expect_ok({"bigbird", "bigbird(32, 1, 1, 2, seed=3)", 799, 1, 2, 2, 32, DType::f16, 32, mg::Options::Split::all_coarse});
  expect_ok({"random", "random(40, seed=5) | local(10)", 799, 1, 4, 1, 64, DType::f32, 64, mg::Options::Split::automatic});
  expect_ok({"finetc128", "random(40, seed=6)", 799, 2, 2, 2, 128, DType::bf16, 32, mg::Options::Split::all_fine});
  expect_ok({"finetc32", "random(30, seed=7) | local(5)", 333, 1, 3, 1, 32, DType::bf16, 64, mg::Options::Split::automatic});
}

// Guards: a strided view (packed QKV) read with the wrong strides.
TEST(MultigrainGpu, StridedPackedQkv) {
  REQUIRE_GPU();
  const int64_t B = 1, L = 333, H = 2, D = 64;
  Problem pr;
  pr.batch = B;
  pr.q_heads = pr.kv_heads = H;
  pr.q_len = pr.kv_len = L;
  pr.head_dim = D;
  pr.dtype = DType::bf16;
  const BoundPattern bp = Pattern::parse("local(40) | global(0:3)").bind(L);
  const mg::UnfusedPlan plan = mg::UnfusedPlan::build(bp, pr);
  std::mt19937_64 rng(11);
  const auto hqkv = random_bytes(B * L * 3 * H * D, DType::bf16, rng);
  Dev qkv(hqkv.size()), o(size_t(B * L * H * D) * 2), ws(size_t(plan.attention_workspace_size(false)));
  cudaMemcpy(qkv.p, hqkv.data(), hqkv.size(), cudaMemcpyHostToDevice);
  const std::array<int64_t, 4> st{L * 3 * H * D, 3 * H * D, D, 1};
  auto view = [&](void* base, int part) {
    return TensorView{static_cast<char*>(base) + part * H * D * 2, DType::bf16, {B, L, H, D}, st};
  };
  o.poison();
  plan.attention(view(qkv.p, 0), view(qkv.p, 1), view(qkv.p, 2), TensorView::contiguous(o.p, DType::bf16, {B, L, H, D}),
                 nullptr, {}, ws.p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<double> ro(size_t(B * L * H * D));
  void* hbase = const_cast<char*>(hqkv.data());
  spattn::cpu::reference_attention({bp}, pr, view(hbase, 0), view(hbase, 1), view(hbase, 2),
                                   TensorView::contiguous(ro.data(), DType::f64, {B, L, H, D}), TensorView{});
  const auto ho = o.host();
  double num = 0, den = 0;
  for (size_t i = 0; i < ro.size(); ++i) {
    const double g = elem(ho, DType::bf16, int64_t(i));
    num += (g - ro[i]) * (g - ro[i]);
    den += ro[i] * ro[i];
  }
  EXPECT_LE(std::sqrt(num / den), 1e-2);
}

// Guards: bad input must give spattn::Error naming the value, never a crash.
TEST(MultigrainGpu, BadInputNamesTheValue) {
  REQUIRE_GPU();
  Problem pr;
  pr.q_len = pr.kv_len = 100;
  pr.head_dim = 64;
  pr.dtype = DType::bf16;
  const BoundPattern bp = Pattern::parse("local(8)").bind(100);
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const spattn::Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  mg::Options bad_block;
  bad_block.block = 48;
  EXPECT_NE(message([&] { mg::UnfusedPlan::build(bp, pr, bad_block); }).find("48"), std::string::npos);
  Problem bad_dim = pr;
  bad_dim.head_dim = 72;  // multiple of 8, not of 16: refused for the coarse part
  EXPECT_NE(message([&] { mg::UnfusedPlan::build(bp, bad_dim); }).find("72"), std::string::npos);
  Problem f64 = pr;
  f64.dtype = DType::f64;
  EXPECT_NE(message([&] { mg::UnfusedPlan::build(bp, f64); }).find("f64"), std::string::npos);
  EXPECT_NE(message([&] { mg::UnfusedPlan::build(Pattern::parse("local(8)").bind(99), pr); }).find("99"), std::string::npos);
  const mg::UnfusedPlan plan = mg::UnfusedPlan::build(bp, pr);
  Dev buf(1 << 20);
  const TensorView good = TensorView::contiguous(buf.p, DType::bf16, {1, 100, 1, 64});
  const TensorView wrong_len = TensorView::contiguous(buf.p, DType::bf16, {1, 101, 1, 64});
  const TensorView wrong_type = TensorView::contiguous(buf.p, DType::f16, {1, 100, 1, 64});
  EXPECT_NE(message([&] { plan.sddmm(wrong_len, good, {buf.p, buf.p}, nullptr); }).find("101"), std::string::npos);
  EXPECT_NE(message([&] { plan.sddmm(good, wrong_type, {buf.p, buf.p}, nullptr); }).find("f16"), std::string::npos);
  EXPECT_NE(message([&] { plan.attention(good, good, good, good, nullptr, {}, nullptr, nullptr); }).find("workspace"),
            std::string::npos);
  TensorView misaligned = good;
  misaligned.data = static_cast<char*>(buf.p) + 2;
  EXPECT_NE(message([&] { plan.sddmm(misaligned, good, {buf.p, buf.p}, nullptr); }).find("aligned"), std::string::npos);
}

}  // namespace
