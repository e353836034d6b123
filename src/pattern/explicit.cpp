// pattern/explicit.cpp — BoundPattern::from_rows: a pattern given by its kept keys instead of a spec.
#include <algorithm>
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

}  // namespace spattn
