// The run-time tile lists' walks (src/cuda/runtime/tile_walk.hpp), run on the host: for random packed documents (one
// set of boundaries, or separate key boundaries and lengths) and
// block masks, forward and key-major (the backward's), every listed tile's pairs (full, band or bitmask, as the kernels read them) are exactly the mask's pairs
// in that tile, every tile holding a kept pair is listed once, in ascending order, and no full tile runs past the keys.
// The same walks write the lists on the GPU (tile_lists.cu); here they are checked without one.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <vector>

#include "cuda/runtime/tile_walk.hpp"
#include "plan/analysis.hpp"
#include "plan/gpu/block_plan.hpp"
#include "plan/key_plan.hpp"
#include "spattn/pattern.hpp"

namespace {

using spattn::cuda::runtime::BlockTileArgs;
using spattn::cuda::runtime::DocTileArgs;
using spattn::cuda::runtime::Entry4;

using Kept = std::function<bool(int64_t q, int64_t k)>;
using Word = std::function<unsigned long long(int outer, const Entry4& e, int w)>;

// Checks one list: outer tile t's entries (inner tiles) against `kept`. keys: key-major (outer = key tiles).
void check_tile(int t, const std::vector<Entry4>& es, bool keys, int om, int im, int64_t lq, int64_t lk, const Kept& kept,
                const Word& word) {
  const int64_t olen = keys ? lk : lq, ilen = keys ? lq : lk;
  const int64_t o0 = int64_t(t) * om, o1 = std::min(o0 + om, olen);
  std::vector<char> listed(size_t((ilen + im - 1) / im), 0);
  for (size_t i = 0; i < es.size(); ++i) {
    const Entry4& e = es[i];
    ASSERT_TRUE(e.x >= 0 && int64_t(e.x) * im < ilen) << "tile " << t << " entry " << i << " tile " << e.x;
    if (i > 0) ASSERT_LT(es[i - 1].x, e.x) << "tile " << t << ": entries not strictly ascending";
    listed[size_t(e.x)] = 1;
    const int64_t i0 = int64_t(e.x) * im, i1 = std::min(i0 + im, ilen);
    const int64_t q0 = keys ? i0 : o0, q1 = keys ? i1 : o1, k0 = keys ? o0 : i0, k1 = keys ? o1 : i1;
    const int bn = keys ? om : im;
    if (e.y == -1) ASSERT_EQ(k1 - k0, bn) << "a full tile past the keys (tile " << t << ", " << e.x << ")";
    for (int64_t q = q0; q < q1; ++q)
      for (int64_t k = k0; k < k1; ++k) {
        bool run;
        if (e.y == -1) run = true;
        else if (e.y == -2) run = e.z <= k - q && k - q <= e.w;
        else if (keys) run = (word(t, e, int(k - k0)) >> (q - q0)) & 1;  // word: a key's bits over the queries
        else {
          const int64_t bit = (q - q0) * bn + (k - k0);
          run = (word(t, e, int(bit / 64)) >> (bit % 64)) & 1;
        }
        ASSERT_EQ(run, kept(q, k)) << "tile " << t << " entry " << e.x << " kind " << e.y << " pair (" << q << ", " << k << ")";
      }
  }
  for (int64_t it = 0; it < int64_t(listed.size()); ++it) {
    if (listed[size_t(it)]) continue;
    const int64_t i0 = it * im, i1 = std::min(i0 + im, ilen);
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t i = i0; i < i1; ++i)
        ASSERT_FALSE(keys ? kept(i, o) : kept(o, i)) << "tile " << t << ": unlisted tile " << it << " keeps a pair";
  }
}

