// plan/analysis.cpp — see analysis.hpp.
#include "plan/analysis.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <climits>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <sstream>
#include <thread>
#include <vector>

#include "common/parallel.hpp"
#include "plan/tile_map.hpp"
#include "spattn/format.hpp"

namespace spattn::plan {

int plan_thread_cap() {
  int cap = std::min(32, common::hardware_threads());
  if (const char* env = std::getenv("SPATTN_PLAN_THREADS")) {
    const long v = std::strtol(env, nullptr, 10);
    if (v >= 1) cap = int(std::min<long>(cap, v));
  }
  return cap;
}

bool general_paths_only() {
  const char* env = std::getenv("SPATTN_PLAN_GENERAL");
  return env && env[0] == '1';
}

namespace {

int64_t residue_stride(const BoundPattern& pat) {
  const int64_t lq = pat.q_len();
  int64_t g = 0;
  RowRuns runs;
  for (int64_t q : {lq / 2, lq / 3, (2 * lq) / 3, lq - 1, int64_t(0)}) {
    if (q < 0 || q >= lq) continue;
    pat.row(q, runs);
    for (const Run& r : runs) {
      if (r.count <= 1) continue;
      if (r.stride == 1) return 1;
      g = std::gcd(g, r.stride);
    }
  }
  return g >= 2 ? g : 1;
}

// One thread's share of the row walk.
struct Part {
  int64_t nnz = 0, empty = 0, dense = 0;
  int64_t min_row = INT64_MAX, max_row = 0;
  int64_t lo = INT64_MAX, hi = INT64_MIN;  // band bounds over the rows that are one interval
  bool single = true;                      // every nonempty row is one interval
  // Sinks check: every nonempty row one interval, or [0, g) and one interval after it (g the same in every row);
  // slo: the least k - q of those rows' second intervals.
  bool sinks = true;
  int64_t g = -1, slo = INT64_MAX;
};

// The row walk's counts for rows whose key count is piecewise linear in q, linear between consecutive `cuts` (which
// include 0 and lq): nnz, empty, dense, least and most keys a row, from the ends of the pieces.
template <class Keys>
void count_rows_in_pieces(Analysis& a, std::vector<int64_t> cuts, Keys&& keys) {
  const int64_t lq = a.q_len, lk = a.k_len;
  for (int64_t& c : cuts) c = std::clamp<int64_t>(c, 0, lq);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  a.min_row = INT64_MAX;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    const int64_t q0 = cuts[i], q1 = cuts[i + 1] - 1;
    const int64_t k0 = keys(q0), k1 = keys(q1);
    a.nnz += (k0 + k1) * (q1 - q0 + 1) / 2;
    a.min_row = std::min({a.min_row, k0, k1});
    a.max_row = std::max({a.max_row, k0, k1});
    // Rows of count c in the piece: all where it is constant, else the one q (if whole) where the line meets c.
    auto rows_of = [&](int64_t c) -> int64_t {
      if (k0 == k1) return k0 == c ? q1 - q0 + 1 : 0;
      const int64_t num = (c - k0) * (q1 - q0), den = k1 - k0;
      return num % den == 0 && num / den >= 0 && num / den <= q1 - q0 ? 1 : 0;
    };
    a.empty_rows += rows_of(0);
    a.dense_rows += rows_of(lk);
  }
}

// The row walk's results for band rows (BoundPattern::band: offsets lo <= 0 <= hi, as every band of the spec has),
// in closed form. Row q keeps [max(0, q + lo), min(lk - 1, q + hi)]: rows 0 .. n - 1 keep keys, n = min(lq, lk - lo);
// cut where either end stops being clamped, a row's count is linear in q.
void band_in_closed_form(Analysis& a, int64_t lo, int64_t hi) {
  const int64_t lq = a.q_len, lk = a.k_len;
  const int64_t n = std::clamp<int64_t>(lk - lo, 0, lq);  // rows keeping keys (q + lo <= lk - 1)
  count_rows_in_pieces(a, {0, n, lq, -lo, lk - 1 - hi}, [&](int64_t q) {
    return q >= n ? 0 : std::min(lk - 1, q + hi) - std::max<int64_t>(0, q + lo) + 1;
  });
  // The offsets the rows show: the least first key - q at the last row keeping keys, the most last key - q at row 0.
  const int64_t shown_lo = std::max(-(n - 1), lo), shown_hi = std::min(lk - 1, hi);
  a.band = {true, int32_t(std::max(shown_lo, -lq)), int32_t(std::min(shown_hi, lk))};
}

// The same for band rows with a key prefix [0, g) and dense rows [0, r) (BoundPattern::band_spec: sliding windows
// with sinks, longformer) where some row past r keeps the two apart (q + lo > g for a row whose band keeps keys):
// what the walk's sinks check finds. Such a row keeps g keys plus its band's past the prefix; without dense rows the
// band's lo shows in those rows, its hi at the first row whose band reaches key g; with them the check fails at row
// r, whose band ends before the last key (required here). False (the walk decides) where these do not hold.
bool sinks_in_closed_form(Analysis& a, int64_t lo, int64_t hi, int64_t g, int64_t r) {
  const int64_t lq = a.q_len, lk = a.k_len;
  const int64_t n = std::clamp<int64_t>(lk - lo, 0, lq);  // rows whose band keeps keys
  if (g < 1 || g >= lk || std::max<int64_t>(r, g - lo + 1) > n - 1 || (r > 0 && r + hi >= lk - 1)) return false;
  count_rows_in_pieces(a, {0, r, n, lq, -lo, lk - 1 - hi, g - lo, g - lo + 1, g - 1 - hi, g - hi}, [&](int64_t q) {
    if (q < r) return lk;
    if (q >= n) return g;
    const int64_t s = std::max<int64_t>(0, q + lo), e = std::min(lk - 1, q + hi);
    return g + (e - s + 1) - std::max<int64_t>(0, std::min(g - 1, e) - s + 1);
  });
  if (r == 0) {
    const int64_t q_min = std::max<int64_t>(0, g - hi);  // the first row whose band reaches key g
    a.sinks = {true, int32_t(lo), int32_t(std::min({lk - 1 - q_min, hi, lk}))};
    a.prefix = int32_t(g);
  }
  return true;
}

// The row walk's results for dilated band rows (BoundPattern::dilated_band, d >= 2, lo <= 0 <= hi) in closed form,
// group by group: the rows q = g + j d of residue group g keep the group's keys g + j' d with lo <= j' - j <= hi, band
// rows of the group's lengths (band_in_closed_form; a group's dense rows and band are not the pattern's: no row keeps
// every key, Lk > d leaving keys of another residue). The walk finds no band, window or sinks rows: residue_stride saw
// a row of several keys d apart.
void groups_in_closed_form(Analysis& a, int64_t lo, int64_t hi, int64_t d) {
  a.min_row = INT64_MAX;
  for (int64_t g = 0; g < d && g < a.q_len; ++g) {
    Analysis grp;
    grp.q_len = residue_group_len(a.q_len, g, d);
    grp.k_len = residue_group_len(a.k_len, g, d);
    band_in_closed_form(grp, lo, hi);
    a.nnz += grp.nnz;
    a.empty_rows += grp.empty_rows;
    a.min_row = std::min(a.min_row, grp.min_row);
    a.max_row = std::max(a.max_row, grp.max_row);
  }
  a.groups = {true, int32_t(lo), int32_t(hi)};
}

// Whether the row walk finds no band, window or sinks rows in rows alike by block rows (spans: the rows' runs, no
// strided one; block rows of `rows` rows each, the last one clipped to Lq), without walking them; false where it may:
//  - a row of three spans or more is neither one interval (band and window rows) nor [0, g) and one more (sinks rows);
//  - else, where a row keeps two spans (not one interval: no band or window rows), no sinks rows where such a row's
//    first span does not start at key 0 or two such rows' first spans differ (the walk's sinks rows share one [0, g));
//  - else (every row one interval or none): band rows keep the same interval in two consecutive rows only where both
//    ends are clamped (every key), shifted windows only where one end is (the first W keys or the last), and the walk
//    takes a window's offset from a row starting inside (0, Lk - W): so no band rows where a block row of two rows or
//    more keeps some keys but not all, and no window rows where rows keep unequal counts, or none starts inside or one
//    of a block row of two rows or more does.
bool walk_finds_none(const BlockRows& br, int64_t lq, int64_t lk) {
  const int64_t n = br.block_rows();
  auto spans = [&](int64_t i) { return br.offsets[size_t(i) + 1] - br.offsets[size_t(i)]; };
  auto rows = [&](int64_t i) { return std::min(lq, (i + 1) * br.block) - i * br.block; };
  int64_t most = 0;
  for (int64_t i = 0; i < n; ++i) most = std::max(most, spans(i));
  if (most >= 3) return true;
  if (most == 2) {
    int64_t g = -1;
    for (int64_t i = 0; i < n; ++i) {
      if (spans(i) != 2) continue;
      const auto [first, end] = br.spans[size_t(br.offsets[size_t(i)])];
      if (first != 0 || (g >= 0 && end != g)) return true;
      g = end;
    }
    return false;
  }
  bool no_band = false;
  int64_t w_min = INT64_MAX, w_max = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t keys = br.keys(i);
    no_band = no_band || (rows(i) >= 2 && keys > 0 && keys < lk);
    w_min = std::min(w_min, keys), w_max = std::max(w_max, keys);
  }
  if (!no_band) return false;
  if (w_min != w_max || w_min == 0 || w_min >= lk) return true;
  bool inside = false;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t first = br.spans[size_t(br.offsets[size_t(i)])].first;
    if (first > 0 && first < lk - w_min) {
      if (rows(i) >= 2) return true;
      inside = true;
    }
  }
  return !inside;
}

