// TsvdGpu (the factors on a GPU, the kernel choice, the fixup workspace) and compression with cuSOLVER.
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "cuda/common/check.hpp"
#include "cuda/common/device.hpp"
#include "cuda/common/tmap.hpp"
#include "cuda/tsvd/kernels.hpp"
#include "spattn/tsvd.hpp"

namespace spattn {
namespace {

namespace ck = cuda::tsvd;
std::string num(int64_t v) { return std::to_string(v); }

struct DeviceArray {
  void* p = nullptr;
  size_t bytes = 0;
  DeviceArray() = default;
  explicit DeviceArray(size_t n) : bytes(n) { SPATTN_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 16))); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(p, o.p);
    std::swap(bytes, o.bytes);
    return *this;
  }
  ~DeviceArray() {
    if (p) cudaFree(p);
  }
};

uint16_t to16(float v, DType t) { return t == DType::bf16 ? float_to_bf16(v) : float_to_half(v); }

}  // namespace

struct TsvdGpu::Impl {
  int device = 0;
  DType dtype = DType::bf16;
  int64_t k = 0, n = 0, tile_k = 0, tile_n = 0;
  int rank = 0, rp = 0, tile_rows = 0, tile_cols = 0;
  int sms = 0;
  bool sm90a = false;  // bulk copies and wgmma
  long long resident = 0;  // tensor-core kernel CTAs the GPU holds at once (sms x occupancy); 0: it cannot run these
  DeviceArray a, b;
  // The fixup workspace, grown to the largest launch seen (the kernels leave the counters at zero). One launch at
  // a time per TsvdGpu: two in flight on different streams would share it.
  DeviceArray partial, counters;
  std::string last;
  // The wgmma kernel (sm_90a): its Y tile width (0: it cannot run these factors, or this GPU is not sm_90a), the
  // factors' tensor maps, and X's for the last (X, M) seen (one host driver call per new X).
  int wg_bn = 0;
  ck::WgParams wg;
  const void* wg_x = nullptr;
  int64_t wg_m = -1;

  // Why the wgmma kernel cannot run these factors, or "".
  std::string wgmma_refusal() const {
    if (wg_bn) return "";
    return "the wgmma TSVD kernel needs an sm_90a GPU (compute capability 9.0), tile_k % 64 == 0, tile_n % 128 == 0 "
           "and a padded rank of 16, 32, 64 or 128; these factors have tile " + num(tile_k) + "x" + num(tile_n) +
           ", rank " + num(rank) + " (padded " + num(rp) + ")";
  }

  void reserve(size_t partial_bytes, size_t counter_count) {
    if (partial.bytes < partial_bytes) partial = DeviceArray(partial_bytes);
    if (counters.bytes < counter_count * sizeof(int)) {
      counters = DeviceArray(counter_count * sizeof(int));
      SPATTN_CUDA_CHECK(cudaMemset(counters.p, 0, counters.bytes));
      SPATTN_CUDA_CHECK(cudaDeviceSynchronize());  // zero before a launch on any stream (non-blocking ones too)
    }
  }
  // Why the tensor-core kernel cannot run these factors, or "".
  std::string mma_refusal() const {
    if (tile_k % ck::kBK || tile_n % ck::kBN || (rp != 16 && rp != 32 && rp != 64 && rp != 128))
      return "the tensor-core TSVD kernel needs tile_k % " + num(ck::kBK) + " == 0, tile_n % " + num(ck::kBN) +
             " == 0 and a padded rank of 16, 32, 64 or 128; these factors have tile " + num(tile_k) + "x" + num(tile_n) +
             ", rank " + num(rank) + " (padded " + num(rp) + ")";
    return "";
  }
};