TEST(RuntimeTiles, DocumentsForwardAndKeyMajor) {
  std::mt19937 rng(1);
  auto boundaries = [&](int n, int64_t L, bool gaps) {
    std::vector<int64_t> cu(size_t(n + 1));
    for (int64_t& x : cu) x = std::uniform_int_distribution<int64_t>(0, L)(rng);
    std::sort(cu.begin(), cu.end());
    if (!gaps) cu.front() = 0, cu.back() = L;
    return cu;
  };
  for (int trial = 0; trial < 600; ++trial) {
    // odd trials: separate key boundaries (cu_seqlens_k) over keys of another length
    const bool separate = trial % 2 == 1;
    const int64_t L = std::uniform_int_distribution<int64_t>(1, 700)(rng);
    const int64_t Lk = separate ? std::uniform_int_distribution<int64_t>(1, 700)(rng) : L;
    const int n = std::uniform_int_distribution<int>(1, trial % 5 == 0 ? 40 : 9)(rng);
    const std::vector<int64_t> cu = boundaries(n, L, trial % 3 == 0);
    const std::vector<int64_t> ck = separate ? boundaries(n, Lk, trial % 7 == 0) : cu;
    const int kind = (trial / 2) % 4;  // dense, causal, a causal window, a two-sided window (random widths)
    const int lo = kind < 2 ? int(-(L + 1)) : -std::uniform_int_distribution<int>(0, 300)(rng);
    const int hi = kind == 0 ? int(Lk + 1) : kind == 3 ? std::uniform_int_distribution<int>(0, 200)(rng) : 0;
    const Kept kept = [&](int64_t q, int64_t k) {
      for (int d = 0; d < n; ++d)
        if (cu[size_t(d)] <= q && q < cu[size_t(d + 1)]) {
          const int64_t dk = k - ck[size_t(d)], dq = q - cu[size_t(d)];  // document coordinates
          return ck[size_t(d)] <= k && k < ck[size_t(d + 1)] && lo <= dk - dq && dk - dq <= hi;
        }
      return false;
    };
    SCOPED_TRACE("trial " + std::to_string(trial) + ": L " + std::to_string(L) + " x " + std::to_string(Lk) + ", " +
                 std::to_string(n) + " documents" + (separate ? " (separate key boundaries)" : "") + ", band " +
                 std::to_string(lo) + ".." + std::to_string(hi));
    DocTileArgs a;
    a.cu = cu.data(), a.cu_bits = 64, a.documents = n;
    if (separate) a.cu_k = ck.data(), a.cu_k_bits = 64;
    a.q_len = int(L), a.k_len = int(Lk);
    a.lo = lo, a.hi = hi;
    a.entry_capacity = int64_t(1) << 40;
    for (bool keys : {false, true}) {
      a.block_m = keys ? 64 : 128, a.block_n = 128;
      const int om = 128, im = keys ? 64 : 128;
      const int64_t olen = keys ? Lk : L, ilen = keys ? L : Lk;
      const int tiles = int((olen + om - 1) / om), inner = int((ilen + im - 1) / im);
      int64_t at = 0;
      for (int t = 0; t < tiles; ++t) {
        const int64_t count = spattn::cuda::runtime::walk(a, t, nullptr, 0, keys);
        std::vector<Entry4> es(static_cast<size_t>(count));
        ASSERT_EQ(spattn::cuda::runtime::walk(a, t, es.data(), at, keys), count);
        for (size_t i = 0; i < es.size(); ++i)
          if (es[i].y >= 0) ASSERT_EQ(es[i].y, at + int64_t(i)) << "a bitmask's index is its entry's";
        check_tile(t, es, keys, om, im, L, Lk, kept, [&](int outer, const Entry4& e, int w) {
          return keys ? spattn::cuda::runtime::doc_key_mask_word(a, outer, e.x, w)
                      : spattn::cuda::runtime::doc_mask_word(a, outer, e.x, w);
        });
        at += count;
      }
      // The arrays' capacity (device_runner.cpp sizes them by document_entries) holds every list.
      const int64_t per = keys ? spattn::cuda::runtime::document_tiles_per_row(128, 64, -hi, -lo, inner)
                               : spattn::cuda::runtime::document_tiles_per_row(128, 128, lo, hi, inner);
      EXPECT_LE(at, spattn::cuda::runtime::document_entries(tiles, inner, per, n, separate)) << (keys ? "key-major" : "forward");
    }
  }
}

