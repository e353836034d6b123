// `spattn tsvd`: compress a weight matrix into TSVD factors, multiply through them, report the error, bench.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "spattn/config.hpp"
#include "spattn/tsvd.hpp"
#include "bench/bench.hpp"
#include "common/args.hpp"
#include "tools/commands.hpp"
#include "tools/npy.hpp"

#if SPATTN_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace spattn::tools {
using common::Args;
namespace {

const char* kTsvdUsage =
    "usage: spattn tsvd <command> [options]\n"
    "  compress  --in W.npy (--tile T | --tile-k A --tile-n B) (--ratio R | --rank r | --error E) --out F.tsvd\n"
    "            [--common G] [--device cpu|cuda] [--threads N]\n"
    "            W is K x N float32; R: stored floats = K N / R (r = floor(tK tN / (R (tK + tN)))); E: total relative\n"
    "            Frobenius error target (ranks per tile); G: TSVD-common with G shared A factors (groups of tile rows)\n"
    "  matmul    --x X.npy --factors F.tsvd --out Y.npy [--device cpu|cuda] [--dtype bf16|fp16]\n"
    "            [--kernel auto|tile|streamk|gemv|gemv_bulk|wgmma] [--threads N]      X is M x K; Y = X * TSVD(W), float32\n"
    "  error     --in W.npy --factors F.tsvd [--per-tile]   per-tile and total relative Frobenius error\n"
    "  info      --factors F.tsvd\n"
    "  bench     [--shapes M:K:N,...] [--ratios 2,4,8] [--tiles 128,256] [--dtype bf16|fp16] [--reps 50] [--json FILE]\n"
    "            the GPU: cuBLAS GEMM on W, SVD-matmul (two cuBLAS GEMMs) at the same ratio, and the TSVD kernels\n";

std::string require(const Args& a, const std::string& name) {
  if (!a.has(name)) throw Error("missing --" + name);
  return a.str(name);
}

// A 2-D float32 (or float16, widened) .npy as floats; `what` names it in errors.
std::vector<float> read_matrix(const std::string& path, const char* what, int64_t* rows, int64_t* cols) {
  const NpyArray arr = read_npy(path);
  if (arr.shape.size() != 2)
    throw Error(std::string(what) + " '" + path + "' has shape " + shape_str(arr.shape) + ", expected 2 dimensions");
  *rows = arr.shape[0];
  *cols = arr.shape[1];
  std::vector<float> out(arr.bytes.size() / (arr.dtype == DType::f32 ? 4 : 2));  // the reader checked it against the shape
  if (arr.dtype == DType::f32) {
    std::memcpy(out.data(), arr.bytes.data(), out.size() * 4);
  } else {
    const auto* h = reinterpret_cast<const uint16_t*>(arr.bytes.data());
    for (size_t i = 0; i < out.size(); ++i) out[i] = half_to_float(h[i]);
  }
  return out;
}

void tiles_from(const Args& a, TsvdOptions& o) {
  if (a.has("tile") && (a.has("tile-k") || a.has("tile-n"))) throw Error("give either --tile or --tile-k/--tile-n");
  o.tile_k = a.integer("tile-k", a.integer("tile", 256));
  o.tile_n = a.integer("tile-n", a.integer("tile", 256));
}

int cmd_compress(int argc, char** argv) {
  Args a(argc, argv, 3, {"in", "out", "tile", "tile-k", "tile-n", "ratio", "rank", "error", "common", "device", "threads"}, {});
  int64_t k = 0, n = 0;
  const std::vector<float> w = read_matrix(require(a, "in"), "--in", &k, &n);
  const std::string out = require(a, "out");
  TsvdOptions o;
  tiles_from(a, o);
  o.ratio = a.real("ratio", 0);
  o.rank = a.integer("rank", 0);
  o.error = a.real("error", 0);
  o.common = a.integer("common", 0);
  o.threads = int(a.integer("threads", 0));
  if (!a.has("ratio") && !a.has("rank") && !a.has("error")) throw Error("give one of --ratio, --rank and --error");
  const std::string device = a.str("device", "cpu");
  if (device != "cpu" && device != "cuda") throw Error("--device must be cpu or cuda, got '" + device + "'");
  const auto t0 = std::chrono::steady_clock::now();
  const TsvdFactors f = device == "cuda" ? tsvd_compress_gpu(w.data(), k, n, o) : tsvd_compress(w.data(), k, n, o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  tsvd_save(f, out);
  std::fprintf(stderr, "%s\ncompressed on the %s in %.3f s; wrote %s\n", f.describe().c_str(), device.c_str(), s, out.c_str());
  return 0;
}

#if SPATTN_HAVE_CUDA
void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}
// Y = X TSVD(W) on GPU 0: X rounded to `dtype` on the host, Y read back and widened.
std::string matmul_cuda(const TsvdFactors& f, const std::vector<float>& x, int64_t m, std::vector<float>& y, DType dtype,
                        const std::string& kernel) {
  TsvdGpu g(f, dtype);
  std::vector<uint16_t> hx(x.size()), hy(size_t(m * f.n));
  for (size_t i = 0; i < x.size(); ++i) hx[i] = dtype == DType::bf16 ? float_to_bf16(x[i]) : float_to_half(x[i]);
  void *dx = nullptr, *dy = nullptr;
  ck(cudaMalloc(&dx, std::max<size_t>(2, hx.size() * 2)), "cudaMalloc");
  ck(cudaMalloc(&dy, std::max<size_t>(2, hy.size() * 2)), "cudaMalloc");
  ck(cudaMemcpy(dx, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice), "upload X");
  g.matmul(dx, m, dy, nullptr, kernel);
  ck(cudaMemcpy(hy.data(), dy, hy.size() * 2, cudaMemcpyDeviceToHost), "download Y");
  cudaFree(dx);
  cudaFree(dy);
  for (size_t i = 0; i < hy.size(); ++i) y[i] = dtype == DType::bf16 ? bf16_to_float(hy[i]) : half_to_float(hy[i]);
  return g.last_kernel();
}
#endif

int cmd_matmul(int argc, char** argv) {
  Args a(argc, argv, 3, {"x", "factors", "out", "device", "dtype", "kernel", "threads"}, {});
  const TsvdFactors f = tsvd_load(require(a, "factors"));
  int64_t m = 0, kx = 0;
  const std::vector<float> x = read_matrix(require(a, "x"), "--x", &m, &kx);
  if (kx != f.k) throw Error("--x has " + std::to_string(kx) + " columns, the factors' K is " + std::to_string(f.k));
  const std::string out = require(a, "out");
  const std::string device = a.str("device", "cpu");
  std::vector<float> y(static_cast<size_t>(m * f.n));
  std::string ran;
  const auto t0 = std::chrono::steady_clock::now();
  if (device == "cpu") {
    if (a.has("dtype") || a.has("kernel")) throw Error("--dtype and --kernel are for --device cuda");
    tsvd_matmul(f, x.data(), m, y.data(), int(a.integer("threads", 0)));
    ran = "cpu";
  } else if (device == "cuda") {
#if SPATTN_HAVE_CUDA
    const DType t = parse_dtype(a.str("dtype", "bf16"));
    if (t != DType::bf16 && t != DType::f16) throw Error("--dtype must be bf16 or fp16 on the GPU, got '" + a.str("dtype") + "'");
    ran = "cuda " + matmul_cuda(f, x, m, y, t, a.str("kernel", "auto"));
#else
    throw Error("this build of spattn has no CUDA support: rebuild with a CUDA compiler (SPATTN_CUDA=ON), or use --device cpu");
#endif
  } else {
    throw Error("--device must be cpu or cuda, got '" + device + "'");
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  write_npy(out, y.data(), {m, f.n});
  std::fprintf(stderr, "Y = X * TSVD(W): %lld x %lld (%s, %.3f s); wrote %s\n", (long long)m, (long long)f.n, ran.c_str(), s,
               out.c_str());
  return 0;
}

int cmd_error(int argc, char** argv) {
  Args a(argc, argv, 3, {"in", "factors"}, {"per-tile"});
  const TsvdFactors f = tsvd_load(require(a, "factors"));
  int64_t k = 0, n = 0;
  const std::vector<float> w = read_matrix(require(a, "in"), "--in", &k, &n);
  if (k != f.k || n != f.n)
    throw Error("--in is " + std::to_string(k) + " x " + std::to_string(n) + ", the factors are for " + std::to_string(f.k) + " x " +
                std::to_string(f.n));
  const TsvdError e = tsvd_error(w.data(), f);
  std::printf("%s\n", f.describe().c_str());
  const int64_t tc = f.tile_cols();
  // Every tile when asked or when there are few; else the spread.
  if (a.has("per-tile") || e.tile.size() <= 64) {
    std::printf("tile_row tile_col rank rel_err\n");
    for (size_t t = 0; t < e.tile.size(); ++t)
      std::printf("%lld %lld %d %.6e\n", (long long)(int64_t(t) / tc), (long long)(int64_t(t) % tc), f.rank(int64_t(t) / tc, int64_t(t) % tc),
                  e.tile[t]);
  } else {
    std::vector<double> s = e.tile;
    std::sort(s.begin(), s.end());
    std::printf("per tile (%zu tiles; --per-tile lists them): min %.6e, median %.6e, max %.6e\n", s.size(), s.front(),
                s[s.size() / 2], s.back());
  }
  std::printf("total relative Frobenius error %.6e\n", e.total);
  return 0;
}

int cmd_info(int argc, char** argv) {
  Args a(argc, argv, 3, {"factors"}, {});
  std::printf("%s\n", tsvd_load(require(a, "factors")).describe().c_str());
  return 0;
}

}  // namespace

int tsvd_main(int argc, char** argv) {
  const std::string sub = argc > 2 ? argv[2] : "help";
  if (sub == "compress") return cmd_compress(argc, argv);
  if (sub == "matmul") return cmd_matmul(argc, argv);
  if (sub == "error") return cmd_error(argc, argv);
  if (sub == "info") return cmd_info(argc, argv);
  if (sub == "bench") return bench::tsvd_bench_main(argc, argv);
  if (sub == "help" || sub == "--help" || sub == "-h") {
    std::cout << kTsvdUsage;
    return 0;
  }
  throw Error("unknown tsvd command '" + sub + "' (run `spattn tsvd help` for the list)");
}

}  // namespace spattn::tools
