// Compound plans (plan/parts.hpp): the parts of a split cover the pattern exactly and are disjoint where they merge;
// union terms; the CPU engine's compound forward against the reference engine, and its choice of parts.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "plan/gpu/launch.hpp"
#include "plan/parts.hpp"
#include "spattn/plan.hpp"

namespace {

using spattn::BoundPattern;
using spattn::plan::Part;
using spattn::plan::PartKind;

// Every (q, k): the pattern keeps it iff exactly one merged part does (rows of a rows part: the pattern keeps the
// whole row, and the rows part is dense there).
void expect_exact_cover(const BoundPattern& pat, const spattn::plan::Split& split) {
  const int64_t lq = pat.q_len(), lk = pat.k_len();
  std::vector<int> count(size_t(lq * lk), 0);
  std::vector<char> owned(size_t(lq), 0);
  int64_t nnz_sum = 0;
  for (const Part& p : split.parts) {
    if (p.kind == PartKind::rows) {
      ASSERT_EQ(p.pattern.q_len(), p.row_end - p.row_begin);
      for (int64_t q = p.row_begin; q < p.row_end; ++q) {
        owned[size_t(q)] = 1;
        for (int64_t k = 0; k < lk; ++k) ASSERT_TRUE(pat.contains(q, k)) << "owned row " << q << " misses key " << k;
      }
      continue;
    }
    nnz_sum += p.nnz;
    std::vector<int64_t> keys;
    for (int64_t q = 0; q < lq; ++q) {
      p.pattern.row_keys(q, keys);
      for (int64_t j : keys) {
        const int64_t k = p.kind == PartKind::columns ? p.columns[size_t(j)] : j;
        ++count[size_t(q * lk + k)];
      }
      // The part's predicate agrees with its rows (a columns part's gathered pattern answers both its own way).
      for (int64_t j = 0, i = 0; j < p.pattern.k_len(); ++j) {
        const bool in_row = i < int64_t(keys.size()) && keys[size_t(i)] == j;
        i += in_row;
        ASSERT_EQ(p.pattern.contains(q, j), in_row) << p.pattern.spec() << ": (" << q << ", " << j << ")";
      }
    }
  }
  for (int64_t q = 0; q < lq; ++q) {
    if (owned[size_t(q)]) continue;
    for (int64_t k = 0; k < lk; ++k)
      ASSERT_EQ(count[size_t(q * lk + k)], pat.contains(q, k) ? 1 : 0)
          << pat.spec() << ": (" << q << ", " << k << ")\n" << split.describe();
  }
  (void)nnz_sum;
}

const char* kSpecs[] = {
    "longformer(7, 3)",
    "sparse_fixed(16)",
    "sparse_fixed(10, 3)",
    "local(5) | random(3, seed=4)",
    "random(4, seed=9)",
    "random(2) | random(3, seed=1) | summary(32)",
    "global(0:2, 50) | local(left=6, right=0)",
    "global_rows(5:9) | dilated(4, 3) | global_cols(7, 90:93)",
    "(local(3) | random(2)) & causal",
    "random(3, seed=5) & causal | block_diag(8) | global_cols(0)",
    "bigbird(8, 1, 1, 1)",
    "summary(16) | global_rows(0:4)",
    "global_rows(0:3) | random(2)",
    "dense | random(2)",
    "causal",
    "local(9) | global(0:3)",                           // longformer's shape: band rows with a key prefix + rows
    "local(left=12, right=0) | global_cols(0:2) | global_rows(4:7)",
    "local(30) | global_cols(0:70) | global_rows(0:2)",  // the band overlapping the prefix in most rows
    "dilated(6, 3) | summary(12, c=2) | global_rows(3:5)",  // gathered columns less strided runs
    "stride(4) | summary(16, c=3)",
    "sparse_strided(16)",                              // the affine part (issue 42): the strided term less the band
    "sparse_strided(40)",                              // groups of 3 and 4 tokens at 131
    "local(left=50, right=3) | (stride(20) & causal)",  // the band keeps three of the term's offsets
};

TEST(Parts, CoverThePatternExactly) {
  for (const char* spec : kSpecs)
    for (auto [lq, lk] : {std::pair<int64_t, int64_t>{97, 97}, {64, 150}, {130, 61}})
      for (int mode : {-1, 1})
        for (bool band_kernel : {false, true}) {
          BoundPattern pat;
          try {
            pat = spattn::parse(spec).bind(lq, lk);
          } catch (const spattn::Error&) {
            continue;  // lengths the spec refuses (document sums, global indices out of range)
          }
          const auto split = spattn::plan::split_pattern(pat, spattn::plan::analyze(pat), mode, {band_kernel});
          SCOPED_TRACE(std::string(spec) + " at " + std::to_string(lq) + "x" + std::to_string(lk) + " mode " +
                       std::to_string(mode) + (band_kernel ? ", band kernel" : ""));
          expect_exact_cover(pat, split);
        }
}

TEST(Parts, SplitsWhatTheRulesSay) {
  auto kinds = [](const char* spec, int64_t len, int mode = -1, bool band_kernel = false) {
    const BoundPattern pat = spattn::parse(spec).bind(len);
    std::string s;
    for (const Part& p : spattn::plan::split_pattern(pat, spattn::plan::analyze(pat), mode, {band_kernel}).parts)
      s += std::string(s.empty() ? "" : ",") + spattn::plan::part_kind_name(p.kind);
    return s;
  };
  EXPECT_EQ(kinds("longformer(64, 8)", 1024), "tiles") << "global columns in one key tile, rows only when asked";
  EXPECT_EQ(kinds("longformer(64, 8)", 1024, 1), "tiles,columns,rows");
  EXPECT_EQ(kinds("sparse_fixed(64)", 1024), "tiles,columns");
  EXPECT_EQ(kinds("local(64) | random(4)", 1024), "tiles,scattered");
  EXPECT_EQ(kinds("random(8)", 1024), "scattered");
  EXPECT_EQ(kinds("random(100)", 1024), "tiles") << "a dense random term stays in tiles";
  EXPECT_EQ(kinds("local(64) | global_cols(0:300)", 1024), "tiles") << "too many columns to gather";
  EXPECT_EQ(kinds("longformer(64, 8)", 1024, 0), "tiles") << "mode 0 never splits";
  EXPECT_EQ(kinds("random(100)", 1024, 1), "scattered") << "mode 1 splits whatever the size";
  EXPECT_EQ(kinds("bigbird(64, 1, 1, 1)", 1024), "tiles") << "random blocks cluster";
  EXPECT_EQ(kinds("global_rows(0:4)", 1024), "tiles") << "a rows part alone cannot write the other rows";
  EXPECT_THROW(kinds("local(4)", 64, 2), spattn::Error);
  // Where the band kernel runs the tiles part: global rows beside band rows (with or without a key prefix) leave
  // the tiles for a rows part (the band kernel's split over keys), the rest stays one band part.
  EXPECT_EQ(kinds("longformer(256, 32)", 16384, -1, true), "tiles,rows");
  EXPECT_EQ(kinds("longformer(64, 8)", 1024, -1, true), "tiles,rows");
  EXPECT_EQ(kinds("local(64) | global_rows(0:8)", 1024, -1, true), "tiles,rows");
  EXPECT_EQ(kinds("local(left=64, right=0) | global(0:4)", 1024, -1, true), "tiles,rows") << "sinks, causal window";
  EXPECT_EQ(kinds("longformer(64, 200)", 1024, -1, true), "tiles") << "more rows than Lq / kPartsMaxFraction";
  EXPECT_EQ(kinds("local(64) | global_cols(0:200) | global_rows(0:8)", 1024, -1, true), "tiles")
      << "a prefix too long for the band kernel";
  EXPECT_EQ(kinds("local(64) | global(0:4, 500)", 1024, -1, true), "tiles") << "rows not one range";
  EXPECT_EQ(kinds("dilated(8, 3) | global(0:4)", 1024, -1, true), "tiles") << "no band rows";
  EXPECT_EQ(kinds("local(64) | global_cols(0:8)", 1024, -1, true), "tiles") << "no rows: one band part";
  EXPECT_EQ(kinds("longformer(64, 8)", 1024, 0, true), "tiles") << "mode 0 never splits";
  // The affine part (issue 42): the strided term of sparse_strided less its band, grouped by residue.
  auto gpu = [](const char* spec, int64_t len, int64_t head_dim = 64) {
    const BoundPattern pat = spattn::parse(spec).bind(len);
    spattn::plan::SplitTarget t;
    t.band_kernel = true, t.affine = true, t.head_dim = head_dim, t.tma = true;
    const auto split = spattn::plan::split_pattern(pat, spattn::plan::analyze(pat), -1, t);
    std::string s;
    for (const Part& p : split.parts) s += std::string(s.empty() ? "" : ",") + spattn::plan::part_kind_name(p.kind);
    return s + (split.parts.size() == 2 ? " " + split.parts[1].pattern.spec() : "");
  };
  EXPECT_EQ(gpu("sparse_strided(256)", 16384), "tiles,affine stride(256) & local(left=16384, right=-256)");
  EXPECT_EQ(gpu("sparse_strided(128)", 65536, 128), "tiles,affine stride(128) & local(left=65536, right=-128)");
  EXPECT_EQ(gpu("local(left=300, right=0) | (stride(256) & causal)", 16384),
            "tiles,affine stride(256) & local(left=16384, right=-512)");
  EXPECT_EQ(gpu("dilated(64, 32)", 16384), "tiles") << "one term: the tiles part alone, grouped by residue";
  EXPECT_EQ(gpu("local(4) | dilated(3, 5)", 1024), "tiles") << "the band splits the term's offsets in two";
  EXPECT_EQ(gpu("local(20) | dilated(3, 5)", 1024), "tiles") << "the band keeps all of the term";
  EXPECT_EQ(kinds("sparse_strided(256)", 16384), "tiles") << "the CPU engine's target: only when asked";
  EXPECT_EQ(kinds("sparse_strided(16)", 1024, 1), "tiles,affine") << "mode 1 always";
  // The affine part's pattern: rows k = q + m d, lo <= m <= hi (here the strided term less the diagonal).
  const BoundPattern a = BoundPattern::dilated_offsets(100, 90, 7, -3, -1);
  for (int64_t q = 0; q < 100; ++q)
    for (int64_t k = 0; k < 90; ++k) ASSERT_EQ(a.contains(q, k), (q - k) % 7 == 0 && q - k >= 7 && q - k <= 21) << q << ", " << k;
  try {
    BoundPattern::dilated_offsets(10, 10, 1, 0, 1);
    ADD_FAILURE() << "d = 1 accepted";
  } catch (const spattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("got d 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(BoundPattern::dilated_offsets(10, 10, 3, 2, 1), spattn::Error) << "lo > hi";
}

// The GPU backward's parts (plan::backward_parts, issue 39): where a compound split runs by parts, every kept score is
// in exactly one part (the tiles part's pattern, or a CSR part's row in the full key space), so the parts' gradients
// sum to the pattern's; a rows part or a forced kernel keeps the whole pattern. Host only: no device needed.
TEST(Parts, BackwardPartsCoverThePatternExactly) {
  const spattn::plan::GpuTarget h100{90, 132};
  struct C {
    const char* spec;
    int64_t lq, lk;
    int mode;
    const char* kinds;  // the parts by kind, "" where the pattern runs whole
  };
  const C cs[] = {
      {"sparse_fixed(128, 4)", 517, 517, 1, "tiles,columns"},
      {"sparse_fixed(64)", 1024, 1024, -1, "tiles,columns"},
      {"local(64) | random(4)", 1024, 1024, -1, "tiles,scattered"},
      {"local(256) | random(8)", 1000, 1000, -1, "tiles,scattered"},
      {"local(16) | random(4, seed=1)", 300, 300, 1, "tiles,scattered"},
      {"sparse_fixed(64, 2)", 300, 300, 1, "tiles,columns"},
      {"(local(left=200, right=0) | global_cols(0:4)) & causal", 457, 457, 1, ""},
      {"local(64) | random(8, seed=3)", 333, 301, 1, "tiles,scattered"},
      {"random(6, seed=2)", 301, 301, 1, "scattered"},
      {"local(16) | global_cols(0:4) | random(3, seed=4)", 290, 290, 1, "tiles,columns,scattered"},
      {"longformer(64, 8)", 1024, 1024, 1, ""},     // a rows part
      {"longformer(256, 32)", 16384, 16384, -1, ""},  // a rows part beside band rows (the band kernel)
      {"local(64)", 1024, 1024, -1, ""},
      {"bigbird(64, 1, 1, 1)", 1024, 1024, -1, ""},
      // Issue 42: the affine part (the strided term less the band) beside the band, at lengths that leave residue
      // groups unequal. Its part had no pattern here (backward_parts dropped it): the CSR pass was handed an empty
      // CSR ("a CSR of 1 offsets and 0 keys for 4099 rows", BackwardGpu.StridedPastSixteen on an H200).
      {"sparse_strided(256)", 4099, 4099, -1, "tiles,affine"},
      {"sparse_strided(100)", 3001, 3001, 1, "tiles,affine"},
      {"local(left=300, right=0) | (stride(256) & causal)", 4097, 4097, 1, "tiles,affine"},
  };
  for (const C& c : cs) {
    SCOPED_TRACE(std::string(c.spec) + " mode " + std::to_string(c.mode));
    const BoundPattern pat = spattn::parse(c.spec).bind(c.lq, c.lk);
    spattn::PlanOptions o;
    o.compound = c.mode;
    const spattn::plan::BackwardParts bp = spattn::plan::backward_parts(pat, spattn::plan::analyze(pat), 64, h100, o);
    std::string kinds;
    for (const auto& p : bp.parts) kinds += std::string(kinds.empty() ? "" : ",") + spattn::plan::part_kind_name(p.kind);
    EXPECT_EQ(kinds, c.kinds) << bp.describe();
    EXPECT_EQ(bp.describe().find(bp.by_parts() ? "backward by parts" : "backward: the whole pattern"), 0u) << bp.describe();
    if (!bp.by_parts()) continue;
    std::vector<int> count(size_t(c.lq * c.lk), 0);
    int64_t nnz = 0;
    for (const auto& p : bp.parts) {
      nnz += p.nnz;
      if (p.kind == PartKind::tiles) EXPECT_EQ(&p, &bp.parts.front()) << "the tiles part writes the gradients: first";
      std::vector<int64_t> offsets;
      std::vector<int32_t> cols;
      spattn::plan::backward_part_csr(p, offsets, cols);
      ASSERT_EQ(int64_t(offsets.size()), c.lq + 1);
      ASSERT_EQ(offsets.back(), int64_t(cols.size()));
      EXPECT_EQ(p.nnz, int64_t(cols.size()));
      for (int64_t q = 0; q < c.lq; ++q)
        for (int64_t e = offsets[size_t(q)]; e < offsets[size_t(q) + 1]; ++e) {
          ASSERT_TRUE(cols[size_t(e)] >= 0 && cols[size_t(e)] < c.lk);
          if (e > offsets[size_t(q)]) ASSERT_LT(cols[size_t(e) - 1], cols[size_t(e)]) << "row " << q;
          ++count[size_t(q * c.lk + cols[size_t(e)])];
        }
    }
    EXPECT_EQ(nnz, pat.nnz());
    for (int64_t q = 0; q < c.lq; ++q)
      for (int64_t k = 0; k < c.lk; ++k)
        ASSERT_EQ(count[size_t(q * c.lk + k)], pat.contains(q, k) ? 1 : 0) << q << ", " << k;
  }
  spattn::PlanOptions o;
  const BoundPattern fixed = spattn::parse("sparse_fixed(64, 2)").bind(600);
  o.compound = 1;
  const std::string ex = spattn::plan::backward_parts(fixed, spattn::plan::analyze(fixed), 64, h100, o).describe();
  EXPECT_NE(ex.find("columns [summary(64, c=2)]"), std::string::npos) << ex;
  EXPECT_NE(ex.find("the tile backward over its 18 keys gathered"), std::string::npos) << ex;
  // A forced kernel keeps the whole pattern (its tests force one).
  const BoundPattern pat = spattn::parse("local(64) | random(4)").bind(1024);
  o.compound = -1;
  o.backward_kernel = "cuda_csr_bwd";
  EXPECT_FALSE(spattn::plan::backward_parts(pat, spattn::plan::analyze(pat), 64, h100, o).by_parts());
  o.backward_kernel.clear();
  o.compound = 0;
  EXPECT_FALSE(spattn::plan::backward_parts(pat, spattn::plan::analyze(pat), 64, h100, o).by_parts());
}

// The backward's parts of issue 39's cases at their lengths (host only): which parts each pattern's backward runs
// and the kernels its description names; the patterns that run whole say why.
TEST(Parts, BackwardPartsOfTheIssueCases) {
  const spattn::plan::GpuTarget h200{90, 132};
  struct C {
    const char* spec;
    int64_t len, d;
    const char* kinds;  // "" where the pattern runs whole
    const char* says;   // in describe()
  };
  const C cs[] = {
      {"sparse_fixed(128, 4)", 16384, 64, "tiles,columns", "the tile backward over its 512 keys gathered"},
      {"local(256) | random(8)", 16384, 64, "tiles,scattered", "(cuda_scattered_bwd"},
      {"local(256)", 16384, 64, "", "backward: the whole pattern (one tile list)"},
      {"bigbird(64, 3, 2, 3)", 16384, 64, "", "backward: the whole pattern (one tile list)"},
      {"neighborhood(dims=(96,96), kernel=7)", 9216, 64, "", "backward: the whole pattern (one tile list)"},
      {"(local(left=2048, right=0) | global_cols(0:4)) & causal", 32768, 128, "",
       "backward: the whole pattern (one tile list)"},
      {"longformer(256, 32)", 16384, 64, "", "a rows part replaces its rows' output"},
  };
  for (const C& c : cs) {
    SCOPED_TRACE(c.spec);
    const BoundPattern pat = spattn::parse(c.spec).bind(c.len);
    const spattn::plan::BackwardParts bp =
        spattn::plan::backward_parts(pat, spattn::plan::analyze(pat), c.d, h200, spattn::PlanOptions{});
    std::string kinds;
    for (const auto& p : bp.parts) kinds += std::string(kinds.empty() ? "" : ",") + spattn::plan::part_kind_name(p.kind);
    EXPECT_EQ(kinds, c.kinds) << bp.describe();
    EXPECT_NE(bp.describe().find(c.says), std::string::npos) << bp.describe();
  }
}

TEST(Parts, UnionTerms) {
  const BoundPattern p = spattn::parse("longformer(4, 2) | (random(3) & causal)").bind(50);
  std::vector<std::string> specs;
  for (const BoundPattern& t : p.union_terms()) specs.push_back(t.spec());
  const std::vector<std::string> want{"local(4)", "global_rows(0:2)", "global_cols(0:2)", "random(3, seed=0) & causal"};
  EXPECT_EQ(specs, want);
  const BoundPattern u = BoundPattern::union_of(p.union_terms());
  for (int64_t q = 0; q < 50; ++q)
    for (int64_t k = 0; k < 50; ++k) ASSERT_EQ(u.contains(q, k), p.contains(q, k)) << q << ", " << k;
  EXPECT_EQ(spattn::parse("local(3) & causal").bind(10).union_terms().size(), 1u);
  EXPECT_THROW(BoundPattern::union_of({spattn::parse("local(1)").bind(10), spattn::parse("local(1)").bind(11)}),
               spattn::Error);
}

// The CPU engine's compound forward against the reference engine, on fresh inputs, GQA, every part kind.
TEST(Parts, CpuCompoundMatchesReference) {
  std::mt19937 rng(1234);
  for (const char* spec : kSpecs) {
    spattn::Problem pr;
    pr.batch = 2, pr.q_heads = 4, pr.kv_heads = 2, pr.q_len = 131, pr.kv_len = 131, pr.head_dim = 16;
    pr.dtype = spattn::DType::f32;
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> q(size_t(2 * 131 * 4 * 16)), k(size_t(2 * 131 * 2 * 16)), v(k.size());
    for (auto* t : {&q, &k, &v})
      for (float& x : *t) x = nd(rng);
    using spattn::TensorView;
    const auto tq = TensorView::contiguous(q.data(), spattn::DType::f32, {2, 131, 4, 16});
    const auto tk = TensorView::contiguous(k.data(), spattn::DType::f32, {2, 131, 2, 16});
    const auto tv = TensorView::contiguous(v.data(), spattn::DType::f32, {2, 131, 2, 16});
    auto run = [&](spattn::Engine e, int compound, std::string* explain) {
      spattn::PlanOptions o;
      o.engine = e;
      o.compound = compound;
      const spattn::Plan plan = spattn::make_plan(spattn::parse(spec), pr, spattn::Device::cpu(), o);
      std::vector<float> out(q.size()), lse(size_t(2 * 4 * 131));
      plan.forward(tq, tk, tv, TensorView::contiguous(out.data(), spattn::DType::f32, {2, 131, 4, 16}),
                   TensorView::contiguous(lse.data(), spattn::DType::f32, {2, 4, 131, 1}));
      if (explain) *explain = plan.explain();
      out.insert(out.end(), lse.begin(), lse.end());
      return out;
    };
    const std::vector<float> want = run(spattn::Engine::reference, -1, nullptr);
    for (int mode : {-1, 1}) {
      std::string explain;
      const std::vector<float> got = run(spattn::Engine::cpu_fused, mode, &explain);
      const bool compound = explain.find("compound plan") != std::string::npos;
      // Mode 1 splits every pattern with a column, row or scattered term that keeps something of its own.
      const std::string sp = spec;
      const bool splits = sp != "causal" && sp.rfind("bigbird", 0) != 0 && sp != "dense | random(2)";
      if (mode == 1) EXPECT_EQ(compound, splits) << spec << ": " << explain;
      if (mode == -1) EXPECT_FALSE(compound) << "the CPU engine splits only when asked: " << explain;
      for (size_t i = 0; i < want.size(); ++i) {
        if (std::isinf(want[i])) {
          ASSERT_EQ(got[i], want[i]) << spec << " mode " << mode << " at " << i;
          continue;
        }
        ASSERT_NEAR(got[i], want[i], 2e-4 * (1 + std::fabs(want[i]))) << spec << " mode " << mode << " at " << i << "\n"
                                                                       << explain;
      }
    }
  }
}

}  // namespace
