// cuda/backward/columns_backward.cu — see columns_backward.hpp.
#include "cuda/backward/columns_backward.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/common/check.hpp"
#include "plan/analysis.hpp"

namespace spattn::cuda {
namespace {

Problem compact_problem(Problem p, int64_t columns) {
  p.kv_len = columns;
  return p;
}

// Thread t's place in [batch, nkeys, heads, per] (per units a row): row (b, j, h), unit w.
struct Place {
  int b, j, h, w;
};
__device__ __forceinline__ Place place_of(int64_t t, int nkeys, int heads, int per) {
  const int64_t r = t / per;
  return {int(r / (int64_t(heads) * nkeys)), int((r / heads) % nkeys), int(r % heads), int(t % per)};
}

// dst[b, j, h, :] = src[b, keys[j], h, :], a thread per 16 bytes (rows 16-byte aligned: TileBackward::refusal).
__global__ void gather_rows_kernel(const uint8_t* src, int64_t sb, int64_t sl, int64_t sh, uint4* dst,
                                   const int32_t* keys, int batch, int nkeys, int heads, int words) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= int64_t(batch) * nkeys * heads * words) return;
  const Place x = place_of(t, nkeys, heads, words);
  dst[t] = reinterpret_cast<const uint4*>(src + 2 * (x.b * sb + int64_t(keys[x.j]) * sl + x.h * sh))[x.w];
}

// dst[b, keys[j], h, :] += src[b, j, h, :], a thread per two elements (dk / dv rows 4-byte aligned). The columns are
// distinct: no two threads add to one element.
template <class T2>
__global__ void scatter_add_rows_kernel(const T2* src, uint8_t* dst, int64_t sb, int64_t sl, int64_t sh,
                                        const int32_t* keys, int batch, int nkeys, int heads, int pairs) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= int64_t(batch) * nkeys * heads * pairs) return;
  const Place x = place_of(t, nkeys, heads, pairs);
  T2* d = reinterpret_cast<T2*>(dst + 2 * (x.b * sb + int64_t(keys[x.j]) * sl + x.h * sh)) + x.w;
  if constexpr (std::is_same_v<T2, __nv_bfloat162>) {
    const float2 a = __bfloat1622float2(*d), c = __bfloat1622float2(src[t]);
    *d = __floats2bfloat162_rn(a.x + c.x, a.y + c.y);
  } else {
    const float2 a = __half22float2(*d), c = __half22float2(src[t]);
    *d = __floats2half2_rn(a.x + c.x, a.y + c.y);
  }
}

}  // namespace

ColumnsBackward::ColumnsBackward(const BoundPattern& compact, const std::vector<int32_t>& columns,
                                 const Problem& problem, int row)
    : problem_(compact_problem(problem, int64_t(columns.size()))),
      tile_(compact, plan::analyze(compact), problem_, row),
      keys_(DeviceBuffer::upload(columns)) {
  if (compact.k_len() != int64_t(columns.size()) || compact.q_len() != problem.q_len)
    throw Error("backward columns: a pattern of " + std::to_string(compact.q_len()) + " x " +
                std::to_string(compact.k_len()) + " for " + std::to_string(problem.q_len) + " rows and " +
                std::to_string(columns.size()) + " columns");
  const size_t bytes = size_t(checked_bytes("backward columns' K/V", {problem.batch, int64_t(columns.size()),
                                                                       problem.kv_heads, problem.head_dim}, 2));
  kc_ = DeviceBuffer(bytes), vc_ = DeviceBuffer(bytes), dkc_ = DeviceBuffer(bytes), dvc_ = DeviceBuffer(bytes);
}

void ColumnsBackward::run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                          const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                          const TensorView& dv, void* stream) const {
  const Problem& p = problem_;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int nk = int(p.kv_len), B = int(p.batch), H = int(p.kv_heads), D = int(p.head_dim);
  const int64_t words = int64_t(B) * nk * H * (D / 8), pairs = int64_t(B) * nk * H * (D / 2);
  if (words == 0) return;
  const unsigned gw = unsigned((words + 255) / 256), gp = unsigned((pairs + 255) / 256);
  gather_rows_kernel<<<gw, 256, 0, s>>>(static_cast<const uint8_t*>(k.data), k.stride[0], k.stride[1], k.stride[2],
                                        kc_.get<uint4>(), keys_.get<int32_t>(), B, nk, H, D / 8);
  SPATTN_LAUNCH_CHECK("backward columns: gather k");
  gather_rows_kernel<<<gw, 256, 0, s>>>(static_cast<const uint8_t*>(v.data), v.stride[0], v.stride[1], v.stride[2],
                                        vc_.get<uint4>(), keys_.get<int32_t>(), B, nk, H, D / 8);
  SPATTN_LAUNCH_CHECK("backward columns: gather v");
  const std::array<int64_t, 4> shape{p.batch, p.kv_len, p.kv_heads, p.head_dim};
  const TensorView kc = TensorView::contiguous(kc_.get(), q.dtype, shape), vc = TensorView::contiguous(vc_.get(), q.dtype, shape);
  const TensorView dkc = TensorView::contiguous(dkc_.get(), q.dtype, shape), dvc = TensorView::contiguous(dvc_.get(), q.dtype, shape);
  tile_.run(q, kc, vc, o, lse, dout, dq, dkc, dvc, stream, /*dq_accumulate=*/true);
  const TensorView* from[] = {&dkc, &dvc};
  const TensorView* to[] = {&dk, &dv};
  for (int g = 0; g < 2; ++g) {
    uint8_t* dst = static_cast<uint8_t*>(to[g]->data);
    if (q.dtype == DType::bf16)
      scatter_add_rows_kernel<<<gp, 256, 0, s>>>(static_cast<const __nv_bfloat162*>(from[g]->data), dst, to[g]->stride[0],
                                                 to[g]->stride[1], to[g]->stride[2], keys_.get<int32_t>(), B, nk, H, D / 2);
    else
      scatter_add_rows_kernel<<<gp, 256, 0, s>>>(static_cast<const __half2*>(from[g]->data), dst, to[g]->stride[0],
                                                 to[g]->stride[1], to[g]->stride[2], keys_.get<int32_t>(), B, nk, H, D / 2);
    SPATTN_LAUNCH_CHECK("backward columns: add dk / dv");
  }
}

}  // namespace spattn::cuda
