// cuda/tsvd/wgmma.cu — the Hopper (sm_90a) TSVD matmul: warp-specialized, TMA-fed, wgmma (layouts and parameters:
// kernels.hpp).
//
//   warpgroup 0      producer: one thread issues bulk tensor copies (TMA) into a kWgStages ring of
//                    (X chunk kWgBM x 64, A_ij^T chunk rp x 64) stages and into two B_ij buffers (rp x BN);
//                    `full` mbarriers complete on the bytes, `empty` ones on the consumers' release.
//   warpgroups 1, 2  consumers, 64 rows of X / Y each: per tile row i, P (64 x rp, fp32 in registers) = X_i A_ij by
//                    SS wgmma over the K-chunks (A_ij^T K-major: the K-major B operand); P rounded to 16 bits in
//                    registers (the m64nNk16 accumulator of a thread, 8 columns at a time, is its A fragment of the
//                    next wgmma); Y (64 x BN, fp32 in registers) += P B_ij by RS wgmma (B_ij N-major). The RS
//                    wgmma of tile row i runs while the first chunk of tile row i + 1 is issued.
//
// Shared memory is in the 128-byte-swizzled layouts of cuda/common/mma_tile.cuh (sw_off): X and A^T chunks are
// 128-byte rows (K-major), B_ij is BN / 64 column blocks of rp rows x 128 bytes (N-major, LBO = rp x 128 bytes).
//
// What bounds it (GPT-3, 2048 x 12288 x 12288, H100): each X element staged in shared memory serves 2 rp flops, and
// an SM multiplies 4096 bf16 flops a clock against 128 bytes a clock of shared memory (an A100 2048), so at rp 64 the
// X stream alone (written by TMA, read by wgmma) takes the whole shared-memory rate, at rp 32 and 16 twice and four
// times it: ratio 2 / 4 / 8 run at 0.55 / 0.45 / 0.40 ms against SVD-matmul's 0.40 / 0.21 / 0.13. Not kept: CTA pairs
// sharing X by TMA multicast (branch tsvd-multicast-attempt): 2x slower, latency-bound (ncu: SM 29% vs 72%); a
// deeper ring (6 stages: 0.549 -> 0.572 ms).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>

#include "cuda/common/check.hpp"
#include "cuda/common/mma_tile.cuh"  // desc_lo, desc_of_lo, pack2, tile_to_p, kWgmmaAvailable; wgmma_ops.cuh
#include "cuda/tsvd/gemv_common.cuh"
#include "cuda/tsvd/kernels.hpp"

