// plan/gpu/tiles.hpp — what the GPU tile planner's files share (internal to src/plan/gpu): the plan-space geometry
// (Space, Maps), counting a query tile's rows by key tile (TileScratch), the row bits, the closed-form key tiles of band
// rows and of rows alike by blocks, and the builders' entry points. The public side is block_plan.hpp.
#pragma once
#include <algorithm>
#include <climits>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "plan/gpu/block_plan.hpp"

namespace spattn::plan::gpu {

inline constexpr int64_t kNegInf = -(int64_t(1) << 30);  // band bounds that never bind
inline constexpr int64_t kPosInf = (int64_t(1) << 30);

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }  // b > 0, any sign of a
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

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
  inline ATTR int64_t bit_keys##SUFFIX(const uint64_t* b, int64_t n) {                                                  \
    int64_t keys = 0;                                                                                            \
    for (int64_t w = 0; w < n; ++w) keys += __builtin_popcountll(b[w]);                                         \
    return keys;                                                                                                 \
  }                                                                                                              \
  inline ATTR int64_t word_counts##SUFFIX(const uint64_t* b, int64_t n, int64_t* count, int64_t* touched, size_t& nt) { \
    int64_t keys = 0;                                                                                            \
    for (int64_t w = 0; w < n; ++w)                                                                              \
      if (const int64_t c = __builtin_popcountll(b[w])) count[w] = c, touched[nt++] = w, keys += c;              \
    return keys;                                                                                                 \
  }
SPATTN_ROW_BITS_FUNCTIONS(_generic, )
#if defined(__x86_64__) && defined(__GNUC__)
SPATTN_ROW_BITS_FUNCTIONS(_popcnt, __attribute__((target("popcnt"))))
inline bool have_popcnt() {
  static const bool v = __builtin_cpu_supports("popcnt");
  return v;
}
#else
inline bool have_popcnt() { return false; }
#define bit_keys_popcnt bit_keys_generic
#define word_counts_popcnt word_counts_generic
#endif
#undef SPATTN_ROW_BITS_FUNCTIONS
inline int64_t bit_keys(const uint64_t* b, int64_t n) { return have_popcnt() ? bit_keys_popcnt(b, n) : bit_keys_generic(b, n); }
inline int64_t word_counts(const uint64_t* b, int64_t n, int64_t* count, int64_t* touched, size_t& nt) {
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

// Worker threads for building a plan: about 2^15 row x key units a thread at least (a scattered pattern's row
// costs O(Lk)).
int64_t plan_threads(int64_t q_tiles, int64_t k_len);

// Collects the plan-space runs of every row of query tile qt into rows[0, bm) (rows past the end: none);
// returns the number of valid rows. nruns: the runs of them all. same (where given, unpermuted and unmapped): rows
// alike by the spec (BoundPattern::row_block) are marked 1 and left empty, not drawn, counted or copied: their runs
// are those of the last row before them marked 0 (the copies were a tenth of sparse_fixed's forward plan).
int64_t tile_rows(const BoundPattern& pat, const Space& sp, int64_t qt, RowRuns& tmp, std::vector<RowRuns>& rows,
                  int64_t& nruns, int64_t& nnz, std::vector<char>* same = nullptr);

// Tries to describe a partial tile's mask as a band lo <= kp - qp <= hi (restricted to the tile's valid
// keys). Rows whose token is out of range are don't-cares.
// scratch: 2 * bm entries, reused between calls.
bool detect_band(const uint64_t* mask, const Space& sp, int64_t qt, int64_t kt, int64_t kvalid, int64_t& lo_out,
                 int64_t& hi_out, std::vector<int64_t>& scratch);

// The launch order of a plan's query tiles (BlockPlan::order): most entries first (entries.cpp).
void order_by_entries(BlockPlan& plan);

// A plan of bm x bn tiles and permutation d (entries.cpp). analysis: analyze(pat) where the caller has it already
// (its band rows), else computed here. maps: a mapped plan space (then d is 1 and bm, bn the boxes' volumes).
// drawn: the bitmasks left to the device (BlockPlan::drawn; drawn_masks_apply holds, d is 1, no maps).
BlockPlan build_plan(const BoundPattern& pat, int bm, int bn, int d, const Analysis* analysis, const Maps* maps = nullptr,
                     bool drawn = false);

// The entries and bitmasks of any pattern from its rows (BoundPattern::row), query tiles on worker threads (walk.cpp).
void build_walked(BlockPlan& plan, const BoundPattern& pat, const Space& sp);

}  // namespace spattn::plan::gpu
