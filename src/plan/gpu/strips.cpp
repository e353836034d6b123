// plan/gpu/strips.cpp — key-strip plans (tile_map 2; block_plan.hpp, build_strip_plan): each query box's key tiles
// strips of its window union, from its rows, or for a lone neighborhood atom from the grid's windows.
#include <array>
#include <chrono>

#include "common/parallel.hpp"
#include "plan/gpu/tiles.hpp"
#include "plan/key_strips.hpp"

namespace spattn::plan {

using gpu::order_by_entries;

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

namespace {

// The strips' axes of a tiling: the grid's used axes (longer than 1), the last one the strips' inner axis ai (its
// tokens are consecutive: every axis after it has size 1), the other, if any, the outer axis ao; an unused axis stands
// in for a missing one (its coordinate is always 0). Empty, with the reason in *why, where they do not fit.
struct StripAxes {
  std::array<int64_t, 3> step{1, 1, 1};  // tokens per coordinate of each axis (dilation 1)
  int ai = 2, ao = 0;
  int64_t ni = 1, di = 1, dout = 1;  // the inner axis's size; the inner and outer axes' dilations
  int64_t sx = 0, sy = 0;            // their token strides in a dilation group (sy == di)
};
std::optional<StripAxes> strip_axes(const BoundPattern& pat, const GridTiling& qt, std::string& why) {
  StripAxes x;
  std::array<int64_t, 3>& step = x.step;
  for (int a = 1; a >= 0; --a) step[size_t(a)] = step[size_t(a) + 1] * qt.dims[size_t(a) + 1];
  int used[3], nused = 0;
  for (int a = 0; a < 3; ++a)
    if (qt.dims[size_t(a)] > 1) used[nused++] = a;
  if (nused > 2) {
    why = "the grid (" + qt.describe() + ") has three axes longer than 1";
    return std::nullopt;
  }
  x.ai = nused > 0 ? used[nused - 1] : 2;
  x.ao = nused > 1 ? used[0] : (x.ai == 0 ? 1 : 0);
  x.ni = qt.dims[size_t(x.ai)];
  x.di = qt.dilation[size_t(x.ai)], x.dout = qt.dilation[size_t(x.ao)];
  x.sx = qt.token_stride(x.ao), x.sy = qt.token_stride(x.ai);  // sy == di: the axes after ai have size 1
  if (x.sx >= INT32_MAX || int64_t(pat.k_len()) >= INT32_MAX) {
    why = "the grid is too large for 32-bit tokens";
    return std::nullopt;
  }
  return x;
}

// The pattern's lone neighborhood atom where it is one on this tiling's grid (NeighborhoodGrid::exact, the same dims
// and dilations), else none; shift: tiling axis a is grid axis a - shift (right-aligned).
std::optional<NeighborhoodGrid> exact_grid(const BoundPattern& pat, const GridTiling& qt, int* shift) {
  // One neighborhood atom on this tiling's grid (NeighborhoodGrid::exact, the same dims and dilations): a query's keys
  // are the product of its axis windows, so a row's pieces (one a line of the outer axis's window) come from its two
  // windows, not from its runs and each run's coordinates (a row whose first key is not in its group, or whose windows
  // step other than by the grid's dilation, takes its runs). na2d 128x128 K=13: choose 5.12 -> 4.16 ms, one thread.
  std::optional<NeighborhoodGrid> grid = general_paths_only() ? std::nullopt : pat.neighborhood_grid();
  *shift = grid ? 3 - grid->naxes : 0;
  for (int a = 0; a < 3 && grid; ++a) {
    const bool on = a >= *shift;
    if (!grid->exact || (on ? grid->dims[size_t(a - *shift)] : 1) != qt.dims[size_t(a)] ||
        (on ? grid->dilation[size_t(a - *shift)] : 1) != qt.dilation[size_t(a)])
      grid.reset();
  }
  return grid;
}

// A token's coordinates on the strips' two axes (ci, co) and in its dilation group (y = ci / di, x = co / dout).
struct Coord {
  int32_t ci, co, y, x;
};
// Every token's coordinates on the two axes (ci, co) and in its dilation group (y = ci / di, x = co / dout), counted
// up token by token: a run's piece reads them here instead of dividing (about ten 64-bit divisions a piece, 213k
// pieces for na2d 128x128 K=13 at L = 16384: the strip plan took 6.2 ms, 2.9 after, on the shared 2-core VM).
std::vector<Coord> token_coords(const GridTiling& qt, const StripAxes& ax, int64_t len) {
  const int ai = ax.ai, ao = ax.ao;
  std::vector<Coord> coord(static_cast<size_t>(len));
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
  return coord;
}

// Per query tile: its strips (base, width, count), its entries' masks (64 words each), nnz; or a failure.
struct BoxPart {
  std::vector<KeyStrip> strips;
  std::vector<uint64_t> masks;
  int64_t nnz = 0;
  std::string error;
};
struct Piece {
  int32_t row, x, y, ystep, n;  // query row; keys at group coordinates (x, y + i ystep), i < n
};
struct BoxScratch {
  RowRuns runs;
  std::vector<Piece> pieces;
  std::vector<uint64_t> m;
  std::vector<int32_t> strip_of, slot_of;  // per row of U: its strip, its first slot
};

// The strips of query box t from its rows' keys: each row's keys as pieces along the inner axis (from its two windows
// where the pattern is the grid's lone atom, else from its runs), their union U's bounding box cut into strips of
// 64 / W rows, a bitmask each.
struct BoxStrips {
  const BoundPattern& pat;
  const std::vector<int32_t>& q_map;
  const std::vector<GridTiling::BoxRows>& qboxes;
  const std::vector<Coord>& coord;
  const StripAxes& ax;
  const std::optional<NeighborhoodGrid>& grid;
  int shift;
  const GridTiling& qt;

