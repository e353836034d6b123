// Guards the CPU reference attention against a direct naive formula (dense scores, mask from the
// predicate, softmax), for GQA, Dv != D, custom scale, strided views, fp16/bf16 inputs, fully masked rows.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "spattn/reference.hpp"

using namespace spattn;

namespace {

struct Case {
  int64_t B, Lq, Lk, H, HK, D, Dv;
  std::string spec;
  DType dtype = DType::f32;
  std::optional<double> scale;  // none: 1 / sqrt(D)
};

// Naive: S = Q K^T * scale over all keys, masked entries dropped, softmax, P V; all in double.
void naive(const Case& c, const std::vector<double>& Q, const std::vector<double>& K, const std::vector<double>& V,
           std::vector<double>& O, std::vector<double>& LSE) {
  const BoundPattern p = Pattern::parse(c.spec).bind(c.Lq, c.Lk);
  const double scale = c.scale ? *c.scale : 1.0 / std::sqrt(double(c.D));
  O.assign(size_t(c.B * c.Lq * c.H * c.Dv), 0.0);
  LSE.assign(size_t(c.B * c.H * c.Lq), -std::numeric_limits<double>::infinity());
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h) {
      const int64_t hk = h / (c.H / c.HK);
      for (int64_t i = 0; i < c.Lq; ++i) {
        std::vector<double> s(size_t(c.Lk), -std::numeric_limits<double>::infinity());
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < c.Lk; ++j) {
          if (!p.contains(i, j)) continue;
          double d = 0;
          for (int64_t x = 0; x < c.D; ++x) d += Q[size_t(((b * c.Lq + i) * c.H + h) * c.D + x)] * K[size_t(((b * c.Lk + j) * c.HK + hk) * c.D + x)];
          s[size_t(j)] = d * scale;
          m = std::max(m, s[size_t(j)]);
        }
        if (m == -std::numeric_limits<double>::infinity()) continue;
        double sum = 0;
        for (int64_t j = 0; j < c.Lk; ++j) sum += std::exp(s[size_t(j)] - m);
        for (int64_t j = 0; j < c.Lk; ++j) {
          const double w = std::exp(s[size_t(j)] - m) / sum;
          for (int64_t x = 0; x < c.Dv; ++x) O[size_t(((b * c.Lq + i) * c.H + h) * c.Dv + x)] += w * V[size_t(((b * c.Lk + j) * c.HK + hk) * c.Dv + x)];
        }
        LSE[size_t((b * c.H + h) * c.Lq + i)] = m + std::log(sum);
      }
    }
}

// Stores values into a buffer of the given dtype with a [B, H, L, D] memory order, and returns a strided
// [B, L, H, D] view of it (so the reference reads a non-contiguous view). `vals` come back rounded.
TensorView strided_store(DType t, std::array<int64_t, 4> shape, std::vector<double>& vals, std::vector<uint8_t>& buf) {
  const int64_t B = shape[0], L = shape[1], H = shape[2], D = shape[3];
  buf.assign(size_t(B * L * H * D * dtype_size(t)), 0);
  TensorView v{buf.data(), t, shape, {H * L * D, D, L * D, 1}};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t l = 0; l < L; ++l)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          double& x = vals[size_t(((b * L + l) * H + h) * D + d)];
          v.store(b, l, h, d, x);
          x = v.load(b, l, h, d);
        }
  return v;
}

