// Coarse SpMM: O = P V over BSR blocks, tensor cores (mma.sync m16n8k16), blocked 1-D tiling.
//
// One CTA (4 warps) owns an output tile of one block row x 64 value columns for one (b, h) and steps
// through the row's blocks: P block [BS][BS] and V tile [BS][64] stream through two shared-memory buffers
// (cp.async); V feeds the B operand through ldmatrix.trans. Block rows are visited heaviest first
// (row_order) so a causal or global row does not start last. In a plan with both parts the fine entries
// of the CTA's rows are added in the epilogue (no partial buffers, no merge kernel, one launch).
//   BS = 64: warps stacked in M (4 x 16 rows), each 16 x 64 (32 fp32 accumulators).
//   BS = 32: 2 x 2 warps, each 16 x 32.
#include "cuda/common/check.hpp"
#include "cuda/common/ptx.cuh"
#include "cuda/unfused/checks.hpp"
#include "cuda/unfused/dtype.cuh"

namespace spattn::unfused::detail {
using namespace ::spattn::cuda::ptx;
namespace {

constexpr int kDvTile = 64;

template <class T, int BS>
__global__ void __launch_bounds__(128) spmm_coarse_kernel(const SpmmCoarse::Arguments a) {
  constexpr int WM = BS / 16, WN = 4 / WM, NT = kDvTile / WN / 8;
  static_assert(NT % 2 == 0, "n-tiles are loaded in pairs");
  constexpr int PP = BS + 8, VP = kDvTile + 8;  // +16 bytes per row: conflict-free ldmatrix
  constexpr int OP = kDvTile + 4;                 // fp32 output tile pitch (fused fine epilogue)
  constexpr int kTileBytes = int(sizeof(T)) * 2 * (BS * PP + BS * VP);
  static_assert(BS * OP * 4 <= kTileBytes, "the fp32 output tile reuses the P/V buffers");
  __shared__ __align__(16) unsigned char raw[kTileBytes];
  T (*sP)[BS * PP] = reinterpret_cast<T (*)[BS * PP]>(raw);
  T (*sV)[BS * VP] = reinterpret_cast<T (*)[BS * VP]>(raw + sizeof(T) * 2 * BS * PP);

  const int br = a.row_order[blockIdx.x];
  const int64_t bh = blockIdx.y;
  const int dv0 = blockIdx.z * kDvTile;
  const int64_t b = bh / a.shape.Hq, h = bh % a.shape.Hq, hk = h / (a.shape.Hq / a.shape.Hkv);
  const int first = a.meta.row_offsets[br], last = a.meta.row_offsets[br + 1];
  const T* Pg = static_cast<const T*>(a.p) + bh * a.meta.nblocks * (BS * BS);
  const T* Vg = static_cast<const T*>(a.v.data) + b * a.v.sb + hk * a.v.sh;
  const int Dv = int(a.shape.Dv);

  auto load = [&](int blk, int buf) {
    const T* src = Pg + int64_t(blk) * (BS * BS);
    constexpr int pc = BS / 8;
    for (int i = threadIdx.x; i < BS * pc; i += 128) {
      const int r = i / pc, c = i % pc;
      cp_async16(&sP[buf][r * PP + c * 8], src + r * BS + c * 8, 16);
    }
    const int64_t k0 = int64_t(a.meta.cols[blk]) * BS;
    for (int i = threadIdx.x; i < BS * (kDvTile / 8); i += 128) {
      const int r = i / (kDvTile / 8), c = i % (kDvTile / 8);
      const bool ok = k0 + r < a.shape.Lk && dv0 + c * 8 < Dv;
      cp_async16(&sV[buf][r * VP + c * 8], Vg + (ok ? (k0 + r) * a.v.sl + dv0 + c * 8 : 0), ok ? 16 : 0);
    }
  };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp % WM, wn = warp / WM;
  float acc[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

  if (first < last) load(first, 0);
  cp_async_commit();
  for (int blk = first; blk < last; ++blk) {
    const int buf = (blk - first) & 1;
    if (blk + 1 < last) load(blk + 1, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
#pragma unroll
    for (int k0 = 0; k0 < BS; k0 += 16) {
      uint32_t af[4];
      ldmatrix_x4(af, &sP[buf][(wm * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * PP + k0 + (lane / 16) * 8]);
#pragma unroll
      for (int nt = 0; nt < NT; nt += 2) {
        uint32_t bf[4];
        const int n0 = wn * NT * 8 + nt * 8;
        ldmatrix_x4_trans(bf, &sV[buf][(k0 + (lane % 8) + ((lane / 8) % 2) * 8) * VP + n0 + (lane / 16) * 8]);
        mma16816<kIsBf16<T>>(acc[nt], af, bf[0], bf[1]);
        mma16816<kIsBf16<T>>(acc[nt + 1], af, bf[2], bf[3]);
      }
    }
    __syncthreads();
  }

  if (a.fine.nnz == 0) {
    // Epilogue straight from the accumulators.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t q = int64_t(br) * BS + wm * 16 + lane / 4 + half * 8;
      if (q >= a.shape.Lq) continue;
      T* orow = static_cast<T*>(const_cast<void*>(a.o.data)) + b * a.o.sb + q * a.o.sl + h * a.o.sh;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int c = dv0 + wn * NT * 8 + nt * 8 + 2 * (lane % 4);
        if (c >= Dv) continue;
        T pair[2] = {Num<T>::from(acc[nt][half * 2]), Num<T>::from(acc[nt][half * 2 + 1])};
        *reinterpret_cast<uint32_t*>(orow + c) = *reinterpret_cast<uint32_t*>(pair);
      }
    }
    return;
  }

  // Fused fine epilogue: the fp32 tile goes to shared memory (over the P/V buffers, free after the loop's
  // last barrier), then one warp per row adds the row's fine entries P[i] * V[col[i]] (groups of 8 lanes,
  // a 16-byte chunk of the 64 value columns per lane, 8 V rows in flight) and writes the row of O.
  float* sO = reinterpret_cast<float*>(raw);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = wm * 16 + lane / 4 + half * 8;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int c = wn * NT * 8 + nt * 8 + 2 * (lane % 4);
      *reinterpret_cast<float2*>(sO + r * OP + c) = make_float2(acc[nt][half * 2], acc[nt][half * 2 + 1]);
    }
  }
  __syncthreads();
  const int g = lane / 8, l8 = lane % 8;
  const int dc = dv0 + l8 * 8;  // this lane's 8 value columns
  const bool dok = dc < Dv;
  const T* Pf = static_cast<const T*>(a.p_fine) + bh * a.fine.nnz;
  for (int r = warp; r < BS; r += 4) {
    const int64_t q = int64_t(br) * BS + r;
    if (q >= a.shape.Lq) break;
    const int64_t f0 = a.fine.row_offsets[q], f1 = a.fine.row_offsets[q + 1];
    float o8[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) o8[e] = 0.f;
    for (int64_t base = f0; base < f1; base += 32) {
      const int n = f1 - base < 32 ? int(f1 - base) : 32;
      const int mycol = lane < n ? a.fine.cols[base + lane] : 0;
      const float myp = lane < n ? Num<T>::to(Pf[base + lane]) : 0.f;
      uint4 vv[8];
      float pv[8];
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        const int key = s * 4 + g;
        const int col = __shfl_sync(0xffffffffu, mycol, key);
        pv[s] = __shfl_sync(0xffffffffu, myp, key);
        vv[s] = (key < n && dok) ? *reinterpret_cast<const uint4*>(Vg + int64_t(col) * a.v.sl + dc) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        float vf[8];
        unpack<T>(vv[s], vf);
#pragma unroll
        for (int e = 0; e < 8; ++e) o8[e] = fmaf(pv[s], vf[e], o8[e]);
      }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      o8[e] += __shfl_xor_sync(0xffffffffu, o8[e], 8);
      o8[e] += __shfl_xor_sync(0xffffffffu, o8[e], 16);
    }
    if (g == 0 && dok) {
#pragma unroll
      for (int e = 0; e < 8; ++e) o8[e] += sO[r * OP + l8 * 8 + e];
      T* orow = static_cast<T*>(const_cast<void*>(a.o.data)) + b * a.o.sb + q * a.o.sl + h * a.o.sh;
      *reinterpret_cast<uint4*>(orow + dc) = pack<T>(o8);
    }
  }
}

