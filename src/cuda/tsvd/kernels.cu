// cuda/tsvd/kernels.cu — the fused TSVD matmul: a tensor-core kernel (mma.sync m16n8k16, P = X_i A_ij kept in
// registers, stream-K over the (output tile, tile row) iterations with a fixup by the last CTA of a tile) and a
// GEMV kernel for M = 1 that streams the factors once. Layouts: kernels.hpp.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>

#include "cuda/common/check.hpp"
#include "cuda/common/ptx.cuh"
#include "cuda/tsvd/gemv_common.cuh"
#include "cuda/tsvd/kernels.hpp"

namespace spattn::cuda::tsvd {
namespace {

template <bool kBf16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (kBf16) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}
template <bool kBf16>
__device__ __forceinline__ float to_float(uint16_t h) {
  if constexpr (kBf16) return __bfloat162float(__ushort_as_bfloat16(h));
  else return __half2float(__ushort_as_half(h));
}
// 16 bytes of data read once (the factors): not kept in L1.
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// CTA g's iterations are [split_begin(g), split_begin(g + 1)).
__device__ __forceinline__ long long split_begin(const Params& p, int g) { return p.total * g / p.grid; }
// The CTA whose range holds iteration `it`.
__device__ int owner(const Params& p, long long it) {
  int g = int(it * p.grid / p.total);
  while (g + 1 < p.grid && split_begin(p, g + 1) <= it) ++g;
  while (g > 0 && split_begin(p, g) > it) --g;
  return g;
}

// ---- the tensor-core kernel ----------------------------------------------------------------------------------
// 4 warps; warp w owns rows [16w, 16w + 16) of the CTA's kBM x kBN output tile, all RP columns of P and all kBN
// columns of Y (P: RP / 2 registers, Y: 64). Per tile row i the K-chunks of X_i and A_ij go through a 2-stage
// cp.async pipeline; B_ij comes with the first chunk of its tile row into one of two B buffers. After the last
// chunk of tile row i, P (the mma accumulator layout is the A-operand layout of the next mma) is rounded to
// 16 bits in registers and Y += P B_ij.
template <bool kBf16, int RP>
__global__ void __launch_bounds__(kMmaThreads) tsvd_mma(const Params p) {
  // Row strides (elements, +16 bytes against ldmatrix bank conflicts) and the three regions: smem_layout.hpp (the
  // host sizes the dynamic shared memory from the same mma_smem(RP); tests/tsvd_layout_test.cpp checks the loads).
  static_assert(mma_smem_bytes_for(RP) <= kSmemSm80, "the mma kernel's shared memory");
  // Every shared-memory address below is one of smem_layout.hpp's mma_*_elem.
  //   xs [2][kBM][kXS]: X_i's chunk; as [2][RP][kAS]: A_ij^T's chunk (N x K, the mma's "col" B operand);
  //   bs [2][RP][kBS]: B_ij's kBN columns.
  extern __shared__ __align__(16) uint16_t smem[];
  __shared__ int s_last;
  const auto* X = static_cast<const uint16_t*>(p.x);
  const auto* A = static_cast<const uint16_t*>(p.a);
  const auto* B = static_cast<const uint16_t*>(p.b);
  auto* Y = static_cast<uint16_t*>(p.y);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int kc_n = p.tile_k / kBK;
  const long long it0 = split_begin(p, blockIdx.x), it1 = split_begin(p, blockIdx.x + 1);

  for (long long it = it0; it < it1;) {
    const int t = int(it / p.kt), i0 = int(it % p.kt);
    const int i1 = int(i0 + (it1 - it) < p.kt ? i0 + (it1 - it) : p.kt);
    const int mt = t % p.m_tiles, nt = t / p.m_tiles;  // M fastest: neighbouring CTAs share the factors of a column
    const int m0 = mt * kBM, n0 = nt * kBN, j = n0 / p.tile_n, nsub = n0 % p.tile_n;
    float yacc[kBN / 8][4];
    float pacc[RP / 8][4];
#pragma unroll
    for (int q = 0; q < kBN / 8; ++q) yacc[q][0] = yacc[q][1] = yacc[q][2] = yacc[q][3] = 0.f;
#pragma unroll
    for (int q = 0; q < RP / 8; ++q) pacc[q][0] = pacc[q][1] = pacc[q][2] = pacc[q][3] = 0.f;

    const int nchunks = (i1 - i0) * kc_n;
    auto load = [&](int c) {
      const int buf = c & 1, i = i0 + c / kc_n, kc = c % kc_n;
      const size_t tile = size_t(i) * p.tile_cols + j;
      const uint16_t* xg = X + size_t(i) * p.tile_k + kc * kBK;
#pragma unroll
      for (int v = tid; v < mma_x_vectors(); v += kMmaThreads) {
        const int r = v / (kBK / 8), cc = (v % (kBK / 8)) * 8, gm = m0 + r;
        ptx::cp_async16(&smem[mma_x_elem(RP, buf, v)], xg + size_t(gm < p.m ? gm : 0) * p.k + cc, gm < p.m ? 16 : 0);
      }
      const uint16_t* ag = A + tile * RP * p.tile_k + size_t(kc) * kBK;  // (RP x kBK) of A_ij^T, ld tile_k
#pragma unroll
      for (int v = tid; v < mma_a_vectors(RP); v += kMmaThreads) {
        const int r = v / (kBK / 8), cc = (v % (kBK / 8)) * 8;
        ptx::cp_async16(&smem[mma_a_elem(RP, buf, v)], ag + size_t(r) * p.tile_k + cc, 16);
      }
      if (kc == 0) {
        const uint16_t* bg = B + tile * RP * p.tile_n + nsub;  // (RP x kBN), ld tile_n
#pragma unroll
        for (int v = tid; v < mma_b_vectors(RP); v += kMmaThreads) {
          const int r = v / (kBN / 8), cc = (v % (kBN / 8)) * 8;
          ptx::cp_async16(&smem[mma_b_elem(RP, i & 1, v)], bg + size_t(r) * p.tile_n + cc, 16);
        }
      }
    };

    load(0);
    ptx::cp_async_commit();
    for (int c = 0; c < nchunks; ++c) {
      // Chunk c + 1 goes into the buffers chunk c - 1 used (freed by the barrier that ended iteration c - 1); its
      // B buffer, when it starts a tile row, is the one tile row i - 1 used.
      if (c + 1 < nchunks) load(c + 1);
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();
      __syncthreads();
#pragma unroll
      for (int ks = 0; ks < kBK / 16; ++ks) {
        uint32_t af[4];
        ptx::ldmatrix_x4(af, &smem[mma_ldx_elem(RP, c & 1, warp, ks, lane)]);
#pragma unroll
        for (int np = 0; np < RP / 16; ++np) {
          // Matrix q = lane / 8: rank rows np 16 + (q / 2) 8 + lane % 8, K columns ks 16 + (q % 2) 8; bf[0], bf[1]
          // are the fragment of rank columns np 16 ... + 7, bf[2], bf[3] of the next 8.
          uint32_t bf[4];
          ptx::ldmatrix_x4(bf, &smem[mma_lda_elem(RP, c & 1, np, ks, lane)]);
          ptx::mma16816<kBf16>(pacc[2 * np], af, bf[0], bf[1]);
          ptx::mma16816<kBf16>(pacc[2 * np + 1], af, bf[2], bf[3]);
        }
      }
      if (c % kc_n == kc_n - 1) {  // tile row i done: Y += P B_ij
        const int i = i0 + c / kc_n;
#pragma unroll
        for (int kk = 0; kk < RP / 16; ++kk) {
          const uint32_t pf[4] = {pack2<kBf16>(pacc[2 * kk][0], pacc[2 * kk][1]), pack2<kBf16>(pacc[2 * kk][2], pacc[2 * kk][3]),
                                  pack2<kBf16>(pacc[2 * kk + 1][0], pacc[2 * kk + 1][1]),
                                  pack2<kBf16>(pacc[2 * kk + 1][2], pacc[2 * kk + 1][3])};
#pragma unroll
          for (int np = 0; np < kBN / 16; ++np) {
            uint32_t bf[4];
            ptx::ldmatrix_x4_trans(bf, &smem[mma_ldb_elem(RP, i & 1, kk, np, lane)]);
            ptx::mma16816<kBf16>(yacc[2 * np], pf, bf[0], bf[1]);
            ptx::mma16816<kBf16>(yacc[2 * np + 1], pf, bf[2], bf[3]);
          }
        }
#pragma unroll
        for (int q = 0; q < RP / 8; ++q) pacc[q][0] = pacc[q][1] = pacc[q][2] = pacc[q][3] = 0.f;
      }
      __syncthreads();
    }

    // Epilogue. Thread (g = lane / 4, tq = lane % 4) holds rows 16 warp + g (+8), columns 8 q + 2 tq (+1).
    const int g = lane >> 2, tq = lane & 3;
    if (i0 == 0 && i1 == p.kt) {  // the whole tile: straight to Y
#pragma unroll
      for (int q = 0; q < kBN / 8; ++q)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = m0 + warp * 16 + g + 8 * h;
          if (row < p.m)
            *reinterpret_cast<uint32_t*>(&Y[size_t(row) * p.n + n0 + q * 8 + 2 * tq]) =
                pack2<kBf16>(yacc[q][2 * h], yacc[q][2 * h + 1]);
        }
    } else {
      // Part of the tile: to this CTA's slot (0: its first segment, 1: its last); the last CTA of the tile to
      // arrive adds the slots of every CTA of the tile in CTA order (deterministic) and writes Y.
      float* ws = p.partial + (size_t(blockIdx.x) * 2 + (it == it0 ? 0 : 1)) * (kBM * kBN);
#pragma unroll
      for (int q = 0; q < kBN / 8; ++q)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<float2*>(&ws[(warp * 16 + g + 8 * h) * kBN + q * 8 + 2 * tq]) =
              make_float2(yacc[q][2 * h], yacc[q][2 * h + 1]);
      __threadfence();
      __syncthreads();
      const long long tb = (long long)t * p.kt;
      const int gf = owner(p, tb), gl = owner(p, tb + p.kt - 1);
      if (tid == 0) s_last = atomicAdd(&p.counters[t], 1) == gl - gf;
      __syncthreads();
      if (s_last) {
        __threadfence();
        for (int e = tid * 4; e < kBM * kBN; e += kMmaThreads * 4) {
          float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
          for (int g2 = gf; g2 <= gl; ++g2) {
            const int slot = split_begin(p, g2) >= tb ? 0 : 1;
            const float4 v = __ldcg(reinterpret_cast<const float4*>(p.partial + (size_t(g2) * 2 + slot) * (kBM * kBN) + e));
            s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
          }
          const int row = m0 + e / kBN;
          if (row < p.m)
            *reinterpret_cast<uint2*>(&Y[size_t(row) * p.n + n0 + e % kBN]) = make_uint2(pack2<kBf16>(s.x, s.y), pack2<kBf16>(s.z, s.w));
        }
        if (tid == 0) p.counters[t] = 0;  // ready for the next launch
      }
    }
    it += i1 - i0;
  }
}