double run_case(const Case& c, bool strided) {
  std::mt19937_64 rng(1234 + c.Lq * 7 + c.H);
  std::normal_distribution<double> nd;
  std::vector<double> Q(size_t(c.B * c.Lq * c.H * c.D)), K(size_t(c.B * c.Lk * c.HK * c.D)), V(size_t(c.B * c.Lk * c.HK * c.Dv));
  for (auto* v : {&Q, &K, &V})
    for (double& x : *v) x = nd(rng);
  std::vector<uint8_t> qb, kb, vb;
  TensorView q, k, v;
  if (strided) {
    q = strided_store(c.dtype, {c.B, c.Lq, c.H, c.D}, Q, qb);
    k = strided_store(c.dtype, {c.B, c.Lk, c.HK, c.D}, K, kb);
    v = strided_store(c.dtype, {c.B, c.Lk, c.HK, c.Dv}, V, vb);
  } else {
    auto contiguous = [&](std::vector<double>& vals, std::array<int64_t, 4> shape, std::vector<uint8_t>& buf) {
      buf.assign(vals.size() * size_t(dtype_size(c.dtype)), 0);
      TensorView t = TensorView::contiguous(buf.data(), c.dtype, shape);
      for (size_t i = 0; i < vals.size(); ++i) {
        const int64_t d = int64_t(i) % shape[3], h = int64_t(i) / shape[3] % shape[2], l = int64_t(i) / (shape[3] * shape[2]) % shape[1],
                      b = int64_t(i) / (shape[3] * shape[2] * shape[1]);
        t.store(b, l, h, d, vals[i]);
        vals[i] = t.load(b, l, h, d);
      }
      return t;
    };
    q = contiguous(Q, {c.B, c.Lq, c.H, c.D}, qb);
    k = contiguous(K, {c.B, c.Lk, c.HK, c.D}, kb);
    v = contiguous(V, {c.B, c.Lk, c.HK, c.Dv}, vb);
  }
  std::vector<double> O, LSE;
  naive(c, Q, K, V, O, LSE);
  std::vector<float> o(O.size()), lse(LSE.size());
  Problem p{c.B, c.H, c.HK, c.Lq, c.Lk, c.D, c.Dv, c.dtype, c.scale};
  cpu::reference_attention({Pattern::parse(c.spec).bind(c.Lq, c.Lk)}, p, q, k, v,
                           TensorView::contiguous(o.data(), DType::f32, {c.B, c.Lq, c.H, c.Dv}),
                           TensorView::contiguous(lse.data(), DType::f32, {c.B, c.H, c.Lq, 1}));
  double num = 0, den = 0;
  for (size_t i = 0; i < O.size(); ++i) {
    num += (o[i] - O[i]) * (o[i] - O[i]);
    den += O[i] * O[i];
  }
  for (size_t i = 0; i < LSE.size(); ++i) {
    if (std::isinf(LSE[i])) {
      EXPECT_TRUE(std::isinf(lse[i]) && lse[i] < 0) << "LSE of a fully masked row must be -inf";
    } else {
      EXPECT_NEAR(lse[i], LSE[i], 1e-5 * std::max(1.0, std::abs(LSE[i])));
    }
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace

TEST(Reference, MatchesNaiveFormula) {
  const Case cases[] = {
      {1, 113, 113, 2, 2, 16, 16, "local(5) | global(0:3)"},
      {2, 7, 7, 4, 2, 8, 8, "causal"},                                  // GQA 2:1, awkward size
      {1, 64, 64, 4, 1, 32, 8, "bigbird(8, 1, 1, 1, seed=2)"},         // MQA, Dv != D
      {1, 50, 77, 2, 2, 16, 16, "dilated(3, 2) | stride(11)"},          // cross attention
      {1, 40, 40, 2, 2, 16, 16, "sparse_strided(6)", DType::f32, 0.37}, // custom scale
      {1, 40, 40, 2, 2, 16, 16, "local(4) | global(0)", DType::f32, 0.0}, // scale 0: uniform, not the default
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    EXPECT_LT(run_case(c, false), 1e-6);
    EXPECT_LT(run_case(c, true), 1e-6) << "strided view";
  }
}

TEST(Reference, HalfAndBfloat16Inputs) {
  for (DType t : {DType::f16, DType::bf16}) {
    Case c{1, 57, 57, 2, 1, 16, 16, "longformer(4, 2)", t};
    EXPECT_LT(run_case(c, true), 1e-6) << dtype_name(t);
  }
}

// fp16 conversion (inputs stored as half): every half value survives float and back, bit for bit; floats in the
// half-subnormal range round to nearest even (they were all flushed to 0, through a shift past 31 bits that
// UBSan reports).
TEST(Reference, HalfConversionRoundTripsAndKeepsSubnormals) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // NaN: any NaN will do
    ASSERT_EQ(spattn::float_to_half(spattn::half_to_float(uint16_t(h))), h) << std::hex << h;
  }
  EXPECT_EQ(spattn::float_to_half(std::ldexp(1.f, -15)), 0x0200);
  EXPECT_EQ(spattn::float_to_half(std::ldexp(1.f, -24)), 0x0001);
  EXPECT_EQ(spattn::float_to_half(std::ldexp(1.5f, -24)), 0x0002);  // a tie, to even
  EXPECT_EQ(spattn::float_to_half(std::ldexp(1.f, -25)), 0x0000);   // a tie, to even
  EXPECT_EQ(spattn::float_to_half(std::ldexp(1.01f, -25)), 0x0001);
}

