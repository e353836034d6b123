// plan/block_plan.cpp — see block_plan.hpp.
#include "plan/block_plan.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <climits>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <numeric>
#include <span>
#include <sstream>
#include <thread>

#include "common/parallel.hpp"
#include "plan/kernels.hpp"
#include "plan/key_strips.hpp"

namespace spattn::plan {
namespace {

constexpr int64_t kNegInf = -(int64_t(1) << 30);  // band bounds that never bind
constexpr int64_t kPosInf = (int64_t(1) << 30);

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }  // b > 0, any sign of a
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// A mapped plan space (tile_map.hpp): the maps, the key map's inverse and what map_run needs of the key grid; the
// arrays (O(L) each) built at the first Space over them (build()), so that a candidate priced from its grid's windows
// (mapped_candidates) and never chosen builds none.
struct Maps {
  GridTiling q, k;
  mutable std::vector<int32_t> qmap, kmap;
  mutable std::vector<int32_t> kpos;   // token -> key plan position
  mutable std::vector<char> kwhole;    // per key tile: no padding position
  mutable int64_t n2 = 1, d2 = 1, s2 = 1;  // the key grid's last axis: size, dilation, box side
  mutable std::once_flag built;

  Maps(const GridTiling& q_, const GridTiling& k_) : q(q_), k(k_) {}
  void build() const {
    std::call_once(built, [&] {
      qmap = q.map();
      kmap = k.map();
      const int64_t bn = k.box.volume();
      kpos.assign(size_t(k.tokens()), -1);
      kwhole.assign(kmap.size() / size_t(bn), 1);
      for (size_t p = 0; p < kmap.size(); ++p) {
        if (kmap[p] >= 0) kpos[size_t(kmap[p])] = int32_t(p);
        else kwhole[p / size_t(bn)] = 0;
      }
      n2 = k.dims[2], d2 = k.dilation[2], s2 = k.box.side[2];
    });
  }
};

// The plan-space geometry shared by the builder and the cost estimate.
struct Space {
  int bm, bn, d;
  int64_t lq, lk, q_group, k_group, q_tiles, k_tiles;
  const Maps* m = nullptr;  // mapped plan space (d is 1)

  Space(int64_t lq_, int64_t lk_, int bm_, int bn_, const Maps& maps) : bm(bm_), bn(bn_), d(1), lq(lq_), lk(lk_), m(&maps) {
    maps.build();
    q_group = int64_t(maps.qmap.size());
    k_group = int64_t(maps.kmap.size());
    q_tiles = q_group / bm;
    k_tiles = k_group / bn;
  }
  Space(int64_t lq_, int64_t lk_, int bm_, int bn_, int d_) : bm(bm_), bn(bn_), d(d_), lq(lq_), lk(lk_) {
    if (d == 1) {
      q_group = lq;
      k_group = lk;
      q_tiles = ceil_div(lq, bm);
      k_tiles = ceil_div(lk, bn);
    } else {
      q_group = round_up(ceil_div(lq, d), bm);
      k_group = round_up(ceil_div(lk, d), bn);
      q_tiles = d * q_group / bm;
      k_tiles = d * k_group / bn;
    }
  }
  int64_t q_token(int64_t p) const {
    if (m) return BlockPlan::mapped_token(m->qmap, p, lq);
    if (d == 1) return p;
    const int64_t g = p / q_group;
    return g + (p - g * q_group) * d;
  }
  // Key tile kt holds no padding position (a full tile must: the kernels run it unmasked).
  bool k_whole(int64_t kt) const { return m ? m->kwhole[size_t(kt)] != 0 : k_valid(kt) == bn; }
  // Number of valid keys at the start of key tile kt (invalid keys of a tile are always a suffix). Unmapped only.
  int64_t k_valid(int64_t kt) const {
    const int64_t k0 = kt * bn;
    if (d == 1) return std::clamp<int64_t>(lk - k0, 0, bn);
    const int64_t g = k0 / k_group, j0 = k0 - g * k_group;
    const int64_t ng = residue_group_len(lk, g, d);
    return std::clamp<int64_t>(ng - j0, 0, bn);
  }
  // Appends the plan-space runs of a token-space run.
  void map_run(const Run& r, std::vector<Run>& out) const {
    if (m) return map_run_mapped(r, out);
    if (d == 1) {
      out.push_back(r);
      return;
    }
    if (r.stride % d == 0) {
      const int64_t g = r.start % d;
      out.push_back({g * k_group + r.start / d, r.stride / d, r.count});
    } else if (r.stride == 1) {
      const int64_t last = r.last();
      for (int64_t g = 0; g < d; ++g) {
        const int64_t t0 = r.start + ((g - r.start % d) % d + d) % d;
        if (t0 > last) continue;
        out.push_back({g * k_group + t0 / d, 1, (last - t0) / d + 1});
      }
    } else {
      for (int64_t i = 0; i < r.count; ++i) {
        const int64_t t = r.start + i * r.stride;
        out.push_back({(t % d) * k_group + t / d, 1, 1});
      }
    }
  }
  // Mapped: a run along the key grid's last axis at its dilation (a neighborhood row's runs) steps one offset a
  // key inside a box, so it maps to one plan interval per box it crosses; other runs map key by key.
  // (The last-axis coordinate is carried from piece to piece, and without dilation the offset in a box of a power-of-
  // two side is a mask: no division a piece, which were most of a neighborhood plan's row mapping.)
  void map_run_mapped(const Run& r, std::vector<Run>& out) const {
    const bool along = r.stride == m->d2, plain = m->d2 == 1 && (m->s2 & (m->s2 - 1)) == 0;
    int64_t c = along ? r.start % m->n2 : 0;  // last-axis coordinate of t
    for (int64_t t = r.start, left = r.count; left > 0;) {
      int64_t len = 1;
      if (along && left > 1) {
        if (plain) {
          len = std::min({left, m->s2 - (c & (m->s2 - 1)), m->n2 - c});
        } else {
          const int64_t o = (c / m->d2) % m->s2;  // offset in the box
          len = std::min({left, m->s2 - o, (m->n2 - 1 - c) / m->d2 + 1});
        }
      }
      out.push_back({m->kpos[size_t(t)], 1, len});
      t += len * r.stride;
      left -= len;
      if (along && (c += len * m->d2) >= m->n2) c = t % m->n2;
    }
  }
};

// Walks the kept keys of one plan-space run tile by tile: f(kt, first local col, one-past-last local col)
// for intervals, f(kt, c, c + 1) per key for strided runs. bn: 64 or 128 (shifts, not divisions: a random
// row is ~800 runs).
template <class F>
void for_each_tile_span(const Run& r, int bn, F&& f) {
  if (r.count <= 0) return;
  const int sh = bn == 64 ? 6 : 7;
  if (r.stride == 1 || r.count == 1) {
    const int64_t a = r.start, b = r.start + r.count;
    for (int64_t kt = a >> sh; (kt << sh) < b; ++kt) {
      const int64_t k0 = kt << sh;
      f(kt, std::max(a, k0) - k0, std::min(b, k0 + bn) - k0);
    }
  } else {
    for (int64_t i = 0; i < r.count; ++i) {
      const int64_t k = r.start + i * r.stride;
      const int64_t kt = k >> sh;
      f(kt, k - (kt << sh), k - (kt << sh) + 1);
    }
  }
}

// Rows as bits (BoundPattern::row_bits): a row's keys, and each
// word's keys (a 64-key tile's) added to counts of the nonzero words, listed in touched. With the CPU's popcnt where
// it has one: the library is built for baseline x86-64, where __builtin_popcountll is a libgcc call (it was a
// quarter of a random plan's build).
#define SPATTN_ROW_BITS_FUNCTIONS(SUFFIX, ATTR)                                                                  \
  ATTR int64_t bit_keys##SUFFIX(const uint64_t* b, int64_t n) {                                                  \
    int64_t keys = 0;                                                                                            \
    for (int64_t w = 0; w < n; ++w) keys += __builtin_popcountll(b[w]);                                         \
    return keys;                                                                                                 \
  }                                                                                                              \
  ATTR int64_t word_counts##SUFFIX(const uint64_t* b, int64_t n, int64_t* count, int64_t* touched, size_t& nt) { \
    int64_t keys = 0;                                                                                            \
    for (int64_t w = 0; w < n; ++w)                                                                              \
      if (const int64_t c = __builtin_popcountll(b[w])) count[w] = c, touched[nt++] = w, keys += c;              \
    return keys;                                                                                                 \
  }
SPATTN_ROW_BITS_FUNCTIONS(_generic, )
#if defined(__x86_64__) && defined(__GNUC__)
SPATTN_ROW_BITS_FUNCTIONS(_popcnt, __attribute__((target("popcnt"))))
bool have_popcnt() {
  static const bool v = __builtin_cpu_supports("popcnt");
  return v;
}
#else
bool have_popcnt() { return false; }
#define bit_keys_popcnt bit_keys_generic
#define word_counts_popcnt word_counts_generic
#endif
#undef SPATTN_ROW_BITS_FUNCTIONS
int64_t bit_keys(const uint64_t* b, int64_t n) { return have_popcnt() ? bit_keys_popcnt(b, n) : bit_keys_generic(b, n); }
int64_t word_counts(const uint64_t* b, int64_t n, int64_t* count, int64_t* touched, size_t& nt) {
  return have_popcnt() ? word_counts_popcnt(b, n, count, touched, nt) : word_counts_generic(b, n, count, touched, nt);
}

// Sets bits [a, b) of a row of mask words.
inline void set_bits(uint64_t* m, int64_t a, int64_t b) {
  for (int64_t c = a; c < b;) {
    const int64_t w = c / 64, e = std::min(b, (w + 1) * 64);
    const int64_t n = e - c;
    m[w] |= n == 64 ? ~uint64_t(0) : ((uint64_t(1) << n) - 1) << (c % 64);
    c = e;
  }
}

// Per query tile scratch: counts per touched key tile.
struct TileScratch {
  std::vector<int64_t> count;   // [k_tiles]
  std::vector<int32_t> slot;    // [k_tiles] partial slot or -1
  std::vector<int64_t> tbuf;    // [k_tiles + 1]: the touched tiles in tbuf[0, nt), in order of first touch
  size_t nt = 0;
  const bool shortcuts = !general_paths_only();  // add_run's for strided runs, count_runs_unordered's
  std::vector<int64_t> diff;  // count_runs_unordered's, [k_tiles + 1], zero between calls
  explicit TileScratch(int64_t k_tiles)
      : count(size_t(k_tiles), 0), slot(size_t(k_tiles), -1), tbuf(size_t(k_tiles) + 1) {}
  std::span<int64_t> touched() { return {tbuf.data(), nt}; }
  // Counts the kept scores of each key tile that the query tile's runs touch (touched(): those tiles).
  void count_runs(const std::vector<RowRuns>& rows, int64_t bn) {
    nt = 0;
    for (const RowRuns& runs : rows) add_runs(runs, bn);
  }
  // count_runs, one row at a time: adds to the counts and touched tiles so far (mult: as add_run's).
  void add_runs(const std::vector<Run>& runs, int64_t bn, int64_t mult = 1) {
    const int sh = bn == 64 ? 6 : 7;
    for (const Run& r : runs) add_run(r, sh, bn, mult);
  }
  // Runs within one key tile (a scattered row's, most of a band's) take no branch on whether the tile is new
  // (random rows' ~800 runs made it a coin toss).
  // mult: the run stands for that many rows' (rows alike, BoundPattern::row_block).
  void add_run(const Run& r, int sh, int64_t bn, int64_t mult = 1) {
    int64_t* cnt = count.data();
    int64_t* t = tbuf.data();
    if ((r.stride == 1 || r.count == 1) && r.count > 0 && r.start >> sh == (r.start + r.count - 1) >> sh) {
      const int64_t kt = r.start >> sh, old = cnt[kt];
      cnt[kt] = old + r.count * mult;
      t[nt] = kt;
      nt += old == 0;
    } else if (shortcuts && r.stride > 1 && r.stride < bn && r.count > 1) {
      // A strided run (dilated rows unpermuted) counted tile by tile: its keys in tile kt are those of index
      // ceil((k0 - start) / stride) ... floor((k0 + bn - 1 - start) / stride), not walked one by one; the first is
      // the tile before's last plus one (one division a tile, not two: dilated(256, 2)'s unpermuted candidates).
      const int64_t last = r.last();
      int64_t i0 = 0;
      for (int64_t kt = r.start >> sh, k0 = kt << sh; k0 <= last; ++kt, k0 += bn) {
        const int64_t i1 = (std::min(last, k0 + bn - 1) - r.start) / r.stride;
        if (i1 >= i0) {
          if (cnt[kt] == 0) t[nt++] = kt;
          cnt[kt] += (i1 - i0 + 1) * mult;
        }
        i0 = std::max(i0, i1 + 1);
      }
    } else {
      for_each_tile_span(r, int(bn), [&](int64_t kt, int64_t a, int64_t b) {
        if (cnt[kt] == 0) t[nt++] = kt;
        cnt[kt] += (b - a) * mult;
      });
    }
  }
  // count_runs for the builder, which sorts the touched tiles after: an interval over three key tiles or more
  // counts its two end tiles and adds bn to the ones between through a difference array, swept once per query
  // tile (a causal row spans up to Lk / bn tiles: rows x tiles steps before). same[r]: row r is row r - 1 again
  // (tile_rows), counted with it.
  void count_runs_unordered(const std::vector<RowRuns>& rows, int64_t bn, const std::vector<char>& same) {
    if (!shortcuts) return count_runs(rows, bn);
    nt = 0;
    if (diff.empty()) diff.assign(count.size() + 1, 0);
    const int sh = bn == 64 ? 6 : 7;
    int64_t lo = INT64_MAX, hi = -1;  // the tiles between some interval's ends
    for (size_t i = 0; i < rows.size(); ++i) {
      if (same[i]) continue;
      int64_t mult = 1;
      while (i + size_t(mult) < rows.size() && same[i + size_t(mult)]) ++mult;
      for (const Run& r : rows[i]) {
        const int64_t a = r.start >> sh, b = (r.start + r.count - 1) >> sh;
        if (r.stride != 1 || b - a < 2) {
          add_run(r, sh, bn, mult);
          continue;
        }
        add_run({r.start, 1, ((a + 1) << sh) - r.start}, sh, bn, mult);
        add_run({b << sh, 1, r.start + r.count - (b << sh)}, sh, bn, mult);
        diff[size_t(a + 1)] += bn * mult;
        diff[size_t(b)] -= bn * mult;
        lo = std::min(lo, a + 1), hi = std::max(hi, b - 1);
      }
    }
    for (int64_t kt = lo, run = 0; kt <= hi + 1; ++kt) {
      run += diff[size_t(kt)];
      diff[size_t(kt)] = 0;
      if (kt > hi || run == 0) continue;
      if (count[size_t(kt)] == 0) tbuf[nt++] = kt;
      count[size_t(kt)] += run;
    }
  }
  // Every valid (q, k) of key tile kt is kept.
  bool full(int64_t kt, int64_t valid_rows, const Space& sp) const {
    return count[size_t(kt)] == valid_rows * sp.bn && sp.k_whole(kt);
  }
};

