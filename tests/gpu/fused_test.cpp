// tests/gpu/fused_test.cpp — the fused block-sparse attention kernel against the CPU reference (fp64,
// straight from pattern.contains, sharing no code with the plan or the kernel).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gpu/require_gpu.hpp"
#include "plan/gpu/block_plan.hpp"
#include "cuda/fused/fused_attention.hpp"
#include "plan/analysis.hpp"
#include "plan/kernels.hpp"
#include "spattn/reference.hpp"

namespace {

using spattn::DType;
using spattn::TensorView;

struct Case {
  const char* what;  // the failure it guards against
  std::string spec;
  int64_t B, Hq, Hkv, Lq, Lk, D;
  DType dtype;
  int block = 0;  // 0: planner's choice; 64 or 128: forced square tiles
  bool sm80 = false;
  int perm_d = -1;
  int block_n = 0;  // 0: same as block
  bool no_tma = false;  // sm_90a: keep the cp.async kernels where the warp-specialized TMA kernel applies
  bool packed = false;  // q, k, v as strided views of one [B, L, 3, H, D] buffer (needs Lq == Lk, Hq == Hkv)
  int persistent = -1;  // TMA kernel: 1 persistent CTAs, 0 one work item a CTA, -1 chosen
  int band = -1;        // band-row plans: 1 the band kernel (checked to run on sm_90a), 0 never, -1 chosen
  int split = -1;       // band kernel: -1 chosen split, 0 never, 1 the last items as slabs, 2-4 the last items in that many parts
  bool rising = false;  // scores that rise along the keys (q[..., 0] = 32, k[j, 0] = (j % 256) / 16, k[j, 0] = 40 at
                        // j % 700 == 699): row maxima that grow step after step, and jump by more than 128 log2 units
  int running_max = -1;  // band kernel: -1 chosen, 1 running-max steps (checked to run on sm_90a), 0 never
  int draw = -1;         // random patterns: -1 chosen (not checked), 1 chosen and checked to draw the bitmasks on the
                         // device, 0 drawn on the host (checked)
  bool tma128 = false;  // checked to run the TMA kernel at head dim 128 (its lazy-rescale loop) on sm_90a
  bool tma = false;  // checked to run the TMA kernel (sm90_tma: its bulk-copy epilogue where o has a tensor map)
  int o_pad = 0;     // elements added to o's token stride: 2 gives rows that are not 16-byte multiples apart (no
                     // tensor map of o), checked to run the row without one: the cp.async kernel of a 128-row plan,
                     // the TMA kernel's threads' stores on 192-row tiles (sm_90a)
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << c.what << " [" << c.spec << " B" << c.B << " H" << c.Hq << "/" << c.Hkv << " L" << c.Lq << "x" << c.Lk
            << " D" << c.D << " " << spattn::dtype_name(c.dtype) << " block " << c.block << "x" << c.block_n
            << (c.sm80 ? " sm80" : "") << (c.no_tma ? " no-tma" : "") << (c.packed ? " packed" : "") << (c.persistent >= 0 ? (c.persistent ? " persistent" : " item-per-CTA") : "")
            << (c.band >= 0 ? (c.band ? " band" : " no-band") : "") << (c.split >= 0 ? " split " + std::to_string(c.split) : "")
            << (c.rising ? " rising scores" : "") << (c.running_max >= 0 ? (c.running_max ? " rmax" : " no-rmax") : "")
            << (c.draw >= 0 ? (c.draw ? " device-drawn" : " host-drawn") : "") << (c.tma ? " TMA" : "") << (c.o_pad ? " o stride +" + std::to_string(c.o_pad) : "") << "]";
}

uint16_t to_half_bits(float x, DType t) {
  return t == DType::bf16 ? spattn::float_to_bf16(x) : spattn::float_to_half(x);
}
float from_half_bits(uint16_t x, DType t) { return t == DType::bf16 ? spattn::bf16_to_float(x) : spattn::half_to_float(x); }

struct DeviceBuf {
  void* p = nullptr;
  explicit DeviceBuf(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
  ~DeviceBuf() { cudaFree(p); }
};

// Runs one case; returns the relative error of O (and checks LSE, empty rows, poisoned outputs).
void check_case(const Case& c) {
  SCOPED_TRACE(::testing::PrintToString(c));
  const auto bound = spattn::parse(c.spec).bind(c.Lq, c.Lk);
  spattn::Problem pr;
  pr.batch = c.B, pr.q_heads = c.Hq, pr.kv_heads = c.Hkv, pr.q_len = c.Lq, pr.kv_len = c.Lk, pr.head_dim = c.D;
  pr.dtype = c.dtype;

  std::mt19937 rng(1234 + unsigned(c.Lq * 7 + c.D));
  std::normal_distribution<float> nd(0.f, 1.f);
  auto fill = [&](size_t n) {
    std::vector<uint16_t> v(n);
    for (auto& x : v) x = to_half_bits(nd(rng), c.dtype);
    return v;
  };
  const size_t nq = size_t(c.B * c.Lq * c.Hq * c.D), nk = size_t(c.B * c.Lk * c.Hkv * c.D);
  // Inputs: three contiguous tensors, or (packed) one [B, L, 3, H, D] buffer holding q, k and v.
  if (c.packed) ASSERT_TRUE(c.Lq == c.Lk && c.Hq == c.Hkv) << "packed cases need Lq == Lk and Hq == Hkv";
  const size_t nin = c.packed ? 3 * nq : nq + 2 * nk;
  auto hin = fill(nin);
  if (c.rising) {  // element 0 of every q row and k row; packed: rows of [3, H, D], q then k then v
    const int64_t qrow = c.packed ? 3 * c.Hq * c.D : c.Hq * c.D, krow = c.packed ? 3 * c.Hq * c.D : c.Hkv * c.D;
    const size_t k_base = c.packed ? size_t(c.Hq * c.D) : nq;
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t t = 0; t < c.Lq; ++t)
        for (int64_t h = 0; h < c.Hq; ++h) hin[size_t((b * c.Lq + t) * qrow + h * c.D)] = to_half_bits(32.f, c.dtype);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t j = 0; j < c.Lk; ++j)
        for (int64_t h = 0; h < (c.packed ? c.Hq : c.Hkv); ++h)
          hin[k_base + size_t((b * c.Lk + j) * krow + h * c.D)] =
              to_half_bits(j % 700 == 699 ? 40.f : float(j % 256) / 16.f, c.dtype);
  }
  // O (rows of Hq D + o_pad elements) with a poisoned guard of 192 rows past its end: a store past the last row (a
  // tile's rows past Lq) or into a row's padding fails.
  const int64_t orow = c.Hq * c.D + c.o_pad;
  const size_t no = size_t(c.B * c.Lq * orow), guard = size_t(192 * orow);
  DeviceBuf din(nin * 2), dout((no + guard) * 2), dlse(size_t(c.B * c.Hq * c.Lq) * 4);
  ASSERT_EQ(cudaMemcpy(din.p, hin.data(), nin * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(dout.p, 0xFF, (no + guard) * 2), cudaSuccess);  // NaN poison: an unwritten element fails
  ASSERT_EQ(cudaMemset(dlse.p, 0xFF, size_t(c.B * c.Hq * c.Lq) * 4), cudaSuccess);
  // The q, k, v views over a base pointer (device or host copy of the inputs).
  auto views = [&](void* base, DType t) {
    auto* b8 = static_cast<uint8_t*>(base);
    const int64_t es = 2;
    if (c.packed) {
      const int64_t H = c.Hq, L = c.Lq, D = c.D;
      auto at = [&](int64_t which) {
        return TensorView{b8 + which * H * D * es, t, {c.B, L, H, D}, {L * 3 * H * D, 3 * H * D, D, 1}};
      };
      return std::array<TensorView, 3>{at(0), at(1), at(2)};
    }
    return std::array<TensorView, 3>{TensorView::contiguous(b8, t, {c.B, c.Lq, c.Hq, c.D}),
                                     TensorView::contiguous(b8 + nq * es, t, {c.B, c.Lk, c.Hkv, c.D}),
                                     TensorView::contiguous(b8 + (nq + nk) * es, t, {c.B, c.Lk, c.Hkv, c.D})};
  };

  spattn::plan::FusedOptions opt;
  opt.block_m = c.block;
  opt.block_n = c.block_n ? c.block_n : c.block;
  opt.force_sm80 = c.sm80;
  opt.perm_d = c.perm_d;
  opt.tma = !c.no_tma;
  opt.persistent = c.persistent;
  opt.band = c.band;
  opt.split = c.split;
  opt.running_max = c.running_max;
  opt.device_draw = c.draw == 0 ? 0 : -1;
  spattn::cuda::fused::FusedAttention attn(bound, c.D, opt);
  if (c.draw >= 0)
    EXPECT_EQ(attn.explain().find("drawn on the device") != std::string::npos, c.draw == 1) << attn.explain();
  if (c.band == 1 && !c.sm80 && !c.no_tma) {
    if (on_sm90a()) {
      EXPECT_NE(attn.kernel_name().find("_band"), std::string::npos) << "the band kernel should run: " << attn.explain();
      if (c.running_max >= 0)
        EXPECT_EQ(attn.kernel_name().find("_rmax") != std::string::npos, c.running_max == 1) << attn.kernel_name();
    }
  }
  const auto [q, k, v] = views(din.p, c.dtype);
  const TensorView o{dout.p, c.dtype, {c.B, c.Lq, c.Hq, c.D}, {c.Lq * orow, orow, c.D, 1}};
  const TensorView lse = TensorView::contiguous(dlse.p, DType::f32, {c.B, c.Hq, c.Lq, 1});
  const auto st = attn.can_implement(pr, q, k, v, o, lse);
  ASSERT_TRUE(st.ok) << st.reason;
  attn.run(pr, q, k, v, o, lse, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // The variant the case forces is the one that ran (the kernel-table row recorded at launch).
  {
    using spattn::plan::KernelKind;
    const int row = attn.last_kernel_row();
    ASSERT_GE(row, 0) << "no kernel recorded";
    const auto& ran = spattn::plan::kKernels[row];
    if (c.block > 0 && c.band != 1) EXPECT_EQ(ran.block_m, c.block) << ran.name;
    if (c.sm80) EXPECT_EQ(ran.kind, KernelKind::sm80_mma) << ran.name;
    if (on_sm90a() && !c.sm80) {
      if (c.no_tma) EXPECT_EQ(ran.kind, KernelKind::sm90_cp) << ran.name;
      if (c.band == 1 && !c.no_tma) EXPECT_TRUE(spattn::plan::is_band(ran.kind)) << ran.name;
      if (c.band == 1 && !c.no_tma && c.running_max >= 0)
        EXPECT_EQ(ran.kind == KernelKind::sm90_band_rmax, c.running_max == 1) << ran.name;
      if (c.persistent >= 0 && !c.no_tma)
        EXPECT_TRUE(ran.kind == KernelKind::sm90_tma || spattn::plan::is_band(ran.kind)) << ran.name;
      if (c.tma128) EXPECT_TRUE(ran.kind == KernelKind::sm90_tma && ran.head_dim == 128) << ran.name;
      if (c.tma) EXPECT_EQ(ran.kind, KernelKind::sm90_tma) << ran.name;
      if (c.o_pad % 8 != 0 && !c.no_tma) {
        // band=-1 cases: a band plan (the planner's row), whose fallback runs
        if (c.band == -1) EXPECT_TRUE(spattn::plan::is_band(spattn::plan::kKernels[attn.kernel_row()].kind)) << attn.kernel_name();
        EXPECT_EQ(ran.kind, ran.block_m == 192 ? KernelKind::sm90_tma : KernelKind::sm90_cp) << ran.name;
      }
    }
  }
  std::vector<uint16_t> hpad(no + guard), ho(nq);
  std::vector<float> hlse(size_t(c.B * c.Hq * c.Lq));
  ASSERT_EQ(cudaMemcpy(hpad.data(), dout.p, (no + guard) * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  int64_t guard_hit = 0;
  for (size_t i = 0; i < no + guard; ++i) {
    const int64_t t = int64_t(i) / orow, e = int64_t(i) % orow;  // token row (b Lq + t), element in it
    if (i < no && e < c.Hq * c.D) ho[size_t(t * c.Hq * c.D + e)] = hpad[i];
    else guard_hit += hpad[i] != 0xFFFF;
  }
  EXPECT_EQ(guard_hit, 0) << "elements written past O's last row or into its rows' padding";
  ASSERT_EQ(cudaMemcpy(hlse.data(), dlse.p, hlse.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);

  // Reference on the same (rounded) inputs.
  std::vector<double> ro(nq), rlse(hlse.size());
  const auto [rq, rk, rv] = views(hin.data(), c.dtype);
  spattn::cpu::reference_attention({bound}, pr, rq, rk, rv,
                                   TensorView::contiguous(ro.data(), DType::f64, {c.B, c.Lq, c.Hq, c.D}),
                                   TensorView::contiguous(rlse.data(), DType::f64, {c.B, c.Hq, c.Lq, 1}));
  double num = 0, den = 0;
  int64_t bad = 0;
  for (size_t i = 0; i < nq; ++i) {
    const double x = from_half_bits(ho[i], c.dtype);
    if (!std::isfinite(x)) ++bad;
    num += (x - ro[i]) * (x - ro[i]);
    den += ro[i] * ro[i];
  }
  EXPECT_EQ(bad, 0) << "non-finite (unwritten or NaN) outputs";
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  EXPECT_LE(rel, 1e-2) << "relative error of O; plan: " << attn.explain();
  int64_t lse_bad = 0;
  for (size_t i = 0; i < hlse.size(); ++i) {
    const double r = rlse[i], x = hlse[i];
    if (std::isinf(r)) lse_bad += !(std::isinf(x) && x < 0);
    else lse_bad += !(std::abs(x - r) <= 2e-2 * std::max(1.0, std::abs(r)));
  }
  EXPECT_EQ(lse_bad, 0) << "LSE mismatches (fully masked rows must give -inf)";
  std::cout << "  " << c.what << ": rel err " << rel << "; " << attn.kernel_name() << "; " << attn.explain() << "\n";
}

class FusedSuite : public ::testing::TestWithParam<Case> {};
TEST_P(FusedSuite, MatchesReference) {
  REQUIRE_GPU();
  check_case(GetParam());
}

constexpr DType bf = DType::bf16, fp = DType::f16;
const Case kCases[] = {
    // Every pattern of the standard suite (docs/BENCHMARKS.md), small lengths so the fp64 reference stays quick.
    {"suite local", "local(256)", 1, 2, 2, 1023, 1023, 64, bf},
    {"suite longformer: band plus global rows and columns", "longformer(256, 32)", 1, 2, 2, 1023, 1023, 64, bf},
    {"suite bigbird: 64-blocks, random blocks", "bigbird(64, 1, 2, 3, seed=0)", 1, 2, 2, 1024, 1024, 64, bf},
    {"suite dilated: residue permutation", "dilated(256, 2)", 1, 2, 2, 1023, 1023, 64, bf},
    {"suite fixed: one summary column per block", "sparse_fixed(128)", 1, 2, 2, 1023, 1023, 64, bf},
    {"suite random: scattered keys", "random(51, seed=0)", 1, 2, 2, 1023, 1023, 64, bf},
    {"suite na2d: 2-D windows", "neighborhood(dims=(32,32), kernel=13)", 1, 2, 2, 1024, 1024, 64, bf},
    {"suite causal", "causal", 1, 2, 2, 1023, 1023, 64, bf},
    {"dense", "dense", 1, 2, 2, 1023, 1023, 64, bf},
    // Awkward lengths (tile tails in q and k).
    {"length 799: partial last tiles", "local(256)", 1, 2, 2, 799, 799, 64, bf},
    {"length 4099: one row past a tile", "causal", 1, 1, 1, 4099, 4099, 64, bf},
    {"length 799 dilated: unequal residue groups", "dilated(100, 3)", 1, 2, 2, 799, 799, 64, bf},
    {"cross attention Lq != Lk", "local(left=300, right=40)", 1, 2, 2, 300, 1000, 64, bf},
    // GQA, head dim 128, fp16.
    {"GQA 4 query heads on 2 kv heads", "causal", 2, 4, 2, 513, 513, 64, bf},
    {"head dim 128", "longformer(100, 16)", 1, 2, 2, 1023, 1023, 128, bf},
    {"head dim 128 dense", "dense", 1, 2, 1, 700, 700, 128, fp},
    {"fp16", "bigbird(64, 1, 2, 3, seed=0)", 1, 2, 2, 1024, 1024, 64, fp},
    {"fp16 d128 causal", "causal", 1, 2, 2, 799, 799, 128, fp},
    // Fully masked rows: O = 0, LSE = -inf, never NaN.
    {"fully masked rows", "local(20) & global_rows(100:300)", 1, 2, 2, 1023, 1023, 64, bf},
    {"fully masked rows, all empty tiles", "global_rows(0:10) & local(5)", 1, 1, 1, 600, 600, 128, fp},
    // Forced tile shapes and the mma.sync (sm_80) kernel.
    {"forced 64x64 tiles", "local(256)", 1, 2, 2, 1023, 1023, 64, bf, 64},
    {"forced 128x128 tiles on 64-blocks", "bigbird(64, 1, 2, 3, seed=0)", 1, 2, 2, 1024, 1024, 64, bf, 128},
    {"forced 64x64 d128", "causal", 1, 2, 2, 799, 799, 128, bf, 64},
    {"forced 64x128 tiles", "longformer(256, 32)", 1, 2, 2, 1023, 1023, 64, bf, 64, false, -1, 128},
    {"forced 64x128 tiles fp16 GQA", "causal", 1, 4, 1, 799, 799, 64, fp, 64, false, -1, 128},
    {"forced 64x128 dilated", "dilated(256, 2)", 1, 2, 2, 1023, 1023, 64, bf, 64, false, -1, 128},
    {"sm80 64x128", "local(100)", 1, 2, 2, 799, 799, 64, bf, 64, true, -1, 128},
    {"dilated without permutation (bitmask path)", "dilated(256, 2)", 1, 2, 2, 1023, 1023, 64, bf, 0, false, 1},
    {"sm80 local", "local(256)", 1, 2, 2, 1023, 1023, 64, bf, 0, true},
    {"sm80 bigbird 64x64", "bigbird(64, 1, 2, 3, seed=0)", 1, 2, 2, 1024, 1024, 64, fp, 64, true},
    {"sm80 d128 causal", "causal", 1, 2, 2, 799, 799, 128, bf, 128, true},
    {"sm80 d128 64x64 longformer", "longformer(100, 16)", 1, 2, 1, 799, 799, 128, fp, 64, true},
    {"sm80 dilated", "dilated(256, 2)", 1, 2, 2, 1023, 1023, 64, bf, 0, true},
    // half-width entries (one 64-key half of a 64x128 tile): bitmask tiles of 64-blocks, band edges of
    // cross attention, both halves
    {"forced 64x128 bigbird: half-width bitmask tiles", "bigbird(64, 1, 2, 3, seed=0)", 1, 2, 2, 1024, 1024, 64, bf, 64,
     false, -1, 128},
    {"forced 64x128 cross attention: half-width bands", "local(left=300, right=40)", 1, 2, 2, 300, 1000, 64, fp, 64,
     false, -1, 128},
    // The warp-specialized TMA kernel (sm_90a): 192x128 (three consumer warpgroups) and 128x128 tiles; the
    // cp.async 128-row kernel it replaces stays reachable (no_tma). Tails, bands, bitmasks, empty rows, GQA,
    // cross attention, packed (strided) inputs.
    {"192x128 local, tails", "local(256)", 1, 2, 2, 1023, 1023, 64, bf, 192, false, -1, 128},
    {"192x128 causal 4099", "causal", 1, 1, 1, 4099, 4099, 64, bf, 192, false, -1, 128},
    {"192x128 bigbird bitmask tiles fp16", "bigbird(64, 1, 2, 3, seed=0)", 1, 2, 2, 1024, 1024, 64, fp, 192, false, -1,
     128},
    {"192x128 random", "random(51, seed=0)", 1, 2, 2, 1023, 1023, 64, bf, 192, false, -1, 128},
    {"192x128 fully masked rows", "local(20) & global_rows(100:300)", 1, 2, 2, 1023, 1023, 64, bf, 192, false, -1, 128},
    {"192x128 GQA cross attention", "local(left=300, right=40)", 2, 4, 2, 300, 1000, 64, fp, 192, false, -1, 128},
    {"192x128 packed qkv", "longformer(256, 32)", 2, 2, 2, 777, 777, 64, bf, 192, false, -1, 128, false, true},
    {"128x128 TMA dense d64", "dense", 1, 2, 2, 1023, 1023, 64, bf, 128},
    {"128x128 TMA packed d128", "causal", 1, 2, 2, 799, 799, 128, fp, 128, false, -1, 0, false, true},
    // Persistent TMA CTAs (one per SM) walking several work items each, empty items among them.
    {"192x128 persistent: items per CTA > 1, GQA", "local(300) | global_rows(0:64)", 2, 8, 4, 2000, 2000, 64, bf, 192,
     false, -1, 128},
    {"192x128 persistent: mostly empty items", "global_rows(0:10) & local(5)", 2, 8, 8, 3000, 3000, 64, fp, 192, false,
     -1, 128},
    {"128x128 persistent d128", "causal", 2, 8, 8, 2100, 2100, 128, bf, 128, false, -1, 0, false, false, 1},
    {"192x128 one item a CTA, empty items", "global_rows(0:10) & local(5)", 2, 8, 8, 3000, 3000, 64, bf, 192, false,
     -1, 128, false, false, 0},
    // Packed variable-length batches: B = 1, sequences of 700, 1500 and 1899 tokens as document segments.
    {"varlen: document(...) & causal", "document(700, 1500, 1899) & causal", 1, 4, 2, 4099, 4099, 64, bf},
    {"varlen: document(...) & local, d128", "document(700, 1500, 1899) & local(200)", 1, 2, 2, 4099, 4099, 128, fp},
    {"varlen: document(...) 192x128", "document(700, 1500, 1899) & causal", 1, 2, 2, 4099, 4099, 64, fp, 192, false,
     -1, 128},
    // The band kernel (sm_90a, band-row plans): 64-row slabs over 64-key chunks, odd and even chunk counts,
    // sequence ends, empty rows and slabs, cross attention both ways, GQA, fp16, one item a CTA; and the same
    // patterns without it.
    {"band 192 local, tails", "local(256)", 1, 2, 2, 1023, 1023, 64, bf, 192, false, -1, 128, false, false, -1, 1},
    {"band 192 local, tails fp16", "local(256)", 1, 2, 2, 1023, 1023, 64, fp, 192, false, -1, 128, false, false, -1, 1},
    {"band 192 narrow window (one chunk a slab)", "local(5)", 1, 2, 2, 1000, 1000, 64, bf, 192, false, -1, 128, false, false, -1, 1},
    {"band 192 sliding window", "local(left=200, right=0)", 2, 4, 2, 2047, 2047, 64, bf, 192, false, -1, 128, false, false, -1, 1},
    {"band 192 causal 4099", "causal", 1, 1, 1, 4099, 4099, 64, bf, 192, false, -1, 128, false, false, -1, 1},
    {"band 192 causal GQA", "causal", 2, 4, 1, 1500, 1500, 64, fp, 192, false, -1, 128, false, false, -1, 1},
    {"band 192 dense", "dense", 1, 2, 2, 777, 777, 64, bf, 192, false, -1, 128, false, false, -1, 1},
    {"band 192 cross attention Lq < Lk", "local(left=300, right=40)", 2, 4, 2, 300, 1000, 64, fp, 192, false, -1, 128, false, false, -1, 1},
    {"band 192 cross attention Lq > Lk, empty rows", "local(left=40, right=300)", 1, 2, 2, 1000, 300, 64, bf, 192, false, -1, 128, false, false, -1, 1},
    {"band 192 one item a CTA", "local(256)", 2, 4, 4, 2000, 2000, 64, bf, 192, false, -1, 128, false, false, 0, 1},
    {"band 192 packed qkv", "local(100)", 2, 2, 2, 777, 777, 64, bf, 192, false, -1, 128, false, true, -1, 1},
    {"no band kernel: 192x128 local", "local(256)", 1, 2, 2, 1023, 1023, 64, bf, 192, false, -1, 128, false, false, -1, 0},
    {"no band kernel: 192x128 causal", "causal", 1, 2, 2, 1023, 1023, 64, bf, 192, false, -1, 128, false, false, -1, 0},
    {"128x128 cp.async d64", "longformer(256, 32)", 1, 2, 2, 1023, 1023, 64, bf, 128, false, -1, 0, true},
    {"128x128 cp.async d128", "causal", 1, 4, 2, 799, 799, 128, bf, 128, false, -1, 0, true},
    // The band kernel's split work items: parts over an item's chunks, written to the workspace and merged by the last
    // part to arrive. The small cases above run split by default (a few items on a whole GPU); here the
    // unsplit path, forced splits of the last items of a long list, parts with no chunks (causal's first
    // tiles, narrow windows) and empty rows.
    {"band 192 local, no split", "local(256)", 1, 2, 2, 1023, 1023, 64, bf, 192, false, -1, 128, false, false, -1, 1, 0},
    {"band 192 causal, no split", "causal", 1, 2, 2, 1500, 1500, 64, fp, 192, false, -1, 128, false, false, -1, 1, 0},
    {"band 192 split 2, last items of many", "local(256)", 2, 8, 8, 4099, 4099, 64, bf, 192, false, -1, 128, false, false, -1, 1, 2},
    {"band 192 split 3, causal (empty parts)", "causal", 1, 4, 2, 2000, 2000, 64, bf, 192, false, -1, 128, false, false, -1, 1, 3},
    {"band 192 split 4, narrow window", "local(5)", 1, 2, 2, 1000, 1000, 64, fp, 192, false, -1, 128, false, false, -1, 1, 4},
    {"band 192 split 4, Lq > Lk, empty rows", "local(left=40, right=300)", 1, 2, 2, 1000, 300, 64, bf, 192, false, -1, 128, false, false, -1, 1, 4},
    {"band 192 split 3, one item a CTA (no split)", "local(256)", 1, 2, 2, 1023, 1023, 64, bf, 192, false, -1, 128, false, false, 0, 1, 3},
    // Slab parts: an item's 64-row slabs as work items of their own (one warpgroup runs, the others skip).
    {"band 192 slabs, last items of many", "local(256)", 2, 8, 4, 4099, 4099, 64, bf, 192, false, -1, 128, false, false, -1, 1, 1},
    {"band 192 slabs, causal", "causal", 1, 4, 2, 2000, 2000, 64, fp, 192, false, -1, 128, false, false, -1, 1, 1},
    {"band 192 chosen, last wave as slabs (132 SMs)", "local(256)", 2, 16, 16, 4096, 4096, 64, bf, 192, false, -1, 128, false, false, -1, 1, -1},
    // The band kernel's running-max steps (exponentials against the running row maximum; chosen for long rows,
    // forced here): rows whose maxima rise after their first step (rescales), and jump by more than 128 log2 units
    // within one 128-key step (overflowed exponentials: that step again, exactly); GQA fp16, empty rows, split parts,
    // slabs; and the TMA kernel on the same inputs.
    {"band 192 rmax rising scores, causal", "causal", 1, 2, 2, 1500, 1500, 64, bf, 192, false, -1, 128, false, false, -1, 1, -1, true, 1},
    {"band 192 rmax rising scores, causal fp16", "causal", 1, 2, 2, 1500, 1500, 64, fp, 192, false, -1, 128, false, false, -1, 1, -1, true, 1},
    {"band 192 rmax rising scores, local fp16", "local(256)", 1, 2, 2, 2047, 2047, 64, fp, 192, false, -1, 128, false, false, -1, 1, -1, true, 1},
    {"band 192 rmax rising scores, split 3", "causal", 1, 4, 2, 2000, 2000, 64, bf, 192, false, -1, 128, false, false, -1, 1, 3, true, 1},
    {"192x128 rising scores (TMA kernel)", "longformer(256, 32)", 1, 2, 2, 1023, 1023, 64, bf, 192, false, -1, 128, false, false, -1, 0, -1, true},
    {"band 192 rmax causal GQA fp16", "causal", 2, 4, 1, 1500, 1500, 64, fp, 192, false, -1, 128, false, false, -1, 1, -1, false, 1},
    {"band 192 rmax Lq > Lk, empty rows, split 4", "local(left=40, right=300)", 1, 2, 2, 1000, 300, 64, bf, 192, false, -1, 128, false, false, -1, 1, 4, false, 1},
    {"band 192 rmax slabs, causal", "causal", 1, 4, 2, 2000, 2000, 64, fp, 192, false, -1, 128, false, false, -1, 1, 1, false, 1},
    {"band 192 causal 4099 chosen rmax", "causal", 1, 2, 2, 4099, 4099, 64, bf, 192, false, -1, 128, false, false, -1, 1, -1, false, -1},
    {"band 192 local no rmax", "local(256)", 1, 2, 2, 4099, 4099, 64, bf, 192, false, -1, 128, false, false, -1, 1, -1, false, 0},
    // The band kernel at head dim 128: 128-row items of two slabs, tiles as two 64-column panels, a 4-stage ring, one
    // Q buffer; the cases above that apply (no running-max steps at 128: long rows take the plain steps).
    {"band 128 local, tails", "local(256)", 1, 2, 2, 1023, 1023, 128, bf, 128, false, -1, 128, false, false, -1, 1},
    {"band 128 local, tails fp16", "local(256)", 1, 2, 2, 1023, 1023, 128, fp, 128, false, -1, 128, false, false, -1, 1},
    {"band 128 narrow window (one chunk a slab)", "local(5)", 1, 2, 2, 1000, 1000, 128, bf, 128, false, -1, 128, false, false, -1, 1},
    {"band 128 sliding window", "local(left=200, right=0)", 2, 4, 2, 2047, 2047, 128, bf, 128, false, -1, 128, false, false, -1, 1},
    {"band 128 causal 4099 (long rows: plain steps)", "causal", 1, 1, 1, 4099, 4099, 128, bf, 128, false, -1, 128, false, false, -1, 1},
    {"band 128 causal GQA", "causal", 2, 4, 1, 1500, 1500, 128, fp, 128, false, -1, 128, false, false, -1, 1},
    {"band 128 dense", "dense", 1, 2, 2, 777, 777, 128, bf, 128, false, -1, 128, false, false, -1, 1},
    {"band 128 cross attention Lq < Lk", "local(left=300, right=40)", 2, 4, 2, 300, 1000, 128, fp, 128, false, -1, 128, false, false, -1, 1},
    {"band 128 cross attention Lq > Lk, empty rows", "local(left=40, right=300)", 1, 2, 2, 1000, 300, 128, bf, 128, false, -1, 128, false, false, -1, 1},
    {"band 128 one item a CTA", "local(256)", 2, 4, 4, 2000, 2000, 128, bf, 128, false, -1, 128, false, false, 0, 1},
    {"band 128 packed qkv", "local(100)", 2, 2, 2, 777, 777, 128, bf, 128, false, -1, 128, false, true, -1, 1},
    {"no band kernel: 128x128 local d128", "local(256)", 1, 2, 2, 1023, 1023, 128, bf, 128, false, -1, 128, false, false, -1, 0},
    {"band 128 local, no split", "local(256)", 1, 2, 2, 1023, 1023, 128, bf, 128, false, -1, 128, false, false, -1, 1, 0},
    {"band 128 split 2, last items of many", "local(256)", 2, 8, 8, 4099, 4099, 128, bf, 128, false, -1, 128, false, false, -1, 1, 2},
    {"band 128 split 3, causal (empty parts)", "causal", 1, 4, 2, 2000, 2000, 128, bf, 128, false, -1, 128, false, false, -1, 1, 3},
    {"band 128 split 4, Lq > Lk, empty rows", "local(left=40, right=300)", 1, 2, 2, 1000, 300, 128, fp, 128, false, -1, 128, false, false, -1, 1, 4},
    {"band 128 slabs, last items of many", "local(256)", 2, 8, 4, 4099, 4099, 128, bf, 128, false, -1, 128, false, false, -1, 1, 1},
    {"band 128 chosen, last wave as slabs (132 SMs)", "local(256)", 2, 16, 16, 4096, 4096, 128, bf, 128, false, -1, 128, false, false, -1, 1, -1},
    {"band 128 rising scores, causal", "causal", 1, 2, 2, 1500, 1500, 128, bf, 128, false, -1, 128, false, false, -1, 1, -1, true},
    // Band rows in residue groups by the spec (plans built in closed form, group by group): with causal, cross lengths.
    {"dilated & causal: one-sided bands in residue groups", "dilated(40, 4) & causal", 1, 2, 2, 1001, 1001, 64, bf},
    {"dilated D=128, Lq < Lk: groups of unequal size", "dilated(60, 3)", 1, 2, 2, 700, 1000, 128, bf},
    {"dilated, Lq > Lk: group rows past the keys", "dilated(30, 2) & local(left=50, right=10)", 1, 2, 2, 1000, 601, 64, fp},
    // random(r) bitmasks drawn on the device at upload (cuda/fused/random_rows.hpp; every tile visited) and on the host,
    // each checked to be the one that ran: ragged tiles, Lq != Lk, each tile shape and kernel kind, r near Lk.
    {"random drawn on the device, 192x128 TMA", "random(51, seed=0)", 1, 2, 2, 1023, 1023, 64, bf, 192, false, -1, 128, false, false, -1, -1, -1, false, -1, 1},
    {"random drawn on the host, 192x128 TMA", "random(51, seed=0)", 1, 2, 2, 1023, 1023, 64, bf, 192, false, -1, 128, false, false, -1, -1, -1, false, -1, 0},
    {"random drawn, chosen tiles, Lq < Lk", "random(120, seed=5)", 2, 4, 2, 500, 1300, 64, fp, 0, false, -1, 0, false, false, -1, -1, -1, false, -1, 1},
    {"random drawn, 64x128 cp.async, Lq > Lk", "random(40, seed=9)", 1, 2, 1, 1100, 333, 64, bf, 64, false, -1, 128, true, false, -1, -1, -1, false, -1, 1},
    {"random drawn, 64x64 mma.sync d128", "random(30, seed=2)", 1, 2, 2, 700, 700, 128, bf, 64, true, -1, 64, false, false, -1, -1, -1, false, -1, 1},
    {"random drawn, r = Lk - 1, 128x128 d128", "random(999, seed=4)", 1, 2, 2, 515, 1000, 128, fp, 128, false, -1, 128, false, false, -1, -1, -1, false, -1, 1},
};
INSTANTIATE_TEST_SUITE_P(Fused, FusedSuite, ::testing::ValuesIn(kCases));

// The TMA kernel at head dim 128 (fused_fwd.cuh, pipelined_tiles' kLazy: the lazy rescale, the softmax under the
// previous P V): causal, windows and GQA at awkward lengths, bf16 and fp16, each checked to have run that kernel.
// The random scores' row maxima rise by a few log2 units from tile to tile, under the threshold of 8 (the stale-max
// step, whose exponentials exceed 1); the rising scores (Case::rising) rise by ~32 log2 units per 128 keys and by
// ~100-130 at the spike at key 699, past it (the rescale branch). Where a window starts in the first 128 keys the
// spike is ~131 log2 units above the first tile's maximum: a missed rescale overflows fp32 there (2^131).
Case tma128_case(const char* what, const char* spec, int64_t hq, int64_t hkv, int64_t len, DType t = DType::bf16,
                 bool rising = false) {
  Case c{what, spec, 1, hq, hkv, len, len, 128, t, 128};
  c.band = 0;  // band rows on the TMA kernel
  c.rising = rising;
  c.tma128 = true;
  return c;
}
const Case kTma128Cases[] = {
    tma128_case("TMA D=128: causal, length 1999", "causal", 2, 2, 1999),
    tma128_case("TMA D=128: GQA 4/2 causal", "causal", 4, 2, 1281),
    tma128_case("TMA D=128: local window", "local(300)", 2, 2, 2049),
    tma128_case("TMA D=128: GQA 4/1 left window", "local(left=700, right=0)", 4, 1, 1537),
    tma128_case("TMA D=128: window, length 833", "local(200)", 2, 2, 833),
    tma128_case("TMA D=128: rising scores, causal", "causal", 2, 2, 1501, DType::bf16, true),
    tma128_case("TMA D=128: rising scores, left window", "local(left=900, right=0)", 2, 2, 1501, DType::bf16, true),
    tma128_case("TMA D=128: fp16 causal", "causal", 2, 2, 1999, DType::f16),
    tma128_case("TMA D=128: fp16 rising scores, left window", "local(left=900, right=0)", 2, 2, 1501, DType::f16, true),
};
class FusedTma128 : public ::testing::TestWithParam<Case> {};
TEST_P(FusedTma128, MatchesReference) {
  REQUIRE_GPU();
  check_case(GetParam());
}
INSTANTIATE_TEST_SUITE_P(Fused, FusedTma128, ::testing::ValuesIn(kTma128Cases));

// The TMA kernel's epilogue by bulk tensor copies (WsTraits::kTmaEpi; issue 40): O staged in the consumers' rows of
// the Q buffer, stored through o's tensor map (rows past Lq dropped: the partial last tiles, the guard past O), the
// LSE by the threads; items with no key tile (cross attention's empty rows) store zeros the same way. Head dims 64
// (128- and 192-row tiles: two and three consumers) and 128, bf16 and fp16, causal and windows, GQA, persistent CTAs
// and one item a CTA; each checked to have run the TMA row. Then o views with no tensor map (o_pad): the row that
// runs without one.
Case tma_epi_case(const char* what, const char* spec, int64_t B, int64_t hq, int64_t hkv, int64_t lq, int64_t lk, int64_t d,
                  DType t, int block = 128, int persistent = -1, int o_pad = 0, int band = 0) {
  Case c{what, spec, B, hq, hkv, lq, lk, d, t, block};
  c.block_n = block ? 128 : 0;  // 0: the planner's tiles
  c.band = band;  // 0: band rows on the TMA kernel
  c.persistent = persistent;
  c.tma = o_pad == 0;
  c.o_pad = o_pad;
  return c;
}
const Case kTmaEpiCases[] = {
    tma_epi_case("TMA epilogue D=128: causal, length 1000", "causal", 2, 2, 2, 1000, 1000, 128, DType::bf16),
    tma_epi_case("TMA epilogue D=128: fp16 GQA 4/1 left window, length 4099", "local(left=700, right=0)", 1, 4, 1, 4099, 4099, 128, DType::f16),
    tma_epi_case("TMA epilogue D=128: fp16 window, length 1000", "local(300)", 2, 2, 2, 1000, 1000, 128, DType::f16),
    tma_epi_case("TMA epilogue D=128: GQA 4/2 causal, one item a CTA", "causal", 1, 4, 2, 1281, 1281, 128, DType::bf16, 128, 0),
    tma_epi_case("TMA epilogue D=128: Lq > Lk, items with no key", "local(left=40, right=300)", 1, 2, 2, 1000, 300, 128, DType::bf16),
    tma_epi_case("TMA epilogue D=64: causal, length 4099", "causal", 1, 2, 2, 4099, 4099, 64, DType::bf16),
    tma_epi_case("TMA epilogue D=64: fp16 GQA 4/2 window, length 1000", "local(256)", 2, 4, 2, 1000, 1000, 64, DType::f16),
    tma_epi_case("TMA epilogue D=64 192x128: causal, length 1000", "causal", 1, 2, 2, 1000, 1000, 64, DType::bf16, 192),
    tma_epi_case("TMA epilogue D=64 192x128: fp16 GQA 4/1 window, length 4099", "local(left=500, right=0)", 1, 4, 1, 4099, 4099, 64, DType::f16, 192),
    tma_epi_case("TMA epilogue D=64 192x128: Lq > Lk, items with no key", "local(left=40, right=300)", 1, 2, 2, 1000, 300, 64, DType::f16, 192),
    // o with no tensor map (its rows 4 bytes past a 16-byte multiple apart): 128-row plans on the cp.async row,
    // 192-row tiles (TMA and band plans) on the TMA kernel with the threads' stores.
    tma_epi_case("no o map D=128: causal on cp.async", "causal", 1, 2, 2, 1000, 1000, 128, DType::bf16, 128, -1, 2),
    tma_epi_case("no o map D=128: band plan on cp.async", "local(300)", 1, 2, 2, 1000, 1000, 128, DType::f16, 0, -1, 2, -1),
    tma_epi_case("no o map D=64: 128x128 on cp.async", "local(256)", 1, 2, 2, 1000, 1000, 64, DType::bf16, 128, -1, 2),
    tma_epi_case("no o map D=64 192x128: Lq > Lk, threads' stores", "local(left=40, right=300)", 1, 2, 2, 1000, 300, 64, DType::f16, 192, -1, 2),
    tma_epi_case("no o map D=64: band plan on the TMA kernel", "causal", 1, 2, 2, 1000, 1000, 64, DType::bf16, 0, -1, 2, -1),
};
class FusedTmaEpilogue : public ::testing::TestWithParam<Case> {};
TEST_P(FusedTmaEpilogue, MatchesReference) {
  REQUIRE_GPU();
  check_case(GetParam());
}
INSTANTIATE_TEST_SUITE_P(Fused, FusedTmaEpilogue, ::testing::ValuesIn(kTmaEpiCases));

TEST(FusedPlan, BandAndPermutation) {
  // Host-only: the plan describes causal/local diagonals as bands and dilated rows as dense groups.
  const auto causal = spattn::parse("causal").bind(4096);
  const auto p = spattn::plan::build_block_plan(causal, 128, 128, 1);
  EXPECT_EQ(p.n_bitmask, 0);
  EXPECT_EQ(p.n_band, 32);
  EXPECT_EQ(p.nnz, int64_t(4096) * 4097 / 2);
  const auto dil = spattn::parse("dilated(256, 2)").bind(4096);
  EXPECT_EQ(spattn::plan::analyze(dil).permutation(spattn::plan::kMaxGpuPermutation), 2);
  const auto pd = spattn::plan::build_block_plan(dil, 128, 128, 2);
  EXPECT_EQ(pd.n_bitmask, 0);
  EXPECT_LT(pd.waste(), 1.5);
  const auto bb = spattn::parse("bigbird(64, 1, 2, 3, seed=0)").bind(4096);
  const auto pb = spattn::plan::choose_block_plan(bb, spattn::plan::analyze(bb), 64);
  EXPECT_EQ(pb.block_m, 64);
  EXPECT_NEAR(pb.waste(), 1.0, 1e-9);
}

TEST(FusedPlan, HalfWidthEntries) {
  // Host-only: with 64x128 tiles every interior query tile of local(256) has one edge tile whose kept keys
  // lie in one 64-key half (the kernel then loads and multiplies that half only); full tiles use both.
  const auto loc = spattn::parse("local(256)").bind(4096);
  const auto p = spattn::plan::build_block_plan(loc, 64, 128, 1);
  for (int64_t qt = 8; qt < p.q_tiles - 8; ++qt) {
    int narrow = 0;
    for (int64_t i = p.row_offsets[size_t(qt)]; i < p.row_offsets[size_t(qt) + 1]; ++i) {
      const int bits = spattn::plan::entry_halves(p, qt, i);
      EXPECT_TRUE(bits >= 1 && bits <= 3);
      if (p.entries[size_t(i)].mask == spattn::plan::kFull) EXPECT_EQ(bits, 3);
      narrow += bits != 3;
    }
    EXPECT_EQ(narrow, 1) << "query tile " << qt;
  }
  // A bitmask tile of one 64-block (bigbird's random blocks) is half-width on the side of that block.
  const auto bb = spattn::parse("bigbird(64, 1, 2, 3, seed=0)").bind(4096);
  const auto pb = spattn::plan::build_block_plan(bb, 64, 128, 1);
  int64_t halves[4] = {};
  for (int64_t qt = 0; qt < pb.q_tiles; ++qt)
    for (int64_t i = pb.row_offsets[size_t(qt)]; i < pb.row_offsets[size_t(qt) + 1]; ++i)
      ++halves[spattn::plan::entry_halves(pb, qt, i)];
  EXPECT_EQ(halves[0], 0);
  EXPECT_GT(halves[1], 0);
  EXPECT_GT(halves[2], 0);
}

TEST(FusedApi, CanImplementSaysWhy) {
  REQUIRE_GPU();
  const auto bound = spattn::parse("local(16)").bind(256);
  spattn::cuda::fused::FusedAttention attn(bound, 64);
  spattn::Problem pr;
  pr.q_len = pr.kv_len = 256;
  pr.head_dim = 64;
  pr.dtype = DType::f32;
  TensorView t = TensorView::contiguous(reinterpret_cast<void*>(256), DType::f32, {1, 256, 1, 64});
  const auto st = attn.can_implement(pr, t, t, t, t, TensorView{});
  EXPECT_FALSE(st.ok);
  EXPECT_NE(st.reason.find("dtype"), std::string::npos) << st.reason;
  spattn::plan::FusedOptions opt;
  opt.split = 7;
  spattn::cuda::fused::FusedAttention bad_split(bound, 64, opt);
  pr.dtype = DType::bf16;
  const TensorView b = TensorView::contiguous(reinterpret_cast<void*>(256), DType::bf16, {1, 256, 1, 64});
  const auto st2 = bad_split.can_implement(pr, b, b, b, b, TensorView{});
  EXPECT_FALSE(st2.ok);
  EXPECT_NE(st2.reason.find("split must be -1 (chosen), 0 (never), 1 (slabs) or 2-4 parts, got 7"), std::string::npos) << st2.reason;
}

TEST(FusedApi, TmaTileShapesSayWhy) {
  REQUIRE_GPU();
  const auto bound = spattn::parse("local(16)").bind(256);
  spattn::Problem pr;
  pr.q_len = pr.kv_len = 256;
  pr.dtype = DType::bf16;
  auto views = [&](int64_t d) {
    pr.head_dim = d;
    return TensorView::contiguous(reinterpret_cast<void*>(256), DType::bf16, {1, 256, 1, d});
  };
  spattn::plan::FusedOptions opt;
  opt.block_m = 192;
  opt.block_n = 128;
  {  // 192-row tiles exist only in the TMA kernel at head dim 64
    spattn::cuda::fused::FusedAttention attn(bound, 128, opt);
    const TensorView t = views(128);
    const auto st = attn.can_implement(pr, t, t, t, t, TensorView{});
    EXPECT_FALSE(st.ok);
    EXPECT_NE(st.reason.find("192x128 at head dim 128"), std::string::npos) << st.reason;
  }
  opt.tma = false;
  {
    spattn::cuda::fused::FusedAttention attn(bound, 64, opt);
    const TensorView t = views(64);
    const auto st = attn.can_implement(pr, t, t, t, t, TensorView{});
    EXPECT_FALSE(st.ok);
    EXPECT_NE(st.reason.find("192x128"), std::string::npos) << st.reason;
  }
}

// run() in a CUDA graph: the TMA kernels reset their work counters at the end of each launch, so a graph
// replayed twice (and a direct run beside it) gives the same bits: the TMA kernel (longformer-like plan) and the band kernel
// with split items (local(200): 64 items on the H100's 132 SMs, split in two; the merge order is fixed).
class FusedGraph : public ::testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Fused, FusedGraph, ::testing::Values("local(200) | global_rows(0:64)", "local(200)"));
TEST_P(FusedGraph, ReplayMatchesDirectRun) {
  REQUIRE_GPU();
  const int64_t B = 2, H = 4, L = 1500, D = 64;
  const auto bound = spattn::parse(GetParam()).bind(L);
  spattn::Problem pr;
  pr.batch = B, pr.q_heads = pr.kv_heads = H, pr.q_len = pr.kv_len = L, pr.head_dim = D;
  pr.dtype = DType::bf16;
  const size_t n = size_t(B * L * H * D);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> h(3 * n);
  for (auto& x : h) x = spattn::float_to_bf16(nd(rng));
  DeviceBuf din(3 * n * 2), d1(n * 2), d2(n * 2);
  ASSERT_EQ(cudaMemcpy(din.p, h.data(), 3 * n * 2, cudaMemcpyHostToDevice), cudaSuccess);
  auto tv = [&](void* p) { return TensorView::contiguous(p, DType::bf16, {B, L, H, D}); };
  auto* base = static_cast<uint8_t*>(din.p);
  const TensorView q = tv(base), k = tv(base + 2 * n), v = tv(base + 4 * n);
  spattn::plan::FusedOptions opt;
  opt.block_m = 192;  // the persistent TMA kernels (counters left zero by each launch)
  opt.block_n = 128;
  spattn::cuda::fused::FusedAttention attn(bound, D, opt);
  const auto st = attn.can_implement(pr, q, k, v, tv(d1.p), TensorView{});
  ASSERT_TRUE(st.ok) << st.reason;
  attn.run(pr, q, k, v, tv(d1.p), TensorView{}, nullptr);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  attn.run(pr, q, k, v, tv(d2.p), TensorView{}, s);
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  std::vector<uint16_t> o1(n), o2(n);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(o1.data(), d1.p, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int rep = 0; rep < 2; ++rep) {
    ASSERT_EQ(cudaMemset(d2.p, 0xFF, n * 2), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(o2.data(), d2.p, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(o1, o2) << "graph replay " << rep << " differs from the direct run";
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}


// The band kernel stores through o's tensor map; an output whose row stride a tensor map does not admit (not a
// multiple of 16 bytes) runs the TMA kernel instead, with the same result.
// FusedOptions::running_max chosen: the band kernel's running-max steps for rows of 1536 keys or more on average.
TEST(FusedApi, RunningMaxChosenForLongRows) {
  REQUIRE_GPU();
  if (!on_sm90a()) GTEST_SKIP() << "the band kernel runs on sm_90a only";
  struct {
    const char* spec;
    int64_t L;
    bool rmax;
  } const cases[] = {{"causal", 4096, true},      {"causal", 16384, true}, {"causal", 1500, false},
                     {"local(256)", 16384, false}, {"local(1024)", 8192, true}};
  for (const auto& c : cases) {
    spattn::Problem pr;
    pr.batch = 1, pr.q_heads = pr.kv_heads = 2, pr.q_len = pr.kv_len = c.L, pr.head_dim = 64;
    pr.dtype = DType::bf16;
    spattn::cuda::fused::FusedAttention attn(spattn::parse(c.spec).bind(c.L), 64, {});
    const std::string name = attn.kernel_name();
    EXPECT_NE(name.find("_band"), std::string::npos) << c.spec << " L=" << c.L << ": " << name;
    EXPECT_EQ(name.find("_rmax") != std::string::npos, c.rmax) << c.spec << " L=" << c.L << ": " << name;
  }
}

TEST(FusedApi, BandOutputWithoutTensorMap) {
  REQUIRE_GPU();
  const int64_t B = 1, H = 2, L = 1023, D = 64;
  const auto bound = spattn::parse("local(256)").bind(L);
  spattn::Problem pr;
  pr.batch = B, pr.q_heads = pr.kv_heads = H, pr.q_len = pr.kv_len = L, pr.head_dim = D;
  pr.dtype = DType::bf16;
  const size_t n = size_t(B * L * H * D);
  const int64_t row = H * D + 2;  // 260 bytes between tokens: 4-byte aligned, no tensor map
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> h(3 * n);
  for (auto& x : h) x = spattn::float_to_bf16(nd(rng));
  DeviceBuf din(3 * n * 2), d1(n * 2), d2(size_t(B * L * row) * 2);
  ASSERT_EQ(cudaMemcpy(din.p, h.data(), 3 * n * 2, cudaMemcpyHostToDevice), cudaSuccess);
  auto tv = [&](void* p) { return TensorView::contiguous(p, DType::bf16, {B, L, H, D}); };
  auto* base = static_cast<uint8_t*>(din.p);
  const TensorView q = tv(base), k = tv(base + 2 * n), v = tv(base + 4 * n);
  const TensorView o_strided{d2.p, DType::bf16, {B, L, H, D}, {L * row, row, D, 1}};
  spattn::plan::FusedOptions opt;
  opt.band = 1;
  spattn::cuda::fused::FusedAttention attn(bound, D, opt);
  ASSERT_TRUE(attn.can_implement(pr, q, k, v, tv(d1.p), TensorView{}).ok);
  const auto st = attn.can_implement(pr, q, k, v, o_strided, TensorView{});
  ASSERT_TRUE(st.ok) << st.reason;
  attn.run(pr, q, k, v, tv(d1.p), TensorView{}, nullptr);
  if (on_sm90a()) EXPECT_TRUE(spattn::plan::is_band(spattn::plan::kKernels[attn.last_kernel_row()].kind));
  attn.run(pr, q, k, v, o_strided, TensorView{}, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (on_sm90a())
    EXPECT_EQ(spattn::plan::kKernels[attn.last_kernel_row()].kind, spattn::plan::KernelKind::sm90_tma)
        << "an output without a tensor map runs the band plan through the TMA kernel";
  std::vector<uint16_t> o1(n), o2(size_t(B * L * row));
  ASSERT_EQ(cudaMemcpy(o1.data(), d1.p, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(o2.data(), d2.p, o2.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  double worst = 0;
  for (int64_t t = 0; t < L; ++t)
    for (int64_t i = 0; i < H * D; ++i)
      worst = std::max(worst, double(std::abs(spattn::bf16_to_float(o1[size_t(t * H * D + i)]) -
                                              spattn::bf16_to_float(o2[size_t(t * row + i)]))));
  EXPECT_LT(worst, 2e-2) << "band kernel vs its fallback for an output without a tensor map";
}
}  // namespace
