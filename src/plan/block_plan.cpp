// plan/block_plan.cpp — see block_plan.hpp.
#include "plan/block_plan.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <numeric>
#include <sstream>
#include <thread>

#include "common/parallel.hpp"
#include "plan/kernels.hpp"

namespace spattn::plan {
namespace {

constexpr int64_t kNegInf = -(int64_t(1) << 30);  // band bounds that never bind
constexpr int64_t kPosInf = (int64_t(1) << 30);

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// The plan-space geometry shared by the builder and the cost estimate.
struct Space {
  int bm, bn, d;
  int64_t lq, lk, q_group, k_group, q_tiles, k_tiles;

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
    if (d == 1) return p;
    const int64_t g = p / q_group;
    return g + (p - g * q_group) * d;
  }
  // Number of valid keys at the start of key tile kt (invalid keys of a tile are always a suffix).
  int64_t k_valid(int64_t kt) const {
    const int64_t k0 = kt * bn;
    if (d == 1) return std::clamp<int64_t>(lk - k0, 0, bn);
    const int64_t g = k0 / k_group, j0 = k0 - g * k_group;
    const int64_t ng = g < lk ? (lk - g + d - 1) / d : 0;
    return std::clamp<int64_t>(ng - j0, 0, bn);
  }
  // Appends the plan-space runs of a token-space run.
  void map_run(const Run& r, std::vector<Run>& out) const {
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
};

// Walks the kept keys of one plan-space run tile by tile: f(kt, first local col, one-past-last local col,
// stride) for intervals, f(kt, c, c + 1, 1) per key for strided runs.
template <class F>
void for_each_tile_span(const Run& r, int bn, F&& f) {
  if (r.count <= 0) return;
  if (r.stride == 1 || r.count == 1) {
    const int64_t a = r.start, b = r.start + r.count;
    for (int64_t kt = a / bn; kt * bn < b; ++kt) {
      const int64_t k0 = kt * bn;
      f(kt, std::max(a, k0) - k0, std::min(b, k0 + bn) - k0);
    }
  } else {
    for (int64_t i = 0; i < r.count; ++i) {
      const int64_t k = r.start + i * r.stride;
      const int64_t kt = k / bn;
      f(kt, k - kt * bn, k - kt * bn + 1);
    }
  }
}

// Per query tile scratch: counts per touched key tile.
struct TileScratch {
  std::vector<int64_t> count;   // [k_tiles]
  std::vector<int32_t> slot;    // [k_tiles] partial slot or -1
  std::vector<int64_t> touched;
  explicit TileScratch(int64_t k_tiles) : count(size_t(k_tiles), 0), slot(size_t(k_tiles), -1) {}
  // Counts the kept scores of each key tile that the query tile's runs touch (touched: those tiles).
  void count_runs(const std::vector<Run>& runs, int64_t bn) {
    touched.clear();
    for (const Run& r : runs)
      for_each_tile_span(r, bn, [&](int64_t kt, int64_t a, int64_t b) {
        if (count[size_t(kt)] == 0) touched.push_back(kt);
        count[size_t(kt)] += b - a;
      });
  }
  // Every valid (q, k) of key tile kt is kept.
  bool full(int64_t kt, int64_t valid_rows, const Space& sp) const {
    return count[size_t(kt)] == valid_rows * sp.bn && sp.k_valid(kt) == sp.bn;
  }
};

// Worker threads for building a plan: about 2^15 row x key units a thread at least (a scattered pattern's row
// costs O(Lk)).
int64_t plan_threads(int64_t q_tiles, int64_t k_len) {
  const int64_t by_size = std::max<int64_t>(1, q_tiles * std::max<int64_t>(k_len, 64) / (int64_t(1) << 15));
  return std::max<int64_t>(1, std::min({int64_t(plan_thread_cap()), q_tiles, by_size}));
}

// Collects the plan-space runs of every row of query tile qt; returns the number of valid rows.
int64_t tile_rows(const BoundPattern& pat, const Space& sp, int64_t qt, std::vector<Run>& tmp,
                  std::vector<int64_t>& row_begin, std::vector<Run>& runs, int64_t& nnz) {
  row_begin.assign(size_t(sp.bm) + 1, 0);
  runs.clear();
  int64_t valid = 0;
  for (int r = 0; r < sp.bm; ++r) {
    row_begin[size_t(r)] = int64_t(runs.size());
    const int64_t q = sp.q_token(qt * sp.bm + r);
    if (q >= sp.lq) continue;
    ++valid;
    pat.row(q, tmp);
    for (const Run& x : tmp) {
      nnz += x.count;
      sp.map_run(x, runs);
    }
  }
  row_begin[size_t(sp.bm)] = int64_t(runs.size());
  return valid;
}

// Tries to describe a partial tile's mask as a band lo <= kp - qp <= hi (restricted to the tile's valid
// keys). Rows whose token is out of range are don't-cares.
bool detect_band(const uint64_t* mask, const Space& sp, int64_t qt, int64_t kt, int64_t kvalid, int64_t& lo_out,
                 int64_t& hi_out) {
  const int words = sp.bn / 64;
  const int64_t q0 = qt * sp.bm, k0 = kt * sp.bn;
  int64_t lo = kNegInf, hi = kPosInf;
  bool have_lo = false, have_hi = false;
  std::vector<int64_t> a(size_t(sp.bm)), b(size_t(sp.bm));
  std::vector<char> valid(size_t(sp.bm));
  for (int r = 0; r < sp.bm; ++r) {
    valid[size_t(r)] = sp.q_token(q0 + r) < sp.lq;
    int64_t first = -1, last = -1, pop = 0;
    for (int w = 0; w < words; ++w) {
      const uint64_t x = mask[size_t(r) * words + w];
      if (!x) continue;
      pop += __builtin_popcountll(x);
      if (first < 0) first = w * 64 + __builtin_ctzll(x);
      last = w * 64 + 63 - __builtin_clzll(x);
    }
    if (!valid[size_t(r)]) continue;
    if (pop == 0) {
      a[size_t(r)] = b[size_t(r)] = 0;
      continue;
    }
    if (pop != last - first + 1) return false;  // a hole: not a band
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
    if (!valid[size_t(r)]) continue;
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
    << " bitmask), nnz " << nnz << ", waste " << waste();
  if (band) s << ", band rows [" << band_lo << ", " << band_hi << "]";
  s << ", built in " << build_ms << " ms";
  return s.str();
}

namespace {
// analysis: analyze(pat) where the caller has it already (its band rows), else computed here.
BlockPlan build_plan(const BoundPattern& pat, int bm, int bn, int d, const Analysis* analysis) {
  const auto t0 = std::chrono::steady_clock::now();
  if ((bm != 64 && bm != 128 && bm != 192) || (bn != 64 && bn != 128))
    throw Error("block plan: tiles must be 64, 128 or 192 query rows by 64 or 128 keys, got " + std::to_string(bm) + "x" +
                std::to_string(bn));
  if (d < 1 || d > 64) throw Error("block plan: perm_d must be in [1, 64], got " + std::to_string(d));
  if (pat.q_len() <= 0 || pat.k_len() <= 0) throw Error("block plan: empty lengths");
  const Space sp(pat.q_len(), pat.k_len(), bm, bn, d);
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

  const int words = bm * bn / 64, row_words = bn / 64;
  // Query tiles are independent: contiguous ranges of them are built on worker threads (a random pattern's
  // row costs O(Lk) hashes: 16384 rows took seconds on one thread), then concatenated in order, so the plan
  // is the same for any thread count.
  struct Part {
    std::vector<int64_t> offsets;  // entries before each query tile, within this part
    std::vector<TileEntry> entries;
    std::vector<uint64_t> masks;
    int64_t nnz = 0, n_full = 0, n_band = 0, n_bitmask = 0;
  };
  auto build_range = [&](int64_t qt_begin, int64_t qt_end, Part& out) {
    TileScratch scr(sp.k_tiles);
    std::vector<Run> tmp, runs;
    std::vector<int64_t> row_begin;
    std::vector<uint64_t> pmask;  // partial masks of the current query tile
    std::vector<int64_t> partial_kt;
    for (int64_t qt = qt_begin; qt < qt_end; ++qt) {
      out.offsets.push_back(int64_t(out.entries.size()));
      const int64_t valid_rows = tile_rows(pat, sp, qt, tmp, row_begin, runs, out.nnz);
      scr.count_runs(runs, bn);
      std::sort(scr.touched.begin(), scr.touched.end());
      partial_kt.clear();
      for (int64_t kt : scr.touched) {
        if (!scr.full(kt, valid_rows, sp)) {
          scr.slot[size_t(kt)] = int32_t(partial_kt.size());
          partial_kt.push_back(kt);
        }
      }
      pmask.assign(partial_kt.size() * size_t(words), 0);
      if (!partial_kt.empty()) {
        for (int r = 0; r < bm; ++r) {
          for (int64_t i = row_begin[size_t(r)]; i < row_begin[size_t(r) + 1]; ++i)
            for_each_tile_span(runs[size_t(i)], bn, [&](int64_t kt, int64_t a, int64_t b) {
              const int32_t s = scr.slot[size_t(kt)];
              if (s < 0) return;
              uint64_t* m = &pmask[size_t(s) * words + size_t(r) * row_words];
              for (int64_t c = a; c < b;) {  // set bits [a, b) word by word
                const int64_t w = c / 64, e = std::min(b, (w + 1) * 64);
                const int64_t n = e - c;
                const uint64_t bits = n == 64 ? ~uint64_t(0) : ((uint64_t(1) << n) - 1) << (c % 64);
                m[w] |= bits;
                c = e;
              }
            });
        }
      }
      for (int64_t kt : scr.touched) {
        TileEntry e{int32_t(kt), kFull, 0, 0};
        const int32_t s = scr.slot[size_t(kt)];
        if (s >= 0) {
          const uint64_t* m = &pmask[size_t(s) * words];
          int64_t lo, hi;
          if (detect_band(m, sp, qt, kt, sp.k_valid(kt), lo, hi)) {
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
    build_range(sp.q_tiles * t / nthreads, sp.q_tiles * (t + 1) / nthreads, parts[size_t(t)]);
  });
  int64_t qt = 0;
  for (Part& part : parts) {
    const int64_t base = int64_t(plan.entries.size()), mask_base = int64_t(plan.masks.size()) / words;
    for (int64_t off : part.offsets) plan.row_offsets[size_t(qt++)] = base + off;
    for (TileEntry& e : part.entries)
      if (e.mask >= 0) {
        if (mask_base + e.mask >= int64_t(INT32_MAX)) throw Error("block plan: too many bitmasks");
        e.mask = int32_t(mask_base + e.mask);
      }
    plan.entries.insert(plan.entries.end(), part.entries.begin(), part.entries.end());
    plan.masks.insert(plan.masks.end(), part.masks.begin(), part.masks.end());
    plan.nnz += part.nnz;
    plan.n_full += part.n_full;
    plan.n_band += part.n_band;
    plan.n_bitmask += part.n_bitmask;
    part = Part{};
  }
  plan.row_offsets[size_t(sp.q_tiles)] = int64_t(plan.entries.size());

  plan.order.resize(size_t(sp.q_tiles));
  std::iota(plan.order.begin(), plan.order.end(), 0);
  std::stable_sort(plan.order.begin(), plan.order.end(), [&](int32_t a, int32_t b) {
    return plan.row_offsets[size_t(a) + 1] - plan.row_offsets[size_t(a)] >
           plan.row_offsets[size_t(b) + 1] - plan.row_offsets[size_t(b)];
  });
  if (d == 1) {
    const BandRows br = analysis ? analysis->band : analyze(pat).band;
    plan.band = br.ok;
    plan.band_lo = br.lo;
    plan.band_hi = br.hi;
  }
  plan.build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return plan;
}
}  // namespace

BlockPlan build_block_plan(const BoundPattern& pat, int bm, int bn, int d, const Analysis* analysis) {
  return build_plan(pat, bm, bn, d, analysis);
}

int entry_halves(const BlockPlan& plan, int64_t qt, int64_t i) {
  if (plan.block_n != 128) return 1;
  const TileEntry& e = plan.entries[size_t(i)];
  if (e.mask == kFull) return 3;
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
// A candidate: a tile shape priced by its kernel-table row.
struct Candidate {
  int block_m, block_n, d;
  const KernelConfig* row;
  double cost = 0;
};

// Predicted cost of a candidate from a sample of query tiles (no bitmasks built).
double estimate_cost(const BoundPattern& pat, const Candidate& c) {
  const int bm = c.block_m, bn = c.block_n;
  const Space sp(pat.q_len(), pat.k_len(), bm, bn, c.d);
  const int64_t samples = std::min<int64_t>(sp.q_tiles, 48);
  TileScratch scr(sp.k_tiles);
  std::vector<Run> tmp, runs;
  std::vector<int64_t> row_begin;
  double cost = 0;
  for (int64_t i = 0; i < samples; ++i) {
    const int64_t qt = samples == sp.q_tiles ? i : (i * sp.q_tiles) / samples;
    int64_t nnz = 0;
    const int64_t valid_rows = tile_rows(pat, sp, qt, tmp, row_begin, runs, nnz);
    scr.count_runs(runs, bn);
    for (int64_t kt : scr.touched) {
      cost += double(bm) * bn * (scr.full(kt, valid_rows, sp) ? 1.0 : c.row->partial_cost);
      scr.count[size_t(kt)] = 0;
    }
  }
  return cost * c.row->full_cost * double(sp.q_tiles) / double(std::max<int64_t>(samples, 1));
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
    if (same == out.end()) out.push_back({r.block_m, r.block_n, d, &r});
    else if (ws) same->row = &r;
  }
  return out;
}
}  // namespace

BlockPlan choose_block_plan(const BoundPattern& pat, const Analysis& an, int64_t head_dim, int block_m, int block_n,
                            int perm_d, bool tma) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int> perms;
  if (perm_d >= 1) {
    perms = {perm_d};
  } else {
    const int d = an.permutation(kMaxGpuPermutation);
    perms = {1};
    if (d > 1) perms.push_back(d);
  }
  // Band rows on the TMA kernel's device at head dim 64: the band kernel multiplies 64-row slabs over 64-key
  // chunks, so the tile's height costs no area there, and 192-row items share each chunk among three consumer
  // warpgroups (bench/LOG.md).
  const bool band_plan = block_m <= 0 && tma && head_dim == 64 && perm_d <= 1 && an.band.ok &&
                         find_kernel(KernelKind::sm90_band, 192, 128, 64) >= 0;
  int bm = 192, bn = 128, bd = 1;
  if (!band_plan && block_m > 0 && block_n > 0) {
    bm = block_m, bn = block_n, bd = perms[0];
    if (perms.size() > 1) {  // a forced shape: still choose the permutation
      std::vector<Candidate> cands;
      for (int d : perms)
        for (const Candidate& c : candidates(head_dim, d, tma))
          if (c.block_m == bm && c.block_n == bn) cands.push_back(c);
      double best = 0;
      for (Candidate& c : cands) {
        c.cost = estimate_cost(pat, c);
        if (&c == &cands[0] || c.cost < best) best = c.cost, bd = c.d;
      }
    }
  } else if (!band_plan) {
    std::vector<Candidate> cands;
    for (int d : perms)
      for (const Candidate& c : candidates(head_dim, d, tma)) cands.push_back(c);
    if (cands.empty())
      throw Error("block plan: the kernel table has no fused GPU kernel at head dim " + std::to_string(head_dim));
    // The estimates sample rows of the pattern: a thread a candidate, within the cap.
    common::parallel_for(int64_t(cands.size()), int(std::min<int64_t>(int64_t(cands.size()), plan_thread_cap())),
                         [&](int64_t i, int) { cands[size_t(i)].cost = estimate_cost(pat, cands[size_t(i)]); });
    double best = 0;
    for (const Candidate& c : cands)  // in order: ties keep the earlier candidate
      if (&c == &cands[0] || c.cost < best) best = c.cost, bm = c.block_m, bn = c.block_n, bd = c.d;
  }
  BlockPlan p = build_plan(pat, bm, bn, bd, &an);
  p.build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return p;
}

}  // namespace spattn::plan