// Worker threads for building a plan: about 2^15 row x key units a thread at least (a scattered pattern's row
// costs O(Lk)).
int64_t plan_threads(int64_t q_tiles, int64_t k_len) {
  const int64_t by_size = std::max<int64_t>(1, q_tiles * std::max<int64_t>(k_len, 64) / (int64_t(1) << 15));
  return std::max<int64_t>(1, std::min({int64_t(plan_thread_cap()), q_tiles, by_size}));
}

// Collects the plan-space runs of every row of query tile qt into rows[0, bm) (rows past the end: none);
// returns the number of valid rows. nruns: the runs of them all. same (where given, unpermuted and unmapped): rows
// alike by the spec (BoundPattern::row_block) are marked 1 and left empty, not drawn, counted or copied: their runs
// are those of the last row before them marked 0 (the copies were a tenth of sparse_fixed's forward plan).
int64_t tile_rows(const BoundPattern& pat, const Space& sp, int64_t qt, RowRuns& tmp, std::vector<RowRuns>& rows,
                  int64_t& nruns, int64_t& nnz, std::vector<char>* same = nullptr) {
  rows.resize(size_t(sp.bm));
  nruns = 0;
  int64_t valid = 0, row_nnz = 0, src_runs = 0, bend = -1;  // bend: the end of the last drawn row's block
  const int64_t block = same && sp.d == 1 && !sp.m && !general_paths_only() ? pat.row_block() : 1;
  if (same) same->assign(size_t(sp.bm), 0);
  for (int r = 0; r < sp.bm; ++r) {
    RowRuns& out = rows[size_t(r)];
    const int64_t q = sp.q_token(qt * sp.bm + r);
    if (q >= sp.lq) {
      out.clear();
      continue;
    }
    ++valid;
    if (q < bend) {  // (r > 0: bend is set at a row drawn; no division a row, two were a tenth of fixed's build)
      out.clear();
      nnz += row_nnz;
      nruns += src_runs;
      (*same)[size_t(r)] = 1;
      continue;
    } else if (sp.d == 1 && !sp.m) {
      pat.row(q, out);
      nnz += row_nnz = count_keys(out);
      if (block > 1) bend = (q / block + 1) * block;
    } else {
      pat.row(q, tmp);
      nnz += count_keys(tmp);
      out.clear();
      for (const Run& x : tmp) sp.map_run(x, out);
    }
    nruns += src_runs = int64_t(out.size());
  }
  return valid;
}

// Tries to describe a partial tile's mask as a band lo <= kp - qp <= hi (restricted to the tile's valid
// keys). Rows whose token is out of range are don't-cares.
// scratch: 2 * bm entries, reused between calls.
bool detect_band(const uint64_t* mask, const Space& sp, int64_t qt, int64_t kt, int64_t kvalid, int64_t& lo_out,
                 int64_t& hi_out, std::vector<int64_t>& scratch) {
  const int words = sp.bn / 64;
  const int64_t q0 = qt * sp.bm, k0 = kt * sp.bn;
  int64_t lo = kNegInf, hi = kPosInf;
  bool have_lo = false, have_hi = false;
  scratch.resize(2 * size_t(sp.bm));
  int64_t* a = scratch.data();
  int64_t* b = a + sp.bm;
  // Unmapped plan space (every caller's): the tile's rows lie in one residue group g, at tokens g + (j0 + r) d, so
  // row r is valid iff that is below Lq, without Space::q_token's division a row (twice a row, two partial tiles a
  // query tile: a quarter of dilated(256, 2)'s build with the popcounts below).
  const int64_t g = sp.d == 1 ? 0 : q0 / sp.q_group, j0 = q0 - g * sp.q_group;
  auto valid = [&](int r) { return g + (j0 + r) * sp.d < sp.lq; };
  for (int r = 0; r < sp.bm; ++r) {
    int64_t first = -1, last = -1;
    for (int w = 0; w < words; ++w) {
      const uint64_t x = mask[size_t(r) * words + w];
      if (!x) continue;
      if (first < 0) first = w * 64 + __builtin_ctzll(x);
      last = w * 64 + 63 - __builtin_clzll(x);
    }
    if (!valid(r)) continue;
    if (first < 0) {
      a[size_t(r)] = b[size_t(r)] = 0;
      continue;
    }
    // A hole: some bit of [first, last] unset (word by word against that range's bits: the library's baseline
    // x86-64 build has no popcnt instruction, __builtin_popcountll is a libgcc call).
    for (int w = 0; w < words; ++w) {
      const int64_t lo = std::max<int64_t>(first, w * 64) - w * 64, hi = std::min<int64_t>(last, w * 64 + 63) - w * 64;
      const uint64_t want = lo > hi ? 0 : (~uint64_t(0) >> (63 - (hi - lo))) << lo;
      if (mask[size_t(r) * words + w] != want) return false;  // not a band
    }
    a[size_t(r)] = first;
    b[size_t(r)] = last + 1;
    const int64_t p = q0 + r;
    if (first > 0) {
      const int64_t v = k0 + first - p;
      if (have_lo && v != lo) return false;
      lo = v, have_lo = true;
    }
    if (last + 1 < kvalid) {
      const int64_t v = k0 + last - p;
      if (have_hi && v != hi) return false;
      hi = v, have_hi = true;
    }
  }
  for (int r = 0; r < sp.bm; ++r) {
    if (!valid(r)) continue;
    const int64_t p = q0 + r;
    int64_t ea = std::max<int64_t>(0, p + lo - k0), eb = std::min<int64_t>(kvalid, p + hi - k0 + 1);
    if (eb <= ea) ea = eb = 0;
    if (ea != a[size_t(r)] || eb != b[size_t(r)]) return false;
  }
  lo_out = lo;
  hi_out = hi;
  return true;
}

}  // namespace

std::string BlockPlan::describe() const {
  std::ostringstream s;
  s << "block " << block_m << "x" << block_n << ", perm_d " << perm_d << ", " << q_tiles << "x" << k_tiles
    << " tiles, " << nentries() << " visited (" << n_full << " full, " << n_band << " band, " << n_bitmask
    << " bitmask), nnz " << nnz << ", waste " << waste() << " (kept " << kept_fraction() << " of visited scores)";
  if (key_strips())
    s << ", tile map: query tiles " << q_tiling.describe() << ", key tiles strips of each query box's window union ("
      << strips.size() << " strips, " << q_map.size() - size_t(q_len)
      << " query padding positions; cp.async and mma.sync 64x64 kernels only)";
  else if (mapped())
    s << ", tile map: query tiles " << q_tiling.describe() << ", key tiles " << k_tiling.box.str(k_tiling.naxes)
      << " (" << q_map.size() - size_t(q_len) << " + " << k_map.size() - size_t(k_len)
      << " padding positions; cp.async and mma.sync kernels only: the TMA and band kernels load affine rows)";
  if (drawn.r > 0) s << ", bitmasks drawn on the device (random(" << drawn.r << ", seed=" << drawn.seed << "): every tile)";
  if (!grid_windows.empty()) s << ", bitmasks computed on the device from the grid's windows";
  if (band) {
    s << ", band rows [" << band_lo << ", " << band_hi << "]" << (band_shifted ? " shifted inside the keys at the ends" : "");
    if (band_prefix > 0) s << " with key prefix 0:" << band_prefix;
    if (block_n == 128 && (block_m == 192 || block_m == 128)) {  // what the band kernel visits: each 64-row slab
                                                                  // its own 64-key chunks (and the prefix's)
      double area = 0;
      const int64_t pc = band_prefix_chunks();
      for (int64_t qs = 0; qs < q_len; qs += 64) {
        const int64_t a = std::max(band_first(qs), 64 * pc), z = band_last(std::min(qs + 63, q_len - 1));
        area += 64.0 * 64.0 * double(pc + (a <= z ? z / 64 - a / 64 + 1 : 0));
      }
      s << " (the band kernel's 64-row slabs over 64-key chunks keep " << (area > 0 ? double(nnz) / area : 0.0)
        << " of theirs)";
    }
  }
  s << ", built in " << build_ms << " ms";
  if (choice_ms > 0) s << " (" << choice_ms << " ms choosing the tile shape)";
  if (!choice.empty()) {
    s << "; chosen by predicted cost per kept score among";
    for (const PricedShape& c : choice)
      s << (&c == &choice[0] ? " " : ", ") << c.name << " " << c.cost << " (kept " << c.kept << ")";
  }
  return s.str();
}

