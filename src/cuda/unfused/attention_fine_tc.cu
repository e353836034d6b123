// Attention without P on a fine-only tensor-core plan, in one kernel: flash-style over the occupied
// (128-row query tile, 64-key chunk) pairs. The three-kernel path (SDDMM -> LSE -> SpMM forming P) moves S
// through memory and reads every K and V chunk once per 64-row tile; here one CTA of 8 warps (16 query rows
// each) keeps Q in registers, streams the K and V chunks of its pairs through three cp.async buffers (two
// pairs ahead, one barrier per pair) and keeps
// the row max/sum and O in registers:
//   random(205) at L = 4096, B*H = 32, D = 64: 32 tiles x 64 chunks x 32 heads = 65536 pairs, each 16 KB
//   of K+V from L2 (1.07 GB, half the 64-row tiles' traffic), 1 KB of mask, 2 x 64x64x64 MMA per warp row
//   block (137 GFLOP in all: ~0.25-0.45 ms on mma.sync), no S/P bytes (the unfused path writes and reads
//   S: 2 x 54 MB, plus 27 M scattered 2-byte stores).
// Entries outside the pattern get -inf before the max; a row with no kept entry gets O = 0, LSE = -inf.
#include <math_constants.h>

#include "cuda/common/check.hpp"
#include "cuda/common/ptx.cuh"
#include "cuda/unfused/checks.hpp"
#include "cuda/unfused/dtype.cuh"

