// The CPU reference attention: fp64 accumulation, straight from pattern.contains(q, k). It shares no code
// with formats, plans or fast kernels: it is the oracle they are all checked against.
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "spattn/reference.hpp"

namespace spattn::cpu {

void reference_attention(const std::vector<BoundPattern>& patterns, const Problem& p, const TensorView& q,
                         const TensorView& k, const TensorView& v, const TensorView& o, const TensorView& lse) {
  p.validate();
  const int64_t B = p.batch, Lq = p.q_len, Lk = p.kv_len, H = p.q_heads, HK = p.kv_heads, D = p.head_dim, Dv = p.dv();
  if (patterns.size() != 1 && int64_t(patterns.size()) != H)
    throw Error("expected 1 pattern or one per query head (" + std::to_string(H) + "), got " + std::to_string(patterns.size()));
  for (const BoundPattern& bp : patterns)
    if (bp.q_len() != Lq || bp.k_len() != Lk)
      throw Error("pattern '" + bp.spec() + "' is bound to " + std::to_string(bp.q_len()) + " x " + std::to_string(bp.k_len()) +
                  " but the problem is " + std::to_string(Lq) + " x " + std::to_string(Lk));
  Problem::check_view(q, "q", {B, Lq, H, D});
  Problem::check_view(k, "k", {B, Lk, HK, D});
  Problem::check_view(v, "v", {B, Lk, HK, Dv});
  Problem::check_view(o, "o", {B, Lq, H, Dv});
  if (o.dtype != DType::f32 && o.dtype != DType::f64) throw Error("reference output o must be fp32 or fp64");
  if (lse.data) {
    Problem::check_view(lse, "lse", {B, H, Lq, 1});
    if (lse.dtype != DType::f32 && lse.dtype != DType::f64) throw Error("reference lse must be fp32 or fp64");
  }
  const double scale = p.softmax_scale();
  const int64_t group = H / HK;
  const int64_t rows = B * H * Lq;
  const unsigned nthreads = std::max(1u, std::min(std::thread::hardware_concurrency(), 64u));
  auto work = [&](int64_t r0, int64_t r1) {
    std::vector<double> s(static_cast<size_t>(Lk)), qrow(static_cast<size_t>(D)), acc(static_cast<size_t>(Dv));
    std::vector<int64_t> kept;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / (H * Lq), h = (r / Lq) % H, i = r % Lq, hk = h / group;
      const BoundPattern& pat = patterns.size() == 1 ? patterns[0] : patterns[size_t(h)];
      for (int64_t d = 0; d < D; ++d) qrow[size_t(d)] = q.load(b, i, h, d);
      kept.clear();
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < Lk; ++j) {
        if (!pat.contains(i, j)) continue;
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += qrow[size_t(d)] * k.load(b, j, hk, d);
        s[size_t(j)] = dot * scale;
        m = std::max(m, s[size_t(j)]);
        kept.push_back(j);
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double l = -std::numeric_limits<double>::infinity();
      if (!kept.empty()) {
        double sum = 0;
        for (int64_t j : kept) sum += std::exp(s[size_t(j)] - m);
        for (int64_t j : kept) {
          const double w = std::exp(s[size_t(j)] - m) / sum;
          for (int64_t d = 0; d < Dv; ++d) acc[size_t(d)] += w * v.load(b, j, hk, d);
        }
        l = m + std::log(sum);
      }
      for (int64_t d = 0; d < Dv; ++d) o.store(b, i, h, d, acc[size_t(d)]);
      if (lse.data) lse.store(b, h, i, 0, l);
    }
  };
  std::vector<std::thread> pool;
  const int64_t chunk = (rows + nthreads - 1) / nthreads;
  for (unsigned t = 0; t < nthreads && int64_t(t) * chunk < rows; ++t)
    pool.emplace_back(work, int64_t(t) * chunk, std::min(rows, int64_t(t + 1) * chunk));
  for (auto& th : pool) th.join();
}

}  // namespace spattn::cpu