// The block rows of rows alike by blocks: blocked(b, inner) (BoundPattern::blocked: bigbird) from inner's rows (one a
// block row, where the walk draws one a block row and copies it to each of its rows), else rows alike by the spec
// (BoundPattern::row_block b >= 2: block_diag, sparse_fixed's parts), one row drawn a block (the rows of a block have
// the same runs: each atom's row is a function of its block). None where a row has a strided run (*strided set;
// blocked: a span a block, O(its keys), where the walk's runs are O(1)) or the walk may find band, window or sinks rows
// (walk_finds_none: left to it).
std::shared_ptr<const BlockRows> block_rows(const BoundPattern& pat, bool& strided) {
  const auto bl = pat.blocked();
  const int64_t lq = pat.q_len(), lk = pat.k_len(), b = bl ? bl->block : pat.row_block();
  if (!bl && b < 2) return nullptr;
  auto br = std::make_shared<BlockRows>();
  const int64_t n = bl ? bl->inner.q_len() : (lq + b - 1) / b, scale = bl ? b : 1;
  br->block = b;
  br->offsets.resize(size_t(n) + 1);
  RowRuns runs;
  for (int64_t i = 0; i < n; ++i) {
    const size_t begin = br->spans.size();
    br->offsets[size_t(i)] = int64_t(begin);
    if (bl) bl->inner.row(i, runs);
    else pat.row(i * b, runs);
    for (const Run& r : runs) {  // ordered by start (RowRuns)
      if (r.stride != 1 && r.count > 1) return strided = true, nullptr;
      const int32_t first = int32_t(r.start * scale), end = int32_t(std::min(lk, (r.start + r.count) * scale));
      if (br->spans.size() > begin && first == br->spans.back().second)  // (a single key's run may touch an interval)
        br->spans.back().second = end;
      else
        br->spans.push_back({first, end});
    }
  }
  br->offsets[size_t(n)] = int64_t(br->spans.size());
  return walk_finds_none(*br, lq, lk) ? br : nullptr;
}

