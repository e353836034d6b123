// plan/tile_map.cpp — see tile_map.hpp.
#include "plan/tile_map.hpp"

#include <algorithm>
#include <climits>
#include <map>
#include <optional>

namespace spattn::plan {
namespace {

int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }
int64_t pow2_ceil(int64_t a) {
  int64_t p = 1;
  while (p < a) p *= 2;
  return p;
}

// The grid's axis a (right-aligned) as the grid's own axis index; -1 for the leading axes of size 1.
int grid_axis(const NeighborhoodGrid& g, int a) { return a - (3 - g.naxes); }

// A neighborhood grid's dims and dilation right-aligned to 3 axes.
void aligned(const NeighborhoodGrid& g, std::array<int64_t, 3>& dims, std::array<int64_t, 3>& dil) {
  if (g.naxes < 1 || g.naxes > 3) throw Error("tile map: a neighborhood grid has 1 to 3 axes, got " + std::to_string(g.naxes));
  dims = {1, 1, 1};
  dil = {1, 1, 1};
  for (int a = 0; a < 3; ++a) {
    const int ga = grid_axis(g, a);
    if (ga < 0) continue;
    dims[size_t(a)] = g.dims[size_t(ga)];
    dil[size_t(a)] = g.dilation[size_t(ga)];
    if (dims[size_t(a)] < 1 || dil[size_t(a)] < 1) throw Error("tile map: axis sizes and dilations must be at least 1");
  }
}

// One axis's share of tiling_scores (its fields per axis, multiplied over the axes): the sums over (query interval, key
// interval) pairs of one dilation group that hold a kept pair (visited), that are full (full), and the kept pairs
// (kept), over all groups of the axis; out[i] for key side tks[i] (a query interval's windows and their sums serve
// every key side: best_boxes asks for 8 a query side, which were 8 passes over the windows).
// windows: the grid's window of every coordinate of axis a (Run window(ga, i)), where the caller has them.
void axis_scores(const NeighborhoodGrid& g, int a, int64_t tq, const std::vector<int64_t>& tks, std::vector<TilingScores>& out,
                 const std::vector<Run>* windows = nullptr) {
  std::array<int64_t, 3> dims, dil;
  aligned(g, dims, dil);
  const int ga = grid_axis(g, a);
  const int64_t n = dims[size_t(a)], d = dil[size_t(a)];
  out.assign(tks.size(), TilingScores{});
  if (ga < 0) {  // a leading axis of size 1: one coordinate, its own window
    for (size_t t = 0; t < tks.size(); ++t) out[t] = {double(tq * tks[t]), double(tq * tks[t]), 1};
    return;
  }
  struct W {
    int64_t start, stride, count;  // in sub-grid coordinates
  };
  std::vector<W> wins;
  std::vector<int64_t> sums;  // per key of [lo, hi + 1]: kept pairs of the keys before it
  double kept = 0;
  for (int64_t grp = 0; grp < std::min(d, n); ++grp) {
    const int64_t ng = (n - 1 - grp) / d + 1;
    for (int64_t i0 = 0; i0 < ng; i0 += tq) {
      const int64_t i1 = std::min(ng, i0 + tq);
      wins.clear();
      int64_t lo = INT64_MAX, hi = -1;
      for (int64_t i = i0; i < i1; ++i) {
        const Run r = windows ? (*windows)[size_t(grp + i * d)] : g.window(ga, grp + i * d);
        if (r.count <= 0) continue;
        // The atom's window stays in its query's residue group of the atom's dilation, a multiple of the grid's.
        const W w{(r.start - grp) / d, r.count > 1 ? r.stride / d : 1, r.count};
        wins.push_back(w);
        lo = std::min(lo, w.start);
        hi = std::max(hi, w.start + (w.count - 1) * w.stride);
        kept += double(w.count);
      }
      if (hi < 0) continue;
      // Windows of consecutive coordinates (every one here without the atom's own dilation): the kept pairs of a key
      // interval from prefix sums of how many windows hold each key, not window by window.
      const bool intervals = std::all_of(wins.begin(), wins.end(), [](const W& w) { return w.stride == 1 || w.count == 1; });
      if (intervals) {
        sums.assign(size_t(hi - lo + 2), 0);
        for (const W& w : wins) sums[size_t(w.start - lo)] += 1, sums[size_t(w.start + w.count - lo)] -= 1;
        int64_t cover = 0, total = 0;
        for (int64_t& x : sums) cover += x, x = total, total += cover;  // sums[j - lo]: kept pairs of keys < j
      }
      for (size_t t = 0; t < tks.size(); ++t) {
        const int64_t tk = tks[t];
        for (int64_t j0 = lo / tk * tk; j0 <= hi; j0 += tk) {
          const int64_t j1 = j0 + tk;  // [j0, j1); real keys below ng
          int64_t c = 0;
          if (intervals) {
            c = sums[size_t(std::min(j1, hi + 1) - lo)] - sums[size_t(std::max(j0, lo) - lo)];
          } else {
            for (const W& w : wins) {
              // keys start + t * stride in [j0, j1), 0 <= t < count
              const int64_t t_lo = w.start >= j0 ? 0 : (j0 - w.start + w.stride - 1) / w.stride;
              const int64_t t_hi = std::min(w.count - 1, w.start < j1 ? (j1 - 1 - w.start) / w.stride : -1);
              c += std::max<int64_t>(0, t_hi - t_lo + 1);
            }
          }
          if (c == 0) continue;
          out[t].visited += double(tq * tk);
          if (c == (i1 - i0) * tk && j1 <= ng) out[t].full += double(tq * tk);
        }
      }
    }
  }
  for (TilingScores& o : out) o.kept = kept;
}

}  // namespace