TEST(RuntimeTiles, BlockMasks) {
  std::mt19937 rng(2);
  for (int trial = 0; trial < 32; ++trial) {
    const int64_t bs = trial % 4 < 2 ? 128 : 64;  // blocks (and tiles) of 128, or 64
    const int64_t Lq = std::uniform_int_distribution<int64_t>(1, 700)(rng), Lk = std::uniform_int_distribution<int64_t>(1, 700)(rng);
    const int64_t nq = (Lq + bs - 1) / bs + trial % 2, nk = (Lk + bs - 1) / bs, cap = nk + 1;
    const bool band = trial % 3 != 0;
    const int lo = trial % 3 == 2 ? -100 : int(-(Lq + 1)), hi = band ? 0 : int(Lk + 1);
    std::vector<int32_t> num(static_cast<size_t>(nq)), idx(static_cast<size_t>(nq * cap), 9999),
        fnum(static_cast<size_t>(nq)), fidx(static_cast<size_t>(nq * cap), -5);
    for (int64_t r = 0; r < nq; ++r) {
      std::vector<int32_t> b(static_cast<size_t>(nk));
      for (int64_t j = 0; j < nk; ++j) b[size_t(j)] = int32_t(j);
      std::shuffle(b.begin(), b.end(), rng);
      const int64_t n = std::uniform_int_distribution<int64_t>(0, nk)(rng), f = std::uniform_int_distribution<int64_t>(0, n)(rng);
      fnum[size_t(r)] = int32_t(f), num[size_t(r)] = int32_t(n - f);
      std::copy(b.begin(), b.begin() + f, fidx.begin() + r * cap);
      std::copy(b.begin() + f, b.begin() + n, idx.begin() + r * cap);
    }
    auto listed = [&](const std::vector<int32_t>& cnt, const std::vector<int32_t>& ix, int64_t qb, int64_t kb) {
      for (int64_t j = 0; j < cnt[size_t(qb)]; ++j)
        if (ix[size_t(qb * cap + j)] == kb) return true;
      return false;
    };
    const Kept kept = [&](int64_t q, int64_t k) {
      if (listed(fnum, fidx, q / bs, k / bs)) return true;
      return listed(num, idx, q / bs, k / bs) && (!band || (lo <= k - q && k - q <= hi));
    };
    SCOPED_TRACE("trial " + std::to_string(trial));
    BlockTileArgs a;
    a.num = num.data(), a.idx = idx.data(), a.full_num = fnum.data(), a.full_idx = fidx.data();
    a.num_s[2] = 1, a.idx_s[2] = cap, a.idx_s[3] = 1, a.full_num_s[2] = 1, a.full_idx_s[2] = cap, a.full_idx_s[3] = 1;
    a.cap = a.full_cap = int(cap);
    a.q_len = int(Lq), a.k_len = int(Lk), a.q_tiles = int((Lq + bs - 1) / bs), a.k_tiles = int(nk);
    a.band = band, a.lo = lo, a.hi = hi;
    a.block_m = a.block_n = int(bs);
    auto by_tile = [](const Entry4& x, const Entry4& y) { return x.x < y.x; };
    const auto none = [](int, const Entry4&, int) { return 0ull; };
    // Forward (as block_lists writes them): each query tile's listed blocks of the types block_entry gives, sorted.
    std::vector<std::vector<Entry4>> key_major(static_cast<size_t>(nk));
    for (int qt = 0; qt < a.q_tiles; ++qt) {
      std::vector<Entry4> es;
      const int64_t q0 = int64_t(qt) * bs, q1 = std::min<int64_t>(q0 + bs, Lq);
      spattn::cuda::runtime::each_block(a, 0, 0, qt, [&](int64_t kt, bool full) {
        if (const int type = spattn::cuda::runtime::block_entry(a, q0, q1, kt, full))
          es.push_back(spattn::cuda::runtime::block_entry4(a, kt, type));
        const int64_t sub = bs / 64;  // the 64-row query tiles of a block (key-major, as block_key_lists)
        for (int64_t t = sub * qt; t < sub * qt + sub && t * 64 < Lq; ++t)
          if (const int type = spattn::cuda::runtime::block_entry(a, t * 64, std::min<int64_t>(t * 64 + 64, Lq), kt, full))
            key_major[size_t(kt)].push_back(spattn::cuda::runtime::block_entry4(a, t, type));
      });
      std::sort(es.begin(), es.end(), by_tile);
      check_tile(qt, es, false, int(bs), int(bs), Lq, Lk, kept, none);
    }
    for (int64_t kt = 0; kt < nk; ++kt) {  // key tiles as wide as the blocks (64: the sm90_bwd 64x64 row)
      std::sort(key_major[size_t(kt)].begin(), key_major[size_t(kt)].end(), by_tile);
      check_tile(int(kt), key_major[size_t(kt)], true, int(bs), 64, Lq, Lk, kept, none);
    }
  }
}

