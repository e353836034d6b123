// Run algebra: normalising, intersecting and compressing rows of keys given as affine runs.
#include <algorithm>
#include <numeric>

#include "pattern/ast.hpp"

namespace spattn {

int64_t count_keys(const RowRuns& runs) {
  int64_t n = 0;
  for (const Run& r : runs) n += r.count;
  return n;
}

void expand_runs(const RowRuns& runs, std::vector<int64_t>& keys) {
  keys.clear();
  bool sorted = true;
  int64_t prev = -1;
  for (const Run& r : runs) {
    for (int64_t i = 0; i < r.count; ++i) keys.push_back(r.start + i * r.stride);
    if (r.start <= prev) sorted = false;
    prev = std::max(prev, r.last());
  }
  if (!sorted) std::sort(keys.begin(), keys.end());
}

void compress_keys(const std::vector<int64_t>& keys, RowRuns& out) {
  // Greedy: a maximal stretch of keys with one common difference becomes one run.
  out.clear();
  size_t i = 0;
  const size_t n = keys.size();
  while (i < n) {
    if (i + 1 == n) {
      out.push_back({keys[i], 1, 1});
      break;
    }
    const int64_t d = keys[i + 1] - keys[i];
    size_t j = i + 1;
    while (j + 1 < n && keys[j + 1] - keys[j] == d) ++j;
    // A two-element stretch with a gap is kept as two single keys so that a later key may start a longer run.
    if (j == i + 1 && d != 1 && j + 1 < n) {
      out.push_back({keys[i], 1, 1});
      i += 1;
      continue;
    }
    out.push_back({keys[i], d, int64_t(j - i + 1)});
    i = j + 1;
  }
}

namespace detail {

bool run_has(const Run& r, int64_t k) {
  return k >= r.start && k <= r.last() && (k - r.start) % r.stride == 0;
}

namespace {

using Interval = std::pair<int64_t, int64_t>;  // [first, second)

void merge_intervals(std::vector<Interval>& iv) {
  if (iv.size() < 2) return;
  std::sort(iv.begin(), iv.end());
  size_t w = 0;
  for (size_t i = 1; i < iv.size(); ++i) {
    if (iv[i].first <= iv[w].second) {
      iv[w].second = std::max(iv[w].second, iv[i].second);
    } else {
      iv[++w] = iv[i];
    }
  }
  iv.resize(w + 1);
}

// Removes from strided run r every key inside the merged intervals iv; appends the pieces to out.
void subtract_intervals(const Run& r, const std::vector<Interval>& iv, std::vector<Run>& out) {
  int64_t lo = r.start;          // first key of the remaining part
  const int64_t last = r.last();
  // First interval that may overlap: the one whose end > lo.
  auto it = std::upper_bound(iv.begin(), iv.end(), lo,
                             [](int64_t v, const Interval& x) { return v < x.second; });
  for (; it != iv.end() && it->first <= last && lo <= last; ++it) {
    // keys of the run in [lo, it->first) survive
    if (it->first > lo) {
      const int64_t n = (it->first - 1 - lo) / r.stride + 1;
      out.push_back({lo, r.stride, n});
    }
    // skip keys < it->second
    if (it->second > lo) {
      const int64_t skip = (it->second - lo + r.stride - 1) / r.stride;
      lo += skip * r.stride;
    }
  }
  if (lo <= last) out.push_back({lo, r.stride, (last - lo) / r.stride + 1});
}

bool may_share(const Run& a, const Run& b) {
  if (a.last() < b.start || b.last() < a.start) return false;
  return (b.start - a.start) % std::gcd(a.stride, b.stride) == 0;
}

}  // namespace

void normalize(RowRuns& runs) {
  if (runs.size() <= 1) {  // one run is normalised as it is (a single key as an interval); no scratch
    if (!runs.empty() && runs[0].count <= 0) runs.clear();
    else if (!runs.empty() && runs[0].count == 1) runs[0].stride = 1;
    return;
  }
  // Per-thread scratch (nothing called from here normalises): two fresh vectors a call were most of the malloc and
  // free that took a quarter of a union's row walk (local(256) | random(4), L = 16384: its analysis).
  thread_local std::vector<Interval> iv;
  thread_local std::vector<Run> strided;
  iv.clear();
  strided.clear();
  for (const Run& r : runs) {
    if (r.count <= 0) continue;
    if (r.stride == 1 || r.count == 1) {
      iv.push_back({r.start, r.start + (r.stride == 1 ? r.count : 1)});
    } else {
      strided.push_back(r);
    }
  }
  merge_intervals(iv);
  if (!strided.empty()) {
    // (Per-thread too: two fresh vectors a row were a third of the count of sparse_fixed's rows, a block and its
    // summary columns, one row a block.)
    thread_local std::vector<Run> pieces_tl;
    thread_local std::vector<char> clash_tl;
    std::vector<Run>& pieces = pieces_tl;
    pieces.clear();
    for (const Run& r : strided) subtract_intervals(r, iv, pieces);
    // Strided pieces that may share keys with one another are expanded, deduplicated and recompressed.
    std::sort(pieces.begin(), pieces.end(), [](const Run& a, const Run& b) { return a.start < b.start; });
    clash_tl.assign(pieces.size(), 0);
    char* clash = clash_tl.data();  // (through a pointer: flags stored through the vector made every access reload it)
    const Run* pc = pieces.data();
    const size_t np = pieces.size();
    bool any = false;
    for (size_t i = 0; i < np; ++i)
      for (size_t j = i + 1; j < np && pc[j].start <= pc[i].last(); ++j)
        if (may_share(pc[i], pc[j])) clash[i] = clash[j] = 1, any = true;
    strided.clear();
    std::vector<int64_t> keys;
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (clash[i]) {
        for (int64_t t = 0; t < pieces[i].count; ++t) keys.push_back(pieces[i].start + t * pieces[i].stride);
      } else if (pieces[i].count == 1 || pieces[i].stride == 1) {
        iv.push_back({pieces[i].start, pieces[i].start + (pieces[i].stride == 1 ? pieces[i].count : 1)});
      } else {
        strided.push_back(pieces[i]);
      }
    }
    if (any) {
      std::sort(keys.begin(), keys.end());
      keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
      RowRuns re;
      compress_keys(keys, re);
      for (const Run& r : re) {
        if (r.stride == 1 || r.count == 1) {
          iv.push_back({r.start, r.start + (r.stride == 1 ? r.count : 1)});
        } else {
          strided.push_back(r);
        }
      }
    }
    merge_intervals(iv);
  }
  runs.clear();
  runs.reserve(iv.size() + strided.size());
  for (const Interval& x : iv) runs.push_back({x.first, 1, x.second - x.first});
  for (const Run& r : strided) runs.push_back(r);
  if (!strided.empty())
    std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.start < b.start; });
}

void intersect(const RowRuns& a, const RowRuns& b, RowRuns& out) {
  out.clear();
  for (const Run& x : a) {
    for (const Run& y : b) {
      const int64_t lo = std::max(x.start, y.start), hi = std::min(x.last(), y.last());
      if (lo > hi) continue;
      if (x.stride == 1 && y.stride == 1) {
        out.push_back({lo, 1, hi - lo + 1});
      } else if (x.stride == 1 || y.stride == 1) {
        const Run& s = x.stride == 1 ? y : x;  // the strided one, clipped to [lo, hi]
        const int64_t i0 = (lo - s.start + s.stride - 1) / s.stride, i1 = (hi - s.start) / s.stride;
        if (i0 <= i1) out.push_back({s.start + i0 * s.stride, s.stride, i1 - i0 + 1});
      } else {
        const Run& small = x.count <= y.count ? x : y;
        const Run& other = x.count <= y.count ? y : x;
        for (int64_t t = 0; t < small.count; ++t) {
          const int64_t k = small.start + t * small.stride;
          if (k >= lo && k <= hi && run_has(other, k)) out.push_back({k, 1, 1});
        }
      }
    }
  }
  normalize(out);
}

}  // namespace detail
}  // namespace spattn
