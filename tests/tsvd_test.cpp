// TSVD on the CPU against an independent reference: a one-sided Jacobi SVD in fp64 written here (no LAPACK),
// applied to the same tiles (or TSVD-common strips). Each test names the failure it guards against.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "spattn/config.hpp"
#include "spattn/tsvd.hpp"
#include "tsvd/matmul.hpp"

using spattn::TsvdFactors;
using spattn::TsvdOptions;

namespace {

// Column-major m x n matrix.
struct Mat {
  int64_t m = 0, n = 0;
  std::vector<double> v;
  double& at(int64_t i, int64_t j) { return v[size_t(j * m + i)]; }
  double at(int64_t i, int64_t j) const { return v[size_t(j * m + i)]; }
};

// Hestenes one-sided Jacobi: A = U diag(s) V^T, s descending. For m < n it factors A^T and swaps.
struct JSvd {
  Mat u, vt;  // u: m x mn, vt: mn x n
  std::vector<double> s;
};
JSvd jacobi_svd(Mat a) {
  const bool tr = a.m < a.n;
  if (tr) {
    Mat t{a.n, a.m, std::vector<double>(a.v.size())};
    for (int64_t i = 0; i < a.m; ++i)
      for (int64_t j = 0; j < a.n; ++j) t.at(j, i) = a.at(i, j);
    a = t;
  }
  const int64_t m = a.m, n = a.n;  // m >= n
  Mat v{n, n, std::vector<double>(size_t(n * n), 0.0)};
  for (int64_t i = 0; i < n; ++i) v.at(i, i) = 1;
  for (int sweep = 0; sweep < 60; ++sweep) {
    double off = 0;
    for (int64_t p = 0; p < n; ++p)
      for (int64_t q = p + 1; q < n; ++q) {
        double al = 0, be = 0, ga = 0;
        for (int64_t i = 0; i < m; ++i) {
          al += a.at(i, p) * a.at(i, p);
          be += a.at(i, q) * a.at(i, q);
          ga += a.at(i, p) * a.at(i, q);
        }
        if (std::abs(ga) <= 1e-15 * std::sqrt(al * be)) continue;
        off = std::max(off, std::abs(ga) / std::sqrt(al * be));
        const double zeta = (be - al) / (2 * ga);
        const double t = (zeta >= 0 ? 1.0 : -1.0) / (std::abs(zeta) + std::sqrt(1 + zeta * zeta));
        const double c = 1 / std::sqrt(1 + t * t), s = c * t;
        for (int64_t i = 0; i < m; ++i) {
          const double x = a.at(i, p), y = a.at(i, q);
          a.at(i, p) = c * x - s * y;
          a.at(i, q) = s * x + c * y;
        }
        for (int64_t i = 0; i < n; ++i) {
          const double x = v.at(i, p), y = v.at(i, q);
          v.at(i, p) = c * x - s * y;
          v.at(i, q) = s * x + c * y;
        }
      }
    if (off < 1e-14) break;
  }
  std::vector<double> norms(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    double s = 0;
    for (int64_t i = 0; i < m; ++i) s += a.at(i, j) * a.at(i, j);
    norms[size_t(j)] = std::sqrt(s);
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return norms[size_t(x)] > norms[size_t(y)]; });
  JSvd r;
  r.s.resize(size_t(n));
  Mat uu{m, n, std::vector<double>(size_t(m * n))}, vv{n, n, std::vector<double>(size_t(n * n))};
  for (int64_t k = 0; k < n; ++k) {
    const int64_t j = order[size_t(k)];
    r.s[size_t(k)] = norms[size_t(j)];
    for (int64_t i = 0; i < m; ++i) uu.at(i, k) = norms[size_t(j)] > 0 ? a.at(i, j) / norms[size_t(j)] : 0;
    for (int64_t i = 0; i < n; ++i) vv.at(k, i) = v.at(i, j);  // vv = V^T
  }
  if (!tr) {
    r.u = uu;
    r.vt = vv;
  } else {  // A^T = U S V^T  =>  A = V S U^T
    r.u = Mat{n, n, std::vector<double>(size_t(n * n))};
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < n; ++k) r.u.at(i, k) = vv.at(k, i);
    r.vt = Mat{n, m, std::vector<double>(size_t(n * m))};
    for (int64_t k = 0; k < n; ++k)
      for (int64_t i = 0; i < m; ++i) r.vt.at(k, i) = uu.at(i, k);
  }
  return r;
}

