// plan/tile_map.hpp — multi-dimensional tiles over a neighborhood pattern's token grid (KERNELS.md section 2).
//
// Tokens of a neighborhood pattern lie row-major on a grid (PATTERNS.md), so a tile of 128 consecutive tokens is a
// strip of one image row, and its queries' keys spread over many key tiles, most of them bitmask tiles. Here tokens
// are ordered tile-major instead (NATTEN's token permutation, done through a map rather than a copy):
//   1. each axis's dilation groups (coordinates of one residue mod the dilation) become sub-grids of their own;
//   2. each sub-grid is padded, axis by axis, to whole boxes (side[0] x side[1] x side[2] coordinates);
//   3. plan positions run over the groups in row-major order of their residues, over a group's boxes in row-major
//      order, and over a box's coordinates in row-major order (offsets inside the box).
// A query tile is then one box, the union of its queries' windows a box too, covered by a few key boxes of which
// most are full. Padding positions map to no token (-1); every box holds at least one token.
//
// Grids have 1 to 3 axes; here they are always 3, right-aligned (a 2-D grid n0 x n1 is 1 x n0 x n1), so that a
// token is (c0 * dims[1] + c1) * dims[2] + c2 and the last axis is axis 2.
//
// One source for the box shapes of every tiler: the GPU tile planner (plan/gpu/block_plan.hpp: query and key boxes of
// its tile sizes) and the CPU engine's query tiles (src/cpu/fused.cpp: key "boxes" of one key, so the cost is the
// keys a query tile's windows cover).
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "spattn/pattern.hpp"

namespace spattn::plan {

struct TileBox {
  std::array<int, 3> side{1, 1, 1};  // coordinates per axis (right-aligned, see above)
  int64_t volume() const { return int64_t(side[0]) * side[1] * side[2]; }
  bool operator==(const TileBox&) const = default;
  std::string str(int naxes) const;  // the last naxes sides: "8x16"
};

struct GridTiling {
  int naxes = 1;                             // the grid's own axes (for printing)
  std::array<int64_t, 3> dims{1, 1, 1};      // right-aligned
  std::array<int64_t, 3> dilation{1, 1, 1};  // right-aligned; groups per axis: min(dilation, dims)
  TileBox box;

  // The tiling of a neighborhood grid (its axes right-aligned) by `box` (right-aligned sides). Throws Error where a
  // side is below 1.
  static GridTiling of(const NeighborhoodGrid& grid, const TileBox& box);
  int64_t groups(int a) const { return std::min(dilation[size_t(a)], dims[size_t(a)]); }
  // Coordinates of group g (< groups(a)) on axis a: g, g + d, ...; and that count rounded up to whole boxes.
  int64_t group_size(int a, int64_t g) const { return (dims[size_t(a)] - 1 - g) / dilation[size_t(a)] + 1; }
  int64_t padded(int a, int64_t g) const;
  int64_t tokens() const { return dims[0] * dims[1] * dims[2]; }
  int64_t length() const;  // plan positions: tokens plus padding
  // Plan position -> token (-1 for padding), in O(length()). Throws Error past 2^31 - 256 positions.
  std::vector<int32_t> map() const;
  // The map is the identity (the box covers whole rows of a grid without dilation or padding: tile-major order is
  // row-major order).
  bool identity() const;
  // The map without the map: position r of a box has offsets (o0, o1, o2) in it (row-major in the box's sides, which
  // are powers of two where the kernels use this: bit fields of r), and holds token base + sum o[a] * token_stride(a)
  // where o[a] < extent[a] on every axis, padding elsewhere. The GPU kernels compute their key rows' tokens so from
  // each key box's base and extents (one plan entry's two words) instead of reading the map (a dependent load a row).
  struct BoxRows {
    int64_t base = 0;                    // the token at offsets (0, 0, 0) (a token: every box's first corner is one)
    std::array<int, 3> extent{1, 1, 1};  // coordinates that are tokens, per axis: 1 ... side
  };
  std::vector<BoxRows> boxes() const;  // in plan order (box b: plan positions b * volume ...); O(boxes)
  int64_t token_stride(int a) const;   // dilation[a] * the product of the dims after axis a
  std::string describe() const;  // "8x16 boxes of a 128x128 grid" (+ ", dilation 2x2")
};

// The box shapes of `volume` tokens (a power of two) for a grid: every product of powers of two, one a grid axis,
// with no side past its axis's largest group rounded up to a power of two (axes of size 1 take side 1). Empty
// where the grid holds fewer than `volume` coordinates that way, or volume is no power of two.
std::vector<TileBox> tile_boxes(const NeighborhoodGrid& grid, int64_t volume);

// The scores a tiling pair (query boxes, key boxes) visits, counted axis by axis from the grid's windows (the
// kept set of a neighborhood atom is the product of its axis windows, tiles are products of axis intervals):
// exact for grid.exact, the first atom's estimate otherwise. O(sum of axis sizes x (window / key side + 2)).
struct TilingScores {
  double visited = 0;  // scores of the (query tile, key tile) pairs that hold a kept score, padding included
  double full = 0;     // of those, in pairs where every query token keeps every key position (no padding key)
  double kept = 0;     // kept scores (the pattern's nnz where exact)
  double kept_fraction() const { return visited > 0 ? kept / visited : 0.0; }
  // Predicted cost in full-tile score units: a partial pair's scores cost partial_cost each.
  double cost(double partial_cost) const { return full + (visited - full) * partial_cost; }
};
TilingScores tiling_scores(const NeighborhoodGrid& grid, const TileBox& q, const TileBox& k);

// The query box of q_volume tokens and key box of k_volume tokens with the least cost(partial_cost) (ties: the
// first in tile_boxes' order); ok false where tile_boxes has none for either volume.
struct BoxChoice {
  bool ok = false;
  TileBox q, k;
  TilingScores scores;
};
// Every coordinate's window on each right-aligned axis (NeighborhoodGrid::window; a leading axis of size 1: its one
// coordinate's {0, 1, 1}): the planners that read a grid axis by axis (best_boxes, the strip and row-major estimates,
// the analysis of a lone atom) take them from here once.
using AxisWindows = std::array<std::vector<Run>, 3>;
AxisWindows axis_windows(const NeighborhoodGrid& grid);

// Each axis's scores depend on its two sides only: best_boxes computes them once per (axis, query side, key side), from
// the axes' windows computed once, and keeps them here where the caller passes one cache for several calls on its grid
// (the GPU planner asks for three tile shapes, whose pairs of sides are mostly shared).
struct BoxScoreCache {
  explicit BoxScoreCache(const NeighborhoodGrid& grid) : windows(axis_windows(grid)) {}
  std::map<std::array<int64_t, 3>, TilingScores> axes;  // (axis, query side, key side): that axis's share
  AxisWindows windows;
};
BoxChoice best_boxes(const NeighborhoodGrid& grid, int64_t q_volume, int64_t k_volume, double partial_cost,
                     BoxScoreCache* cache = nullptr);

// Axes of the grid longer than one coordinate (a tiling pays where there are two or more).
int grid_axes_used(const NeighborhoodGrid& grid);
// "128x128 grid" (+ ", dilation 2x2" where an axis has one).
std::string describe_grid(const NeighborhoodGrid& grid);

}  // namespace spattn::plan
