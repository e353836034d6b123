// spattn/pattern.hpp — the pattern language of PATTERNS.md: parse, bind to lengths, predicate, rows.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "spattn/error.hpp"

namespace spattn {

// An affine run of keys: start, start + stride, ..., start + (count - 1) * stride. stride >= 1, count >= 1.
// An interval [a, b) is the run {a, 1, b - a}.
struct Run {
  int64_t start = 0;
  int64_t stride = 1;
  int64_t count = 0;
  int64_t last() const { return start + (count - 1) * stride; }
  int64_t end() const { return last() + 1; }  // one past the last key
  bool operator==(const Run&) const = default;
};

// The keys of one query row, as runs. Guarantees: no key appears twice; runs are ordered by start;
// intervals (stride 1) neither overlap nor touch one another. Strided runs may interleave with other runs.
using RowRuns = std::vector<Run>;

// A half-open range of indices [begin, end): a shard's tokens, keys fetched from another rank (src/dist).
struct IndexRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const IndexRange&) const = default;
};
using IndexRanges = std::vector<IndexRange>;
int64_t total_size(const IndexRanges& ranges);  // sum of the ranges' sizes
// "a:b,c:d" (the first `shown` ranges, then how many there are).
std::string ranges_text(const IndexRanges& ranges, size_t shown = 4);

// The token grid of a pattern's neighborhood atoms (PATTERNS.md, "Neighborhood attention"), for the tilers that
// lay tokens out in multi-dimensional boxes (src/plan/tile_map.hpp). Axes are row-major: token
// (c0 * dims[1] + c1) * dims[2] + c2 for 3 axes. A kept key of any atom lies in its query's residue group
// (coordinate mod dilation) on every axis, for the grid's dilation (the gcd of the atoms').
struct NeighborhoodGrid {
  int naxes = 0;                             // 1 to 3
  std::array<int64_t, 3> dims{1, 1, 1};      // axis sizes (the first naxes); their product is the length
  std::array<int64_t, 3> dilation{1, 1, 1};  // per axis, the gcd of the atoms' dilations
  // The pattern is one neighborhood atom: (q, k) is kept iff on every axis k's coordinate lies in window(axis,
  // q's coordinate). Otherwise (other terms, several atoms) the windows are the first atom's and only guide the
  // choice of a box shape.
  bool exact = false;
  // The first atom's window of coordinate i on `axis`: its kept coordinates, as a run.
  Run window(int axis, int64_t i) const;

  std::array<int64_t, 3> kernel{1, 1, 1}, atom_dilation{1, 1, 1};  // the first atom's (window())
  std::array<bool, 3> causal{false, false, false};
};

namespace detail {
struct Node;       // parsed spec (length independent)
struct BoundNode;  // spec bound to (q_len, k_len), validated
}  // namespace detail

class BoundPattern;

// A parsed pattern spec. Immutable and cheap to copy. Syntax errors throw spattn::Error naming the
// offending text and its column (1-based).
class Pattern {
 public:
  static Pattern parse(std::string_view spec);
  const std::string& spec() const { return spec_; }
  // Binds the pattern to a query length and a key length. Length-dependent errors (an index out of range,
  // document segments that do not sum to L, a neighborhood window that does not fit) throw here.
  BoundPattern bind(int64_t q_len, int64_t k_len) const;
  BoundPattern bind(int64_t len) const;

 private:
  std::string spec_;
  std::shared_ptr<const detail::Node> root_;
};

inline Pattern parse(std::string_view spec) { return Pattern::parse(spec); }

// A pattern bound to lengths: the reference predicate and cheap row enumeration. Thread-safe for reads.
class BoundPattern {
 public:
  int64_t q_len() const { return q_len_; }
  int64_t k_len() const { return k_len_; }
  const std::string& spec() const { return spec_; }

  // The reference predicate of PATTERNS.md. O(1) for every atom except random (the row's r draws the first
  // time a row is asked on a thread, then O(log r) while it stays cached).
  bool contains(int64_t q, int64_t k) const;

