// plan/gpu/entries.cpp — a tile plan's entries: in closed form for band rows (also inside residue groups) and rows
// alike by blocks, every tile a device-drawn bitmask for random rows, else from the rows' walk (walk.cpp); the plan's
// launch order; build_plan, which picks the builder (tiles.hpp, block_plan.hpp).
#include <chrono>
#include <numeric>

#include "plan/gpu/tiles.hpp"

namespace spattn::plan {
namespace gpu {
namespace {

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

}  // namespace

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

BlockPlan build_plan(const BoundPattern& pat, int bm, int bn, int d, const Analysis* analysis, const Maps* maps,
                     bool drawn) {
  const auto t0 = std::chrono::steady_clock::now();
  if ((bm != 64 && bm != 128 && bm != 192) || (bn != 64 && bn != 128))  // for_each_tile_span shifts by bn
    throw Error("block plan: tiles must be 64, 128 or 192 query rows by 64 or 128 keys, got " + std::to_string(bm) + "x" +
                std::to_string(bn));
  if (d < 1 || d > kMaxGpuPermutation)
    throw Error("block plan: perm_d must be in [1, " + std::to_string(kMaxGpuPermutation) + "], got " + std::to_string(d));
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

}  // namespace gpu

BlockPlan build_block_plan(const BoundPattern& pat, int bm, int bn, int d, const Analysis* analysis) {
  return gpu::build_plan(pat, bm, bn, d, analysis);
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
  const gpu::Maps maps(q, k);
  return gpu::build_plan(pat, int(q.box.volume()), int(k.box.volume()), 1, nullptr, &maps);
}

}  // namespace spattn::plan
