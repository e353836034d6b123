// tests/gpu/fused_test.cpp — the fused block-sparse attention kernel against the CPU reference (fp64,
// straight from pattern.contains, sharing no code with the plan or the kernel).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "plan/block_plan.hpp"
#include "spattn/fused.hpp"
#include "spattn/reference.hpp"

namespace {

using spattn::DType;
using spattn::TensorView;

bool have_gpu(std::string& why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    why = std::string("no CUDA device: ") + cudaGetErrorString(e);
    return false;
  }
  if (n == 0) {
    why = "no CUDA device";
    return false;
  }
  return true;
}

#define REQUIRE_GPU()                    \
  do {                                   \
    std::string why;                     \
    if (!have_gpu(why)) GTEST_SKIP() << why; \
  } while (0)

struct Case {
  const char* what;  // the failure it guards against
  std::string spec;
  int64_t B, Hq, Hkv, Lq, Lk, D;
  DType dtype;
  int block = 0;  // 0: planner's choice; 64 or 128: forced square tiles
  bool sm80 = false;
  int perm_d = -1;
  int block_n = 0;  // 0: same as block
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << c.what << " [" << c.spec << " B" << c.B << " H" << c.Hq << "/" << c.Hkv << " L" << c.Lq << "x" << c.Lk
            << " D" << c.D << " " << spattn::dtype_name(c.dtype) << " block " << c.block << (c.sm80 ? " sm80" : "")
            << "]";
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
  auto hq = fill(nq), hk = fill(nk), hv = fill(nk);
  DeviceBuf dq(nq * 2), dk(nk * 2), dv(nk * 2), dout(nq * 2), dlse(size_t(c.B * c.Hq * c.Lq) * 4);
  ASSERT_EQ(cudaMemcpy(dq.p, hq.data(), nq * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dk.p, hk.data(), nk * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dv.p, hv.data(), nk * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(dout.p, 0xFF, nq * 2), cudaSuccess);  // NaN poison: an unwritten element fails
  ASSERT_EQ(cudaMemset(dlse.p, 0xFF, size_t(c.B * c.Hq * c.Lq) * 4), cudaSuccess);

  spattn::FusedOptions opt;
  opt.block_m = c.block;
  opt.block_n = c.block_n ? c.block_n : c.block;
  opt.force_sm80 = c.sm80;
  opt.perm_d = c.perm_d;
  spattn::FusedAttention attn(bound, c.D, opt);
  auto tv = [&](void* p, int64_t L, int64_t H) { return TensorView::contiguous(p, c.dtype, {c.B, L, H, c.D}); };
  const TensorView q = tv(dq.p, c.Lq, c.Hq), k = tv(dk.p, c.Lk, c.Hkv), v = tv(dv.p, c.Lk, c.Hkv),
                   o = tv(dout.p, c.Lq, c.Hq);
  const TensorView lse = TensorView::contiguous(dlse.p, DType::f32, {c.B, c.Hq, c.Lq, 1});
  const auto st = attn.can_implement(pr, q, k, v, o, lse);
  ASSERT_TRUE(st.ok) << st.reason;
  attn.run(pr, q, k, v, o, lse, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> ho(nq);
  std::vector<float> hlse(size_t(c.B * c.Hq * c.Lq));
  ASSERT_EQ(cudaMemcpy(ho.data(), dout.p, nq * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(hlse.data(), dlse.p, hlse.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);

  // Reference on the same (rounded) inputs.
  std::vector<double> ro(nq), rlse(hlse.size());
  auto hv_ = [&](std::vector<uint16_t>& x, int64_t L, int64_t H) {
    return TensorView::contiguous(x.data(), c.dtype, {c.B, L, H, c.D});
  };
  spattn::cpu::reference_attention({bound}, pr, hv_(hq, c.Lq, c.Hq), hv_(hk, c.Lk, c.Hkv), hv_(hv, c.Lk, c.Hkv),
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
  std::cout << "  " << c.what << ": rel err " << rel << "; " << attn.explain() << "\n";
}

class FusedSuite : public ::testing::TestWithParam<Case> {};
TEST_P(FusedSuite, MatchesReference) {
  REQUIRE_GPU();
  check_case(GetParam());
}

constexpr DType bf = DType::bf16, fp = DType::f16;
const Case kCases[] = {
    // Every pattern of the standard suite (BENCH.md), small lengths so the fp64 reference stays quick.
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
};
INSTANTIATE_TEST_SUITE_P(Fused, FusedSuite, ::testing::ValuesIn(kCases));

TEST(FusedPlan, BandAndPermutation) {
  // Host-only: the plan describes causal/local diagonals as bands and dilated rows as dense groups.
  const auto causal = spattn::parse("causal").bind(4096);
  const auto p = spattn::plan::build_block_plan(causal, 128, 128, 1);
  EXPECT_EQ(p.n_bitmask, 0);
  EXPECT_EQ(p.n_band, 32);
  EXPECT_EQ(p.nnz, int64_t(4096) * 4097 / 2);
  const auto dil = spattn::parse("dilated(256, 2)").bind(4096);
  EXPECT_EQ(spattn::plan::choose_permutation(dil), 2);
  const auto pd = spattn::plan::build_block_plan(dil, 128, 128, 2);
  EXPECT_EQ(pd.n_bitmask, 0);
  EXPECT_LT(pd.waste(), 1.5);
  const auto bb = spattn::parse("bigbird(64, 1, 2, 3, seed=0)").bind(4096);
  const auto pb = spattn::plan::choose_block_plan(bb, 64);
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
  spattn::FusedAttention attn(bound, 64);
  spattn::Problem pr;
  pr.q_len = pr.kv_len = 256;
  pr.head_dim = 64;
  pr.dtype = DType::f32;
  TensorView t = TensorView::contiguous(reinterpret_cast<void*>(256), DType::f32, {1, 256, 1, 64});
  const auto st = attn.can_implement(pr, t, t, t, t, TensorView{});
  EXPECT_FALSE(st.ok);
  EXPECT_NE(st.reason.find("dtype"), std::string::npos) << st.reason;
}

}  // namespace