namespace {
// Band rows' key tiles of the query rows q0 .. q1 (lo <= 0 <= hi: the rows keeping keys keep one interval of key tiles
// together): [first, last] (first > last: none), and whether key tile [k0, k0 + bn) is full (every row keeps all of
// it). Shared by the builder and the closed-form estimate (estimate_groups).
struct BandTiles {
  int64_t q0, q1, lo, hi, lk, bn;
  int64_t first_tile() const { return std::max<int64_t>(0, std::max(q0, -hi) + lo) / bn; }
  int64_t last_tile() const {
    const int64_t pa = std::max(q0, -hi), pb = std::min(q1, lk - 1 - lo);  // rows keeping keys
    return pa > pb ? -1 : std::min(lk - 1, pb + hi) / bn;
  }
  bool full(int64_t k0) const {
    return lk - k0 >= bn && std::max<int64_t>(0, q1 + lo) <= k0 && std::min(lk - 1, q0 + hi) >= k0 + bn - 1;
  }
};

// Where the rows and keys of a Space sit in a plan (a residue group's, build_group_band_entries): query tile qt of the
// space is the plan's qt + TileOffsets::qt, key tile kt its kt + TileOffsets::kt, and a band entry's bounds move by
// shift (its unbound sides stay unbound).
struct TileOffsets {
  int64_t qt = 0, kt = 0, shift = 0;
};

// A partial tile's entry from its rows' bits (block_m x block_n, kvalid valid keys), as the walk makes it: a band where
// detect_band finds one (its bounds moved by at.shift), else a bitmask; counted. The bits are the plan's last bitmask,
// appended by the caller (written in place, not copied in: the copies were a tenth of sparse_fixed's build), and
// dropped for a band.
TileEntry partial_entry(BlockPlan& plan, const Space& sp, int64_t qt, int64_t kt, int64_t kvalid, TileOffsets at,
                        std::vector<int64_t>& scratch) {
  const size_t words = size_t(sp.bm) * size_t(sp.bn) / 64, index = plan.masks.size() / words - 1;
  int64_t lo, hi;
  if (detect_band(plan.masks.data() + index * words, sp, qt, kt, kvalid, lo, hi, scratch)) {
    plan.masks.resize(index * words);
    ++plan.n_band;
    return {int32_t(kt + at.kt), kBand, int32_t(lo + at.shift), int32_t(hi + at.shift)};
  }
  ++plan.n_bitmask;
  return {int32_t(kt + at.kt), int32_t(index), 0, 0};
}

// The entries of band rows (Analysis::band: row q keeps [max(0, q + lo), min(Lk - 1, q + hi)]) tile by tile in closed
// form, O(entries + bits of the few bitmask tiles): what the row walk and detect_band give them. A query tile's rows
// keep one interval of key tiles together (each row's interval overlaps the next row's); a key tile is full where
// the last row starts at or before it and the first row ends at or past it (both ends grow with the row); else a
// band entry, whose lo (hi) binds, as detect_band finds it, where some row keeping keys in the tile starts (ends)
// inside it, or a bitmask where detect_band's band does not hold (below).
//
// With a key prefix (Analysis::sinks: every row also keeps [0, prefix)), the key tiles below the prefix's end are
// built from their rows' bits (O(rows) each: a few a query tile) and priced as the walk prices them (full, else
// detect_band, else a bitmask); the tiles past it hold band keys only. at: where sp's tiles sit in the plan.
void build_band_entries(BlockPlan& plan, const Space& sp, int64_t lo, int64_t hi, int64_t prefix, TileOffsets at = {}) {
  const int64_t lq = sp.lq, lk = sp.lk, bm = sp.bm, bn = sp.bn, words = bm * bn / 64;
  std::vector<int64_t> band_scratch;
  const int64_t prefix_tiles = (std::min(prefix, lk) + bn - 1) / bn;
  // Query tiles whose bands all miss a prefix tile have the same rows there (the prefix's keys): the first one's
  // full or bitmask outcome (which, unlike a band entry's bounds, does not depend on the rows' positions) is reused
  // for the others of as many valid rows, a bitmask by its index (one mask for every such tile: longformer's 85
  // were 261 KB built, copied and uploaded).
  struct Reuse {
    int64_t rows = -1;  // valid rows of the tile it was made for (-1: none)
    bool full = false;
    int32_t mask = -1;  // its bitmask's index
  };
  std::vector<Reuse> reuse(static_cast<size_t>(prefix_tiles));
  // At most the prefix's tiles and two band tiles a query tile are bitmasks: reserved at once (pages untouched cost
  // nothing), not grown by doubling (each growth a copy into fresh pages: page faults were a third of longformer's
  // tiles part).
  plan.masks.reserve(plan.masks.size() + size_t((prefix_tiles + 2) * sp.q_tiles * words));
  for (int64_t qt = 0; qt < sp.q_tiles; ++qt) {
    plan.row_offsets[size_t(qt + at.qt)] = int64_t(plan.entries.size());
    const int64_t q0 = qt * bm, q1 = std::min(lq, q0 + bm) - 1;  // the tile's rows
    for (int64_t kt = 0; kt < prefix_tiles; ++kt) {  // the prefix's tiles, from their rows' bits
      const int64_t k0 = kt * bn, kvalid = std::min(bn, lk - k0);
      const bool prefix_only = q0 + lo > k0 + kvalid - 1 || q1 + hi < k0;  // no row's band keys in this tile
      Reuse& ru = reuse[size_t(kt)];
      if (prefix_only && ru.rows == q1 - q0 + 1) {
        TileEntry e{int32_t(kt + at.kt), kFull, 0, 0};
        if (ru.full) {
          ++plan.n_full;
        } else {
          e.mask = ru.mask;
          ++plan.n_bitmask;
        }
        plan.entries.push_back(e);
        continue;
      }
      const size_t at_mask = plan.masks.size();  // the tile's bits, appended (partial_entry)
      plan.masks.resize(at_mask + size_t(words), 0);
      int64_t count = 0;
      for (int64_t p = q0; p <= q1; ++p) {
        uint64_t* m = plan.masks.data() + at_mask + (p - q0) * (bn / 64);
        const int64_t a = std::max<int64_t>(0, p + lo - k0), b = std::min(kvalid - 1, p + hi - k0);  // band keys here
        const int64_t pe = std::min(prefix - k0, kvalid);  // prefix keys here: [0, pe)
        set_bits(m, 0, pe);
        if (a <= b && p + lo <= lk - 1 && p + hi >= 0) set_bits(m, a, b + 1);
        count += bit_keys(m, bn / 64);
      }
      TileEntry e{int32_t(kt + at.kt), kFull, 0, 0};
      if (kvalid == bn && count == (q1 - q0 + 1) * bn) {
        plan.masks.resize(at_mask);
        ++plan.n_full;
      } else {
        e = partial_entry(plan, sp, qt, kt, kvalid, at, band_scratch);
      }
      if (prefix_only && e.mask != kBand) ru = {q1 - q0 + 1, e.mask == kFull, e.mask};  // (a band's bounds are the rows')
      plan.entries.push_back(e);
    }
    const BandTiles bt{q0, q1, lo, hi, lk, bn};
    for (int64_t kt = std::max(bt.first_tile(), prefix_tiles), last = bt.last_tile(); kt <= last; ++kt) {
      const int64_t k0 = kt * bn, kvalid = std::min(bn, lk - k0);
      TileEntry e{int32_t(kt + at.kt), kFull, 0, 0};
      if (bt.full(k0)) {
        ++plan.n_full;
      } else {
        const int64_t ta = std::max(q0, k0 - hi), tb = std::min(q1, k0 + kvalid - 1 - lo);  // rows keeping keys here
        const bool has_lo = tb > k0 - lo, has_hi = ta < k0 + kvalid - 1 - hi;
        // detect_band's band predicts every row of the tile; an unbound side (no row keeping keys here starts or
        // ends inside it) mispredicts the rows that end before the tile (starting after it): a bitmask then.
        if ((q0 < k0 - hi && !has_hi) || (q1 > k0 + kvalid - 1 - lo && !has_lo)) {
          e.mask = int32_t(plan.masks.size() / size_t(words));
          plan.masks.resize(plan.masks.size() + size_t(words), 0);
          uint64_t* m = plan.masks.data() + plan.masks.size() - size_t(words);
          for (int64_t p = ta; p <= tb; ++p)
            set_bits(m + (p - q0) * (bn / 64), std::max<int64_t>(0, p + lo - k0), std::min(kvalid - 1, p + hi - k0) + 1);
          ++plan.n_bitmask;
        } else {
          e.mask = kBand;
          e.lo = int32_t(has_lo ? lo + at.shift : kNegInf);
          e.hi = int32_t(has_hi ? hi + at.shift : kPosInf);
          ++plan.n_band;
        }
      }
      plan.entries.push_back(e);
    }
  }
  plan.row_offsets[size_t(sp.q_tiles + at.qt)] = int64_t(plan.entries.size());
}

// The entries of band rows inside residue groups (Analysis::groups; plan space of perm_d = d: group g's rows and keys
// at g q_group + j and g k_group + j'), group by group as band rows of the group's lengths (build_band_entries in the
// group's own positions, placed at the group's tiles: kp - qp of plan positions is the group's plus g (k_group -
// q_group)), what the walk and detect_band give the group's tiles; the group's padding query tiles visit nothing.
void build_group_band_entries(BlockPlan& plan, const Space& sp, int64_t lo, int64_t hi) {
  const int64_t d = sp.d, q_per = sp.q_group / sp.bm, k_per = sp.k_group / sp.bn;  // tiles a group
  for (int64_t g = 0; g < d; ++g) {
    const int64_t nq = residue_group_len(sp.lq, g, d), nk = residue_group_len(sp.lk, g, d);
    const Space gs(nq, nk, sp.bm, sp.bn, 1);
    int64_t qt = 0;
    if (nq > 0 && nk > 0) {
      build_band_entries(plan, gs, lo, hi, 0, {g * q_per, g * k_per, g * (sp.k_group - sp.q_group)});
      qt = gs.q_tiles;
    }
    for (; qt < q_per; ++qt) plan.row_offsets[size_t(g * q_per + qt)] = int64_t(plan.entries.size());
  }
  plan.row_offsets[size_t(sp.q_tiles)] = int64_t(plan.entries.size());
}

// The key tiles (bn keys) that the rows q0 .. q1 of rows alike by blocks (Analysis::blocks) touch, ascending, each full
// where every row keeps all its keys, as the walk's counts find them (tile()): the rows are those of a few block rows,
// so the tiles are those block rows' merged, full where full in each; a block row's tiles are its spans', full where
// one span holds the tile whole (spans are apart: a tile a row keeps whole lies in one span). O(the block rows' spans'
// tiles). Shared by the builder and the closed-form estimate (estimate_blocks).
struct BlockTiles {
  struct Tile {
    int32_t kt;
    bool full;
  };
  const BlockRows& br;
  int sh;  // bn = 1 << sh
  std::vector<Tile> merged, row, scratch;
  BlockTiles(const BlockRows& rows, int bn) : br(rows), sh(bn == 64 ? 6 : 7) {}
  // Key tiles of block row i's spans, at most (a tile two spans reach counted twice).
  int64_t most(int64_t i) const {
    int64_t n = 0;
    for (int64_t s = br.offsets[size_t(i)]; s < br.offsets[size_t(i) + 1]; ++s)
      n += ((br.spans[size_t(s)].second - 1) >> sh) - (br.spans[size_t(s)].first >> sh) + 1;
    return n;
  }
  void row_tiles(int64_t i, std::vector<Tile>& out) const {
    out.clear();
    for (int64_t s = br.offsets[size_t(i)]; s < br.offsets[size_t(i) + 1]; ++s) {
      const auto [a, e] = br.spans[size_t(s)];
      for (int64_t kt = a >> sh; (kt << sh) < e; ++kt) {
        if (!out.empty() && out.back().kt == kt) continue;  // (a tile the span before ended in: whole in neither)
        out.push_back({int32_t(kt), (kt << sh) >= a && ((kt + 1) << sh) <= e});
      }
    }
  }
  std::span<const Tile> tile(int64_t q0, int64_t q1) {
    const int64_t i0 = q0 / br.block, i1 = q1 / br.block;
    row_tiles(i0, merged);
    for (int64_t i = i0 + 1; i <= i1; ++i) {
      row_tiles(i, row);
      scratch.clear();
      size_t x = 0, y = 0;
      while (x < merged.size() || y < row.size()) {
        if (y == row.size() || (x < merged.size() && merged[x].kt < row[y].kt)) {
          scratch.push_back({merged[x++].kt, false});
        } else if (x == merged.size() || row[y].kt < merged[x].kt) {
          scratch.push_back({row[y++].kt, false});
        } else {
          scratch.push_back({row[y].kt, merged[x].full && row[y].full});
          ++x, ++y;
        }
      }
      merged.swap(scratch);
    }
    return merged;
  }
};

// The entries of rows alike by blocks (Analysis::blocks) query tile by query tile from their block rows' key tiles
// (BlockTiles): a partial tile's bitmask is its block rows' bits in the tile, each set in its first row and copied to
// its others, and is run through detect_band as the walk's are (a tile of one valid row can make a band). A query tile
// of bm valid rows inside the block row of the one before, which had bm too, has its rows and so its entries: they
// are copied, its bitmasks shared (in two rows alike or more detect_band binds neither side of a band, whose bounds
// would be the rows'). O(entries + partial tiles' bits).
void build_block_entries(BlockPlan& plan, const Space& sp, const BlockRows& br) {
  const int64_t b = br.block, row_words = sp.bn / 64, words = sp.bm * row_words;
  BlockTiles bt(br, sp.bn);
  // Entries at most: each block row's tiles, a query tile it is in; their bitmasks likewise (both reserved, not grown
  // by doubling: each growth a copy into fresh pages, most of sparse_fixed's columns part).
  int64_t most = 0;
  for (int64_t i = 0; i < br.block_rows(); ++i)
    most += bt.most(i) * ((std::min(sp.lq, (i + 1) * b) - 1) / sp.bm - i * b / sp.bm + 1);
  plan.entries.reserve(size_t(most));
  plan.masks.reserve(size_t(most * words));
  std::vector<int64_t> band_scratch, cursor;
  for (int64_t qt = 0; qt < sp.q_tiles; ++qt) {
    plan.row_offsets[size_t(qt)] = int64_t(plan.entries.size());
    const int64_t q0 = qt * sp.bm, q1 = std::min(sp.lq, q0 + sp.bm) - 1, i0 = q0 / b, i1 = q1 / b;
    if (qt > 0 && i0 == i1 && (q0 - sp.bm) / b == i0 && q1 - q0 + 1 == sp.bm) {  // (the tile before: bm rows)
      for (int64_t x = plan.row_offsets[size_t(qt) - 1], e = plan.row_offsets[size_t(qt)]; x < e; ++x) {
        const TileEntry t = plan.entries[size_t(x)];
        ++(t.mask == kFull ? plan.n_full : t.mask == kBand ? plan.n_band : plan.n_bitmask);
        plan.entries.push_back(t);
      }
      continue;
    }
    cursor.assign(br.offsets.begin() + i0, br.offsets.begin() + i1 + 1);  // per block row: its first span not behind
    for (const BlockTiles::Tile& t : bt.tile(q0, q1)) {
      const int64_t k0 = int64_t(t.kt) * sp.bn;
      if (t.full) {
        ++plan.n_full;
        plan.entries.push_back({t.kt, kFull, 0, 0});
        continue;
      }
      const size_t at_mask = plan.masks.size();  // the tile's bits, appended (partial_entry)
      plan.masks.resize(at_mask + size_t(words));  // (uninitialised: every word is written below)
      uint64_t* pm = plan.masks.data() + at_mask;
      for (int64_t i = i0; i <= i1; ++i) {
        const int64_t r0 = std::max(q0, i * b) - q0, r1 = std::min(q1, i * b + b - 1) - q0;  // its rows in the tile
        uint64_t row[2] = {0, 0};  // their bits (row_words of them)
        int64_t& s = cursor[size_t(i - i0)];
        while (s < br.offsets[size_t(i) + 1] && br.spans[size_t(s)].second <= k0) ++s;
        for (int64_t x = s; x < br.offsets[size_t(i) + 1] && br.spans[size_t(x)].first < k0 + sp.bn; ++x) {
          const auto [a, e] = br.spans[size_t(x)];
          set_bits(row, std::max<int64_t>(a, k0) - k0, std::min<int64_t>(e, k0 + sp.bn) - k0);
        }
        // Stored in each of its rows (one or two words: a memmove call a row of 16 bytes, copying the first, was a
        // third of the build of sparse_fixed's columns part).
        for (int64_t r = r0; r <= r1; ++r)
          pm[r * row_words] = row[0], pm[r * row_words + row_words - 1] = row[row_words - 1];
      }
      std::fill(pm + (q1 - q0 + 1) * row_words, pm + words, 0);  // rows past Lq
      plan.entries.push_back(partial_entry(plan, sp, qt, t.kt, sp.k_valid(t.kt), {}, band_scratch));
    }
  }
  plan.row_offsets[size_t(sp.q_tiles)] = int64_t(plan.entries.size());
}

void build_walked(BlockPlan& plan, const BoundPattern& pat, const Space& sp);

// Every tile a bitmask entry, in order (BlockPlan::drawn): the device draws the bits.
void build_drawn_entries(BlockPlan& plan, const Space& sp, const BoundPattern::RandomSpec& rs) {
  const int64_t n = sp.q_tiles * sp.k_tiles;
  if (n >= int64_t(INT32_MAX)) throw Error("block plan: too many bitmasks");
  plan.entries.resize(size_t(n));
  for (int64_t qt = 0, i = 0; qt < sp.q_tiles; ++qt) {
    plan.row_offsets[size_t(qt)] = i;
    for (int64_t kt = 0; kt < sp.k_tiles; ++kt, ++i) plan.entries[size_t(i)] = {int32_t(kt), int32_t(i), 0, 0};
  }
  plan.row_offsets[size_t(sp.q_tiles)] = n;
  plan.n_bitmask = n;
  plan.nnz = sp.lq * rs.r;
  plan.drawn = {rs.r, rs.seed};
}

// The launch order of a plan's query tiles: most entries first (stable), so the longest work items start earliest.
// Already in order where no tile has more entries than the one before (every tile alike: block_diag, sparse_fixed's
// columns): no sort (its buffer and passes were a twelfth of those plans' build, caches cold after the backward's
// plan).
void order_by_entries(BlockPlan& plan) {
  plan.order.resize(size_t(plan.q_tiles));
  std::iota(plan.order.begin(), plan.order.end(), 0);
  const std::vector<int64_t>& at = plan.row_offsets;
  bool sorted = true;
  for (size_t t = 1; t < size_t(plan.q_tiles) && sorted; ++t) sorted = at[t + 1] - at[t] <= at[t] - at[t - 1];
  if (!sorted)
    std::stable_sort(plan.order.begin(), plan.order.end(),
                     [&](int32_t a, int32_t b) { return at[size_t(a) + 1] - at[size_t(a)] > at[size_t(b) + 1] - at[size_t(b)]; });
}

// analysis: analyze(pat) where the caller has it already (its band rows), else computed here.
// maps: a mapped plan space (then d is 1 and bm, bn the boxes' volumes).
// drawn: the bitmasks left to the device (BlockPlan::drawn; drawn_masks_apply holds, d is 1, no maps).
BlockPlan build_plan(const BoundPattern& pat, int bm, int bn, int d, const Analysis* analysis, const Maps* maps = nullptr,
                     bool drawn = false) {
  const auto t0 = std::chrono::steady_clock::now();
  if ((bm != 64 && bm != 128 && bm != 192) || (bn != 64 && bn != 128))  // for_each_tile_span shifts by bn
    throw Error("block plan: tiles must be 64, 128 or 192 query rows by 64 or 128 keys, got " + std::to_string(bm) + "x" +
                std::to_string(bn));
  if (d < 1 || d > 64) throw Error("block plan: perm_d must be in [1, 64], got " + std::to_string(d));
  const Space sp = maps ? Space(pat.q_len(), pat.k_len(), bm, bn, *maps) : Space(pat.q_len(), pat.k_len(), bm, bn, d);
  if (sp.q_tiles >= INT32_MAX || sp.k_tiles >= INT32_MAX) throw Error("block plan: too many tiles");

  BlockPlan plan;
  plan.block_m = bm;
  plan.block_n = bn;
  plan.q_len = sp.lq;
  plan.k_len = sp.lk;
  plan.perm_d = d;
  plan.q_group = sp.q_group;
  plan.k_group = sp.k_group;
  plan.q_tiles = sp.q_tiles;
  plan.k_tiles = sp.k_tiles;
  plan.row_offsets.assign(size_t(sp.q_tiles) + 1, 0);
  if (maps) {
    plan.q_map = maps->qmap;
    plan.k_map = maps->kmap;
    plan.q_tiling = maps->q;
    plan.k_tiling = maps->k;
  }
  if (sp.lq == 0 || sp.lk == 0) {  // an empty problem: its query tiles (none where Lq = 0) visit no key tile
    plan.order.resize(size_t(sp.q_tiles));
    std::iota(plan.order.begin(), plan.order.end(), 0);
    plan.build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return plan;
  }
  Analysis own;
  if (d == 1 && !maps && !analysis) own = analyze(pat), analysis = &own;
  if (drawn) {
    build_drawn_entries(plan, sp, *pat.random_spec());
  } else if (d == 1 && !maps && (analysis->band.ok || analysis->sinks.ok) && !general_paths_only()) {
    const BandRows& br = analysis->band.ok ? analysis->band : analysis->sinks;
    build_band_entries(plan, sp, br.lo, br.hi, analysis->band.ok ? 0 : analysis->prefix);
    plan.nnz = analysis->nnz;
  } else if (d > 1 && !maps && analysis && analysis->groups.ok && d == analysis->residue && !general_paths_only()) {
    build_group_band_entries(plan, sp, analysis->groups.lo, analysis->groups.hi);
    plan.nnz = analysis->nnz;
  } else if (d == 1 && !maps && analysis->blocks && !general_paths_only()) {
    build_block_entries(plan, sp, *analysis->blocks);
    plan.nnz = analysis->nnz;
  } else {
    build_walked(plan, pat, sp);
  }
  order_by_entries(plan);
  if (d == 1 && !maps) {
    const BandRows& br = analysis->band.ok ? analysis->band : analysis->window.ok ? analysis->window : analysis->sinks;
    plan.band = br.ok;
    plan.band_shifted = !analysis->band.ok && analysis->window.ok;
    plan.band_lo = br.lo;
    plan.band_hi = br.hi;
    plan.band_prefix = !analysis->band.ok && !analysis->window.ok && br.ok ? analysis->prefix : 0;
  }
  plan.build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return plan;
}

// The entries and bitmasks of any pattern from its rows (BoundPattern::row), query tiles on worker threads.
void build_walked(BlockPlan& plan, const BoundPattern& pat, const Space& sp) {
  const int bm = sp.bm, bn = sp.bn;

  const int words = bm * bn / 64, row_words = bn / 64;
  // Rows as bits where the pattern draws them so (BoundPattern::row_bits): lkw words of keys, kw with the last key
  // tile's padding.
  const int64_t lkw = (sp.lk + 63) / 64, kw = sp.k_tiles * row_words;
  bool bits_ok = sp.d == 1 && !sp.m && !general_paths_only() && sp.lq > 0;
  if (bits_ok) {
    std::vector<uint64_t> probe(static_cast<size_t>(lkw));
    bits_ok = pat.row_bits(0, probe.data());
  }
  // Query tiles are independent: contiguous ranges of them are built on worker threads (a random pattern's
  // row costs O(Lk) hashes: 16384 rows took seconds on one thread), then concatenated in order, so the plan
  // is the same for any thread count.
  struct Part {
    std::vector<int64_t> offsets;  // entries before each query tile, within this part
    std::vector<TileEntry> entries;
    MaskWords masks;  // (huge pages where large)
    int64_t nnz = 0, n_full = 0, n_band = 0, n_bitmask = 0;
  };
  // out: the part; room: query tiles whose bitmasks `out` will hold (its own: reserved at the rate of its first
  // tiles).
  //
  // Bits are set in scratch masks that lie `stride` words apart: at their own size (1 KiB for 64x128) a row's
  // bits, one per partial key tile, fell into a few cache sets (most of a random plan's mask time was L1
  // misses).
  auto build_range = [&](int64_t qt_begin, int64_t qt_end, int64_t room, Part& out) {
    TileScratch scr(sp.k_tiles);
    RowRuns tmp;
    std::vector<RowRuns> rows;
    std::vector<char> same;  // tile_rows': rows alike
    std::vector<uint64_t> bitrows;  // the tile's rows as bits, kw words a row (bits_ok)
    std::vector<int64_t> band_scratch;
    std::vector<int64_t> partial_kts;  // the query tile's partial key tiles, ascending (their slots' order)
    const int64_t stride = words + 8;
    std::vector<uint64_t> pmask;   // partial masks of the current query tile, by slot (runs counted first)
    std::vector<uint64_t> blocks;  // [k_tiles * stride], by key tile (scattered query tiles)
    std::vector<uint64_t> rowbits;  // [k_tiles * row_words] (scattered query tiles)
    std::vector<char> any, all;     // [k_tiles] a row touched the key tile, every valid row fills it
    const int sh = bn == 64 ? 6 : 7;
    auto one_tile = [&](const Run& x) {
      return (x.stride == 1 || x.count == 1) && x.count > 0 && x.start >> sh == (x.start + x.count - 1) >> sh;
    };
    const int64_t probe = qt_begin + std::max<int64_t>(1, (qt_end - qt_begin) / 16);
    for (int64_t qt = qt_begin; qt < qt_end; ++qt) {
      out.offsets.push_back(int64_t(out.entries.size()));
      const int64_t nnz0 = out.nnz;
      int64_t nruns = 0, valid_rows = 0;
      // Many short runs (a random tile: ~800 a row, a run every few keys) are set as bits of one row at a time
      // in `rowbits` (the row's keys, a few KiB) and the row is then copied into every key tile's block; the
      // tiles a row touches and whether it fills them come from its words (no count per run).
      // (Not in a mapped space: its rows' runs come in any order, and padding rows sit anywhere in a tile.)
      // Rows the pattern draws as bits (BoundPattern::row_bits: random) are taken as bits, their keys counted from
      // the words, and the tile as a scattered one whatever its runs (its rows' bits cost O(Lk) a row anyway).
      auto scattered_tile = [&](int64_t n) { return nruns * 8 >= n && nruns * 4 >= int64_t(bm) * sp.k_tiles; };
      bool scattered = false, from_bits = false;
      if (bits_ok) {
        valid_rows = std::min<int64_t>(bm, sp.lq - qt * bm);
        if (bitrows.empty()) bitrows.assign(size_t(bm * kw), 0);
        int64_t n = 0;
        for (int64_t r = 0; r < valid_rows; ++r) {
          uint64_t* b = bitrows.data() + r * kw;
          pat.row_bits(qt * bm + r, b);  // the first lkw words; the rest stay zero
          n += bit_keys(b, lkw);
        }
        std::fill(bitrows.begin() + valid_rows * kw, bitrows.end(), 0);
        from_bits = scattered = true;
        out.nnz += n;
      }
      if (!from_bits) {
        valid_rows = tile_rows(pat, sp, qt, tmp, rows, nruns, out.nnz, &same);
        scattered = !sp.m && !general_paths_only() && scattered_tile(out.nnz - nnz0);
      }
      int64_t npartial = 0;
      if (scattered) {
        if (blocks.empty()) {
          blocks.assign(size_t(sp.k_tiles * stride), 0);
          rowbits.assign(size_t(sp.k_tiles * row_words), 0);
          any.assign(size_t(sp.k_tiles), 0);
          all.assign(size_t(sp.k_tiles), 0);
        }
        uint64_t* rb = rowbits.data();
        std::fill(any.begin(), any.end(), 0);
        std::fill(all.begin(), all.end(), 1);
        int drawn = 0;  // the row whose runs are row r's (tile_rows: rows alike)
        for (int r = 0; r < bm; ++r) {
          // Runs in increasing order of their words (no permutation, no strided run so far): a word's bits are
          // gathered in `acc` and stored, not or-ed into memory (keys a few apart made a chain of loads and
          // stores through one word).
          bool ordered = sp.d == 1;
          int64_t cw = -1;  // the word `acc` holds
          uint64_t acc = 0;
          const uint64_t* src = from_bits ? bitrows.data() + r * kw : rb;  // the row's bits
          if (!from_bits && !same[size_t(r)]) drawn = r;  // (rows are not drawn as runs from bits)
          const Run* x = from_bits ? nullptr : rows[size_t(drawn)].data();
          for (const Run* xe = from_bits ? nullptr : x + rows[size_t(drawn)].size(); x < xe; ++x) {
            if (x->count == 1 && ordered) {
              const int64_t w = x->start >> 6;
              acc = (w == cw ? acc : 0) | uint64_t(1) << (x->start & 63);
              rb[w] = acc;
              cw = w;
            } else if (x->count == 1 || x->stride == 1) {
              set_bits(rb, x->start, x->start + x->count);
              cw = (x->start + x->count - 1) >> 6;
              acc = rb[cw];
            } else {
              for (int64_t j = 0, k = x->start; j < x->count; ++j, k += x->stride) rb[k >> 6] |= uint64_t(1) << (k & 63);
              ordered = false;
            }
          }
          uint64_t* dst = blocks.data() + size_t(r) * row_words;
          const bool valid = r < valid_rows;  // valid rows are a prefix of the tile
          for (int64_t kt = 0; kt < sp.k_tiles; ++kt) {
            uint64_t o = 0, a = ~uint64_t(0);
            for (int w = 0; w < row_words; ++w) {
              const uint64_t v = src[kt * row_words + w];
              dst[kt * stride + w] = v;
              if (!from_bits) rb[kt * row_words + w] = 0;
              o |= v, a &= v;
            }
            any[size_t(kt)] |= o != 0;
            all[size_t(kt)] &= !valid || a == ~uint64_t(0);
          }
        }
        scr.nt = 0;
        for (int64_t kt = 0; kt < sp.k_tiles; ++kt) {
          if (!any[size_t(kt)]) continue;
          scr.tbuf[scr.nt++] = kt;
          scr.count[size_t(kt)] = all[size_t(kt)] ? valid_rows * bn : 1;  // what full() reads
          if (!scr.full(kt, valid_rows, sp)) scr.slot[size_t(kt)] = int32_t(npartial++);
        }
      } else {
        scr.count_runs_unordered(rows, bn, same);
        std::sort(scr.touched().begin(), scr.touched().end());
        partial_kts.clear();
        for (int64_t kt : scr.touched())
          if (!scr.full(kt, valid_rows, sp)) {
            scr.slot[size_t(kt)] = int32_t(npartial++);
            partial_kts.push_back(kt);
          }
        if (npartial > 0) {
          pmask.assign(size_t(npartial * stride), 0);
          int drawn = 0;  // (as above)
          for (int r = 0; r < bm; ++r) {
            uint64_t* rm = pmask.data() + size_t(r) * row_words;
            auto mark = [&](int64_t kt, int64_t a, int64_t b) {
              const int32_t s = scr.slot[size_t(kt)];
              if (s >= 0) set_bits(rm + size_t(s) * stride, a, b);
            };
            if (!same[size_t(r)]) drawn = r;
            for (const Run& x : rows[size_t(drawn)]) {
              if (one_tile(x)) {
                mark(x.start >> sh, x.start & (bn - 1), (x.start & (bn - 1)) + x.count);
              } else if (scr.shortcuts && x.stride == 1) {
                // An interval marks the partial tiles it crosses only (those in slot order, ascending), not each.
                const int64_t a = x.start >> sh, b = (x.start + x.count - 1) >> sh;
                for (auto it = std::lower_bound(partial_kts.begin(), partial_kts.end(), a);
                     it != partial_kts.end() && *it <= b; ++it) {
                  const int64_t k0 = *it << sh;
                  mark(*it, std::max(x.start, k0) - k0, std::min(x.start + x.count, k0 + bn) - k0);
                }
              } else {
                for_each_tile_span(x, bn, mark);
              }
            }
          }
        }
      }
      if (npartial > 0 && qt == probe && out.masks.capacity() < out.masks.size() * size_t(room) / size_t(qt - qt_begin))
        out.masks.reserve(out.masks.size() * size_t(room) / size_t(qt - qt_begin) * 17 / 16);  // this part's rate
      for (int64_t kt : scr.touched()) {
        TileEntry e{int32_t(kt), kFull, 0, 0};
        const int32_t s = scr.slot[size_t(kt)];
        if (s >= 0) {
          const uint64_t* m = scattered ? blocks.data() + size_t(kt) * stride : pmask.data() + size_t(s) * stride;
          int64_t lo, hi;
          if (!sp.m && detect_band(m, sp, qt, kt, sp.k_valid(kt), lo, hi, band_scratch)) {
            e.mask = kBand;
            e.lo = int32_t(lo);
            e.hi = int32_t(hi);
            ++out.n_band;
          } else {
            e.mask = int32_t(out.masks.size() / size_t(words));  // within this part; rebased when merged
            out.masks.insert(out.masks.end(), m, m + words);
            ++out.n_bitmask;
          }
        } else {
          ++out.n_full;
        }
        out.entries.push_back(e);
        scr.count[size_t(kt)] = 0;
        scr.slot[size_t(kt)] = -1;
      }
    }
  };
  const int64_t nthreads = plan_threads(sp.q_tiles, pat.k_len());
  std::vector<Part> parts(static_cast<size_t>(nthreads));
  common::parallel_for(nthreads, int(nthreads), [&](int64_t t, int) {
    const int64_t qt0 = sp.q_tiles * t / nthreads, qt1 = sp.q_tiles * (t + 1) / nthreads;
    build_range(qt0, qt1, qt1 - qt0, parts[size_t(t)]);
  });
  // The parts concatenated in order, each copied by its own thread into arrays sized once (a random plan's bitmasks
  // are tens of MB: appended part after part, their copy and first touch of the pages ran on one thread).
  std::vector<int64_t> entry_base(parts.size() + 1, 0), mask_base(parts.size() + 1, 0);
  for (size_t pi = 0; pi < parts.size(); ++pi) {
    const Part& part = parts[pi];
    entry_base[pi + 1] = entry_base[pi] + int64_t(part.entries.size());
    mask_base[pi + 1] = mask_base[pi] + int64_t(part.masks.size());
    plan.nnz += part.nnz;
    plan.n_full += part.n_full;
    plan.n_band += part.n_band;
    plan.n_bitmask += part.n_bitmask;
  }
  if (mask_base.back() / words >= int64_t(INT32_MAX)) throw Error("block plan: too many bitmasks");
  plan.entries.resize(size_t(entry_base.back()));
  plan.masks.resize(size_t(mask_base.back()));  // not zeroed (MaskWords): every word is copied below
  common::parallel_for(nthreads, int(nthreads), [&](int64_t t, int) {
    Part& part = parts[size_t(t)];
    const int64_t qt0 = sp.q_tiles * t / nthreads;
    for (size_t i = 0; i < part.offsets.size(); ++i) plan.row_offsets[size_t(qt0) + i] = entry_base[size_t(t)] + part.offsets[i];
    TileEntry* e = plan.entries.data() + entry_base[size_t(t)];
    const int32_t mb = int32_t(mask_base[size_t(t)] / words);
    for (TileEntry x : part.entries) {
      if (x.mask >= 0) x.mask += mb;
      *e++ = x;
    }
    std::copy(part.masks.begin(), part.masks.end(), plan.masks.begin() + mask_base[size_t(t)]);
    part = Part{};
  });
  plan.row_offsets[size_t(sp.q_tiles)] = int64_t(plan.entries.size());
}
}  // namespace

