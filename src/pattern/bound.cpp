// Binding a parsed pattern to lengths: validation, the reference predicate and row enumeration per atom.
#include <algorithm>
#include <array>
#include <atomic>
#include <deque>
#include <limits>
#include <numeric>
#include <sstream>
#include <utility>
#include <vector>

#include "pattern/ast.hpp"
#include "pattern/random_draw.hpp"
#include "pattern/random_hash.hpp"

namespace spattn {

uint64_t random_mix(uint64_t x) { return detail::mix64(x); }
uint64_t random_hash(uint64_t seed, uint64_t q, uint64_t k) { return detail::mix64(detail::random_row_key(seed, q) + k); }

namespace detail {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
int64_t sat_add(int64_t a, int64_t b) { return (b > 0 && a > kMax - b) ? kMax : a + b; }
int64_t sat_mul(int64_t a, int64_t b) {
  // (the overflow flag where both are nonnegative, as every caller's: no division in dilated's row, a tenth of its
  // unpermuted shape estimates)
  if (int64_t r; a > 0 && b >= 0) return __builtin_mul_overflow(a, b, &r) ? kMax : r;
  return (a != 0 && b > kMax / a) ? kMax : a * b;
}

[[noreturn]] void bind_fail(const Node& n, const std::string& spec, const std::string& what) {
  std::ostringstream os;
  os << "pattern error at column " << n.column << ": " << what << " (in \"" << spec << "\")";
  throw Error(os.str());
}

using BoundPtr = std::shared_ptr<const BoundNode>;

// ---- composites ----
// Blocks of rows alike in every kid are alike in a union or intersection of them: the gcd of the kids' blocks (0,
// every row alike, where every kid's are).
int64_t kids_row_block(const std::vector<BoundPtr>& kids) {
  int64_t g = 0;
  for (auto& c : kids) g = std::gcd(g, c->row_block());
  return g;
}

struct UnionB : BoundNode {
  std::vector<BoundPtr> kids;
  bool contains(int64_t q, int64_t k) const override {
    for (auto& c : kids)
      if (c->contains(q, k)) return true;
    return false;
  }
  void row(int64_t q, RowRuns& out) const override {
    // The kids' rows land in a per-thread scratch of this union's nesting depth (a union inside a kid has its own):
    // a fresh vector a row, with normalize's, was a quarter of local(256) | random(4)'s analysis at L = 16384.
    thread_local std::deque<std::array<RowRuns, 2>> scratch;  // (a deque: growing it moves no outer frame's scratch)
    thread_local size_t depth = 0;
    if (scratch.size() <= depth) scratch.emplace_back();
    RowRuns &tmp = scratch[depth][0], &merged = scratch[depth][1];
    struct Nest {
      size_t& d;
      explicit Nest(size_t& d_) : d(++d_) {}
      ~Nest() { --d; }
    } nest(depth);
    // Rows of intervals (normalised: in order, apart) are merged as they come, their touching intervals joined, with
    // no normalize (its sort and copies: local(1) | global(0:2), bigbird's block rows but random, 26 -> 19 ns a row);
    // from a row with a strided run on, or once the merged row is long (each merge copies it: 3000 random(2) terms,
    // 83 s to plan at L = 4096), the rows are appended and normalised once.
    out.clear();
    bool apart = true;  // out: intervals in order, apart
    auto interval = [](const Run& r) { return r.stride == 1 || r.count == 1; };
    for (auto& c : kids) {
      c->row(q, tmp);
      if (!apart || out.size() > 64 || !std::all_of(tmp.begin(), tmp.end(), interval)) {
        apart = false;
        out.insert(out.end(), tmp.begin(), tmp.end());
        continue;
      }
      merged.clear();
      for (size_t i = 0, j = 0; i < out.size() || j < tmp.size();) {
        const Run& r = j == tmp.size() || (i < out.size() && out[i].start <= tmp[j].start) ? out[i++] : tmp[j++];
        if (!merged.empty() && r.start <= merged.back().end())
          merged.back().count = std::max(merged.back().end(), r.end()) - merged.back().start;
        else
          merged.push_back({r.start, 1, r.end() - r.start});
      }
      out.swap(merged);
    }
    if (!apart) normalize(out);
  }
  // Bands whose offset ranges overlap or touch (in order of lo) are one band; an empty band (lo > hi) is none.
  bool band(int64_t& lo, int64_t& hi) const override {
    int64_t g = 0, r = 0;
    return band_prefixes(lo, hi, g, r) && g == 0 && r == 0;
  }
  // The same with prefixes among the kids: their unions [0, g) of keys and [0, r) of rows beside the bands'.
  bool band_prefixes(int64_t& lo, int64_t& hi, int64_t& g, int64_t& r) const override {
    return band_prefixes_but(nullptr, lo, hi, g, r);
  }
  // One random kid, the others band rows.
  bool band_random(int64_t& lo, int64_t& hi, int64_t& r, uint64_t& seed) const override {
    const BoundNode* random = nullptr;
    for (auto& c : kids)
      if (c->random(r, seed)) {
        if (random) return false;
        random = c.get();
      }
    int64_t g = 0, rows = 0;
    return random && band_prefixes_but(random, lo, hi, g, rows) && g == 0 && rows == 0;
  }
  // band_prefixes of the kids but `skip`.
  bool band_prefixes_but(const BoundNode* skip, int64_t& lo, int64_t& hi, int64_t& g, int64_t& r) const {
    std::vector<std::pair<int64_t, int64_t>> b;
    g = r = 0;
    for (auto& c : kids) {
      if (c.get() == skip) continue;
      int64_t l, h, pg, pr;
      if (c->prefixes(pg, pr)) {
        g = std::max(g, pg), r = std::max(r, pr);
        continue;
      }
      if (!c->band_prefixes(l, h, pg, pr)) return false;
      g = std::max(g, pg), r = std::max(r, pr);
      if (l <= h) b.push_back({l, h});
    }
    if (b.empty()) return false;
    std::sort(b.begin(), b.end());
    lo = b[0].first, hi = b[0].second;
    for (auto& [l, h] : b) {
      if (l > hi + 1) return false;
      hi = std::max(hi, h);
    }
    return true;
  }
  int64_t row_block() const override { return kids_row_block(kids); }
  bool dense_rows(IndexSet& ranges) const override {
    IndexSet all, one;
    for (auto& c : kids) {
      if (!c->dense_rows(one)) return false;
      all.insert(all.end(), one.begin(), one.end());
    }
    ranges = std::move(all);  // sorted and merged by BoundPattern::dense_row_ranges
    return true;
  }
};

struct InterB : BoundNode {
  std::vector<BoundPtr> kids;
  bool contains(int64_t q, int64_t k) const override {
    for (auto& c : kids)
      if (!c->contains(q, k)) return false;
    return true;
  }
  void row(int64_t q, RowRuns& out) const override {
    // Pairwise run intersection while the run lists are short; otherwise enumerate the sparsest operand's
    // keys and keep those every other operand contains (cost follows that operand's nnz).
    std::vector<RowRuns> rows(kids.size());
    size_t best = 0;
    int64_t best_n = kMax;
    for (size_t i = 0; i < kids.size(); ++i) {
      kids[i]->row(q, rows[i]);
      const int64_t n = count_keys(rows[i]);
      if (n < best_n) best_n = n, best = i;
    }
    out = rows[best];
    RowRuns tmp;
    for (size_t i = 0; i < kids.size() && !out.empty(); ++i) {
      if (i == best) continue;
      if (out.size() * rows[i].size() <= 256) {
        intersect(out, rows[i], tmp);
        out.swap(tmp);
      } else {
        std::vector<int64_t> keys, kept;
        expand_runs(out, keys);
        for (int64_t k : keys)
          if (kids[i]->contains(q, k)) kept.push_back(k);
        compress_keys(kept, out);
        normalize(out);
      }
    }
  }
  int64_t row_block() const override { return kids_row_block(kids); }
  bool band(int64_t& lo, int64_t& hi) const override {
    lo = -q_len, hi = k_len;
    for (auto& c : kids) {
      int64_t l, h;
      if (!c->band(l, h)) return false;
      lo = std::max(lo, l), hi = std::min(hi, h);
    }
    return true;
  }
  // Dilated bands of one dilation d and bands (d = 1): offsets k - q = m d with m in every kid's range (a band's
  // [l, h] holds m d iff ceil(l / d) <= m <= floor(h / d)).
  bool dilated_band(int64_t& lo, int64_t& hi, int64_t& d) const override {
    std::vector<std::array<int64_t, 3>> b;  // each kid's (lo, hi, d)
    d = 1;
    for (auto& c : kids) {
      std::array<int64_t, 3> x;
      if (!c->dilated_band(x[0], x[1], x[2])) return false;
      if (x[2] > 1 && d > 1 && x[2] != d) return false;
      d = std::max(d, x[2]);
      b.push_back(x);
    }
    auto floor_div = [](int64_t a, int64_t n) { return a >= 0 ? a / n : -((-a + n - 1) / n); };
    lo = -q_len, hi = k_len;
    for (const auto& x : b) {
      const bool band = x[2] == 1 && d > 1;
      lo = std::max(lo, band ? -floor_div(-x[0], d) : x[0]);
      hi = std::min(hi, band ? floor_div(x[1], d) : x[1]);
    }
    return true;
  }
};

// ---- atoms ----
struct DenseB : BoundNode {
  bool contains(int64_t, int64_t) const override { return true; }
  int64_t row_block() const override { return 0; }
  bool band(int64_t& lo, int64_t& hi) const override {
    lo = -q_len, hi = k_len;  // offsets past every row's reach
    return true;
  }
  void row(int64_t, RowRuns& out) const override {
    out.clear();
    if (k_len > 0) out.push_back({0, 1, k_len});
  }
};

struct CausalB : BoundNode {
  bool contains(int64_t q, int64_t k) const override { return k <= q; }
  bool band(int64_t& lo, int64_t& hi) const override {
    lo = -q_len, hi = 0;
    return true;
  }
  void row(int64_t q, RowRuns& out) const override {
    out.clear();
    const int64_t n = std::min(q + 1, k_len);
    if (n > 0) out.push_back({0, 1, n});
  }
};

struct LocalB : BoundNode {
  int64_t left = 0, right = 0;
  bool contains(int64_t q, int64_t k) const override { return k >= q - left && k <= sat_add(q, right); }
  bool band(int64_t& lo, int64_t& hi) const override {
    lo = -std::min(left, q_len), hi = std::min(right, k_len);
    return true;
  }
  void row(int64_t q, RowRuns& out) const override {
    out.clear();
    const int64_t lo = q - std::min(left, q);
    const int64_t hi = std::min(k_len - 1, sat_add(q, std::min(right, k_len)));
    if (lo <= hi) out.push_back({lo, 1, hi - lo + 1});
  }
};

struct DilatedB : BoundNode {
  int64_t w = 0, d = 1;
  bool dilated_band(int64_t& lo, int64_t& hi, int64_t& dd) const override {
    lo = -std::min(w, q_len), hi = std::min(w, k_len), dd = d;
    return true;
  }
  bool contains(int64_t q, int64_t k) const override {
    const int64_t diff = q > k ? q - k : k - q;
    return diff <= sat_mul(w, d) && diff % d == 0;
  }
  void row(int64_t q, RowRuns& out) const override {
    out.clear();
    const int64_t lo = q - std::min(w, q / d) * d;
    const int64_t hi = std::min(k_len - 1, sat_add(q, sat_mul(std::min(w, k_len), d)));
    if (lo <= hi) out.push_back({lo, d, (hi - lo) / d + 1});
    normalize(out);
  }
};

struct StrideB : BoundNode {
  int64_t s = 1;
  // A dilated band at d = s of offsets past every row's reach (stride(s) & causal: m <= 0, the Sparse Transformer's
  // strided part).
  bool dilated_band(int64_t& lo, int64_t& hi, int64_t& dd) const override {
    lo = -q_len, hi = k_len, dd = s;
    return true;
  }
  bool contains(int64_t q, int64_t k) const override { return (q - k) % s == 0; }
  void row(int64_t q, RowRuns& out) const override {
    out.clear();
    const int64_t st = q % s;
    if (st < k_len) out.push_back({st, s, (k_len - 1 - st) / s + 1});
    normalize(out);
  }
};

struct BlockDiagB : BoundNode {
  int64_t s = 1;
  bool contains(int64_t q, int64_t k) const override { return q / s == k / s; }
  int64_t row_block() const override { return s; }
  void row(int64_t q, RowRuns& out) const override {
    out.clear();
    const int64_t lo = (q / s) * s;
    const int64_t hi = std::min(k_len, sat_add(lo, s));
    if (lo < hi) out.push_back({lo, 1, hi - lo});
  }
};

struct SummaryB : BoundNode {
  int64_t s = 1, c = 1;
  bool contains(int64_t, int64_t k) const override { return k % s >= s - c; }
  int64_t row_block() const override { return 0; }
  void row(int64_t, RowRuns& out) const override {
    out.clear();
    if (c <= 0 || k_len <= 0) return;
    if (c >= s) {
      out.push_back({0, 1, k_len});
      return;
    }
    const int64_t nblocks = k_len / s + (k_len % s != 0);  // (k_len + s - 1 overflows for s near 2^63)
    if (c <= nblocks) {  // c strided runs, one per kept offset
      for (int64_t i = 0; i < c; ++i) {
        const int64_t st = s - c + i;
        if (st < k_len) out.push_back({st, s, (k_len - 1 - st) / s + 1});
      }
    } else {  // one interval per block
      for (int64_t j = 0; j < nblocks; ++j) {
        const int64_t lo = j * s + s - c, hi = std::min(k_len, (j + 1) * s);
        if (lo < hi) out.push_back({lo, 1, hi - lo});
      }
    }
    normalize(out);
  }
};

bool in_set(const IndexSet& s, int64_t x) {
  auto it = std::upper_bound(s.begin(), s.end(), x, [](int64_t v, const std::pair<int64_t, int64_t>& r) { return v < r.first; });
  return it != s.begin() && x < std::prev(it)->second;
}

struct GlobalB : BoundNode {
  IndexSet set;
  bool rows = true, cols = true;
  bool contains(int64_t q, int64_t k) const override { return (rows && in_set(set, q)) || (cols && in_set(set, k)); }
  int64_t row_block() const override { return rows ? 1 : 0; }
  bool prefixes(int64_t& g, int64_t& r) const override {  // global_cols(0:g), global_rows(0:r), global(0:g)
    if (set.size() != 1 || set[0].first != 0) return false;
    g = cols ? std::min(set[0].second, k_len) : 0;
    r = rows && k_len > 0 ? std::min(set[0].second, q_len) : 0;
    return true;
  }
  bool dense_rows(IndexSet& ranges) const override {  // global_rows: the set's rows (none where Lk = 0)
    if (cols) return false;
    ranges.clear();
    for (auto& r : set)
      if (r.first < q_len && k_len > 0) ranges.push_back({r.first, std::min(r.second, q_len)});
    return true;
  }
  void row(int64_t q, RowRuns& out) const override {
    out.clear();
    if (rows && in_set(set, q)) {
      if (k_len > 0) out.push_back({0, 1, k_len});
      return;
    }
    if (!cols) return;
    for (auto& r : set) {
      if (r.first >= k_len) break;
      out.push_back({r.first, 1, std::min(r.second, k_len) - r.first});
    }
  }
};

struct RandomB : BoundNode {
  int64_t r = 0;
  uint64_t seed = 0;
  uint64_t id = 0;  // identifies this bound atom in the per-thread row cache
  // A row's keys as maximal intervals [first[i], last[i]], i < n, increasing (scattered keys: mostly single).
  struct Spans {
    std::vector<int32_t> first, last;
    int64_t n = 0;
  };
  // Floyd's set of draws t[0, r) (j = lo + i for draw i) as bits of b (zero where no key is).
  static void set_draws(const uint32_t* t_, int64_t r, int64_t lo, uint64_t* b) {
    for (int64_t i = 0; i < r; ++i) {
      const uint32_t t = t_[i];
      const uint64_t w = b[t >> 6];
      if ((w >> (t & 63)) & 1) {  // t is in the set: j, which is not yet (only keys below j are)
        const uint32_t j = uint32_t(lo + i);
        b[j >> 6] |= uint64_t(1) << (j & 63);
      } else {
        b[t >> 6] = w | uint64_t(1) << (t & 63);
      }
    }
  }
  // Row q's keys as bits (BoundPattern::row_bits) where they live in a bitmap anyway (draw_row's bitmap rows).
  bool row_bits(int64_t q, uint64_t* out) const override {
    const int64_t words = (k_len + 63) / 64;
    std::fill(out, out + words, 0);
    if (r >= k_len) {
      for (int64_t k = 0; k < k_len; k += 64) out[k >> 6] = k_len - k >= 64 ? ~uint64_t(0) : (uint64_t(1) << (k_len - k)) - 1;
      return true;
    }
    if (words > 4 * r) return false;
    thread_local std::vector<uint32_t> t;
    t.resize(size_t(r));
    random_draws(detail::random_row_key(seed, uint64_t(q)), k_len - r, r, t.data());
    set_draws(t.data(), r, k_len - r, out);
    return true;
  }
  // A few draws (r <= 8, draw i at t[i * step]) as their keys at keys[0, r): the set is the keys so far, scanned.
  // kSorted: in increasing order, by insertion (random(3): 50 -> 35 ns a row); else in the draws' order (the insertion's
  // mispredicted branches were 17 ns of the 28 a row of local(256) | random(4)'s analysis, which needs no order).
  template <bool kSorted>
  static void few_draws_keys(const uint32_t* t, int64_t step, int64_t r, int64_t lo, int32_t* keys) {
    for (int64_t i = 0; i < r; ++i) {
      int32_t k = int32_t(t[i * step]);
      if (std::find(keys, keys + i, k) != keys + i) k = int32_t(lo + i);
      int64_t at = i;
      if constexpr (kSorted)
        for (; at > 0 && keys[at - 1] > k; --at) keys[at] = keys[at - 1];
      keys[at] = k;
    }
  }
  // A thread's buffers for drawing rows.
  struct Scratch {
    std::vector<uint32_t> t, set;
    std::vector<uint64_t> bits;  // all zero between rows
    std::vector<int32_t> keys;   // draw_row's: keys[0] and keys[r + 1] for key_spans' sentinels
  };
  static Scratch& scratch() {
    thread_local Scratch s;
    return s;
  }
  // Row q's keys (r < k_len) in increasing order at keys[0, r), up to keys[r + kSlack) written: Floyd's sampling as
  // PATTERNS.md writes it. The draws are hashed in bulk; the set lives in a per-thread bitmap of Lk bits when the row
  // keeps at least one key in 256 (its scan yields the keys in increasing order, and clears it), else in a small hash
  // set whose keys are then sorted; up to 8 draws, in the sorted keys themselves. (Inlined into draw_row, as it was
  // before random_rows_keys shared it: a call was 2-3 ns of random(4)'s 48 a row.)
  [[gnu::always_inline]] static void draw_keys(int64_t r, uint64_t seed, int64_t q, int64_t k_len, int32_t* keys, Scratch& s) {
    const int64_t lo = k_len - r;
    s.t.resize(size_t(r));
    random_draws(detail::random_row_key(seed, uint64_t(q)), lo, r, s.t.data());
    const int64_t words = (k_len + 63) / 64;
    if (r <= 8) {  // sorted by insertion (random(3): 50 -> 35 ns a row with the set scanned)
      few_draws_keys<true>(s.t.data(), 1, r, lo, keys);
    } else if (words <= 4 * r) {
      if (int64_t(s.bits.size()) < words) s.bits.resize(size_t(words), 0);
      uint64_t* b = s.bits.data();
      set_draws(s.t.data(), r, lo, b);
      bitmap_keys(b, words, keys, words > r);
    } else {
      // Open addressing on keys (< 2^31) with Fibonacci hashing, at most half full; ~0u marks an empty slot.
      int bits = 4;
      while ((int64_t(1) << bits) < 2 * r) ++bits;
      const uint32_t mask = (uint32_t(1) << bits) - 1;
      s.set.assign(size_t(mask) + 1, ~0u);
      auto insert = [&](uint32_t k) {  // false if k was there
        for (uint32_t h = (k * 0x9E3779B1u) >> (32 - bits);; h = (h + 1) & mask) {
          if (s.set[h] == k) return false;
          if (s.set[h] == ~0u) {
            s.set[h] = k;
            return true;
          }
        }
      };
      for (int64_t i = 0; i < r; ++i) {
        uint32_t k = s.t[size_t(i)];
        if (!insert(k)) insert(k = uint32_t(lo + i));  // t is in the set: j, which is not yet
        keys[i] = int32_t(k);
      }
      std::sort(keys, keys + r);
    }
  }
  // Row q (r < k_len): its keys (draw_keys) as intervals.
  static void draw_row(int64_t r, uint64_t seed, int64_t q, int64_t k_len, Spans& out) {
    Scratch& s = scratch();
    s.keys.resize(size_t(r) + 2 + kSlack);
    int32_t* keys = s.keys.data() + 1;
    draw_keys(r, seed, q, k_len, keys, s);
    out.first.resize(size_t(r) + kSlack);
    out.last.resize(size_t(r) + kSlack);
    // (A few keys, stored one by one, by the scalar path: the vector one's loads of them wait for the stores; random(3)
    // 35 -> 32 ns a row.)
    out.n = r <= 8 ? key_spans_scalar(keys, r, out.first.data(), out.last.data())
                   : key_spans(keys, r, out.first.data(), out.last.data());
  }
  // Row q's intervals, from a per-thread cache keyed by (atom, row): contains() asks one row many times, and
  // blocked(b, ...) asks each block row b times in a row.
  // Direct-mapped by atom id, 64 slots whose buffers are reused: a map cleared past 64 atoms freed and reallocated
  // every atom's buffers, a third of planning a union of 1000 random terms.
  const Spans& spans(int64_t q) const {
    struct Entry {
      uint64_t id = 0;
      int64_t q = -1;
      Spans spans;
    };
    thread_local std::array<Entry, 64> cache;
    thread_local uint64_t last_id = 0;  // the atom asked last and its entry
    thread_local Entry* last = nullptr;
    if (!last || last_id != id) {  // (a map's hash and bucket division were a sparse row's largest cost)
      last = &cache[id % cache.size()];
      last_id = id;
      if (last->id != id) last->id = id, last->q = -1;
    }
    Entry& e = *last;
    if (e.q != q) {
      e.q = q;
      draw_row(r, seed, q, k_len, e.spans);
    }
    return e.spans;
  }
  bool contains(int64_t q, int64_t k) const override {
    if (r >= k_len) return true;
    const Spans& sp = spans(q);
    const int32_t* f = sp.first.data();
    const int64_t i = std::upper_bound(f, f + sp.n, k) - f;  // intervals [0, i) start at or before k
    return i > 0 && k <= sp.last[size_t(i - 1)];
  }
  void row(int64_t q, RowRuns& out) const override {
    if (r >= k_len) {
      out.clear();
      if (k_len > 0) out.push_back({0, 1, k_len});
      return;
    }
    // Maximal intervals are normalised runs. Not cleared first: callers reuse out, and resize then fills only
    // what it grows.
    const Spans& sp = spans(q);
    out.resize(size_t(sp.n));
    span_runs(sp.first.data(), sp.last.data(), sp.n, out.data());
  }
  int64_t row_nnz(int64_t, RowRuns&) const override { return std::min(r, k_len); }
  bool counts_alike() const override { return true; }
  bool random(int64_t& r_, uint64_t& seed_) const override {
    r_ = r, seed_ = seed;
    return true;
  }
};
std::atomic<uint64_t> g_row_cache_ids{1};

struct DocumentB : BoundNode {
  std::vector<int64_t> starts;  // segment starts, plus the total at the end
  int64_t seg(int64_t x) const { return int64_t(std::upper_bound(starts.begin(), starts.end(), x) - starts.begin()) - 1; }
  bool contains(int64_t q, int64_t k) const override { return seg(q) == seg(k); }
  void row(int64_t q, RowRuns& out) const override {
    out.clear();
    const int64_t s = seg(q);
    const int64_t lo = starts[size_t(s)], hi = std::min(k_len, starts[size_t(s) + 1]);
    if (lo < hi) out.push_back({lo, 1, hi - lo});
  }
};

struct BlockedB : BoundNode {
  int64_t b = 1;
  BoundPtr inner;
  uint64_t id = 0;  // identifies this bound node in the per-thread row cache
  bool contains(int64_t q, int64_t k) const override { return inner->contains(q / b, k / b); }
  int64_t row_block() const override { return b; }
  BoundPtr blocked(int64_t& block) const override {
    block = b;
    return inner;
  }
  void row(int64_t q, RowRuns& out) const override {
    // The b rows of a block row share their keys: the last block row's per thread (rows are walked in order:
    // bigbird(64, ...) drew and normalised each block row 64 times).
    struct Entry {
      uint64_t id = 0;
      int64_t block = -1;
      RowRuns runs;
    };
    thread_local Entry cache;
    if (cache.id == id && cache.block == q / b) {
      out = cache.runs;
      return;
    }
    block_row(q / b, out);
    cache.id = id;
    cache.block = q / b;
    cache.runs = out;
  }
  void block_row(int64_t qb, RowRuns& out) const {
    RowRuns blocks;
    inner->row(qb, blocks);
    out.clear();
    for (const Run& r : blocks) {
      if (r.stride == 1) {
        out.push_back({r.start * b, 1, std::min(k_len, (r.start + r.count) * b) - r.start * b});
      } else if (b <= r.count) {  // b strided runs of stride r.stride * b
        for (int64_t i = 0; i < b; ++i) {
          const int64_t st = r.start * b + i;
          const int64_t last = std::min(k_len - 1, r.last() * b + i);
          if (st <= last) out.push_back({st, r.stride * b, (last - st) / (r.stride * b) + 1});
        }
      } else {  // one interval per block
        for (int64_t t = 0; t < r.count; ++t) {
          const int64_t j = r.start + t * r.stride;
          out.push_back({j * b, 1, std::min(k_len, (j + 1) * b) - j * b});
        }
      }
    }
    normalize(out);
  }
};

}  // namespace

Run neighborhood_window(int64_t n, int64_t K, int64_t d, bool causal, int64_t i) {
  // (Without dilation: no division. Six a 2-D row were a tenth of choosing na2d's tile shape, which draws ~40k rows.)
  const int64_t g = d == 1 ? 0 : i % d, p = d == 1 ? i : i / d;
  const int64_t ng = d == 1 ? n : (n - 1 - g) / d + 1;
  int64_t t0, cnt;
  if (causal) {
    t0 = std::max<int64_t>(0, p - K + 1);
    cnt = p - t0 + 1;
  } else {
    t0 = std::clamp<int64_t>(p - K / 2, 0, ng - K);
    cnt = K;
  }
  return {g + t0 * d, d, cnt};
}

namespace {

struct NeighborhoodB : BoundNode {
  int naxes = 1;
  std::array<int64_t, 3> n{1, 1, 1}, K{1, 1, 1}, d{1, 1, 1};
  std::array<bool, 3> causal{false, false, false};
  // The window of coordinate i on axis ax as an affine run of coordinates.
  Run window(int ax, int64_t i) const { return neighborhood_window(n[ax], K[ax], d[ax], causal[ax], i); }
  void coords(int64_t x, int64_t* c) const {
    for (int ax = naxes - 1; ax >= 0; --ax) {
      c[ax] = x % n[ax];
      x /= n[ax];
    }
  }
  bool contains(int64_t q, int64_t k) const override {
    int64_t cq[3], ck[3];
    coords(q, cq);
    coords(k, ck);
    for (int ax = 0; ax < naxes; ++ax)
      if (!run_has(window(ax, cq[ax]), ck[ax])) return false;
    return true;
  }
  void row(int64_t q, RowRuns& out) const override {
    out.clear();
    int64_t c[3];
    coords(q, c);
    const Run w0 = window(0, c[0]);
    const Run w1 = naxes > 1 ? window(1, c[1]) : Run{0, 1, 1};
    const Run w2 = naxes > 2 ? window(2, c[2]) : Run{0, 1, 1};
    Run inner = naxes == 1 ? w0 : naxes == 2 ? w1 : w2;  // the fastest-varying axis
    if (inner.count == 1) inner.stride = 1;            // (normalised)
    const int64_t n1 = naxes > 1 ? n[1] : 1, n2 = naxes > 2 ? n[2] : 1;
    if (naxes == 1) {
      out.push_back(inner);
    } else if (naxes == 2) {
      for (int64_t a = 0; a < w0.count; ++a)
        out.push_back({(w0.start + a * w0.stride) * n1 + inner.start, inner.stride, inner.count});
    } else {
      for (int64_t a = 0; a < w0.count; ++a)
        for (int64_t b2 = 0; b2 < w1.count; ++b2)
          out.push_back({((w0.start + a * w0.stride) * n1 + (w1.start + b2 * w1.stride)) * n2 + inner.start, inner.stride,
                         inner.count});
    }
    // One run a line of the last axis, in increasing order: normalised already unless a run spans its whole line
    // (then consecutive lines' runs may touch and merge).
    if (inner.count >= n[size_t(naxes - 1)]) normalize(out);
  }
  // The product of the axes' window sizes (the kept set is the product of the windows), without the row.
  int64_t row_nnz(int64_t q, RowRuns&) const override {
    int64_t c[3], keys = 1;
    coords(q, c);
    for (int ax = 0; ax < naxes; ++ax) keys *= window(ax, c[ax]).count;
    return keys;
  }
};

}  // namespace

BoundPtr bind_node(const std::shared_ptr<const Node>& np, const std::string& spec, int64_t q_len, int64_t k_len) {
  const Node& n = *np;
  auto finish = [&](auto b) -> BoundPtr {
    b->q_len = q_len;
    b->k_len = k_len;
    return b;
  };
  switch (n.kind) {
    case Kind::Union:
    case Kind::Inter: {
      if (n.kind == Kind::Union) {
        auto b = std::make_shared<UnionB>();
        for (auto& c : n.children) b->kids.push_back(bind_node(c, spec, q_len, k_len));
        return finish(b);
      }
      auto b = std::make_shared<InterB>();
      for (auto& c : n.children) b->kids.push_back(bind_node(c, spec, q_len, k_len));
      return finish(b);
    }
    case Kind::Dense: return finish(std::make_shared<DenseB>());
    case Kind::Causal: return finish(std::make_shared<CausalB>());
    case Kind::Local: {
      auto b = std::make_shared<LocalB>();
      b->left = n.a;
      b->right = n.b;
      return finish(b);
    }
    case Kind::Dilated: {
      auto b = std::make_shared<DilatedB>();
      b->w = n.a;
      b->d = n.b;
      return finish(b);
    }
    case Kind::Stride: {
      auto b = std::make_shared<StrideB>();
      b->s = n.a;
      return finish(b);
    }
    case Kind::BlockDiag: {
      auto b = std::make_shared<BlockDiagB>();
      b->s = n.a;
      return finish(b);
    }
    case Kind::Summary: {
      auto b = std::make_shared<SummaryB>();
      b->s = n.a;
      b->c = n.b;
      return finish(b);
    }
    case Kind::Global:
    case Kind::GlobalRows:
    case Kind::GlobalCols: {
      auto b = std::make_shared<GlobalB>();
      b->rows = n.kind != Kind::GlobalCols;
      b->cols = n.kind != Kind::GlobalRows;
      const int64_t limit = n.kind == Kind::GlobalRows ? q_len : n.kind == Kind::GlobalCols ? k_len : std::max(q_len, k_len);
      b->set = n.set;
      if (n.clip) {
        IndexSet clipped;
        for (auto& r : b->set)
          if (r.first < limit) clipped.push_back({r.first, std::min(r.second, limit)});
        b->set = clipped;
      } else if (!b->set.empty() && b->set.back().second > limit) {
        const char* axis = n.kind == Kind::GlobalRows ? "query length" : n.kind == Kind::GlobalCols ? "key length" : "length";
        bind_fail(n, spec, "index " + std::to_string(b->set.back().second - 1) + " in '" + n.text + "' is out of range for " +
                               axis + " " + std::to_string(limit));
      }
      return finish(b);
    }
    case Kind::Random: {
      auto b = std::make_shared<RandomB>();
      b->r = n.a;
      b->seed = uint64_t(n.b);
      b->id = g_row_cache_ids.fetch_add(1);
      return finish(b);
    }
    case Kind::Document: {
      auto b = std::make_shared<DocumentB>();
      int64_t total = 0;
      b->starts.push_back(0);
      for (int64_t s : n.segments) {
        total = sat_add(total, s);
        b->starts.push_back(total);
      }
      if (total != q_len || total != k_len) {
        bind_fail(n, spec, "segments of '" + n.text + "' sum to " + std::to_string(total) + " but the length is " +
                               (q_len == k_len ? std::to_string(q_len) : std::to_string(q_len) + " x " + std::to_string(k_len)));
      }
      return finish(b);
    }
    case Kind::Blocked: {
      auto b = std::make_shared<BlockedB>();
      b->b = n.a;
      b->id = g_row_cache_ids.fetch_add(1);
      const int64_t nbq = q_len / n.a + (q_len % n.a != 0), nbk = k_len / n.a + (k_len % n.a != 0);
      b->inner = bind_node(n.children[0], spec, nbq, nbk);
      return finish(b);
    }
    case Kind::Neighborhood: {
      auto b = std::make_shared<NeighborhoodB>();
      b->naxes = n.naxes;
      if (q_len != k_len)
        bind_fail(n, spec, "'" + n.text + "' needs equal query and key lengths, got " + std::to_string(q_len) + " and " + std::to_string(k_len));
      int64_t prod = 1;
      for (int ax = 0; ax < n.naxes; ++ax) {
        b->n[size_t(ax)] = n.dims[size_t(ax)] ? n.dims[size_t(ax)] : q_len;
        b->K[size_t(ax)] = n.kernel[size_t(ax)];
        b->d[size_t(ax)] = n.dilation[size_t(ax)];
        b->causal[size_t(ax)] = n.causal[size_t(ax)];
        prod = sat_mul(prod, b->n[size_t(ax)]);
      }
      if (prod != q_len) {
        std::string dims;
        for (int ax = 0; ax < n.naxes; ++ax) dims += (ax ? "x" : "") + std::to_string(b->n[size_t(ax)]);
        bind_fail(n, spec, "dims " + dims + " of '" + n.text + "' hold " + std::to_string(prod) + " tokens but the length is " + std::to_string(q_len));
      }
      if (q_len == 0) bind_fail(n, spec, "'" + n.text + "' needs a length of at least 1");
      for (int ax = 0; ax < n.naxes; ++ax) {
        const int64_t nn = b->n[size_t(ax)], d = b->d[size_t(ax)], K = b->K[size_t(ax)];
        const int64_t ng_min = d <= nn ? nn / d : 1;  // tokens in the smallest non-empty dilation group
        if (!b->causal[size_t(ax)] && K > ng_min)
          bind_fail(n, spec, "kernel " + std::to_string(K) + " on axis " + std::to_string(ax) + " of '" + n.text + "' does not fit: axis size " +
                                 std::to_string(nn) + " with dilation " + std::to_string(d) + " leaves " + std::to_string(ng_min) + " tokens in a group");
      }
      return finish(b);
    }
  }
  throw Error("internal: unknown pattern node");
}

}  // namespace detail

