// plan/parts.cpp — split_pattern (plan/parts.hpp).
#include "plan/parts.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <sstream>

#include "common/parallel.hpp"
#include "plan/gpu/block_plan.hpp"
#include "plan/kernels.hpp"

namespace spattn::plan {

const char* part_kind_name(PartKind k) {
  switch (k) {
    case PartKind::tiles: return "tiles";
    case PartKind::columns: return "columns";
    case PartKind::rows: return "rows";
    case PartKind::scattered: return "scattered";
    case PartKind::affine: return "affine";
  }
  return "?";
}

std::string Split::describe() const {
  std::ostringstream s;
  s << parts.size() << (parts.size() == 1 ? " part" : " parts") << " (split in " << ms << " ms)";
  for (const Part& p : parts) s << "\n  " << plan::describe(p);
  return s.str();
}

std::string describe(const Part& p) {
  std::ostringstream s;
  s << part_kind_name(p.kind) << " [" << p.terms << "]: " << p.nnz << " kept scores";
  if (p.kind == PartKind::columns) s << " over " << p.columns.size() << " gathered keys";
  if (p.kind == PartKind::rows) s << ", rows " << p.row_begin << ":" << p.row_end << " (replaced, not merged)";
  if (p.kind == PartKind::scattered && p.drawn.r > 0) s << ", CSR drawn on the device";
  return s.str();
}

namespace {

std::string join_specs(const std::vector<BoundPattern>& terms) {
  std::string s;
  for (auto& t : terms) s += (s.empty() ? "" : " | ") + t.spec();
  return s;
}

// Builds the CSR of a part row by row in parallel: keep(q, keys) appends row q's kept (part-space) keys.
template <class RowFn>
void build_csr(int64_t lq, std::vector<int64_t>& offsets, std::vector<int32_t>& cols, RowFn&& row_fn) {
  const int threads = int(std::clamp<int64_t>(lq / 1024, 1, plan_thread_cap()));
  const int64_t nchunks = std::min<int64_t>(lq, int64_t(threads) * 8);
  std::vector<std::vector<int32_t>> chunk_cols(size_t(std::max<int64_t>(nchunks, 1)));
  offsets.assign(size_t(lq) + 1, 0);
  common::parallel_for(nchunks, threads, [&](int64_t c, int) {
    std::vector<int32_t>& out = chunk_cols[size_t(c)];
    for (int64_t q = c * lq / nchunks, qe = (c + 1) * lq / nchunks; q < qe; ++q) {
      const size_t before = out.size();
      row_fn(q, out);
      offsets[size_t(q) + 1] = int64_t(out.size() - before);
    }
  });
  for (int64_t q = 0; q < lq; ++q) offsets[size_t(q) + 1] += offsets[size_t(q)];
  // The chunks copied in place in parallel (a serial concatenation was a large share of sparse random's split).
  cols.resize(size_t(offsets.back()));
  common::parallel_for(nchunks, threads, [&](int64_t c, int) {
    std::vector<int32_t>& from = chunk_cols[size_t(c)];
    std::copy(from.begin(), from.end(), cols.begin() + offsets[size_t(c * lq / nchunks)]);
    std::vector<int32_t>().swap(from);
  });
}

// The affine split of tiles terms alone (plan/parts.hpp): a dilated term and band rows for the others, the term less
// the band's offsets one interval of multiples of d; [tiles part, affine part], or none where no term fits or (mode
// -1) the cost model prices the union's one tile list cheaper.
std::optional<std::vector<Part>> affine_split(const BoundPattern& pattern, const Analysis& analysis,
                                              const std::vector<BoundPattern>& tiles, int mode, const SplitTarget& target) {
  auto floor_div = [](int64_t a, int64_t n) { return a >= 0 ? a / n : -((-a + n - 1) / n); };
  auto best_cost = [&](const BoundPattern& p, const Analysis& an) {
    double b = std::numeric_limits<double>::infinity();
    for (const ShapeCost& c : block_shape_costs(p, an, target.head_dim, target.tma, 0)) b = std::min(b, c.cost);
    return b;
  };
  for (size_t i = 0; i < tiles.size(); ++i) {
    const auto db = tiles[i].dilated_band();
    if (!db || db->d < 2) continue;
    std::vector<BoundPattern> rest;
    for (size_t j = 0; j < tiles.size(); ++j)
      if (j != i) rest.push_back(tiles[j]);
    const BoundPattern band_pat = BoundPattern::union_of(rest);
    const auto band = band_pat.band();
    if (!band) continue;
    // The band keeps the term's offsets m d with c0 <= m <= c1; what is left must be one interval.
    const int64_t d = db->d, c0 = -floor_div(-band->first, d), c1 = floor_div(band->second, d);
    int64_t lo = db->lo, hi = db->hi;
    if (c0 <= c1 && c0 <= hi && c1 >= lo) {
      if (c0 <= lo && c1 >= hi) continue;  // the band keeps all of the term
      if (c0 <= lo) {
        lo = c1 + 1;
      } else if (c1 >= hi) {
        hi = c0 - 1;
      } else {
        continue;  // two intervals
      }
    }
    Part tp;
    tp.pattern = band_pat;
    tp.analysis = analyze(band_pat);
    tp.nnz = tp.analysis->nnz;
    tp.terms = join_specs(rest);
    Part ap;
    ap.kind = PartKind::affine;
    ap.pattern = BoundPattern::dilated_offsets(pattern.q_len(), pattern.k_len(), d, lo, hi);
    ap.analysis = analyze(ap.pattern);
    ap.nnz = ap.analysis->nnz;
    ap.terms = tiles[i].spec();
    if (ap.nnz == 0) continue;
    // Both parts lie in the pattern and are disjoint by construction: their counts add up to its count.
    if (tp.nnz + ap.nnz != analysis.nnz)
      throw Error("compound split: the affine part of '" + pattern.spec() + "' keeps " + std::to_string(ap.nnz) +
                  " scores and its band part " + std::to_string(tp.nnz) + ", the pattern " + std::to_string(analysis.nnz));
    if (mode < 0 && target.affine_cpu) {
      if (pattern.q_len() < kCpuAffineMinLen || pattern.q_len() < kCpuAffineMinGroup * d) continue;
    } else if (mode < 0) {
      const double whole = best_cost(pattern, analysis);
      if (!std::isfinite(whole) || best_cost(tp.pattern, *tp.analysis) + best_cost(ap.pattern, *ap.analysis) >
                                       kAffineSplitGain * whole)
        continue;
    }
    std::vector<Part> parts;
    parts.push_back(std::move(tp));
    parts.push_back(std::move(ap));
    return parts;
  }
  return std::nullopt;
}

}  // namespace

Split split_pattern(const BoundPattern& pattern, const Analysis& analysis, int mode, const SplitTarget& target) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t lq = pattern.q_len(), lk = pattern.k_len();
  if (mode < -1 || mode > 1)
    throw Error("compound must be -1 (chosen), 0 (never) or 1 (every column, row and scattered term), got " +
                std::to_string(mode));
  Split split;
  auto whole = [&] {
    Part p;
    p.pattern = pattern;
    p.nnz = analysis.nnz;
    p.terms = pattern.spec();
    split.parts = {std::move(p)};
  };
  if (mode == 0 || lq == 0 || lk == 0) {
    whole();
    return split;
  }
  std::vector<BoundPattern> tiles, columns, rows, scattered;
  for (BoundPattern& t : pattern.union_terms()) {
    switch (t.shape()) {
      case BoundPattern::Shape::columns: columns.push_back(std::move(t)); break;
      case BoundPattern::Shape::rows: rows.push_back(std::move(t)); break;
      case BoundPattern::Shape::scattered: scattered.push_back(std::move(t)); break;
      case BoundPattern::Shape::general: tiles.push_back(std::move(t)); break;
    }
  }
  // The gathered keys (every row of a columns term keeps the same keys: its row 0's).
  std::vector<int64_t> keys, all_keys;
  if (!columns.empty()) {
    for (auto& t : columns) {
      t.row_keys(0, keys);
      all_keys.insert(all_keys.end(), keys.begin(), keys.end());
    }
    std::sort(all_keys.begin(), all_keys.end());
    all_keys.erase(std::unique(all_keys.begin(), all_keys.end()), all_keys.end());
    // Gathering pays where the keys spread over more 128-key tiles than twice what the rest visits a row; keys
    // packed in a tile or two (longformer's global columns) cost less inside the tiles than a gather and a merge.
    int64_t key_tiles = 0;
    for (size_t i = 0; i < all_keys.size(); ++i) key_tiles += i == 0 || all_keys[i] / 128 != all_keys[i - 1] / 128;
    const double rest_tiles = std::max(0.0, analysis.mean_row() - double(all_keys.size())) / 128.0 + 1.0;
    if (mode < 0 && (int64_t(all_keys.size()) * kPartsMaxFraction > lk || double(key_tiles) <= 2.0 * rest_tiles)) {
      tiles.insert(tiles.end(), columns.begin(), columns.end());
      columns.clear();
      all_keys.clear();
    }
  }
  // The owned rows: one contiguous range.
  int64_t rb = 0, re = 0;
  std::optional<Analysis> tiles_analysis;  // of union_of(tiles), where the rows rule analysed it
  if (!rows.empty()) {
    const BoundPattern u = BoundPattern::union_of(rows);
    int64_t first = -1, last = -1, count = 0;
    if (const auto ranges = u.dense_row_ranges(); ranges && !general_paths_only()) {  // global_rows: from the spec
      for (const auto& [b, e] : *ranges) {
        if (first < 0) first = b;
        last = e - 1;
        count += e - b;
      }
    } else {
      for (int64_t q = 0; q < lq; ++q)
        if (u.row_nnz(q) > 0) {
          if (first < 0) first = q;
          last = q;
          ++count;
        }
    }
    const bool one_range = count > 0 && last - first + 1 == count;
    // Chosen (mode -1) only where the rest runs on the band kernel: band rows, or band rows with a short key prefix
    // (the rest of longformer: local(w) | global_cols(0:G)), and the rows are few. Else the tile kernels' own
    // scheduling of those rows is faster (longformer at L = 16384, H100: tiles + columns + rows parts with the
    // rows on one CTA each 0.53 ms, one tile list 0.34).
    bool keep = one_range && mode > 0;
    if (one_range && mode < 0 && target.band_kernel && count * kPartsMaxFraction <= lq) {
      std::vector<BoundPattern> rest = tiles;
      rest.insert(rest.end(), columns.begin(), columns.end());
      rest.insert(rest.end(), scattered.begin(), scattered.end());
      if (!rest.empty()) {
        Analysis an = analyze(BoundPattern::union_of(rest));
        if (an.band.ok || (an.sinks.ok && an.prefix <= kBandPrefixMax)) {
          keep = true;
          tiles_analysis = std::move(an);
          tiles = std::move(rest);
          columns.clear();
          all_keys.clear();
          scattered.clear();
        }
      }
    }
    if (!keep) {
      tiles.insert(tiles.end(), rows.begin(), rows.end());
      rows.clear();
    } else {
      rb = first, re = last + 1;
    }
  }
  if (!scattered.empty() && mode < 0) {
    int64_t n = 0;
    for (auto& t : scattered) n += t.nnz();
    if (n * kScatteredMaxFill > lq * lk) {
      tiles.insert(tiles.end(), scattered.begin(), scattered.end());
      scattered.clear();
    }
  }
  // A rows part needs another part for the rows it does not own.
  if (!rows.empty() && tiles.empty() && columns.empty() && scattered.empty()) {
    tiles = rows;
    rows.clear();
  }
  if (columns.empty() && rows.empty() && scattered.empty() && tiles.size() >= 2 && (mode > 0 || target.affine || target.affine_cpu)) {
    if (auto parts = affine_split(pattern, analysis, tiles, mode, target)) {
      split.parts = std::move(*parts);
      split.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      return split;
    }
  }
  if (columns.empty() && rows.empty() && scattered.empty()) {
    whole();
    split.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return split;
  }

