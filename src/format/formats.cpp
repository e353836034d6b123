// CSR, BSR and ACSR: builders from a bound pattern (through its row enumeration), conversions, validation.
#include <algorithm>
#include <string>

#include "spattn/format.hpp"

namespace spattn {
namespace {

[[noreturn]] void invalid(const std::string& what) { throw Error("invalid sparse matrix: " + what); }

void check_block(int block) {
  if (!is_supported_block(block))
    throw Error("block size " + std::to_string(block) + " is not supported (use 16, 32, 64 or 128)");
}

// Accumulates one block row of a BSR: the touched block columns and their bitmasks.
struct BlockRowBuilder {
  int block;
  int64_t words;
  std::vector<int64_t> slot_of;          // block column -> slot, -1 if untouched
  std::vector<int32_t> touched;          // block columns touched, in order of first touch
  std::vector<uint64_t> bits;            // slots x words
  BlockRowBuilder(int b, int64_t block_cols) : block(b), words(int64_t(b) * b / 64), slot_of(size_t(block_cols), -1) {}

  uint64_t* mask(int32_t bc) {
    int64_t& s = slot_of[size_t(bc)];
    if (s < 0) {
      s = int64_t(touched.size());
      touched.push_back(bc);
      bits.resize(bits.size() + size_t(words), 0);
    }
    return bits.data() + s * words;
  }
  // Sets keys [a, b) of local row r.
  void set_interval(int r, int64_t a, int64_t b) {
    while (a < b) {
      const int32_t bc = int32_t(a / block);
      const int64_t c0 = a - int64_t(bc) * block, c1 = std::min<int64_t>(block, b - int64_t(bc) * block);
      uint64_t* m = mask(bc);
      for (int64_t c = c0; c < c1;) {  // set bits [r*block + c0, r*block + c1)
        const int64_t bit = int64_t(r) * block + c;
        const int64_t w = bit / 64, off = bit % 64;
        const int64_t n = std::min<int64_t>(64 - off, c1 - c);
        m[w] |= (n == 64 ? ~0ull : ((1ull << n) - 1) << off);
        c += n;
      }
      a = int64_t(bc + 1) * block;
    }
  }
  void set_key(int r, int64_t k) {
    const int32_t bc = int32_t(k / block);
    const int64_t bit = int64_t(r) * block + (k - int64_t(bc) * block);
    mask(bc)[bit / 64] |= 1ull << (bit % 64);
  }
  // Appends the block row to the BSR, in block-column order; full blocks lose their mask.
  void flush(Bsr& out, int64_t rows_here, int64_t cols) {
    std::vector<size_t> order(touched.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return touched[x] < touched[y]; });
    for (size_t i : order) {
      const int32_t bc = touched[i];
      const uint64_t* m = bits.data() + int64_t(i) * words;
      const int64_t cols_here = std::min<int64_t>(block, cols - int64_t(bc) * block);
      bool full = true;
      for (int64_t r = 0; r < rows_here && full; ++r)
        for (int64_t c = 0; c < cols_here; ++c) {
          const int64_t bit = r * block + c;
          if (!((m[bit / 64] >> (bit % 64)) & 1)) {
            full = false;
            break;
          }
        }
      out.col_indices.push_back(bc);
      if (full) {
        out.mask_index.push_back(-1);
      } else {
        out.mask_index.push_back(out.npartial());
        out.masks.insert(out.masks.end(), m, m + words);
      }
      slot_of[size_t(bc)] = -1;
    }
    out.row_offsets.push_back(int64_t(out.col_indices.size()));
    touched.clear();
    bits.clear();
  }
};

}  // namespace

bool is_supported_block(int block) { return block == 16 || block == 32 || block == 64 || block == 128; }

bool Bsr::test(int64_t i, int r, int c) const {
  if (int64_t(r) >= block || int64_t(c) >= block || r < 0 || c < 0) return false;
  const int64_t bi = row_offsets.empty() ? 0 : int64_t(std::upper_bound(row_offsets.begin(), row_offsets.end(), i) - row_offsets.begin()) - 1;
  const int64_t q = bi * block + r, k = int64_t(col_indices[size_t(i)]) * block + c;
  if (q >= rows || k >= cols) return false;
  if (full(i)) return true;
  const int64_t bit = int64_t(r) * block + c;
  return (masks[size_t(mask_index[size_t(i)] * words_per_mask() + bit / 64)] >> (bit % 64)) & 1;
}