// The row walk's counts for rows alike by blocks of b rows: block row i's rows keep keys(i) keys each.
template <class Keys>
void count_alike_rows(Analysis& a, int64_t b, int64_t block_rows, Keys&& keys) {
  const int64_t lq = a.q_len, lk = a.k_len;
  a.min_row = INT64_MAX;
  for (int64_t i = 0; i < block_rows; ++i) {
    const int64_t rows = std::min(lq, (i + 1) * b) - i * b, n = keys(i);
    a.nnz += n * rows;
    a.empty_rows += n == 0 ? rows : 0;
    a.dense_rows += n == lk ? rows : 0;
    a.min_row = std::min(a.min_row, n);
    a.max_row = std::max(a.max_row, n);
  }
}

// The row walk's results for rows alike by blocks by their block rows (block_rows): a row's keys are its block row's,
// counted once for its rows. The walk finds no band, window or sinks rows (walk_finds_none); no row has a strided run,
// so the residue stride is 1.
void blocks_in_closed_form(Analysis& a, std::shared_ptr<const BlockRows> br) {
  count_alike_rows(a, br->block, br->block_rows(), [&](int64_t i) { return br->keys(i); });
  a.residue = 1;
  a.blocks = std::move(br);
}

// The parts' row counts into a: nnz, empty and dense rows, least and most keys a row.
void add_counts(Analysis& a, const std::vector<Part>& parts) {
  a.min_row = INT64_MAX;
  for (const Part& p : parts) {
    a.nnz += p.nnz;
    a.empty_rows += p.empty;
    a.dense_rows += p.dense;
    a.min_row = std::min(a.min_row, p.min_row);
    a.max_row = std::max(a.max_row, p.max_row);
  }
}