template <class T, int BS>
void launch(const SpmmCoarse::Arguments& a, cudaStream_t stream) {
  dim3 grid(grid_dim(a.meta.block_rows, "spmm coarse rows"), unsigned(a.shape.bh()),
            unsigned((a.shape.Dv + kDvTile - 1) / kDvTile));
  spmm_coarse_kernel<T, BS><<<grid, 128, 0, stream>>>(a);
  SPATTN_LAUNCH_CHECK("spmm_coarse_kernel");
}

}  // namespace

Status SpmmCoarse::can_implement(const Arguments& a) {
  if (Status s = check_coarse(a.shape, a.meta.block, "SpMM"); !s) return s;
  if (a.shape.Dv % 8 != 0 || a.shape.Dv > 256)
    return Status::fail("value dim " + std::to_string(a.shape.Dv) + " is not a multiple of 8 up to 256");
  if (Status s = check_dense(a.v, a.shape.Dv, a.shape.dtype, "v"); !s) return s;
  if (Status s = check_dense(a.o, a.shape.Dv, a.shape.dtype, "o"); !s) return s;
  if (!a.p && a.meta.nblocks > 0) return Status::fail("p coarse is null");
  if (!aligned16(a.p)) return Status::fail("p coarse is not 16-byte aligned");
  if (a.fine.nnz > 0 && (!a.p_fine || !a.fine.row_offsets || !a.fine.cols)) return Status::fail("p fine is null");
  if (!a.row_order || !a.meta.row_offsets) return Status::fail("null metadata pointer");
  return Status::success();
}

void SpmmCoarse::run(const Arguments& a, cudaStream_t stream) {
  require(can_implement(a), "SpmmCoarse");
  const bool bf = a.shape.dtype == DType::bf16;
  if (a.meta.block == 64)
    bf ? launch<__nv_bfloat16, 64>(a, stream) : launch<__half, 64>(a, stream);
  else
    bf ? launch<__nv_bfloat16, 32>(a, stream) : launch<__half, 32>(a, stream);
}

}  // namespace spattn::unfused::detail