namespace spattn::cuda::tsvd {
namespace {

template <int RP, int BN>
struct WgLayout {
  static_assert(RP == 16 || RP == 32 || RP == 64 || RP == 128, "padded rank: 16, 32, 64 or 128");
  static_assert(BN == 128 || (BN == 256 && RP <= 64), "Y tile width 128, or 256 with rank <= 64 (registers)");
  // The layout: smem_layout.hpp's wg_smem (the host's wgmma_smem_bytes is the same; tests/tsvd_layout_test.cpp
  // checks it against the TMA boxes below).
  static constexpr WgSmem W = wg_smem(RP, BN);
  static constexpr int kXBytes = W.x_bytes;      // (kWgBM x 64), 128-byte rows
  static constexpr int kABytes = W.a_bytes;      // (RP x 64) of A_ij^T
  static constexpr int kStageBytes = W.stage;    // a multiple of 1024 (the swizzle's alignment)
  static constexpr int kBBytes = W.b_bytes;      // BN / 64 blocks of (RP x 64)
  static constexpr int kSmemBytes = W.bytes;     // + alignment slack
  static_assert(kXBytes % 1024 == 0 && kStageBytes % 1024 == 0 && W.b_block % 1024 == 0 && W.b_off % 1024 == 0 &&
                    kBBytes % 1024 == 0,
                "every TMA destination of the 128-byte swizzle starts 1024-aligned");
  static_assert(kXBytes == kWgBM * 128 && kABytes == RP * 128 && W.b_block * (BN / 64) == kBBytes,
                "the TMA boxes (64 elements x rows) fill the stage and B buffers exactly");
  static_assert(size_t(kSmemBytes) <= kSmemSm90, "the wgmma kernel's shared memory");
  // Registers a thread after setmaxnreg (fused_fwd_ws.cuh's split for two consumer warpgroups).
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 65536, "register split");
};

template <bool kBf16, int RP, int BN>
__device__ __forceinline__ void wgmma_body(const WgParams& w) {
  using namespace ptx;
  using mma::desc_lo;
  using mma::desc_of_lo;
  using mma::pack2;
  using L = WgLayout<RP, BN>;
  using Op1 = wgmma::Op<RP, kBf16>;  // P = X A: m64 n RP k16
  using Op2 = wgmma::Op<BN, kBf16>;  // Y += P B: m64 n BN k16
  constexpr int S = kWgStages;  // (not a WgLayout member: nvcc warned such members unreferenced, #177-D)
  const Params& p = w.p;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t s0 = smem_u32(smem);                    // stage s: X at s0 + s kStageBytes, A^T after it
  const uint32_t s_b = s0 + S * L::kStageBytes;         // B buffers 0, 1
  const uint32_t bar_full = s0 + L::W.bar_off, bar_empty = bar_full + 8 * S;
  const uint32_t bar_bfull = bar_empty + 8 * S, bar_bempty = bar_bfull + 16;
  __shared__ int s_last;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wgi = warp >> 2;
  const int tiles = p.m_tiles * p.n_tiles;
  const int t = int(blockIdx.x % unsigned(tiles)), split = int(blockIdx.x / unsigned(tiles));
  const int mt = t % p.m_tiles, nt = t / p.m_tiles;  // M fastest: neighbouring CTAs share the factors of a column
  const int m0 = mt * kWgBM, n0 = nt * BN, j = n0 / p.tile_n, nsub = n0 % p.tile_n;
  const int ib = int((long long)p.kt * split / p.splits), ie = int((long long)p.kt * (split + 1) / p.splits);
  const int kc_n = p.tile_k / kWgBK;

  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(bar_full + 8 * s, 1);     // the producer's expect_tx; completes on the bytes
      mbar_init(bar_empty + 8 * s, 256);  // every consumer thread done with the stage
    }
    for (int s = 0; s < 2; ++s) {
      mbar_init(bar_bfull + 8 * s, 1);
      mbar_init(bar_bempty + 8 * s, 256);
    }
    fence_mbar_init();
  }
  __syncthreads();

  if (wgi == 0) {
    // ---- producer ----
    setmaxnreg_dec<L::kProducerRegs>();
    if (tid == 0) {
      unsigned g = 0;  // chunks loaded so far
      for (int i = ib; i < ie; ++i) {
        const int u = i - ib, bb = u & 1, tile = i * p.tile_cols + j;
        if (u >= 2) mbar_wait(bar_bempty + 8 * bb, ((u >> 1) - 1) & 1);
        mbar_expect_tx(bar_bfull + 8 * bb, L::kBBytes);
#pragma unroll
        for (int c = 0; c < BN / 64; ++c)
          tma_load_4d(s_b + bb * L::kBBytes + c * L::W.b_block, &w.tmap_b, bar_bfull + 8 * bb, nsub + 64 * c, tile * RP, 0, 0);
        for (int kc = 0; kc < kc_n; ++kc, ++g) {
          const int st = int(g % S);
          if (g >= unsigned(S)) mbar_wait(bar_empty + 8 * st, int((g / S) - 1) & 1);
          const uint32_t sx = s0 + st * L::kStageBytes, full = bar_full + 8 * st;
          mbar_expect_tx(full, L::kStageBytes);  // rows of X past M count too (zero-filled)
          tma_load_4d(sx, &w.tmap_x, full, i * p.tile_k + kc * kWgBK, m0, 0, 0);
          tma_load_4d(sx + L::kXBytes, &w.tmap_a, full, kc * kWgBK, tile * RP, 0, 0);
        }
      }
    }
  } else {
    // ---- consumers ----
    setmaxnreg_inc<L::kConsumerRegs>();
    const int c = wgi - 1;  // rows 64c ... 64c + 63 of the CTA tile
    float yacc[BN / 2];
    float pacc[RP / 2];
    uint32_t pk[RP / 16][4];
#pragma unroll
    for (int e = 0; e < BN / 2; ++e) yacc[e] = 0.f;
    unsigned g = 0;  // chunks consumed so far
    for (int i = ib; i < ie; ++i) {
      const int u = i - ib, bb = u & 1;
      for (int kc = 0; kc < kc_n; ++kc, ++g) {
        const int st = int(g % S);
        mbar_wait(bar_full + 8 * st, int((g / S) & 1));
        const uint32_t sx = s0 + st * L::kStageBytes;
        const uint32_t x_lo = desc_lo(sx + c * 64 * 128, 16), a_lo = desc_lo(sx + L::kXBytes, 16);
        fence_regs(pacc);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kWgBK / 16; ++kk)  // 32 bytes a k-step inside the 128-byte rows
          Op1::ss(pacc, desc_of_lo(x_lo + kk * 2), desc_of_lo(a_lo + kk * 2), (kc > 0 || kk > 0) ? 1 : 0);
        wgmma_commit();
        wgmma_wait<1>();  // the group before this one is done: chunk kc - 1, or Y += P B of tile row i - 1
        fence_regs(pacc);
        if (kc > 0) mbar_arrive(bar_empty + 8 * ((g - 1) % S));
        else if (u > 0) mbar_arrive(bar_bempty + 8 * ((u - 1) & 1));
      }
      wgmma_wait<0>();
      fence_regs(pacc);
      mbar_arrive(bar_empty + 8 * ((g - 1) % S));
      // P to 16 bits: accumulator columns 16kk ... 16kk + 15 are the A fragment of k-step kk.
      mma::tile_to_p<RP, kBf16>(pacc, pk);
      mbar_wait(bar_bfull + 8 * bb, (u >> 1) & 1);
      fence_regs(yacc);
      fence_regs(pk);
      wgmma_fence();
      const uint32_t b_lo = desc_lo(s_b + bb * L::kBBytes, RP * 128);
#pragma unroll
      for (int kk = 0; kk < RP / 16; ++kk) Op2::rs_tb(yacc, pk[kk], desc_of_lo(b_lo + kk * 128), 1);  // 16 rows of B
      wgmma_commit();
    }
    wgmma_wait<0>();
    fence_regs(yacc);
    fence_regs(pk);

    // Epilogue. Thread (warp w of the warpgroup, lane) holds rows 16w + lane / 4 (+8), columns 8q + 2 (lane % 4) (+1).
    auto* Y = static_cast<uint16_t*>(p.y);
    const int r0 = (warp & 3) * 16 + (lane >> 2), cb = 2 * (lane & 3);
    if (p.splits == 1) {
#pragma unroll
      for (int q = 0; q < BN / 8; ++q)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = m0 + 64 * c + r0 + 8 * h;
          if (row < p.m)
            *reinterpret_cast<uint32_t*>(&Y[size_t(row) * p.n + n0 + q * 8 + cb]) = pack2<kBf16>(yacc[4 * q + 2 * h], yacc[4 * q + 2 * h + 1]);
        }
    } else {
      // This split's Y tile to its slot (slot = blockIdx.x = split x tiles + t); the last CTA of the tile to
      // arrive adds the slots in split order (deterministic) and writes Y.
      float* ws = p.partial + size_t(blockIdx.x) * (kWgBM * BN);
#pragma unroll
      for (int q = 0; q < BN / 8; ++q)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<float2*>(&ws[(64 * c + r0 + 8 * h) * BN + q * 8 + cb]) = make_float2(yacc[4 * q + 2 * h], yacc[4 * q + 2 * h + 1]);
      __threadfence();
      named_sync(1, 256);  // the consumers (the producer warpgroup has no part in the fixup)
      if (tid == 128) s_last = atomicAdd(&p.counters[t], 1) == p.splits - 1;
      named_sync(1, 256);
      if (s_last) {
        __threadfence();
        for (int e = (tid - 128) * 4; e < kWgBM * BN; e += 256 * 4) {
          float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
          for (int s2 = 0; s2 < p.splits; ++s2) {
            const float4 v = __ldcg(reinterpret_cast<const float4*>(p.partial + (size_t(s2) * tiles + t) * (kWgBM * BN) + e));
            sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
          }
          const int row = m0 + e / BN;
          if (row < p.m)
            *reinterpret_cast<uint2*>(&Y[size_t(row) * p.n + n0 + e % BN]) = make_uint2(pack2<kBf16>(sum.x, sum.y), pack2<kBf16>(sum.z, sum.w));
        }
        if (tid == 128) p.counters[t] = 0;  // ready for the next launch
      }
    }
  }
}