// The rank-r truncation of a block, in fp64.
Mat truncate(const Mat& a, int64_t r) {
  const JSvd s = jacobi_svd(a);
  Mat out{a.m, a.n, std::vector<double>(a.v.size(), 0.0)};
  for (int64_t q = 0; q < r; ++q)
    for (int64_t j = 0; j < a.n; ++j)
      for (int64_t i = 0; i < a.m; ++i) out.at(i, j) += s.u.at(i, q) * s.s[size_t(q)] * s.vt.at(q, j);
  return out;
}

// A matrix with decaying spectrum (so truncations are well separated) plus noise.
std::vector<float> test_matrix(int64_t k, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd;
  std::vector<float> w(static_cast<size_t>(k * n));
  std::vector<double> u(static_cast<size_t>(k)), v(static_cast<size_t>(n));
  for (int term = 0; term < 12; ++term) {
    for (auto& x : u) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    const double s = std::pow(0.7, term);
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < n; ++j) w[size_t(i * n + j)] += float(s * u[size_t(i)] * v[size_t(j)]);
  }
  for (auto& x : w) x += float(0.05 * nd(rng));
  return w;
}

// The reference tiled truncation (plain TSVD, the ranks the factors chose): W_hat in fp64, row-major.
std::vector<double> reference_plain(const std::vector<float>& w, const TsvdFactors& f) {
  std::vector<double> out(w.size());
  for (int64_t i = 0; i < f.tile_rows(); ++i)
    for (int64_t j = 0; j < f.tile_cols(); ++j) {
      Mat t{f.rows_of(i), f.cols_of(j), {}};
      t.v.resize(size_t(t.m * t.n));
      for (int64_t p = 0; p < t.m; ++p)
        for (int64_t c = 0; c < t.n; ++c) t.at(p, c) = w[size_t((i * f.tile_k + p) * f.n + j * f.tile_n + c)];
      const Mat r = truncate(t, f.rank(i, j));
      for (int64_t p = 0; p < t.m; ++p)
        for (int64_t c = 0; c < t.n; ++c) out[size_t((i * f.tile_k + p) * f.n + j * f.tile_n + c)] = r.at(p, c);
    }
  return out;
}

// TSVD-common per the thesis: a group's strips side by side (short strips padded with zero rows), truncated.
std::vector<double> reference_common(const std::vector<float>& w, const TsvdFactors& f) {
  std::vector<double> out(w.size());
  const int64_t tr = f.tile_rows();
  for (int64_t g = 0; g < f.common; ++g) {
    std::vector<int64_t> strips;
    for (int64_t i = 0; i < tr; ++i)
      if (i * f.common / tr == g) strips.push_back(i);
    Mat c{f.tile_k, int64_t(strips.size()) * f.n, {}};
    c.v.assign(size_t(c.m * c.n), 0.0);
    for (size_t s = 0; s < strips.size(); ++s)
      for (int64_t p = 0; p < f.rows_of(strips[s]); ++p)
        for (int64_t col = 0; col < f.n; ++col) c.at(p, int64_t(s) * f.n + col) = w[size_t((strips[s] * f.tile_k + p) * f.n + col)];
    const Mat r = truncate(c, f.ranks[size_t(g)]);
    for (size_t s = 0; s < strips.size(); ++s)
      for (int64_t p = 0; p < f.rows_of(strips[s]); ++p)
        for (int64_t col = 0; col < f.n; ++col) out[size_t((strips[s] * f.tile_k + p) * f.n + col)] = r.at(p, int64_t(s) * f.n + col);
  }
  return out;
}

double rel_frob(const std::vector<float>& w, const std::vector<double>& hat) {
  double d = 0, s = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    d += (w[i] - hat[i]) * (w[i] - hat[i]);
    s += double(w[i]) * w[i];
  }
  return std::sqrt(d / s);
}

// Largest |a - b| relative to max |b|.
double max_rel_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double d = 0, s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::abs(a[i] - b[i]));
    s = std::max(s, std::abs(b[i]));
  }
  return d / s;
}

#define REQUIRE_LAPACK() \
  if (!SPATTN_HAVE_LAPACK) GTEST_SKIP() << "this build has no LAPACK: TSVD compression is off"