int64_t Acsr::nnz() const {
  int64_t n = 0;
  for (const AcsrRun& r : runs) n += r.count;
  return n;
}

Csr make_csr(const BoundPattern& p) {
  Csr c;
  c.rows = p.q_len();
  c.cols = p.k_len();
  c.row_offsets.resize(size_t(c.rows) + 1, 0);
  RowRuns runs;
  std::vector<int64_t> keys;
  for (int64_t q = 0; q < c.rows; ++q) {
    p.row(q, runs);
    c.row_offsets[size_t(q) + 1] = c.row_offsets[size_t(q)] + count_keys(runs);
  }
  c.col_indices.resize(size_t(c.nnz()));
  for (int64_t q = 0; q < c.rows; ++q) {
    p.row_keys(q, keys);
    std::copy(keys.begin(), keys.end(), c.col_indices.begin() + c.row_offsets[size_t(q)]);
  }
  return c;
}

// Walks the block rows of a rows x cols matrix; fill_row(r, q, builder) marks the keys of query q (local row r).
template <class FillRow>
Bsr build_bsr(int64_t rows, int64_t cols, int block, FillRow&& fill_row) {
  check_block(block);
  Bsr b;
  b.rows = rows;
  b.cols = cols;
  b.block = block;
  b.block_rows = (rows + block - 1) / block;
  b.block_cols = (cols + block - 1) / block;
  b.row_offsets.push_back(0);
  BlockRowBuilder br(block, b.block_cols);
  for (int64_t bi = 0; bi < b.block_rows; ++bi) {
    const int64_t rows_here = std::min<int64_t>(block, rows - bi * block);
    for (int64_t r = 0; r < rows_here; ++r) fill_row(int(r), bi * block + r, br);
    br.flush(b, rows_here, cols);
  }
  return b;
}

Bsr make_bsr(const BoundPattern& p, int block) {
  RowRuns runs;
  return build_bsr(p.q_len(), p.k_len(), block, [&](int r, int64_t q, BlockRowBuilder& br) {
    p.row(q, runs);
    for (const Run& run : runs) {
      if (run.stride == 1) {
        br.set_interval(r, run.start, run.start + run.count);
      } else {
        for (int64_t t = 0; t < run.count; ++t) br.set_key(r, run.start + t * run.stride);
      }
    }
  });
}

Acsr make_acsr(const BoundPattern& p) {
  Acsr a;
  a.rows = p.q_len();
  a.cols = p.k_len();
  a.row_offsets.push_back(0);
  RowRuns runs;
  for (int64_t q = 0; q < a.rows; ++q) {
    p.row(q, runs);
    for (const Run& r : runs) a.runs.push_back({int32_t(r.start), int32_t(r.stride), int32_t(r.count)});
    a.row_offsets.push_back(int64_t(a.runs.size()));
  }
  return a;
}

Csr to_csr(const Bsr& b) {
  validate(b);
  Csr c;
  c.rows = b.rows;
  c.cols = b.cols;
  c.row_offsets.assign(size_t(c.rows) + 1, 0);
  for (int64_t bi = 0; bi < b.block_rows; ++bi) {
    const int64_t rows_here = std::min<int64_t>(b.block, b.rows - bi * b.block);
    for (int64_t r = 0; r < rows_here; ++r) {
      for (int64_t i = b.row_offsets[size_t(bi)]; i < b.row_offsets[size_t(bi) + 1]; ++i) {
        const int64_t k0 = int64_t(b.col_indices[size_t(i)]) * b.block;
        const int64_t cols_here = std::min<int64_t>(b.block, b.cols - k0);
        for (int64_t cc = 0; cc < cols_here; ++cc) {
          bool on = b.full(i);
          if (!on) {
            const int64_t bit = r * b.block + cc;
            on = (b.masks[size_t(b.mask_index[size_t(i)] * b.words_per_mask() + bit / 64)] >> (bit % 64)) & 1;
          }
          if (on) c.col_indices.push_back(int32_t(k0 + cc));
        }
      }
      c.row_offsets[size_t(bi * b.block + r) + 1] = int64_t(c.col_indices.size());
    }
  }
  return c;
}

