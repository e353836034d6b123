// The Multigrain split: a bound pattern -> coarse BSR blocks (tensor cores) + fine CSR residue (CUDA cores),
// with no (q, k) in both. Host only; walks each row's runs twice (count, then place), so its cost follows
// rows x blocks touched (+ fine nnz), never Lq x Lk.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "cuda/unfused/unfused.hpp"

namespace spattn::unfused {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Number of j in [0, count) with start + j * stride in [lo, hi).
int64_t keys_in(const Run& r, int64_t lo, int64_t hi) {
  if (hi <= lo || r.count <= 0) return 0;
  const int64_t s = r.stride;
  int64_t jlo = lo <= r.start ? 0 : ceil_div(lo - r.start, s);
  int64_t jhi = hi - 1 < r.start ? -1 : (hi - 1 - r.start) / s;
  jhi = std::min(jhi, r.count - 1);
  return jhi >= jlo ? jhi - jlo + 1 : 0;
}

void set_bits(std::vector<uint64_t>& masks, int64_t base_word, int64_t first, int64_t last /*exclusive*/) {
  for (int64_t b = first; b < last;) {
    const int64_t w = b / 64, off = b % 64;
    const int64_t n = std::min<int64_t>(64 - off, last - b);
    const uint64_t bits = n == 64 ? ~uint64_t(0) : (((uint64_t(1) << n) - 1) << off);
    masks[size_t(base_word + w)] |= bits;
    b += n;
  }
}

}  // namespace

