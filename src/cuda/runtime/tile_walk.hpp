// cuda/runtime/tile_walk.hpp — the walks behind the run-time tile lists (tile_lists.cu), callable on the host too so
// that tests/runtime_tiles_test.cpp checks them on the CPU against the pairs they must cover (no GPU needed): which
// tiles a query tile (or, key-major, a key tile) visits and of which kind, and the bitmask words of the partial ones.
#pragma once
#include <cstdint>

#include "cuda/runtime/tile_lists.hpp"

#if defined(__CUDACC__)
#define SPATTN_HD __host__ __device__ __forceinline__
#else
#define SPATTN_HD inline
#endif

namespace spattn::cuda::runtime {

// A tile entry as the kernels read it (int4: {tile, mask, lo, hi}).
struct Entry4 {
  int x, y, z, w;
};

SPATTN_HD int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
SPATTN_HD int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
// The lowest set bit's index of x != 0.
SPATTN_HD int low_bit(unsigned x) {
#if defined(__CUDA_ARCH__)
  return __ffs(int(x)) - 1;
#else
  return __builtin_ctz(x);
#endif
}

SPATTN_HD int64_t boundary(const DocTileArgs& a, int i) {
  return a.cu_bits == 32 ? int64_t(static_cast<const int*>(a.cu)[i * a.cu_stride])
                         : int64_t(static_cast<const long long*>(a.cu)[i * a.cu_stride]);
}
// Document i's first key (cu_seqlens_k where given, else the queries' boundary).
SPATTN_HD int64_t key_boundary(const DocTileArgs& a, int i) {
  if (!a.cu_k) return boundary(a, i);
  return a.cu_k_bits == 32 ? int64_t(static_cast<const int*>(a.cu_k)[i * a.cu_k_stride])
                           : int64_t(static_cast<const long long*>(a.cu_k)[i * a.cu_k_stride]);
}
SPATTN_HD int64_t side_boundary(const DocTileArgs& a, int i, bool keys) { return keys ? key_boundary(a, i) : boundary(a, i); }

// The first document d with cu[d + 1] > x (n where none): the one that holds x if any, else the next. keys: by the
// keys' boundaries.
SPATTN_HD int first_doc_after(const DocTileArgs& a, int64_t x, bool keys = false) {
  int lo = 0, hi = a.documents;  // answer in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (side_boundary(a, mid + 1, keys) > x) hi = mid; else lo = mid + 1;
  }
  return lo;
}

// kFull (-1) where the band lo..hi (of k - q) keeps every pair of the tile [q0, q1) x [k0, k1) and every key of the
// tile is in range (the kernels run full tiles unmasked: a tile past k_len is never full), else kBand (-2: the kernels
// mask by the band and by the valid keys).
SPATTN_HD int full_or_band(const DocTileArgs& a, int64_t q0, int64_t q1, int64_t k0, int64_t k1, int64_t lo, int64_t hi) {
  return (k1 - k0 == a.block_n && k0 - (q1 - 1) >= lo && (k1 - 1) - q0 <= hi) ? -1 : -2;
}

// Walks tile t's partner tiles in ascending order: the key tiles of query tile t, or (keys: the backward's key-major
// lists) the 64-row query tiles of key tile t. Writes them at out (entry index first ...) where out is not null;
// returns how many there are. Document d's band of k - q is lo..hi shifted by cu_k[d] - cu[d].
SPATTN_HD int64_t walk(const DocTileArgs& a, int t, Entry4* out, int64_t first, bool keys = false) {
  const int os = keys ? a.block_n : a.block_m, is = keys ? a.block_m : a.block_n;  // outer and inner tile sizes
  const int64_t olen = keys ? a.k_len : a.q_len, ilen = keys ? a.q_len : a.k_len;
  const int64_t o0 = int64_t(t) * os, o1 = imin(o0 + os, olen);
  int64_t n = 0, last = -1;
  for (int d = first_doc_after(a, o0, keys); d < a.documents; ++d) {
    const int64_t c0 = side_boundary(a, d, keys), c1 = side_boundary(a, d + 1, keys);      // the outer side's
    const int64_t e0 = side_boundary(a, d, !keys), e1 = side_boundary(a, d + 1, !keys);    // the inner side's
    if (c0 >= o1) break;
    const int64_t oa = imax(o0, c0), ob = imin(o1, c1);
    if (oa >= ob) continue;
    const int64_t shift = key_boundary(a, d) - boundary(a, d);  // the band of k - q in this document
    const int64_t lo = a.lo + shift, hi = a.hi + shift;
    const int64_t dlo = keys ? -hi : lo, dhi = keys ? -lo : hi;  // inner - outer in the band
    const int64_t ia = imax(imax(e0, oa + dlo), int64_t(0)), ib = imin(imin(e1, ob + dhi), ilen);  // [ia, ib)
    if (ia >= ib) continue;
    const bool one_doc_outer = c0 <= o0 && o1 <= c1;
    for (int64_t it = ia / is; it <= (ib - 1) / is; ++it) {
      if (it == last) continue;  // a tile shared with the previous document (then a bitmask)
      last = it;
      if (out) {
        const int64_t e = first + n;
        if (e >= a.entry_capacity) return n;
        const int64_t i0 = it * is, i1 = imin(i0 + is, ilen);
        Entry4 v;
        v.x = int(it);
        v.z = int(lo);
        v.w = int(hi);
        if (one_doc_outer && e0 <= i0 && i1 <= e1)
          v.y = keys ? full_or_band(a, i0, i1, o0, o1, lo, hi) : full_or_band(a, o0, o1, i0, i1, lo, hi);
        else
          v.y = int(e);  // bitmask: its own index
        out[n] = v;
      }
      ++n;
    }
  }
  return n;
}

