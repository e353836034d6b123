// tests/large_test.cpp — the CPU engine past 32-bit counts: more than 2^31 kept scores in one head.
//
// causal at L = 65537 keeps L (L + 1) / 2 = 2147581953 > 2^31 scores a head: every nnz sum, tile count, key-list
// offset and row offset of the plan must be 64-bit. At head dim 4 the forward is ~1 s and the backward ~2 s on
// two cores; the checks are a few rows in fp64, computed here straight from the inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "spattn/pattern.hpp"
#include "spattn/plan.hpp"

namespace {

using spattn::DType;
using spattn::TensorView;

TEST(Large, CausalPast2To31KeptScoresInOneHead) {
  constexpr int64_t L = 65537, D = 4;
  const int64_t nnz = L * (L + 1) / 2;
  ASSERT_GT(nnz, int64_t(1) << 31);
  spattn::Problem pr;
  pr.q_len = pr.kv_len = L, pr.head_dim = D;
  const spattn::Plan plan = spattn::make_plan(spattn::parse("causal"), pr, spattn::Device::cpu());
  EXPECT_EQ(plan.nnz(), nnz);
  EXPECT_NE(plan.explain().find("nnz " + std::to_string(nnz)), std::string::npos) << plan.explain();

  std::vector<float> q(size_t(L * D)), k(q.size()), v(q.size()), dout(q.size()), o(q.size()), lse(static_cast<size_t>(L));
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto* t : {&q, &k, &v, &dout})
    for (float& x : *t) x = nd(rng);
  auto view = [&](std::vector<float>& t) { return TensorView::contiguous(t.data(), DType::f32, {1, L, 1, D}); };
  plan.forward(view(q), view(k), view(v), view(o), TensorView::contiguous(lse.data(), DType::f32, {1, 1, L, 1}));
  const double scale = 1.0 / std::sqrt(double(D));
  auto score = [&](int64_t i, int64_t j) {
    double s = 0;
    for (int64_t d = 0; d < D; ++d) s += double(q[size_t(i * D + d)]) * k[size_t(j * D + d)];
    return s * scale;
  };
  // Rows at the start, around 2^15 and 2^16 (the last rows' keys sit past 2^31 kept scores of the head).
  for (int64_t i : {int64_t(0), int64_t(1), int64_t(32767), int64_t(32768), L - 2, L - 1}) {
    double m = -INFINITY;
    for (int64_t j = 0; j <= i; ++j) m = std::max(m, score(i, j));
    double sum = 0, acc[D] = {};
    for (int64_t j = 0; j <= i; ++j) {
      const double p = std::exp(score(i, j) - m);
      sum += p;
      for (int64_t d = 0; d < D; ++d) acc[d] += p * v[size_t(j * D + d)];
    }
    for (int64_t d = 0; d < D; ++d) EXPECT_NEAR(o[size_t(i * D + d)], acc[d] / sum, 1e-5) << "row " << i;
    EXPECT_NEAR(lse[size_t(i)], m + std::log(sum), 1e-4) << "row " << i;
  }

  std::vector<float> dq(q.size()), dk(q.size()), dv(q.size());
  plan.backward(view(q), view(k), view(v), view(o), TensorView::contiguous(lse.data(), DType::f32, {1, 1, L, 1}),
                view(dout), view(dq), view(dk), view(dv));
  // The gradients from the forward's O and LSE (what the backward takes): P = exp(s - lse), delta = rowsum(dO O),
  // dS = P (dO.v - delta); dQ_i = scale sum_j dS_ij k_j, dK_j = scale sum_i dS_ij q_i, dV_j = sum_i P_ij dO_i.
  auto delta = [&](int64_t i) {
    double s = 0;
    for (int64_t d = 0; d < D; ++d) s += double(dout[size_t(i * D + d)]) * o[size_t(i * D + d)];
    return s;
  };
  auto dp = [&](int64_t i, int64_t j) {
    double s = 0;
    for (int64_t d = 0; d < D; ++d) s += double(dout[size_t(i * D + d)]) * v[size_t(j * D + d)];
    return s;
  };
  for (int64_t i : {int64_t(0), int64_t(40000), L - 1}) {
    double g[D] = {};
    for (int64_t j = 0; j <= i; ++j) {
      const double ds = std::exp(score(i, j) - lse[size_t(i)]) * (dp(i, j) - delta(i));
      for (int64_t d = 0; d < D; ++d) g[d] += scale * ds * k[size_t(j * D + d)];
    }
    for (int64_t d = 0; d < D; ++d) EXPECT_NEAR(dq[size_t(i * D + d)], g[d], 1e-4) << "dq row " << i;
  }
  for (int64_t j : {int64_t(0), int64_t(40000), L - 1}) {  // key 0 gathers every query row
    double gk[D] = {}, gv[D] = {};
    for (int64_t i = j; i < L; ++i) {
      const double p = std::exp(score(i, j) - lse[size_t(i)]), ds = p * (dp(i, j) - delta(i));
      for (int64_t d = 0; d < D; ++d) {
        gk[d] += scale * ds * q[size_t(i * D + d)];
        gv[d] += p * dout[size_t(i * D + d)];
      }
    }
    for (int64_t d = 0; d < D; ++d) {
      EXPECT_NEAR(dk[size_t(j * D + d)], gk[d], 1e-4) << "dk row " << j;
      EXPECT_NEAR(dv[size_t(j * D + d)], gv[d], 1e-4) << "dv row " << j;
    }
  }
}

}  // namespace
