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

// Each lane owns BS/32 adjacent columns of every block (a float2 for 64-blocks); blocks are taken 8 at a
// time with all loads issued first (a warp-per-row loop that loads, then uses, is latency bound: the first
// version, one float per lane and per-element online rescaling, ran local(256) at 0.68 ms on an H100).
// Each chunk finds its max first, so there is one exp2 per element.
template <class T, int BS>
__global__ void __launch_bounds__(256) softmax_kernel(const CompoundSoftmax::Arguments a, int64_t rows) {
  constexpr int EPL = BS / 32, CH = 8;
  const int64_t q = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  if (q >= rows) return;
  const int64_t bh = blockIdx.y;
  const int lane = threadIdx.x % 32, c0 = lane * EPL;
  const bool valid = q < a.shape.Lq;
  const float sl2 = a.scale * 1.4426950408889634f;  // scale * log2(e)
  constexpr int64_t bb = int64_t(BS) * BS, wpm = bb / 64;

  int64_t cfirst = 0, clast = 0, r = 0;
  if (a.coarse.nblocks > 0) {
    const int64_t br = q / BS;
    r = q % BS;
    cfirst = a.coarse.row_offsets[br];
    clast = a.coarse.row_offsets[br + 1];
  }
  int64_t ffirst = 0, flast = 0;
  if (valid && a.fine.nnz > 0) {
    ffirst = a.fine.row_offsets[q];
    flast = a.fine.row_offsets[q + 1];
  }
  const T* Sc = static_cast<const T*>(a.s_coarse) + bh * a.coarse.nblocks * bb + r * BS + c0;
  const T* Sf = static_cast<const T*>(a.s_fine) + bh * a.fine.nnz;

  // The kept bits of this lane's EPL columns in block blk (this row): mask bit and in range.
  auto lane_bits = [&](int64_t blk) -> unsigned {
    if (!valid) return 0u;
    const int64_t mi = a.coarse.mask_index[blk];
    unsigned bits = (1u << EPL) - 1;
    if (mi >= 0) {
      const int64_t bit = r * BS + c0;
      bits = unsigned(a.coarse.masks[mi * wpm + bit / 64] >> (bit % 64)) & ((1u << EPL) - 1);
    }
    const int64_t rem = a.shape.Lk - (int64_t(a.coarse.cols[blk]) * BS + c0);
    if (rem < EPL) bits &= rem <= 0 ? 0u : ((1u << rem) - 1);
    return bits;
  };
  auto load = [&](int64_t blk, float (&v)[EPL]) {
#pragma unroll
    for (int e = 0; e < EPL; ++e) v[e] = Num<T>::to(Sc[blk * bb + e]);  // adjacent: one 4- or 8-byte load
  };

  float m = -CUDART_INF_F, l = 0.f;
  auto absorb = [&](float mx, auto&& sum_with) {  // a chunk with max mx (scaled, log2 domain)
    if (mx == -CUDART_INF_F) return;
    if (mx > m) {
      l *= exp2f(m - mx);
      m = mx;
    }
    l += sum_with(m);
  };
  if (valid) {
    for (int64_t blk0 = cfirst; blk0 < clast; blk0 += CH) {
      float v[CH][EPL];
      unsigned kb[CH];
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        kb[i] = blk0 + i < clast ? lane_bits(blk0 + i) : 0u;
        if (blk0 + i < clast) load(blk0 + i, v[i]);
      }
      float mx = -CUDART_INF_F;
#pragma unroll
      for (int i = 0; i < CH; ++i)
#pragma unroll
        for (int e = 0; e < EPL; ++e) {
          v[i][e] *= sl2;
          if ((kb[i] >> e) & 1) mx = fmaxf(mx, v[i][e]);
        }
      absorb(mx, [&](float mm) {
        float t = 0.f;
#pragma unroll
        for (int i = 0; i < CH; ++i)
#pragma unroll
          for (int e = 0; e < EPL; ++e)
            if ((kb[i] >> e) & 1) t += exp2f(v[i][e] - mm);
        return t;
      });
    }
    for (int64_t i0 = ffirst; i0 < flast; i0 += 32 * CH) {
      float v[CH];
      float mx = -CUDART_INF_F;
#pragma unroll
      for (int j = 0; j < CH; ++j) {
        const int64_t i = i0 + j * 32 + lane;
        v[j] = i < flast ? Num<T>::to(Sf[i]) * sl2 : -CUDART_INF_F;
        mx = fmaxf(mx, v[j]);
      }
      absorb(mx, [&](float mm) {
        float t = 0.f;
#pragma unroll
        for (int j = 0; j < CH; ++j) t += exp2f(v[j] - mm);  // exp2(-inf) = 0 for the tail
        return t;
      });
    }
  }
  float M = m;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  float L = M == -CUDART_INF_F ? 0.f : l * exp2f(m - M);