GridTiling GridTiling::of(const NeighborhoodGrid& grid, const TileBox& box) {
  GridTiling t;
  t.naxes = grid.naxes;
  aligned(grid, t.dims, t.dilation);
  for (int s : box.side)
    if (s < 1) throw Error("tile map: box sides must be at least 1, got " + box.str(3));
  t.box = box;
  return t;
}

int64_t GridTiling::padded(int a, int64_t g) const { return round_up(group_size(a, g), box.side[size_t(a)]); }

int64_t GridTiling::length() const {
  int64_t n = 1;
  for (int a = 0; a < 3; ++a) {
    int64_t s = 0;
    for (int64_t g = 0; g < groups(a); ++g) s += padded(a, g);
    n *= s;
  }
  return n;
}

std::vector<int32_t> GridTiling::map() const {
  const int64_t len = length();
  if (len >= int64_t(INT32_MAX) - 256)
    throw Error("tile map: " + std::to_string(len) + " plan positions (" + describe() + ") exceed 2^31 - 256");
  std::vector<int32_t> m(size_t(len), -1);
  int64_t p = 0;
  const auto& s = box.side;
  for (int64_t g0 = 0; g0 < groups(0); ++g0)
    for (int64_t g1 = 0; g1 < groups(1); ++g1)
      for (int64_t g2 = 0; g2 < groups(2); ++g2) {
        const int64_t n0 = group_size(0, g0), n1 = group_size(1, g1), n2 = group_size(2, g2);
        const int64_t nb0 = padded(0, g0) / s[0], nb1 = padded(1, g1) / s[1], nb2 = padded(2, g2) / s[2];
        for (int64_t b0 = 0; b0 < nb0; ++b0)
          for (int64_t b1 = 0; b1 < nb1; ++b1)
            for (int64_t b2 = 0; b2 < nb2; ++b2)
              for (int64_t o0 = 0; o0 < s[0]; ++o0) {
                const int64_t j0 = b0 * s[0] + o0;
                for (int64_t o1 = 0; o1 < s[1]; ++o1) {
                  const int64_t j1 = b1 * s[1] + o1;
                  const bool row_ok = j0 < n0 && j1 < n1;
                  const int64_t row = ((g0 + j0 * dilation[0]) * dims[1] + g1 + j1 * dilation[1]) * dims[2];
                  for (int64_t o2 = 0; o2 < s[2]; ++o2, ++p) {
                    const int64_t j2 = b2 * s[2] + o2;
                    if (row_ok && j2 < n2) m[size_t(p)] = int32_t(row + g2 + j2 * dilation[2]);
                  }
                }
              }
      }
  return m;
}

