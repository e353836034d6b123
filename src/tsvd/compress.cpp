// TSVD compression on the CPU: one LAPACK dgesdd per tile (or per TSVD-common group), in fp64, tiles in
// parallel on the library's worker pool.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>

#include "common/parallel.hpp"
#include "spattn/tsvd.hpp"
#include "tsvd/blas.hpp"

namespace spattn {
namespace {

std::string num(int64_t v) { return std::to_string(v); }
std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

// The thin SVD of a column-major m x n matrix (overwritten): u (m x mn), s (mn), vt (mn x n), mn = min(m, n).
// With vectors = false only s.
struct Svd {
  std::vector<double> u, s, vt;
};
Svd svd(std::vector<double>& a, int m, int n, bool vectors) {
#if SPATTN_HAVE_LAPACK
  const int mn = std::min(m, n);
  Svd r;
  r.s.resize(size_t(mn));
  if (vectors) {
    r.u.resize(size_t(m) * size_t(mn));
    r.vt.resize(size_t(mn) * size_t(n));
  }
  const char jobz = vectors ? 'S' : 'N';
  const int lda = m, ldu = m, ldvt = std::max(1, mn);
  std::vector<int> iwork(static_cast<size_t>(8 * mn));
  int info = 0, lwork = -1;
  double query = 0;
  double dummy = 0;
  dgesdd_(&jobz, &m, &n, a.data(), &lda, r.s.data(), vectors ? r.u.data() : &dummy, &ldu, vectors ? r.vt.data() : &dummy,
          &ldvt, &query, &lwork, iwork.data(), &info, 1);
  if (info != 0) throw Error("TSVD: LAPACK dgesdd workspace query failed (info " + num(info) + ")");
  lwork = int(query) + 1;
  std::vector<double> work(static_cast<size_t>(lwork));
  dgesdd_(&jobz, &m, &n, a.data(), &lda, r.s.data(), vectors ? r.u.data() : &dummy, &ldu, vectors ? r.vt.data() : &dummy,
          &ldvt, work.data(), &lwork, iwork.data(), &info, 1);
  if (info != 0)
    throw Error("TSVD: LAPACK dgesdd failed on a " + num(m) + " x " + num(n) + " block (info " + num(info) +
                (info > 0 ? ": did not converge; does W hold NaN or Inf?)" : ")"));
  return r;
#else
  (void)a, (void)m, (void)n, (void)vectors;
  throw Error("TSVD compression needs LAPACK: this build of spattn found none (install liblapack-dev, e.g. through "
              "scripts/install-deps.sh, and configure again)");
#endif
}

// W[rows r0.., cols c0..] (h x w) into a column-major double matrix of height `ld` rows (extra rows zero).
void gather(const float* w, int64_t n, int64_t r0, int64_t c0, int64_t h, int64_t wd, int64_t ld, double* out) {
  for (int64_t c = 0; c < wd; ++c)
    for (int64_t p = 0; p < ld; ++p) out[c * ld + p] = p < h ? double(w[(r0 + p) * n + c0 + c]) : 0.0;
}

int pool_threads(int threads) { return threads > 0 ? threads : common::hardware_threads(); }

void check_options(int64_t k, int64_t n, const TsvdOptions& o) {
  if (k < 1 || n < 1) throw Error("TSVD: W is " + num(k) + " x " + num(n) + ", expected at least 1 x 1");
  if (o.tile_k < 1 || o.tile_n < 1)
    throw Error("TSVD: tile " + num(o.tile_k) + " x " + num(o.tile_n) + " must be at least 1 x 1");
  const int given = (o.rank != 0) + (o.ratio != 0) + (o.error != 0);
  if (given == 0)
    throw Error("TSVD: give exactly one of rank (at least 1), ratio (at least 1) and error (in (0, 1)); none given "
                "(0 is none of them)");
  if (given != 1) throw Error("TSVD: give exactly one of rank, ratio and error (" + num(given) + " given)");
  if (o.rank < 0) throw Error("TSVD: rank " + num(o.rank) + " must be at least 1");
  // A rank past tK tN / (tK + tN) stores more floats than the tile itself (rank 1000 at tile 256 stored twice W's).
  const int64_t tk = std::min(o.tile_k, k), tn = std::min(o.tile_n, n), useful = std::max<int64_t>(1, tk * tn / (tk + tn));
  if (o.rank > useful && !o.common)
    throw Error("TSVD: rank " + num(o.rank) + " stores more floats than W: rank r keeps r (" + num(tk) + " + " +
                num(tn) + ") floats a " + num(tk) + " x " + num(tn) + " tile of " + num(tk * tn) + "; at most rank " +
                num(useful) + " (ratio 1)");
  if (o.ratio != 0 && !(o.ratio >= 1)) throw Error("TSVD: ratio " + fmt(o.ratio) + " must be at least 1");
  if (o.error != 0 && !(o.error > 0 && o.error < 1))
    throw Error("TSVD: error target " + fmt(o.error) + " must be in (0, 1)");
  if (o.common < 0) throw Error("TSVD: common " + num(o.common) + " must not be negative");
  if (o.common && o.error) throw Error("TSVD: an error target is for plain TSVD only (common = " + num(o.common) + ")");
}

// Plain TSVD: ranks per tile from the options (rank / ratio capped at the tile's smaller side; the error target
// through the singular values of every tile, computed first).
std::vector<int32_t> plain_ranks(const float* w, const TsvdFactors& f, const TsvdOptions& o) {
  const int64_t tr = f.tile_rows(), tc = f.tile_cols();
  std::vector<int32_t> ranks(static_cast<size_t>(tr * tc));
  const int64_t base = o.rank ? o.rank : o.ratio ? tsvd_rank_for_ratio(f.tile_k, f.tile_n, o.ratio) : 0;
  if (base) {
    for (int64_t i = 0; i < tr; ++i)
      for (int64_t j = 0; j < tc; ++j) ranks[size_t(i * tc + j)] = int32_t(std::min({base, f.rows_of(i), f.cols_of(j)}));
    return ranks;
  }
  // Error target e: drop the singular values with the least energy per stored float (sigma^2 / (tk + tn)) while
  // the dropped energy stays within e^2 ||W||^2; every tile keeps its first. Dropping a tile's tail first is
  // automatic: within a tile that key falls along the singular values.
  std::vector<std::vector<double>> sig(size_t(tr * tc));
  common::parallel_for(tr * tc, pool_threads(o.threads), [&](int64_t t, int) {
    const int64_t i = t / tc, j = t % tc, h = f.rows_of(i), wd = f.cols_of(j);
    std::vector<double> a(static_cast<size_t>(h * wd));
    gather(w, f.n, i * f.tile_k, j * f.tile_n, h, wd, h, a.data());
    sig[size_t(t)] = svd(a, int(h), int(wd), false).s;
  });
  double total = 0;
  struct Drop {
    double key, energy;
    int64_t tile;
  };
  std::vector<Drop> drops;
  for (int64_t t = 0; t < tr * tc; ++t) {
    const double cost = double(f.rows_of(t / tc) + f.cols_of(t % tc));
    const auto& s = sig[size_t(t)];
    for (size_t q = 0; q < s.size(); ++q) {
      total += s[q] * s[q];
      if (q > 0) drops.push_back({s[q] * s[q] / cost, s[q] * s[q], t});
    }
    ranks[size_t(t)] = int32_t(s.size());
  }
  std::sort(drops.begin(), drops.end(), [](const Drop& x, const Drop& y) { return x.key < y.key; });
  double dropped = 0;
  const double budget = o.error * o.error * total;
  for (const Drop& d : drops) {
    if (dropped + d.energy > budget) break;
    dropped += d.energy;
    --ranks[size_t(d.tile)];
  }
  return ranks;
}

}  // namespace

int64_t tsvd_rank_for_ratio(int64_t tile_k, int64_t tile_n, double ratio) {
  if (!(ratio >= 1)) throw Error("TSVD: ratio " + fmt(ratio) + " must be at least 1");
  return std::max<int64_t>(1, int64_t(std::floor(double(tile_k) * double(tile_n) / (ratio * double(tile_k + tile_n)))));
}

TsvdFactors tsvd_compress(const float* w, int64_t k, int64_t n, const TsvdOptions& o) {
  check_options(k, n, o);
  TsvdFactors f;
  f.k = k, f.n = n, f.tile_k = std::min(o.tile_k, k), f.tile_n = std::min(o.tile_n, n), f.common = o.common;
  f.check_shape();  // names a common count beyond the tile rows
  for (int64_t i = 0; i < k * n; ++i)  // (LAPACK answered a NaN with "info -4")
    if (!std::isfinite(w[i]))
      throw Error("TSVD: W[" + num(i / n) + ", " + num(i % n) + "] is " + fmt(double(w[i])) + ": W must be finite");
  const int64_t tr = f.tile_rows(), tc = f.tile_cols();
  const int threads = pool_threads(o.threads);

  if (!f.common) {
    f.ranks = plain_ranks(w, f, o);
    f.layout(true);
    common::parallel_for(tr * tc, threads, [&](int64_t t, int) {
      const int64_t i = t / tc, j = t % tc, h = f.rows_of(i), wd = f.cols_of(j), r = f.rank(i, j), mn = std::min(h, wd);
      std::vector<double> a(static_cast<size_t>(h * wd));
      gather(w, n, i * f.tile_k, j * f.tile_n, h, wd, h, a.data());
      const Svd s = svd(a, int(h), int(wd), true);
      float *A = f.a_block(i, j), *B = f.b_block(i, j);
      for (int64_t p = 0; p < h; ++p)
        for (int64_t q = 0; q < r; ++q) A[p * r + q] = float(s.u[size_t(q * h + p)] * s.s[size_t(q)]);
      for (int64_t q = 0; q < r; ++q)
        for (int64_t c = 0; c < wd; ++c) B[q * wd + c] = float(s.vt[size_t(c * mn + q)]);
    });
    return f;
  }

  // TSVD-common: group g's strips side by side, a tK x (strips * N) matrix; one SVD; A shared, B sliced per tile.
  const int64_t G = f.common;
  auto first_strip = [&](int64_t g) { return (g * tr + G - 1) / G; };
  f.ranks.resize(size_t(G));
  for (int64_t g = 0; g < G; ++g) {
    const int64_t strips = first_strip(g + 1) - first_strip(g), maxr = std::min(f.tile_k, strips * n);
    // Stored floats r (G tK + tr N) = K N / R.
    const int64_t r = o.rank ? o.rank
                             : std::max<int64_t>(1, int64_t(std::floor(double(k) * double(n) /
                                                                       (o.ratio * double(G * f.tile_k + tr * n)))));
    f.ranks[size_t(g)] = int32_t(std::min(r, maxr));
  }
  f.layout(true);
  common::parallel_for(G, threads, [&](int64_t g, int) {
    const int64_t i0 = first_strip(g), strips = first_strip(g + 1) - i0, h = f.tile_k, wd = strips * n;
    const int64_t r = f.ranks[size_t(g)], mn = std::min(h, wd);
    std::vector<double> a(static_cast<size_t>(h * wd));
    for (int64_t s = 0; s < strips; ++s) gather(w, n, (i0 + s) * f.tile_k, 0, f.rows_of(i0 + s), n, h, a.data() + s * n * h);
    const Svd s = svd(a, int(h), int(wd), true);
    float* A = f.a_block(i0, 0);
    for (int64_t p = 0; p < h; ++p)
      for (int64_t q = 0; q < r; ++q) A[p * r + q] = float(s.u[size_t(q * h + p)] * s.s[size_t(q)]);
    for (int64_t st = 0; st < strips; ++st)
      for (int64_t j = 0; j < tc; ++j) {
        const int64_t tn = f.cols_of(j);
        float* B = f.b_block(i0 + st, j);
        for (int64_t q = 0; q < r; ++q)
          for (int64_t c = 0; c < tn; ++c) B[q * tn + c] = float(s.vt[size_t((st * n + j * f.tile_n + c) * mn + q)]);
      }
  });
  return f;
}

}  // namespace spattn