namespace spattn::unfused::detail {
using namespace ::spattn::cuda::ptx;
namespace {

template <class T, int D>
__global__ void __launch_bounds__(256, D == 64 ? 2 : 1) attention_fine_tc_kernel(const AttentionFineTc::Arguments a) {
  constexpr int P = D + 8;  // smem pitch (halves): conflict-free ldmatrix
  constexpr int KC = kFineChunkKeys;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // [128][P]
  T* sK = sQ + kAttTileRows * P;            // [3][64][P]
  T* sV = sK + 3 * KC * P;                  // [3][64][P]

  const int tile = blockIdx.x;
  const int64_t bh = blockIdx.y;
  const int64_t b = bh / a.shape.Hq, h = bh % a.shape.Hq, hk = h / (a.shape.Hq / a.shape.Hkv);
  const T* Qg = static_cast<const T*>(a.q.data) + b * a.q.sb + h * a.q.sh;
  const T* Kg = static_cast<const T*>(a.k.data) + b * a.k.sb + hk * a.k.sh;
  const T* Vg = static_cast<const T*>(a.v.data) + b * a.v.sb + hk * a.v.sh;
  const int p0 = a.tiles.tile_pairs[tile], p1 = a.tiles.tile_pairs[tile + 1];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int VEC = D / 8;  // 16-byte pieces of a row

  for (int i = threadIdx.x; i < kAttTileRows * VEC; i += 256) {
    const int r = i / VEC, c = i % VEC;
    const int64_t q = int64_t(tile) * kAttTileRows + r;
    const bool ok = q < a.shape.Lq;
    cp_async16(sQ + r * P + c * 8, Qg + (ok ? q : 0) * a.q.sl + c * 8, ok ? 16 : 0);
  }
  auto load_kv = [&](int chunk, int buf) {
    const int64_t k0 = int64_t(chunk) * KC;
    T* dk = sK + buf * KC * P;
    T* dv = sV + buf * KC * P;
    for (int i = threadIdx.x; i < KC * VEC; i += 256) {
      const int r = i / VEC, c = i % VEC;
      const bool ok = k0 + r < a.shape.Lk;
      const int64_t kr = ok ? k0 + r : 0;
      cp_async16(dk + r * P + c * 8, Kg + kr * a.k.sl + c * 8, ok ? 16 : 0);
      cp_async16(dv + r * P + c * 8, Vg + kr * a.v.sl + c * 8, ok ? 16 : 0);
    }
  };
  // The mask words of this lane's two rows (r0, r0 + 8 of the warp's 16), one pair ahead.
  const int r0 = warp * 16 + lane / 4;
  const uint64_t* M = a.tiles.masks;
  // K/V chunks go through three buffers, two pairs ahead: one barrier per pair (the buffer refilled at
  // pair p was last read at pair p - 1, which every warp has left once past pair p's barrier).
  uint64_t mA0 = 0, mA1 = 0;
  int chunkN = 0;  // the chunk of pair p + 2 at the top of pair p
  if (p0 < p1) {
    mA0 = M[int64_t(p0) * kAttTileRows + r0];
    mA1 = M[int64_t(p0) * kAttTileRows + r0 + 8];
    load_kv(a.tiles.pair_chunk[p0], 0);
  }
  cp_async_commit();
  if (p0 + 1 < p1) load_kv(a.tiles.pair_chunk[p0 + 1], 1);
  cp_async_commit();
  if (p0 + 2 < p1) chunkN = a.tiles.pair_chunk[p0 + 2];
  cp_async_wait<1>();
  __syncthreads();
  uint32_t qf[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    ldmatrix_x4(qf[kk], sQ + (warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * P + kk * 16 + (lane / 16) * 8);

  const float sl2 = a.scale * 1.4426950408889634f;
  float m0 = -CUDART_INF_F, m1 = -CUDART_INF_F, l0 = 0.f, l1 = 0.f;  // rows r0, r0 + 8 (l: this lane's part)
  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;

  for (int p = p0, buf = 0; p < p1; ++p, buf = buf == 2 ? 0 : buf + 1) {
    cp_async_wait<1>();  // pair p's chunks have landed (p + 1's may still be in flight)
    __syncthreads();
    if (p + 2 < p1) load_kv(chunkN, buf == 0 ? 2 : buf - 1);
    cp_async_commit();
    uint64_t mB0 = 0, mB1 = 0;
    if (p + 1 < p1) {
      mB0 = M[int64_t(p + 1) * kAttTileRows + r0];
      mB1 = M[int64_t(p + 1) * kAttTileRows + r0 + 8];
    }
    if (p + 3 < p1) chunkN = a.tiles.pair_chunk[p + 3];
    const T* kb = sK + buf * KC * P;
    const T* vb = sV + buf * KC * P;
    // ---- S = Q K^T (16 x 64 per warp) ----
    float s[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int nt = 0; nt < 8; nt += 2) {
        uint32_t bf[4];
        ldmatrix_x4(bf, kb + (nt * 8 + (lane % 8) + (lane / 16) * 8) * P + kk * 16 + ((lane / 8) % 2) * 8);
        mma16816<kIsBf16<T>>(s[nt], qf[kk], bf[0], bf[1]);
        mma16816<kIsBf16<T>>(s[nt + 1], qf[kk], bf[2], bf[3]);
      }
    }
    // ---- mask, scale, online softmax ----
    float mx0 = -CUDART_INF_F, mx1 = -CUDART_INF_F;
    // This lane's columns are 8 nt + 2 (lane % 4) + {0, 1}: shifted once, the bits sit at constant places.
    const uint64_t w0 = mA0 >> (2 * (lane % 4)), w1 = mA1 >> (2 * (lane % 4));
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const int c = nt * 8;
      s[nt][0] = (w0 >> c) & 1 ? s[nt][0] * sl2 : -CUDART_INF_F;
      s[nt][1] = (w0 >> (c + 1)) & 1 ? s[nt][1] * sl2 : -CUDART_INF_F;
      s[nt][2] = (w1 >> c) & 1 ? s[nt][2] * sl2 : -CUDART_INF_F;
      s[nt][3] = (w1 >> (c + 1)) & 1 ? s[nt][3] * sl2 : -CUDART_INF_F;
      mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
      mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
    }
#pragma unroll
    for (int off = 1; off < 4; off *= 2) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
    }
    const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
    // A row with nothing kept so far keeps m = -inf; exponentiate against 0 there (every value is -inf).
    const float u0 = n0 == -CUDART_INF_F ? 0.f : n0, u1 = n1 == -CUDART_INF_F ? 0.f : n1;
    const float al0 = exp2f(m0 - u0), al1 = exp2f(m1 - u1);  // m = -inf: 0 (l and o are 0 then anyway)
    m0 = n0;
    m1 = n1;
    float t0 = 0.f, t1 = 0.f;
    uint32_t pf[4][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const float e0 = ex2_ftz(s[nt][0] - u0), e1 = ex2_ftz(s[nt][1] - u0);
      const float e2 = ex2_ftz(s[nt][2] - u1), e3 = ex2_ftz(s[nt][3] - u1);
      t0 += e0 + e1;
      t1 += e2 + e3;
      T lo[2] = {Num<T>::from(e0), Num<T>::from(e1)};
      T hi[2] = {Num<T>::from(e2), Num<T>::from(e3)};
      pf[nt / 2][(nt % 2) * 2] = *reinterpret_cast<uint32_t*>(lo);
      pf[nt / 2][(nt % 2) * 2 + 1] = *reinterpret_cast<uint32_t*>(hi);
    }
    l0 = l0 * al0 + t0;
    l1 = l1 * al1 + t1;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      o[i][0] *= al0;
      o[i][1] *= al0;
      o[i][2] *= al1;
      o[i][3] *= al1;
    }
    // ---- O += P V ----
#pragma unroll
    for (int j = 0; j < KC / 16; ++j) {
#pragma unroll
      for (int nt = 0; nt < D / 8; nt += 2) {
        uint32_t bf[4];
        ldmatrix_x4_trans(bf, vb + (j * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * P + nt * 8 + (lane / 16) * 8);
        mma16816<kIsBf16<T>>(o[nt], pf[j], bf[0], bf[1]);
        mma16816<kIsBf16<T>>(o[nt + 1], pf[j], bf[2], bf[3]);
      }
    }
    mA0 = mB0;
    mA1 = mB1;
  }
  // ---- O / l and the LSE ----
#pragma unroll
  for (int off = 1; off < 4; off *= 2) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t q = int64_t(tile) * kAttTileRows + r0 + half * 8;
    if (q >= a.shape.Lq) continue;
    const float l = half ? l1 : l0, m = half ? m1 : m0;
    const float inv = l == 0.f ? 0.f : 1.f / l;  // a NaN l (NaN or +inf score): O NaN
    T* orow = static_cast<T*>(const_cast<void*>(a.o.data)) + b * a.o.sb + q * a.o.sl + h * a.o.sh;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      const int c = nt * 8 + 2 * (lane % 4);
      T pair[2] = {Num<T>::from(o[nt][half * 2] * inv), Num<T>::from(o[nt][half * 2 + 1] * inv)};
      *reinterpret_cast<uint32_t*>(orow + c) = *reinterpret_cast<uint32_t*>(pair);
    }
    if (a.lse && lane % 4 == 0)
      a.lse[bh * a.shape.Lq + q] = l == 0.f ? -CUDART_INF_F : (m + log2f(l)) * 0.6931471805599453f;
  }
}