// Whether the walk's band and sinks checks both fail at a row of these runs: neither one interval nor [0, g) and one
// interval after it.
bool fails_band_checks(const RowRuns& runs) {
  auto interval = [](const Run& r) { return r.stride == 1 || r.count == 1; };
  return !runs.empty() && !(runs.size() == 1 && interval(runs[0])) &&
         !(runs.size() == 2 && runs[0].start == 0 && interval(runs[0]) && interval(runs[1]));
}

// The row walk's results for band rows united with random(r)'s (BoundPattern::band_random: local(w) | random(r), the
// suite's bandrand), 1 <= r < Lk: row q keeps its band's clipped interval and those of its r drawn keys outside it
// (random_rows_keys), counted without merging the row's runs (the walk's union rows, local(256) | random(4) at
// L = 16384: 1.3 ms on one thread of the 2-core machine). Where some row fails the walk's band and sinks checks (found
// by the runs of the first rows of a chunk), the walk finds no band, window or sinks rows; false (the walk decides)
// where none of the rows looked at does.
bool band_random_in_closed_form(Analysis& a, const BoundPattern& pat, int64_t lo, int64_t hi, int64_t r, uint64_t seed) {
  const int64_t lq = a.q_len, lk = a.k_len;
  const int threads = int(std::clamp<int64_t>(lq / 1024, 1, plan_thread_cap()));
  const int64_t nchunks = std::min<int64_t>(lq, int64_t(threads) * 8);
  std::vector<Part> parts(static_cast<size_t>(nchunks));
  std::atomic<bool> apart{false};
  constexpr int64_t kLooked = 8;  // rows a chunk looks at by their runs (row 0 of local(256) | random(4) fails)
  common::parallel_for(nchunks, threads, [&](int64_t c, int) {
    Part& p = parts[size_t(c)];
    const int64_t q0 = c * lq / nchunks, q1 = (c + 1) * lq / nchunks;
    RowRuns runs;
    for (int64_t q = q0; q < std::min(q1, q0 + kLooked) && !apart.load(std::memory_order_relaxed); ++q) {
      pat.row(q, runs);
      if (fails_band_checks(runs)) apart.store(true, std::memory_order_relaxed);
    }
    std::vector<int32_t> keys;
    const int64_t batch = std::max<int64_t>(1, 4096 / r);  // rows drawn at a time (16 KiB of keys)
    Part t;  // (counted here, not in parts: a store a row of each count, 0.185 -> 0.17 ms on one thread)
    for (int64_t b = q0; b < q1; b += batch) {
      const int64_t be = std::min(q1, b + batch);
      random_rows_keys(seed, r, b, be, lk, keys);
      const int32_t* k = keys.data();
      for (int64_t q = b; q < be; ++q, k += r) {
        const int64_t s = std::max<int64_t>(0, q + lo), e = std::min(lk - 1, q + hi);
        int64_t n = std::max<int64_t>(0, e - s + 1);
        for (int64_t i = 0; i < r; ++i) n += k[i] < s || k[i] > e;
        t.nnz += n;
        t.empty += n == 0;
        t.dense += n == lk;
        t.min_row = std::min(t.min_row, n);
        t.max_row = std::max(t.max_row, n);
      }
    }
    p = t;
  });
  if (!apart.load()) return false;
  add_counts(a, parts);
  return true;
}

