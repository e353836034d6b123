// plan/gpu/geometry.cpp — a query tile's rows in plan space, band detection in a tile's bits, the plan's own
// description and the 64-key halves of its entries (tiles.hpp, block_plan.hpp).
#include <sstream>

#include "plan/gpu/tiles.hpp"

namespace spattn::plan {
namespace gpu {

int64_t plan_threads(int64_t q_tiles, int64_t k_len) {
  const int64_t by_size = std::max<int64_t>(1, q_tiles * std::max<int64_t>(k_len, 64) / (int64_t(1) << 15));
  return std::max<int64_t>(1, std::min({int64_t(plan_thread_cap()), q_tiles, by_size}));
}

int64_t tile_rows(const BoundPattern& pat, const Space& sp, int64_t qt, RowRuns& tmp, std::vector<RowRuns>& rows,
                  int64_t& nruns, int64_t& nnz, std::vector<char>* same) {
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

}  // namespace gpu

using gpu::Space;

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

}  // namespace spattn::plan
