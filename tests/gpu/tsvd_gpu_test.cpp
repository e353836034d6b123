// The GPU TSVD matmul kernels (tensor-core per tile, stream-K, M = 1 gemv) against the CPU TSVD matmul on the
// same factors rounded to the GPU's dtype, and cuSOLVER compression against the CPU's. GPU tests skip themselves,
// with the reason, where no GPU is usable. Each case names the failure it guards against.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "spattn/config.hpp"
#include "spattn/device.hpp"
#include "spattn/tsvd.hpp"

using spattn::DType;
using spattn::TsvdFactors;

namespace {

// The library's own list of GPUs says why there is none.
#define REQUIRE_GPU()                                         \
  do {                                                        \
    std::string why;                                          \
    if (spattn::list_gpus(&why).empty()) GTEST_SKIP() << why; \
  } while (0)

bool sm90a() {
  cudaDeviceProp prop{};
  return cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major == 9 && prop.minor == 0;
}

float round16(float v, DType t) { return t == DType::bf16 ? spattn::bf16_to_float(spattn::float_to_bf16(v)) : spattn::half_to_float(spattn::float_to_half(v)); }

// Random factors with one rank, already rounded to `t` (so the CPU reference sees what the GPU sees).
TsvdFactors random_factors(int64_t k, int64_t n, int64_t tile_k, int64_t tile_n, int rank, DType t, uint64_t seed) {
  TsvdFactors f;
  f.k = k, f.n = n, f.tile_k = tile_k, f.tile_n = tile_n;
  f.ranks.assign(size_t(f.tile_rows() * f.tile_cols()), rank);
  f.layout(true);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  const float sa = 1.f / std::sqrt(float(tile_k)), sb = 1.f / std::sqrt(float(rank));
  for (float& v : f.a) v = round16(sa * nd(rng), t);
  for (float& v : f.b) v = round16(sb * nd(rng), t);
  return f;
}

struct Case {
  const char* what;
  int64_t m, k, n, tile_k, tile_n;
  int rank;
  const char* kernel;
  DType dtype;
};

// Y on the GPU for x (rounded to the dtype), widened to float.
std::vector<float> run_gpu(const TsvdFactors& f, const std::vector<float>& x, int64_t m, DType t, const std::string& kernel,
                           std::string* ran, int launches = 1) {
  spattn::TsvdGpu g(f, t);
  std::vector<uint16_t> hx(x.size()), hy(size_t(m * f.n));
  for (size_t i = 0; i < x.size(); ++i) hx[i] = t == DType::bf16 ? spattn::float_to_bf16(x[i]) : spattn::float_to_half(x[i]);
  void *dx = nullptr, *dy = nullptr;
  EXPECT_EQ(cudaMalloc(&dx, hx.size() * 2), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&dy, hy.size() * 2), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(dx, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<float> first;
  for (int l = 0; l < launches; ++l) {
    EXPECT_EQ(cudaMemset(dy, 0xff, hy.size() * 2), cudaSuccess);  // NaN: a row or column never written shows
    g.matmul(dx, m, dy, nullptr, kernel);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(hy.data(), dy, hy.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<float> y(hy.size());
    for (size_t i = 0; i < y.size(); ++i) y[i] = t == DType::bf16 ? spattn::bf16_to_float(hy[i]) : spattn::half_to_float(hy[i]);
    if (l == 0) first = y;
    else EXPECT_EQ(y, first) << "launch " << l << " differs: the fixup is not deterministic or its counters were not reset";
  }
  *ran = g.last_kernel();
  cudaFree(dx);
  cudaFree(dy);
  return first;
}

// The cheapest case of each kernel, one test per kernel, defined first so that they run first: a kernel that breaks
// shows by its own name before the larger cases run. scripts/gpu_check.d/tsvd.sh runs every test in its own process
// (a kernel's illegal address poisons its process's CUDA context, not the next test's) and these under
// compute-sanitizer one at a time. Each at M = 1 and 70 (the gemv kernel at M = 1 only; wgmma on sm_90a: one ragged
// 128-row tile, its tile rows split over CTAs), rank 16 (the smallest padded rank), and asserts which kernel ran.
void small_case(const char* kernel) {
  const TsvdFactors f = random_factors(256, 256, 128, 128, 16, DType::bf16, 3);
  for (int64_t m : {int64_t(1), int64_t(70)}) {
    if (m != 1 && std::string(kernel).rfind("gemv", 0) == 0) continue;
    std::vector<float> x(size_t(m * 256), 0.5f), ref(size_t(m * 256));
    spattn::tsvd_matmul(f, x.data(), m, ref.data());
    std::string ran;
    const auto y = run_gpu(f, x, m, DType::bf16, kernel, &ran);
    ASSERT_EQ(ran.rfind(kernel, 0), 0u) << "asked for " << kernel << ", ran " << ran;
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_NEAR(y[i], ref[i], 2e-2 * (1 + std::abs(ref[i]))) << kernel << " M=" << m << " at " << i << " (" << ran << ")";
  }
}

TEST(TsvdGpuSmall, Tile) {
  REQUIRE_GPU();
  small_case("tile");
}
TEST(TsvdGpuSmall, StreamK) {
  REQUIRE_GPU();
  small_case("streamk");
}
TEST(TsvdGpuSmall, Gemv) {
  REQUIRE_GPU();
  small_case("gemv");
}
TEST(TsvdGpuSmall, GemvBulk) {
  REQUIRE_GPU();
  if (!sm90a()) GTEST_SKIP() << "the bulk-copy gemv kernel needs an sm_90a GPU (compute capability 9.0)";
  small_case("gemv_bulk");
}
TEST(TsvdGpuSmall, Wgmma) {
  REQUIRE_GPU();
  if (!sm90a()) GTEST_SKIP() << "the wgmma kernel needs an sm_90a GPU (compute capability 9.0)";
  small_case("wgmma");
}

// Each padded rank of the tensor-core kernels (16, 32, 64, 128: one instantiation each, each its own shared-memory
// layout) once, small, before the larger cases.
TEST(TsvdGpuSmall, EveryPaddedRank) {
  REQUIRE_GPU();
  for (const char* kernel : {"tile", "wgmma"}) {
    if (std::string(kernel) == "wgmma" && !sm90a()) continue;
    for (int rank : {16, 20, 64, 128}) {
      const TsvdFactors f = random_factors(256, 256, 128, 128, rank, DType::bf16, uint64_t(rank));
      const int64_t m = 70;
      std::vector<float> x(size_t(m * 256)), ref(size_t(m * 256));
      for (size_t i = 0; i < x.size(); ++i) x[i] = round16(float(int(i % 7) - 3) / 4.f, DType::bf16);
      spattn::tsvd_matmul(f, x.data(), m, ref.data());
      std::string ran;
      const auto y = run_gpu(f, x, m, DType::bf16, kernel, &ran);
      ASSERT_EQ(ran.rfind(kernel, 0), 0u) << "asked for " << kernel << ", ran " << ran;
      double d = 0, s = 0;
      for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_TRUE(std::isfinite(y[i])) << kernel << " rank " << rank << ": Y[" << i << "] not written (" << ran << ")";
        d += (double(y[i]) - ref[i]) * (double(y[i]) - ref[i]);
        s += double(ref[i]) * ref[i];
      }
      EXPECT_LT(std::sqrt(d / s), 1.2e-2) << kernel << " rank " << rank << " (" << ran << ")";
    }
  }
}

class TsvdGpuSuite : public ::testing::TestWithParam<Case> {};

TEST_P(TsvdGpuSuite, MatchesCpuTsvdMatmul) {
  REQUIRE_GPU();
  const Case c = GetParam();
  if (std::string(c.kernel) == "wgmma" && !sm90a()) GTEST_SKIP() << "the wgmma kernel needs an sm_90a GPU (compute capability 9.0)";
  const TsvdFactors f = random_factors(c.k, c.n, c.tile_k, c.tile_n, c.rank, c.dtype, uint64_t(c.m * 7 + c.rank));
  std::mt19937_64 rng(uint64_t(c.k));
  std::normal_distribution<float> nd;
  std::vector<float> x(size_t(c.m * c.k));
  for (float& v : x) v = round16(nd(rng), c.dtype);
  std::vector<float> ref(size_t(c.m * c.n));
  spattn::tsvd_matmul(f, x.data(), c.m, ref.data());
  std::string ran;
  const std::vector<float> y = run_gpu(f, x, c.m, c.dtype, c.kernel, &ran, 2);
  // P = X_i A_ij is rounded to 16 bits before the second product, Y once at the end: errors of a few 2^-8.
  double d = 0, s = 0, worst = 0, scale = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    ASSERT_TRUE(std::isfinite(y[i])) << "Y[" << i / size_t(c.n) << ", " << i % size_t(c.n) << "] not written (" << ran << ")";
    d += (double(y[i]) - ref[i]) * (double(y[i]) - ref[i]);
    s += double(ref[i]) * ref[i];
    worst = std::max(worst, std::abs(double(y[i]) - ref[i]));
    scale = std::max(scale, std::abs(double(ref[i])));
  }
  const double tol = c.dtype == DType::bf16 ? 1.2e-2 : 2e-3;
  EXPECT_LT(std::sqrt(d / s), tol) << c.what << " (" << ran << ")";
  EXPECT_LT(worst / scale, 4 * tol) << c.what << " (" << ran << ")";
  if (std::string(c.kernel) != "auto") EXPECT_EQ(ran.rfind(c.kernel, 0), 0u) << "asked for " << c.kernel << ", ran " << ran;
}

INSTANTIATE_TEST_SUITE_P(
    Tsvd, TsvdGpuSuite,
    ::testing::Values(
        Case{"one tile per CTA, M a multiple of 64", 128, 256, 256, 128, 128, 32, "tile", DType::bf16},
        Case{"M not a multiple of 64 (row guard), tile 256 (two CTA columns per tile)", 70, 512, 512, 256, 256, 64, "tile", DType::bf16},
        Case{"stream-K: tiles split across CTAs, fixup", 70, 1024, 256, 256, 128, 64, "streamk", DType::bf16},
        Case{"stream-K, CTA ranges across tile boundaries (more iterations than CTAs)", 500, 512, 1024, 64, 128, 16, "streamk", DType::bf16},
        Case{"rank 20 padded to 32 with zeros", 64, 256, 256, 128, 128, 20, "tile", DType::bf16},
        Case{"rank 128 (the largest tensor-core rank)", 64, 512, 256, 256, 128, 128, "streamk", DType::f16},
        Case{"fp16, stream-K", 33, 512, 256, 128, 128, 32, "streamk", DType::f16},
        Case{"M = 1 through the tensor-core kernel", 1, 512, 256, 128, 128, 16, "tile", DType::bf16},
        Case{"M = 1 gemv, tile 256, splits with fixup", 1, 2048, 1024, 256, 256, 64, "gemv", DType::bf16},
        Case{"M = 1 gemv, tile 64 and rank 4 padded to 16", 1, 1024, 512, 64, 64, 4, "gemv", DType::bf16},
        Case{"M = 1 gemv, non-square tile, rank 48 (vectors a row do not divide the threads)", 1, 768, 1024, 128, 512, 48, "gemv", DType::f16},
        Case{"M = 1 gemv_bulk, tile 256 rank 32 (3 stages), splits with fixup", 1, 2048, 1024, 256, 256, 32, "gemv_bulk", DType::bf16},
        Case{"M = 1 gemv_bulk, tile 64 and rank 4 padded to 16, 264 tile columns of 64 tile rows (one split on 132 SMs: the ring of 8 wraps)", 1, 4096, 16896, 64, 64, 4, "gemv_bulk", DType::bf16},
        Case{"M = 1 gemv_bulk, 660 tile columns of 4 tile rows (more columns than CTAs resident: one split, several waves), fp16", 1, 256, 42240, 64, 64, 16, "gemv_bulk", DType::f16},
        Case{"M = 1 gemv_bulk, non-square tile 128 x 192, rank 48 (vectors a row do not divide the threads)", 1, 1024, 768, 128, 192, 48, "gemv_bulk", DType::f16},
        Case{"M = 1 auto, a tile row too large for the bulk ring: the plain gemv", 1, 2048, 2048, 2048, 1024, 64, "auto", DType::bf16},
        Case{"wgmma: M = 70 (one ragged 128-row tile, TMA zero-fill), rank 64 (ratio 2 at tile 256), BN 256, split fixup", 70, 512, 512, 256, 256, 64, "wgmma", DType::bf16},
        Case{"wgmma: M = 300 (ragged), tile 128, rank 16 (ratio 4 at tile 128), BN 128, fp16", 300, 1024, 512, 128, 128, 16, "wgmma", DType::f16},
        Case{"wgmma: M = 129 (one row in the second tile), tile 256, rank 32 (ratio 4), 3 tile rows", 129, 768, 512, 256, 256, 32, "wgmma", DType::bf16},
        Case{"wgmma: rank 12 padded to 16 (ratio 8 at tile 256 is 16), fp16", 200, 512, 512, 256, 256, 12, "wgmma", DType::f16},
        Case{"wgmma: rank 128 (BN 128 for registers), non-square tile 256 x 128", 150, 512, 512, 256, 128, 128, "wgmma", DType::bf16},
        Case{"wgmma: tile_n 512 (two 256-wide CTA columns a tile, B at a column offset)", 200, 512, 1024, 256, 512, 32, "wgmma", DType::bf16},
        Case{"wgmma: tile_k 64 (one K-chunk a tile row), rank 20 padded to 32", 260, 512, 256, 64, 128, 20, "wgmma", DType::bf16},
        Case{"wgmma: 144 tiles >= SMs (no split), M = 1100", 1100, 512, 4096, 256, 256, 32, "wgmma", DType::bf16},
        Case{"auto at M = 512", 512, 1024, 1024, 128, 128, 32, "auto", DType::bf16},
        Case{"auto at M = 1", 1, 1024, 1024, 128, 128, 32, "auto", DType::bf16}),
    // Names that say the case: kernel_M_KxN_tile_rank_dtype (ctest lists them without the parameter's bytes).
    [](const ::testing::TestParamInfo<Case>& i) {
      const Case& c = i.param;
      return std::string(c.kernel) + "_M" + std::to_string(c.m) + "_" + std::to_string(c.k) + "x" + std::to_string(c.n) +
             "_tile" + std::to_string(c.tile_k) + "x" + std::to_string(c.tile_n) + "_r" + std::to_string(c.rank) + "_" +
             (c.dtype == DType::bf16 ? "bf16" : "fp16");
    });

TEST(TsvdGpu, RefusesFactorsItCannotRun) {
  REQUIRE_GPU();
  auto msg = [](const TsvdFactors& f) -> std::string {
    try {
      spattn::TsvdGpu g(f, DType::bf16);
    } catch (const spattn::Error& e) {
      return e.what();
    }
    return "accepted";
  };
  TsvdFactors ragged = random_factors(100, 256, 64, 128, 8, DType::bf16, 1);
  EXPECT_NE(msg(ragged).find("K % tile_k"), std::string::npos) << msg(ragged);
  TsvdFactors mixed = random_factors(128, 128, 64, 64, 8, DType::bf16, 1);
  mixed.ranks[1] = 4;
  mixed.layout(true);
  EXPECT_NE(msg(mixed).find("one rank"), std::string::npos) << msg(mixed);
  // The tensor-core kernel needs tile_n % 128: a 64 x 64 tile runs M = 1 only, and says so for M > 1.
  const TsvdFactors small = random_factors(128, 128, 64, 64, 8, DType::bf16, 1);
  spattn::TsvdGpu g(small, DType::bf16);
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 1 << 16), cudaSuccess);
  try {
    g.matmul(d, 4, d, nullptr, "auto");
    ADD_FAILURE() << "tile 64x64 accepted for M = 4";
  } catch (const spattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tile_n % 128"), std::string::npos) << e.what();
  }
  EXPECT_THROW(g.matmul(d, 4, d, nullptr, "gemv"), spattn::Error);
  EXPECT_THROW(g.matmul(d, 4, d, nullptr, "gemv_bulk"), spattn::Error);
  EXPECT_THROW(g.matmul(d, 4, d, nullptr, "wgmma"), spattn::Error);  // tile_k % 64, tile_n % 128
  EXPECT_THROW(g.matmul(d, 1, d, nullptr, "fast"), spattn::Error);
  cudaFree(d);
}