// A lone neighborhood atom (NeighborhoodGrid::exact) keeps, for query q, the product of its coordinates' axis windows,
// so its counts are products of the axes' own: nnz the product of each axis's window sizes summed over its
// coordinates, the least and most keys a row the products of the least and most window sizes, the dense rows those
// whose windows are whole axes on every axis (no row is empty: a window holds a coordinate at least). Where some row
// is neither one interval nor an interval after a key prefix (the middle query's, whose windows are the widest), no
// band, window or sinks rows are possible, so nothing else needs the rows: true, a filled in O(axis sizes). Else
// false (the walk decides). na2d 128x128 K=13 at L = 16384: the walk was 0.11-0.13 ms on two threads.
bool grid_in_closed_form(Analysis& a, const BoundPattern& pat) {
  if (!a.grid || !a.grid->exact || a.q_len != a.k_len) return false;
  const NeighborhoodGrid& g = *a.grid;
  int64_t mid = 0;  // the middle query: every axis's middle coordinate
  for (int ax = 0; ax < g.naxes; ++ax) mid = mid * g.dims[size_t(ax)] + g.dims[size_t(ax)] / 2;
  RowRuns runs;
  pat.row(mid, runs);
  if (!fails_band_checks(runs)) return false;
  int64_t nnz = 1, lo = 1, hi = 1, dense = 1;
  for (const std::vector<Run>& axis : axis_windows(g)) {  // (a leading axis of size 1: one window of one, a factor 1)
    int64_t sum = 0, mn = INT64_MAX, mx = 0, whole = 0;
    for (const Run& w : axis)
      sum += w.count, mn = std::min(mn, w.count), mx = std::max(mx, w.count), whole += w.count == int64_t(axis.size());
    nnz *= sum, lo *= mn, hi *= mx, dense *= whole;
  }
  a.nnz = nnz;
  a.min_row = lo;
  a.max_row = hi;
  a.dense_rows = dense;
  a.empty_rows = 0;
  return true;
}

// The row walk's results for rows alike by the spec (BoundPattern::row_block b >= 2) with strided runs, where
// block_rows makes no block rows (the whole of sparse_fixed: its block and its summary columns, one strided run): one
// row drawn a block row, its keys counted for its rows, where some row fails the walk's band and sinks checks
// (fails_band_checks: the walk finds no band, window or sinks rows); false (the walk decides) where none does. The
// residue stride is the walk's (residue_stride).
bool alike_in_closed_form(Analysis& a, const BoundPattern& pat) {
  const int64_t b = pat.row_block(), n = (a.q_len + b - 1) / b;
  if (b < 2) return false;
  std::vector<int64_t> keys(static_cast<size_t>(n));
  RowRuns runs;
  bool fails = false;
  for (int64_t i = 0; i < n; ++i) {
    if (fails) {  // (counted, not drawn: a blocked row's count is O(its inner row's runs), its keys O(b runs))
      keys[size_t(i)] = pat.row_nnz(i * b);
      continue;
    }
    pat.row(i * b, runs);
    keys[size_t(i)] = count_keys(runs);
    fails = fails_band_checks(runs);
  }
  if (!fails) return false;
  count_alike_rows(a, b, n, [&](int64_t i) { return keys[size_t(i)]; });
  a.residue = residue_stride(pat);
  return true;
}

}  // namespace

