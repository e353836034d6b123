// pattern/window.cpp — BoundPattern::window: a pattern seen through lists of query and key ranges (a rank's shard
// against its own or its fetched keys, src/dist), without an index list of its rows.
#include <algorithm>
#include <atomic>
#include <optional>
#include <sstream>
#include <string>

#include "pattern/ast.hpp"

namespace spattn {

int64_t total_size(const IndexRanges& ranges) {
  int64_t n = 0;
  for (const IndexRange& r : ranges) n += r.size();
  return n;
}

std::string ranges_text(const IndexRanges& r, size_t shown) {
  std::ostringstream s;
  for (size_t i = 0; i < r.size() && i < shown; ++i) s << (i ? "," : "") << r[i].begin << ":" << r[i].end;
  if (r.size() > shown) s << ",... (" << r.size() << " ranges)";
  return s.str();
}

namespace {

// Ranges in the order given, with the compact index of each one's first element.
struct RangeMap {
  IndexRanges ranges;
  std::vector<int64_t> offset;  // [ranges.size() + 1]: compact index of ranges[i].begin; the last is the total
  std::vector<size_t> by_begin;  // range indices ordered by begin (the ranges are disjoint: ends ordered too)

  explicit RangeMap(IndexRanges r) : ranges(std::move(r)) {
    offset.assign(ranges.size() + 1, 0);
    for (size_t i = 0; i < ranges.size(); ++i) offset[i + 1] = offset[i] + ranges[i].size();
    for (size_t i = 0; i < ranges.size(); ++i)
      if (ranges[i].size() > 0) by_begin.push_back(i);
    std::sort(by_begin.begin(), by_begin.end(), [&](size_t a, size_t b) { return ranges[a].begin < ranges[b].begin; });
  }
  int64_t size() const { return offset.back(); }
  // The index in the base pattern of compact index c (0 <= c < size()).
  int64_t global(int64_t c) const {
    const size_t i = size_t(std::upper_bound(offset.begin(), offset.end(), c) - offset.begin()) - 1;
    return ranges[i].begin + (c - offset[i]);
  }
  // The first position in by_begin whose range ends after g.
  size_t first_ending_after(int64_t g) const {
    return size_t(std::upper_bound(by_begin.begin(), by_begin.end(), g,
                                   [&](int64_t v, size_t i) { return v < ranges[i].end; }) -
                  by_begin.begin());
  }
};

// Checks a list of ranges against [0, len) and for overlaps; the error names the list, the range and the length.
void check_ranges(const IndexRanges& r, int64_t len, const char* what) {
  auto str = [](const IndexRange& x) { return "[" + std::to_string(x.begin) + ", " + std::to_string(x.end) + ")"; };
  for (size_t i = 0; i < r.size(); ++i)
    if (r[i].begin < 0 || r[i].end < r[i].begin || r[i].end > len)
      throw Error(std::string("window: ") + what + " range " + std::to_string(i) + " " + str(r[i]) +
                  " is not a range inside [0, " + std::to_string(len) + ")");
  std::vector<size_t> order(r.size());
  for (size_t i = 0; i < r.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return r[a].begin < r[b].begin; });
  for (size_t t = 1; t < order.size(); ++t) {
    const IndexRange &a = r[order[t - 1]], &b = r[order[t]];
    if (a.size() > 0 && b.size() > 0 && b.begin < a.end)
      throw Error(std::string("window: ") + what + " ranges " + std::to_string(order[t - 1]) + " " + str(a) + " and " +
                  std::to_string(order[t]) + " " + str(b) + " overlap");
  }
}

struct WindowNode final : detail::BoundNode {
  std::shared_ptr<const detail::BoundNode> base;
  RangeMap rows, keys;
  IndexRanges skip;  // sorted, disjoint

  WindowNode(IndexRanges r, IndexRanges k) : rows(std::move(r)), keys(std::move(k)) {}

