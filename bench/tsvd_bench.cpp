// `spattn tsvd bench`: Y = X W on the GPU three ways, timed in one process on the same X: cuBLAS GEMM on the
// uncompressed W; SVD-matmul, two cuBLAS GEMMs P = X U, Y = P V at the same compression ratio (global rank
// r_g = floor(K N / (R (K + N)))); and the TSVD kernels (auto, and each kernel that applies), per tile size.
//
//   spattn tsvd bench [--shapes M:K:N,...] [--ratios 2,4,8] [--tiles 128,256] [--dtype bf16|fp16] [--reps 50]
//                     [--kernels auto,tile,streamk,gemv,gemv_bulk,wgmma] [--json FILE]
//
// Every kernel of --kernels that applies (gemv, gemv_bulk: M = 1 only; wgmma: M > 1; gemv_bulk, wgmma: sm_90a) is
// timed on the same factors;
// the row reports the fastest, and each kernel's time and what ran ("auto" names the kernel it chose).
//
// Default shapes: the issue's (GPT-3 175B at 2048 tokens and at 1, GPT-2 medium attention 1024 -> 1024 and
// feed-forward 1024 -> 4096 at 512 tokens and at 1). Timing: 5 warm-up calls, then `reps` calls each between two
// CUDA events, the median reported; the factors are random (timing does not depend on their values), and every
// operand stays where the previous call left it (warm L2, as for every row alike). Outputs: one line per row
// and, with --json, {"machine": ..., "rows": [...]}.
#include "bench/bench.hpp"
#include "spattn/config.hpp"
#include "spattn/error.hpp"

#if !SPATTN_HAVE_CUDA
namespace spattn::bench {
int tsvd_bench_main(int, char**) {
  throw Error("spattn tsvd bench runs on the GPU: this build has no CUDA support (rebuild with SPATTN_CUDA=ON)");
}
}  // namespace spattn::bench
#else
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <vector>

#include "common/args.hpp"
#include "spattn/tsvd.hpp"

namespace spattn::bench {
using common::Args;
namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("tsvd bench: ") + what + ": " + cudaGetErrorString(e));
}
void cb(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(std::string("tsvd bench: cuBLAS ") + what + " failed (status " + std::to_string(int(s)) + ")");
}

struct Buf {
  void* p = nullptr;
  explicit Buf(size_t bytes) { ck(cudaMalloc(&p, std::max<size_t>(bytes, 16)), "cudaMalloc"); }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
};

// Random 16-bit values N(0, scale^2) on the device.
void fill(void* d, size_t n, float scale, DType t, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<uint16_t> h(n);
  for (auto& v : h) v = t == DType::bf16 ? float_to_bf16(scale * nd(rng)) : float_to_half(scale * nd(rng));
  ck(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice), "upload");
}

template <class F>
double median_ms(F&& f, int reps, cudaStream_t s) {
  for (int i = 0; i < 5; ++i) f();
  cudaEvent_t a, b;
  ck(cudaEventCreate(&a), "event");
  ck(cudaEventCreate(&b), "event");
  std::vector<float> ms(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    ck(cudaEventRecord(a, s), "record");
    f();
    ck(cudaEventRecord(b, s), "record");
    ck(cudaEventSynchronize(b), "sync");
    ck(cudaEventElapsedTime(&ms[size_t(i)], a, b), "elapsed");
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Row-major C (m x n) = A (m x k) B (k x n), 16-bit in and out, fp32 accumulation: column-major C^T = B^T A^T.
void gemm(cublasHandle_t h, int m, int n, int k, const void* a, const void* b, void* c, cudaDataType t) {
  const float one = 1.f, zero = 0.f;
  cb(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, b, t, n, a, t, k, &zero, c, t, n, CUBLAS_COMPUTE_32F,
                  CUBLAS_GEMM_DEFAULT),
     "GemmEx");
}

std::vector<int64_t> int_list(const std::string& s, const char* what) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    try {
      out.push_back(std::stoll(item));
    } catch (...) {
      throw Error(std::string("--") + what + ": '" + item + "' is not an integer");
    }
  }
  return out;
}

struct Shape {
  int64_t m, k, n;
};

}  // namespace

