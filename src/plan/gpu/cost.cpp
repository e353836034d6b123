// plan/gpu/cost.cpp — the planner's cost model: each candidate tile shape (and permutation, tile map, key strips)
// priced by its kernel-table row from a sample of query tiles, or in closed form where the analysis allows
// (cost.hpp).
#include <cmath>
#include <memory>

#include "common/parallel.hpp"
#include "plan/gpu/cost.hpp"

namespace spattn::plan {
namespace gpu {
namespace {

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
  const double scale = double(sp.q_tiles) / double(std::max<int64_t>(samples, 1));
  c.cost = predicted_cost(*c.row, double(n_full), double(n_partial), double(items), tile) * scale;
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

}  // namespace

// estimate_cost of every candidate. Those without a permutation sample query tiles of consecutive rows, and
// their samples overlap (a 64-row tile's rows are those of a 128-row one; random(820) at L = 16384 walked
// 12288 rows for three shapes, 6144 distinct): each distinct row is walked once, on the plan threads, and fed
// to every candidate tile holding it. The per-sample results are summed as estimate_cost sums them.
void estimate_costs(const BoundPattern& pat, const Analysis& an, std::vector<Candidate>& cands, bool device_draw) {
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
void add_strip_candidates(const BoundPattern& pat, std::vector<Candidate>& mapped, std::string* why,
                          bool device_masks) {
  const size_t n = mapped.size();
  for (size_t i = 0; i < n; ++i)
    if (std::optional<Candidate> c = strip_candidate(pat, mapped[i], why, device_masks)) mapped.push_back(std::move(*c));
}

}  // namespace gpu

using namespace gpu;

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

}  // namespace spattn::plan