void random_rows_keys(uint64_t seed, int64_t r, int64_t q0, int64_t q1, int64_t k_len, std::vector<int32_t>& keys) {
  if (r < 1 || r >= k_len || q0 < 0 || q1 < q0)
    throw Error("random_rows_keys: needs 1 <= r < k_len and 0 <= q0 <= q1, got r " + std::to_string(r) + ", k_len " +
                std::to_string(k_len) + ", rows " + std::to_string(q0) + ":" + std::to_string(q1));
  const size_t n = size_t((q1 - q0) * r);
  keys.resize(n + detail::kSlack);  // (draw_keys writes up to kSlack past a row's keys: the next row's, or these)
  int64_t q = q0;
#if defined(__x86_64__) && defined(__GNUC__)
  if (r <= 8 && detail::have_avx512()) {  // eight rows' draws at a time (local(256) | random(4): 40 -> 8 ns a row)
    uint32_t t[64];
    for (; q < q1; q += 8) {
      detail::random_draws_rows_avx512(seed, q, k_len - r, r, t);
      for (int64_t l = 0; l < 8 && q + l < q1; ++l)
        detail::RandomB::few_draws_keys<false>(t + l, 8, r, k_len - r, keys.data() + (q + l - q0) * r);
    }
  }
#endif
  for (detail::RandomB::Scratch& s = detail::RandomB::scratch(); q < q1; ++q)
    detail::RandomB::draw_keys(r, seed, q, k_len, keys.data() + (q - q0) * r, s);
  keys.resize(n);
}