TsvdGpu::TsvdGpu(const TsvdFactors& f, DType dtype, int device) : impl_(new Impl) {
  std::unique_ptr<Impl> guard(impl_);
  Impl& g = *impl_;
  if (dtype != DType::bf16 && dtype != DType::f16)
    throw Error("TsvdGpu: dtype " + std::string(dtype_name(dtype)) + " is not supported (bf16 or fp16)");
  if (f.common) throw Error("TsvdGpu: TSVD-common factors (common = " + num(f.common) + ") are not supported on the GPU yet");
  if (f.ranks.empty() || !f.uniform_rank()) throw Error("TsvdGpu: the GPU kernels need one rank in every tile; these factors have several");
  if (f.k % f.tile_k || f.n % f.tile_n)
    throw Error("TsvdGpu: the GPU kernels need K % tile_k == 0 and N % tile_n == 0; these factors are " + num(f.k) + " x " +
                num(f.n) + " with tile " + num(f.tile_k) + "x" + num(f.tile_n));
  if (f.tile_k % 8 || f.tile_n % 8 || f.tile_n > 2048 || f.tile_k > 4096)
    throw Error("TsvdGpu: tile " + num(f.tile_k) + "x" + num(f.tile_n) +
                " is not supported (tile_k and tile_n multiples of 8, tile_k <= 4096, tile_n <= 2048)");
  g.device = device;
  g.dtype = dtype;
  g.k = f.k, g.n = f.n, g.tile_k = f.tile_k, g.tile_n = f.tile_n;
  g.rank = f.ranks.front();
  g.rp = (g.rank + 15) / 16 * 16;
  if (g.rp > 256) throw Error("TsvdGpu: rank " + num(g.rank) + " is above the GPU kernels' 256");
  g.tile_rows = int(f.tile_rows()), g.tile_cols = int(f.tile_cols());
  cuda::DeviceScope scope(device);
  g.sms = cuda::device_info(device).sms;
  if (g.mma_refusal().empty()) g.resident = (long long)g.sms * ck::mma_ctas_per_sm(g.rp, dtype == DType::bf16);
  // The device layout (kernels.hpp): A_ij transposed, rank padded with zeros to rp.
  const size_t tiles = size_t(g.tile_rows) * size_t(g.tile_cols);
  std::vector<uint16_t> ha(tiles * size_t(g.tile_k * g.rp), 0), hb(tiles * size_t(g.rp * g.tile_n), 0);
  for (int64_t i = 0; i < g.tile_rows; ++i)
    for (int64_t j = 0; j < g.tile_cols; ++j) {
      const size_t t = size_t(i * g.tile_cols + j);
      const float *A = f.a_block(i, j), *B = f.b_block(i, j);
      for (int64_t p = 0; p < g.tile_k; ++p)
        for (int q = 0; q < g.rank; ++q) ha[(t * g.rp + q) * g.tile_k + p] = to16(A[p * g.rank + q], dtype);
      for (int q = 0; q < g.rank; ++q)
        for (int64_t c = 0; c < g.tile_n; ++c) hb[(t * g.rp + q) * g.tile_n + c] = to16(B[q * g.tile_n + c], dtype);
    }
  g.a = DeviceArray(ha.size() * 2);
  g.b = DeviceArray(hb.size() * 2);
  SPATTN_CUDA_CHECK(cudaMemcpy(g.a.p, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
  SPATTN_CUDA_CHECK(cudaMemcpy(g.b.p, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
  g.sm90a = cuda::device_info(device).sm90a();
  if (g.sm90a) {
    const int bn = ck::wgmma_bn(int(g.tile_k), int(g.tile_n), g.rp);
    const int64_t rows = int64_t(tiles) * g.rp;
    if (bn && cuda::encode_tmap(g.wg.tmap_a, TensorView::contiguous(g.a.p, dtype, {1, rows, 1, g.tile_k}), g.rp) &&
        cuda::encode_tmap(g.wg.tmap_b, TensorView::contiguous(g.b.p, dtype, {1, rows, 1, g.tile_n}), g.rp))
      g.wg_bn = bn;
  }
  guard.release();
}

TsvdGpu::~TsvdGpu() {
  if (impl_) {
    cudaSetDevice(impl_->device);
    delete impl_;
  }
}

std::string TsvdGpu::last_kernel() const { return impl_->last; }
int64_t TsvdGpu::k() const { return impl_->k; }
int64_t TsvdGpu::n() const { return impl_->n; }
DType TsvdGpu::dtype() const { return impl_->dtype; }

void TsvdGpu::matmul(const void* x, int64_t m, void* y, void* stream_ptr, const std::string& kernel) {
  Impl& g = *impl_;
  if (m < 0 || m > (int64_t(1) << 31) - 1) throw Error("TsvdGpu::matmul: M = " + num(m) + " is out of range");
  if (kernel != "auto" && kernel != "tile" && kernel != "streamk" && kernel != "gemv" && kernel != "gemv_bulk" &&
      kernel != "wgmma")
    throw Error("TsvdGpu::matmul: kernel '" + kernel + "' is not one of auto, tile, streamk, gemv, gemv_bulk, wgmma");
  if (m == 0) return;
  if (reinterpret_cast<uintptr_t>(x) % 16 || reinterpret_cast<uintptr_t>(y) % 16)
    throw Error("TsvdGpu::matmul: X and Y must be 16-byte aligned device arrays");
  cuda::DeviceScope scope(g.device);
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  ck::Params p;
  p.x = x, p.a = g.a.p, p.b = g.b.p, p.y = y;
  p.m = int(m), p.k = int(g.k), p.n = int(g.n), p.tile_k = int(g.tile_k), p.tile_n = int(g.tile_n), p.rp = g.rp;
  p.tile_cols = g.tile_cols, p.kt = g.tile_rows;
  const bool bf16 = g.dtype == DType::bf16;
  // M = 1: the bulk-copy gemv on sm_90a where a tile row's factors are 256 x 256 or more and fit its ring, else the
  // plain one. H100, 1 x 12288 x 12288 (ms, bulk vs plain): tile 256 rank 64 0.0718 vs 0.0933, rank 32 0.0383 vs
  // 0.0457, rank 16 0.0241 vs 0.0275; tile 128 rank 32 0.0783 vs 0.0735, rank 16 0.0544 vs 0.0447; 1024-wide shapes
  // within 0.0003 of each other.
  const bool bulk_fits = g.sm90a && ck::gemv_bulk_fits(p.tile_k, p.tile_n, p.rp);
  const bool bulk = kernel == "gemv_bulk" || (kernel == "auto" && m == 1 && bulk_fits && p.tile_k * p.tile_n >= 256 * 256);
  if (bulk || kernel == "gemv" || (kernel == "auto" && m == 1)) {
    const std::string name = bulk ? "gemv_bulk" : "gemv";
    if (m != 1) throw Error("TsvdGpu::matmul: the " + name + " kernel is for M = 1, got M = " + num(m));
    if (bulk && !g.sm90a) throw Error("TsvdGpu::matmul: the gemv_bulk kernel needs an sm_90a device (bulk copies)");
    // The tile rows of a column split over CTAs: the bulk kernel one wave (gemv_smem's CTAs an SM), the plain one
    // about 8 CTAs an SM (256 threads each), enough to stream the factors at full bandwidth.
    p.splits = bulk ? std::clamp(ck::gemv_smem(p.tile_k, p.tile_n, p.rp).ctas_per_sm * g.sms / g.tile_cols, 1, g.tile_rows)
                    : std::clamp((8 * g.sms + g.tile_cols - 1) / g.tile_cols, 1, g.tile_rows);
    p.grid = g.tile_cols * p.splits;
    if (p.splits > 1) g.reserve(size_t(p.splits) * size_t(g.n) * sizeof(float), size_t(g.tile_cols));
    p.partial = static_cast<float*>(g.partial.p), p.counters = static_cast<int*>(g.counters.p);
    if (bulk) ck::launch_gemv_bulk(p, bf16, stream);
    else ck::launch_gemv(p, bf16, stream);
    g.last = name + " (" + num(p.splits) + " splits of the tile rows)";
    return;
  }
  // auto for M > 1: the wgmma kernel where it can run and its output tiles (kWgBM x wg_bn) fill at least half the
  // SMs; else the mma.sync kernel, one CTA a 64 x 128 tile. H100, `spattn tsvd bench` (session 15): 512 x 1024 x 1024
  // (16-32 wgmma tiles, split over tile rows) tile 0.018-0.024 ms vs wgmma 0.020-0.028; 512 x 1024 x 4096, tile 128
  // (128 wgmma tiles) wgmma 0.016-0.017 vs tile 0.024-0.028; GPT-3 M = 2048 (768-1536 tiles) wgmma 3-4x faster.
  const bool wg_fills = g.wg_bn && m >= ck::kWgBM && 2 * ((m + ck::kWgBM - 1) / ck::kWgBM) * (g.n / g.wg_bn) >= g.sms;
  if (kernel == "wgmma" || (kernel == "auto" && wg_fills)) {
    if (const std::string why = g.wgmma_refusal(); !why.empty()) throw Error("TsvdGpu::matmul: " + why);
    if (x != g.wg_x || m != g.wg_m) {
      if (!cuda::encode_tmap(g.wg.tmap_x, TensorView::contiguous(const_cast<void*>(x), g.dtype, {1, m, 1, g.k}), ck::kWgBM))
        throw Error("TsvdGpu::matmul: the driver gives X no tensor map (the wgmma kernel needs one)");
      g.wg_x = x, g.wg_m = m;
    }
    p.m_tiles = int((m + ck::kWgBM - 1) / ck::kWgBM), p.n_tiles = int(g.n / g.wg_bn);
    const int tiles = p.m_tiles * p.n_tiles;
    // Fewer output tiles than SMs: the tile rows of each tile split over CTAs so that about one wave runs.
    p.splits = tiles >= g.sms ? 1 : std::clamp(g.sms / tiles, 1, g.tile_rows);
    p.grid = tiles * p.splits;
    if (p.splits > 1) g.reserve(size_t(p.grid) * ck::kWgBM * size_t(g.wg_bn) * sizeof(float), size_t(tiles));
    p.partial = static_cast<float*>(g.partial.p), p.counters = static_cast<int*>(g.counters.p);
    g.wg.p = p;
    g.wg.bn = g.wg_bn;
    ck::launch_wgmma(g.wg, bf16, stream);
    g.last = "wgmma (" + num(tiles) + " tiles of " + num(ck::kWgBM) + "x" + num(g.wg_bn) + (p.splits > 1 ? ", tile rows split " + num(p.splits) + " ways" : "") + ")";
    return;
  }
  if (const std::string why = g.mma_refusal(); !why.empty()) throw Error("TsvdGpu::matmul: " + why);
  p.m_tiles = int((m + ck::kBM - 1) / ck::kBM), p.n_tiles = int(g.n / ck::kBN);
  const long long tiles = (long long)p.m_tiles * p.n_tiles;
  p.total = tiles * p.kt;
  // Stream-K (every resident CTA gets an equal share of the (tile, tile row) iterations) only when asked: on an
  // H100 it was slower than one CTA per tile in every shape of the issue (512 x 1024 x 1024, tile 128, R = 2:
  // 0.063 ms against 0.023; M = 1, 1024 x 1024: 0.053 against 0.022), its fixup being one CTA reading every
  // slot of a tile.
  const long long resident = g.resident;
  const bool streamk = kernel == "streamk";
  p.grid = int(streamk ? std::min(p.total, resident) : tiles);
  if (streamk) g.reserve(size_t(p.grid) * 2 * ck::kBM * ck::kBN * sizeof(float), size_t(tiles));
  p.partial = static_cast<float*>(g.partial.p), p.counters = static_cast<int*>(g.counters.p);
  ck::launch_mma(p, bf16, stream);
  g.last = streamk ? "streamk (" + num(p.grid) + " CTAs over " + num(tiles) + " tiles x " + num(p.kt) + " tile rows)"
                   : "tile (" + num(tiles) + " CTAs)";
}

// ---- compression with cuSOLVER ----
namespace {

void sol(cusolverStatus_t s, const char* what) {
  if (s != CUSOLVER_STATUS_SUCCESS) throw Error(std::string("cuSOLVER ") + what + " failed (status " + std::to_string(int(s)) + ")");
}

}  // namespace

TsvdFactors tsvd_compress_gpu(const float* w, int64_t k, int64_t n, const TsvdOptions& o, int device) {
  if (o.common || o.error)
    throw Error("tsvd_compress_gpu: plain TSVD with a rank or a ratio only (TSVD-common and error targets: the CPU)");
  if ((o.rank > 0) == (o.ratio > 0)) throw Error("tsvd_compress_gpu: give exactly one of rank and ratio");
  TsvdFactors f;
  f.k = k, f.n = n, f.tile_k = std::min(o.tile_k, k), f.tile_n = std::min(o.tile_n, n);
  f.check_shape();
  if (k % f.tile_k || n % f.tile_n)
    throw Error("tsvd_compress_gpu: K % tile_k and N % tile_n must be 0 (K = " + num(k) + ", N = " + num(n) + ", tile " +
                num(f.tile_k) + "x" + num(f.tile_n) + "); the CPU compresses ragged tiles");
  const int tk = int(f.tile_k), tn = int(f.tile_n);
  // gesvda needs a tall matrix (m >= n): the tile, or its transpose when it is wide.
  const bool transposed = tn > tk;
  const int m = std::max(tk, tn), nn = std::min(tk, tn);
  const int r = int(std::min<int64_t>(o.rank ? o.rank : tsvd_rank_for_ratio(tk, tn, o.ratio), nn));
  const int batch = int(f.tile_rows() * f.tile_cols());
  f.ranks.assign(size_t(batch), r);
  f.layout(true);

  // The tiles, column-major m x nn each: element (row p, col c) of the tile at p + c tk, or of its transpose
  // (row c, col p) at c + p tn, which is the tile's row-major order.
  std::vector<float> h(size_t(batch) * m * nn);
  for (int64_t i = 0; i < f.tile_rows(); ++i)
    for (int64_t j = 0; j < f.tile_cols(); ++j) {
      float* dst = h.data() + size_t(i * f.tile_cols() + j) * m * nn;
      for (int p = 0; p < tk; ++p)
        for (int c = 0; c < tn; ++c) {
          const float v = w[(i * tk + p) * n + j * tn + c];
          if (transposed) dst[c + size_t(p) * tn] = v;
          else dst[p + size_t(c) * tk] = v;
        }
    }
  cuda::DeviceScope scope(device);
  cusolverDnHandle_t handle = nullptr;
  sol(cusolverDnCreate(&handle), "create");
  struct HandleGuard {
    cusolverDnHandle_t h;
    ~HandleGuard() { cusolverDnDestroy(h); }
  } hg{handle};
  const bool small = m <= 32;  // gesvdjBatched: full SVDs of matrices up to 32 x 32
  const int ucols = small ? m : nn;  // U: m x m (gesvdj) or m x nn (gesvda)
  DeviceArray da(h.size() * 4), ds(size_t(batch) * nn * 4), du(size_t(batch) * m * ucols * 4), dv(size_t(batch) * nn * nn * 4),
      dinfo(size_t(batch) * sizeof(int));
  SPATTN_CUDA_CHECK(cudaMemcpy(da.p, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  auto* A = static_cast<float*>(da.p);
  auto* S = static_cast<float*>(ds.p);
  auto* U = static_cast<float*>(du.p);
  auto* V = static_cast<float*>(dv.p);
  int lwork = 0;
  if (small) {
    gesvdjInfo_t params = nullptr;
    sol(cusolverDnCreateGesvdjInfo(&params), "gesvdj info");
    struct ParamsGuard {
      gesvdjInfo_t p;
      ~ParamsGuard() { cusolverDnDestroyGesvdjInfo(p); }
    } pg{params};
    sol(cusolverDnSgesvdjBatched_bufferSize(handle, CUSOLVER_EIG_MODE_VECTOR, m, nn, A, m, S, U, m, V, nn, &lwork, params, batch),
        "gesvdjBatched buffer size");
    DeviceArray work(size_t(lwork) * 4);
    sol(cusolverDnSgesvdjBatched(handle, CUSOLVER_EIG_MODE_VECTOR, m, nn, A, m, S, U, m, V, nn, static_cast<float*>(work.p), lwork,
                                 static_cast<int*>(dinfo.p), params, batch),
        "gesvdjBatched");
    SPATTN_CUDA_CHECK(cudaDeviceSynchronize());
  } else {
    sol(cusolverDnSgesvdaStridedBatched_bufferSize(handle, CUSOLVER_EIG_MODE_VECTOR, r, m, nn, A, m, (long long)m * nn, S, nn, U, m,
                                                   (long long)m * ucols, V, nn, (long long)nn * nn, &lwork, batch),
        "gesvdaStridedBatched buffer size");
    DeviceArray work(size_t(lwork) * 4);
    std::vector<double> residual(static_cast<size_t>(batch));
    sol(cusolverDnSgesvdaStridedBatched(handle, CUSOLVER_EIG_MODE_VECTOR, r, m, nn, A, m, (long long)m * nn, S, nn, U, m,
                                        (long long)m * ucols, V, nn, (long long)nn * nn, static_cast<float*>(work.p), lwork,
                                        static_cast<int*>(dinfo.p), residual.data(), batch),
        "gesvdaStridedBatched");
    SPATTN_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<int> info(static_cast<size_t>(batch));
  SPATTN_CUDA_CHECK(cudaMemcpy(info.data(), dinfo.p, info.size() * sizeof(int), cudaMemcpyDeviceToHost));
  for (int t = 0; t < batch; ++t)
    if (info[size_t(t)] != 0)
      throw Error("tsvd_compress_gpu: cuSOLVER reports info " + std::to_string(info[size_t(t)]) + " for tile " + num(t) +
                  (info[size_t(t)] > 0 ? " (no convergence: does W hold NaN or Inf?)" : ""));
  std::vector<float> hs(size_t(batch) * nn), hu(size_t(batch) * m * ucols), hv(size_t(batch) * nn * nn);
  SPATTN_CUDA_CHECK(cudaMemcpy(hs.data(), S, hs.size() * 4, cudaMemcpyDeviceToHost));
  SPATTN_CUDA_CHECK(cudaMemcpy(hu.data(), U, hu.size() * 4, cudaMemcpyDeviceToHost));
  SPATTN_CUDA_CHECK(cudaMemcpy(hv.data(), V, hv.size() * 4, cudaMemcpyDeviceToHost));
  // Tile = U S V^T (U: tk x r, V: tn x r), or tile^T = U S V^T, so tile = V S U^T.
  for (int64_t i = 0; i < f.tile_rows(); ++i)
    for (int64_t j = 0; j < f.tile_cols(); ++j) {
      const size_t t = size_t(i * f.tile_cols() + j);
      const float* s = hs.data() + t * nn;
      const float* u = hu.data() + t * m * ucols;
      const float* v = hv.data() + t * nn * nn;
      const float* left = transposed ? v : u;   // tk x r, leading dimension tk
      const float* right = transposed ? u : v;  // tn x r, leading dimension tn
      float *Af = f.a_block(i, j), *Bf = f.b_block(i, j);
      for (int p = 0; p < tk; ++p)
        for (int q = 0; q < r; ++q) Af[p * r + q] = left[p + size_t(q) * tk] * s[q];
      for (int q = 0; q < r; ++q)
        for (int c = 0; c < tn; ++c) Bf[q * tn + c] = right[c + size_t(q) * tn];
    }
  return f;
}

}  // namespace spattn
