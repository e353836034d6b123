// spattn/format.hpp — sparse formats built from a pattern: CSR, BSR (+ full flag / bitmasks), ACSR.
#pragma once
#include <cstdint>
#include <vector>

#include "spattn/pattern.hpp"

namespace spattn {

// Compressed sparse rows. Row offsets are 64-bit (nnz above 2^31 works); column indices are 32-bit.
struct Csr {
  int64_t rows = 0, cols = 0;
  std::vector<int64_t> row_offsets;  // [rows + 1], monotone, row_offsets[0] == 0
  std::vector<int32_t> col_indices;  // [nnz], sorted and unique within each row, in [0, cols)
  int64_t nnz() const { return row_offsets.empty() ? 0 : row_offsets.back(); }
};

// Block sparse rows, square blocks of `block` (16, 32, 64 or 128). A stored block is either full (every
// in-range (q, k) of it is kept: mask_index == -1) or partial, with a bitmask of block*block bits, row-major
// (bit r*block + c is (q0 + r, k0 + c)), block*block/64 words. Bits of out-of-range positions are 0.
struct Bsr {
  int64_t rows = 0, cols = 0;
  int block = 0;
  int64_t block_rows = 0, block_cols = 0;  // ceil(rows / block), ceil(cols / block)
  std::vector<int64_t> row_offsets;        // [block_rows + 1]
  std::vector<int32_t> col_indices;        // [nblocks] block-column, sorted within a block row
  std::vector<int64_t> mask_index;         // [nblocks] -1 for a full block, else index of its bitmask
  std::vector<uint64_t> masks;             // [npartial * words_per_mask()]
  int64_t nblocks() const { return row_offsets.empty() ? 0 : row_offsets.back(); }
  int64_t npartial() const { return words_per_mask() ? int64_t(masks.size()) / words_per_mask() : 0; }
  int64_t words_per_mask() const { return int64_t(block) * block / 64; }
  bool full(int64_t i) const { return mask_index[size_t(i)] < 0; }
  // Whether (r, c) inside block i (local coordinates) is kept.
  bool test(int64_t i, int r, int c) const;
};

// One affine run in ACSR: keys start + j * stride for j < count.
struct AcsrRun {
  int32_t start = 0, stride = 1, count = 0;
};

// Affine compressed sparse rows: per row a list of affine runs, no per-element indices.
struct Acsr {
  int64_t rows = 0, cols = 0;
  std::vector<int64_t> row_offsets;  // [rows + 1] into runs
  std::vector<AcsrRun> runs;
  int64_t nnz() const;
};

// Builders: each walks the pattern's row enumeration once (cost follows the runs, not rows x cols).
Csr make_csr(const BoundPattern& p);
Bsr make_bsr(const BoundPattern& p, int block);
Acsr make_acsr(const BoundPattern& p);

// Conversions.
Csr to_csr(const Bsr& b);
Csr to_csr(const Acsr& a);
Bsr to_bsr(const Csr& c, int block);
Acsr to_acsr(const Csr& c);  // compresses each row into maximal affine runs

// Validation of user-given matrices: monotone offsets, sorted unique in-range indices, consistent sizes,
// block size supported. Throws Error naming the first offending row / block and value.
void validate(const Csr& c);
void validate(const Bsr& b);
void validate(const Acsr& a);

bool is_supported_block(int block);  // 16, 32, 64, 128

}  // namespace spattn