// Non-multiple sizes (ragged last tile row and column), non-square tiles, a ratio.
TEST(Tsvd, RaggedTilesMatchJacobiReference) {
  REQUIRE_LAPACK();
  const int64_t K = 100, N = 75;
  const auto w = test_matrix(K, N, 1);
  TsvdOptions o;
  o.tile_k = 32, o.tile_n = 24, o.ratio = 2;
  const TsvdFactors f = spattn::tsvd_compress(w.data(), K, N, o);
  EXPECT_EQ(f.tile_rows(), 4);
  EXPECT_EQ(f.tile_cols(), 4);
  EXPECT_EQ(f.rank(0, 0), 6);   // floor(32 * 24 / (2 * 56)) = 6
  EXPECT_EQ(f.rank(3, 0), 4);   // the last tile row has 4 rows: the rank is capped there
  const auto ref = reference_plain(w, f);
  const auto rec = spattn::tsvd_reconstruct(f);
  EXPECT_LT(max_rel_diff(rec, ref), 2e-6) << "the factors are not the tiles' truncated SVD";
  const spattn::TsvdError e = spattn::tsvd_error(w.data(), f);
  EXPECT_NEAR(e.total, rel_frob(w, ref), 1e-6 * rel_frob(w, ref) + 1e-7);
  EXPECT_GT(e.total, 1e-3) << "a truncation that loses nothing does not test anything";
}

// Square tiles dividing the matrix, a rank: the per-tile errors against the reference, tile by tile.
TEST(Tsvd, PerTileErrorsMatchReference) {
  REQUIRE_LAPACK();
  const int64_t K = 64, N = 96;
  const auto w = test_matrix(K, N, 2);
  TsvdOptions o;
  o.tile_k = 32, o.tile_n = 32, o.rank = 5;
  const TsvdFactors f = spattn::tsvd_compress(w.data(), K, N, o);
  ASSERT_TRUE(f.uniform_rank());
  const auto ref = reference_plain(w, f);
  const spattn::TsvdError e = spattn::tsvd_error(w.data(), f);
  for (int64_t i = 0; i < f.tile_rows(); ++i)
    for (int64_t j = 0; j < f.tile_cols(); ++j) {
      double d = 0, s = 0;
      for (int64_t p = 0; p < 32; ++p)
        for (int64_t c = 0; c < 32; ++c) {
          const size_t x = size_t((i * 32 + p) * N + j * 32 + c);
          d += (w[x] - ref[x]) * (w[x] - ref[x]);
          s += double(w[x]) * w[x];
        }
      EXPECT_NEAR(e.tile[size_t(i * f.tile_cols() + j)], std::sqrt(d / s), 1e-6) << "tile " << i << ", " << j;
    }
  EXPECT_EQ(f.stored(), 6 * 5 * (32 + 32));
}

TEST(Tsvd, RatioGivesTheIssueFormula) {
  EXPECT_EQ(spattn::tsvd_rank_for_ratio(256, 256, 2), 64);
  EXPECT_EQ(spattn::tsvd_rank_for_ratio(256, 256, 8), 16);
  EXPECT_EQ(spattn::tsvd_rank_for_ratio(64, 64, 8), 4);
  EXPECT_EQ(spattn::tsvd_rank_for_ratio(4, 4, 8), 1) << "at least 1";
  EXPECT_THROW(spattn::tsvd_rank_for_ratio(64, 64, 0.5), spattn::Error);
}

// An error target: met, and not met by much less storage (the greedy drops what it can).
TEST(Tsvd, ErrorTargetIsMetWithPerTileRanks) {
  REQUIRE_LAPACK();
  const int64_t K = 96, N = 80;
  auto w = test_matrix(K, N, 3);
  for (int64_t i = 0; i < 32; ++i)  // one important tile (the thesis's Fig. 4.2): ten times larger
    for (int64_t j = 0; j < 32; ++j) w[size_t(i * N + j)] *= 10;
  TsvdOptions o;
  o.tile_k = 32, o.tile_n = 32, o.error = 0.05;
  const TsvdFactors f = spattn::tsvd_compress(w.data(), K, N, o);
  const spattn::TsvdError e = spattn::tsvd_error(w.data(), f);
  EXPECT_LE(e.total, 0.05 * (1 + 1e-6));
  EXPECT_GT(e.total, 0.03) << "the ranks keep more than the target needs";
  EXPECT_FALSE(f.uniform_rank()) << "the important tile should keep a higher rank";
  EXPECT_GT(f.rank(0, 0), f.rank(2, 2));
  EXPECT_NEAR(e.total, rel_frob(w, reference_plain(w, f)), 1e-6);
}