// ---- M = 1 ------------------------------------------------------------------------------------------------------
// CTA (j, s) walks tile rows [kt s / S, kt (s + 1) / S) of tile column j: p = x_i A_ij (G = 256 / rp rounded down to
// a power of two, at most 32, threads a rank row of A_ij^T, over its 16-byte vectors, reduced by shuffles), then
// y_j += p B_ij (threads over 16-byte vectors of B's rows). Before each tile row the CTA asks for B_ij and the next
// tile row's factors in L2 (bulk prefetch, sm_90), so that the bytes of both products and of the next tile row are
// in flight while x_i A_ij is computed. With S > 1 each CTA writes its y_j to a slot and the last to arrive adds
// the S slots in order.
template <bool kBf16>
__global__ void __launch_bounds__(kGemvThreads) tsvd_gemv(const Params p) {
  using gemv::to_float2;
  extern __shared__ __align__(16) float fsm[];
  float* xs = fsm;              // [tile_k]
  float* ps = xs + p.tile_k;    // [rp]
  float* red = ps + p.rp;       // [2048]: (256 / vectors a row) x row length
  const auto* X = static_cast<const uint16_t*>(p.x);
  const auto* A = static_cast<const uint16_t*>(p.a);
  const auto* B = static_cast<const uint16_t*>(p.b);
  const int tid = threadIdx.x;
  const int j = blockIdx.x % p.tile_cols, s = blockIdx.x / p.tile_cols;
  const int ib = int((long long)p.kt * s / p.splits), ie = int((long long)p.kt * (s + 1) / p.splits);
  const gemv::Roles t = gemv::roles(p, tid);
  const uint32_t a_bytes = uint32_t(p.rp) * p.tile_k * 2, b_bytes = uint32_t(p.rp) * p.tile_n * 2;
  float yacc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int i = ib; i < ie; ++i) {
    const size_t tile = size_t(i) * p.tile_cols + j;
    const uint16_t* at = A + tile * p.rp * p.tile_k;  // (rp x tile_k)
    const uint16_t* bt = B + tile * p.rp * p.tile_n;  // (rp x tile_n)
    if (tid == 0) {
      ptx::bulk_prefetch_l2(bt, b_bytes);
      if (i + 1 < ie) {
        ptx::bulk_prefetch_l2(at + size_t(p.tile_cols) * p.rp * p.tile_k, a_bytes);
        ptx::bulk_prefetch_l2(bt + size_t(p.tile_cols) * p.rp * p.tile_n, b_bytes);
      }
    }
    __syncthreads();  // the previous tile row's xs and ps are read
    for (int e = tid; e < p.tile_k; e += kGemvThreads) xs[e] = to_float<kBf16>(X[size_t(i) * p.tile_k + e]);
    __syncthreads();
    // Rank rows gq, gq + 256 / G, ...: G threads a row, each over vectors gl, gl + G, ...
    for (int q = t.gq; q < p.rp; q += kGemvThreads / t.G) {
      float acc = 0.f;
      const uint16_t* ar = at + size_t(q) * p.tile_k;
#pragma unroll 8
      for (int v = t.gl; v < t.vk; v += t.G) {
        const uint4 a8 = ld_stream(ar + v * 8);
        const float4 x0 = *reinterpret_cast<const float4*>(&xs[v * 8]), x1 = *reinterpret_cast<const float4*>(&xs[v * 8 + 4]);
        const float2 a0 = to_float2<kBf16>(a8.x), a1 = to_float2<kBf16>(a8.y), a2 = to_float2<kBf16>(a8.z), a3 = to_float2<kBf16>(a8.w);
        acc = fmaf(a0.x, x0.x, fmaf(a0.y, x0.y, fmaf(a1.x, x0.z, fmaf(a1.y, x0.w, acc))));
        acc = fmaf(a2.x, x1.x, fmaf(a2.y, x1.y, fmaf(a3.x, x1.z, fmaf(a3.y, x1.w, acc))));
      }
      gemv::rank_row_done(acc, t, ps, q);
    }
    __syncthreads();
    if (t.pn < t.qph) {
      const uint16_t* bg = bt + t.cn * 8;
#pragma unroll 8
      for (int q = t.pn; q < p.rp; q += t.qph) gemv::fma8<kBf16>(yacc, ld_stream(bg + size_t(q) * p.tile_n), ps[q]);
    }
  }
  gemv::finish<kBf16>(p, t, yacc, red, j, s);
}

