// The CPU reference attention: fp64 accumulation, straight from pattern.contains(q, k). It shares no code
// with formats, plans or fast kernels: it is the oracle they are all checked against.
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "spattn/reference.hpp"
#include "common/parallel.hpp"

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
  const unsigned nthreads = unsigned(std::min(common::hardware_threads(), 64));
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

void reference_attention_backward(const std::vector<BoundPattern>& patterns, const Problem& p, const TensorView& q,
                                  const TensorView& k, const TensorView& v, const TensorView& dout,
                                  const TensorView& dq, const TensorView& dk, const TensorView& dv) {
  p.validate();
  const int64_t B = p.batch, Lq = p.q_len, Lk = p.kv_len, H = p.q_heads, HK = p.kv_heads, D = p.head_dim, Dv = p.dv();
  if (patterns.size() != 1 && int64_t(patterns.size()) != H)
    throw Error("expected 1 pattern or one per query head (" + std::to_string(H) + "), got " + std::to_string(patterns.size()));
  p.check_backward_views(q, k, v, dout, dq, dk, dv, true);
  const double scale = p.softmax_scale();
  const int64_t group = H / HK;
  // One task per (b, kv head): it owns dk and dv of that head and dq of the query heads that share it.
  auto work = [&](int64_t task) {
    const int64_t b = task / HK, hk = task % HK;
    std::vector<double> gk(static_cast<size_t>(Lk * D), 0.0), gv(static_cast<size_t>(Lk * Dv), 0.0);
    std::vector<double> s(static_cast<size_t>(Lk)), dp(static_cast<size_t>(Lk));
    std::vector<double> qrow(static_cast<size_t>(D)), gq(static_cast<size_t>(D)), drow(static_cast<size_t>(Dv));
    std::vector<int64_t> kept;
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      const BoundPattern& pat = patterns.size() == 1 ? patterns[0] : patterns[size_t(h)];
      for (int64_t i = 0; i < Lq; ++i) {
        for (int64_t d = 0; d < D; ++d) qrow[size_t(d)] = q.load(b, i, h, d);
        for (int64_t d = 0; d < Dv; ++d) drow[size_t(d)] = dout.load(b, i, h, d);
        kept.clear();
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < Lk; ++j) {
          if (!pat.contains(i, j)) continue;
          double dot = 0, dd = 0;
          for (int64_t d = 0; d < D; ++d) dot += qrow[size_t(d)] * k.load(b, j, hk, d);
          for (int64_t d = 0; d < Dv; ++d) dd += drow[size_t(d)] * v.load(b, j, hk, d);
          s[size_t(j)] = dot * scale;
          dp[size_t(j)] = dd;
          m = std::max(m, s[size_t(j)]);
          kept.push_back(j);
        }
        std::fill(gq.begin(), gq.end(), 0.0);
        if (!kept.empty()) {
          double sum = 0, delta = 0;
          for (int64_t j : kept) sum += std::exp(s[size_t(j)] - m);
          for (int64_t j : kept) delta += std::exp(s[size_t(j)] - m) / sum * dp[size_t(j)];
          for (int64_t j : kept) {
            const double pj = std::exp(s[size_t(j)] - m) / sum, ds = pj * (dp[size_t(j)] - delta) * scale;
            for (int64_t d = 0; d < D; ++d) {
              gq[size_t(d)] += ds * k.load(b, j, hk, d);
              gk[size_t(j * D + d)] += ds * qrow[size_t(d)];
            }
            for (int64_t d = 0; d < Dv; ++d) gv[size_t(j * Dv + d)] += pj * drow[size_t(d)];
          }
        }
        for (int64_t d = 0; d < D; ++d) dq.store(b, i, h, d, gq[size_t(d)]);
      }
    }
    for (int64_t j = 0; j < Lk; ++j) {
      for (int64_t d = 0; d < D; ++d) dk.store(b, j, hk, d, gk[size_t(j * D + d)]);
      for (int64_t d = 0; d < Dv; ++d) dv.store(b, j, hk, d, gv[size_t(j * Dv + d)]);
    }
  };
  const int64_t tasks = B * HK;
  const unsigned nthreads = unsigned(std::min(common::hardware_threads(), 64));
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < nthreads && int64_t(t) < tasks; ++t)
    pool.emplace_back([&, t] {
      for (int64_t task = t; task < tasks; task += nthreads) work(task);
    });
  for (auto& th : pool) th.join();
}

}  // namespace spattn::cpu
