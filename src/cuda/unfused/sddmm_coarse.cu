// Coarse SDDMM: S = Q K^T on BSR blocks, tensor cores (mma.sync m16n8k16), blocked row splitting.
//
// One CTA (4 warps) takes a slice of a block row (at most `max_slice` blocks, for load balance) for one
// (b, h): the Q tile is loaded once and reused for every block of the slice, the K tiles stream through
// two shared-memory buffers (cp.async). Tile: BS x BS scores, k = D in steps of 16.
//   BS = 64: warps stacked in M (4 x 16 rows), each 16 x 64 (8 n-tiles, 32 fp32 accumulators).
//   BS = 32: 2 x 2 warps, each 16 x 16.
// S is stored in the input dtype (fp32 accumulation, rounded once: half the bytes of fp32, and the
// epilogue is what this kernel spends its time on). Masked entries of a partial block are stored as 0; rows/cols past Lq/Lk come out 0 from zero-filled tiles.
#include "cuda/common/check.hpp"
#include "cuda/common/ptx.cuh"
#include "cuda/unfused/checks.hpp"
#include "cuda/unfused/dtype.cuh"

namespace spattn::unfused::detail {
using namespace ::spattn::cuda::ptx;
namespace {

template <class T, int BS>
__global__ void __launch_bounds__(128) sddmm_coarse_kernel(const SddmmCoarse::Arguments a) {
  constexpr int WM = BS / 16, WN = 4 / WM, NT = BS / WN / 8;
  static_assert(NT % 2 == 0, "n-tiles are loaded in pairs");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int D = int(a.shape.D), pitch = D + 8;  // +16 bytes: ldmatrix rows land in distinct banks
  T* sQ = reinterpret_cast<T*>(smem_raw);         // [BS][pitch]
  T* sK = sQ + BS * pitch;                         // [2][BS][pitch]

  const int item = blockIdx.x;
  const int64_t bh = blockIdx.y;
  const int br = a.items[3 * item], first = a.items[3 * item + 1], last = a.items[3 * item + 2];
  const int64_t b = bh / a.shape.Hq, h = bh % a.shape.Hq, hk = h / (a.shape.Hq / a.shape.Hkv);
  const T* Qg = static_cast<const T*>(a.q.data) + b * a.q.sb + h * a.q.sh;
  const T* Kg = static_cast<const T*>(a.k.data) + b * a.k.sb + hk * a.k.sh;
  const int chunks = D / 8;  // 16-byte chunks per row

  for (int i = threadIdx.x; i < BS * chunks; i += 128) {
    const int r = i / chunks, c = i % chunks;
    const int64_t q = int64_t(br) * BS + r;
    const bool ok = q < a.shape.Lq;
    cp_async16(sQ + r * pitch + c * 8, Qg + (ok ? q : 0) * a.q.sl + c * 8, ok ? 16 : 0);
  }
  auto load_k = [&](int blk, int buf) {
    const int64_t k0 = int64_t(a.meta.cols[blk]) * BS;
    T* dst = sK + buf * BS * pitch;
    for (int i = threadIdx.x; i < BS * chunks; i += 128) {
      const int r = i / chunks, c = i % chunks;
      const bool ok = k0 + r < a.shape.Lk;
      cp_async16(dst + r * pitch + c * 8, Kg + (ok ? k0 + r : 0) * a.k.sl + c * 8, ok ? 16 : 0);
    }
  };
  load_k(first, 0);
  cp_async_commit();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp % WM, wn = warp / WM;
  const int r0 = wm * 16 + lane / 4;  // this thread's rows: r0, r0 + 8
  const int64_t wpm = int64_t(BS) * BS / 64;

  for (int blk = first; blk < last; ++blk) {
    const int buf = (blk - first) & 1;
    if (blk + 1 < last) load_k(blk + 1, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    float acc[NT][4];
#pragma unroll
    for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    const T* kb = sK + buf * BS * pitch;
    for (int k0 = 0; k0 < D; k0 += 16) {
      uint32_t af[4];
      ldmatrix_x4(af, sQ + (wm * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * pitch + k0 + (lane / 16) * 8);
#pragma unroll
      for (int nt = 0; nt < NT; nt += 2) {
        uint32_t bf[4];
        const int n0 = wn * NT * 8 + nt * 8;
        ldmatrix_x4(bf, kb + (n0 + (lane % 8) + (lane / 16) * 8) * pitch + k0 + ((lane / 8) % 2) * 8);
        mma16816<kIsBf16<T>>(acc[nt], af, bf[0], bf[1]);
        mma16816<kIsBf16<T>>(acc[nt + 1], af, bf[2], bf[3]);
      }
    }

    // Epilogue: the row bits of a partial block (bit r*BS + c), then float2 stores (32-byte row segments).
    const int64_t mi = a.meta.mask_index[blk];
    uint64_t m0 = ~uint64_t(0), m1 = ~uint64_t(0);
    if (mi >= 0) {
      const uint64_t* M = a.meta.masks + mi * wpm;
      const int rb0 = r0 * BS, rb1 = (r0 + 8) * BS;
      m0 = M[rb0 / 64] >> (rb0 % 64);
      m1 = M[rb1 / 64] >> (rb1 % 64);
    }
    T* out = static_cast<T*>(a.s) + (bh * a.meta.nblocks + blk) * (BS * BS);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int c = wn * NT * 8 + nt * 8 + 2 * (lane % 4);
      T v0[2] = {Num<T>::from((m0 >> c) & 1 ? acc[nt][0] : 0.f), Num<T>::from((m0 >> (c + 1)) & 1 ? acc[nt][1] : 0.f)};
      T v1[2] = {Num<T>::from((m1 >> c) & 1 ? acc[nt][2] : 0.f), Num<T>::from((m1 >> (c + 1)) & 1 ? acc[nt][3] : 0.f)};
      *reinterpret_cast<uint32_t*>(out + r0 * BS + c) = *reinterpret_cast<uint32_t*>(v0);
      *reinterpret_cast<uint32_t*>(out + (r0 + 8) * BS + c) = *reinterpret_cast<uint32_t*>(v1);
    }
    __syncthreads();  // the buffer just read is the next prefetch's target
  }
}

template <class T, int BS>
void launch(const SddmmCoarse::Arguments& a, cudaStream_t stream) {
  const size_t smem = size_t(3) * BS * (a.shape.D + 8) * sizeof(T);
  auto kernel = sddmm_coarse_kernel<T, BS>;
  if (smem > 48 * 1024)
    SPATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  dim3 grid(grid_dim(a.nitems, "sddmm coarse items"), unsigned(a.shape.bh()));
  kernel<<<grid, 128, smem, stream>>>(a);
  SPATTN_LAUNCH_CHECK("sddmm_coarse_kernel");
}

}  // namespace

Status SddmmCoarse::can_implement(const Arguments& a) {
  if (Status s = check_coarse(a.shape, a.meta.block, "SDDMM"); !s) return s;
  if (a.shape.D % 16 != 0 || a.shape.D > 256)
    return Status::fail("head dim " + std::to_string(a.shape.D) + " is not a multiple of 16 up to 256");
  if (Status s = check_dense(a.q, a.shape.D, a.shape.dtype, "q"); !s) return s;
  if (Status s = check_dense(a.k, a.shape.D, a.shape.dtype, "k"); !s) return s;
  if (a.nitems > 0 && (!a.items || !a.s || !a.meta.cols || !a.meta.mask_index))
    return Status::fail("null metadata or output pointer");
  return Status::success();
}

void SddmmCoarse::run(const Arguments& a, cudaStream_t stream) {
  require(can_implement(a), "SddmmCoarse");
  if (a.nitems == 0) return;
  const bool bf = a.shape.dtype == DType::bf16;
  if (a.meta.block == 64)
    bf ? launch<__nv_bfloat16, 64>(a, stream) : launch<__half, 64>(a, stream);
  else
    bf ? launch<__nv_bfloat16, 32>(a, stream) : launch<__half, 32>(a, stream);
}

}  // namespace spattn::unfused::detail