// The dynamic shared memory opt-in, once per device (a host call per launch shows in the small cases' times).
template <bool kBf16, int RP>
void mma_config(size_t smem) {
  static std::atomic<uint64_t> configured{0};
  int dev = 0;
  SPATTN_CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (configured.load(std::memory_order_acquire) & bit) return;
  SPATTN_CUDA_CHECK(cudaFuncSetAttribute(tsvd_mma<kBf16, RP>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  configured.fetch_or(bit, std::memory_order_release);
}

template <bool kBf16, int RP>
void launch_mma_t(const Params& p, cudaStream_t stream) {
  const size_t smem = mma_smem_bytes(RP);
  mma_config<kBf16, RP>(smem);
  tsvd_mma<kBf16, RP><<<p.grid, kMmaThreads, smem, stream>>>(p);
  SPATTN_LAUNCH_CHECK("tsvd_mma");
}

template <bool kBf16>
void launch_mma_rp(const Params& p, cudaStream_t stream) {
  switch (p.rp) {
    case 16: return launch_mma_t<kBf16, 16>(p, stream);
    case 32: return launch_mma_t<kBf16, 32>(p, stream);
    case 64: return launch_mma_t<kBf16, 64>(p, stream);
    case 128: return launch_mma_t<kBf16, 128>(p, stream);
    default: throw Error("TSVD tensor-core kernel: padded rank " + std::to_string(p.rp) + " is not one of 16, 32, 64, 128");
  }
}

template <bool kBf16, int RP>
int occupancy_t() {
  const size_t smem = mma_smem_bytes(RP);
  mma_config<kBf16, RP>(smem);
  int n = 0;
  SPATTN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, tsvd_mma<kBf16, RP>, kMmaThreads, smem));
  return n;
}

}  // namespace