TEST(Reference, FullyMaskedRowsGiveZeroAndMinusInf) {
  const Case c{1, 20, 20, 2, 2, 8, 8, "global_rows(0:3)"};
  std::vector<double> Q(size_t(20 * 2 * 8), 1.0), K = Q, V = Q;
  std::vector<float> o(Q.size(), 123.f), lse(size_t(2 * 20), 123.f);
  std::vector<float> qf(Q.begin(), Q.end());
  const TensorView q = TensorView::contiguous(qf.data(), DType::f32, {1, 20, 2, 8});
  cpu::reference_attention({Pattern::parse(c.spec).bind(20)}, Problem{1, 2, 2, 20, 20, 8, 0, DType::f32}, q, q, q,
                           TensorView::contiguous(o.data(), DType::f32, {1, 20, 2, 8}),
                           TensorView::contiguous(lse.data(), DType::f32, {1, 2, 20, 1}));
  for (int64_t i = 3 * 2 * 8; i < int64_t(o.size()); ++i) ASSERT_EQ(o[size_t(i)], 0.f);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 20; ++i) {
      const float l = lse[size_t(h * 20 + i)];
      if (i < 3) {
        EXPECT_TRUE(std::isfinite(l));
      } else {
        EXPECT_TRUE(std::isinf(l) && l < 0);
      }
    }
}

TEST(Reference, PerHeadPatterns) {
  // Head 0 causal, head 1 local(1): each head must follow its own pattern.
  const int64_t L = 9;
  std::vector<float> x(size_t(L * 2 * 4));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(double(i)));
  std::vector<float> o(x.size()), lse(size_t(2 * L)), o2(x.size()), lse2(size_t(2 * L));
  const TensorView t = TensorView::contiguous(x.data(), DType::f32, {1, L, 2, 4});
  Problem p{1, 2, 2, L, L, 4, 0, DType::f32};
  cpu::reference_attention({Pattern::parse("causal").bind(L), Pattern::parse("local(1)").bind(L)}, p, t, t, t,
                           TensorView::contiguous(o.data(), DType::f32, {1, L, 2, 4}), TensorView::contiguous(lse.data(), DType::f32, {1, 2, L, 1}));
  cpu::reference_attention({Pattern::parse("local(1)").bind(L)}, p, t, t, t, TensorView::contiguous(o2.data(), DType::f32, {1, L, 2, 4}),
                           TensorView::contiguous(lse2.data(), DType::f32, {1, 2, L, 1}));
  for (int64_t i = 0; i < L; ++i) EXPECT_EQ(lse[size_t(L + i)], lse2[size_t(L + i)]) << "head 1 is local(1) in both runs";
  EXPECT_NE(lse[size_t(L - 1)], lse2[size_t(L - 1)]) << "head 0 is causal in the first run";
}

TEST(Reference, RejectsBadShapes) {
  std::vector<float> x(64);
  const TensorView t = TensorView::contiguous(x.data(), DType::f32, {1, 4, 2, 8});
  const TensorView bad = TensorView::contiguous(x.data(), DType::f32, {1, 4, 2, 4});
  Problem p{1, 2, 2, 4, 4, 8, 0, DType::f32};
  const auto pat = Pattern::parse("dense").bind(4);
  std::vector<float> lse(8);
  const TensorView l = TensorView::contiguous(lse.data(), DType::f32, {1, 2, 4, 1});
  try {
    cpu::reference_attention({pat}, p, t, bad, t, t, l);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("k: dimension 3 is 4, expected 8 (shape [1, 4, 2, 4], expected [1, 4, 2, 8])"), std::string::npos) << e.what();
  }
  Problem gqa = p;
  gqa.kv_heads = 3;
  EXPECT_THROW(cpu::reference_attention({pat}, gqa, t, t, t, t, l), Error);
  EXPECT_THROW(cpu::reference_attention({Pattern::parse("dense").bind(5)}, p, t, t, t, t, l), Error);
}