Analysis analyze(const BoundPattern& pat) {
  const auto t0 = std::chrono::steady_clock::now();
  Analysis a;
  const int64_t lq = pat.q_len(), lk = pat.k_len();
  a.q_len = lq;
  a.k_len = lk;
  if (lq > 0 && lk > 0) a.grid = pat.neighborhood_grid();
  // Rows alike by blocks (bigbird, block_diag, sparse_fixed) by their block rows, each drawn once: no row walked.
  if (lq > 0 && lk > 0 && !general_paths_only()) {
    bool strided = false;
    std::shared_ptr<const BlockRows> br = block_rows(pat, strided);
    if (br) blocks_in_closed_form(a, std::move(br));
    // (Rows with no strided run that walk_finds_none leaves to the walk fail no band check either: not drawn again.)
    if (a.blocks || (strided && alike_in_closed_form(a, pat))) {
      a.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      return a;
    }
  }
  if (lq > 0 && lk > 0) a.residue = residue_stride(pat);
  if (lq > 0 && lk > 0 && !general_paths_only() && grid_in_closed_form(a, pat)) {
    a.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return a;
  }
  // Band rows by the spec (local, causal, dense, ...), with or without a key prefix: no row walked.
  if (lq > 0 && lk > 0 && !general_paths_only()) {
    const auto b = pat.band_spec();
    const bool plain = b && b->key_prefix == 0 && b->row_prefix == 0;
    if (b && b->lo <= 0 && b->hi >= 0 && b->key_prefix < (int64_t(1) << 30) &&
        (plain ? (band_in_closed_form(a, b->lo, b->hi), true)
               : sinks_in_closed_form(a, b->lo, b->hi, b->key_prefix, b->row_prefix))) {
      a.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      return a;
    }
    // Dilated band rows by the spec (dilated(w, d), with causal, ...): band rows in each residue group.
    const auto db = b ? std::nullopt : pat.dilated_band();
    if (db && db->d >= 2 && db->d == a.residue && lk > db->d && db->lo <= 0 && db->hi >= 0 && db->hi - db->lo >= 1 &&
        db->hi - db->lo < (int64_t(1) << 30)) {
      groups_in_closed_form(a, db->lo, db->hi, db->d);
      a.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      return a;
    }
    // Band rows and random rows (local(w) | random(r)): counted by the random rows' keys outside the band.
    const auto br = b || db ? std::nullopt : pat.band_random();
    if (br && br->random.r >= 1 && br->random.r < lk &&
        band_random_in_closed_form(a, pat, br->lo, br->hi, br->random.r, br->random.seed)) {
      a.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      return a;
    }
  }
  // Rows' first and last keys where every row is one interval (band check, second pass); rows of two intervals
  // (sinks check): the second interval's, with the first's length in prefix. Left unwritten (new[]: no page touched)
  // but for the rows walked while band rows are possible, which the checks below read only where every row was:
  // filled up front (320 KB set and faulted in at L = 16384) they were a sixth of sprandom's analysis, whose rows fail
  // the checks at each chunk's first row (random(81): 0.083 -> 0.069 ms, one thread), and most of sparse_fixed's before
  // its rows were counted by blocks (0.047 -> 0.013).
  const std::unique_ptr<int64_t[]> first(new int64_t[size_t(lq)]), last(new int64_t[size_t(lq)]);
  const std::unique_ptr<int32_t[]> prefix(new int32_t[size_t(lq)]);
  const int threads = int(std::clamp<int64_t>(lq / 1024, 1, plan_thread_cap()));
  const int64_t nchunks = std::min<int64_t>(lq, int64_t(threads) * 8);
  std::vector<Part> parts(size_t(std::max<int64_t>(nchunks, 1)));
  const int64_t block = general_paths_only() ? 1 : pat.row_block();  // rows alike by the spec
  common::parallel_for(nchunks, threads, [&](int64_t c, int) {
    Part& p = parts[size_t(c)];
    RowRuns runs;
    int64_t n = 0;
    // bend: the end of the block of the last row drawn (no division a row: two were a seventh of sparse_fixed's plan).
    for (int64_t q = c * lq / nchunks, bend = q, qe = (c + 1) * lq / nchunks, m = 1; q < qe; q += m) {
      // While the rows can still be band rows, their runs; after the first row that is not one interval, only
      // their key counts (row_nnz: O(1) a row for random, whose rows are the costly ones to draw). A row alike the
      // one before (blocked(b, ...)) keeps its runs and count; once no band is possible, the rest of its block is
      // counted with it (m rows).
      const bool alike = q < bend;
      const bool band_possible = p.single || p.sinks;
      if (!alike && block > 1) bend = (q / block + 1) * block;
      if (!alike && band_possible) {
        pat.row(q, runs);
        n = 0;
        for (const Run& r : runs) n += r.count;
      } else if (!alike) {
        n = pat.row_nnz(q);
      }
      m = band_possible || block == 1 ? 1 : std::min(bend, qe) - q;
      p.nnz += n * m;
      p.empty += (n == 0) * m;
      p.dense += (n == lk && n > 0) * m;  // (with Lk = 0 a row is empty, not dense)
      p.min_row = std::min(p.min_row, n);
      p.max_row = std::max(p.max_row, n);
      if (!band_possible) continue;
      first[size_t(q)] = last[size_t(q)] = -1;
      prefix[size_t(q)] = 0;
      if (runs.empty()) continue;
      auto interval = [](const Run& r) { return r.stride == 1 || r.count == 1; };
      if (runs.size() == 2 && p.sinks && runs[0].start == 0 && interval(runs[0]) && interval(runs[1]) &&
          (p.g < 0 || p.g == runs[0].count) && runs[0].count < (int64_t(1) << 30)) {
        p.single = false;
        p.g = runs[0].count;
        prefix[size_t(q)] = int32_t(runs[0].count);
        first[size_t(q)] = runs[1].start;
        last[size_t(q)] = runs[1].last();
        p.slo = std::min(p.slo, runs[1].start - q);
        continue;
      }
      if (runs.size() != 1 || !interval(runs[0])) {
        p.single = p.sinks = false;
        continue;
      }
      first[size_t(q)] = runs[0].start;
      last[size_t(q)] = runs[0].last();
      p.lo = std::min(p.lo, runs[0].start - q);
      p.hi = std::max(p.hi, runs[0].last() - q);
    }
  });
  int64_t lo = INT64_MAX, hi = INT64_MIN, g = -1, slo = INT64_MAX;
  bool single = true, sinks = true;
  add_counts(a, parts);
  for (const Part& p : parts) {
    lo = std::min(lo, p.lo);
    hi = std::max(hi, p.hi);
    single = single && p.single;
    sinks = sinks && p.sinks && (p.g < 0 || g < 0 || p.g == g);
    if (p.g >= 0) g = p.g;
    slo = std::min(slo, p.slo);
  }
  if (lq == 0) a.min_row = 0;
  // Band rows: every row one interval, and exactly the band's clipped interval (a row past the band's reach
  // keeps nothing). No key kept anywhere: nothing for a band kernel to gain.
  if (single && lo <= hi) {
    lo = std::max(lo, -lq);
    hi = std::min(hi, lk);
    bool ok = true;
    for (int64_t q = 0; q < lq && ok; ++q) {
      const int64_t s = std::max<int64_t>(0, q + lo), e = std::min(lk - 1, q + hi);
      ok = s > e ? first[size_t(q)] < 0 : (first[size_t(q)] == s && last[size_t(q)] == e);
    }
    if (ok) a.band = {true, int32_t(lo), int32_t(hi)};
  }
  // Shifted window rows: every row W keys (one interval), the same offset lo of every unclamped row's first key.
  if (single && !a.band.ok && lq > 0 && a.min_row == a.max_row && a.min_row > 0 && a.min_row < lk) {
    const int64_t w = a.min_row;
    int64_t wlo = INT64_MIN;
    for (int64_t q = 0; q < lq && wlo == INT64_MIN; ++q)
      if (first[size_t(q)] > 0 && first[size_t(q)] < lk - w) wlo = first[size_t(q)] - q;
    bool ok = wlo != INT64_MIN;
    for (int64_t q = 0; q < lq && ok; ++q)
      ok = first[size_t(q)] == std::clamp(q + wlo, int64_t(0), lk - w) && last[size_t(q)] == first[size_t(q)] + w - 1;
    if (ok) a.window = {true, int32_t(wlo), int32_t(wlo + w - 1)};
  }
  // Band rows with a key prefix [0, g): some row two intervals (so not band rows), whose second gives lo; hi from
  // the rows' last keys past the prefix; every row then checked against [0, g) united with the band's clipped
  // interval (one interval where they touch).
  int64_t shi = INT64_MIN;
  if (!single && sinks && g > 0)
    for (int64_t q = 0; q < lq; ++q)
      if (last[size_t(q)] >= g) shi = std::max(shi, last[size_t(q)] - q);
  if (!single && sinks && g > 0 && slo <= shi) {
    const int64_t blo = std::max(slo, -lq), bhi = std::min(shi, lk);
    bool ok = true;
    for (int64_t q = 0; q < lq && ok; ++q) {
      const int64_t s = std::max<int64_t>(0, q + blo), e = std::min(lk - 1, q + bhi);
      const size_t i = size_t(q);
      if (s <= e && s > g)  // apart: [0, g) and [s, e]
        ok = prefix[i] == g && first[i] == s && last[i] == e;
      else  // one interval [0, max(g - 1, e)]
        ok = prefix[i] == 0 && first[i] == 0 && last[i] == std::max(g - 1, s <= e ? e : -1);
    }
    if (ok) {
      a.sinks = {true, int32_t(blo), int32_t(bhi)};
      a.prefix = int32_t(g);
    }
  }
  a.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return a;
}