BlockPlan build_block_plan(const BoundPattern& pat, int bm, int bn, int d, const Analysis* analysis) {
  return build_plan(pat, bm, bn, d, analysis);
}

namespace {
// Checks a pair of tilings against the pattern (build_block_plan's mapped form).
void check_tilings(const BoundPattern& pat, const GridTiling& q, const GridTiling& k) {
  for (const GridTiling* t : {&q, &k}) {
    const char* what = t == &q ? "query" : "key";
    const int64_t len = t == &q ? pat.q_len() : pat.k_len();
    if (t->tokens() != len)
      throw Error(std::string("block plan: the ") + what + " tiling's grid (" + t->describe() + ") holds " +
                  std::to_string(t->tokens()) + " tokens, the pattern's " + what + " length is " + std::to_string(len));
    const int64_t v = t->box.volume();
    if (v != 64 && v != 128)
      throw Error(std::string("block plan: ") + what + " boxes must hold 64 or 128 tokens (the tile sizes), " +
                  t->box.str(3) + " holds " + std::to_string(v));
  }
}
}  // namespace

BlockPlan build_block_plan(const BoundPattern& pat, const GridTiling& q, const GridTiling& k) {
  check_tilings(pat, q, k);
  const Maps maps(q, k);
  return build_plan(pat, int(q.box.volume()), int(k.box.volume()), 1, nullptr, &maps);
}

