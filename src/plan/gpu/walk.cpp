// plan/gpu/walk.cpp — the entries and bitmasks of any pattern from its rows (BoundPattern::row, row_bits), query
// tiles on worker threads: build_walked (tiles.hpp).
#include "common/parallel.hpp"
#include "plan/gpu/tiles.hpp"

namespace spattn::plan::gpu {

namespace {

// Query tiles are independent: contiguous ranges of them are built on worker threads (a random pattern's
// row costs O(Lk) hashes: 16384 rows took seconds on one thread), then concatenated in order, so the plan
// is the same for any thread count. A range's entries and bitmasks:
struct WalkPart {
  std::vector<int64_t> offsets;  // entries before each query tile, within this part
  std::vector<TileEntry> entries;
  MaskWords masks;  // (huge pages where large)
  int64_t nnz = 0, n_full = 0, n_band = 0, n_bitmask = 0;
};

// One worker's walk of a range of query tiles into its WalkPart, with its scratch.
//
// Bits are set in scratch masks that lie `stride` words apart: at their own size (1 KiB for 64x128) a row's
// bits, one per partial key tile, fell into a few cache sets (most of a random plan's mask time was L1
// misses).
struct RangeWalk {
  const BoundPattern& pat;
  const Space& sp;
  const bool bits_ok;  // rows drawn as bits (BoundPattern::row_bits)
  const int bm, bn, words, row_words, sh;
  const int64_t lkw, kw, stride;  // row_bits' words of keys, with the last key tile's padding; scratch mask stride
  WalkPart& out;

  TileScratch scr;
  RowRuns tmp;
  std::vector<RowRuns> rows;
  std::vector<char> same;  // tile_rows': rows alike
  std::vector<uint64_t> bitrows;  // the tile's rows as bits, kw words a row (bits_ok)
  std::vector<int64_t> band_scratch;
  std::vector<int64_t> partial_kts;  // the query tile's partial key tiles, ascending (their slots' order)
  std::vector<uint64_t> pmask;   // partial masks of the current query tile, by slot (runs counted first)
  std::vector<uint64_t> blocks;  // [k_tiles * stride], by key tile (scattered query tiles)
  std::vector<uint64_t> rowbits;  // [k_tiles * row_words] (scattered query tiles)
  std::vector<char> any, all;     // [k_tiles] a row touched the key tile, every valid row fills it

  RangeWalk(const BoundPattern& p, const Space& s, bool bits, WalkPart& o)
      : pat(p), sp(s), bits_ok(bits), bm(s.bm), bn(s.bn), words(s.bm * s.bn / 64), row_words(s.bn / 64),
        sh(s.bn == 64 ? 6 : 7), lkw((s.lk + 63) / 64), kw(s.k_tiles * (s.bn / 64)), stride(s.bm * s.bn / 64 + 8),
        out(o), scr(s.k_tiles) {}

  bool one_tile(const Run& x) const {
    return (x.stride == 1 || x.count == 1) && x.count > 0 && x.start >> sh == (x.start + x.count - 1) >> sh;
  }

  // room: query tiles whose bitmasks `out` will hold (its own: reserved at the rate of its first tiles).
  void walk(int64_t qt_begin, int64_t qt_end, int64_t room) {
    const int64_t probe = qt_begin + std::max<int64_t>(1, (qt_end - qt_begin) / 16);
    for (int64_t qt = qt_begin; qt < qt_end; ++qt) {
      out.offsets.push_back(int64_t(out.entries.size()));
      const int64_t nnz0 = out.nnz;
      int64_t nruns = 0, valid_rows = 0;
      // Many short runs (a random tile: ~800 a row, a run every few keys) are set as bits of one row at a time
      // in `rowbits` (the row's keys, a few KiB) and the row is then copied into every key tile's block; the
      // tiles a row touches and whether it fills them come from its words (no count per run).
      // (Not in a mapped space: its rows' runs come in any order, and padding rows sit anywhere in a tile.)
      // Rows the pattern draws as bits (BoundPattern::row_bits: random) are taken as bits, their keys counted from
      // the words, and the tile as a scattered one whatever its runs (its rows' bits cost O(Lk) a row anyway).
      auto scattered_tile = [&](int64_t n) { return nruns * 8 >= n && nruns * 4 >= int64_t(bm) * sp.k_tiles; };
      bool scattered = false, from_bits = false;
      if (bits_ok) {
        valid_rows = draw_bits(qt);
        from_bits = scattered = true;
      }
      if (!from_bits) {
        valid_rows = tile_rows(pat, sp, qt, tmp, rows, nruns, out.nnz, &same);
        scattered = !sp.m && !general_paths_only() && scattered_tile(out.nnz - nnz0);
      }
      const int64_t npartial = scattered ? scattered_blocks(valid_rows, from_bits) : partial_masks(valid_rows);
      if (npartial > 0 && qt == probe && out.masks.capacity() < out.masks.size() * size_t(room) / size_t(qt - qt_begin))
        out.masks.reserve(out.masks.size() * size_t(room) / size_t(qt - qt_begin) * 17 / 16);  // this part's rate
      emit(qt, scattered);
    }
  }