  Run window(int a, int64_t c) const { return a >= shift ? grid->window(a - shift, c) : Run{0, 1, 1}; }

  void operator()(int64_t t, BoxScratch& s, BoxPart& out) const {
    const std::array<int64_t, 3>& step = ax.step;
    const int ai = ax.ai, ao = ax.ao;
    const int64_t ni = ax.ni, di = ax.di, dout = ax.dout, sx = ax.sx, sy = ax.sy;
    const Coord& bc = coord[size_t(qboxes[size_t(t)].base)];
    const int64_t go = bc.co - int64_t(bc.x) * dout, gi = bc.ci - int64_t(bc.y) * di;  // the box's group
    const int64_t gbase = go * step[size_t(ao)] + gi * step[size_t(ai)];  // the group's token at coordinates (0, 0)
    const int64_t gsize = (ni - 1 - gi) / di + 1;  // the group's coordinates on the inner axis
    RowRuns& runs = s.runs;
    std::vector<Piece>& pieces = s.pieces;
    pieces.clear();
    int64_t x0 = INT64_MAX, x1 = -1, y0 = INT64_MAX, y1 = -1;
    for (int r = 0; r < 64; ++r) {
      const int32_t q = q_map[size_t(t * 64 + r)];
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
  }
};

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
  std::string axes_why;
  const std::optional<StripAxes> axes = strip_axes(pat, qt, axes_why);
  if (!axes) return fail(axes_why);
  const int ai = axes->ai, ao = axes->ao;
  const int64_t sx = axes->sx, sy = axes->sy;

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
  int shift = 0;
  const std::optional<NeighborhoodGrid> grid = exact_grid(pat, qt, &shift);

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

  const std::vector<Coord> coord = token_coords(qt, *axes, pat.k_len());
  std::vector<BoxPart> parts(size_t(plan.q_tiles));
  const int threads = int(std::max<int64_t>(1, std::min<int64_t>(plan_thread_cap(), plan.q_tiles / 8)));
  std::vector<BoxScratch> scratch(static_cast<size_t>(threads));
  const BoxStrips box{pat, plan.q_map, qboxes, coord, *axes, grid, shift, qt};
  common::parallel_for(plan.q_tiles, threads,
                       [&](int64_t t, int th) { box(t, scratch[size_t(th)], parts[size_t(t)]); });
  for (const BoxPart& part : parts)
    if (!part.error.empty()) return fail(part.error);
  plan.row_offsets.assign(size_t(plan.q_tiles) + 1, 0);
  size_t nstrips = 0;  // (the arrays sized once, not grown part by part: na2d choose 5.29 -> 5.19 ms, one thread)
  for (const BoxPart& part : parts) nstrips += part.strips.size();
  if (nstrips < size_t(INT32_MAX)) {
    plan.entries.reserve(nstrips);
    plan.strips.reserve(nstrips);
    plan.masks.reserve(nstrips * 64);
  }
  for (int64_t t = 0; t < plan.q_tiles; ++t) {
    const BoxPart& part = parts[size_t(t)];
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

}  // namespace spattn::plan
