// tests/gpu/plan_run.hpp — a spattn::Plan run on the GPU against the reference engine (shared by the GPU tests of
// spattn::Plan: plan_gpu_test.cpp, neighborhood_test.cpp).
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "spattn/plan.hpp"

namespace spattn::test {

using spattn::DType;
using spattn::TensorView;

struct Buf {
  void* p = nullptr;
  explicit Buf(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
  ~Buf() { cudaFree(p); }
};

// f(a, b, c, d) for every index of a 4-D shape, row-major (the order of a contiguous tensor's elements).
template <class F>
inline void for_each_index(const std::array<int64_t, 4>& s, F f) {
  for (int64_t a = 0; a < s[0]; ++a)
    for (int64_t b = 0; b < s[1]; ++b)
      for (int64_t c = 0; c < s[2]; ++c)
        for (int64_t d = 0; d < s[3]; ++d) f(a, b, c, d);
}

// Runs `plan` on the GPU with random inputs of `dt` and compares O with the reference engine's on the same
// (rounded) inputs; returns the relative error. lse_err: where given, the largest |lse - reference lse| over rows
// with keys (an empty row must give -inf exactly, else it counts as infinite error).
inline double run_vs_reference(const spattn::Plan& plan, const std::vector<spattn::Pattern>& pats, DType dt,
                               uint32_t seed, double* lse_err = nullptr) {
  const spattn::Problem& p = plan.problem();
  const int es = spattn::dtype_size(dt);
  const size_t nq = size_t(p.batch * p.q_len * p.q_heads * p.head_dim), nk = size_t(p.batch * p.kv_len * p.kv_heads * p.head_dim);
  std::vector<uint8_t> hq(nq * es), hk(nk * es), hv(nk * es);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto fill = [&](std::vector<uint8_t>& h, std::array<int64_t, 4> shape) {
    const TensorView t = TensorView::contiguous(h.data(), dt, shape);
    for_each_index(shape, [&](int64_t a, int64_t b, int64_t c, int64_t d) { t.store(a, b, c, d, nd(rng)); });
    return t;
  };
  const TensorView tq = fill(hq, {p.batch, p.q_len, p.q_heads, p.head_dim});
  const TensorView tk = fill(hk, {p.batch, p.kv_len, p.kv_heads, p.head_dim});
  const TensorView tv = fill(hv, {p.batch, p.kv_len, p.kv_heads, p.head_dim});
  Buf dq(hq.size()), dk(hk.size()), dv(hv.size()), dout(nq * es), dlse(size_t(p.batch * p.q_heads * p.q_len) * 4);
  EXPECT_EQ(cudaMemset(dout.p, 0xFF, nq * es), cudaSuccess);  // NaN poison: an unwritten output row fails
  EXPECT_EQ(cudaMemset(dlse.p, 0xFF, size_t(p.batch * p.q_heads * p.q_len) * 4), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(dq.p, hq.data(), hq.size(), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(dk.p, hk.data(), hk.size(), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(dv.p, hv.data(), hv.size(), cudaMemcpyHostToDevice), cudaSuccess);
  plan.forward(TensorView::contiguous(dq.p, dt, tq.shape), TensorView::contiguous(dk.p, dt, tk.shape),
               TensorView::contiguous(dv.p, dt, tv.shape), TensorView::contiguous(dout.p, dt, tq.shape),
               TensorView::contiguous(dlse.p, DType::f32, {p.batch, p.q_heads, p.q_len, 1}));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> ho(nq * es);
  EXPECT_EQ(cudaMemcpy(ho.data(), dout.p, ho.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  spattn::PlanOptions ref;
  ref.engine = spattn::Engine::reference;
  std::vector<double> ro(nq);
  const size_t nl = size_t(p.batch * p.q_heads * p.q_len);
  std::vector<double> rl(nl);
  spattn::make_plan(pats, p, spattn::Device::cpu(), ref)
      .forward(tq, tk, tv, TensorView::contiguous(ro.data(), DType::f64, tq.shape),
               TensorView::contiguous(rl.data(), DType::f64, {p.batch, p.q_heads, p.q_len, 1}));
  if (lse_err) {
    std::vector<float> hl(nl);
    EXPECT_EQ(cudaMemcpy(hl.data(), dlse.p, nl * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    *lse_err = 0;
    for (size_t j = 0; j < nl; ++j)
      *lse_err = std::max(*lse_err, std::isinf(rl[j])     ? (hl[j] == rl[j] ? 0.0 : INFINITY)
                                    : std::isnan(hl[j]) ? INFINITY  // unwritten (poisoned) or NaN
                                                        : std::fabs(hl[j] - rl[j]));
  }
  const TensorView got = TensorView::contiguous(ho.data(), dt, tq.shape);
  double num = 0, den = 0;
  size_t i = 0;
  for_each_index({tq.shape[0], tq.shape[1], tq.shape[2], tq.shape[3]}, [&](int64_t a, int64_t b, int64_t c, int64_t d) {
    const double x = got.load(a, b, c, d);
    num += (x - ro[i]) * (x - ro[i]);
    den += ro[i] * ro[i];
    ++i;
  });
  return std::sqrt(num / std::max(den, 1e-30));
}

inline spattn::Problem problem(int64_t B, int64_t H, int64_t HK, int64_t L, int64_t D, DType dt) {
  spattn::Problem p;
  p.batch = B, p.q_heads = H, p.kv_heads = HK, p.q_len = p.kv_len = L, p.head_dim = D, p.dtype = dt;
  return p;
}

}  // namespace spattn::test