template <bool kBf16, int RP, int BN>
__global__ void __launch_bounds__(kWgThreads, 1) tsvd_wgmma(const __grid_constant__ WgParams w) {
#ifdef __CUDA_ARCH__
  if constexpr (!mma::kWgmmaAvailable) {
    __trap();
  } else {
    wgmma_body<kBf16, RP, BN>(w);
  }
#endif
}

template <bool kBf16, int RP, int BN>
void launch_t(const WgParams& w, cudaStream_t stream) {
  constexpr int smem = WgLayout<RP, BN>::kSmemBytes;
  static std::atomic<uint64_t> configured{0};  // the opt-in, once per device (as mma_config in kernels.cu)
  int dev = 0;
  SPATTN_CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (!(configured.load(std::memory_order_acquire) & bit)) {
    SPATTN_CUDA_CHECK(cudaFuncSetAttribute(tsvd_wgmma<kBf16, RP, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    configured.fetch_or(bit, std::memory_order_release);
  }
  tsvd_wgmma<kBf16, RP, BN><<<w.p.grid, kWgThreads, smem, stream>>>(w);
  SPATTN_LAUNCH_CHECK("tsvd_wgmma");
}

template <bool kBf16>
void launch_b(const WgParams& w, cudaStream_t stream) {
  if (w.bn == 256) {
    switch (w.p.rp) {
      case 16: return launch_t<kBf16, 16, 256>(w, stream);
      case 32: return launch_t<kBf16, 32, 256>(w, stream);
      case 64: return launch_t<kBf16, 64, 256>(w, stream);
    }
  } else if (w.bn == 128) {
    switch (w.p.rp) {
      case 16: return launch_t<kBf16, 16, 128>(w, stream);
      case 32: return launch_t<kBf16, 32, 128>(w, stream);
      case 64: return launch_t<kBf16, 64, 128>(w, stream);
      case 128: return launch_t<kBf16, 128, 128>(w, stream);
    }
  }
  throw Error("TSVD wgmma kernel: no instantiation for rank " + std::to_string(w.p.rp) + ", BN " + std::to_string(w.bn));
}

// ---- M = 1 on sm_90: the factors streamed by bulk copies -----------------------------------------------------------
// CTA (j, s) walks tile rows [kt s / S, kt (s + 1) / S) of tile column j as kernels.cu's tsvd_gemv does (p = x_i A_ij
// with G threads a rank row, then y_j += p B_ij with threads over 16-byte vectors of B's rows), but its thread 0 keeps
// `stages` tile rows (x_i, A_ij^T, B_ij: one bulk copy each, completing on the stage's mbarrier) in flight in shared
// memory, where tsvd_gemv's loads of a tile row wait on each other. Layout: smem_layout.hpp's gemv_smem. Not kept:
// stream-K over the tile rows (branch gemv-streamk-attempt; H100 12288 x 12288, tile 256: rank 64 0.0718 -> 0.0685
// ms, rank 32 0.0383 -> 0.0433, rank 16 0.0241 -> 0.0277).
template <bool kBf16>
__device__ __forceinline__ void gemv_bulk_body(const Params& p) {
  using namespace ptx;
  using gemv::to_float2;
  extern __shared__ __align__(16) uint8_t gsm[];
  const GemvSmem L = gemv_smem(p.tile_k, p.tile_n, p.rp);
  const uint32_t s0 = smem_u32(gsm), bar0 = s0 + L.bar_off;
  float* ps = reinterpret_cast<float*>(gsm + L.p_off);
  float* red = reinterpret_cast<float*>(gsm + L.red_off);
  const auto* X = static_cast<const uint16_t*>(p.x);
  const auto* A = static_cast<const uint16_t*>(p.a);
  const auto* B = static_cast<const uint16_t*>(p.b);
  const int tid = threadIdx.x;
  const int j = blockIdx.x % p.tile_cols, s = blockIdx.x / p.tile_cols;
  const int ib = int((long long)p.kt * s / p.splits), ie = int((long long)p.kt * (s + 1) / p.splits), rows = ie - ib;
  const gemv::Roles t = gemv::roles(p, tid);
  const int S = L.stages;
  auto issue = [&](int u) {  // tile row ib + u into stage u % S (thread 0)
    const int i = ib + u, st = u % S;
    const size_t tile = size_t(i) * p.tile_cols + j;
    const uint32_t dst = s0 + st * L.stage, bar = bar0 + 8 * st;
    mbar_expect_tx(bar, uint32_t(p.tile_k * 2 + L.a_bytes + L.b_bytes));
    bulk_load(dst, X + size_t(i) * p.tile_k, uint32_t(p.tile_k * 2), bar);
    bulk_load(dst + L.x_bytes, A + tile * p.rp * p.tile_k, uint32_t(L.a_bytes), bar);
    bulk_load(dst + L.x_bytes + L.a_bytes, B + tile * p.rp * p.tile_n, uint32_t(L.b_bytes), bar);
  };
  if (tid == 0) {
    for (int st = 0; st < S; ++st) mbar_init(bar0 + 8 * st, 1);
    fence_mbar_init();
    for (int u = 0; u < S && u < rows; ++u) issue(u);
  }
  __syncthreads();
  float yacc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int u = 0; u < rows; ++u) {
    const int st = u % S;
    mbar_wait(bar0 + 8 * st, (u / S) & 1);
    const uint8_t* base = gsm + st * L.stage;
    const uint16_t* xs = reinterpret_cast<const uint16_t*>(base);
    const uint16_t* at = reinterpret_cast<const uint16_t*>(base + L.x_bytes);
    const uint16_t* bt = reinterpret_cast<const uint16_t*>(base + L.x_bytes + L.a_bytes);
    // Rank rows gq, gq + 256 / G, ...: G threads a row, each over vectors gl, gl + G, ... (x_i in 16 bits here).
    for (int q = t.gq; q < p.rp; q += kGemvThreads / t.G) {
      float acc0 = 0.f, acc1 = 0.f;
      const uint16_t* ar = at + size_t(q) * p.tile_k;
#pragma unroll 4
      for (int v = t.gl; v < t.vk; v += t.G) {
        const uint4 a8 = *reinterpret_cast<const uint4*>(ar + v * 8), x8 = *reinterpret_cast<const uint4*>(xs + v * 8);
        const float2 a0 = to_float2<kBf16>(a8.x), a1 = to_float2<kBf16>(a8.y), a2 = to_float2<kBf16>(a8.z), a3 = to_float2<kBf16>(a8.w);
        const float2 x0 = to_float2<kBf16>(x8.x), x1 = to_float2<kBf16>(x8.y), x2 = to_float2<kBf16>(x8.z), x3 = to_float2<kBf16>(x8.w);
        acc0 = fmaf(a0.x, x0.x, fmaf(a0.y, x0.y, fmaf(a1.x, x1.x, fmaf(a1.y, x1.y, acc0))));
        acc1 = fmaf(a2.x, x2.x, fmaf(a2.y, x2.y, fmaf(a3.x, x3.x, fmaf(a3.y, x3.y, acc1))));
      }
      gemv::rank_row_done(acc0 + acc1, t, ps, q);
    }
    __syncthreads();
    if (t.pn < t.qph) {
      const uint16_t* bg = bt + t.cn * 8;
#pragma unroll 4
      for (int q = t.pn; q < p.rp; q += t.qph) gemv::fma8<kBf16>(yacc, *reinterpret_cast<const uint4*>(bg + size_t(q) * p.tile_n), ps[q]);
    }
    __syncthreads();  // stage st and ps are read: the stage takes tile row u + S
    if (tid == 0 && u + S < rows) issue(u + S);
  }
  gemv::finish<kBf16>(p, t, yacc, red, j, s);
}

template <bool kBf16>
__global__ void __launch_bounds__(kGemvThreads) tsvd_gemv_bulk(const Params p) {
#ifdef __CUDA_ARCH__
  if constexpr (!mma::kWgmmaAvailable) {
    __trap();
  } else {
    gemv_bulk_body<kBf16>(p);
  }
#endif
}

template <bool kBf16>
void launch_gemv_bulk_t(const Params& p, cudaStream_t stream) {
  const int smem = gemv_smem(p.tile_k, p.tile_n, p.rp).bytes;
  static std::atomic<uint64_t> configured{0};  // the opt-in, once per device
  int dev = 0;
  SPATTN_CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (!(configured.load(std::memory_order_acquire) & bit)) {
    SPATTN_CUDA_CHECK(cudaFuncSetAttribute(tsvd_gemv_bulk<kBf16>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemSm90 - 1024)));
    configured.fetch_or(bit, std::memory_order_release);
  }
  tsvd_gemv_bulk<kBf16><<<p.grid, kGemvThreads, smem, stream>>>(p);
  SPATTN_LAUNCH_CHECK("tsvd_gemv_bulk");
}

}  // namespace