  bool skipped(int64_t gq) const {
    auto it = std::upper_bound(skip.begin(), skip.end(), gq, [](int64_t v, const IndexRange& x) { return v < x.end; });
    return it != skip.end() && it->begin <= gq;
  }
  bool contains(int64_t q, int64_t k) const override {
    if (q < 0 || q >= q_len || k < 0 || k >= k_len) return false;
    const int64_t gq = rows.global(q);
    return !skipped(gq) && base->contains(gq, keys.global(k));
  }
  void row(int64_t q, RowRuns& out) const override {
    out.clear();
    if (q < 0 || q >= q_len) return;
    const int64_t gq = rows.global(q);
    if (skipped(gq)) return;
    thread_local RowRuns runs;
    base->row(gq, runs);
    for (const Run& r : runs) {
      for (size_t p = keys.first_ending_after(r.start); p < keys.by_begin.size(); ++p) {
        const size_t i = keys.by_begin[p];
        const IndexRange& kr = keys.ranges[i];
        if (kr.begin > r.last()) break;
        const int64_t lo = std::max(r.start, kr.begin), hi = std::min(r.last(), kr.end - 1);
        // The run's first key at or after lo (its residue), then its keys up to hi, renumbered into the range's
        // compact indices (a shift: the stride stays).
        const int64_t first = r.start + (lo - r.start + r.stride - 1) / r.stride * r.stride;
        if (first > hi) continue;
        out.push_back({keys.offset[i] + (first - kr.begin), r.stride, (hi - first) / r.stride + 1});
      }
    }
    detail::normalize(out);
  }
};

std::atomic<int64_t> g_window_ids{1};

}  // namespace

// The spec of a band pattern seen through one query range and one key range, where it is a band again: row i and key
// j stand for q0 + i and k0 + j, so the diagonal moves by d = q0 - k0 (local(left=a, right=b) becomes local(left=a - d,
// right=b + d) where both stay >= 0; causal becomes local(left=n, right=d) for d >= 0; dense stays dense). The
// planners then see a band (the GPU band kernel), not rows. None otherwise.
std::optional<std::string> band_window_spec(const detail::Node* node, const IndexRange& rows, const IndexRange& keys) {
  while (node && (node->kind == detail::Kind::Union || node->kind == detail::Kind::Inter) && node->children.size() == 1)
    node = node->children[0].get();
  if (!node) return std::nullopt;
  const int64_t d = rows.begin - keys.begin;
  auto local = [](int64_t left, int64_t right) {
    std::ostringstream s;
    s << "local(left=" << left << ", right=" << right << ")";
    return s.str();
  };
  switch (node->kind) {
    case detail::Kind::Dense: return std::string("dense");
    case detail::Kind::Local:
      if (node->a - d >= 0 && node->b + d >= 0) return local(node->a - d, node->b + d);
      return std::nullopt;
    case detail::Kind::Causal:
      if (d >= 0) return local(std::max<int64_t>(rows.size(), 1), d);
      return std::nullopt;
    default: return std::nullopt;
  }
}

BoundPattern BoundPattern::window(const BoundPattern& base, IndexRanges rows, IndexRanges keys, IndexRanges skip) {
  if (!base.root_) throw Error("window: the base pattern is empty");
  check_ranges(rows, base.q_len_, "query");
  check_ranges(keys, base.k_len_, "key");
  check_ranges(skip, base.q_len_, "skipped query");
  std::erase_if(skip, [](const IndexRange& r) { return r.size() == 0; });
  bool skips_rows = false;
  for (const IndexRange& s : skip)
    for (const IndexRange& r : rows) skips_rows = skips_rows || (s.begin < r.end && r.begin < s.end);
  if (rows.size() == 1 && keys.size() == 1 && !skips_rows)
    if (auto spec = band_window_spec(base.node_.get(), rows[0], keys[0]))
      return Pattern::parse(*spec).bind(rows[0].size(), keys[0].size());
  std::string spec = "window#" + std::to_string(g_window_ids.fetch_add(1)) + " (" + base.spec_ + "; rows " +
                     ranges_text(rows) + "; keys " + ranges_text(keys);
  if (!skip.empty()) spec += "; skip " + ranges_text(skip);
  auto node = std::make_shared<WindowNode>(std::move(rows), std::move(keys));
  node->q_len = node->rows.size();
  node->k_len = node->keys.size();
  node->base = base.root_;
  std::sort(skip.begin(), skip.end(), [](const IndexRange& a, const IndexRange& b) { return a.begin < b.begin; });
  node->skip = std::move(skip);
  BoundPattern p;
  p.spec_ = spec + ")";
  p.q_len_ = node->q_len;
  p.k_len_ = node->k_len;
  p.root_ = std::move(node);
  return p;
}

}  // namespace spattn