  // The valid rows of query tile qt as bits (bitrows), their keys counted into out.nnz; returns their number.
  int64_t draw_bits(int64_t qt) {
    const int64_t valid_rows = std::min<int64_t>(bm, sp.lq - qt * bm);
    if (bitrows.empty()) bitrows.assign(size_t(bm * kw), 0);
    int64_t n = 0;
    for (int64_t r = 0; r < valid_rows; ++r) {
      uint64_t* b = bitrows.data() + r * kw;
      pat.row_bits(qt * bm + r, b);  // the first lkw words; the rest stay zero
      n += bit_keys(b, lkw);
    }
    std::fill(bitrows.begin() + valid_rows * kw, bitrows.end(), 0);
    out.nnz += n;
    return valid_rows;
  }

  // A scattered query tile: every row's bits copied into each key tile's block (blocks), the touched tiles listed and
  // the partial ones given slots; returns the partial tiles' count.
  int64_t scattered_blocks(int64_t valid_rows, bool from_bits) {
    if (blocks.empty()) {
      blocks.assign(size_t(sp.k_tiles * stride), 0);
      rowbits.assign(size_t(sp.k_tiles * row_words), 0);
      any.assign(size_t(sp.k_tiles), 0);
      all.assign(size_t(sp.k_tiles), 0);
    }
    uint64_t* rb = rowbits.data();
    std::fill(any.begin(), any.end(), 0);
    std::fill(all.begin(), all.end(), 1);
    int drawn = 0;  // the row whose runs are row r's (tile_rows: rows alike)
    for (int r = 0; r < bm; ++r) {
      // Runs in increasing order of their words (no permutation, no strided run so far): a word's bits are
      // gathered in `acc` and stored, not or-ed into memory (keys a few apart made a chain of loads and
      // stores through one word).
      bool ordered = sp.d == 1;
      int64_t cw = -1;  // the word `acc` holds
      uint64_t acc = 0;
      const uint64_t* src = from_bits ? bitrows.data() + r * kw : rb;  // the row's bits
      if (!from_bits && !same[size_t(r)]) drawn = r;  // (rows are not drawn as runs from bits)
      const Run* x = from_bits ? nullptr : rows[size_t(drawn)].data();
      for (const Run* xe = from_bits ? nullptr : x + rows[size_t(drawn)].size(); x < xe; ++x) {
        if (x->count == 1 && ordered) {
          const int64_t w = x->start >> 6;
          acc = (w == cw ? acc : 0) | uint64_t(1) << (x->start & 63);
          rb[w] = acc;
          cw = w;
        } else if (x->count == 1 || x->stride == 1) {
          set_bits(rb, x->start, x->start + x->count);
          cw = (x->start + x->count - 1) >> 6;
          acc = rb[cw];
        } else {
          for (int64_t j = 0, k = x->start; j < x->count; ++j, k += x->stride) rb[k >> 6] |= uint64_t(1) << (k & 63);
          ordered = false;
        }
      }
      uint64_t* dst = blocks.data() + size_t(r) * row_words;
      const bool valid = r < valid_rows;  // valid rows are a prefix of the tile
      for (int64_t kt = 0; kt < sp.k_tiles; ++kt) {
        uint64_t o = 0, a = ~uint64_t(0);
        for (int w = 0; w < row_words; ++w) {
          const uint64_t v = src[kt * row_words + w];
          dst[kt * stride + w] = v;
          if (!from_bits) rb[kt * row_words + w] = 0;
          o |= v, a &= v;
        }
        any[size_t(kt)] |= o != 0;
        all[size_t(kt)] &= !valid || a == ~uint64_t(0);
      }
    }
    int64_t npartial = 0;
    scr.nt = 0;
    for (int64_t kt = 0; kt < sp.k_tiles; ++kt) {
      if (!any[size_t(kt)]) continue;
      scr.tbuf[scr.nt++] = kt;
      scr.count[size_t(kt)] = all[size_t(kt)] ? valid_rows * bn : 1;  // what full() reads
      if (!scr.full(kt, valid_rows, sp)) scr.slot[size_t(kt)] = int32_t(npartial++);
    }
    return npartial;
  }

