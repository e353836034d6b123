// pattern/explicit.cpp — patterns given otherwise than by a spec: BoundPattern::from_rows (by their kept keys),
// BoundPattern::gathered (columns less another pattern's keys) and BoundPattern::less (a pattern less others).
#include <algorithm>
#include <numeric>
#include <atomic>
#include <string>

#include "pattern/ast.hpp"

namespace spattn {
namespace {

struct ExplicitNode final : detail::BoundNode {
  std::vector<int64_t> offsets;
  std::vector<int32_t> cols;

  bool contains(int64_t q, int64_t k) const override {
    if (q < 0 || q >= q_len) return false;
    const auto b = cols.begin() + offsets[size_t(q)], e = cols.begin() + offsets[size_t(q) + 1];
    return std::binary_search(b, e, int32_t(k));
  }
  void row(int64_t q, RowRuns& out) const override {
    out.clear();
    if (q < 0 || q >= q_len) return;
    thread_local std::vector<int64_t> keys;
    keys.assign(cols.begin() + offsets[size_t(q)], cols.begin() + offsets[size_t(q) + 1]);
    compress_keys(keys, out);
  }
};

std::atomic<int64_t> g_explicit_ids{1};

struct GatheredNode final : detail::BoundNode {
  std::vector<int64_t> keys;               // compact key j is keys[j]
  std::shared_ptr<const detail::BoundNode> minus;  // null: nothing dropped
  int64_t skip_begin = 0, skip_end = 0;

  bool skipped(int64_t q) const { return q >= skip_begin && q < skip_end; }
  bool contains(int64_t q, int64_t j) const override {
    return q >= 0 && q < q_len && j >= 0 && j < k_len && !skipped(q) && !(minus && minus->contains(q, keys[size_t(j)]));
  }
  // Rows alike in `minus` and on one side of the skipped rows' ends are alike here.
  int64_t row_block() const override {
    int64_t b = minus ? minus->row_block() : 0;
    if (skip_begin < skip_end) b = std::gcd(std::gcd(b, skip_begin), skip_end);
    return b;
  }
  void row(int64_t q, RowRuns& out) const override {
    out.clear();
    if (q < 0 || q >= q_len || skipped(q) || k_len == 0) return;
    if (!minus) {
      out.push_back({0, 1, k_len});
      return;
    }
    // The compact keys `minus` keeps, as intervals [a, b) of j: an interval run drops the keys inside it, a strided
    // run those of its residue (tested key by key over the fewer of its keys and the gathered keys it spans).
    thread_local RowRuns runs;
    thread_local std::vector<std::pair<int64_t, int64_t>> drop;
    minus->row(q, runs);
    drop.clear();
    const auto kb = keys.begin(), ke = keys.end();
    for (const Run& r : runs) {
      const int64_t a = std::lower_bound(kb, ke, r.start) - kb, b = std::upper_bound(kb, ke, r.last()) - kb;
      if (a >= b) continue;
      if (r.stride == 1 || r.count == 1) {
        drop.push_back({a, b});
      } else if (b - a <= r.count) {
        for (int64_t j = a; j < b; ++j)
          if ((keys[size_t(j)] - r.start) % r.stride == 0) drop.push_back({j, j + 1});
      } else {
        for (int64_t i = 0; i < r.count; ++i) {
          const auto it = std::lower_bound(kb + a, kb + b, r.start + i * r.stride);
          if (it != kb + b && *it == r.start + i * r.stride) drop.push_back({it - kb, it - kb + 1});
        }
      }
    }
    std::sort(drop.begin(), drop.end());
    int64_t next = 0;  // the first compact key not yet written or dropped
    for (const auto& [a, b] : drop) {
      if (a > next) out.push_back({next, 1, a - next});
      next = std::max(next, b);
    }
    if (next < k_len) out.push_back({next, 1, k_len - next});
  }
};

std::atomic<int64_t> g_gathered_ids{1};

struct LessNode final : detail::BoundNode {
  std::shared_ptr<const detail::BoundNode> base;
  std::vector<std::shared_ptr<const detail::BoundNode>> minus;
  int64_t skip_begin = 0, skip_end = 0;