// Word w of the forward bitmask of entry (query tile qt, key tile kt): bit c is (q0 + r, k0 + c0 + c), r = 64 w /
// block_n, c0 = 64 w % block_n; kept iff q lies in a document d, k in d's keys, lo <= k - q - shift_d <= hi, k < k_len.
SPATTN_HD unsigned long long doc_mask_word(const DocTileArgs& a, int qt, int kt, int w) {
  const int r = w * 64 / a.block_n, c0 = w * 64 % a.block_n;
  const int64_t q = int64_t(qt) * a.block_m + r, k0 = int64_t(kt) * a.block_n + c0;
  if (q >= a.q_len) return 0;
  const int d = first_doc_after(a, q);
  if (d >= a.documents || boundary(a, d) > q) return 0;
  const int64_t shift = key_boundary(a, d) - boundary(a, d);
  const int64_t lo = imax(imax(key_boundary(a, d), q + a.lo + shift), k0);
  const int64_t hi = imin(imin(imin(key_boundary(a, d + 1), q + a.hi + shift + 1), int64_t(a.k_len)), k0 + 64);  // [lo, hi)
  if (lo >= hi) return 0;
  const int n = int(hi - lo), s = int(lo - k0);
  return (n >= 64 ? ~0ull : ((1ull << n) - 1)) << s;
}

// Word c of the backward's transposed bitmask of entry (key tile kt, 64-row query tile qt): bit r is (q0 + r, k0 + c).
SPATTN_HD unsigned long long doc_key_mask_word(const DocTileArgs& a, int kt, int qt, int c) {
  const int64_t k = int64_t(kt) * a.block_n + c, q0 = int64_t(qt) * a.block_m;
  if (k >= a.k_len) return 0;
  const int d = first_doc_after(a, k, true);
  if (d >= a.documents || key_boundary(a, d) > k) return 0;
  // the document's queries whose band holds k: [k - hi - shift, k - lo - shift], clipped to the tile and to q_len
  const int64_t shift = key_boundary(a, d) - boundary(a, d);
  const int64_t qa = imax(imax(boundary(a, d), k - a.hi - shift), q0);
  const int64_t qb = imin(imin(imin(boundary(a, d + 1), k - a.lo - shift + 1), q0 + 64), int64_t(a.q_len));
  if (qa >= qb) return 0;
  const int n = int(qb - qa), s = int(qa - q0);
  return (n >= 64 ? ~0ull : ((1ull << n) - 1)) << s;
}

// ---- block masks ----
SPATTN_HD int64_t load_index(const void* p, int bits, int64_t off) {
  return bits == 32 ? int64_t(static_cast<const int*>(p)[off]) : int64_t(static_cast<const long long*>(p)[off]);
}

// The entry type of key tile kt for the query rows [q0, q1): -1 kFull, -2 kBand by the spec's band, -3 kBand over
// every pair (a tile kept whole whose keys run past k_len: the kernels run full tiles unmasked), 0 none (out of range,
// or a partial block the band misses).
SPATTN_HD int block_entry(const BlockTileArgs& a, int64_t q0, int64_t q1, int64_t kt, bool full) {
  if (kt < 0 || kt >= a.k_tiles) return 0;
  const int64_t k0 = kt * a.block_n, k1 = imin(k0 + a.block_n, int64_t(a.k_len));
  const bool whole = k1 - k0 == a.block_n;
  if (full || !a.band) return whole ? -1 : -3;
  if (k0 - (q1 - 1) > a.hi || (k1 - 1) - q0 < a.lo) return 0;
  return (whole && k0 - (q1 - 1) >= a.lo && (k1 - 1) - q0 <= a.hi) ? -1 : -2;
}

// The entry of tile `tile` (a key tile, or key-major a query tile) of block_entry's type.
SPATTN_HD Entry4 block_entry4(const BlockTileArgs& a, int64_t tile, int type) {
  return type == -3 ? Entry4{int(tile), -2, -(a.q_len + 1), a.k_len + 1} : Entry4{int(tile), type, a.lo, a.hi};
}

