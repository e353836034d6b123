// Guards the sparse formats: builders agree with the pattern, round trips are lossless, validation names
// the offending row / block / value.
#include <gtest/gtest.h>

#include "spattn/format.hpp"

using namespace spattn;

namespace {

const char* kSpecs[] = {
    "local(5)", "longformer(9, 3)", "bigbird(16, 1, 1, 2, seed=1)", "dilated(7, 3)", "sparse_fixed(32, 2)", "random(13, seed=4)",
    "neighborhood(dims=(13,61), kernel=5, dilation=(1,2))", "causal", "sparse_strided(11)", "global_rows(0:3) | local(1) & causal",
    "dense", "local(2) & global_cols(5)",
};

void expect_same(const Csr& a, const Csr& b) {
  EXPECT_EQ(a.rows, b.rows);
  EXPECT_EQ(a.cols, b.cols);
  EXPECT_EQ(a.row_offsets, b.row_offsets);
  EXPECT_EQ(a.col_indices, b.col_indices);
}

}  // namespace

TEST(Formats, CsrMatchesPredicate) {
  for (const char* spec : kSpecs) {
    for (int64_t L : {7, 113, 793}) {
      if (std::string(spec).find("neighborhood") != std::string::npos && L != 793) continue;
      SCOPED_TRACE(std::string(spec) + " L=" + std::to_string(L));
      const BoundPattern p = Pattern::parse(spec).bind(L);
      const Csr c = make_csr(p);
      validate(c);
      for (int64_t q = 0; q < L; ++q) {
        int64_t i = c.row_offsets[size_t(q)];
        for (int64_t k = 0; k < L; ++k)
          if (p.contains(q, k)) {
            ASSERT_LT(i, c.row_offsets[size_t(q) + 1]);
            ASSERT_EQ(c.col_indices[size_t(i++)], k);
          }
        ASSERT_EQ(i, c.row_offsets[size_t(q) + 1]);
      }
    }
  }
}

TEST(Formats, RoundTripsAreLossless) {
  for (const char* spec : kSpecs) {
    for (int64_t L : {7, 113, 793}) {
      if (std::string(spec).find("neighborhood") != std::string::npos && L != 793) continue;
      SCOPED_TRACE(std::string(spec) + " L=" + std::to_string(L));
      const BoundPattern p = Pattern::parse(spec).bind(L);
      const Csr c = make_csr(p);
      for (int bs : {16, 32, 64, 128}) {
        const Bsr b = make_bsr(p, bs);
        validate(b);
        expect_same(to_csr(b), c);
        const Bsr b2 = to_bsr(c, bs);
        EXPECT_EQ(b2.col_indices, b.col_indices);
        EXPECT_EQ(b2.mask_index, b.mask_index);
        EXPECT_EQ(b2.masks, b.masks);
      }
      const Acsr a = make_acsr(p);
      validate(a);
      expect_same(to_csr(a), c);
      expect_same(to_csr(to_acsr(c)), c);
    }
  }
}

TEST(Formats, BsrFullFlagAndBitmask) {
  // local(1) on 40 rows in 16-blocks: diagonal blocks are partial (band), the last block row is cut at 40.
  const Bsr b = make_bsr(Pattern::parse("dense").bind(40), 16);
  ASSERT_EQ(b.nblocks(), 9);
  for (int64_t i = 0; i < b.nblocks(); ++i) EXPECT_TRUE(b.full(i)) << "dense blocks, edge ones included, are full";
  const Bsr l = make_bsr(Pattern::parse("local(1)").bind(40), 16);
  EXPECT_FALSE(l.full(0));
  EXPECT_TRUE(l.test(0, 3, 4));
  EXPECT_FALSE(l.test(0, 3, 5));
  EXPECT_EQ(l.block_rows, 3);
}

TEST(Formats, AcsrUsesAffineRuns) {
  const Acsr a = make_acsr(Pattern::parse("dilated(8, 4) | global_cols(0)").bind(4096));
  for (int64_t q = 0; q < a.rows; ++q) EXPECT_LE(a.row_offsets[size_t(q) + 1] - a.row_offsets[size_t(q)], 2) << "row " << q;
}

namespace {
void expect_invalid(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    FAIL() << "no error, expected: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}
}  // namespace

TEST(Formats, ValidationNamesTheProblem) {
  Csr c;
  c.rows = 2;
  c.cols = 4;
  c.row_offsets = {0, 2, 3};
  c.col_indices = {1, 3, 2};
  validate(c);
  Csr bad = c;
  bad.col_indices = {3, 1, 2};
  expect_invalid([&] { validate(bad); }, "not sorted and unique (3 then 1)");
  bad = c;
  bad.col_indices = {1, 3, 4};
  expect_invalid([&] { validate(bad); }, "column index 4 in row 1 is out of range [0, 4)");
  bad = c;
  bad.row_offsets = {0, 3, 2};
  expect_invalid([&] { validate(bad); }, "row_offsets decrease at row 1");
  bad = c;
  bad.row_offsets = {0, 2};
  expect_invalid([&] { validate(bad); }, "row_offsets has 2 entries, expected rows + 1 = 3");
  bad = c;
  bad.col_indices = {1, 3};
  expect_invalid([&] { validate(bad); }, "col_indices has 2 entries");

  Bsr b = make_bsr(Pattern::parse("local(20)").bind(64), 16);
  validate(b);
  Bsr bb = b;
  bb.col_indices[1] = 7;
  expect_invalid([&] { validate(bb); }, "block column 7 in block row 0 is out of range [0, 4)");
  bb = b;
  bb.block = 24;
  expect_invalid([&] { validate(bb); }, "block size 24 is not supported");
  bb = b;
  bb.mask_index[0] = 99;
  expect_invalid([&] { validate(bb); }, "mask_index 99");
  expect_invalid([&] { make_bsr(Pattern::parse("local(1)").bind(8), 8); }, "block size 8 is not supported");

  // A mask given by its rows (BoundPattern::from_rows): an offset past the columns, though the last one is right,
  // used to read past them (found by fuzz_mask).
  auto from_rows = [](std::vector<int64_t> offsets, std::vector<int32_t> cols) {
    const int64_t rows = int64_t(offsets.size()) - 1;
    spattn::BoundPattern::from_rows(rows, 5, std::move(offsets), std::move(cols));
  };
  from_rows({0, 2, 3}, {1, 3, 2});
  try {
    from_rows({0, 100, 3}, {0, 1, 2});
    ADD_FAILURE() << "no error";
  } catch (const spattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 0 ends at offset 100, past the 3 column indices"), std::string::npos) << e.what();
  }
}
