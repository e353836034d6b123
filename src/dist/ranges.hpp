// dist/ranges.hpp — set algebra on index ranges (sorted, disjoint, non-empty after normalize), for the exchange
// schedule of a distributed plan.
#pragma once
#include <algorithm>
#include <string>
#include <utility>

#include "spattn/pattern.hpp"

namespace spattn::dist::detail {

// Sorted, empty ranges dropped, overlapping or touching ranges merged.
inline IndexRanges normalized(IndexRanges r) {
  std::erase_if(r, [](const IndexRange& x) { return x.size() <= 0; });
  std::sort(r.begin(), r.end(), [](const IndexRange& a, const IndexRange& b) { return a.begin < b.begin; });
  IndexRanges out;
  for (const IndexRange& x : r) {
    if (!out.empty() && x.begin <= out.back().end)
      out.back().end = std::max(out.back().end, x.end);
    else
      out.push_back(x);
  }
  return out;
}

// a ∩ b, both normalized.
inline IndexRanges intersect(const IndexRanges& a, const IndexRanges& b) {
  IndexRanges out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const int64_t lo = std::max(a[i].begin, b[j].begin), hi = std::min(a[i].end, b[j].end);
    if (lo < hi) out.push_back({lo, hi});
    (a[i].end < b[j].end) ? ++i : ++j;
  }
  return out;
}

// a \ b, both normalized.
inline IndexRanges subtract(const IndexRanges& a, const IndexRanges& b) {
  IndexRanges out;
  size_t j = 0;
  for (IndexRange x : a) {
    while (j < b.size() && b[j].end <= x.begin) ++j;
    for (size_t t = j; t < b.size() && b[t].begin < x.end; ++t) {
      if (b[t].begin > x.begin) out.push_back({x.begin, b[t].begin});
      x.begin = std::max(x.begin, b[t].end);
    }
    if (x.begin < x.end) out.push_back(x);
  }
  return out;
}

// Global token -> index in a rank's tensors (its ranges in order).
class LocalIndex {
 public:
  explicit LocalIndex(const IndexRanges& owned) {
    int64_t off = 0;
    for (const IndexRange& r : owned) {
      if (r.size() > 0) sorted_.push_back({r.begin, r.end, off});
      off += r.size();
    }
    std::sort(sorted_.begin(), sorted_.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  }
  // The local index of global token g (owned), or -1.
  int64_t operator()(int64_t g) const {
    auto it = find(g);
    return it != sorted_.end() && it->begin <= g ? it->off + (g - it->begin) : -1;
  }
  // The local index of owned token g and how many tokens from g up to `end` follow it consecutively.
  std::pair<int64_t, int64_t> run(int64_t g, int64_t end) const {
    auto it = find(g);
    if (it == sorted_.end() || it->begin > g) throw Error("token " + std::to_string(g) + " is not the rank's");
    return {it->off + (g - it->begin), std::min(end, it->end) - g};
  }

 private:
  struct Entry {
    int64_t begin, end, off;
  };
  std::vector<Entry>::const_iterator find(int64_t g) const {
    return std::upper_bound(sorted_.begin(), sorted_.end(), g, [](int64_t v, const Entry& e) { return v < e.end; });
  }
  std::vector<Entry> sorted_;
};

}  // namespace spattn::dist::detail