// cuSOLVER compression (gesvdjBatched for 32 x 32, gesvdaStridedBatched above; wide tiles transposed) against
// LAPACK's: the same truncation, so the same error to single-precision rounding.
TEST(TsvdGpu, CusolverCompressionMatchesCpu) {
  REQUIRE_GPU();
  if (!SPATTN_HAVE_LAPACK) GTEST_SKIP() << "this build has no LAPACK: no CPU compression to compare with";
  const int64_t K = 256, N = 384;
  std::mt19937_64 rng(9);
  std::normal_distribution<float> nd;
  std::vector<float> w(size_t(K * N));
  std::vector<float> u(static_cast<size_t>(K)), v(static_cast<size_t>(N));
  for (int term = 0; term < 40; ++term) {
    for (float& x : u) x = nd(rng);
    for (float& x : v) x = nd(rng);
    const float s = std::pow(0.85f, float(term));
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < N; ++j) w[size_t(i * N + j)] += s * u[size_t(i)] * v[size_t(j)];
  }
  struct T {
    int64_t tk, tn;
  };
  for (const T t : {T{32, 32}, T{128, 64}, T{64, 128}}) {
    spattn::TsvdOptions o;
    o.tile_k = t.tk, o.tile_n = t.tn, o.ratio = 4;
    const TsvdFactors cpu = spattn::tsvd_compress(w.data(), K, N, o);
    const TsvdFactors gpu = spattn::tsvd_compress_gpu(w.data(), K, N, o);
    EXPECT_EQ(gpu.ranks, cpu.ranks);
    const double ec = spattn::tsvd_error(w.data(), cpu).total, eg = spattn::tsvd_error(w.data(), gpu).total;
    EXPECT_NEAR(eg, ec, 2e-3 * ec + 1e-5) << "tile " << t.tk << "x" << t.tn;
  }
}

}  // namespace