std::vector<GridTiling::BoxRows> GridTiling::boxes() const {
  std::vector<BoxRows> out;
  const auto& s = box.side;
  for (int64_t g0 = 0; g0 < groups(0); ++g0)
    for (int64_t g1 = 0; g1 < groups(1); ++g1)
      for (int64_t g2 = 0; g2 < groups(2); ++g2) {
        const int64_t n[3] = {group_size(0, g0), group_size(1, g1), group_size(2, g2)};
        const int64_t nb0 = padded(0, g0) / s[0], nb1 = padded(1, g1) / s[1], nb2 = padded(2, g2) / s[2];
        for (int64_t b0 = 0; b0 < nb0; ++b0)
          for (int64_t b1 = 0; b1 < nb1; ++b1)
            for (int64_t b2 = 0; b2 < nb2; ++b2) {
              const int64_t j[3] = {b0 * s[0], b1 * s[1], b2 * s[2]};  // the box's first coordinates in its group
              BoxRows r;
              r.base = ((g0 + j[0] * dilation[0]) * dims[1] + g1 + j[1] * dilation[1]) * dims[2] + g2 + j[2] * dilation[2];
              for (int a = 0; a < 3; ++a) r.extent[size_t(a)] = int(std::min<int64_t>(s[size_t(a)], n[a] - j[a]));
              out.push_back(r);
            }
      }
  return out;
}

int64_t GridTiling::token_stride(int a) const {
  int64_t st = dilation[size_t(a)];
  for (int b = a + 1; b < 3; ++b) st *= dims[size_t(b)];
  return st;
}

bool GridTiling::identity() const {
  // Tile-major order is row-major order where there is one group per axis and each box spans whole rows of the
  // axes after its first non-1 side, with no padding.
  for (int a = 0; a < 3; ++a)
    if (groups(a) != 1 || dims[size_t(a)] % box.side[size_t(a)] != 0) return false;
  int a = 0;
  while (a < 3 && box.side[size_t(a)] == 1) ++a;
  for (int b = a + 1; b < 3; ++b)
    if (box.side[size_t(b)] != dims[size_t(b)]) return false;
  return true;
}

namespace {
// The first n values, "AxBxC".
std::string axes_str(const int64_t* v, int n) {
  std::string s;
  for (int a = 0; a < n; ++a) {
    if (a) s += 'x';
    s += std::to_string(v[a]);
  }
  return s;
}
std::string grid_str(const int64_t* dims, const int64_t* dil, int n) {
  bool dilated = false;
  for (int a = 0; a < n; ++a) dilated = dilated || dil[a] > 1;
  return axes_str(dims, n) + " grid" + (dilated ? ", dilation " + axes_str(dil, n) : "");
}
}  // namespace

std::string TileBox::str(int naxes) const {
  const int n = std::clamp(naxes, 1, 3);
  const std::array<int64_t, 3> v{side[0], side[1], side[2]};
  return axes_str(v.data() + 3 - n, n);
}

std::string GridTiling::describe() const {
  const int n = std::clamp(naxes, 1, 3);
  return box.str(naxes) + " boxes of a " + grid_str(dims.data() + 3 - n, dilation.data() + 3 - n, n);
}

std::string describe_grid(const NeighborhoodGrid& grid) {
  return grid_str(grid.dims.data(), grid.dilation.data(), std::clamp(grid.naxes, 1, 3));
}

std::vector<TileBox> tile_boxes(const NeighborhoodGrid& grid, int64_t volume) {
  std::vector<TileBox> out;
  if (volume < 1 || (volume & (volume - 1)) != 0) return out;
  std::array<int64_t, 3> dims, dil;
  aligned(grid, dims, dil);
  int e = 0;
  while ((int64_t(1) << e) < volume) ++e;
  std::array<int64_t, 3> cap;
  for (size_t a = 0; a < 3; ++a) cap[a] = pow2_ceil((dims[a] - 1) / dil[a] + 1);  // group 0 is the largest
  // Sides from the last axis's largest down: row-major order's longest runs first among equal costs.
  for (int e2 = e; e2 >= 0; --e2)
    for (int e1 = e - e2; e1 >= 0; --e1) {
      const int e0 = e - e2 - e1;
      const TileBox b{{1 << e0, 1 << e1, 1 << e2}};
      if (b.side[0] <= cap[0] && b.side[1] <= cap[1] && b.side[2] <= cap[2]) out.push_back(b);
    }
  return out;
}