  bool skipped(int64_t q) const { return q >= skip_begin && q < skip_end; }
  bool dropped(int64_t q, int64_t k) const {
    for (const auto& m : minus)
      if (m->contains(q, k)) return true;
    return false;
  }
  bool contains(int64_t q, int64_t k) const override { return !skipped(q) && base->contains(q, k) && !dropped(q, k); }
  void row(int64_t q, RowRuns& out) const override {
    out.clear();
    if (skipped(q)) return;
    base->row(q, out);
    if (minus.empty()) return;
    thread_local std::vector<int64_t> keys;
    expand_runs(out, keys);
    size_t n = 0;
    for (int64_t k : keys)
      if (!dropped(q, k)) keys[n++] = k;
    keys.resize(n);
    compress_keys(keys, out);
  }
};

std::atomic<int64_t> g_less_ids{1};

}  // namespace

BoundPattern BoundPattern::from_rows(int64_t q_len, int64_t k_len, std::vector<int64_t> row_offsets,
                                     std::vector<int32_t> cols) {
  if (q_len < 0 || k_len < 0)
    throw Error("explicit pattern: lengths must not be negative, got " + std::to_string(q_len) + " x " +
                std::to_string(k_len));
  if (int64_t(row_offsets.size()) != q_len + 1)
    throw Error("explicit pattern: expected " + std::to_string(q_len + 1) + " row offsets, got " +
                std::to_string(row_offsets.size()));
  if (row_offsets[0] != 0) throw Error("explicit pattern: row_offsets[0] must be 0, got " + std::to_string(row_offsets[0]));
  if (row_offsets.back() != int64_t(cols.size()))
    throw Error("explicit pattern: row_offsets[" + std::to_string(q_len) + "] = " + std::to_string(row_offsets.back()) +
                " but there are " + std::to_string(cols.size()) + " column indices");
  for (int64_t q = 0; q < q_len; ++q) {
    const int64_t b = row_offsets[size_t(q)], e = row_offsets[size_t(q) + 1];
    if (e < b)
      throw Error("explicit pattern: row " + std::to_string(q) + ": offsets decrease (" + std::to_string(b) + " then " +
                  std::to_string(e) + ")");
    if (e > int64_t(cols.size()))  // (before reading the row: the last offset alone does not bound the others)
      throw Error("explicit pattern: row " + std::to_string(q) + " ends at offset " + std::to_string(e) + ", past the " +
                  std::to_string(cols.size()) + " column indices");
    for (int64_t i = b; i < e; ++i) {
      const int32_t c = cols[size_t(i)];
      if (c < 0 || c >= k_len)
        throw Error("explicit pattern: row " + std::to_string(q) + ": column " + std::to_string(c) +
                    " out of range [0, " + std::to_string(k_len) + ")");
      if (i > b && c <= cols[size_t(i) - 1])
        throw Error("explicit pattern: row " + std::to_string(q) + ": columns not sorted and unique (" +
                    std::to_string(cols[size_t(i) - 1]) + " then " + std::to_string(c) + ")");
    }
  }
  auto node = std::make_shared<ExplicitNode>();
  node->q_len = q_len;
  node->k_len = k_len;
  const int64_t nnz = int64_t(cols.size());
  node->offsets = std::move(row_offsets);
  node->cols = std::move(cols);
  BoundPattern p;
  p.spec_ = "explicit#" + std::to_string(g_explicit_ids.fetch_add(1)) + " (" + std::to_string(q_len) + " x " +
            std::to_string(k_len) + ", nnz " + std::to_string(nnz) + ")";
  p.q_len_ = q_len;
  p.k_len_ = k_len;
  p.root_ = std::move(node);
  return p;
}

BoundPattern BoundPattern::gathered(int64_t q_len, std::vector<int64_t> keys, const BoundPattern* minus,
                                    int64_t skip_begin, int64_t skip_end) {
  if (q_len < 0) throw Error("gathered pattern: the query length must not be negative, got " + std::to_string(q_len));
  if (minus && minus->q_len() != q_len)
    throw Error("gathered pattern: the pattern to drop has query length " + std::to_string(minus->q_len()) + ", not " +
                std::to_string(q_len));
  for (size_t i = 0; i < keys.size(); ++i)
    if (keys[i] < 0 || (minus && keys[i] >= minus->k_len()) || (i > 0 && keys[i] <= keys[i - 1]))
      throw Error("gathered pattern: key " + std::to_string(keys[i]) + " (index " + std::to_string(i) +
                  ") is out of range or not sorted and unique");
  auto node = std::make_shared<GatheredNode>();
  node->q_len = q_len;
  node->k_len = int64_t(keys.size());
  node->keys = std::move(keys);
  if (minus) node->minus = minus->root_;
  node->skip_begin = skip_begin;
  node->skip_end = skip_end;
  BoundPattern p;
  p.spec_ = "gathered#" + std::to_string(g_gathered_ids.fetch_add(1)) + " (" + std::to_string(q_len) + " x " +
            std::to_string(node->k_len);
  if (minus) p.spec_ += ", less " + minus->spec();
  p.spec_ += ")";
  p.q_len_ = q_len;
  p.k_len_ = node->k_len;
  p.root_ = std::move(node);
  return p;
}

BoundPattern BoundPattern::less(const BoundPattern& base, const std::vector<BoundPattern>& minus, int64_t skip_begin,
                                int64_t skip_end) {
  if (!base.root_) throw Error("less: the base pattern is empty");
  auto node = std::make_shared<LessNode>();
  node->q_len = base.q_len_;
  node->k_len = base.k_len_;
  node->base = base.root_;
  std::string spec = "less#" + std::to_string(g_less_ids.fetch_add(1));
  spec += " (" + base.spec_;
  for (const BoundPattern& m : minus) {
    if (m.q_len_ != base.q_len_ || m.k_len_ != base.k_len_)
      throw Error("less: '" + m.spec_ + "' is bound to other lengths than '" + base.spec_ + "'");
    node->minus.push_back(m.root_);
    spec += " less " + m.spec_;
  }
  node->skip_begin = skip_begin;
  node->skip_end = skip_end;
  BoundPattern p;
  p.spec_ = spec + ")";
  p.q_len_ = base.q_len_;
  p.k_len_ = base.k_len_;
  p.root_ = std::move(node);
  return p;
}

}  // namespace spattn