int tsvd_bench_main(int argc, char** argv) {
  Args a(argc, argv, 3, {"shapes", "ratios", "tiles", "dtype", "reps", "kernels", "json"}, {});
  std::vector<Shape> shapes;
  for (const std::string& s : [&] {
         std::vector<std::string> v;
         std::stringstream ss(a.str("shapes", "2048:12288:12288,1:12288:12288,512:1024:1024,1:1024:1024,512:1024:4096,1:1024:4096"));
         for (std::string item; std::getline(ss, item, ',');) v.push_back(item);
         return v;
       }()) {
    Shape sh{};
    if (std::sscanf(s.c_str(), "%ld:%ld:%ld", &sh.m, &sh.k, &sh.n) != 3 || sh.m < 1 || sh.k < 1 || sh.n < 1)
      throw Error("--shapes: '" + s + "' is not M:K:N with positive sizes");
    shapes.push_back(sh);
  }
  const std::vector<int64_t> ratios = int_list(a.str("ratios", "2,4,8"), "ratios"), tiles = int_list(a.str("tiles", "128,256"), "tiles");
  const DType t = parse_dtype(a.str("dtype", "bf16"));
  if (t != DType::bf16 && t != DType::f16) throw Error("--dtype must be bf16 or fp16");
  const cudaDataType ct = t == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
  const int reps = int(a.integer("reps", 50));
  std::vector<std::string> kernel_names;
  {
    std::stringstream ss(a.str("kernels", "auto,tile,streamk,gemv,gemv_bulk,wgmma"));
    for (std::string item; std::getline(ss, item, ',');) kernel_names.push_back(item);
  }
  if (reps < 5) throw Error("--reps must be at least 5");
  cudaDeviceProp prop{};
  ck(cudaGetDeviceProperties(&prop, 0), "device properties");
  cudaStream_t stream;
  ck(cudaStreamCreate(&stream), "stream");
  cublasHandle_t h;
  cb(cublasCreate(&h), "create");
  cb(cublasSetStream(h, stream), "set stream");
  std::printf("spattn tsvd bench: %s, %s, median of %d (ms); speedups of the best TSVD kernel\n", prop.name,
              std::string(dtype_name(t)).c_str(), reps);
  std::printf("%6s %6s %6s %3s | %9s | %5s %9s | %5s %4s %9s %-12s | %6s %6s | %s\n", "M", "K", "N", "R", "dense", "r_svd", "svd", "tile",
              "r", "tsvd", "kernel", "x svd", "x dense", "other TSVD kernels");
  std::ostringstream rows;
  bool first_row = true;
  for (const Shape& sh : shapes) {
    Buf x(size_t(sh.m * sh.k) * 2), y(size_t(sh.m * sh.n) * 2), w(size_t(sh.k * sh.n) * 2);
    fill(x.p, size_t(sh.m * sh.k), 1.f, t, 1);
    fill(w.p, size_t(sh.k * sh.n), 1.f / std::sqrt(float(sh.k)), t, 2);
    const double dense = median_ms([&] { gemm(h, int(sh.m), int(sh.n), int(sh.k), x.p, w.p, y.p, ct); }, reps, stream);
    for (int64_t R : ratios) {
      const int64_t rg = std::max<int64_t>(1, sh.k * sh.n / (R * (sh.k + sh.n)));
      double svd = 0;
      {
        Buf u(size_t(sh.k * rg) * 2), v(size_t(rg * sh.n) * 2), p(size_t(sh.m * rg) * 2);
        fill(u.p, size_t(sh.k * rg), 1.f / std::sqrt(float(sh.k)), t, 3);
        fill(v.p, size_t(rg * sh.n), 1.f / std::sqrt(float(rg)), t, 4);
        svd = median_ms(
            [&] {
              gemm(h, int(sh.m), int(rg), int(sh.k), x.p, u.p, p.p, ct);
              gemm(h, int(sh.m), int(sh.n), int(rg), p.p, v.p, y.p, ct);
            },
            reps, stream);
      }
      for (int64_t tile : tiles) {
        if (sh.k % tile || sh.n % tile) continue;
        const int64_t r = tsvd_rank_for_ratio(tile, tile, double(R));
        // Random factors of the right shapes (the kernels' time does not depend on the values).
        TsvdFactors f;
        f.k = sh.k, f.n = sh.n, f.tile_k = f.tile_n = tile;
        f.ranks.assign(size_t(f.tile_rows() * f.tile_cols()), int32_t(r));
        f.layout(true);
        std::mt19937_64 rng(uint64_t(R * 1000 + tile));
        std::uniform_real_distribution<float> ud(-0.1f, 0.1f);
        for (float& v : f.a) v = ud(rng);
        for (float& v : f.b) v = ud(rng);
        std::unique_ptr<TsvdGpu> g;
        try {
          g = std::make_unique<TsvdGpu>(f, t);
        } catch (const Error& e) {
          std::fprintf(stderr, "tsvd bench: skipped tile %ld at %ld:%ld:%ld R=%ld: %s\n", tile, sh.m, sh.k, sh.n, R, e.what());
          continue;
        }
        struct K {
          std::string name;
          double ms;
          std::string ran;
        };
        std::vector<K> ks;
        for (const std::string& kn : kernel_names) {
          if ((kn.rfind("gemv", 0) == 0 && sh.m != 1) || (kn == "wgmma" && sh.m == 1)) continue;
          try {
            const double ms = median_ms([&] { g->matmul(x.p, sh.m, y.p, stream, kn); }, reps, stream);
            ks.push_back({kn, ms, g->last_kernel()});
          } catch (const Error& e) {
            std::fprintf(stderr, "tsvd bench: %s at %ld:%ld:%ld tile %ld: %s\n", kn.c_str(), sh.m, sh.k, sh.n, tile, e.what());
          }
        }
        if (ks.empty()) continue;
        // "auto" shows the kernel it chose: auto:wgmma.
        auto label = [](const K& k2) { return k2.name == "auto" ? "auto:" + k2.ran.substr(0, k2.ran.find(' ')) : k2.name; };
        const K best = *std::min_element(ks.begin(), ks.end(), [](const K& p, const K& q) { return p.ms < q.ms; });
        // Bytes of the factors as the kernels read them (rank padded to 16).
        const double factor_bytes = double(f.tile_rows() * f.tile_cols()) * double((r + 15) / 16 * 16) * double(2 * tile) * 2;
        std::string others;
        for (const K& k2 : ks) {
          char b[96];
          std::snprintf(b, sizeof b, "%s%s %.4f", others.empty() ? "" : ", ", label(k2).c_str(), k2.ms);
          others += b;
        }
        std::printf("%6ld %6ld %6ld %3ld | %9.4f | %5ld %9.4f | %5ld %4ld %9.4f %-12s | %6.2f %6.2f | %s\n", sh.m, sh.k, sh.n, R, dense, rg,
                    svd, tile, r, best.ms, label(best).c_str(), svd / best.ms, dense / best.ms, others.c_str());
        std::fflush(stdout);
        rows << (first_row ? "" : ",\n") << "  {\"M\": " << sh.m << ", \"K\": " << sh.k << ", \"N\": " << sh.n << ", \"ratio\": " << R
             << ", \"dense_ms\": " << dense << ", \"svd_rank\": " << rg << ", \"svd_ms\": " << svd << ", \"tile\": " << tile
             << ", \"tsvd_rank\": " << r << ", \"tsvd_ms\": " << best.ms << ", \"tsvd_kernel\": \"" << best.ran
             << "\", \"speedup_vs_svd\": " << svd / best.ms << ", \"speedup_vs_dense\": " << dense / best.ms
             << ", \"factor_gbps\": " << factor_bytes / (best.ms * 1e6) << ", \"kernels\": {";
        for (size_t i = 0; i < ks.size(); ++i) rows << (i ? ", " : "") << "\"" << ks[i].name << "\": " << ks[i].ms;
        rows << "}, \"kernels_ran\": {";
        for (size_t i = 0; i < ks.size(); ++i) rows << (i ? ", " : "") << "\"" << ks[i].name << "\": \"" << ks[i].ran << "\"";
        rows << "}}";
        first_row = false;
      }
    }
  }
  cublasDestroy(h);
  cudaStreamDestroy(stream);
  if (a.has("json")) {
    std::ofstream out(a.str("json"));
    if (!out) throw Error("cannot write --json file '" + a.str("json") + "'");
    out << "{\"kind\": \"tsvd\", \"machine\": {\"gpu\": \"" << prop.name << "\", \"sms\": " << prop.multiProcessorCount << "}, \"dtype\": \""
        << dtype_name(t) << "\", \"reps\": " << reps << ", \"timing\": \"median of CUDA-event times, warm L2\",\n\"rows\": [\n"
        << rows.str() << "\n]}\n";
    std::fprintf(stderr, "wrote %s\n", a.str("json").c_str());
  }
  return 0;
}

}  // namespace spattn::bench
#endif
