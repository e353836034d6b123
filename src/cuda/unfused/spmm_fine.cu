// Fine SpMM: O = P V on CSR entries, CUDA cores, one warp per row (a plan with no coarse part whose fine
// part is too sparse for the tensor-core tiles of spmm_fine_tc.cu; f32).
//
// The warp splits into 4 groups of 8 lanes; a group takes one entry (k, p) at a time and each lane one or
// more 16-byte chunks of V[k] (up to 4: Dv <= 256 halves / 128 floats), accumulating p * V[k] in fp32.
// 32 entries' (col, p) pairs are loaded with one coalesced load and passed around by shuffles; at the end
// the 4 groups are summed (2 shuffles per value) and group 0 writes the row.
#include "cuda/common/check.hpp"
#include "cuda/unfused/checks.hpp"
#include "cuda/unfused/dtype.cuh"

namespace spattn::unfused::detail {
namespace {

constexpr int kMaxChunks = 4;

template <class T>
__global__ void __launch_bounds__(256) spmm_fine_kernel(const SpmmFine::Arguments a) {
  constexpr int VEC = Vec<T>::N;
  const int64_t wid = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  if (wid >= a.nrows) return;
  const int64_t bh = blockIdx.y;
  const int lane = threadIdx.x % 32, g = lane / 8, l8 = lane % 8;
  const int64_t q = a.rows[wid];
  const int64_t b = bh / a.shape.Hq, h = bh % a.shape.Hq, hk = h / (a.shape.Hq / a.shape.Hkv);
  const int nchunks = int(a.shape.Dv) / VEC;
  const T* Vg = static_cast<const T*>(a.v.data) + b * a.v.sb + hk * a.v.sh;
  const int64_t first = a.meta.row_offsets[q], last = a.meta.row_offsets[q + 1];
  const int32_t* cols = a.meta.cols;
  const T* P = static_cast<const T*>(a.p) + bh * a.meta.nnz;

  float acc[kMaxChunks][8];
#pragma unroll
  for (int j = 0; j < kMaxChunks; ++j)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[j][e] = 0.f;

  for (int64_t base = first; base < last; base += 32) {
    const int n = last - base < 32 ? int(last - base) : 32;
    const int mycol = lane < n ? cols[base + lane] : 0;
    const float myp = lane < n ? Num<T>::to(P[base + lane]) : 0.f;
    // All 8 V rows of this lane's keys are loaded before the first multiply (the loads are independent).
#pragma unroll
    for (int j = 0; j < kMaxChunks; ++j) {
      const int c = j * 8 + l8;
      if (j * 8 < nchunks) {  // uniform across the warp
        uint4 vv[8];
        float pv[8];
#pragma unroll
        for (int s = 0; s < 8; ++s) {
          const int key = s * 4 + g;
          const int col = __shfl_sync(0xffffffffu, mycol, key);
          pv[s] = __shfl_sync(0xffffffffu, myp, key);
          vv[s] = (key < n && c < nchunks) ? *reinterpret_cast<const uint4*>(Vg + int64_t(col) * a.v.sl + c * VEC)
                                           : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int s = 0; s < 8; ++s) {
          float vf[8];
          unpack<T>(vv[s], vf);
#pragma unroll
          for (int e = 0; e < VEC; ++e) acc[j][e] = fmaf(pv[s], vf[e], acc[j][e]);
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kMaxChunks; ++j)
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      acc[j][e] += __shfl_xor_sync(0xffffffffu, acc[j][e], 8);
      acc[j][e] += __shfl_xor_sync(0xffffffffu, acc[j][e], 16);
    }
  if (g != 0) return;
  T* orow = static_cast<T*>(const_cast<void*>(a.o.data)) + b * a.o.sb + q * a.o.sl + h * a.o.sh;
  float* prow = a.partial ? a.partial + (bh * a.nrows + wid) * a.shape.Dv : nullptr;
#pragma unroll
  for (int j = 0; j < kMaxChunks; ++j) {
    const int c = j * 8 + l8;
    if (c >= nchunks) continue;
    if (prow) {
      float* dst = prow + c * VEC;
#pragma unroll
      for (int e = 0; e < VEC; e += 4)
        *reinterpret_cast<float4*>(dst + e) = make_float4(acc[j][e], acc[j][e + 1], acc[j][e + 2], acc[j][e + 3]);
    } else {
      *reinterpret_cast<uint4*>(orow + c * VEC) = pack<T>(acc[j]);
    }
  }
}

template <class T>
void launch(const SpmmFine::Arguments& a, cudaStream_t stream) {
  dim3 grid(grid_dim((a.nrows + 7) / 8, "spmm fine rows"), unsigned(a.shape.bh()));
  spmm_fine_kernel<T><<<grid, 256, 0, stream>>>(a);
  SPATTN_LAUNCH_CHECK("spmm_fine_kernel");
}

}  // namespace

Status SpmmFine::can_implement(const Arguments& a) {
  if (Status s = check_shape(a.shape); !s) return s;
  if (a.shape.dtype == DType::f64) return Status::fail("dtype f64 is not supported on the GPU");
  const int vec = 16 / dtype_size(a.shape.dtype);
  if (a.shape.Dv > int64_t(vec) * 8 * kMaxChunks)
    return Status::fail("value dim " + std::to_string(a.shape.Dv) + " exceeds " +
                           std::to_string(vec * 8 * kMaxChunks) + " for dtype " + std::string(dtype_name(a.shape.dtype)));
  if (a.shape.bh() > 65535) return Status::fail("batch * q_heads " + std::to_string(a.shape.bh()) + " > 65535");
  if (Status s = check_dense(a.v, a.shape.Dv, a.shape.dtype, "v"); !s) return s;
  if (!a.partial)
    if (Status s = check_dense(a.o, a.shape.Dv, a.shape.dtype, "o"); !s) return s;
  if (a.nrows > 0 && (!a.rows || !a.meta.row_offsets)) return Status::fail("null metadata pointer");
  if (a.meta.nnz > 0 && (!a.p || !a.meta.cols)) return Status::fail("p fine is null");
  return Status::success();
}

void SpmmFine::run(const Arguments& a, cudaStream_t stream) {
  require(can_implement(a), "SpmmFine");
  if (a.nrows == 0) return;
  switch (a.shape.dtype) {
    case DType::bf16: launch<__nv_bfloat16>(a, stream); break;
    case DType::f16: launch<__half>(a, stream); break;
    default: launch<float>(a, stream); break;
  }
}

}  // namespace spattn::unfused::detail