size_t mma_smem_bytes(int rp) { return mma_smem_bytes_for(rp); }

int mma_ctas_per_sm(int rp, bool bf16) {
  switch (rp) {
    case 16: return bf16 ? occupancy_t<true, 16>() : occupancy_t<false, 16>();
    case 32: return bf16 ? occupancy_t<true, 32>() : occupancy_t<false, 32>();
    case 64: return bf16 ? occupancy_t<true, 64>() : occupancy_t<false, 64>();
    case 128: return bf16 ? occupancy_t<true, 128>() : occupancy_t<false, 128>();
    default: return 1;
  }
}

void launch_mma(const Params& p, bool bf16, cudaStream_t stream) {
  if (bf16) launch_mma_rp<true>(p, stream);
  else launch_mma_rp<false>(p, stream);
}

void launch_gemv(const Params& p, bool bf16, cudaStream_t stream) {
  const size_t smem = size_t(p.tile_k + p.rp + 2048) * sizeof(float);
  if (bf16) tsvd_gemv<true><<<p.grid, kGemvThreads, smem, stream>>>(p);
  else tsvd_gemv<false><<<p.grid, kGemvThreads, smem, stream>>>(p);
  SPATTN_LAUNCH_CHECK("tsvd_gemv");
}

}  // namespace spattn::cuda::tsvd
