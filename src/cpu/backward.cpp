// cpu/backward.cpp — see backward.hpp.
#include "cpu/backward.hpp"

#include <algorithm>
#include <thread>

#include "common/parallel.hpp"
#include "cpu/softmax_row.hpp"

namespace spattn::cpu {

void exact_backward(const std::vector<BoundPattern>& patterns, const Problem& p, const TensorView& q,
                    const TensorView& k, const TensorView& v, const TensorView& dout, const TensorView& dq,
                    const TensorView& dk, const TensorView& dv, int threads, const std::vector<int64_t>& groups) {
  const int64_t B = p.batch, Lq = p.q_len, Lk = p.kv_len, H = p.q_heads, HK = p.kv_heads, D = p.head_dim, Dv = p.dv();
  const double scale = p.softmax_scale();
  const int64_t group = H / HK, tasks = groups.empty() ? B * HK : int64_t(groups.size());
  const int nthreads = int(std::clamp<int64_t>(threads > 0 ? threads : int64_t(common::hardware_threads()), 1,
                                               std::max<int64_t>(tasks, 1)));
  common::parallel_for(tasks, nthreads, [&](int64_t task, int) {
    const int64_t g = groups.empty() ? task : groups[size_t(task)];
    const int64_t b = g / HK, hk = g % HK;
    // This kv head's K and V as fp64 rows, and its gradient accumulators.
    std::vector<double> kk(size_t(Lk * D)), vv(size_t(Lk * Dv)), gk(size_t(Lk * D), 0.0), gv(size_t(Lk * Dv), 0.0);
    for (int64_t j = 0; j < Lk; ++j) {
      for (int64_t d = 0; d < D; ++d) kk[size_t(j * D + d)] = k.load(b, j, hk, d);
      for (int64_t d = 0; d < Dv; ++d) vv[size_t(j * Dv + d)] = v.load(b, j, hk, d);
    }
    std::vector<double> qrow(static_cast<size_t>(D)), drow(static_cast<size_t>(Dv)), gq(static_cast<size_t>(D)), s, dp;
    std::vector<int64_t> keys;
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      const BoundPattern& pat = patterns.size() == 1 ? patterns[0] : patterns[size_t(h)];
      for (int64_t i = 0; i < Lq; ++i) {
        pat.row_keys(i, keys);
        std::fill(gq.begin(), gq.end(), 0.0);
        if (!keys.empty()) {
          for (int64_t d = 0; d < D; ++d) qrow[size_t(d)] = q.load(b, i, h, d);
          for (int64_t d = 0; d < Dv; ++d) drow[size_t(d)] = dout.load(b, i, h, d);
          const size_t n = keys.size();
          s.resize(n);
          dp.resize(n);
          for (size_t t = 0; t < n; ++t) {
            const double* kr = &kk[size_t(keys[t] * D)];
            const double* vr = &vv[size_t(keys[t] * Dv)];
            double dot = 0, dd = 0;
            for (int64_t d = 0; d < D; ++d) dot += qrow[size_t(d)] * kr[d];
            for (int64_t d = 0; d < Dv; ++d) dd += drow[size_t(d)] * vr[d];
            s[t] = dot * scale;
            dp[t] = dd;
          }
          softmax_row(s);  // s now holds P
          double delta = 0;
          for (size_t t = 0; t < n; ++t) delta += s[t] * dp[t];
          for (size_t t = 0; t < n; ++t) {
            const double ds = s[t] * (dp[t] - delta) * scale;
            const double* kr = &kk[size_t(keys[t] * D)];
            double* gkr = &gk[size_t(keys[t] * D)];
            double* gvr = &gv[size_t(keys[t] * Dv)];
            for (int64_t d = 0; d < D; ++d) gq[size_t(d)] += ds * kr[d], gkr[d] += ds * qrow[size_t(d)];
            for (int64_t d = 0; d < Dv; ++d) gvr[d] += s[t] * drow[size_t(d)];
          }
        }
        for (int64_t d = 0; d < D; ++d) dq.store(b, i, h, d, gq[size_t(d)]);
      }
    }
    for (int64_t j = 0; j < Lk; ++j) {
      for (int64_t d = 0; d < D; ++d) dk.store(b, j, hk, d, gk[size_t(j * D + d)]);
      for (int64_t d = 0; d < Dv; ++d) dv.store(b, j, hk, d, gv[size_t(j * Dv + d)]);
    }
  });
}

}  // namespace spattn::cpu