Split split_pattern(const BoundPattern& pattern, const Options& options, DType dtype) {
  if (options.block != 32 && options.block != 64)
    throw Error("unfused: block " + std::to_string(options.block) + " is not supported (32 or 64)");
  if (!(options.coarse_min_density >= 0.0 && options.coarse_min_density <= 1.0))
    throw Error("unfused: coarse_min_density " + std::to_string(options.coarse_min_density) +
                " is outside [0, 1]");
  if (options.fine_slice < 32)
    throw Error("unfused: fine_slice " + std::to_string(options.fine_slice) + " is below 32");
  const int64_t Lq = pattern.q_len(), Lk = pattern.k_len();
  if (Lq < 1 || Lk < 1)
    throw Error("unfused: pattern lengths " + std::to_string(Lq) + " x " + std::to_string(Lk) +
                " must be at least 1");
  if (Lk > (int64_t(1) << 30))
    throw Error("unfused: key length " + std::to_string(Lk) + " exceeds 2^30");
  const int bs = options.block;
  Options::Split mode = options.split;
  // f32 has no tensor-core path here (tf32 would lose the precision the user asked for): all fine.
  if (dtype == DType::f32) mode = Options::Split::all_fine;

  Split out;
  out.q_len = Lq;
  out.k_len = Lk;
  out.block = bs;
  Bsr& C = out.coarse;
  C.rows = Lq;
  C.cols = Lk;
  C.block = bs;
  C.block_rows = ceil_div(Lq, bs);
  C.block_cols = ceil_div(Lk, bs);
  C.row_offsets.assign(1, 0);
  Csr& F = out.fine;
  F.rows = Lq;
  F.cols = Lk;
  F.row_offsets.assign(1, 0);
  const int64_t wpm = int64_t(bs) * bs / 64;

  std::vector<int64_t> count(size_t(C.block_cols), 0);
  std::vector<int64_t> slot(size_t(C.block_cols), -1);  // coarse block index of a block column, or -1
  std::vector<int32_t> touched;
  std::vector<RowRuns> rows(static_cast<size_t>(bs));
  std::vector<int32_t> keys;

  for (int64_t br = 0; br < C.block_rows; ++br) {
    const int64_t q0 = br * bs, q1 = std::min(Lq, q0 + bs);
    touched.clear();
    for (int64_t q = q0; q < q1; ++q) {
      RowRuns& rr = rows[size_t(q - q0)];
      pattern.row(q, rr);
      for (const Run& r : rr) {
        if (r.count <= 0) continue;
        out.nnz += r.count;
        const int64_t c0 = r.start / bs, c1 = r.last() / bs;
        for (int64_t c = c0; c <= c1; ++c) {
          const int64_t n = r.stride == 1 ? std::min(r.end(), (c + 1) * bs) - std::max(r.start, c * bs)
                                          : keys_in(r, c * bs, (c + 1) * bs);
          if (n <= 0) continue;
          if (count[size_t(c)] == 0) touched.push_back(int32_t(c));
          count[size_t(c)] += n;
        }
      }
    }
    std::sort(touched.begin(), touched.end());
    for (int32_t c : touched) {
      const int64_t area = (q1 - q0) * (std::min(Lk, (int64_t(c) + 1) * bs) - int64_t(c) * bs);
      const int64_t n = count[size_t(c)];
      bool coarse = false;
      switch (mode) {
        case Options::Split::all_coarse: coarse = true; break;
        case Options::Split::all_fine: coarse = false; break;
        case Options::Split::automatic:
          coarse = double(n) >= options.coarse_min_density * double(bs) * double(bs);
          break;
      }
      if (!coarse) continue;
      slot[size_t(c)] = int64_t(C.col_indices.size());
      C.col_indices.push_back(c);
      // A block at the matrix edge is stored with its padding: call it full only when the whole
      // in-range area is kept (the padding itself is never read back as kept: kernels check the bounds).
      if (n == area) {
        C.mask_index.push_back(-1);
      } else {
        C.mask_index.push_back(int64_t(C.masks.size()) / wpm);
        C.masks.resize(C.masks.size() + size_t(wpm), 0);
      }
      out.coarse_nnz += n;
    }
    C.row_offsets.push_back(int64_t(C.col_indices.size()));

    for (int64_t q = q0; q < q1; ++q) {
      const int64_t r_local = q - q0;
      keys.clear();
      for (const Run& r : rows[size_t(r_local)]) {
        if (r.count <= 0) continue;
        if (r.stride == 1) {
          for (int64_t c = r.start / bs; c <= r.last() / bs; ++c) {
            const int64_t lo = std::max(r.start, c * bs), hi = std::min(r.end(), (c + 1) * bs);
            const int64_t s = slot[size_t(c)];
            if (s >= 0) {
              const int64_t mi = C.mask_index[size_t(s)];
              if (mi >= 0) set_bits(C.masks, mi * wpm, r_local * bs + lo - c * bs, r_local * bs + hi - c * bs);
            } else {
              for (int64_t k = lo; k < hi; ++k) keys.push_back(int32_t(k));
            }
          }
        } else {
          for (int64_t j = 0; j < r.count; ++j) {
            const int64_t k = r.start + j * r.stride, c = k / bs;
            const int64_t s = slot[size_t(c)];
            if (s >= 0) {
              const int64_t mi = C.mask_index[size_t(s)];
              if (mi >= 0) set_bits(C.masks, mi * wpm, r_local * bs + k - c * bs, r_local * bs + k - c * bs + 1);
            } else {
              keys.push_back(int32_t(k));
            }
          }
        }
      }
      if (!std::is_sorted(keys.begin(), keys.end())) std::sort(keys.begin(), keys.end());
      F.col_indices.insert(F.col_indices.end(), keys.begin(), keys.end());
      F.row_offsets.push_back(int64_t(F.col_indices.size()));
    }
    for (int32_t c : touched) {
      count[size_t(c)] = 0;
      slot[size_t(c)] = -1;
    }
  }
  return out;
}

std::string Split::describe() const {
  std::ostringstream os;
  const int64_t nb = coarse.nblocks();
  const double area = double(q_len) * double(k_len);
  os << "pattern " << q_len << " x " << k_len << ": nnz " << nnz << " (density " << double(nnz) / area << ")\n";
  os << "  coarse: BSR " << block << "x" << block << ", " << nb << " blocks (" << nb - coarse.npartial()
     << " full, " << coarse.npartial() << " masked), kept " << coarse_nnz << ", tile fill "
     << (nb ? double(coarse_nnz) / (double(nb) * block * block) : 0.0) << "\n";
  os << "  fine:   CSR, nnz " << fine.nnz() << " in "
     << std::count_if(fine.row_offsets.begin() + 1, fine.row_offsets.end(),
                      [&, i = size_t(0)](int64_t) mutable {
                        ++i;
                        return fine.row_offsets[i] > fine.row_offsets[i - 1];
                      })
     << " rows\n";
  return os.str();
}

}  // namespace spattn::unfused