int wgmma_bn(int tile_k, int tile_n, int rp) {
  if (tile_k % kWgBK || (rp != 16 && rp != 32 && rp != 64 && rp != 128)) return 0;
  if (tile_n % 256 == 0 && rp <= 64) return 256;
  return tile_n % 128 == 0 ? 128 : 0;
}

size_t wgmma_smem_bytes(int rp, int bn) { return size_t(wg_smem(rp, bn).bytes); }

bool gemv_bulk_fits(int tile_k, int tile_n, int rp) {
  return tile_k % 8 == 0 && tile_n % 8 == 0 && tile_n <= 8 * kGemvThreads && gemv_smem(tile_k, tile_n, rp).stages > 0;
}

void launch_gemv_bulk(const Params& p, bool bf16, cudaStream_t stream) {
  if (!gemv_bulk_fits(p.tile_k, p.tile_n, p.rp))
    throw Error("TSVD bulk gemv: a tile row of factors (tile " + std::to_string(p.tile_k) + "x" + std::to_string(p.tile_n) +
                ", rank " + std::to_string(p.rp) + ") does not fit two stages of shared memory");
  if (bf16) launch_gemv_bulk_t<true>(p, stream);
  else launch_gemv_bulk_t<false>(p, stream);
}

void launch_wgmma(const WgParams& w, bool bf16, cudaStream_t stream) {
  if (bf16) launch_b<true>(w, stream);
  else launch_b<false>(w, stream);
}

}  // namespace spattn::cuda::tsvd