namespace {
// build_strip_plan's strips of a lone neighborhood atom with its bitmasks left to the device (BlockPlan::grid_windows),
// from the axes' windows: where on the strips' outer and inner axes (ao, ai) every coordinate's window steps by the
// axis's dilation inside the coordinate's own dilation group (so every row is a product of its two windows, the strip
// builder's grid path), a query box's window union U spans, on each axis, the least start to the most last of its
// coordinates' windows, a strip is kept where some coordinate's window on ao reaches its rows of U (every window on ai
// holds a key), and the box keeps the product of its axes' window sums. The strips, entries and nnz are those the rows
// give (tile_map_test). O(grid axes + boxes x box sides + strips). Returns 1 (built into plan), 0 (the windows do not fit:
// the rows' path applies) or -1 (the strips do not fit: error says why, as the rows' path says it).
int geometric_strips(BlockPlan& plan, const GridTiling& qt, const std::vector<GridTiling::BoxRows>& qboxes, int ao,
                     int ai, const AxisWindows& win, std::string& error) {
  for (int a : {ao, ai}) {
    const int64_t dl = qt.dilation[size_t(a)];
    for (int64_t c = 0; c < qt.dims[size_t(a)]; ++c) {
      const Run& w = win[size_t(a)][size_t(c)];
      if (w.count < 1 || (w.start - c) % dl != 0 || (w.count > 1 && w.stride != dl)) return 0;
    }
  }
  const int64_t dout = qt.dilation[size_t(ao)], di = qt.dilation[size_t(ai)];
  const int64_t sx = plan.strip_sx, sy = plan.strip_sy;
  plan.row_offsets.assign(size_t(plan.q_tiles) + 1, 0);
  std::vector<int32_t> cover;
  for (int64_t t = 0; t < plan.q_tiles; ++t) {
    plan.row_offsets[size_t(t)] = plan.nentries();
    const GridTiling::BoxRows& b = qboxes[size_t(t)];
    int64_t c[3];  // the box's first query's coordinates
    for (int64_t a = 2, x = b.base; a >= 0; --a) c[a] = x % qt.dims[size_t(a)], x /= qt.dims[size_t(a)];
    int64_t x0 = INT64_MAX, x1 = -1, y0 = INT64_MAX, y1 = -1, no = 0, ni = 0;
    for (int o = 0; o < b.extent[size_t(ao)]; ++o) {
      const Run& w = win[size_t(ao)][size_t(c[ao] + o * dout)];
      x0 = std::min(x0, w.start / dout), x1 = std::max(x1, w.last() / dout), no += w.count;
    }
    for (int o = 0; o < b.extent[size_t(ai)]; ++o) {
      const Run& w = win[size_t(ai)][size_t(c[ai] + o * di)];
      y0 = std::min(y0, w.start / di), y1 = std::max(y1, w.last() / di), ni += w.count;
    }
    if (y1 - y0 >= 64) {
      error = "the keys of query box " + std::to_string(t) + " span more than 64 coordinates of the grid's last used axis";
      return -1;
    }
    plan.nnz += no * ni;
    const int64_t h = x1 - x0 + 1, w = y1 - y0 + 1, rows = 64 / w, nst = (h + rows - 1) / rows;
    cover.assign(size_t(h) + 1, 0);  // rows of U some window on ao reaches: a difference array
    for (int o = 0; o < b.extent[size_t(ao)]; ++o) {
      const Run& wo = win[size_t(ao)][size_t(c[ao] + o * dout)];
      ++cover[size_t(wo.start / dout - x0)], --cover[size_t(wo.last() / dout - x0 + 1)];
    }
    const int64_t gbase = (c[ao] % dout) * qt.token_stride(ao) / dout + (c[ai] % di) * qt.token_stride(ai) / di;
    for (int64_t st = 0, run = 0, xr = 0; st < nst; ++st) {
      bool kept = false;
      for (; xr < std::min(h, (st + 1) * rows); ++xr) kept |= (run += cover[size_t(xr)]) > 0;
      if (!kept) continue;
      if (plan.strips.size() >= size_t(INT32_MAX)) {
        error = "too many strips";
        return -1;
      }
      plan.entries.push_back({int32_t(plan.strips.size()), int32_t(plan.strips.size()), 0, 0});
      plan.strips.push_back({int32_t(gbase + (x0 + st * rows) * sx + y0 * sy), int32_t(w),
                             int32_t(std::min(rows, h - st * rows) * w)});
    }
  }
  plan.row_offsets[size_t(plan.q_tiles)] = plan.nentries();
  plan.k_tiles = int64_t(plan.strips.size());
  plan.n_bitmask = plan.k_tiles;
  plan.k_group = plan.k_tiles * 64;
  if (plan.k_group >= int64_t(INT32_MAX) - 256) {
    error = "too many strips";
    return -1;
  }
  // The device's windows: every axis's, right-aligned, a coordinate's (start, stride, count).
  for (const std::vector<Run>& axis : win)
    for (const Run& w : axis)
      plan.grid_windows.insert(plan.grid_windows.end(), {int32_t(w.start), int32_t(w.stride), int32_t(w.count)});
  return 1;
}
}  // namespace

std::optional<BlockPlan> build_strip_plan(const BoundPattern& pat, const GridTiling& qt, std::string* why,
                                          bool device_masks) {
  const auto t0 = std::chrono::steady_clock::now();
  auto fail = [&](const std::string& reason) -> std::optional<BlockPlan> {
    if (why) *why = "key strips: " + reason;
    return std::nullopt;
  };
  if (qt.box.volume() != 64) return fail("query boxes must hold 64 tokens, " + qt.box.str(3) + " holds " + std::to_string(qt.box.volume()));
  if (qt.tokens() != pat.q_len() || qt.tokens() != pat.k_len())
    return fail("the grid (" + qt.describe() + ") must hold the queries and the keys, " + std::to_string(pat.q_len()) +
                " x " + std::to_string(pat.k_len()));
  // The grid's used axes (longer than 1): the last one is the strips' inner axis ai (its tokens are consecutive: every
  // axis after it has size 1), the other, if any, the outer axis ao; an unused axis stands in for a missing one (its
  // coordinate is always 0).
  std::array<int64_t, 3> step{1, 1, 1};  // tokens per coordinate of each axis (dilation 1)
  for (int a = 1; a >= 0; --a) step[size_t(a)] = step[size_t(a) + 1] * qt.dims[size_t(a) + 1];
  int used[3], nused = 0;
  for (int a = 0; a < 3; ++a)
    if (qt.dims[size_t(a)] > 1) used[nused++] = a;
  if (nused > 2) return fail("the grid (" + qt.describe() + ") has three axes longer than 1");
  const int ai = nused > 0 ? used[nused - 1] : 2;
  const int ao = nused > 1 ? used[0] : (ai == 0 ? 1 : 0);
  const int64_t ni = qt.dims[size_t(ai)];
  const int64_t di = qt.dilation[size_t(ai)], dout = qt.dilation[size_t(ao)];
  const int64_t sx = qt.token_stride(ao), sy = qt.token_stride(ai);  // sy == di: the axes after ai have size 1
  if (sx >= INT32_MAX || int64_t(pat.k_len()) >= INT32_MAX) return fail("the grid is too large for 32-bit tokens");

  BlockPlan plan;
  plan.block_m = plan.block_n = 64;
  plan.q_len = pat.q_len();
  plan.k_len = pat.k_len();
  plan.q_map = qt.map();
  plan.q_group = int64_t(plan.q_map.size());
  plan.q_tiles = plan.q_group / 64;
  plan.q_tiling = plan.k_tiling = qt;
  plan.strip_keys = true;
  plan.strip_sx = int32_t(sx);
  plan.strip_sy = int32_t(sy);
  const std::vector<GridTiling::BoxRows> qboxes = qt.boxes();
  // One neighborhood atom on this tiling's grid (NeighborhoodGrid::exact, the same dims and dilations): a query's keys
  // are the product of its axis windows, so a row's pieces (one a line of the outer axis's window) come from its two
  // windows, not from its runs and each run's coordinates (a row whose first key is not in its group, or whose windows
  // step other than by the grid's dilation, takes its runs). na2d 128x128 K=13: choose 5.12 -> 4.16 ms, one thread.
  std::optional<NeighborhoodGrid> grid = general_paths_only() ? std::nullopt : pat.neighborhood_grid();
  const int shift = grid ? 3 - grid->naxes : 0;  // tiling axis a is grid axis a - shift (right-aligned)
  for (int a = 0; a < 3 && grid; ++a) {
    const bool on = a >= shift;
    if (!grid->exact || (on ? grid->dims[size_t(a - shift)] : 1) != qt.dims[size_t(a)] ||
        (on ? grid->dilation[size_t(a - shift)] : 1) != qt.dilation[size_t(a)])
      grid.reset();
  }
  auto window = [&](int a, int64_t c) { return a >= shift ? grid->window(a - shift, c) : Run{0, 1, 1}; };

  // Bitmasks left to the device (device_masks): where every query's windows stay in its dilation group at the group's
  // step (then every row takes the grid path below), a box's strips come from its axes' windows alone.
  if (device_masks && grid) {
    std::string error;
    const int g = geometric_strips(plan, qt, qboxes, ao, ai, axis_windows(*grid), error);
    if (g < 0) return fail(error);
    if (g > 0) {
      order_by_entries(plan);
      plan.build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      return plan;
    }
  }

  // Every token's coordinates on the two axes (ci, co) and in its dilation group (y = ci / di, x = co / dout), counted
  // up token by token: a run's piece reads them here instead of dividing (about ten 64-bit divisions a piece, 213k
  // pieces for na2d 128x128 K=13 at L = 16384: the strip plan took 6.2 ms, 2.9 after, on the shared 2-core VM).
  struct Coord {
    int32_t ci, co, y, x;
  };
  std::vector<Coord> coord(size_t(pat.k_len()));
  {
    std::array<int64_t, 3> c{0, 0, 0}, g{0, 0, 0}, res{0, 0, 0};  // per axis: coordinate, its group coordinate, residue
    for (Coord& e : coord) {
      e = {int32_t(c[size_t(ai)]), int32_t(c[size_t(ao)]), int32_t(g[size_t(ai)]), int32_t(g[size_t(ao)])};
      for (int a = 2; a >= 0; --a) {  // the next token: the last axis steps, carrying into the ones before it
        const size_t u = size_t(a);
        if (++c[u] < qt.dims[u]) {
          if (++res[u] == qt.dilation[u]) res[u] = 0, ++g[u];
          break;
        }
        c[u] = g[u] = res[u] = 0;
      }
    }
  }


  // Per query tile: its strips (base, width, count), its entries' masks (64 words each), nnz; or a failure.
  struct Part {
    std::vector<KeyStrip> strips;
    std::vector<uint64_t> masks;
    int64_t nnz = 0;
    std::string error;
  };
  std::vector<Part> parts(size_t(plan.q_tiles));
  const int threads = int(std::max<int64_t>(1, std::min<int64_t>(plan_thread_cap(), plan.q_tiles / 8)));
  struct Piece {
    int32_t row, x, y, ystep, n;  // query row; keys at group coordinates (x, y + i ystep), i < n
  };
  struct Scratch {
    RowRuns runs;
    std::vector<Piece> pieces;
    std::vector<uint64_t> m;
    std::vector<int32_t> strip_of, slot_of;  // per row of U: its strip, its first slot
  };
  std::vector<Scratch> scratch(static_cast<size_t>(threads));
  common::parallel_for(plan.q_tiles, threads, [&](int64_t t, int th) {
    Part& out = parts[size_t(t)];
    Scratch& s = scratch[size_t(th)];
    const Coord& bc = coord[size_t(qboxes[size_t(t)].base)];
    const int64_t go = bc.co - int64_t(bc.x) * dout, gi = bc.ci - int64_t(bc.y) * di;  // the box's group
    const int64_t gbase = go * step[size_t(ao)] + gi * step[size_t(ai)];  // the group's token at coordinates (0, 0)
    const int64_t gsize = (ni - 1 - gi) / di + 1;  // the group's coordinates on the inner axis
    RowRuns& runs = s.runs;
    std::vector<Piece>& pieces = s.pieces;
    pieces.clear();
    int64_t x0 = INT64_MAX, x1 = -1, y0 = INT64_MAX, y1 = -1;
    for (int r = 0; r < 64; ++r) {
      const int32_t q = plan.q_map[size_t(t * 64 + r)];
      if (q < 0) continue;
      if (grid) {  // the product of the query's windows: a piece a line of the outer one (see above)
        const Coord& qc = coord[size_t(q)];
        const Run wo = window(ao, qc.co), wi = window(ai, qc.ci);
        const Coord& kc = coord[size_t(wo.start * step[size_t(ao)] + wi.start * step[size_t(ai)])];  // the first key
        if (wo.count > 0 && wi.count > 0 && kc.co - int64_t(kc.x) * dout == go && kc.ci - int64_t(kc.y) * di == gi &&
            (wo.count == 1 || wo.stride == dout) && (wi.count == 1 || wi.stride % di == 0)) {
          out.nnz += wo.count * wi.count;
          const int64_t ystep = wi.count > 1 ? wi.stride / di : 1, y = kc.y, x = kc.x;
          x0 = std::min(x0, x), x1 = std::max(x1, x + wo.count - 1);
          y0 = std::min(y0, y), y1 = std::max(y1, y + (wi.count - 1) * ystep);
          if (y1 - y0 >= 64) {
            out.error = "the keys of query box " + std::to_string(t) + " span more than 64 coordinates of the grid's last used axis";
            return;
          }
          for (int64_t a = 0; a < wo.count; ++a)
            pieces.push_back({r, int32_t(x + a), int32_t(y), int32_t(ystep), int32_t(wi.count)});
          continue;
        }
      }
      pat.row(q, runs);
      out.nnz += count_keys(runs);
      for (const Run& run : runs) {
        // The run line by line of the inner axis: a piece is its keys on one line.
        for (int64_t k = run.start, left = run.count; left > 0;) {
          const Coord& kc = coord[size_t(k)];
          const int64_t ci = kc.ci, co = kc.co;
          const int64_t rest = k - ci * step[size_t(ai)] - co * step[size_t(ao)];  // the third axis: size 1
          const bool in_group = co - int64_t(kc.x) * dout == go && ci - int64_t(kc.y) * di == gi;
          // (a run at the group's stride, as a neighborhood row's: its keys to the line's end are the group's)
          const int64_t n = left == 1 || run.stride <= 0 ? 1
                            : run.stride == di && in_group ? std::min(left, gsize - kc.y)
                                                          : std::min(left, (ni - 1 - ci) / run.stride + 1);
          if (rest != 0 || !in_group || (n > 1 && run.stride % di != 0)) {
            out.error = "the keys of query " + std::to_string(q) + " leave its dilation group (" + qt.describe() + ")";
            return;
          }
          const int64_t ystep = n > 1 ? run.stride / di : 1;
          const int64_t x = kc.x, y = kc.y, ye = y + (n - 1) * ystep;
          x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, ye);
          if (y1 - y0 >= 64) {
            out.error = "the keys of query box " + std::to_string(t) + " span more than 64 coordinates of the grid's last used axis";
            return;
          }
          pieces.push_back({r, int32_t(x), int32_t(y), int32_t(ystep), int32_t(n)});
          k += n * run.stride;
          left -= n;
        }
      }
    }
    if (x1 < 0) return;  // no kept key
    const int64_t h = x1 - x0 + 1, w = y1 - y0 + 1, rows = 64 / w, nst = (h + rows - 1) / rows;
    s.strip_of.resize(size_t(h));
    s.slot_of.resize(size_t(h));
    for (int64_t xr = 0; xr < h; ++xr) s.strip_of[size_t(xr)] = int32_t(xr / rows), s.slot_of[size_t(xr)] = int32_t((xr % rows) * w);
    std::vector<uint64_t>& m = s.m;
    m.assign(size_t(nst * 64), 0);
    for (const Piece& pc : pieces) {
      const int64_t xr = pc.x - x0, slot = s.slot_of[size_t(xr)] + (pc.y - y0);
      uint64_t& word = m[size_t(int64_t(s.strip_of[size_t(xr)]) * 64 + pc.row)];
      if (pc.ystep == 1)  // consecutive slots (slot + n <= rows * w <= 64: the piece lies in one row of U)
        word |= (pc.n == 64 ? ~uint64_t(0) : (uint64_t(1) << pc.n) - 1) << slot;
      else
        for (int32_t i = 0; i < pc.n; ++i) word |= uint64_t(1) << (slot + int64_t(i) * pc.ystep);
    }
    for (int64_t st = 0; st < nst; ++st) {
      const uint64_t* sm = m.data() + st * 64;
      if (std::all_of(sm, sm + 64, [](uint64_t v) { return v == 0; })) continue;  // no kept key in this strip
      const int64_t base = gbase + (x0 + st * rows) * sx + y0 * sy;
      out.strips.push_back({int32_t(base), int32_t(w), int32_t(std::min(rows, h - st * rows) * w)});
      out.masks.insert(out.masks.end(), sm, sm + 64);
    }
  });
  for (const Part& part : parts)
    if (!part.error.empty()) return fail(part.error);
  plan.row_offsets.assign(size_t(plan.q_tiles) + 1, 0);
  size_t nstrips = 0;  // (the arrays sized once, not grown part by part: na2d choose 5.29 -> 5.19 ms, one thread)
  for (const Part& part : parts) nstrips += part.strips.size();
  if (nstrips < size_t(INT32_MAX)) {
    plan.entries.reserve(nstrips);
    plan.strips.reserve(nstrips);
    plan.masks.reserve(nstrips * 64);
  }
  for (int64_t t = 0; t < plan.q_tiles; ++t) {
    const Part& part = parts[size_t(t)];
    plan.row_offsets[size_t(t)] = int64_t(plan.entries.size());
    for (const KeyStrip& k : part.strips) {
      if (plan.strips.size() >= size_t(INT32_MAX)) return fail("too many strips");
      plan.entries.push_back({int32_t(plan.strips.size()), int32_t(plan.strips.size()), 0, 0});
      plan.strips.push_back(k);
    }
    plan.masks.insert(plan.masks.end(), part.masks.begin(), part.masks.end());
    plan.nnz += part.nnz;
  }
  plan.row_offsets[size_t(plan.q_tiles)] = int64_t(plan.entries.size());
  plan.k_tiles = int64_t(plan.strips.size());
  plan.n_bitmask = plan.k_tiles;
  plan.k_group = plan.k_tiles * 64;
  if (plan.k_group >= int64_t(INT32_MAX) - 256) return fail("too many strips");
  // The strips' slots as a key map, by the kernels' arithmetic (key_boxes.hpp).
  plan.k_map.resize(size_t(plan.k_group));
  for (size_t kt = 0; kt < plan.strips.size(); ++kt) {
    const KeyStrip& k = plan.strips[kt];
    const int packed = strip_pack(k.width, k.count);
    for (int r = 0; r < 64; ++r) plan.k_map[kt * 64 + size_t(r)] = strip_token(k.base, packed, r, int(sx), int(sy));
  }
  order_by_entries(plan);
  plan.build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return plan;
}