Csr to_csr(const Acsr& a) {
  validate(a);
  Csr c;
  c.rows = a.rows;
  c.cols = a.cols;
  c.row_offsets.assign(size_t(c.rows) + 1, 0);
  RowRuns runs;
  std::vector<int64_t> keys;
  for (int64_t q = 0; q < a.rows; ++q) {
    runs.clear();
    for (int64_t i = a.row_offsets[size_t(q)]; i < a.row_offsets[size_t(q) + 1]; ++i)
      runs.push_back({a.runs[size_t(i)].start, a.runs[size_t(i)].stride, a.runs[size_t(i)].count});
    expand_runs(runs, keys);
    for (int64_t k : keys) c.col_indices.push_back(int32_t(k));
    c.row_offsets[size_t(q) + 1] = int64_t(c.col_indices.size());
  }
  return c;
}

Bsr to_bsr(const Csr& c, int block) {
  validate(c);
  return build_bsr(c.rows, c.cols, block, [&](int r, int64_t q, BlockRowBuilder& br) {
    for (int64_t i = c.row_offsets[size_t(q)]; i < c.row_offsets[size_t(q) + 1]; ++i) br.set_key(r, c.col_indices[size_t(i)]);
  });
}

Acsr to_acsr(const Csr& c) {
  validate(c);
  Acsr a;
  a.rows = c.rows;
  a.cols = c.cols;
  a.row_offsets.push_back(0);
  std::vector<int64_t> keys;
  RowRuns runs;
  for (int64_t q = 0; q < c.rows; ++q) {
    keys.assign(c.col_indices.begin() + c.row_offsets[size_t(q)], c.col_indices.begin() + c.row_offsets[size_t(q) + 1]);
    compress_keys(keys, runs);
    for (const Run& r : runs) a.runs.push_back({int32_t(r.start), int32_t(r.stride), int32_t(r.count)});
    a.row_offsets.push_back(int64_t(a.runs.size()));
  }
  return a;
}

void validate(const Csr& c) {
  if (c.rows < 0 || c.cols < 0) invalid("negative shape " + std::to_string(c.rows) + " x " + std::to_string(c.cols));
  if (int64_t(c.row_offsets.size()) != c.rows + 1)
    invalid("row_offsets has " + std::to_string(c.row_offsets.size()) + " entries, expected rows + 1 = " + std::to_string(c.rows + 1));
  if (c.row_offsets[0] != 0) invalid("row_offsets[0] is " + std::to_string(c.row_offsets[0]) + ", expected 0");
  for (int64_t q = 0; q < c.rows; ++q)
    if (c.row_offsets[size_t(q) + 1] < c.row_offsets[size_t(q)])
      invalid("row_offsets decrease at row " + std::to_string(q) + " (" + std::to_string(c.row_offsets[size_t(q)]) + " then " +
              std::to_string(c.row_offsets[size_t(q) + 1]) + ")");
  if (int64_t(c.col_indices.size()) != c.row_offsets.back())
    invalid("col_indices has " + std::to_string(c.col_indices.size()) + " entries but row_offsets ends at " + std::to_string(c.row_offsets.back()));
  for (int64_t q = 0; q < c.rows; ++q) {
    for (int64_t i = c.row_offsets[size_t(q)]; i < c.row_offsets[size_t(q) + 1]; ++i) {
      const int64_t k = c.col_indices[size_t(i)];
      if (k < 0 || k >= c.cols)
        invalid("column index " + std::to_string(k) + " in row " + std::to_string(q) + " is out of range [0, " + std::to_string(c.cols) + ")");
      if (i > c.row_offsets[size_t(q)] && k <= c.col_indices[size_t(i) - 1])
        invalid("column indices of row " + std::to_string(q) + " are not sorted and unique (" +
                std::to_string(c.col_indices[size_t(i) - 1]) + " then " + std::to_string(k) + ")");
    }
  }
}