  // The keys of row q as runs (see RowRuns), in time proportional to the number of runs where the atoms'
  // geometry allows (local(256) is one interval, O(1)), never worse than O(nnz of the row + runs log runs).
  // random draws its r keys in O(r), never O(Lk) (O(r log r) for rows of less than one key in 256, whose
  // keys are sorted).
  void row(int64_t q, RowRuns& out) const;
  RowRuns row(int64_t q) const {
    RowRuns r;
    row(q, r);
    return r;
  }
  // The keys of row q in increasing order.
  void row_keys(int64_t q, std::vector<int64_t>& out) const;
  int64_t row_nnz(int64_t q) const;
  // Row q's keys as bits (key k: bit k % 64 of words[k / 64]; all ceil(k_len / 64) words written) where the pattern
  // draws them as bits anyway (a random atom keeping one key in 256 or more: no runs made); false, nothing written
  // that the caller may use, otherwise. q must be in range.
  bool row_bits(int64_t q, uint64_t* words) const;
  // Where the spec makes every row one band (dense, causal, local and their intersections, unions of bands whose
  // offsets overlap or touch): (lo, hi), lo <= hi, such that row q keeps exactly the keys k with lo <= k - q <= hi
  // and 0 <= k < k_len (offsets past every row's reach: -q_len, k_len); else none. O(spec), no row walked.
  std::optional<std::pair<int64_t, int64_t>> band() const;
  // Where the spec makes every row one dilated band (dilated(w, d), its intersections with bands and dilated bands
  // of the same d; bands: d = 1): (lo, hi, d), lo <= hi, such that row q keeps exactly the keys k with
  // (k - q) mod d == 0, lo <= (k - q) / d <= hi and 0 <= k < k_len; else none. O(spec), no row walked.
  struct DilatedBand {
    int64_t lo = 0, hi = 0, d = 1;
  };
  std::optional<DilatedBand> dilated_band() const;
  // Where the spec is a union of such bands and prefixes global_cols(0:g), global_rows(0:r), global(0:g) (sliding
  // windows with attention sinks, longformer): row q keeps the band's keys, the keys [0, key_prefix), and every key
  // where q < row_prefix (band() where both prefixes are 0). O(spec), no row walked.
  struct BandSpec {
    int64_t lo = 0, hi = 0;
    int64_t key_prefix = 0, row_prefix = 0;
  };
  std::optional<BandSpec> band_spec() const;
  // Where the spec makes every row keep every key or none (global_rows and unions of them): the rows that keep keys,
  // as sorted disjoint ranges [first, end) of [0, q_len); else none. O(spec), no row walked.
  std::optional<std::vector<std::pair<int64_t, int64_t>>> dense_row_ranges() const;
  // Where the spec is blocked(b, inner) (bigbird): b, and inner bound to the block grid of ceil(q_len / b) x
  // ceil(k_len / b) blocks, so that row q keeps the keys [j b, min((j + 1) b, k_len)) of every block j of inner's row
  // q / b; else none. O(spec), no row walked.
  struct Blocked;
  std::optional<Blocked> blocked() const;
  // Where the spec is one random atom, random(r, seed=x): r and x, whose rows PATTERNS.md's sampling draws (the GPU
  // planner draws them on the device: cuda/fused/random_rows.hpp); else none. O(1).
  struct RandomSpec {
    int64_t r = 0;
    uint64_t seed = 0;
  };
  std::optional<RandomSpec> random_spec() const;
  // Where the spec is a union of band rows and one random atom (local(w) | random(r, seed=x), the suite's bandrand):
  // the band the other terms make (lo <= hi, as band() gives it) and the atom's random_spec(); else none. O(spec).
  struct BandRandom {
    int64_t lo = 0, hi = 0;
    RandomSpec random;
  };
  std::optional<BandRandom> band_random() const;
  // n such that rows q and q' with q / n == q' / n keep the same keys by the spec (blocked(n, ...), block_diag(n);
  // dense, global_cols and summary: q_len; unions and intersections: the gcd of their n); 1 where it promises
  // nothing. O(spec).
  int64_t row_block() const;
  // Total number of kept (q, k) pairs (walks every row, one a block of rows alike (row_block); a random atom's row
  // count is r, without its keys, and its rows are counted as one).
  int64_t nnz() const;

  // A pattern given by its kept keys (a mask the caller already holds, e.g. as CSR): row q keeps
  // cols[row_offsets[q] .. row_offsets[q + 1]), sorted, unique, in [0, k_len). Throws Error naming the first
  // bad row and value. Its spec() is "explicit#N (q_len x k_len, nnz M)", N unique in the process.
  static BoundPattern from_rows(int64_t q_len, int64_t k_len, std::vector<int64_t> row_offsets,
                                std::vector<int32_t> cols);
  // The keys `keys` (sorted, unique, in [0, minus.k_len())) of every row q < q_len as compact keys 0 ..
  // keys.size() - 1 (key j standing for keys[j]), less those that `minus` (bound to q_len, or null: none) keeps in
  // row q; rows [skip_begin, skip_end) keep nothing. The planner's gathered columns (plan/parts.hpp) without a
  // list of every row's keys: row q costs O(minus's runs of row q x log keys + the keys they drop), not O(keys).
  // Its spec() is "gathered#N (q_len x keys, ...)", N unique in the process; like from_rows it has no spec terms.
  static BoundPattern gathered(int64_t q_len, std::vector<int64_t> keys, const BoundPattern* minus, int64_t skip_begin,
                               int64_t skip_end);
  // The keys of `base` that none of `minus` (bound to base's lengths) keeps; rows [skip_begin, skip_end) keep
  // nothing. The planner's scattered part (plan/parts.hpp) without a copy of its rows: row q costs base's row q and
  // a contains() of each `minus` a key. Its spec() is "less#N (...)", N unique in the process; no spec terms.
  static BoundPattern less(const BoundPattern& base, const std::vector<BoundPattern>& minus, int64_t skip_begin,
                           int64_t skip_end);