int entry_halves(const BlockPlan& plan, int64_t qt, int64_t i) {
  if (plan.block_n != 128) return 1;
  const TileEntry& e = plan.entries[size_t(i)];
  if (e.mask == kFull || plan.masks_drawn()) return 3;
  int bits = 0;
  if (e.mask == kBand) {
    const Space sp(plan.q_len, plan.k_len, plan.block_m, plan.block_n, plan.perm_d);
    const int64_t q0 = qt * plan.block_m, k0 = int64_t(e.kt) * plan.block_n;
    // kept keys: lo <= k0 + c - (q0 + r) <= hi for some row r, and c < kvalid
    const int64_t c_lo = std::max<int64_t>(0, int64_t(e.lo) + q0 - k0);
    const int64_t c_hi = std::min<int64_t>(sp.k_valid(e.kt) - 1, int64_t(e.hi) + q0 + plan.block_m - 1 - k0);
    if (c_lo <= c_hi) {
      if (c_lo < 64) bits |= 1;
      if (c_hi >= 64) bits |= 2;
    }
  } else {
    const int64_t words = plan.words_per_mask();
    const uint64_t* m = &plan.masks[size_t(int64_t(e.mask) * words)];
    for (int64_t w = 0; w < words; ++w)
      if (m[w]) bits |= 1 << (w & 1);  // row-major, two words a row
  }
  return bits ? bits : 3;
}

