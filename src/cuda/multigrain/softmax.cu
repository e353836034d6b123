// Compound sparse softmax: one row is the row r of every coarse block of its block row (BSR, with masks)
// plus the row's fine CSR entries; one warp per (row, b, h) sweeps both, scaling and masking fused.
// Pass 1: online max / sum per lane (exp2 domain), then a warp reduction gives LSE; pass 2 writes P.
// The second read of S mostly hits L1/L2 (a row of local(256) in 64-blocks is 10 x 256 bytes).
// Rows past Lq inside the last block row get P = 0, so the coarse P array is fully written.
#include <math_constants.h>

#include <cmath>

#include "common.cuh"

namespace spattn::multigrain::detail {
namespace {

template <class T>
__global__ void __launch_bounds__(256) softmax_kernel(const CompoundSoftmax::Arguments a, int64_t rows) {
  const int64_t q = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  if (q >= rows) return;
  const int64_t bh = blockIdx.y;
  const int lane = threadIdx.x % 32;
  const bool valid = q < a.shape.Lq;
  const float sl2 = a.scale * 1.4426950408889634f;  // scale * log2(e)

  const int bs = a.coarse.block;
  int64_t cfirst = 0, clast = 0, r = 0;
  if (a.coarse.nblocks > 0) {
    const int64_t br = q / bs;
    r = q % bs;
    cfirst = a.coarse.row_offsets[br];
    clast = a.coarse.row_offsets[br + 1];
  }
  int64_t ffirst = 0, flast = 0;
  if (valid && a.fine.nnz > 0) {
    ffirst = a.fine.row_offsets[q];
    flast = a.fine.row_offsets[q + 1];
  }
  const int64_t bb = int64_t(bs) * bs, wpm = bb / 64;
  const float* Sc = a.s_coarse + bh * a.coarse.nblocks * bb + r * bs;
  const float* Sf = a.s_fine + bh * a.fine.nnz;

  // Row bits of block blk for element c (this row): in range and (full block or mask bit set). The block's
  // column and mask index are read once per block, not per element.
  struct BlockRow {
    int64_t kc;
    const uint64_t* mask;  // null: full block
  };
  auto block_row = [&](int64_t blk) -> BlockRow {
    const int64_t mi = a.coarse.mask_index[blk];
    return {int64_t(a.coarse.cols[blk]) * bs, mi < 0 ? nullptr : a.coarse.masks + mi * wpm};
  };
  auto kept = [&](const BlockRow& br, int c) -> bool {
    if (!valid || br.kc + c >= a.shape.Lk) return false;
    if (!br.mask) return true;
    const int64_t bit = r * bs + c;
    return (br.mask[bit / 64] >> (bit % 64)) & 1;
  };

  float m = -CUDART_INF_F, l = 0.f;
  auto add = [&](float x) {
    x *= sl2;
    if (x > m) {
      l = l * exp2f(m - x) + 1.f;
      m = x;
    } else {
      l += exp2f(x - m);
    }
  };
  if (valid) {
    for (int64_t blk = cfirst; blk < clast; ++blk) {
      const BlockRow br = block_row(blk);
      for (int c = lane; c < bs; c += 32)
        if (kept(br, c)) add(Sc[blk * bb + c]);
    }
    for (int64_t i = ffirst + lane; i < flast; i += 32) add(Sf[i]);
  }
  float M = m;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  float L = M == -CUDART_INF_F ? 0.f : l * exp2f(m - M);
#pragma unroll
  for (int o = 16; o > 0; o /= 2) L += __shfl_xor_sync(0xffffffffu, L, o);
  const float lse2 = L > 0.f ? M + log2f(L) : -CUDART_INF_F;  // log2 of the row's sum of 2^(x * scale * log2 e)

  T* Pc = static_cast<T*>(a.p_coarse) + bh * a.coarse.nblocks * bb + r * bs;
  for (int64_t blk = cfirst; blk < clast; ++blk) {
    const BlockRow br = block_row(blk);
    for (int c = lane; c < bs; c += 32)
      Pc[blk * bb + c] = Num<T>::from(kept(br, c) ? exp2f(Sc[blk * bb + c] * sl2 - lse2) : 0.f);
  }
  T* Pf = static_cast<T*>(a.p_fine) + bh * a.fine.nnz;
  for (int64_t i = ffirst + lane; i < flast; i += 32) Pf[i] = Num<T>::from(exp2f(Sf[i] * sl2 - lse2));
  if (valid && lane == 0 && a.lse) a.lse[bh * a.shape.Lq + q] = lse2 == -CUDART_INF_F ? lse2 : lse2 * 0.6931471805599453f;
}

template <class T>
void launch(const CompoundSoftmax::Arguments& a, cudaStream_t stream) {
  const int64_t rows = a.coarse.nblocks > 0 ? a.coarse.block_rows * a.coarse.block : a.shape.Lq;
  dim3 grid(grid_dim((rows + 7) / 8, "softmax rows"), unsigned(a.shape.bh()));
  softmax_kernel<T><<<grid, 256, 0, stream>>>(a, rows);
  SPATTN_LAUNCH_CHECK("softmax_kernel");
}

}  // namespace

Status CompoundSoftmax::can_implement(const Arguments& a) {
  if (Status s = check_shape(a.shape); !s) return s;
  if (a.shape.dtype == DType::f64) return Status::failure("dtype f64 is not supported on the GPU");
  if (a.shape.bh() > 65535) return Status::failure("batch * q_heads " + std::to_string(a.shape.bh()) + " > 65535");
  if (!(a.scale > 0.f) || !std::isfinite(a.scale)) return Status::failure("scale " + std::to_string(a.scale) + " is not a positive finite number");
  if (a.coarse.nblocks > 0 && (!a.s_coarse || !a.p_coarse))
    return Status::failure("the plan has a coarse part but S or P coarse is null");
  if (a.fine.nnz > 0 && (!a.s_fine || !a.p_fine))
    return Status::failure("the plan has a fine part but S or P fine is null");
  if (a.coarse.nblocks > 0 && a.coarse.block != 32 && a.coarse.block != 64)
    return Status::failure("block " + std::to_string(a.coarse.block) + " is not 32 or 64");
  return Status::success();
}

void CompoundSoftmax::run(const Arguments& a, Stream stream) {
  require(can_implement(a), "CompoundSoftmax");
  switch (a.shape.dtype) {
    case DType::bf16: launch<__nv_bfloat16>(a, stream); break;
    case DType::f16: launch<__half>(a, stream); break;
    default: launch<float>(a, stream); break;
  }
}

}  // namespace spattn::multigrain::detail