  const bool have_tiles = !tiles.empty();
  const BoundPattern tile_pat = have_tiles ? BoundPattern::union_of(tiles) : BoundPattern{};
  const auto band = have_tiles ? tile_pat.band() : std::nullopt;
  if (have_tiles) {
    Part p;
    p.pattern = tile_pat;
    // Band rows (the rest of local | random) analysed here, in closed form (their nnz() walks every row: local(256) at
    // L = 16384, 45 of the split's 78 us), for the part's planner too.
    if (!tiles_analysis && band) tiles_analysis = analyze(tile_pat);
    p.nnz = tiles_analysis ? tiles_analysis->nnz : tile_pat.nnz();
    p.terms = join_specs(tiles);
    p.analysis = std::move(tiles_analysis);
    split.parts.push_back(std::move(p));
  }
  if (!columns.empty()) {
    Part p;
    p.kind = PartKind::columns;
    p.columns.assign(all_keys.begin(), all_keys.end());
    // Every gathered key is in every row of some columns term: drop what the tiles keep and the owned rows (by the
    // tiles' runs, not key by key: sparse_fixed's 128 columns a row took 2M contains() at L = 16384).
    p.pattern = BoundPattern::gathered(lq, all_keys, have_tiles ? &tile_pat : nullptr, rb, re);
    // Beside the tiles part alone, the rest of the pattern's kept scores (the parts are disjoint, their union the
    // pattern), not a row a block of the gathered pattern counted again.
    p.nnz = scattered.empty() && rows.empty() ? analysis.nnz - (have_tiles ? split.parts.front().nnz : 0)
                                              : p.pattern.nnz();
    p.terms = join_specs(columns);
    if (p.nnz) split.parts.push_back(std::move(p));
  }
  if (!scattered.empty()) {
    Part p;
    p.kind = PartKind::scattered;
    // The scattered terms less what the tiles and the columns keep, less the owned rows: a pattern over the terms
    // (no copy of the CSR below, which is what the fine-grained kernel reads), its rows drawn once here.
    std::vector<BoundPattern> minus;
    if (have_tiles) minus.push_back(tile_pat);
    if (!columns.empty()) minus.push_back(BoundPattern::union_of(columns));
    p.pattern = BoundPattern::less(BoundPattern::union_of(scattered), minus, rb, re);
    p.terms = join_specs(scattered);
    const auto rs = scattered.size() == 1 ? scattered[0].random_spec() : std::nullopt;
    if (target.device_draw && rs && columns.empty() && rb == re && (!have_tiles || band) &&
        device_draws_random(rs->r, lq, lk)) {
      // The device draws the CSR (compound.cpp). Beside the tiles part (pushed first) the two cover the pattern.
      p.drawn = *rs;
      if (band) p.drawn_lo = band->first, p.drawn_hi = band->second;
      p.nnz = have_tiles ? analysis.nnz - split.parts.front().nnz : lq * rs->r;
    } else {
      build_csr(lq, p.offsets, p.cols, [&](int64_t q, std::vector<int32_t>& out) {
        thread_local RowRuns runs;
        p.pattern.row(q, runs);
        for (const Run& r : runs)
          for (int64_t i = 0; i < r.count; ++i) out.push_back(int32_t(r.start + i * r.stride));
      });
      p.nnz = int64_t(p.cols.size());
    }
    if (p.nnz) split.parts.push_back(std::move(p));
  }
  if (!rows.empty()) {
    Part p;
    p.kind = PartKind::rows;
    p.row_begin = rb;
    p.row_end = re;
    p.pattern = Pattern::parse("dense").bind(re - rb, lk);
    p.nnz = (re - rb) * lk;
    p.terms = join_specs(rows);
    split.parts.push_back(std::move(p));
  }
  // Every merged part empty (the rows part alone cannot give the other rows' empty output): no split.
  if (std::none_of(split.parts.begin(), split.parts.end(), [](const Part& p) { return p.kind != PartKind::rows; })) whole();
  split.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return split;
}

}  // namespace spattn::plan