namespace {
// A candidate: a tile shape (and tile map) priced by its kernel-table row.
struct Candidate {
  int block_m, block_n, d;
  const KernelConfig* row;
  std::shared_ptr<const Maps> maps;  // a mapped candidate (d is 1)
  std::shared_ptr<BlockPlan> strip;  // a strip candidate (maps: its query boxes): its plan, built to price it
  bool priced = false;               // priced already: from its plan (strips) or in closed form (estimate_groups, ...)
  double cost = 0;
  double kept = 0;  // sampled: kept scores over the visited tiles' scores
};

Space space_of(const BoundPattern& pat, const Candidate& c) {
  return c.maps ? Space(pat.q_len(), pat.k_len(), c.block_m, c.block_n, *c.maps)
                : Space(pat.q_len(), pat.k_len(), c.block_m, c.block_n, c.d);
}

// The query tiles a candidate's estimate samples: 48 spread evenly (all where there are fewer).
int64_t estimate_samples(const Space& sp) { return std::min<int64_t>(sp.q_tiles, 48); }
int64_t sampled_tile(const Space& sp, int64_t samples, int64_t i) {
  return samples == sp.q_tiles ? i : (i * sp.q_tiles) / samples;
}

// Prices a candidate from its samples: the cost of visiting the samples' touched key tiles (n_full full, n_partial
// not; items: samples touching any), scaled to all query tiles; and the kept fraction of the samples' visited scores
// (nnz: their kept scores). Or from each sample's touched tiles (full[i][j]: sample i's j-th touched tile is full).
void price(Candidate& c, const Space& sp, int64_t samples, int64_t n_full, int64_t n_partial, int64_t items, int64_t nnz) {
  const double tile = double(c.block_m) * c.block_n;
  c.cost = predicted_cost(*c.row, double(n_full), double(n_partial), double(items), tile) * double(sp.q_tiles) /
           double(std::max<int64_t>(samples, 1));
  c.kept = n_full + n_partial > 0 ? double(nnz) / (double(n_full + n_partial) * tile) : 0.0;
}
void price(Candidate& c, const Space& sp, const std::vector<std::vector<char>>& full, int64_t nnz) {
  int64_t n_full = 0, n_partial = 0, items = 0;
  for (const std::vector<char>& f : full) {
    for (char is_full : f) ++(is_full ? n_full : n_partial);
    items += f.empty() ? 0 : 1;
  }
  price(c, sp, int64_t(full.size()), n_full, n_partial, items, nnz);
}

// Predicted cost of a candidate from a sample of query tiles (no bitmasks built).
void estimate_cost(const BoundPattern& pat, Candidate& c) {
  const Space sp = space_of(pat, c);
  const int64_t samples = estimate_samples(sp);
  TileScratch scr(sp.k_tiles);
  RowRuns tmp;
  std::vector<RowRuns> rows;
  std::vector<std::vector<char>> full(static_cast<size_t>(samples));
  int64_t nnz = 0;
  for (int64_t i = 0; i < samples; ++i) {
    const int64_t qt = sampled_tile(sp, samples, i);
    int64_t nruns = 0;
    const int64_t valid_rows = tile_rows(pat, sp, qt, tmp, rows, nruns, nnz);
    scr.count_runs(rows, c.block_n);
    for (int64_t kt : scr.touched()) {
      full[size_t(i)].push_back(scr.full(kt, valid_rows, sp));
      scr.count[size_t(kt)] = 0;
    }
  }
  price(c, sp, full, nnz);
}

// One sample tile's touched key tiles (f: full or not, in order of first touch) and kept scores (nnz), for rows
// the pattern draws as bits (BoundPattern::row_bits: random), as the row walk finds them. Once every key tile is
// touched and none is still filled by every row so far, the tile's other rows change neither (a key tile touched
// stays touched; one a row left unfilled is not full): they add their keys only, which row_nnz counts without
// drawing them (O(1) for random). random(820) at L = 16384 settles within a few rows of 64-192.
struct SettleScratch {
  std::vector<uint64_t> bits;
  std::vector<char> seen, maybe_full;
  std::vector<int64_t> order;
};
void sample_from_bits(const BoundPattern& pat, const Space& sp, int64_t begin, int64_t end, std::vector<char>& f,
                      int64_t& nnz, SettleScratch& s) {
  const int64_t lkw = (sp.lk + 63) / 64, wpt = sp.bn / 64;
  s.bits.resize(size_t(lkw));
  s.seen.assign(size_t(sp.k_tiles), 0);
  s.maybe_full.assign(size_t(sp.k_tiles), 0);
  s.order.clear();
  int64_t n_maybe = 0;
  for (int64_t kt = 0; kt < sp.k_tiles; ++kt)
    if (sp.k_whole(kt)) s.maybe_full[size_t(kt)] = 1, ++n_maybe;  // a tile with padding is never full
  for (int64_t q = begin; q < end; ++q) {
    if (int64_t(s.order.size()) == sp.k_tiles && n_maybe == 0) {
      nnz += pat.row_nnz(q);
      continue;
    }
    pat.row_bits(q, s.bits.data());
    const uint64_t* b = s.bits.data();
    nnz += bit_keys(b, lkw);
    for (int64_t kt = 0; kt < sp.k_tiles; ++kt) {
      uint64_t o = 0, a = ~uint64_t(0);
      for (int64_t w = kt * wpt; w < std::min(kt * wpt + wpt, lkw); ++w) o |= b[w], a &= b[w];
      if (o && !s.seen[size_t(kt)]) s.seen[size_t(kt)] = 1, s.order.push_back(kt);
      if (s.maybe_full[size_t(kt)] && a != ~uint64_t(0)) s.maybe_full[size_t(kt)] = 0, --n_maybe;
    }
  }
  for (int64_t kt : s.order) f.push_back(s.maybe_full[size_t(kt)]);
}

// Keys of the rows q0 .. q1 of dilated band rows (row q keeps q + m d, lo <= m <= hi, inside [0, lk)), lo <= 0 <= hi.
// A row q < lk keeps m from Lo(q) = max(lo, -floor(q / d)) to U(q) = min(hi, floor((lk - 1 - q) / d)), one key at
// least (m = 0); each clamp binds on one side of a cut (q < -lo d, q > lk - 1 - hi d), so the sums of U and Lo are
// sums of floor(t / d) over ranges of t, in closed form. Rows q >= lk (cross attention, Lq > Lk) are counted one by one.
int64_t dilated_rows_keys(int64_t q0, int64_t q1, int64_t lo, int64_t hi, int64_t d, int64_t lk) {
  auto prefix = [d](int64_t n) {  // sum of floor(t / d), 0 <= t < n
    const int64_t m = n / d, r = n % d;
    return d * m * (m - 1) / 2 + r * m;
  };
  auto sum_floor = [&](int64_t a, int64_t b) { return a > b ? 0 : prefix(b + 1) - prefix(a); };  // t in [a, b]
  int64_t n = 0;
  for (int64_t q = std::max(q0, lk); q <= q1; ++q)
    n += std::max<int64_t>(0, std::min(hi, floor_div(lk - 1 - q, d)) - std::max(lo, -floor_div(q, d)) + 1);
  const int64_t b = std::min(q1, lk - 1);
  if (q0 > b) return n;
  const int64_t c = -lo * d, e = lk - 1 - hi * d;  // Lo(q) = lo from c on; U(q) = hi up to e
  const int64_t lo_sum = -sum_floor(q0, std::min(b, c - 1)) + lo * std::max<int64_t>(0, b - std::max(q0, c) + 1);
  const int64_t a2 = std::max(q0, e + 1);
  const int64_t hi_sum = hi * std::max<int64_t>(0, std::min(b, e) - q0 + 1) + (a2 > b ? 0 : sum_floor(lk - 1 - b, lk - 1 - a2));
  return n + hi_sum - lo_sum + (b - q0 + 1);
}

// estimate_cost in closed form for band rows inside residue groups (Analysis::groups, residue d): the samples'
// touched tiles, full or not, and kept scores, as the row walk counts them.
//  - Candidates of that permutation: a sample's rows are band rows of its group's lengths (BandTiles: the touched key
//    tiles and the full ones, as build_group_band_entries builds them).
//  - Unpermuted candidates where Lq <= Lk, d <= 64 and lo <= 0 <= hi: row q keeps q itself and keys d <= bn apart, so
//    it touches every key tile from its first key's to its last's, and the tile's rows together one interval of key
//    tiles (each row's holds the row's own tile), from the least first key (among the first d rows: first(q + d) >=
//    first(q)) to the most last key (the last d rows); none full (a row keeps at most every d-th key of a tile).
// Others are left to the walk.
void estimate_groups(const BoundPattern& pat, const Analysis& an, std::vector<Candidate>& cands) {
  if (!an.groups.ok || general_paths_only()) return;
  const int64_t lq = pat.q_len(), lk = pat.k_len(), d = an.residue, lo = an.groups.lo, hi = an.groups.hi;
  for (Candidate& c : cands) {
    if (c.maps || c.priced || (c.d != d && c.d != 1)) continue;
    const Space sp = space_of(pat, c);
    const int64_t samples = estimate_samples(sp);
    int64_t nnz = 0, n_full = 0, n_partial = 0, items = 0;
    if (c.d == d) {
      const int64_t q_per = sp.q_group / sp.bm;
      for (int64_t i = 0; i < samples; ++i) {
        const int64_t qt = sampled_tile(sp, samples, i);
        const int64_t g = qt / q_per, j0 = (qt - g * q_per) * sp.bm;
        const int64_t nq = residue_group_len(lq, g, d), nk = residue_group_len(lk, g, d);
        if (j0 >= nq || nk == 0) continue;
        const BandTiles bt{j0, std::min(nq, j0 + sp.bm) - 1, lo, hi, nk, sp.bn};
        const int64_t first = bt.first_tile(), last = bt.last_tile();
        for (int64_t kt = first; kt <= last; ++kt) ++(bt.full(kt * sp.bn) ? n_full : n_partial);
        items += last >= first;
        nnz += dilated_rows_keys(bt.q0, bt.q1, lo, hi, 1, nk);
      }
    } else {
      if (lq > lk || d > 64 || lo > 0 || hi < 0) continue;
      const int sh = sp.bn == 64 ? 6 : 7;
      for (int64_t i = 0; i < samples; ++i) {
        const int64_t qt = sampled_tile(sp, samples, i), q0 = qt * sp.bm, q1 = std::min(lq, q0 + sp.bm) - 1;
        int64_t first = INT64_MAX, last = -1;
        for (int64_t q = q0; q <= std::min(q1, q0 + d - 1); ++q) first = std::min(first, q + d * std::max(lo, -floor_div(q, d)));
        for (int64_t q = std::max(q0, q1 - d + 1); q <= q1; ++q)
          last = std::max(last, q + d * std::min(hi, floor_div(lk - 1 - q, d)));
        n_partial += (last >> sh) - (first >> sh) + 1;
        items += 1;
        nnz += dilated_rows_keys(q0, q1, lo, hi, d, lk);
      }
    }
    price(c, sp, samples, n_full, n_partial, items, nnz);
    c.priced = true;
  }
}

// estimate_cost in closed form for rows alike by blocks (Analysis::blocks), for the unpermuted, unmapped candidates: a
// sample's touched key tiles, full or not (BlockTiles::tile), and kept scores (each block row's keys times its rows in
// the sample), as the row walk counts them.
void estimate_blocks(const BoundPattern& pat, const Analysis& an, std::vector<Candidate>& cands) {
  if (!an.blocks || general_paths_only()) return;
  const BlockRows& br = *an.blocks;
  for (Candidate& c : cands) {
    if (c.maps || c.priced || c.d != 1) continue;
    const Space sp = space_of(pat, c);
    const int64_t samples = estimate_samples(sp), b = br.block;
    BlockTiles bt(br, sp.bn);
    int64_t nnz = 0, n_full = 0, n_partial = 0, items = 0;
    for (int64_t i = 0; i < samples; ++i) {
      const int64_t qt = sampled_tile(sp, samples, i), q0 = qt * sp.bm, q1 = std::min(sp.lq, q0 + sp.bm) - 1;
      const std::span<const BlockTiles::Tile> tiles = bt.tile(q0, q1);
      for (const BlockTiles::Tile& t : tiles) ++(t.full ? n_full : n_partial);
      items += !tiles.empty();
      for (int64_t x = q0 / b; x <= q1 / b; ++x)
        nnz += br.keys(x) * (std::min(q1, x * b + b - 1) - std::max(q0, x * b) + 1);
    }
    price(c, sp, samples, n_full, n_partial, items, nnz);
    c.priced = true;
  }
}

// estimate_cost in closed form for a lone neighborhood atom (NeighborhoodGrid::exact), for the unpermuted, unmapped
// candidates: a sample's rows are tokens in row-major order, so they split into segments of one line of the grid's last
// axis (fixed leading coordinates c0, c1; last coordinates a ... b). A segment's queries keep, on every line (e0, e1) of
// their leading windows' product, the keys e2 of their last windows: the keys of key tile kt on that line are a range
// [u, v] of e2, and the segment's kept scores there the sum over its queries of their windows' keys in [u, v]: a range
// sum of how many of the segment's windows hold each e2 (with the windows' step, for dilation). So a sample costs its
// segments' lines x tiles a line, not its rows' runs: the same touched tiles, full or not, and kept scores as the walk
// (plan_paths_test), which was three quarters of na2d's choice at L = 16384 after its mapped shapes were priced from
// their windows.
void estimate_grid_rows(const BoundPattern& pat, const Analysis& an, std::vector<Candidate>& cands) {
  if (!an.grid || !an.grid->exact || general_paths_only() || pat.q_len() != pat.k_len()) return;
  const AxisWindows win = axis_windows(*an.grid);  // (every window's stride: its axis's dilation, 1 at least)
  const int64_t lq = pat.q_len(), n1 = int64_t(win[1].size()), n2 = int64_t(win[2].size()), step = win[2][0].stride;
  std::vector<int64_t> cov, pre;
  for (Candidate& c : cands) {
    if (c.maps || c.priced || c.d != 1) continue;
    const Space sp = space_of(pat, c);
    const int64_t samples = estimate_samples(sp), bn = sp.bn;
    TileScratch ts(sp.k_tiles);
    int64_t nnz = 0, n_full = 0, n_partial = 0, items = 0;
    for (int64_t i = 0; i < samples; ++i) {
      const int64_t qt = sampled_tile(sp, samples, i), q0 = qt * sp.bm, q1 = std::min(lq, q0 + sp.bm);
      for (int64_t q = q0; q < q1;) {
        const int64_t c2 = q % n2, c1 = (q / n2) % n1, c0 = q / (n2 * n1), len = std::min(q1 - q, n2 - c2);
        int64_t lo = INT64_MAX, hi = -1, keys2 = 0;
        for (int64_t x = c2; x < c2 + len; ++x) {
          const Run& w = win[2][size_t(x)];
          lo = std::min(lo, w.start), hi = std::max(hi, w.last()), keys2 += w.count;
        }
        // cov[e - lo]: the segment's windows holding e2 = e (a difference array stepped by the windows' stride);
        // pre[j]: their sum over e2 < lo + j.
        cov.assign(size_t(hi - lo + 1 + step), 0);
        for (int64_t x = c2; x < c2 + len; ++x) {
          const Run& w = win[2][size_t(x)];
          ++cov[size_t(w.start - lo)], --cov[size_t(w.start + w.count * step - lo)];
        }
        pre.assign(size_t(hi - lo + 2), 0);
        for (int64_t e = 0; e <= hi - lo; ++e) {
          if (e >= step) cov[size_t(e)] += cov[size_t(e - step)];
          pre[size_t(e) + 1] = pre[size_t(e)] + cov[size_t(e)];
        }
        const Run& w0 = win[0][size_t(c0)];
        const Run& w1 = win[1][size_t(c1)];
        nnz += w0.count * w1.count * keys2;
        for (int64_t j0 = 0; j0 < w0.count; ++j0)
          for (int64_t j1 = 0; j1 < w1.count; ++j1) {
            const int64_t base = ((w0.start + j0 * w0.stride) * n1 + w1.start + j1 * w1.stride) * n2;
            for (int64_t kt = (base + lo) / bn; kt <= (base + hi) / bn; ++kt) {
              const int64_t u = std::max(lo, kt * bn - base), v = std::min(hi, kt * bn + bn - 1 - base);
              const int64_t kept = pre[size_t(v - lo) + 1] - pre[size_t(u - lo)];
              if (kept == 0) continue;
              if (ts.count[size_t(kt)] == 0) ts.tbuf[ts.nt++] = kt;
              ts.count[size_t(kt)] += kept;
            }
          }
        q += len;
      }
      for (int64_t kt : ts.touched()) {
        ++(ts.full(kt, q1 - q0, sp) ? n_full : n_partial);
        ts.count[size_t(kt)] = 0;
      }
      items += ts.nt > 0;
      ts.nt = 0;
    }
    price(c, sp, samples, n_full, n_partial, items, nnz);
    c.priced = true;
  }
}

// random(r) with bitmasks drawn on the device (drawn_masks_apply, device_draw): every tile a bitmask entry, every query
// tile an item, r keys a row, exactly as that plan visits them (the host plan may find a tile full or a band in one:
// sampled as any other).
void estimate_random(const BoundPattern& pat, std::vector<Candidate>& cands) {
  if (general_paths_only()) return;
  for (Candidate& c : cands) {
    if (c.maps || c.priced || c.d != 1 || !drawn_masks_apply(pat, c.block_m, c.block_n)) continue;
    const Space sp = space_of(pat, c);
    price(c, sp, sp.q_tiles, 0, sp.q_tiles * sp.k_tiles, sp.q_tiles, sp.lq * pat.random_spec()->r);
    c.priced = true;
  }
}

// estimate_cost of every candidate. Those without a permutation sample query tiles of consecutive rows, and
// their samples overlap (a 64-row tile's rows are those of a 128-row one; random(820) at L = 16384 walked
// 12288 rows for three shapes, 6144 distinct): each distinct row is walked once, on the plan threads, and fed
// to every candidate tile holding it. The per-sample results are summed as estimate_cost sums them.
void estimate_costs(const BoundPattern& pat, const Analysis& an, std::vector<Candidate>& cands, bool device_draw = false) {
  const int threads = plan_thread_cap();
  estimate_groups(pat, an, cands);
  estimate_blocks(pat, an, cands);
  estimate_grid_rows(pat, an, cands);
  if (device_draw) estimate_random(pat, cands);
  std::vector<size_t> shared;
  for (size_t i = 0; i < cands.size(); ++i)
    if (cands[i].d == 1 && !cands[i].maps && !cands[i].priced && !general_paths_only()) shared.push_back(i);
  std::vector<size_t> alone;
  for (size_t i = 0; i < cands.size(); ++i)
    if (std::find(shared.begin(), shared.end(), i) == shared.end() && !cands[i].priced)
      alone.push_back(i);
  common::parallel_for(int64_t(alone.size()), int(std::min<int64_t>(int64_t(alone.size()), threads)),
                       [&](int64_t i, int) { estimate_cost(pat, cands[alone[size_t(i)]]); });
  if (shared.empty()) return;
  const int64_t lq = pat.q_len();
  struct Sample {
    int64_t begin, end;  // rows
    size_t cand;         // index into shared
    int64_t i;           // sample index
  };
  std::vector<Space> spaces;
  std::vector<std::vector<std::vector<char>>> full(shared.size());
  std::vector<std::vector<int64_t>> nnz(shared.size());  // per sample (a sample is one thread's)
  std::vector<Sample> tiles;
  for (size_t s = 0; s < shared.size(); ++s) {
    const Candidate& c = cands[shared[s]];
    spaces.emplace_back(lq, pat.k_len(), c.block_m, c.block_n, 1);
    const int64_t samples = estimate_samples(spaces.back());
    full[s].resize(size_t(samples));
    nnz[s].assign(size_t(samples), 0);
    for (int64_t i = 0; i < samples; ++i) {
      const int64_t qt = sampled_tile(spaces.back(), samples, i);
      tiles.push_back({qt * c.block_m, std::min(lq, (qt + 1) * c.block_m), s, i});
    }
  }
  if (lq > 0 && !general_paths_only()) {
    std::vector<uint64_t> probe(size_t(pat.k_len() + 63) / 64);
    if (pat.row_bits(0, probe.data())) {  // rows drawn as bits (random): each sample alone, until settled
      std::vector<SettleScratch> scratch(static_cast<size_t>(threads));
      common::parallel_for(int64_t(tiles.size()), threads, [&](int64_t j, int t) {
        const Sample& tile = tiles[size_t(j)];
        sample_from_bits(pat, spaces[tile.cand], tile.begin, tile.end, full[tile.cand][size_t(tile.i)],
                         nnz[tile.cand][size_t(tile.i)], scratch[size_t(t)]);
      });
      for (size_t s = 0; s < shared.size(); ++s) {
        int64_t n = 0;
        for (int64_t x : nnz[s]) n += x;
        price(cands[shared[s]], spaces[s], full[s], n);
      }
      return;
    }
  }
  // Segments: rows that overlapping sample tiles join; a segment's tiles are walked by one thread.
  std::sort(tiles.begin(), tiles.end(), [](const Sample& a, const Sample& b) { return a.begin < b.begin; });
  std::vector<size_t> seg_begin;  // into tiles
  int64_t reach = -1;
  for (size_t j = 0; j < tiles.size(); ++j) {
    if (tiles[j].begin >= reach) seg_begin.push_back(j);
    reach = std::max(reach, tiles[j].end);
  }
  seg_begin.push_back(tiles.size());
  // A row of many runs has its keys counted once per 64-key tile (row64), then added into each candidate tile that
  // holds the row (a 128-key tile: two 64-key ones): random rows' ~800 runs were counted once per candidate.
  std::vector<std::vector<TileScratch>> scratch(static_cast<size_t>(threads));
  std::vector<std::unique_ptr<TileScratch>> row64s(static_cast<size_t>(threads));
  const int64_t block = pat.row_block();
  // Rows the pattern draws as bits (BoundPattern::row_bits): counted from their words, no runs made.
  std::vector<std::vector<uint64_t>> bits(static_cast<size_t>(threads), std::vector<uint64_t>(size_t((lq > 0 ? pat.k_len() : 0) + 63) / 64));
  const bool bits_ok = lq > 0 && pat.row_bits(0, bits[0].data());
  common::parallel_for(int64_t(seg_begin.size()) - 1, threads, [&](int64_t sg, int t) {
    std::vector<TileScratch>& scr = scratch[size_t(t)];
    if (scr.empty())
      for (const Space& sp : spaces) scr.emplace_back(sp.k_tiles);
    if (!row64s[size_t(t)]) row64s[size_t(t)] = std::make_unique<TileScratch>(ceil_div(pat.k_len(), 64));
    TileScratch& row64 = *row64s[size_t(t)];
    const size_t j0 = seg_begin[size_t(sg)], j1 = seg_begin[size_t(sg) + 1];
    int64_t end = 0;
    for (size_t j = j0; j < j1; ++j) end = std::max(end, tiles[j].end);
    RowRuns runs;
    int64_t row_nnz = 0;
    bool many = false;
    std::vector<size_t> active;  // into tiles
    size_t next = j0;
    for (int64_t q = tiles[j0].begin, m = 1; q < end; q += m) {
      // Rows alike by the spec (BoundPattern::row_block) take the row before's runs and counts.
      if (q == tiles[j0].begin || q / block != (q - 1) / block) {
        for (int64_t t64 : row64.touched()) row64.count[size_t(t64)] = 0;
        row64.nt = 0;
        if (bits_ok) {  // rows drawn as bits (random): a 64-key tile is a word
          pat.row_bits(q, bits[size_t(t)].data());
          row_nnz = word_counts(bits[size_t(t)].data(), int64_t(bits[size_t(t)].size()), row64.count.data(),
                                row64.tbuf.data(), row64.nt);
          many = true;
        } else {
          pat.row(q, runs);
          row_nnz = count_keys(runs);
          many = runs.size() > 64;  // (a few runs are counted per candidate at once)
          if (many) row64.add_runs(runs, 64);
        }
      }
      // The sample tiles holding row q: those begun (in order of their first rows) and not ended (a segment of
      // the unpermuted candidates' samples can span every row: scanning all its tiles a row was quadratic).
      while (next < j1 && tiles[next].begin <= q) active.push_back(next++);
      // Rows q .. q + m - 1: alike (one block) and in the same sample tiles (none begins or ends among them), added
      // to the tiles' counts once, m times (bigbird(64, ...)'s 64 rows a block were each added to every tile, its
      // global rows spanning every key tile: most of its choice).
      m = std::min((q / block + 1) * block, end) - q;
      if (next < j1) m = std::min(m, tiles[next].begin - q);
      for (size_t a : active) m = std::min(m, tiles[a].end - q);
      for (size_t a = 0; a < active.size();) {
        const Sample& tile = tiles[active[a]];
        if (q + m < tile.end) ++a;
        else active[a] = active.back(), active.pop_back();  // its last row (one tile a candidate at a time)
        TileScratch& ts = scr[tile.cand];
        const int sh = cands[shared[tile.cand]].block_n == 128 ? 1 : 0;
        if (!many) ts.add_runs(runs, cands[shared[tile.cand]].block_n, m);
        for (int64_t t64 : row64.touched()) {
          const int64_t kt = t64 >> sh;
          if (ts.count[size_t(kt)] == 0) ts.tbuf[ts.nt++] = kt;
          ts.count[size_t(kt)] += row64.count[size_t(t64)] * m;
        }
        nnz[tile.cand][size_t(tile.i)] += row_nnz * m;
        if (q + m < tile.end) continue;
        const Space& sp = spaces[tile.cand];
        std::vector<char>& f = full[tile.cand][size_t(tile.i)];
        for (int64_t kt : ts.touched()) {
          f.push_back(ts.full(kt, tile.end - tile.begin, sp));
          ts.count[size_t(kt)] = 0;
        }
        ts.nt = 0;
      }
    }
    for (int64_t t64 : row64.touched()) row64.count[size_t(t64)] = 0;
    row64.nt = 0;
  });
  for (size_t s = 0; s < shared.size(); ++s) {
    int64_t n = 0;
    for (int64_t x : nnz[s]) n += x;
    price(cands[shared[s]], spaces[s], full[s], n);
  }
}

// The shapes the fused GPU rows offer at `head_dim`, in table order, each priced by its TMA row where `tma`
// (sm_90a, no permutation) and one exists, else by its cp.async row; 192-row tiles exist only as TMA rows.
std::vector<Candidate> candidates(int64_t head_dim, int d, bool tma) {
  std::vector<Candidate> out;
  for (const KernelConfig& r : kKernels) {
    const bool cp = r.kind == KernelKind::sm90_cp, ws = r.kind == KernelKind::sm90_tma;
    if ((!cp && !ws) || r.head_dim != head_dim || (ws && (!tma || d != 1))) continue;
    auto same = std::find_if(out.begin(), out.end(), [&](const Candidate& c) {
      return c.block_m == r.block_m && c.block_n == r.block_n;
    });
    if (same == out.end()) out.push_back({r.block_m, r.block_n, d, &r, nullptr, nullptr});
    else if (ws) same->row = &r;
  }
  return out;
}

// The mapped candidates (a neighborhood grid of 2 or 3 axes): for each cp.async shape at `head_dim` (a forced
// shape: that one), the query and key boxes of least cost by the grid's windows (tile_map.hpp, best_boxes; priced
// by the cp.async row: the TMA rows load affine rows), unless they tile in row-major order anyway. forced
// (tile_map 1): grids of one axis too, and maps that are the identity (tests run the mapped kernels on them).
std::vector<Candidate> mapped_candidates(const Analysis& an, int64_t head_dim, int block_m, int block_n, bool forced) {
  std::vector<Candidate> out;
  if (!an.grid || grid_axes_used(*an.grid) < (forced ? 1 : 2)) return out;
  BoxScoreCache cache(*an.grid);
  for (const Candidate& c : candidates(head_dim, 1, false)) {
    if (block_m > 0 && (c.block_m != block_m || c.block_n != block_n)) continue;
    const BoxChoice b = best_boxes(*an.grid, c.block_m, c.block_n, c.row->partial_cost, &cache);
    if (!b.ok) continue;
    const GridTiling q = GridTiling::of(*an.grid, b.q), k = GridTiling::of(*an.grid, b.k);
    if (q.identity() && k.identity() && !forced) continue;
    Candidate m = c;
    m.maps = std::make_shared<const Maps>(q, k);
    // A lone neighborhood atom: the boxes' scores are the plan's own, counted axis by axis (tiling_scores, exact:
    // tile_map_test), and every query box visits a key box (each holds a token, whose window holds a coordinate at
    // least on every axis: neighborhood_window). Priced from them as estimate_cost prices a walk's counts, with every
    // query tile its sample: the walk of 48 sampled boxes for each of three shapes was a third of na2d's choice at
    // L = 16384, and its maps are built only if it is chosen (Maps::build).
    if (an.grid->exact) {
      const double tile = double(c.block_m) * c.block_n, full = b.scores.full / tile;
      const int64_t q_tiles = q.length() / c.block_m;
      m.cost = predicted_cost(*m.row, full, b.scores.visited / tile - full, double(q_tiles), tile);
      m.kept = b.scores.kept_fraction();
      m.priced = true;
    }
    out.push_back(std::move(m));
  }
  return out;
}

std::string candidate_name(const Candidate& c) {
  std::string s = std::to_string(c.block_m) + "x" + std::to_string(c.block_n);
  if (c.d > 1) s += " perm_d " + std::to_string(c.d);
  if (c.maps) s += " map " + c.maps->q.box.str(c.maps->q.naxes) + "/" + (c.strip ? std::string("strips") : c.maps->k.box.str(c.maps->k.naxes));
  return s;
}

// The strip candidate of a 64x64 mapped candidate (its query boxes): the strip plan, priced exactly (every strip a
// partial tile of the row); none where strips do not fit the pattern (*why: the reason).
std::optional<Candidate> strip_candidate(const BoundPattern& pat, const Candidate& boxes, std::string* why,
                                         bool device_masks) {
  if (!boxes.maps || boxes.block_m != 64 || boxes.block_n != 64) return std::nullopt;
  std::optional<BlockPlan> sp = build_strip_plan(pat, boxes.maps->q, why, device_masks);
  if (!sp) return std::nullopt;
  Candidate c = boxes;
  c.strip = std::make_shared<BlockPlan>(std::move(*sp));
  const BlockPlan& p = *c.strip;
  int64_t items = 0;
  for (int64_t qt = 0; qt < p.q_tiles; ++qt) items += p.row_offsets[size_t(qt) + 1] > p.row_offsets[size_t(qt)];
  c.cost = predicted_cost(*c.row, 0, double(p.nentries()), double(items), 64.0 * 64.0);
  c.kept = p.kept_fraction();
  c.priced = true;
  return c;
}

// Appends the strip candidates of the 64x64 mapped candidates among `mapped`.
// device_masks: their bitmasks left to the device where they can be (build_strip_plan).
void add_strip_candidates(const BoundPattern& pat, std::vector<Candidate>& mapped, std::string* why = nullptr,
                          bool device_masks = false) {
  const size_t n = mapped.size();
  for (size_t i = 0; i < n; ++i)
    if (std::optional<Candidate> c = strip_candidate(pat, mapped[i], why, device_masks)) mapped.push_back(std::move(*c));
}
}  // namespace