std::string Analysis::describe() const {
  std::ostringstream s;
  s << "nnz " << nnz << " (density " << density() << "), keys a row " << min_row << ".." << max_row << " (mean "
    << mean_row() << "), " << empty_rows << " empty rows, " << dense_rows << " dense rows";
  if (band.ok) s << ", band rows [" << band.lo << ", " << band.hi << "]";
  if (window.ok) s << ", window rows [" << window.lo << ", " << window.hi << "] shifted inside the keys at the ends";
  if (sinks.ok) s << ", band rows [" << sinks.lo << ", " << sinks.hi << "] with key prefix 0:" << prefix;
  if (residue > 1) s << ", residue stride " << residue;
  if (groups.ok) s << ", band rows [" << groups.lo << ", " << groups.hi << "] in each residue group";
  if (grid) s << ", neighborhood " << describe_grid(*grid);
  s << "; analysed in " << ms << " ms";
  return s.str();
}

std::string block_histogram(const BoundPattern& pat) {
  std::ostringstream s;
  char line[160];
  s << "blocks    size   stored    full  partial  fill%  partial-fill histogram (<25% <50% <75% <100%)\n";
  int64_t nnz = -1;
  for (int bs : {16, 32, 64, 128}) {
    const Bsr b = make_bsr(pat, bs);
    int64_t hist[4] = {0, 0, 0, 0};
    for (int64_t i = 0; i < b.nblocks(); ++i) {
      if (b.full(i)) continue;
      const uint64_t* m = b.masks.data() + b.mask_index[size_t(i)] * b.words_per_mask();
      int64_t bits = 0;
      for (int64_t w = 0; w < b.words_per_mask(); ++w) bits += __builtin_popcountll(m[w]);
      hist[std::min(3, int(4.0 * double(bits) / (double(bs) * bs)))] += 1;
    }
    const int64_t nfull = b.nblocks() - b.npartial();
    if (nnz < 0) nnz = pat.nnz();
    std::snprintf(line, sizeof line, "          %4d %8lld %7lld %8lld %6.1f  %lld %lld %lld %lld\n", bs,
                  (long long)b.nblocks(), (long long)nfull, (long long)b.npartial(),
                  b.nblocks() ? 100.0 * double(nnz) / (double(b.nblocks()) * bs * bs) : 0.0, (long long)hist[0],
                  (long long)hist[1], (long long)hist[2], (long long)hist[3]);
    s << line;
  }
  return s.str();
}

}  // namespace spattn::plan
