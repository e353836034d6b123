// examples/cpu_attention.cpp — sparse attention on the CPU through spattn::Plan, checked against the fp64
// reference (the same Plan API with Engine::reference). Built with the library (target spattn_example_cpu) and run by ctest (label "example"), so the
// README's snippet stays true.
#include <spattn/pattern.hpp>
#include <spattn/plan.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

int main() {
  const int64_t B = 1, L = 1024, H = 4, D = 64;
  spattn::Problem problem;
  problem.batch = B, problem.q_heads = problem.kv_heads = H, problem.q_len = problem.kv_len = L, problem.head_dim = D;

  // One pattern for every head (or one per query head: a std::vector<spattn::Pattern>).
  const spattn::Pattern pattern = spattn::parse("longformer(128, 16)");

  std::vector<float> q(B * L * H * D), k(q.size()), v(q.size()), o(q.size()), lse(B * H * L);
  std::mt19937 rng(1);
  std::normal_distribution<float> n01;
  for (auto* t : {&q, &k, &v})
    for (float& x : *t) x = n01(rng);
  using spattn::TensorView, spattn::DType;
  const TensorView tq = TensorView::contiguous(q.data(), DType::f32, {B, L, H, D});
  const TensorView tk = TensorView::contiguous(k.data(), DType::f32, {B, L, H, D});
  const TensorView tv = TensorView::contiguous(v.data(), DType::f32, {B, L, H, D});
  const TensorView to = TensorView::contiguous(o.data(), DType::f32, {B, L, H, D});
  const TensorView tl = TensorView::contiguous(lse.data(), DType::f32, {B, H, L, 1});

  const spattn::Plan plan = spattn::make_plan(pattern, problem, spattn::Device::cpu());  // analyse once ...
  plan.forward(tq, tk, tv, to, tl);  // ... run as often as needed (all cores by default)
  std::printf("%s\n", plan.explain().c_str());

  // The oracle: fp64 straight from the pattern's definition.
  std::vector<float> o_ref(o.size()), lse_ref(lse.size());
  spattn::PlanOptions ref;
  ref.engine = spattn::Engine::reference;
  spattn::make_plan(pattern, problem, spattn::Device::cpu(), ref)
      .forward(tq, tk, tv, TensorView::contiguous(o_ref.data(), DType::f32, {B, L, H, D}),
               TensorView::contiguous(lse_ref.data(), DType::f32, {B, H, L, 1}));
  double num = 0, den = 0;
  for (size_t i = 0; i < o.size(); ++i) num += (o[i] - o_ref[i]) * double(o[i] - o_ref[i]), den += double(o_ref[i]) * o_ref[i];
  const double rel = std::sqrt(num / den);
  std::printf("relative error vs the fp64 reference: %.2e\n", rel);
  return rel <= 1e-5 ? 0 : 1;
}
