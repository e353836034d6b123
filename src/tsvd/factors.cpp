// The TsvdFactors layout, the .tsvd file, reconstruction and the error report.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

#include "common/parallel.hpp"
#include "spattn/tsvd.hpp"

namespace spattn {
namespace {

std::string num(int64_t v) { return std::to_string(v); }

int pool_threads(int threads) { return threads > 0 ? threads : common::hardware_threads(); }

}  // namespace

void TsvdFactors::check_shape() const {
  constexpr int64_t kMaxSide = (int64_t(1) << 31) - 1;
  if (k < 1 || k > kMaxSide) throw Error("TSVD: K = " + num(k) + " is out of range [1, 2^31 - 1]");
  if (n < 1 || n > kMaxSide) throw Error("TSVD: N = " + num(n) + " is out of range [1, 2^31 - 1]");
  if (tile_k < 1 || tile_k > k) throw Error("TSVD: tile_k = " + num(tile_k) + " is out of range [1, K = " + num(k) + "]");
  if (tile_n < 1 || tile_n > n) throw Error("TSVD: tile_n = " + num(tile_n) + " is out of range [1, N = " + num(n) + "]");
  const int64_t tr = tile_rows(), tc = tile_cols();
  if (tr * tc > (int64_t(1) << 32)) throw Error("TSVD: " + num(tr * tc) + " tiles are too many (at most 2^32)");
  if (common < 0 || common > tr)
    throw Error("TSVD: common = " + num(common) + " is out of range [0, tile rows = " + num(tr) + "]");
}

void TsvdFactors::offsets(std::vector<int64_t>& ao, std::vector<int64_t>& bo) const {
  check_shape();
  const int64_t tr = tile_rows(), tc = tile_cols();
  const int64_t want = common ? common : tr * tc;
  if (int64_t(ranks.size()) != want)
    throw Error("TSVD: " + num(int64_t(ranks.size())) + " ranks given, the layout needs " + num(want) +
                (common ? " (one per group)" : " (one per tile)"));
  ao.assign(size_t(want + 1), 0);
  bo.assign(size_t(tr * tc + 1), 0);
  if (common) {
    for (int64_t g = 0; g < common; ++g) {
      // The strips of group g are the tile rows i with group_of(i) == g: [ceil(g tr / G), ceil((g+1) tr / G)).
      const int64_t strips = ((g + 1) * tr + common - 1) / common - (g * tr + common - 1) / common;
      const int64_t maxr = std::min(tile_k, strips * n), r = ranks[size_t(g)];
      if (r < 1 || r > maxr)
        throw Error("TSVD: rank " + num(r) + " of group " + num(g) + " is out of range [1, " + num(maxr) + "]");
      ao[size_t(g + 1)] = ao[size_t(g)] + tile_k * r;
    }
  }
  for (int64_t i = 0; i < tr; ++i)
    for (int64_t j = 0; j < tc; ++j) {
      const int64_t t = i * tc + j, r = rank(i, j);
      if (!common) {
        const int64_t maxr = std::min(rows_of(i), cols_of(j));
        if (r < 1 || r > maxr)
          throw Error("TSVD: rank " + num(r) + " of tile (" + num(i) + ", " + num(j) + ") is out of range [1, " + num(maxr) + "]");
        ao[size_t(t + 1)] = ao[size_t(t)] + rows_of(i) * r;
      }
      bo[size_t(t + 1)] = bo[size_t(t)] + r * cols_of(j);
    }
}

void TsvdFactors::check() const {
  std::vector<int64_t> ao, bo;
  offsets(ao, bo);
  if (int64_t(a.size()) != ao.back() || int64_t(b.size()) != bo.back())
    throw Error("TSVD: the factor arrays hold " + num(int64_t(a.size())) + " + " + num(int64_t(b.size())) +
                " floats, the layout needs " + num(ao.back()) + " + " + num(bo.back()));
}

void TsvdFactors::layout(bool allocate) {
  offsets(a_offset_, b_offset_);
  if (allocate) {
    a.assign(size_t(a_floats()), 0.f);
    b.assign(size_t(b_floats()), 0.f);
  } else {
    check();
  }
}

bool TsvdFactors::uniform_rank() const {
  return std::all_of(ranks.begin(), ranks.end(), [&](int32_t r) { return r == ranks.front(); });
}

int32_t TsvdFactors::max_rank() const { return ranks.empty() ? 0 : *std::max_element(ranks.begin(), ranks.end()); }

std::string TsvdFactors::describe() const {
  char buf[256];
  const int32_t lo = ranks.empty() ? 0 : *std::min_element(ranks.begin(), ranks.end());
  std::string rk = uniform_rank() ? "rank " + num(lo) : "ranks " + num(lo) + ".." + num(max_rank());
  std::snprintf(buf, sizeof buf, "TSVD%s K=%lld N=%lld tile %lldx%lld (%lld x %lld tiles%s), %s, %lld floats stored, ratio %.3f",
                common ? "-common" : "", (long long)k, (long long)n, (long long)tile_k, (long long)tile_n, (long long)tile_rows(),
                (long long)tile_cols(), common ? (", " + num(common) + " shared A").c_str() : "", rk.c_str(),
                (long long)stored(), compression());
  return buf;
}

namespace {
// Row p of tile (i, j) of A_ij B_ij, in fp64, into row[0, tn).
void tile_row(const TsvdFactors& f, int64_t i, int64_t j, int64_t p, std::vector<double>& row) {
  const int64_t tn = f.cols_of(j), r = f.rank(i, j);
  const float *A = f.a_block(i, j) + p * r, *B = f.b_block(i, j);
  row.assign(static_cast<size_t>(tn), 0.0);
  for (int64_t q = 0; q < r; ++q) {
    const double a = A[q];
    for (int64_t c = 0; c < tn; ++c) row[size_t(c)] += a * B[q * tn + c];
  }
}
}  // namespace

std::vector<float> tsvd_reconstruct(const TsvdFactors& f) {
  std::vector<float> w(static_cast<size_t>(f.k * f.n));
  const int64_t tc = f.tile_cols();
  common::parallel_for(f.tile_rows() * tc, pool_threads(0), [&](int64_t t, int) {
    const int64_t i = t / tc, j = t % tc;
    std::vector<double> row;
    for (int64_t p = 0; p < f.rows_of(i); ++p) {
      tile_row(f, i, j, p, row);
      float* out = w.data() + (i * f.tile_k + p) * f.n + j * f.tile_n;
      for (size_t c = 0; c < row.size(); ++c) out[c] = float(row[c]);
    }
  });
  return w;
}

TsvdError tsvd_error(const float* w, const TsvdFactors& f) {
  const int64_t tr = f.tile_rows(), tc = f.tile_cols();
  std::vector<double> diff(static_cast<size_t>(tr * tc)), norm(size_t(tr * tc));
  common::parallel_for(tr * tc, pool_threads(0), [&](int64_t t, int) {
    const int64_t i = t / tc, j = t % tc;
    std::vector<double> row;
    double d = 0, s = 0;
    for (int64_t p = 0; p < f.rows_of(i); ++p) {
      tile_row(f, i, j, p, row);
      const float* wr = w + (i * f.tile_k + p) * f.n + j * f.tile_n;
      for (size_t c = 0; c < row.size(); ++c) {
        const double e = double(wr[c]) - row[c];
        d += e * e;
        s += double(wr[c]) * double(wr[c]);
      }
    }
    diff[size_t(t)] = d;
    norm[size_t(t)] = s;
  });
  TsvdError out;
  out.tile.resize(size_t(tr * tc));
  double d = 0, s = 0;
  for (size_t t = 0; t < diff.size(); ++t) {
    out.tile[t] = norm[t] > 0 ? std::sqrt(diff[t] / norm[t]) : std::sqrt(diff[t]);
    d += diff[t];
    s += norm[t];
  }
  out.total = s > 0 ? std::sqrt(d / s) : std::sqrt(d);
  return out;
}

// ---- the .tsvd file ----
namespace {

constexpr char kMagic[8] = {'S', 'P', 'T', 'S', 'V', 'D', 0, 0};
constexpr uint32_t kVersion = 1, kFlagCommon = 1, kDtypeF32 = 0;

struct Header {
  char magic[8];
  uint32_t version, flags, dtype, reserved;
  int64_t k, n, tile_k, tile_n, common;
};
static_assert(sizeof(Header) == 64, "the .tsvd header is 64 bytes");

}  // namespace

void tsvd_save(const TsvdFactors& f, const std::string& path) {
  f.check();  // refuse to write factors that would not read back
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kVersion;
  h.flags = f.common ? kFlagCommon : 0;
  h.dtype = kDtypeF32;
  h.k = f.k, h.n = f.n, h.tile_k = f.tile_k, h.tile_n = f.tile_n, h.common = f.common;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error("cannot write '" + path + "'");
  out.write(reinterpret_cast<const char*>(&h), sizeof h);
  out.write(reinterpret_cast<const char*>(f.ranks.data()), std::streamsize(f.ranks.size() * 4));
  out.write(reinterpret_cast<const char*>(f.a.data()), std::streamsize(f.a.size() * 4));
  out.write(reinterpret_cast<const char*>(f.b.data()), std::streamsize(f.b.size() * 4));
  if (!out.flush()) throw Error("writing '" + path + "' failed");
}

TsvdFactors tsvd_load(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw Error("cannot open '" + path + "'");
  const int64_t size = int64_t(in.tellg());
  in.seekg(0);
  const std::string where = "'" + path + "': ";
  Header h{};
  if (size < int64_t(sizeof h) || !in.read(reinterpret_cast<char*>(&h), sizeof h))
    throw Error(where + "too short for a .tsvd header (" + num(size) + " bytes, the header is 64)");
  if (std::memcmp(h.magic, kMagic, 8) != 0) throw Error(where + "not a .tsvd file (bad magic)");
  if (h.version != kVersion)
    throw Error(where + "version " + num(h.version) + " is not supported (this build reads version " + num(kVersion) + ")");
  if (h.flags & ~kFlagCommon) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "0x%x", h.flags);
    throw Error(where + "flags " + hex + " has unknown bits (bit 0, common, is the only one)");
  }
  if (h.dtype != kDtypeF32) throw Error(where + "dtype " + num(h.dtype) + " is not supported (0: float32)");
  if (h.reserved != 0) throw Error(where + "reserved field is " + num(h.reserved) + ", expected 0");
  if (bool(h.flags & kFlagCommon) != (h.common > 0))
    throw Error(where + "flags say " + (h.flags & kFlagCommon ? "TSVD-common" : "plain TSVD") + " but common = " + num(h.common));
  TsvdFactors f;
  f.k = h.k, f.n = h.n, f.tile_k = h.tile_k, f.tile_n = h.tile_n, f.common = h.common;
  try {
    f.check_shape();
  } catch (const Error& e) {
    throw Error(where + e.what());
  }
  const int64_t nranks = f.common ? f.common : f.tile_rows() * f.tile_cols();
  if (size < int64_t(sizeof h) + 4 * nranks)
    throw Error(where + "truncated: " + num(size) + " bytes, the header and " + num(nranks) + " ranks need " +
                num(int64_t(sizeof h) + 4 * nranks));
  f.ranks.resize(size_t(nranks));
  in.read(reinterpret_cast<char*>(f.ranks.data()), std::streamsize(4 * nranks));
  try {
    f.layout(true);
  } catch (const Error& e) {
    throw Error(where + e.what());
  }
  const int64_t need = int64_t(sizeof h) + 4 * (nranks + f.a_floats() + f.b_floats());
  if (size != need)
    throw Error(where + "file is " + num(size) + " bytes, the header says it holds " + num(need) + " (K, N, tiles and ranks)");
  in.read(reinterpret_cast<char*>(f.a.data()), std::streamsize(4 * f.a_floats()));
  in.read(reinterpret_cast<char*>(f.b.data()), std::streamsize(4 * f.b_floats()));
  if (!in) throw Error(where + "read failed");
  for (float v : f.a)
    if (!std::isfinite(v)) throw Error(where + "an A factor holds a non-finite value");
  for (float v : f.b)
    if (!std::isfinite(v)) throw Error(where + "a B factor holds a non-finite value");
  return f;
}

}  // namespace spattn