  // Row q keeps the keys k = q + m d with lo <= m <= hi and 0 <= k < k_len (d >= 2, lo <= hi): stride(d) &
  // local(left=-lo d, right=hi d), whose sides may be negative (offsets that exclude the diagonal), which the parser
  // refuses: the compound split's affine part (plan/parts.hpp: the strided term of sparse_strided less its band). Its
  // spec() is that text; it does not parse. Throws Error naming a bad value.
  static BoundPattern dilated_offsets(int64_t q_len, int64_t k_len, int64_t d, int64_t lo, int64_t hi);

  // A window of `base`: query i stands for the i-th index of `rows` and key j for the j-th of `keys` (each list's
  // ranges taken in the order given, disjoint, inside base's lengths; empty ranges allowed); rows whose query lies
  // in `skip` (base's query indices) keep nothing. A rank's sub-problem under context parallelism (src/dist): its
  // query shard against its own or its fetched keys, with no index list: row i costs base's row plus a binary
  // search per run over the key ranges. Throws Error naming the first bad range. Its spec() is "window#N (...)";
  // like from_rows it has no spec terms; except a band (local, causal, dense) seen through one query range and one
  // key range, which is a band again: that window is the band's spec bound to the window's lengths
  // (local(left=a - d, right=b + d), d = rows.begin - keys.begin), so the planners see a band.
  static BoundPattern window(const BoundPattern& base, IndexRanges rows, IndexRanges keys, IndexRanges skip = {});

  // The operands of the top-level union, bound to the same lengths: nested unions flattened, presets expanded,
  // and global(G) as its two halves global_rows(G) and global_cols(G). Their union is this pattern; they may
  // overlap. A pattern that is no union (an intersection, an atom, an explicit pattern) is its only term.
  std::vector<BoundPattern> union_terms() const;
  // The union of patterns bound to the same lengths (terms of one pattern, or any specs). Throws Error when the
  // lengths differ or a pattern is explicit.
  static BoundPattern union_of(const std::vector<BoundPattern>& terms);
  // What the spec says of a term's geometry, for the planner's split (plan/parts.hpp):
  //   columns    every row keeps the same keys (global_cols, summary): a set of columns;
  //   rows       a set of rows keeps every key, other rows none (global_rows);
  //   scattered  a random atom, alone or intersected with others (not inside blocked, whose blocks cluster);
  //   general    anything else.
  enum class Shape { general, columns, rows, scattered };
  Shape shape() const;
  // The grid of the spec's neighborhood atoms (outside blocked, whose atoms see blocks): present where it has at
  // least one and all of them lay tokens on the same dims; none for explicit patterns.
  std::optional<NeighborhoodGrid> neighborhood_grid() const;

 private:
  friend class Pattern;
  // A parsed spec node bound to the lengths, its spec written from the node.
  static BoundPattern of_node(std::shared_ptr<const detail::Node> node, int64_t q_len, int64_t k_len);
  std::string spec_;
  int64_t q_len_ = 0, k_len_ = 0;
  std::shared_ptr<const detail::BoundNode> root_;
  std::shared_ptr<const detail::Node> node_;  // the parsed spec (null for explicit patterns)
};

struct BoundPattern::Blocked {
  int64_t block = 1;
  BoundPattern inner;
};

// Number of keys in a row given as runs.
int64_t count_keys(const RowRuns& runs);
// Expands runs to sorted keys.
void expand_runs(const RowRuns& runs, std::vector<int64_t>& keys);
// Compresses sorted unique keys into maximal affine runs (greedy; a lone pair with a gap is split so that a
// longer run can start at its second key).
void compress_keys(const std::vector<int64_t>& sorted_keys, RowRuns& runs);

// The hash behind random(r, seed=x), exactly as PATTERNS.md defines it.
uint64_t random_mix(uint64_t x);
uint64_t random_hash(uint64_t seed, uint64_t q, uint64_t k);
// The keys of rows [q0, q1) of random(r, seed=x) over k_len keys, 1 <= r < k_len, 0 <= q0 <= q1: row q's r keys, in no
// set order, at keys[(q - q0) r, (q - q0 + 1) r) (keys resized to (q1 - q0) r). The rows' own draws (BoundPattern::row's),
// without their runs: for counting rows by their keys (plan::analyze's band | random rows).
void random_rows_keys(uint64_t seed, int64_t r, int64_t q0, int64_t q1, int64_t k_len, std::vector<int32_t>& keys);

}  // namespace spattn
