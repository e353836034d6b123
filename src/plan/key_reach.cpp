// plan/key_reach.cpp — keys_reached (key_reach.hpp).
#include "plan/key_reach.hpp"

#include <map>

namespace spattn::plan {

IndexRanges keys_reached(const std::vector<BoundPattern>& patterns, const IndexRanges& rows) {
  if (patterns.empty()) return {};
  const int64_t L = patterns[0].k_len();
  // diff[s][k]: +1 where a run of stride s starts at k, -1 one stride past its last key; summed in steps of s, a
  // key is reached where the sum is positive. Intervals (and single keys) are stride 1.
  std::map<int64_t, std::vector<int64_t>> diff;
  auto add = [&](int64_t stride, int64_t start, int64_t stop) {  // stop: one stride past the last key
    std::vector<int64_t>& d = diff[stride];
    if (d.empty()) d.assign(size_t(L + stride), 0);
    ++d[size_t(start)];
    --d[size_t(stop)];
  };
  RowRuns runs;
  for (const BoundPattern& p : patterns)
    for (const IndexRange& r : rows)
      for (int64_t q = r.begin; q < r.end; ++q) {
        p.row(q, runs);
        for (const Run& x : runs) {
          if (x.count == 1 || x.stride == 1)
            add(1, x.start, x.start + (x.stride == 1 ? x.count : 1));
          else
            add(x.stride, x.start, x.last() + x.stride);
        }
      }
  std::vector<char> reached(size_t(L), 0);
  for (auto& [s, d] : diff) {
    for (int64_t k = 0; k < L; ++k) {
      if (k >= s) d[size_t(k)] += d[size_t(k - s)];
      if (d[size_t(k)] > 0) reached[size_t(k)] = 1;
    }
  }
  IndexRanges out;
  for (int64_t k = 0; k < L; ++k) {
    if (!reached[size_t(k)]) continue;
    if (!out.empty() && out.back().end == k)
      ++out.back().end;
    else
      out.push_back({k, k + 1});
  }
  return out;
}

}  // namespace spattn::plan
