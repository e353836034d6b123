// Binding a parsed pattern to lengths: validation, the reference predicate and row enumeration per atom.
#include <algorithm>
#include <atomic>
#include <limits>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <vector>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "pattern/ast.hpp"

namespace spattn {

namespace {
// PATTERNS.md's mix (splitmix64's finalizer): x ^= x >> 30; x *= kMix1; x ^= x >> 27; x *= kMix2; x ^= x >> 31.
constexpr uint64_t kMix1 = 0xBF58476D1CE4E5B9ull, kMix2 = 0x94D049BB133111EBull;
}  // namespace

uint64_t random_mix(uint64_t x) {
  x ^= x >> 30;
  x *= kMix1;
  x ^= x >> 27;
  x *= kMix2;
  x ^= x >> 31;
  return x;
}
uint64_t random_hash(uint64_t seed, uint64_t q, uint64_t k) { return random_mix(random_mix(random_mix(seed) + q) + k); }

namespace detail {
namespace {

// The (h, k) of keys k < k_len with h = mix(a + k) <= bound, in increasing k (random's row: see RandomB).
void random_collect_scalar(uint64_t a, int64_t k0, int64_t k_len, uint64_t bound,
                           std::vector<std::pair<uint64_t, int64_t>>& out) {
  for (int64_t k = k0; k < k_len; ++k) {
    const uint64_t x = random_mix(a + uint64_t(k));
    if (x <= bound) out.push_back({x, k});
  }
}
#if defined(__x86_64__) && defined(__GNUC__)
// x ^ (x >> n), eight lanes; the zero-masked shift (all lanes kept) because GCC 12 warns on the plain one's
// undefined source operand.
__attribute__((target("avx512f"))) inline __m512i xorshift(__m512i x, unsigned n) {
  return _mm512_xor_si512(x, _mm512_maskz_srli_epi64(0xFF, x, n));
}
// Eight keys at a time (64-bit multiplies need AVX-512DQ); the row's plan-time cost is these hashes, Lq * Lk.
__attribute__((target("avx512f,avx512dq"))) void random_collect_avx512(
    uint64_t a, int64_t k_len, uint64_t bound, std::vector<std::pair<uint64_t, int64_t>>& out) {
  const __m512i m1 = _mm512_set1_epi64(int64_t(kMix1)), m2 = _mm512_set1_epi64(int64_t(kMix2));
  const __m512i vb = _mm512_set1_epi64(int64_t(bound)), step = _mm512_set1_epi64(8);
  __m512i kv = _mm512_add_epi64(_mm512_set1_epi64(int64_t(a)), _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
  int64_t k = 0;
  for (; k + 8 <= k_len; k += 8) {
    __m512i x = kv;
    kv = _mm512_add_epi64(kv, step);
    x = _mm512_mullo_epi64(xorshift(x, 30), m1);
    x = _mm512_mullo_epi64(xorshift(x, 27), m2);
    x = xorshift(x, 31);
    unsigned m = _mm512_cmple_epu64_mask(x, vb);
    if (m) {
      alignas(64) uint64_t xs[8];
      _mm512_store_si512(reinterpret_cast<__m512i*>(xs), x);
      for (; m; m &= m - 1) {
        const int i = __builtin_ctz(m);
        out.push_back({xs[i], k + i});
      }
    }
  }
  random_collect_scalar(a, k, k_len, bound, out);
}
#endif
void random_collect(uint64_t a, int64_t k_len, uint64_t bound, std::vector<std::pair<uint64_t, int64_t>>& out) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  if (avx512) return random_collect_avx512(a, k_len, bound, out);
#endif
  random_collect_scalar(a, 0, k_len, bound, out);
}

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
int64_t sat_add(int64_t a, int64_t b) { return (b > 0 && a > kMax - b) ? kMax : a + b; }
int64_t sat_mul(int64_t a, int64_t b) { return (a != 0 && b > kMax / a) ? kMax : a * b; }

[[noreturn]] void bind_fail(const Node& n, const std::string& spec, const std::string& what) {
  std::ostringstream os;
  os << "pattern error at column " << n.column << ": " << what << " (in \"" << spec << "\")";
  throw Error(os.str());
}

using BoundPtr = std::shared_ptr<const BoundNode>;

// ---- composites ----
struct UnionB : BoundNode {
  std::vector<BoundPtr> kids;
  bool contains(int64_t q, int64_t k) const override {
    for (auto& c : kids)
      if (c->contains(q, k)) return true;
    return false;
  }
  void row(int64_t q, RowRuns& out) const override {
    out.clear();
    RowRuns tmp;
    for (auto& c : kids) {
      c->row(q, tmp);
      out.insert(out.end(), tmp.begin(), tmp.end());
    }
    normalize(out);
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
};

// ---- atoms ----
struct DenseB : BoundNode {
  bool contains(int64_t, int64_t) const override { return true; }
  void row(int64_t, RowRuns& out) const override {
    out.clear();
    if (k_len > 0) out.push_back({0, 1, k_len});
  }
};

struct CausalB : BoundNode {
  bool contains(int64_t q, int64_t k) const override { return k <= q; }
  void row(int64_t q, RowRuns& out) const override {
    out.clear();
    const int64_t n = std::min(q + 1, k_len);
    if (n > 0) out.push_back({0, 1, n});
  }
};

struct LocalB : BoundNode {
  int64_t left = 0, right = 0;
  bool contains(int64_t q, int64_t k) const override { return k >= q - left && k <= sat_add(q, right); }
  void row(int64_t q, RowRuns& out) const override {
    out.clear();
    const int64_t lo = q - std::min(left, q);
    const int64_t hi = std::min(k_len - 1, sat_add(q, std::min(right, k_len)));
    if (lo <= hi) out.push_back({lo, 1, hi - lo + 1});
  }
};

struct DilatedB : BoundNode {
  int64_t w = 0, d = 1;
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
  void row(int64_t, RowRuns& out) const override {
    out.clear();
    if (c <= 0 || k_len <= 0) return;
    if (c >= s) {
      out.push_back({0, 1, k_len});
      return;
    }
    const int64_t nblocks = (k_len + s - 1) / s;
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
  // Keys of row q (sorted), from a per-thread cache keyed by (atom, row).
  const std::vector<int64_t>& keys(int64_t q) const {
    struct Entry {
      int64_t q = -1;
      std::vector<int64_t> keys;
    };
    thread_local std::unordered_map<uint64_t, Entry> cache;
    if (cache.size() > 64) cache.clear();
    Entry& e = cache[id];
    if (e.q != q) {
      e.q = q;
      e.keys.clear();
      // The r smallest (h, k). h(seed, q, k) = mix(a + k) with a = mix(mix(seed) + q) fixed for the row, so a key
      // costs one mix. Hashes are uniform: the r-th smallest lies near r/Lk of the range, so one pass keeps the
      // (h, k) below a bound of about twice that (~2r pairs) and selects among them; when fewer than r fall
      // below it (rare), every pair is kept. Either way the r smallest pairs are among those kept.
      const int64_t rr = std::min(r, k_len);
      if (rr <= 0) return e.keys;
      const uint64_t a = random_mix(random_mix(seed) + uint64_t(q));
      const long double frac = (2.0L * r + 64) / (long double)k_len;
      const uint64_t bound = frac >= 1 ? ~0ull : uint64_t(frac * 18446744073709551616.0L);
      thread_local std::vector<std::pair<uint64_t, int64_t>> sel;
      auto collect = [&](uint64_t b) {
        sel.clear();
        random_collect(a, k_len, b, sel);
      };
      collect(bound);
      if (int64_t(sel.size()) < rr) collect(~0ull);
      // The rr-th smallest hash t; keys with hash below t, then those with hash t in increasing k, until rr:
      // sel is in increasing k, so the keys come out sorted.
      thread_local std::vector<uint64_t> hs;
      hs.resize(sel.size());
      for (size_t i = 0; i < sel.size(); ++i) hs[i] = sel[i].first;
      std::nth_element(hs.begin(), hs.begin() + (rr - 1), hs.end());
      const uint64_t t = hs[size_t(rr - 1)];
      int64_t ties = rr;
      for (const auto& x : sel) ties -= x.first < t;
      e.keys.reserve(size_t(rr));
      for (const auto& x : sel)
        if (x.first < t || (x.first == t && ties-- > 0)) e.keys.push_back(x.second);
    }
    return e.keys;
  }
  bool contains(int64_t q, int64_t k) const override {
    if (r >= k_len) return true;
    const auto& ks = keys(q);
    return std::binary_search(ks.begin(), ks.end(), k);
  }
  void row(int64_t q, RowRuns& out) const override {
    out.clear();
    if (r >= k_len) {
      if (k_len > 0) out.push_back({0, 1, k_len});
      return;
    }
    compress_keys(keys(q), out);
    normalize(out);
  }
};
std::atomic<uint64_t> g_random_ids{1};

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
  bool contains(int64_t q, int64_t k) const override { return inner->contains(q / b, k / b); }
  void row(int64_t q, RowRuns& out) const override {
    RowRuns blocks;
    inner->row(q / b, blocks);
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

struct NeighborhoodB : BoundNode {
  int naxes = 1;
  std::array<int64_t, 3> n{1, 1, 1}, K{1, 1, 1}, d{1, 1, 1};
  std::array<bool, 3> causal{false, false, false};
  // The window of coordinate i on axis ax as an affine run of coordinates.
  Run window(int ax, int64_t i) const {
    const int64_t g = i % d[ax], p = i / d[ax];
    const int64_t ng = (n[ax] - 1 - g) / d[ax] + 1;
    int64_t t0, cnt;
    if (causal[ax]) {
      t0 = std::max<int64_t>(0, p - K[ax] + 1);
      cnt = p - t0 + 1;
    } else {
      t0 = std::clamp<int64_t>(p - K[ax] / 2, 0, ng - K[ax]);
      cnt = K[ax];
    }
    return {g + t0 * d[ax], d[ax], cnt};
  }
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
    const Run inner = naxes == 1 ? w0 : naxes == 2 ? w1 : w2;  // the fastest-varying axis
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
    normalize(out);
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
      b->id = g_random_ids.fetch_add(1);
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
  RowRuns r;
  row(q, r);
  return count_keys(r);
}
int64_t BoundPattern::nnz() const {
  int64_t n = 0;
  RowRuns r;
  for (int64_t q = 0; q < q_len_; ++q) {
    root_->row(q, r);
    n += count_keys(r);
  }
  return n;
}

}  // namespace spattn