// How many blocks list (bb, hh) gives query block qb (full: the full list's), clamped to [0, its capacity].
SPATTN_HD int64_t block_count(const BlockTileArgs& a, int bb, int hh, int qb, bool full) {
  const void* num = full ? a.full_num : a.num;
  if (!num) return 0;
  const int64_t* ns = full ? a.full_num_s : a.num_s;
  return imin(imax(load_index(num, full ? a.full_num_bits : a.num_bits, bb * ns[0] + hh * ns[1] + qb * ns[2]),
                   int64_t(0)), int64_t(full ? a.full_cap : a.cap));
}
// Its j-th listed key block (as listed: block_entry drops indices out of range).
SPATTN_HD int64_t block_index(const BlockTileArgs& a, int bb, int hh, int qb, bool full, int64_t j) {
  const int64_t* is = full ? a.full_idx_s : a.idx_s;
  return load_index(full ? a.full_idx : a.idx, full ? a.full_idx_bits : a.idx_bits,
                    bb * is[0] + hh * is[1] + qb * is[2] + j * is[3]);
}

// f(kt, full) for each block listed for query block qb of list (bb, hh): partial, then full.
template <class F>
SPATTN_HD void each_block(const BlockTileArgs& a, int bb, int hh, int qb, F f) {
  for (int full = 0; full < 2; ++full) {
    const int64_t n = block_count(a, bb, hh, qb, full != 0);
    for (int64_t j = 0; j < n; ++j) f(block_index(a, bb, hh, qb, full != 0, j), full != 0);
  }
}

// ---- block masks by marks (the grid builds: tile_lists.hpp, BlockKeyScratch) ----
// A list's marks: two planes (partial, full) of `rows` rows of `words` 32-bit words. Key-major (the backward): a row a
// key tile, bit qb % 32 of word qb / 32 of row kt set where query block qb lists key block kt; the forward's: a row a
// query tile, bit kt of row qb. A listed block marks one bit however often it is listed.

// The word of plane `full`, row `row` (of `rows`) of list l that holds bit `bit`.
SPATTN_HD int64_t block_mark_word(int64_t l, bool full, int64_t row, int64_t rows, int64_t words, int64_t bit) {
  return ((l * 2 + (full ? 1 : 0)) * rows + row) * words + bit / 32;
}

// The entries of key tile kt for the rows [q0, q1) marked at bit b of part / full (partial first), each tile `tile`'s
// entry of block_entry's type: written at out + n while n < room where out is not null, n counting them. False where
// the room ran out.
SPATTN_HD bool marked_entries(const BlockTileArgs& a, unsigned part, unsigned full, int b, int64_t q0, int64_t q1,
                              int64_t kt, int64_t tile, Entry4* out, int64_t room, int64_t& n) {
  for (int f = 0; f < 2; ++f) {
    if (!(((f ? full : part) >> b) & 1u)) continue;
    const int type = block_entry(a, q0, q1, kt, f != 0);
    if (!type) continue;
    if (out) {
      if (n >= room) return false;
      out[n] = block_entry4(a, tile, type);
    }
    ++n;
  }
  return true;
}

// The entries of word w of key tile kt's marks (part, full: its two planes' words; the query blocks 32 w .. 32 w + 31,
// ascending, each block's `sub` 64-row query tiles ascending, a block marked both ways partial first), as
// block_key_lists writes them: written at out (at most `room`) where out is not null; returns how many there are.
SPATTN_HD int64_t key_word_entries(const BlockTileArgs& a, int64_t kt, int64_t w, unsigned part, unsigned full, int sub,
                                   Entry4* out, int64_t room) {
  int64_t n = 0;
  for (unsigned both = part | full; both; both &= both - 1) {
    const int b = low_bit(both);
    const int64_t qb = 32 * w + b;
    for (int h = 0; h < sub; ++h) {
      const int64_t qt = sub * qb + h, q0 = qt * 64;
      if (q0 >= a.q_len) break;
      if (!marked_entries(a, part, full, b, q0, imin(q0 + 64, int64_t(a.q_len)), kt, qt, out, room, n)) return n;
    }
  }
  return n;
}

// The forward's entries of word w of query tile qt's marks (a row a query tile, a bit a key tile: the key tiles
// 32 w .. 32 w + 31, ascending, a block marked both ways partial first), as launch_block_tiles_grid writes them:
// written at out (at most `room`) where out is not null; returns how many there are.
SPATTN_HD int64_t row_word_entries(const BlockTileArgs& a, int64_t qt, int64_t w, unsigned part, unsigned full,
                                   Entry4* out, int64_t room) {
  const int64_t q0 = qt * a.block_m, q1 = imin(q0 + a.block_m, int64_t(a.q_len));
  int64_t n = 0;
  for (unsigned both = part | full; both; both &= both - 1) {
    const int b = low_bit(both);
    const int64_t kt = 32 * w + b;
    if (!marked_entries(a, part, full, b, q0, q1, kt, kt, out, room, n)) return n;
  }
  return n;
}

// The order's sort key of key tile kt with n entries (launch_block_key_tiles_grid): ascending keys give most entries
// first, ties by ascending tile.
SPATTN_HD unsigned long long key_order_key(int64_t n, int64_t kt) {
  return (static_cast<unsigned long long>(0x7fffffff - imin(n, 0x7fffffff)) << 32) |
         static_cast<unsigned long long>(kt);
}

}  // namespace spattn::cuda::runtime