namespace {
// The tiling's scores as the product of its axes' (axis(a, query side, key side) gives an axis's).
template <class Axis>
TilingScores product_scores(const TileBox& q, const TileBox& k, Axis&& axis) {
  TilingScores t{1, 1, 1};
  for (int a = 0; a < 3; ++a) {
    const TilingScores& s = axis(a, q.side[size_t(a)], k.side[size_t(a)]);
    t.visited *= s.visited;
    t.full *= s.full;
    t.kept *= s.kept;
  }
  return t;
}
}  // namespace

TilingScores tiling_scores(const NeighborhoodGrid& grid, const TileBox& q, const TileBox& k) {
  std::vector<TilingScores> tmp;
  return product_scores(q, k, [&](int a, int64_t tq, int64_t tk) -> const TilingScores& {
    axis_scores(grid, a, tq, {tk}, tmp);
    return tmp[0];
  });
}

AxisWindows axis_windows(const NeighborhoodGrid& grid) {
  AxisWindows w;
  for (int a = 0; a < 3; ++a) {
    const int ga = grid_axis(grid, a);
    if (ga < 0) w[size_t(a)].push_back({0, 1, 1});
    else
      for (int64_t i = 0; i < grid.dims[size_t(ga)]; ++i) w[size_t(a)].push_back(grid.window(ga, i));
  }
  return w;
}

BoxChoice best_boxes(const NeighborhoodGrid& grid, int64_t q_volume, int64_t k_volume, double partial_cost,
                     BoxScoreCache* cache) {
  BoxChoice best;
  const std::vector<TileBox> qb = tile_boxes(grid, q_volume), kb = tile_boxes(grid, k_volume);
  std::optional<BoxScoreCache> own;
  BoxScoreCache& c = cache ? *cache : own.emplace(grid);
  // Every (axis, query side)'s scores for all the key boxes' sides on that axis at once, where any is missing.
  std::vector<TilingScores> scores;
  for (int a = 0; a < 3; ++a) {
    std::vector<int64_t> tqs, tks;
    for (const TileBox& q : qb) tqs.push_back(q.side[size_t(a)]);
    for (const TileBox& k : kb) tks.push_back(k.side[size_t(a)]);
    std::sort(tqs.begin(), tqs.end()), tqs.erase(std::unique(tqs.begin(), tqs.end()), tqs.end());
    std::sort(tks.begin(), tks.end()), tks.erase(std::unique(tks.begin(), tks.end()), tks.end());
    for (int64_t tq : tqs) {
      std::vector<int64_t> missing;
      for (int64_t tk : tks)
        if (!c.axes.count({a, tq, tk})) missing.push_back(tk);
      if (missing.empty()) continue;
      axis_scores(grid, a, tq, missing, scores, &c.windows[size_t(a)]);
      for (size_t t = 0; t < missing.size(); ++t) c.axes[{a, tq, missing[t]}] = scores[t];
    }
  }
  auto axis = [&](int a, int64_t tq, int64_t tk) -> const TilingScores& { return c.axes.at({a, tq, tk}); };
  double best_cost = 0;
  for (const TileBox& q : qb)
    for (const TileBox& k : kb) {
      const TilingScores t = product_scores(q, k, axis);
      const double cost = t.cost(partial_cost);
      if (!best.ok || cost < best_cost) best = {true, q, k, t}, best_cost = cost;
    }
  return best;
}

int grid_axes_used(const NeighborhoodGrid& grid) {
  int n = 0;
  for (int a = 0; a < grid.naxes; ++a) n += grid.dims[size_t(a)] > 1;
  return n;
}

}  // namespace spattn::plan