void validate(const Bsr& b) {
  check_block(b.block);
  if (b.rows < 0 || b.cols < 0) invalid("negative shape " + std::to_string(b.rows) + " x " + std::to_string(b.cols));
  if (b.block_rows != (b.rows + b.block - 1) / b.block || b.block_cols != (b.cols + b.block - 1) / b.block)
    invalid("block grid " + std::to_string(b.block_rows) + " x " + std::to_string(b.block_cols) + " does not match " +
            std::to_string(b.rows) + " x " + std::to_string(b.cols) + " in blocks of " + std::to_string(b.block));
  if (int64_t(b.row_offsets.size()) != b.block_rows + 1)
    invalid("row_offsets has " + std::to_string(b.row_offsets.size()) + " entries, expected block_rows + 1 = " + std::to_string(b.block_rows + 1));
  if (b.row_offsets[0] != 0) invalid("row_offsets[0] is " + std::to_string(b.row_offsets[0]) + ", expected 0");
  for (int64_t r = 0; r < b.block_rows; ++r)
    if (b.row_offsets[size_t(r) + 1] < b.row_offsets[size_t(r)]) invalid("row_offsets decrease at block row " + std::to_string(r));
  const int64_t n = b.row_offsets.back();
  if (int64_t(b.col_indices.size()) != n || int64_t(b.mask_index.size()) != n)
    invalid("col_indices / mask_index have " + std::to_string(b.col_indices.size()) + " / " + std::to_string(b.mask_index.size()) +
            " entries, expected " + std::to_string(n));
  if (b.masks.size() % size_t(b.words_per_mask()) != 0) invalid("masks size is not a multiple of block*block/64");
  for (int64_t r = 0; r < b.block_rows; ++r)
    for (int64_t i = b.row_offsets[size_t(r)]; i < b.row_offsets[size_t(r) + 1]; ++i) {
      const int64_t c = b.col_indices[size_t(i)];
      if (c < 0 || c >= b.block_cols)
        invalid("block column " + std::to_string(c) + " in block row " + std::to_string(r) + " is out of range [0, " + std::to_string(b.block_cols) + ")");
      if (i > b.row_offsets[size_t(r)] && c <= b.col_indices[size_t(i) - 1])
        invalid("block columns of block row " + std::to_string(r) + " are not sorted and unique");
      const int64_t m = b.mask_index[size_t(i)];
      if (m < -1 || m >= b.npartial())
        invalid("mask_index " + std::to_string(m) + " of block " + std::to_string(i) + " is out of range [-1, " + std::to_string(b.npartial()) + ")");
    }
}

void validate(const Acsr& a) {
  if (a.rows < 0 || a.cols < 0) invalid("negative shape");
  if (int64_t(a.row_offsets.size()) != a.rows + 1)
    invalid("row_offsets has " + std::to_string(a.row_offsets.size()) + " entries, expected rows + 1 = " + std::to_string(a.rows + 1));
  if (a.row_offsets[0] != 0 || a.row_offsets.back() != int64_t(a.runs.size())) invalid("row_offsets do not span the runs");
  for (int64_t q = 0; q < a.rows; ++q) {
    if (a.row_offsets[size_t(q) + 1] < a.row_offsets[size_t(q)]) invalid("row_offsets decrease at row " + std::to_string(q));
    for (int64_t i = a.row_offsets[size_t(q)]; i < a.row_offsets[size_t(q) + 1]; ++i) {
      const AcsrRun& r = a.runs[size_t(i)];
      if (r.stride < 1 || r.count < 1 || r.start < 0 || int64_t(r.start) + int64_t(r.count - 1) * r.stride >= a.cols)
        invalid("run (start " + std::to_string(r.start) + ", stride " + std::to_string(r.stride) + ", count " + std::to_string(r.count) +
                ") of row " + std::to_string(q) + " is out of range for " + std::to_string(a.cols) + " columns");
    }
  }
}

}  // namespace spattn
