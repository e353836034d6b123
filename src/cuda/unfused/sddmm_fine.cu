// Fine SDDMM: S = Q K^T on CSR entries, CUDA cores, one warp per row slice (at most Options::fine_slice
// entries, so a long row is shared among warps).
//
// The warp splits into 4 groups of 8 lanes; a group takes one key at a time and each lane one 16-byte chunk
// of it (8 halves or 4 floats; up to 4 chunks per lane: D <= 256 halves / 128 floats). 32 keys make a
// super-step: 8 steps of 4 keys, 8 partial dot products per lane, then a reduce-scatter over the 8 lanes
// (7 shuffles instead of 24) leaves lane (g, j) with key 4j + g, so the 32 results go out as one 128-byte
// store. The 8 K rows of a step are all loaded before the first multiply (memory-level parallelism).
#include "cuda/common/check.hpp"
#include "cuda/unfused/checks.hpp"
#include "cuda/unfused/dtype.cuh"

namespace spattn::unfused::detail {
namespace {

constexpr int kMaxChunks = 4;

template <class T>
__global__ void __launch_bounds__(256) sddmm_fine_kernel(const SddmmFine::Arguments a) {
  constexpr int VEC = Vec<T>::N;
  const int64_t wid = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  if (wid >= a.nitems) return;
  const int64_t bh = blockIdx.y;
  const int lane = threadIdx.x % 32, g = lane / 8, l8 = lane % 8;
  const FineItem it = a.items[wid];
  const int64_t b = bh / a.shape.Hq, h = bh % a.shape.Hq, hk = h / (a.shape.Hq / a.shape.Hkv);
  const int nchunks = int(a.shape.D) / VEC;
  const T* Qrow = static_cast<const T*>(a.q.data) + b * a.q.sb + int64_t(it.row) * a.q.sl + h * a.q.sh;
  const T* Kg = static_cast<const T*>(a.k.data) + b * a.k.sb + hk * a.k.sh;

  uint4 qraw[kMaxChunks];
#pragma unroll
  for (int j = 0; j < kMaxChunks; ++j) {
    const int c = j * 8 + l8;
    qraw[j] = c < nchunks ? *reinterpret_cast<const uint4*>(Qrow + c * VEC) : make_uint4(0, 0, 0, 0);
  }
  const int32_t* cols = a.meta.cols + it.begin;
  T* out = static_cast<T*>(a.s) + bh * a.meta.nnz + it.begin;

  for (int base = 0; base < it.len; base += 32) {
    const int n = min(32, it.len - base);
    const int mycol = lane < n ? cols[base + lane] : 0;
    float acc[8];
    int colk[8];
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      acc[s] = 0.f;
      colk[s] = __shfl_sync(0xffffffffu, mycol, s * 4 + g);
    }
#pragma unroll
    for (int j = 0; j < kMaxChunks; ++j) {
      const int c = j * 8 + l8;
      if (j * 8 < nchunks) {  // uniform across the warp
        uint4 kv[8];
#pragma unroll
        for (int s = 0; s < 8; ++s) {
          const int key = s * 4 + g;
          kv[s] = (key < n && c < nchunks) ? *reinterpret_cast<const uint4*>(Kg + int64_t(colk[s]) * a.k.sl + c * VEC)
                                           : make_uint4(0, 0, 0, 0);
        }
        float qf[8];
        unpack<T>(qraw[j], qf);
#pragma unroll
        for (int s = 0; s < 8; ++s) {
          float kf[8];
          unpack<T>(kv[s], kf);
#pragma unroll
          for (int e = 0; e < VEC; ++e) acc[s] = fmaf(qf[e], kf[e], acc[s]);
        }
      }
    }
    // Reduce-scatter over the 8 lanes of a group: afterwards lane l8 holds the sum for step l8.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bool hi = l8 & 4;
      const float send = hi ? acc[i] : acc[i + 4], keep = hi ? acc[i + 4] : acc[i];
      acc[i] = keep + __shfl_xor_sync(0xffffffffu, send, 4);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const bool hi = l8 & 2;
      const float send = hi ? acc[i] : acc[i + 2], keep = hi ? acc[i + 2] : acc[i];
      acc[i] = keep + __shfl_xor_sync(0xffffffffu, send, 2);
    }
    {
      const bool hi = l8 & 1;
      const float send = hi ? acc[0] : acc[1], keep = hi ? acc[1] : acc[0];
      acc[0] = keep + __shfl_xor_sync(0xffffffffu, send, 1);
    }
    const int key = l8 * 4 + g;
    if (key < n) out[base + key] = Num<T>::from(acc[0]);
  }
}

template <class T>
void launch(const SddmmFine::Arguments& a, cudaStream_t stream) {
  dim3 grid(grid_dim((a.nitems + 7) / 8, "sddmm fine items"), unsigned(a.shape.bh()));
  sddmm_fine_kernel<T><<<grid, 256, 0, stream>>>(a);
  SPATTN_LAUNCH_CHECK("sddmm_fine_kernel");
}

}  // namespace

Status SddmmFine::can_implement(const Arguments& a) {
  if (Status s = check_shape(a.shape); !s) return s;
  const int vec = 16 / dtype_size(a.shape.dtype);
  if (a.shape.dtype == DType::f64) return Status::fail("dtype f64 is not supported on the GPU");
  if (a.shape.D > int64_t(vec) * 8 * kMaxChunks)
    return Status::fail("head dim " + std::to_string(a.shape.D) + " exceeds " + std::to_string(vec * 8 * kMaxChunks) +
                           " for dtype " + std::string(dtype_name(a.shape.dtype)));
  if (a.shape.bh() > 65535) return Status::fail("batch * q_heads " + std::to_string(a.shape.bh()) + " > 65535");
  if (Status s = check_dense(a.q, a.shape.D, a.shape.dtype, "q"); !s) return s;
  if (Status s = check_dense(a.k, a.shape.D, a.shape.dtype, "k"); !s) return s;
  if (a.nitems > 0 && (!a.items || !a.s || !a.meta.cols)) return Status::fail("null metadata or output pointer");
  return Status::success();
}

void SddmmFine::run(const Arguments& a, cudaStream_t stream) {
  require(can_implement(a), "SddmmFine");
  if (a.nitems == 0) return;
  switch (a.shape.dtype) {
    case DType::bf16: launch<__nv_bfloat16>(a, stream); break;
    case DType::f16: launch<__half>(a, stream); break;
    default: launch<float>(a, stream); break;
  }
}

}  // namespace spattn::unfused::detail
