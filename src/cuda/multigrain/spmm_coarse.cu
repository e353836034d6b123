// Coarse SpMM: O = P V over BSR blocks, tensor cores (mma.sync m16n8k16), blocked 1-D tiling.
//
// One CTA (4 warps) owns an output tile of one block row x 64 value columns for one (b, h) and steps
// through the row's blocks: P block [BS][BS] and V tile [BS][64] stream through two shared-memory buffers
// (cp.async); V feeds the B operand through ldmatrix.trans. Block rows are visited heaviest first
// (row_order) so a causal or global row does not start last.
//   BS = 64: warps stacked in M (4 x 16 rows), each 16 x 64 (32 fp32 accumulators).
//   BS = 32: 2 x 2 warps, each 16 x 32.
#include "common.cuh"

namespace spattn::multigrain::detail {
namespace {

constexpr int kDvTile = 64;

template <class T, int BS>
__global__ void __launch_bounds__(128) spmm_coarse_kernel(const SpmmCoarse::Arguments a) {
  constexpr int WM = BS / 16, WN = 4 / WM, NT = kDvTile / WN / 8;
  static_assert(NT % 2 == 0, "n-tiles are loaded in pairs");
  constexpr int PP = BS + 8, VP = kDvTile + 8;  // +16 bytes per row: conflict-free ldmatrix
  __shared__ __align__(16) T sP[2][BS * PP];
  __shared__ __align__(16) T sV[2][BS * VP];

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
      cp_async16(&sP[buf][r * PP + c * 8], src + r * BS + c * 8, true);
    }
    const int64_t k0 = int64_t(a.meta.cols[blk]) * BS;
    for (int i = threadIdx.x; i < BS * (kDvTile / 8); i += 128) {
      const int r = i / (kDvTile / 8), c = i % (kDvTile / 8);
      const bool ok = k0 + r < a.shape.Lk && dv0 + c * 8 < Dv;
      cp_async16(&sV[buf][r * VP + c * 8], Vg + (ok ? (k0 + r) * a.v.sl + dv0 + c * 8 : 0), ok);
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
        mma16816<T>(acc[nt], af, bf[0], bf[1]);
        mma16816<T>(acc[nt + 1], af, bf[2], bf[3]);
      }
    }
    __syncthreads();
  }

  // Epilogue: rows with a fine part too go to the fp32 partial buffer; the others to O.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t q = int64_t(br) * BS + wm * 16 + lane / 4 + half * 8;
    if (q >= a.shape.Lq) continue;
    const int fi = a.fine_row_index ? a.fine_row_index[q] : -1;
    float* prow = fi >= 0 ? a.partial + (bh * a.fine_rows + fi) * Dv : nullptr;
    T* orow = static_cast<T*>(const_cast<void*>(a.o.data)) + b * a.o.sb + q * a.o.sl + h * a.o.sh;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int c = dv0 + wn * NT * 8 + nt * 8 + 2 * (lane % 4);
      if (c >= Dv) continue;
      const float x = acc[nt][half * 2], y = acc[nt][half * 2 + 1];
      if (prow) {
        *reinterpret_cast<float2*>(prow + c) = make_float2(x, y);
      } else if constexpr (sizeof(T) == 2) {
        T pair[2] = {Num<T>::from(x), Num<T>::from(y)};
        *reinterpret_cast<uint32_t*>(orow + c) = *reinterpret_cast<uint32_t*>(pair);
      }
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
  if (Status s = check_shape(a.shape); !s) return s;
  if (a.shape.dtype != DType::bf16 && a.shape.dtype != DType::f16)
    return Status::failure("coarse SpMM runs on tensor cores: dtype " + std::string(dtype_name(a.shape.dtype)) +
                           " is not bf16 or f16");
  if (a.meta.block != 32 && a.meta.block != 64)
    return Status::failure("block " + std::to_string(a.meta.block) + " is not 32 or 64");
  if (a.shape.Dv % 8 != 0 || a.shape.Dv > 256)
    return Status::failure("value dim " + std::to_string(a.shape.Dv) + " is not a multiple of 8 up to 256");
  if (a.shape.bh() > 65535) return Status::failure("batch * q_heads " + std::to_string(a.shape.bh()) + " > 65535");
  if (Status s = check_dense(a.v, a.shape.Dv, a.shape.dtype, "v"); !s) return s;
  if (Status s = check_dense(a.o, a.shape.Dv, a.shape.dtype, "o"); !s) return s;
  if (!a.p && a.meta.nblocks > 0) return Status::failure("p coarse is null");
  if (!aligned16(a.p)) return Status::failure("p coarse is not 16-byte aligned");
  if (a.fine_row_index && !a.partial) return Status::failure("rows with both parts but no partial buffer");
  if (!a.row_order || !a.meta.row_offsets) return Status::failure("null metadata pointer");
  return Status::success();
}

void SpmmCoarse::run(const Arguments& a, Stream stream) {
  require(can_implement(a), "SpmmCoarse");
  const bool bf = a.shape.dtype == DType::bf16;
  if (a.meta.block == 64)
    bf ? launch<__nv_bfloat16, 64>(a, stream) : launch<__half, 64>(a, stream);
  else
    bf ? launch<__nv_bfloat16, 32>(a, stream) : launch<__half, 32>(a, stream);
}

}  // namespace spattn::multigrain::detail