  // A query tile of runs: the touched key tiles counted and sorted, the partial ones given slots and their bits set
  // from the runs (pmask); returns the partial tiles' count.
  int64_t partial_masks(int64_t valid_rows) {
    scr.count_runs_unordered(rows, bn, same);
    std::sort(scr.touched().begin(), scr.touched().end());
    partial_kts.clear();
    int64_t npartial = 0;
    for (int64_t kt : scr.touched())
      if (!scr.full(kt, valid_rows, sp)) {
        scr.slot[size_t(kt)] = int32_t(npartial++);
        partial_kts.push_back(kt);
      }
    if (npartial == 0) return 0;
    pmask.assign(size_t(npartial * stride), 0);
    int drawn = 0;  // (as in scattered_blocks)
    for (int r = 0; r < bm; ++r) {
      uint64_t* rm = pmask.data() + size_t(r) * row_words;
      auto mark = [&](int64_t kt, int64_t a, int64_t b) {
        const int32_t s = scr.slot[size_t(kt)];
        if (s >= 0) set_bits(rm + size_t(s) * stride, a, b);
      };
      if (!same[size_t(r)]) drawn = r;
      for (const Run& x : rows[size_t(drawn)]) {
        if (one_tile(x)) {
          mark(x.start >> sh, x.start & (bn - 1), (x.start & (bn - 1)) + x.count);
        } else if (scr.shortcuts && x.stride == 1) {
          // An interval marks the partial tiles it crosses only (those in slot order, ascending), not each.
          const int64_t a = x.start >> sh, b = (x.start + x.count - 1) >> sh;
          for (auto it = std::lower_bound(partial_kts.begin(), partial_kts.end(), a); it != partial_kts.end() && *it <= b;
               ++it) {
            const int64_t k0 = *it << sh;
            mark(*it, std::max(x.start, k0) - k0, std::min(x.start + x.count, k0 + bn) - k0);
          }
        } else {
          for_each_tile_span(x, bn, mark);
        }
      }
    }
    return npartial;
  }

  // Query tile qt's entries from its touched key tiles: full, else a band (detect_band) or a bitmask; the scratch
  // counts and slots cleared.
  void emit(int64_t qt, bool scattered) {
    for (int64_t kt : scr.touched()) {
      TileEntry e{int32_t(kt), kFull, 0, 0};
      const int32_t s = scr.slot[size_t(kt)];
      if (s >= 0) {
        const uint64_t* m = scattered ? blocks.data() + size_t(kt) * stride : pmask.data() + size_t(s) * stride;
        int64_t lo, hi;
        if (!sp.m && detect_band(m, sp, qt, kt, sp.k_valid(kt), lo, hi, band_scratch)) {
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

// The parts concatenated in order, each copied by its own thread into arrays sized once (a random plan's bitmasks
// are tens of MB: appended part after part, their copy and first touch of the pages ran on one thread).
void merge_parts(BlockPlan& plan, const Space& sp, std::vector<WalkPart>& parts) {
  const int64_t nthreads = int64_t(parts.size()), words = int64_t(sp.bm) * sp.bn / 64;
  std::vector<int64_t> entry_base(parts.size() + 1, 0), mask_base(parts.size() + 1, 0);
  for (size_t pi = 0; pi < parts.size(); ++pi) {
    const WalkPart& part = parts[pi];
    entry_base[pi + 1] = entry_base[pi] + int64_t(part.entries.size());
    mask_base[pi + 1] = mask_base[pi] + int64_t(part.masks.size());
    plan.nnz += part.nnz;
    plan.n_full += part.n_full;
    plan.n_band += part.n_band;
    plan.n_bitmask += part.n_bitmask;
  }
  if (mask_base.back() / words >= int64_t(INT32_MAX)) throw Error("block plan: too many bitmasks");
  plan.entries.resize(size_t(entry_base.back()));
  plan.masks.resize(size_t(mask_base.back()));  // not zeroed (MaskWords): every word is copied below
  common::parallel_for(nthreads, int(nthreads), [&](int64_t t, int) {
    WalkPart& part = parts[size_t(t)];
    const int64_t qt0 = sp.q_tiles * t / nthreads;
    for (size_t i = 0; i < part.offsets.size(); ++i) plan.row_offsets[size_t(qt0) + i] = entry_base[size_t(t)] + part.offsets[i];
    TileEntry* e = plan.entries.data() + entry_base[size_t(t)];
    const int32_t mb = int32_t(mask_base[size_t(t)] / words);
    for (TileEntry x : part.entries) {
      if (x.mask >= 0) x.mask += mb;
      *e++ = x;
    }
    std::copy(part.masks.begin(), part.masks.end(), plan.masks.begin() + mask_base[size_t(t)]);
    part = WalkPart{};
  });
  plan.row_offsets[size_t(sp.q_tiles)] = int64_t(plan.entries.size());
}

}  // namespace

void build_walked(BlockPlan& plan, const BoundPattern& pat, const Space& sp) {
  // Rows as bits where the pattern draws them so (BoundPattern::row_bits).
  bool bits_ok = sp.d == 1 && !sp.m && !general_paths_only() && sp.lq > 0;
  if (bits_ok) {
    std::vector<uint64_t> probe(static_cast<size_t>((sp.lk + 63) / 64));
    bits_ok = pat.row_bits(0, probe.data());
  }
  const int64_t nthreads = plan_threads(sp.q_tiles, pat.k_len());
  std::vector<WalkPart> parts(static_cast<size_t>(nthreads));
  common::parallel_for(nthreads, int(nthreads), [&](int64_t t, int) {
    const int64_t qt0 = sp.q_tiles * t / nthreads, qt1 = sp.q_tiles * (t + 1) / nthreads;
    RangeWalk(pat, sp, bits_ok, parts[size_t(t)]).walk(qt0, qt1, qt1 - qt0);
  });
  merge_parts(plan, sp, parts);
}

}  // namespace spattn::plan::gpu