// TSVD-common (thesis Fig. 4.6) with one shared A (U1) and with one per tile row, a short last strip.
TEST(Tsvd, CommonMatchesConcatenatedStripReference) {
  REQUIRE_LAPACK();
  const int64_t K = 88, N = 40;
  const auto w = test_matrix(K, N, 4);
  for (int64_t groups : {int64_t(1), int64_t(2), int64_t(3)}) {
    TsvdOptions o;
    o.tile_k = 32, o.tile_n = 16, o.rank = 6, o.common = groups;
    const TsvdFactors f = spattn::tsvd_compress(w.data(), K, N, o);
    EXPECT_EQ(f.a_floats(), groups * 32 * 6) << "one A per group";
    const auto ref = reference_common(w, f);
    EXPECT_LT(max_rel_diff(spattn::tsvd_reconstruct(f), ref), 2e-6) << groups << " groups";
    EXPECT_NEAR(spattn::tsvd_error(w.data(), f).total, rel_frob(w, ref), 1e-6) << groups << " groups";
  }
  TsvdOptions o;
  o.tile_k = 32, o.tile_n = 16, o.ratio = 4, o.common = 3;
  const TsvdFactors f = spattn::tsvd_compress(w.data(), K, N, o);
  EXPECT_NEAR(f.compression(), 4.0, 0.6) << "common's ratio counts the shared A once per group";
}

// Y = X TSVD(W) against X (W_hat in fp64), through sgemm and through loops; M = 1 and M not a multiple of 64.
TEST(Tsvd, MatmulMatchesReconstructedProduct) {
  REQUIRE_LAPACK();
  const int64_t K = 100, N = 75;
  const auto w = test_matrix(K, N, 5);
  for (int64_t common : {int64_t(0), int64_t(2)}) {
    TsvdOptions o;
    o.tile_k = 32, o.tile_n = 24, o.rank = 4, o.common = common;
    const TsvdFactors f = spattn::tsvd_compress(w.data(), K, N, o);
    const auto hat = spattn::tsvd_reconstruct(f);
    for (int64_t M : {int64_t(1), int64_t(70)}) {
      std::mt19937_64 rng(static_cast<uint64_t>(M));
      std::normal_distribution<float> nd;
      std::vector<float> x(static_cast<size_t>(M * K));
      for (auto& v : x) v = nd(rng);
      // The reference product in fp64 from the factors' reconstruction (itself checked above).
      std::vector<double> ref(static_cast<size_t>(M * N), 0.0);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t kk = 0; kk < K; ++kk)
          for (int64_t n = 0; n < N; ++n) ref[size_t(m * N + n)] += double(x[size_t(m * K + kk)]) * hat[size_t(kk * N + n)];
      for (bool blas : {false, true}) {
        if (blas && !SPATTN_HAVE_LAPACK) continue;
        std::vector<float> y(static_cast<size_t>(M * N), std::nanf(""));
        spattn::tsvd::matmul_cpu(f, x.data(), M, y.data(), 2, blas);
        EXPECT_LT(max_rel_diff(y, ref), 1e-5) << "M=" << M << " blas=" << blas << " common=" << common;
      }
    }
  }
}

// ---- the .tsvd file ----

TsvdFactors small_factors() {
  TsvdFactors f;
  f.k = 10, f.n = 7, f.tile_k = 4, f.tile_n = 4;
  f.ranks = {2, 1, 2, 3, 1, 2};
  f.layout(true);
  for (size_t i = 0; i < f.a.size(); ++i) f.a[i] = float(i) * 0.5f;
  for (size_t i = 0; i < f.b.size(); ++i) f.b[i] = float(i) * -0.25f;
  return f;
}

std::string temp_path(const char* name) { return ::testing::TempDir() + name; }

std::vector<char> file_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void write_bytes(const std::string& p, const std::vector<char>& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(b.data(), std::streamsize(b.size()));
}

TEST(TsvdFile, RoundTripIsExact) {
  const TsvdFactors f = small_factors();
  const std::string p = temp_path("roundtrip.tsvd");
  spattn::tsvd_save(f, p);
  const TsvdFactors g = spattn::tsvd_load(p);
  EXPECT_EQ(g.k, f.k);
  EXPECT_EQ(g.n, f.n);
  EXPECT_EQ(g.tile_k, f.tile_k);
  EXPECT_EQ(g.tile_n, f.tile_n);
  EXPECT_EQ(g.ranks, f.ranks);
  EXPECT_EQ(g.a, f.a);
  EXPECT_EQ(g.b, f.b);
  EXPECT_EQ(file_bytes(p).size(), 64 + 4 * (6 + f.a.size() + f.b.size()));
}