// The grid builds of block masks' lists (tile_lists.cu, launch_block_key_tiles_grid and launch_block_tiles_grid),
// their kernels' steps run on the host with the same walks (marks by block_mark_word, each row's entries word by word
// by key_word_entries / row_word_entries, a warp's lanes each a run of words placed after the lower lanes', the order
// by key_order_key), against the static plans of the same pairs (the backward's key-major plan, plan/key_plan.cpp, and
// the forward's tile plan): for random block masks (full and partial blocks, no spec, causal or a causal window, masks
// per batch element and per head as under grouped-query attention, empty rows, query blocks past Lq, key tiles past
// the keys, more than 32 blocks a word of marks) each key tile lists the same 64-row query tiles in the same
// (ascending) order and each query tile the same key tiles, the entries keep exactly the mask's pairs, and the key
// tiles run in the same order (most entries first).
TEST(RuntimeTiles, BlockGridListsMatchStaticPlans) {
  namespace rt = spattn::cuda::runtime;
  std::mt19937 rng(3);
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t bs = trial % 3 == 2 ? 64 : 128;
    const int64_t top = trial % 5 == 4 ? 4500 : 700;  // some with more than 32 query blocks (words of marks)
    const int64_t Lq = std::uniform_int_distribution<int64_t>(1, top)(rng);
    const int64_t Lk = trial % 2 ? Lq : std::uniform_int_distribution<int64_t>(1, top)(rng);
    const int64_t nq = (Lq + bs - 1) / bs + trial % 2, nk = (Lk + bs - 1) / bs, cap = std::min<int64_t>(nk, 12);
    const int nb = trial % 4 == 1 ? 2 : 1, nh = trial % 3 == 0 ? 3 : 1, lists = nb * nh;
    const int spec = trial % 3;  // none, causal, a causal window of 100
    const int lo = spec == 2 ? -100 : int(-(Lq + 1)), hi = spec ? 0 : int(Lk + 1);
    std::vector<int32_t> num(size_t(lists * nq)), idx(size_t(lists * nq * cap), 9999), fnum(size_t(lists * nq)),
        fidx(size_t(lists * nq * cap), -5);
    std::vector<int8_t> kind(size_t(lists * nq * nk), 0);  // 0 none, 1 partial, 2 full
    for (int64_t r = 0; r < lists * nq; ++r) {
      std::vector<int32_t> b(static_cast<size_t>(nk));
      for (int64_t j = 0; j < nk; ++j) b[size_t(j)] = int32_t(j);
      std::shuffle(b.begin(), b.end(), rng);
      const int64_t n = rng() % 4 == 0 ? 0 : std::uniform_int_distribution<int64_t>(0, cap)(rng);  // empty rows
      const int64_t f = std::uniform_int_distribution<int64_t>(0, n)(rng);
      fnum[size_t(r)] = int32_t(f), num[size_t(r)] = int32_t(n - f);
      for (int64_t j = 0; j < n; ++j) {
        (j < f ? fidx : idx)[size_t(r * cap + (j < f ? j : j - f))] = b[size_t(j)];
        kind[size_t(r * nk + b[size_t(j)])] = j < f ? 2 : 1;
      }
    }
    SCOPED_TRACE("trial " + std::to_string(trial) + ": " + std::to_string(Lq) + " x " + std::to_string(Lk) +
                 ", blocks of " + std::to_string(bs) + ", " + std::to_string(lists) + " lists");
    rt::BlockTileArgs a;
    a.num = num.data(), a.idx = idx.data(), a.full_num = fnum.data(), a.full_idx = fidx.data();
    a.num_s[0] = nh * nq, a.num_s[1] = nq, a.num_s[2] = 1;
    a.idx_s[0] = nh * nq * cap, a.idx_s[1] = nq * cap, a.idx_s[2] = cap, a.idx_s[3] = 1;
    std::copy(a.num_s, a.num_s + 3, a.full_num_s);
    std::copy(a.idx_s, a.idx_s + 4, a.full_idx_s);
    a.cap = a.full_cap = int(cap), a.heads = nh, a.lists = lists;
    a.q_len = int(Lq), a.k_len = int(Lk), a.block_m = 64, a.block_n = int(bs);
    a.k_tiles = int(nk), a.band = spec != 0, a.lo = lo, a.hi = hi;
    const int q_blocks = int((Lq + bs - 1) / bs), sub = int(bs / 64);
    const int64_t q_tiles = (Lq + 63) / 64, words = (q_blocks + 31) / 32;
    a.list_capacity = q_tiles * nk;
    // block_marks<true> (a row a key tile, a bit a query block) and block_marks<false> (a row a query tile)
    const int64_t fwords = (nk + 31) / 32;
    std::vector<unsigned> marks(size_t(lists * 2 * nk * words), 0), fmarks(size_t(lists * 2 * q_blocks * fwords), 0);
    for (int l = 0; l < lists; ++l)
      for (int qb = 0; qb < q_blocks; ++qb)
        for (int full = 0; full < 2; ++full)
          for (int64_t j = 0; j < rt::block_count(a, l / nh, l % nh, qb, full != 0); ++j) {
            const int64_t kt = rt::block_index(a, l / nh, l % nh, qb, full != 0, j);
            if (kt < 0 || kt >= nk) continue;
            marks[size_t(rt::block_mark_word(l, full != 0, kt, nk, words, qb))] |= 1u << (qb % 32);
            fmarks[size_t(rt::block_mark_word(l, full != 0, qb, q_blocks, fwords, kt))] |= 1u << (kt % 32);
          }
    for (int l = 0; l < lists; ++l) {
      // block_counts, block_offsets (the order: ascending key_order_key) and block_key_entries' lanes
      std::vector<int64_t> offsets(size_t(nk + 1), 0);
      std::vector<std::vector<Entry4>> cols(static_cast<size_t>(nk));
      std::vector<unsigned long long> keys;
      for (int64_t kt = 0; kt < nk; ++kt) {
        const unsigned* part = marks.data() + rt::block_mark_word(l, false, kt, nk, words, 0);
        const unsigned* full = marks.data() + rt::block_mark_word(l, true, kt, nk, words, 0);
        int64_t n = 0;
        for (int64_t w = 0; w < words; ++w) n += rt::key_word_entries(a, kt, w, part[w], full[w], sub, nullptr, 0);
        offsets[size_t(kt + 1)] = offsets[size_t(kt)] + n;
        keys.push_back(rt::key_order_key(n, kt));
        std::vector<Entry4>& col = cols[size_t(kt)];
        col.resize(size_t(n));
        const int64_t per = (words + 31) / 32;
        int64_t at = 0;
        for (int lane = 0; lane < 32; ++lane)
          for (int64_t w = std::min(lane * per, words); w < std::min(lane * per + per, words); ++w)
            at += rt::key_word_entries(a, kt, w, part[w], full[w], sub, col.data() + at, n - at);
        ASSERT_EQ(at, n);
      }
      ASSERT_LE(offsets.back(), a.list_capacity);
      std::sort(keys.begin(), keys.end());
      // The static plan of the same pairs.
      auto kept = [&](int64_t q, int64_t k) {
        const int t = kind[size_t((l * nq + q / bs) * nk + k / bs)];
        return t == 2 || (t == 1 && (spec == 0 || (lo <= k - q && k - q <= hi)));
      };
      std::vector<int64_t> rows{0};
      std::vector<int32_t> keep;
      for (int64_t q = 0; q < Lq; ++q) {
        for (int64_t k = 0; k < Lk; ++k)
          if (kept(q, k)) keep.push_back(int32_t(k));
        rows.push_back(int64_t(keep.size()));
      }
      const spattn::BoundPattern pat = spattn::BoundPattern::from_rows(Lq, Lk, rows, keep);
      const spattn::plan::BlockPlan plan =
          spattn::plan::choose_block_plan(pat, spattn::plan::analyze(pat), 128, 64, int(bs), 1, false, 0);
      ASSERT_EQ(plan.perm_d, 1);
      const spattn::plan::KeyMajorPlan km = spattn::plan::key_major(plan);
      ASSERT_EQ(km.k_tiles, nk);
      const auto none = [](int, const Entry4&, int) { return 0ull; };
      for (int64_t kt = 0; kt < nk; ++kt) {
        const std::vector<Entry4>& col = cols[size_t(kt)];
        std::vector<int> mine, theirs;
        for (const Entry4& e : col) mine.push_back(e.x);
        for (int64_t i = km.col_offsets[size_t(kt)]; i < km.col_offsets[size_t(kt) + 1]; ++i)
          theirs.push_back(km.entries[size_t(i)].kt);
        ASSERT_EQ(mine, theirs) << "list " << l << " key tile " << kt;
        check_tile(int(kt), col, true, int(bs), 64, Lq, Lk, kept, none);
      }
      for (int64_t i = 0; i < nk; ++i)
        ASSERT_EQ(int32_t(keys[size_t(i)] & 0xffffffffu), km.order[size_t(i)]) << "list " << l << " order " << i;
      // The forward's lists (block_entries<false>: a warp a query tile) against the static forward plan's rows.
      rt::BlockTileArgs f = a;
      f.block_m = int(bs);
      const spattn::plan::BlockPlan fplan =
          spattn::plan::choose_block_plan(pat, spattn::plan::analyze(pat), 128, int(bs), int(bs), 1, false, 0);
      ASSERT_EQ(fplan.perm_d, 1);
      int64_t total = 0;
      for (int64_t qt = 0; qt < q_blocks; ++qt) {
        const unsigned* part = fmarks.data() + rt::block_mark_word(l, false, qt, q_blocks, fwords, 0);
        const unsigned* full = fmarks.data() + rt::block_mark_word(l, true, qt, q_blocks, fwords, 0);
        int64_t n = 0;
        for (int64_t w = 0; w < fwords; ++w) n += rt::row_word_entries(f, qt, w, part[w], full[w], nullptr, 0);
        std::vector<Entry4> row(static_cast<size_t>(n));
        const int64_t per = (fwords + 31) / 32;
        int64_t at = 0;
        for (int lane = 0; lane < 32; ++lane)
          for (int64_t w = std::min(lane * per, fwords); w < std::min(lane * per + per, fwords); ++w)
            at += rt::row_word_entries(f, qt, w, part[w], full[w], row.data() + at, n - at);
        ASSERT_EQ(at, n);
        total += n;
        std::vector<int> mine, theirs;
        for (const Entry4& e : row) mine.push_back(e.x);
        for (int64_t i = fplan.row_offsets[size_t(qt)]; i < fplan.row_offsets[size_t(qt) + 1]; ++i)
          theirs.push_back(fplan.entries[size_t(i)].kt);
        ASSERT_EQ(mine, theirs) << "list " << l << " query tile " << qt;
        check_tile(int(qt), row, false, int(bs), int(bs), Lq, Lk, kept, none);
      }
      ASSERT_LE(total, q_blocks * nk);
    }
  }
}

}  // namespace