BoundPattern Pattern::bind(int64_t q_len, int64_t k_len) const {
  if (!root_) throw Error("pattern is empty: parse a spec first");
  if (q_len < 0 || k_len < 0)
    throw Error("lengths must not be negative, got q_len " + std::to_string(q_len) + " and k_len " + std::to_string(k_len));
  if (k_len > std::numeric_limits<int32_t>::max())
    throw Error("key length " + std::to_string(k_len) + " exceeds 2^31 - 1 (32-bit column indices)");
  BoundPattern b;
  b.spec_ = spec_;
  b.q_len_ = q_len;
  b.k_len_ = k_len;
  b.root_ = detail::bind_node(root_, spec_, q_len, k_len);
  b.node_ = root_;
  return b;
}
BoundPattern Pattern::bind(int64_t len) const { return bind(len, len); }

bool BoundPattern::contains(int64_t q, int64_t k) const {
  if (q < 0 || q >= q_len_ || k < 0 || k >= k_len_) return false;
  return root_->contains(q, k);
}
void BoundPattern::row(int64_t q, RowRuns& out) const {
  if (q < 0 || q >= q_len_) throw Error("row " + std::to_string(q) + " is out of range for query length " + std::to_string(q_len_));
  root_->row(q, out);
}
void BoundPattern::row_keys(int64_t q, std::vector<int64_t>& out) const {
  RowRuns r;
  row(q, r);
  expand_runs(r, out);
}
int64_t BoundPattern::row_nnz(int64_t q) const {
  if (q < 0 || q >= q_len_) throw Error("row " + std::to_string(q) + " is out of range for query length " + std::to_string(q_len_));
  thread_local RowRuns r;  // (no node asks a BoundPattern's row_nnz: a fresh vector a row was a malloc and free a row)
  return root_->row_nnz(q, r);
}
bool BoundPattern::row_bits(int64_t q, uint64_t* words) const { return root_ && root_->row_bits(q, words); }
std::optional<std::vector<std::pair<int64_t, int64_t>>> BoundPattern::dense_row_ranges() const {
  std::vector<std::pair<int64_t, int64_t>> ranges, merged;
  if (!root_ || !root_->dense_rows(ranges)) return std::nullopt;
  std::sort(ranges.begin(), ranges.end());
  for (auto& r : ranges) {
    if (r.first >= r.second) continue;
    if (!merged.empty() && r.first <= merged.back().second) merged.back().second = std::max(merged.back().second, r.second);
    else merged.push_back(r);
  }
  return merged;
}
int64_t BoundPattern::row_block() const {
  const int64_t b = root_ ? root_->row_block() : 1;
  return b == 0 ? std::max<int64_t>(q_len_, 1) : std::max<int64_t>(b, 1);
}
std::optional<BoundPattern::BandSpec> BoundPattern::band_spec() const {
  BandSpec b;
  if (!root_ || !root_->band_prefixes(b.lo, b.hi, b.key_prefix, b.row_prefix) || b.lo > b.hi) return std::nullopt;
  return b;
}
std::optional<BoundPattern::BandRandom> BoundPattern::band_random() const {
  BandRandom b;
  if (!root_ || !root_->band_random(b.lo, b.hi, b.random.r, b.random.seed) || b.lo > b.hi) return std::nullopt;
  return b;
}
std::optional<BoundPattern::DilatedBand> BoundPattern::dilated_band() const {
  DilatedBand b;
  if (!root_ || !root_->dilated_band(b.lo, b.hi, b.d) || b.lo > b.hi) return std::nullopt;
  return b;
}
std::optional<std::pair<int64_t, int64_t>> BoundPattern::band() const {
  int64_t lo = 0, hi = 0;
  if (!root_ || !root_->band(lo, hi) || lo > hi) return std::nullopt;
  return std::pair{lo, hi};
}
int64_t BoundPattern::nnz() const {
  int64_t n = 0;
  RowRuns r;
  // One row for all where the spec says (random: a call a row was 30 us of local(256) | random(4)'s split, L = 16384).
  if (root_ && q_len_ > 0 && root_->counts_alike()) return root_->row_nnz(0, r) * q_len_;
  const int64_t b = row_block();  // rows alike: one a block
  for (int64_t q = 0; q < q_len_; q += b) n += root_->row_nnz(q, r) * std::min(b, q_len_ - q);
  return n;
}

}  // namespace spattn
