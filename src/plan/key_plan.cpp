// plan/key_plan.cpp — see key_plan.hpp.
#include "plan/key_plan.hpp"

#include <algorithm>
#include <cstdint>
#include <numeric>

#include "plan/kernels.hpp"
#include "plan/key_strips.hpp"
#include "plan/tile_map.hpp"
#include "spattn/error.hpp"

namespace spattn::plan {

KeyMajorPlan key_major(const BlockPlan& plan) {
  if (plan.masks_drawn())
    throw Error("key-major plan: the plan's bitmasks are drawn on the device (BlockPlan::drawn), none on the host");
  if (plan.block_m != 64)
    throw Error("key-major plan: needs 64-row query tiles, the plan has " + std::to_string(plan.block_m));
  KeyMajorPlan out;
  out.block_m = plan.block_m;
  out.block_n = plan.block_n;
  out.q_tiles = plan.q_tiles;
  out.k_tiles = plan.k_tiles;
  const int bn = plan.block_n, words = int(plan.words_per_mask());
  out.col_offsets.assign(size_t(plan.k_tiles) + 1, 0);
  for (const TileEntry& e : plan.entries) ++out.col_offsets[size_t(e.kt) + 1];
  std::partial_sum(out.col_offsets.begin(), out.col_offsets.end(), out.col_offsets.begin());
  out.entries.resize(plan.entries.size());
  std::vector<int64_t> fill(out.col_offsets.begin(), out.col_offsets.end() - 1);
  int32_t nmask = 0;
  for (int64_t qt = 0; qt < plan.q_tiles; ++qt)  // ascending query tiles within each key tile's list
    for (int64_t i = plan.row_offsets[size_t(qt)]; i < plan.row_offsets[size_t(qt) + 1]; ++i) {
      const TileEntry& e = plan.entries[size_t(i)];
      TileEntry t{int32_t(qt), e.mask, e.lo, e.hi};
      if (e.mask >= 0) {
        t.mask = nmask++;
        const uint64_t* m = plan.masks.data() + size_t(e.mask) * size_t(words);
        out.masks.resize(size_t(nmask) * size_t(bn), 0);
        uint64_t* tm = out.masks.data() + size_t(t.mask) * size_t(bn);
        // m: bit r * bn + c is (row r, key c); tm[c] bit r.
        for (int r = 0; r < 64; ++r)
          for (int w = 0; w < bn / 64; ++w) {
            uint64_t x = m[size_t(r) * size_t(bn / 64) + size_t(w)];
            while (x) {
              const int c = 64 * w + __builtin_ctzll(x);
              x &= x - 1;
              tm[c] |= uint64_t(1) << r;
            }
          }
      }
      out.entries[size_t(fill[size_t(e.kt)]++)] = t;
    }
  out.order.resize(size_t(plan.k_tiles));
  std::iota(out.order.begin(), out.order.end(), 0);
  std::stable_sort(out.order.begin(), out.order.end(), [&](int32_t a, int32_t b) {
    return out.col_offsets[size_t(a) + 1] - out.col_offsets[size_t(a)] >
           out.col_offsets[size_t(b) + 1] - out.col_offsets[size_t(b)];
  });
  return out;
}

namespace {
// The transpose of a pattern: row k keeps the queries q that keep k (ascending), as an explicit pattern. O(nnz).
BoundPattern transposed(const BoundPattern& pattern) {
  const int64_t lq = pattern.q_len(), lk = pattern.k_len();
  std::vector<int64_t> offsets(size_t(lk) + 1, 0);
  RowRuns runs;
  auto each = [&](auto&& f) {
    for (int64_t q = 0; q < lq; ++q) {
      pattern.row(q, runs);
      for (const Run& r : runs)
        for (int64_t i = 0; i < r.count; ++i) f(q, r.start + i * r.stride);
    }
  };
  each([&](int64_t, int64_t k) { ++offsets[size_t(k) + 1]; });
  std::partial_sum(offsets.begin(), offsets.end(), offsets.begin());
  std::vector<int32_t> cols(size_t(offsets.back()));
  std::vector<int64_t> fill(offsets.begin(), offsets.end() - 1);
  each([&](int64_t q, int64_t k) { cols[size_t(fill[size_t(k)]++)] = int32_t(q); });  // q ascending in each row
  return BoundPattern::from_rows(lk, lq, std::move(offsets), std::move(cols));
}
}  // namespace

std::optional<KeyMajorPlan> key_major_strips(const BoundPattern& pattern, std::string* why) {
  auto fail = [&](const std::string& reason) -> std::optional<KeyMajorPlan> {
    if (why) *why = "query strips: " + reason;
    return std::nullopt;
  };
  const std::optional<NeighborhoodGrid> grid = pattern.neighborhood_grid();
  if (!grid) return fail("the pattern has no neighborhood grid");
  const BoundPattern t = transposed(pattern);
  std::optional<BlockPlan> best;
  std::string last;
  for (const TileBox& box : tile_boxes(*grid, 64)) {
    std::string w;
    std::optional<BlockPlan> sp = build_strip_plan(t, GridTiling::of(*grid, box), &w);
    if (!sp) {
      last = w;
      continue;
    }
    if (!best || sp->nentries() < best->nentries()) best = std::move(sp);
  }
  if (!best) return fail(last.empty() ? "no 64-token box fits the grid " + describe_grid(*grid) : last);
  const BlockPlan& sp = *best;  // its query tiles are our key boxes, its key strips our query strips
  KeyMajorPlan out;
  out.query_strips = true;
  out.block_m = out.block_n = 64;
  out.k_tiles = sp.q_tiles;
  out.q_tiles = sp.k_tiles;
  out.col_offsets = sp.row_offsets;
  out.entries.reserve(sp.entries.size());
  for (const TileEntry& e : sp.entries) {
    const KeyStrip& st = sp.strips[size_t(e.kt)];
    out.entries.push_back({e.kt, e.mask, st.base, strip_pack(st.width, st.count)});
  }
  // The strip plan's bitmask rows are its query rows (our keys), each a word over its strip's slots (our queries):
  // already the transposed layout.
  out.masks.assign(sp.masks.begin(), sp.masks.end());
  out.order = sp.order;
  out.k_map = sp.q_map;
  out.strip_sx = sp.strip_sx;
  out.strip_sy = sp.strip_sy;
  out.nnz = sp.nnz;
  out.key_boxes = sp.q_tiling.describe();
  return out;
}

int choose_backward_row(const Analysis& analysis, int64_t head_dim, bool warp_specialized) {
  // Residue-permuted analyses take the 64-key row where the head dim has one (cp.async steps, two CTAs an SM); the
  // others, and those at head dims without a 64-key row, the warp-specialized row: its 128-key tiles come out
  // without the permutation where the pattern allows (TileBackward runs the plain 64x128 row where they do not).
  // H100, dilated(256, 2), D=128, L=16384 (same process): plain 64x128 2.687 ms, warp-specialized 2.227 ms
  // (FlexAttention 2.584).
  const bool permuted = analysis.permutation(kMaxGpuPermutation) > 1;
  const int ws = first_kernel(KernelKind::sm90_bwd_ws, int(head_dim));
  int plain = -1, narrow = -1;
  for (int i = 0; i < kNumKernels; ++i) {
    const KernelConfig& c = kKernels[i];
    if (c.head_dim != head_dim || c.kind != KernelKind::sm90_bwd || bwd_strips_only(c)) continue;
    if (plain < 0) plain = i;
    if (c.block_n == 64 && narrow < 0) narrow = i;
  }
  if (permuted && narrow >= 0) return narrow;
  if (warp_specialized && ws >= 0) return ws;
  return plain;
}

std::vector<int32_t> dq_owners(const KeyMajorPlan& plan, bool* reverse, bool any_waits) {
  if (reverse) *reverse = false;
  if (plan.query_strips) return {};
  // The grid walks plan.order (section_item): every key tile once, else an owner might be a tile no item runs.
  if (int64_t(plan.order.size()) != plan.k_tiles)
    throw Error("dQ owners: the plan's order has " + std::to_string(plan.order.size()) + " key tiles, the plan " +
                std::to_string(plan.k_tiles));
  std::vector<int32_t> rank(size_t(plan.k_tiles), INT32_MAX);
  for (size_t r = 0; r < plan.order.size(); ++r) {
    const int32_t kt = plan.order[r];
    if (kt < 0 || kt >= plan.k_tiles || rank[size_t(kt)] != INT32_MAX)
      throw Error("dQ owners: the plan's order names key tile " + std::to_string(kt) + " at " + std::to_string(r) +
                  (kt < 0 || kt >= plan.k_tiles ? ", out of [0, " + std::to_string(plan.k_tiles) + ")" : ", again"));
    rank[size_t(kt)] = int32_t(r);
  }
  // f(key tile, its entry i of n, that entry's query tile) over every entry
  const auto each_entry = [&](auto&& f) {
    for (int64_t kt = 0; kt < plan.k_tiles; ++kt) {
      const int64_t e0 = plan.col_offsets[size_t(kt)], n = plan.col_offsets[size_t(kt) + 1] - e0;
      for (int64_t i = 0; i < n; ++i) f(kt, i, n, size_t(plan.entries[size_t(e0 + i)].kt));
    }
  };
  std::vector<int32_t> owner(size_t(plan.q_tiles), -1);
  each_entry([&](int64_t kt, int64_t, int64_t, size_t q) {
    if (owner[q] < 0 || rank[size_t(kt)] < rank[size_t(owner[q])]) owner[q] = int32_t(kt);
  });
  if (std::find(owner.begin(), owner.end(), -1) != owner.end()) return {};
  if (!any_waits) {  // a band: each key tile's query tiles one run, a short one
    bool band = true;
    size_t prev = 0;
    each_entry([&](int64_t, int64_t i, int64_t n, size_t q) {
      band = band && n <= kOwnerMaxEntries && (i == 0 || q == prev + 1);
      prev = q;
    });
    if (!band) return {};
  }
  // The steps that would wait, walking the lists first to last (rev false) or last first: the other key tiles' entries
  // of a query tile at or before the owner's step (each key tile's walk counted from its own start).
  const auto waits = [&](bool rev) {
    std::vector<int64_t> own_step(size_t(plan.q_tiles), 0);
    each_entry([&](int64_t kt, int64_t i, int64_t n, size_t q) {
      if (owner[q] == kt) own_step[q] = rev ? n - 1 - i : i;
    });
    int64_t w = 0;
    each_entry([&](int64_t kt, int64_t i, int64_t n, size_t q) {
      w += owner[q] != kt && (rev ? n - 1 - i : i) <= own_step[q];
    });
    return w;
  };
  const int64_t fwd = waits(false), rev = waits(true);
  const int64_t others = int64_t(plan.entries.size()) - plan.q_tiles;
  if (!any_waits && 8 * std::min(fwd, rev) > others) return {};
  if (reverse) *reverse = rev < fwd;
  return owner;
}

}  // namespace spattn::plan