template <class T, int D>
void launch(const AttentionFineTc::Arguments& a, cudaStream_t stream) {
  const size_t smem = size_t(kAttTileRows + 6 * kFineChunkKeys) * (D + 8) * sizeof(T);
  auto kernel = attention_fine_tc_kernel<T, D>;
  if (smem > 48 * 1024)
    SPATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  dim3 grid(grid_dim(a.tiles.ntiles, "attention fine tc tiles"), unsigned(a.shape.bh()));
  kernel<<<grid, 256, smem, stream>>>(a);
  SPATTN_LAUNCH_CHECK("attention_fine_tc_kernel");
}

}  // namespace

Status AttentionFineTc::can_implement(const Arguments& a) {
  if (Status s = check_shape(a.shape); !s) return s;
  if (a.shape.dtype != DType::bf16 && a.shape.dtype != DType::f16)
    return Status::fail("fused fine attention: dtype " + std::string(dtype_name(a.shape.dtype)) + " is not bf16 or f16");
  if (a.shape.D != a.shape.Dv || (a.shape.D != 64 && a.shape.D != 128))
    return Status::fail("fused fine attention: head dims " + std::to_string(a.shape.D) + "/" +
                           std::to_string(a.shape.Dv) + " (needs D == Dv, 64 or 128)");
  if (a.shape.bh() > 65535) return Status::fail("batch * q_heads " + std::to_string(a.shape.bh()) + " > 65535");
  for (auto [t, name] : {std::pair{&a.q, "q"}, std::pair{&a.k, "k"}, std::pair{&a.v, "v"}, std::pair{&a.o, "o"}})
    if (Status s = check_dense(*t, a.shape.D, a.shape.dtype, name); !s) return s;
  if (a.tiles.ntiles > 0 && !a.tiles.tile_pairs) return Status::fail("null attention tile metadata");
  if (a.tiles.npairs > 0 && (!a.tiles.pair_chunk || !a.tiles.masks)) return Status::fail("null attention tile metadata");
  return Status::success();
}

void AttentionFineTc::run(const Arguments& a, cudaStream_t stream) {
  require(can_implement(a), "AttentionFineTc");
  if (a.tiles.ntiles == 0) return;
  const bool bf = a.shape.dtype == DType::bf16;
  if (a.shape.D == 64)
    bf ? launch<__nv_bfloat16, 64>(a, stream) : launch<__half, 64>(a, stream);
  else
    bf ? launch<__nv_bfloat16, 128>(a, stream) : launch<__half, 128>(a, stream);
}

}  // namespace spattn::unfused::detail