// Each corruption is refused with a message naming the field.
TEST(TsvdFile, BadFilesNameTheField) {
  const std::string p = temp_path("bad.tsvd");
  spattn::tsvd_save(small_factors(), p);
  const std::vector<char> good = file_bytes(p);
  auto expect_error = [&](std::vector<char> bytes, const std::string& needle, const char* what) {
    write_bytes(p, bytes);
    try {
      spattn::tsvd_load(p);
      ADD_FAILURE() << what << ": accepted";
    } catch (const spattn::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
    }
  };
  auto put32 = [](std::vector<char> b, size_t at, uint32_t v) {
    std::memcpy(&b[at], &v, 4);
    return b;
  };
  auto put64 = [](std::vector<char> b, size_t at, int64_t v) {
    std::memcpy(&b[at], &v, 8);
    return b;
  };
  expect_error(put32(good, 0, 0x12345678), "magic", "magic");
  expect_error(put32(good, 8, 2), "version 2", "version");
  expect_error(put32(good, 12, 4), "flags", "unknown flag bit");
  expect_error(put32(good, 12, 1), "common", "common flag without groups");
  expect_error(put32(good, 16, 1), "dtype 1", "dtype");
  expect_error(put32(good, 20, 9), "reserved", "reserved");
  expect_error(put64(good, 24, 0), "K = 0", "K");
  expect_error(put64(good, 32, -3), "N = -3", "N");
  expect_error(put64(good, 40, 11), "tile_k = 11", "tile_k beyond K");
  expect_error(put64(good, 48, 0), "tile_n = 0", "tile_n");
  expect_error(put32(good, 64 + 4 * 3, 5), "rank 5 of tile (1, 1)", "rank beyond the tile");
  expect_error(put32(good, 64, 0), "rank 0 of tile (0, 0)", "rank 0");
  expect_error(std::vector<char>(good.begin(), good.end() - 4), "bytes", "truncated data");
  expect_error(std::vector<char>(good.begin(), good.begin() + 70), "truncated", "truncated ranks");
  expect_error(std::vector<char>(good.begin(), good.begin() + 10), "too short", "truncated header");
  std::vector<char> longer = good;
  longer.push_back(0);
  expect_error(longer, "bytes", "trailing bytes");
  std::vector<char> nan = good;
  const float q = std::nanf("");
  std::memcpy(&nan[64 + 4 * 6], &q, 4);
  expect_error(nan, "non-finite", "NaN factor");
}

TEST(TsvdOptions, BadOptionsAreNamed) {
  const std::vector<float> w(64, 1.f);
  auto msg = [&](TsvdOptions o, int64_t k = 8, int64_t n = 8) -> std::string {
    try {
      spattn::tsvd_compress(w.data(), k, n, o);
    } catch (const spattn::Error& e) {
      return e.what();
    }
    return "accepted";
  };
  TsvdOptions o;
  o.tile_k = o.tile_n = 4;
  EXPECT_NE(msg(o).find("none given (0 is none of them)"), std::string::npos);
  o.rank = 2, o.ratio = 2;
  EXPECT_NE(msg(o).find("(2 given)"), std::string::npos);
  o.rank = 0, o.ratio = 0.5;
  EXPECT_NE(msg(o).find("ratio 0.5"), std::string::npos);
  o.ratio = 2, o.tile_k = 0;
  EXPECT_NE(msg(o).find("tile 0 x 4"), std::string::npos);
  o.tile_k = 4, o.common = 3;
  EXPECT_NE(msg(o).find("common = 3"), std::string::npos) << "8 / 4 = 2 tile rows";
  o.common = 0, o.ratio = 0, o.error = 1.5;
  EXPECT_NE(msg(o).find("error target"), std::string::npos);
  o.error = 0, o.rank = 2;
  EXPECT_NE(msg(o, 0, 8).find("W is 0 x 8"), std::string::npos);
  // A rank that stores more than the tile is refused (rank 1000 at tile 256 stored twice W's floats), a non-finite
  // weight named (LAPACK's "info -4").
  o.rank = 3;
  EXPECT_NE(msg(o).find("rank 3 stores more floats than W: rank r keeps r (4 + 4) floats a 4 x 4 tile of 16; at most "
                        "rank 2"), std::string::npos) << msg(o);
  o.rank = 2;
  EXPECT_EQ(msg(o), "accepted");
  std::vector<float> bad(w);
  bad[13] = std::nanf("");
  try {
    spattn::tsvd_compress(bad.data(), 8, 8, o);
    ADD_FAILURE() << "a NaN weight accepted";
  } catch (const spattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("W[1, 5] is nan: W must be finite"), std::string::npos) << e.what();
  }
}

}  // namespace
