// Internal: the parsed form of a pattern spec (length independent) and its bound form.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "spattn/pattern.hpp"

namespace spattn::detail {

enum class Kind {
  Union, Inter,
  Dense, Causal, Local, Dilated, Stride, BlockDiag, Summary,
  Global, GlobalRows, GlobalCols, Random, Document, Blocked, Neighborhood,
};

// A sorted list of half-open index ranges [first, second), merged.
using IndexSet = std::vector<std::pair<int64_t, int64_t>>;

struct Node {
  Kind kind = Kind::Dense;
  int64_t column = 1;      // 1-based column of this node's text in the spec, for errors raised at bind time
  std::string text;        // the node's text, for errors raised at bind time
  std::vector<std::shared_ptr<const Node>> children;  // Union / Inter operands; Blocked: the inner spec
  // Parameters (meaning per kind):
  //   Local: a = left, b = right.   Dilated: a = w, b = d.   Stride / BlockDiag: a = s.
  //   Summary: a = s, b = c.        Random: a = r, b = seed.  Blocked: a = block.
  int64_t a = 0, b = 0;
  IndexSet set;                    // Global*: the index set G
  bool clip = false;               // Global*: clip G to the lengths instead of rejecting (presets)
  std::vector<int64_t> segments;   // Document: segment lengths
  // Neighborhood (naxes in 1..3; dims[0] == 0 means "omitted", then n0 = L):
  int naxes = 1;
  std::array<int64_t, 3> dims{0, 0, 0}, kernel{1, 1, 1}, dilation{1, 1, 1};
  std::array<bool, 3> causal{false, false, false};
};

// The bound form: validated against (q_len, k_len); answers contains() and row().
struct BoundNode {
  int64_t q_len = 0, k_len = 0;
  virtual ~BoundNode() = default;
  virtual bool contains(int64_t q, int64_t k) const = 0;
  // Writes the normalised runs of row q into out (replacing its contents).
  virtual void row(int64_t q, RowRuns& out) const = 0;
  // Number of keys of row q (scratch: any runs, overwritten). Atoms that know it without the row say so.
  virtual int64_t row_nnz(int64_t q, RowRuns& scratch) const {
    row(q, scratch);
    return count_keys(scratch);
  }
  // Band rows (BoundPattern::band): every row q keeps exactly the keys k with lo <= k - q <= hi, 0 <= k < k_len.
  virtual bool band(int64_t& /*lo*/, int64_t& /*hi*/) const { return false; }
  // Dilated band rows (BoundPattern::dilated_band): every row q keeps exactly the keys k with (k - q) mod d == 0,
  // lo <= (k - q) / d <= hi, 0 <= k < k_len; band rows are the case d = 1.
  virtual bool dilated_band(int64_t& lo, int64_t& hi, int64_t& d) const {
    d = 1;
    return band(lo, hi);
  }
  // Every row keeps the keys [0, g) (g = 0: none), the rows [0, r) every key (r = 0: none), and nothing else
  // (global_cols(0:g), global_rows(0:r), global(0:g) with r = g).
  virtual bool prefixes(int64_t& /*g*/, int64_t& /*r*/) const { return false; }
  // Band rows with prefixes (BoundPattern::band_spec): a union of bands and prefixes.
  virtual bool band_prefixes(int64_t& lo, int64_t& hi, int64_t& g, int64_t& r) const {
    g = r = 0;
    return band(lo, hi);
  }
  // random(r, seed=x) (BoundPattern::random_spec): r and x.
  virtual bool random(int64_t& /*r*/, uint64_t& /*seed*/) const { return false; }
  // A union of band rows (band) and one random atom (BoundPattern::band_random): the band's lo, hi and the atom's r, x.
  virtual bool band_random(int64_t& /*lo*/, int64_t& /*hi*/, int64_t& /*r*/, uint64_t& /*seed*/) const { return false; }
  // Row q's keys as bits of words[0, ceil(k_len / 64)) (all written), where the node has them as bits anyway.
  virtual bool row_bits(int64_t /*q*/, uint64_t* /*words*/) const { return false; }
  // Every row keeps as many keys as row 0 (BoundPattern::nnz counts one row).
  virtual bool counts_alike() const { return false; }
  // Rows q and q' with q / n == q' / n keep the same keys (BoundPattern::row_block); 1: no such promise; 0: every
  // row keeps the same keys.
  virtual int64_t row_block() const { return 1; }
  // Rows of all keys or none (BoundPattern::dense_row_ranges): the rows keeping keys as sorted disjoint [first, end).
  virtual bool dense_rows(std::vector<std::pair<int64_t, int64_t>>& /*ranges*/) const { return false; }
  // blocked(b, inner) (BoundPattern::blocked): inner, bound to the block grid, and b; null otherwise.
  virtual std::shared_ptr<const BoundNode> blocked(int64_t& /*b*/) const { return nullptr; }
};

std::shared_ptr<const BoundNode> bind_node(const std::shared_ptr<const Node>& node, const std::string& spec,
                                           int64_t q_len, int64_t k_len);

// Run algebra (runs.cpp).
void normalize(RowRuns& runs);                                       // any runs -> normalised RowRuns
void intersect(const RowRuns& a, const RowRuns& b, RowRuns& out);    // normalised inputs -> normalised
bool run_has(const Run& r, int64_t k);

// The window of coordinate i on one axis of a neighborhood (PATTERNS.md): axis size n, kernel K, dilation d.
Run neighborhood_window(int64_t n, int64_t K, int64_t d, bool causal, int64_t i);

}  // namespace spattn::detail