#pragma unroll
  for (int o = 16; o > 0; o /= 2) L += __shfl_xor_sync(0xffffffffu, L, o);
  const float lse2 = L > 0.f ? M + log2f(L) : -CUDART_INF_F;  // log2 of the row's sum of 2^(x * scale * log2 e)

  if (valid && lane == 0 && a.lse2) a.lse2[bh * a.shape.Lq + q] = lse2 == -CUDART_INF_F ? CUDART_INF_F : lse2;
  if (valid && lane == 0 && a.lse) a.lse[bh * a.shape.Lq + q] = lse2 == -CUDART_INF_F ? lse2 : lse2 * 0.6931471805599453f;
  if (!a.p_coarse && !a.p_fine) return;  // LSE only
  T* Pc = static_cast<T*>(a.p_coarse) + bh * a.coarse.nblocks * bb + r * BS + c0;
  for (int64_t blk0 = cfirst; blk0 < clast; blk0 += CH) {
    float v[CH][EPL];
    unsigned kb[CH];
#pragma unroll
    for (int i = 0; i < CH; ++i) {
      kb[i] = blk0 + i < clast ? lane_bits(blk0 + i) : 0u;
      if (kb[i]) load(blk0 + i, v[i]);
    }
#pragma unroll
    for (int i = 0; i < CH; ++i) {
      if (blk0 + i >= clast) break;
      T out[EPL];
#pragma unroll
      for (int e = 0; e < EPL; ++e) out[e] = Num<T>::from((kb[i] >> e) & 1 ? exp2f(v[i][e] * sl2 - lse2) : 0.f);
      if constexpr (EPL == 2 && sizeof(T) == 2) {
        *reinterpret_cast<uint32_t*>(Pc + (blk0 + i) * bb) = *reinterpret_cast<uint32_t*>(out);
      } else {
#pragma unroll
        for (int e = 0; e < EPL; ++e) Pc[(blk0 + i) * bb + e] = out[e];
      }
    }
  }
  T* Pf = static_cast<T*>(a.p_fine) + bh * a.fine.nnz;
  for (int64_t i = ffirst + lane; i < flast; i += 32) Pf[i] = Num<T>::from(exp2f(Num<T>::to(Sf[i]) * sl2 - lse2));
}

template <class T>
void launch(const CompoundSoftmax::Arguments& a, cudaStream_t stream) {
  const int64_t rows = a.coarse.nblocks > 0 ? a.coarse.block_rows * a.coarse.block : a.shape.Lq;
  dim3 grid(grid_dim((rows + 7) / 8, "softmax rows"), unsigned(a.shape.bh()));
  if (a.coarse.nblocks > 0 && a.coarse.block == 32)
    softmax_kernel<T, 32><<<grid, 256, 0, stream>>>(a, rows);
  else
    softmax_kernel<T, 64><<<grid, 256, 0, stream>>>(a, rows);
  SPATTN_LAUNCH_CHECK("softmax_kernel");
}

}  // namespace

Status CompoundSoftmax::can_implement(const Arguments& a) {
  if (Status s = check_shape(a.shape); !s) return s;
  if (a.shape.dtype == DType::f64) return Status::failure("dtype f64 is not supported on the GPU");
  if (a.shape.bh() > 65535) return Status::failure("batch * q_heads " + std::to_string(a.shape.bh()) + " > 65535");
  if (!(a.scale > 0.f) || !std::isfinite(a.scale)) return Status::failure("scale " + std::to_string(a.scale) + " is not a positive finite number");
  const bool lse_only = a.lse2 && !a.p_coarse && !a.p_fine;
  if (a.coarse.nblocks > 0 && (!a.s_coarse || (!a.p_coarse && !lse_only)))
    return Status::failure("the plan has a coarse part but S or P coarse is null");
  if (a.fine.nnz > 0 && (!a.s_fine || (!a.p_fine && !lse_only)))
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