std::vector<ShapeCost> block_shape_costs(const BoundPattern& pat, const Analysis& an, int64_t head_dim, bool tma,
                                         int tile_map) {
  std::vector<Candidate> cands;
  const int d = an.permutation(kMaxGpuPermutation);
  for (int pd : d > 1 ? std::vector<int>{1, d} : std::vector<int>{1})
    for (const Candidate& c : candidates(head_dim, pd, tma)) cands.push_back(c);
  if (tile_map != 0) {
    std::vector<Candidate> m = mapped_candidates(an, head_dim, 0, 0, tile_map >= 1);
    if (tile_map != 1) add_strip_candidates(pat, m);
    for (Candidate& c : m)
      if (tile_map != 2 || c.strip) cands.push_back(std::move(c));
  }
  estimate_costs(pat, an, cands);
  std::vector<ShapeCost> out;
  for (const Candidate& c : cands)
    out.push_back({c.block_m, c.block_n, c.d, c.cost, c.kept, c.maps != nullptr, c.strip != nullptr,
                   c.maps ? c.maps->q.box : TileBox{}, c.maps ? c.maps->k.box : TileBox{}});
  return out;
}

bool drawn_masks_apply(const BoundPattern& pat, int bm, int bn) {
  const auto rs = pat.random_spec();
  const int64_t lq = pat.q_len(), lk = pat.k_len();
  if (!rs || lq == 0 || !device_draws_random(rs->r, lq, lk)) return false;
  // A row keeps none of w given keys with probability C(Lk - w, r) / C(Lk, r) <= (1 - w / Lk)^r, its rows drawn
  // independently: a tile of h rows by w keys is empty with probability at most (1 - w / Lk)^(r h). Summed over the
  // tiles (whole ones, and the last row and column of narrower ones).
  const int64_t qt = ceil_div(lq, bm), kt = ceil_div(lk, bn), h_last = lq - (qt - 1) * bm, w_last = lk - (kt - 1) * bn;
  auto empty = [&](int64_t h, int64_t w) { return std::exp(double(rs->r) * double(h) * std::log1p(-double(w) / double(lk))); };
  const double expected = double(qt - 1) * double(kt - 1) * empty(bm, bn) + double(qt - 1) * empty(bm, w_last) +
                          double(kt - 1) * empty(h_last, bn) + empty(h_last, w_last);
  return expected <= kDrawnEmptyTiles;
}

BlockPlan choose_block_plan(const BoundPattern& pat, const Analysis& an, int64_t head_dim, int block_m, int block_n,
                            int perm_d, bool tma, int tile_map, bool device_draw) {
  const auto t0 = std::chrono::steady_clock::now();
  if (tile_map < -1 || tile_map > 2)
    throw Error("block plan: tile_map must be -1 (chosen), 0 (never), 1 (always) or 2 (key strips), got " +
                std::to_string(tile_map));
  const bool forced = block_m > 0 && block_n > 0;
  if (tile_map == 2 && forced && (block_m != 64 || block_n != 64))
    throw Error("block plan: tile_map 2 (key strips) runs 64x64 tiles only, got " + std::to_string(block_m) + "x" +
                std::to_string(block_n));
  std::vector<Candidate> mapped;
  std::string strip_why = "no 64x64 kernel at this head dim";
  if (tile_map != 0 && perm_d < 1) {
    mapped = tile_map == 2 ? mapped_candidates(an, head_dim, 64, 64, true)
                           : mapped_candidates(an, head_dim, block_m, block_n, tile_map == 1);
    if (tile_map != 1) add_strip_candidates(pat, mapped, &strip_why, device_draw);
    if (tile_map == 2) std::erase_if(mapped, [](const Candidate& c) { return !c.strip; });
  }
  if (tile_map >= 1 && (perm_d >= 1 || mapped.empty()))
    throw Error("block plan: tile_map " + std::to_string(tile_map) +
                (tile_map == 1 ? " (multi-dimensional tiles)" : " (key strips)") + " for '" + pat.spec() + "' at head dim " +
                std::to_string(head_dim) + (forced ? ", tiles " + std::to_string(block_m) + "x" + std::to_string(block_n) : "") +
                ": " + (perm_d >= 1 ? "a permutation is forced (perm_d " + std::to_string(perm_d) + ")"
                        : !an.grid ? std::string("the pattern has no neighborhood grid")
                        : tile_map == 2 && grid_axes_used(*an.grid) > 0 ? strip_why
                                   : std::string("no box of the tile sizes fits its grid")));
  std::vector<int> perms;
  if (perm_d >= 1) {
    perms = {perm_d};
  } else {
    const int d = an.permutation(kMaxGpuPermutation);
    perms = {1};
    if (d > 1) perms.push_back(d);
  }
  // Band rows on the TMA kernel's device: the band kernel multiplies 64-row slabs over 64-key chunks, so the tile's
  // height costs no area there, and 192-row items (128 at head dim 128) share each chunk among three (two) consumer
  // warpgroups (bench/LOG.md).
  const int band_bm = band_block_m(head_dim);
  const bool band_plan = block_m <= 0 && tma && band_bm > 0 && perm_d <= 1 && tile_map < 1 &&
                         (an.band.ok || an.window.ok || (an.sinks.ok && an.prefix <= kBandPrefixMax)) &&
                         find_kernel(KernelKind::sm90_band, band_bm, 128, int(head_dim)) >= 0;
  int bm = band_plan ? band_bm : 192, bn = 128, bd = 1;
  std::shared_ptr<const Maps> maps;
  std::shared_ptr<BlockPlan> strip;
  std::vector<BlockPlan::PricedShape> choice;
  if (!band_plan) {
    std::vector<Candidate> cands;
    if (tile_map < 1)
      for (int d : perms)
        for (const Candidate& c : candidates(head_dim, d, tma))
          if (!forced || (c.block_m == block_m && c.block_n == block_n)) cands.push_back(c);
    for (Candidate& c : mapped) cands.push_back(std::move(c));
    if (forced) bm = block_m, bn = block_n, bd = perms[0];  // also where no row has the shape (can_implement says so)
    if (cands.empty() && !forced)
      throw Error("block plan: the kernel table has no fused GPU kernel at head dim " + std::to_string(head_dim));
    if (cands.size() > 1) {
      estimate_costs(pat, an, cands, device_draw);
      for (const Candidate& c : cands)
        choice.push_back({candidate_name(c), c.cost / double(std::max<int64_t>(an.nnz, 1)), c.kept});
    }
    if (!cands.empty()) {
      size_t best = 0;
      for (size_t i = 1; i < cands.size(); ++i)  // in order: ties keep the earlier candidate
        if (cands[i].cost < cands[best].cost) best = i;
      bm = cands[best].block_m, bn = cands[best].block_n, bd = cands[best].d, maps = cands[best].maps;
      strip = cands[best].strip;
    }
  }
  const double choice_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const bool drawn = device_draw && !strip && !maps && bd == 1 && drawn_masks_apply(pat, bm, bn);
  BlockPlan p = strip ? std::move(*strip) : build_plan(pat, bm, bn, bd, &an, maps.get(), drawn);
  p.choice = std::move(choice);
  p.choice_ms = choice_ms;
  p.build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return p;
}

}  // namespace spattn::plan
